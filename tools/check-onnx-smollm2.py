#!/usr/bin/python3
"""check-onnx-smollm2: infc/inferrt against onnxruntime on a real exported ONNX LLM.

SmolLM2-135M-Instruct (tools/get-smollm2's GGUF, written as an HF checkpoint by
tools/gguf-to-hf.py, so f32 weights dequantized exactly) is exported with torch.onnx.export
optimum-style WITH past KV (input_ids, attention_mask, position_ids, past_key_values.{i}.*
-> logits, present.{i}.*; tools/gen_onnx_fixtures.py's exporter), `infc build` turns it into
a paged-KV plan, and for each prompt:
  - onnxruntime on the same .onnx prefills the prompt (past_len 0) and greedy-decodes N
    tokens one call at a time, feeding the presents back;
  - `inferrt generate --prompt-ids --json` greedy-decodes N tokens (our KV cache), and
    `dump_logits` teacher-forces prompt + onnxruntime's tokens through the plan.
Reports per prompt: max |ours - ort| over every prompt and decode position and the vocab,
that divided by max |ort| (the relative logit error), max |d| / (1 + |ort|), and how many of
the N greedy tokens agree before the first divergence.

usage: /usr/bin/python3 tools/check-onnx-smollm2.py [--build build] [--work DIR] [-n 32]
Needs Debian's python3-torch + transformers (tools/requirements-fixtures.txt), onnxruntime
and numpy<2 in that interpreter; tools/gguf-to-hf.py runs with `python3` (gguf, numpy).
With --exporter=dynamo the model is exported by torch's default exporter (SDPA attention,
optimum-style past KV; tools/gen_onnx_dynamo_fixtures.py's export) instead: run it with the
scratch venv's python that script names.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
EXPORTER = "dynamo" if "--exporter=dynamo" in sys.argv else "torchscript"
if EXPORTER == "dynamo":  # torch >= 2.9 and transformers 5 (a scratch venv)
    from gen_onnx_dynamo_fixtures import export as export_dynamo  # noqa: E402
    from onnx_oracle import kv_shape as _kv_shape, past_names  # noqa: E402

    def kv_shape(cfg, past):
        return _kv_shape(cfg, 1, past)
else:
    from gen_onnx_fixtures import export_past, kv_shape, past_names  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Water boils at 100 degrees Celsius at sea level because",
    "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n"
    "<|im_start|>assistant\n",
]


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, **kw).stdout


def prepare(args):
    hf = os.path.join(args.work, "hf")
    onnx_dir = os.path.join(args.work, "onnx")
    model = os.path.join(onnx_dir, "model.onnx")
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        gguf = run([os.path.join(ROOT, "tools", "get-smollm2")]).strip()
        run(["python3", os.path.join(ROOT, "tools", "gguf-to-hf.py"), gguf, hf])
    if not os.path.exists(model):
        os.makedirs(onnx_dir, exist_ok=True)
        t = time.time()
        if EXPORTER == "dynamo":
            lm = LlamaForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                                  attn_implementation="sdpa").eval()
            export_dynamo(lm, model, True)
        else:
            lm = LlamaForCausalLM.from_pretrained(hf, torch_dtype=torch.float32,
                                                  attn_implementation="eager").eval()
            with torch.no_grad():
                export_past(lm, model)
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(hf, f)):
                shutil.copy(os.path.join(hf, f), onnx_dir)
        print(f"exported {model} in {time.time() - t:.0f} s", flush=True)
    return hf, model


def ort_greedy(sess, cfg, ids, n):
    """Logits of every prompt position and of each decode step, and the greedy tokens."""
    kv = [np.zeros(kv_shape(cfg, 0), np.float32) for _ in range(2 * cfg.num_hidden_layers)]
    names = past_names(cfg, "past_key_values")
    rows, gen, seq = [], [], list(ids)
    new = list(ids)
    while True:
        start = len(seq) - len(new)
        feed = {"input_ids": np.array([new], np.int64),
                "attention_mask": np.ones((1, len(seq)), np.int64),
                "position_ids": np.arange(start, len(seq), dtype=np.int64)[None]}
        feed.update(zip(names, kv))
        out = sess.run(None, feed)
        kv = out[1:]
        rows.append(out[0][0])
        if len(gen) == n:
            break
        gen.append(int(np.argmax(out[0][0][-1])))
        seq.append(gen[-1])
        new = [gen[-1]]
    return np.concatenate(rows), gen


def ours(args, plan, ids, n):
    out = json.loads(run([os.path.join(args.build, "inferrt"), "generate", plan, "--prompt-ids",
                          ",".join(map(str, ids)), "-n", str(n), "--ignore-eos", "--json",
                          "--threads", str(args.threads)]))
    return out["generated_ids"]


def teacher_forced(args, plan, ids, V, tmp):
    path = os.path.join(tmp, "logits.f32")
    subprocess.run([os.path.join(args.build, "dump_logits"), plan, "--ids",
                    ",".join(map(str, ids)), "--threads", str(args.threads), "--out", path],
                   check=True, stderr=subprocess.DEVNULL)
    return np.fromfile(path, dtype=np.float32).reshape(len(ids), V)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "infc",
                                                   "smollm2-onnx"))
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--exporter", choices=("torchscript", "dynamo"), default="torchscript",
                    help="torch.onnx.export's TorchScript exporter (Debian's torch 1.13) or "
                         "the dynamo exporter (torch 2.15 + transformers 5.25 + onnxscript, "
                         "from a scratch venv: run the script with that venv's python)")
    args = ap.parse_args()
    if args.exporter != EXPORTER:
        sys.exit("check-onnx-smollm2: spell it --exporter=dynamo")
    if args.exporter == "dynamo":
        args.work += "-dynamo"
    hf, model = prepare(args)
    plan = os.path.join(args.work, "model.plan")
    t = time.time()
    print(run([os.path.join(args.build, "infc"), "build", model, "-o", plan]).strip())
    print(f"infc build: {time.time() - t:.1f} s", flush=True)
    tok = AutoTokenizer.from_pretrained(hf)
    cfg = LlamaForCausalLM.config_class.from_pretrained(hf)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    worst_rel, worst_abs, agree_all = 0.0, 0.0, 0
    for text in PROMPTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ref, ref_gen = ort_greedy(sess, cfg, ids, args.n)
        got_gen = ours(args, plan, ids, args.n)
        lg = teacher_forced(args, plan, ids + ref_gen, ref.shape[1], args.work)
        d = np.abs(lg - ref)
        rel = float(d.max() / np.abs(ref).max())
        rel1 = float((d / (1 + np.abs(ref))).max())
        agree = next((i for i, (a, b) in enumerate(zip(got_gen, ref_gen)) if a != b),
                     min(len(got_gen), len(ref_gen)))
        worst_rel, worst_abs = max(worst_rel, rel), max(worst_abs, float(d.max()))
        agree_all += agree == args.n
        print(f"{len(ids):3d} prompt tokens: max |d| {d.max():.3g}, / max|ort| {rel:.2e}, "
              f"/(1+|ort|) {rel1:.2e}; greedy {agree}/{args.n} agree  {text[:40]!r}",
              flush=True)
    print(f"SmolLM2-135M ONNX (past KV) vs onnxruntime {ort.__version__}: {len(PROMPTS)} prompts,"
          f" max |logit diff| {worst_abs:.3g}, max relative {worst_rel:.2e}, greedy {args.n} "
          f"tokens identical {agree_all}/{len(PROMPTS)}")
    return 0 if agree_all == len(PROMPTS) else 1


if __name__ == "__main__":
    sys.exit(main())
