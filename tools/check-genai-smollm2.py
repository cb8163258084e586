#!/usr/bin/python3
"""check-genai-smollm2: infc/inferrt against onnxruntime on real ONNX Runtime GenAI output.

SmolLM2-135M-Instruct (tools/get-smollm2's GGUF written as an HF checkpoint by
tools/gguf-to-hf.py, as tools/check-onnx-smollm2.py does) goes through the ONNX Runtime
GenAI model builder (tools/gen_genai_fixtures.py's shimmed runner) as
  fp32        -p fp32: GroupQueryAttention (rotary inside), packed QKV MatMul, Skip/
              SimplifiedLayerNormalization;
  int4        -p int4, accuracy_level=1: MatMulNBits (block 32, zero point 8) computed by
              onnxruntime on the exactly dequantized f32 weights, as infc does;
  int4-acc4   -p int4 with the CPU default accuracy_level=4 (onnxruntime also quantizes the
              activations to int8; infc still computes in f32, so this row measures that gap).
`infc build` turns each into a paged-KV plan, and for each prompt onnxruntime prefills it
and greedy-decodes N tokens feeding the presents back; `inferrt generate` greedy-decodes N
tokens through our KV cache and `dump_logits` teacher-forces prompt + onnxruntime's tokens.
onnxruntime-genai's generate() gives a third token sequence.

usage: /usr/bin/python3 tools/check-genai-smollm2.py [--build build] [--work DIR] [-n 32]
       [--variants fp32,int4,int4-acc4]
Needs what tools/gen_genai_fixtures.py needs (onnxruntime-genai, onnx_ir, Debian's torch).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from gen_genai_fixtures import run_builder  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n"
    "<|im_start|>assistant\n",
]
VARIANTS = {"fp32": (["-p", "fp32"], {}),
            "int4": (["-p", "int4"], {"accuracy_level": "1"}),
            "int4-acc4": (["-p", "int4"], {})}


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, **kw).stdout


def hf_dir(work):
    """The HF checkpoint, with rope_scaling spelled as the builder's transformers expects."""
    hf = os.path.join(work, "hf")
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        gguf = run([os.path.join(ROOT, "tools", "get-smollm2")]).strip()
        run(["python3", os.path.join(ROOT, "tools", "gguf-to-hf.py"), gguf, hf])
    b = os.path.join(work, "hf-builder")
    if not os.path.exists(os.path.join(b, "config.json")):
        os.makedirs(b, exist_ok=True)
        for f in os.listdir(hf):
            if f != "config.json":
                dst = os.path.join(b, f)
                if not os.path.exists(dst):
                    os.symlink(os.path.join(hf, f), dst)
        cfg = json.load(open(os.path.join(hf, "config.json")))
        cfg["rope_scaling"] = {"rope_type": "default"}
        json.dump(cfg, open(os.path.join(b, "config.json"), "w"), indent=1)
    return hf, b


def ort_greedy(sess, g, ids, n):
    """Logits of every prompt and decode position, and n greedy tokens."""
    dec = g["model"]["decoder"]
    L, kv, hd = dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"]
    names = [i.name for i in sess.get_inputs()]
    past = {f"past_key_values.{i}.{t}": np.zeros((1, kv, 0, hd), np.float32)
            for i in range(L) for t in ("key", "value")}
    rows, gen, seq, new = [], [], list(ids), list(ids)
    outs = [o.name for o in sess.get_outputs()]
    while True:
        start = len(seq) - len(new)
        feed = {"input_ids": np.array([new], np.int64),
                "attention_mask": np.ones((1, len(seq)), np.int64)}
        if "position_ids" in names:
            feed["position_ids"] = np.arange(start, len(seq), dtype=np.int64)[None]
        feed.update(past)
        out = dict(zip(outs, sess.run(None, feed)))
        past = {k.replace("present", "past_key_values"): v for k, v in out.items()
                if k.startswith("present")}
        rows.append(out["logits"][0])
        if len(gen) == n:
            break
        gen.append(int(np.argmax(out["logits"][0][-1])))
        seq.append(gen[-1])
        new = [gen[-1]]
    return np.concatenate(rows), gen


def genai_greedy(model_dir, ids, n):
    import onnxruntime_genai as og
    m = og.Model(model_dir)
    p = og.GeneratorParams(m)
    p.set_search_options(max_length=len(ids) + n, do_sample=False)
    gen = og.Generator(m, p)
    gen.append_tokens([ids])
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)][len(ids):]


def check(args, name, out, tok):
    import onnxruntime as ort
    plan = os.path.join(out, "model.plan")
    t = time.time()
    print(run([os.path.join(args.build, "infc"), "build", os.path.join(out, "model.onnx"),
               "-o", plan]).strip())
    print(f"infc build: {time.time() - t:.1f} s", flush=True)
    g = json.load(open(os.path.join(out, "genai_config.json")))
    sess = ort.InferenceSession(os.path.join(out, "model.onnx"),
                                providers=["CPUExecutionProvider"])
    worst_abs, worst_rel, agree_all, genai_all = 0.0, 0.0, 0, 0
    for text in PROMPTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ref, ref_gen = ort_greedy(sess, g, ids, args.n)
        got = json.loads(run([os.path.join(args.build, "inferrt"), "generate", plan,
                              "--prompt-ids", ",".join(map(str, ids)), "-n", str(args.n),
                              "--ignore-eos", "--json", "--threads", str(args.threads)]))
        got_gen = got["generated_ids"]
        path = os.path.join(out, "logits.f32")
        subprocess.run([os.path.join(args.build, "dump_logits"), plan, "--ids",
                        ",".join(map(str, ids + ref_gen)), "--threads", str(args.threads),
                        "--out", path], check=True, stderr=subprocess.DEVNULL)
        lg = np.fromfile(path, dtype=np.float32).reshape(len(ids) + args.n, ref.shape[1])
        d = np.abs(lg - ref)
        rel = float(d.max() / np.abs(ref).max())
        agree = next((i for i, (a, b) in enumerate(zip(got_gen, ref_gen)) if a != b), args.n)
        gai = genai_greedy(out, ids, args.n)
        worst_abs, worst_rel = max(worst_abs, float(d.max())), max(worst_rel, rel)
        agree_all += agree == args.n
        genai_all += gai == got_gen[:len(gai)]
        print(f"{len(ids):3d} prompt tokens: max |d| {d.max():.3g}, / max|ort| {rel:.2e}; "
              f"greedy {agree}/{args.n} agree with onnxruntime, onnxruntime-genai "
              f"{'same' if gai == got_gen[:len(gai)] else 'differs'}  {text[:32]!r}",
              flush=True)
    print(f"SmolLM2-135M GenAI {name} vs onnxruntime {ort.__version__}: {len(PROMPTS)} prompts,"
          f" max |logit diff| {worst_abs:.3g}, max relative {worst_rel:.2e}; greedy {args.n} "
          f"tokens identical {agree_all}/{len(PROMPTS)} (onnxruntime), {genai_all}/"
          f"{len(PROMPTS)} (onnxruntime-genai)", flush=True)
    return agree_all == len(PROMPTS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "infc",
                                                   "smollm2-onnx"))
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="fp32,int4,int4-acc4")
    args = ap.parse_args()
    from transformers import AutoTokenizer
    hf, hfb = hf_dir(args.work)
    tok = AutoTokenizer.from_pretrained(hf)
    ok = True
    for name in args.variants.split(","):
        out = os.path.join(args.work, f"genai-{name}")
        if not os.path.exists(os.path.join(out, "model.onnx")):
            t = time.time()
            a, extra = VARIANTS[name]
            run_builder(hfb, out, os.path.join(args.work, "genai-cache"), a, extra, False)
            print(f"builder {name}: {time.time() - t:.0f} s", flush=True)
        same = check(args, name, out, tok)
        ok = ok and (same or name == "int4-acc4")  # acc4: a different computation
        shutil.rmtree(os.path.join(args.work, "genai-cache"), ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
