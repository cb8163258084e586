#!/usr/bin/python3
"""Run the ONNX Runtime GenAI model builder on the tiny Llama fixture and record
onnxruntime's (and onnxruntime-genai's) outputs as the oracle.

    /usr/bin/python3 -m pip install --break-system-packages --no-deps \
        onnxruntime-genai==0.18.0 onnx_ir==1.1.0
    /usr/bin/python3 tools/gen_genai_fixtures.py          # from the repo root

Needs Debian's torch 1.13 with transformers 4.44.2 (tools/requirements-fixtures.txt),
onnx and onnxruntime. The builder is written against torch >= 2 and a newer
transformers; the shims in builder_main() paper over what it imports but never uses for
a float32 Llama on the CPU (multimodal classes, float8/uint16 dtypes, @torch.no_grad
without parentheses, fake-tensor mode). The graph is the builder's own output.

Reads tests/fixtures/llama-gqa-f32 and llama-text (tools/gen_fixtures.py,
tools/gen_text_fixture.py) and writes four fixtures, each model.onnx + model.onnx.data
(external weights) + genai_config.json + oracle.json:
  onnx-genai-f32        -p fp32 -e cpu: packed QKV MatMul -> GroupQueryAttention
                        (do_rotary, cos/sin caches), SimplifiedLayerNormalization,
                        SkipSimplifiedLayerNormalization, SwiGLU as Sigmoid/Mul.
  onnx-genai-int4       -p int4 -e cpu: the same with MatMulNBits (4 bits, block 32,
                        symmetric: no zero points, so zero point 8; lm_head too).
  onnx-genai-int4-rope  -p int4 with is_symmetric=false (uint4 with zero points) and the
                        separate-RoPE path the builder takes for DML (q/k/v MatMulNBits,
                        com.microsoft RotaryEmbedding nodes, a position_ids input),
                        forced on the CPU EP by monkeypatching is_fused_rope_supported.
  onnx-genai-int4-tied  llama-text (tied embeddings) with -p int4: the embedding is a
                        GatherBlockQuantized of lm_head's MatMulNBits weight; + its tokenizer.json.
MatMulNBits is built with accuracy_level=1 (f32 compute): onnxruntime then multiplies
by the exactly dequantized weights, the arithmetic infc reproduces (the CPU default 4
would quantize activations to int8 as well).

oracle.json: for the HF oracle's prompts (llama-text: two short id prompts, 4 decode
steps, to keep the 2006-wide logits small), onnxruntime's logits at every prompt position
(prefill with empty past), 32 greedy tokens decoded one at a time through the KV cache
(present fed back as past, attention_mask grown), the logits of the first 8 decode
steps, and onnxruntime-genai's greedy generate() tokens for the same prompts.
"""
import contextlib
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = os.path.join(ROOT, "tests", "fixtures", "llama-text")
NUM_GENERATE = 32
NUM_DECODE_LOGITS = 8

VARIANTS = {  # name: (source fixture, builder args, extra options, separate RoPE)
    "onnx-genai-f32": ("llama-gqa-f32", ["-p", "fp32"], {}, False),
    "onnx-genai-int4": ("llama-gqa-f32", ["-p", "int4"], {"accuracy_level": "1"}, False),
    "onnx-genai-int4-rope": ("llama-gqa-f32", ["-p", "int4"],
                             {"accuracy_level": "1", "is_symmetric": "false",
                              "disable_qkv_fusion": "true"}, True),
    "onnx-genai-int4-tied": ("llama-text", ["-p", "int4"], {"accuracy_level": "1"}, False),
}
# llama-text (tied embeddings, vocab 2006) has no logit oracle of its own: short id
# prompts keep its oracle small.
TIED_PROMPTS = [[0, 312, 45, 1020], [0, 7]]
TIED_DECODE_LOGITS = 4


def builder_main(argv):
    """Runs onnxruntime_genai.models.builder with argv under the compatibility shims."""
    import torch
    import transformers
    for n in ["Gemma3ForConditionalGeneration", "Lfm2VlForConditionalGeneration",
              "Mistral3ForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
              "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
              "Qwen3VLForConditionalGeneration"]:
        if not hasattr(transformers, n):
            setattr(transformers, n, type(n, (), {}))
    plain_no_grad = torch.no_grad
    torch.no_grad = lambda fn=None: plain_no_grad()(fn) if callable(fn) else plain_no_grad()

    class Missing:  # dtypes torch 1.13 lacks; a float32 Llama never produces them
        def __init__(self, name):
            self.name = name

    for n in ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
              "float8_e8m0fnu", "int2", "uint2", "uint16", "uint32", "uint64", "int4",
              "uint4"]:
        if not hasattr(torch, n):
            setattr(torch, n, Missing(n))
    import torch._subclasses.fake_tensor as fake
    if not hasattr(fake, "unset_fake_temporarily"):
        fake.unset_fake_temporarily = contextlib.nullcontext
    import onnxruntime_genai.models  # noqa: F401  (puts the builders on sys.path)
    if os.environ.get("INFC_GENAI_SEPARATE_ROPE") == "1":
        import builders.base
        builders.base.Model.is_fused_rope_supported = lambda self: False
    sys.argv = ["builder"] + argv
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")


def run_builder(hf, out, cache, args, extra, separate_rope):
    cmd = [sys.executable, os.path.abspath(__file__), "--run-builder", "-i", hf, "-o", out,
           "-e", "cpu", "-c", cache] + args
    if extra:
        cmd += ["--extra_options"] + [f"{k}={v}" for k, v in extra.items()]
    env = dict(os.environ, INFC_GENAI_SEPARATE_ROPE="1" if separate_rope else "0")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def make_hf_dir(tmp, src):
    """The checkpoint as the builder wants it: a tokenizer (the builder insists on one;
    llama-gqa-f32 has none, so llama-text's stands in, never used: the oracles run on token
    ids) and rope_scaling spelled as the newer transformers do (null means default)."""
    hf = os.path.join(tmp, "hf-" + src)
    os.makedirs(hf)
    for f in ["config.json", "model.safetensors"]:
        shutil.copy(os.path.join(ROOT, "tests", "fixtures", src, f), hf)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(TOK, f), hf)
    cfg = json.load(open(os.path.join(hf, "config.json")))
    cfg["rope_scaling"] = {"rope_type": "default"}
    json.dump(cfg, open(os.path.join(hf, "config.json"), "w"), indent=2)
    return hf, cfg


class Ort:
    def __init__(self, path):
        import onnxruntime as ort
        self.sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.sess.get_inputs()}
        self.outputs = [o.name for o in self.sess.get_outputs()]
        self.margin = float("inf")  # smallest top-1 - top-2 logit gap of a greedy step
        self.layers = sum(1 for n in self.inputs if n.startswith("past_key_values.")) // 2
        g = json.load(open(os.path.join(os.path.dirname(path), "genai_config.json")))
        self.kv_heads = g["model"]["decoder"]["num_key_value_heads"]
        self.head_dim = g["model"]["decoder"]["head_size"]

    def step(self, ids, past, start):
        import numpy as np
        n = len(ids)
        feed = {"input_ids": np.array([ids], dtype=np.int64),
                "attention_mask": np.ones((1, start + n), dtype=np.int64)}
        if "position_ids" in self.inputs:
            feed["position_ids"] = np.arange(start, start + n, dtype=np.int64)[None]
        for i in range(self.layers):
            for kv in ("key", "value"):
                feed[f"past_key_values.{i}.{kv}"] = past[f"present.{i}.{kv}"]
        out = dict(zip(self.outputs, self.sess.run(None, feed)))
        return out["logits"][0], out

    def empty(self):
        import numpy as np
        z = np.zeros((1, self.kv_heads, 0, self.head_dim), dtype=np.float32)
        return {f"present.{i}.{kv}": z for i in range(self.layers) for kv in ("key", "value")}

    def generate(self, prompt, n_decode):
        import numpy as np
        logits, past = self.step(prompt, self.empty(), 0)
        prefill, ids, gen, dec = logits, list(prompt), [], []
        for s in range(NUM_GENERATE):
            t = int(np.argmax(logits[-1]))
            top2 = np.sort(logits[-1])[-2:]
            self.margin = min(self.margin, float(top2[1] - top2[0]))
            gen.append(t)
            if s > 0 and s <= n_decode:
                dec.append(logits[-1])
            logits, past = self.step([t], past, len(ids))
            ids.append(t)
        return prefill, gen, dec


def genai_greedy(model_dir, prompt):
    import onnxruntime_genai as og
    m = og.Model(model_dir)
    p = og.GeneratorParams(m)
    p.set_search_options(max_length=len(prompt) + NUM_GENERATE, do_sample=False)
    g = og.Generator(m, p)
    g.append_tokens([prompt])
    while not g.is_done():
        g.generate_next_token()
    return [int(t) for t in g.get_sequence(0)][len(prompt):]


def rounded(rows):
    return [[round(float(v), 6) for v in row] for row in rows]


def record(name, out):
    import numpy as np
    import onnxruntime as ort
    import onnxruntime_genai as og
    src, args, extra, _ = VARIANTS[name]
    hf = json.load(open(os.path.join(ROOT, "tests", "fixtures", src, "oracle.json")))
    if src == "llama-text":
        prompts, n_dec = TIED_PROMPTS, TIED_DECODE_LOGITS
    else:
        prompts, n_dec = hf["prompts"], NUM_DECODE_LOGITS
    o = Ort(os.path.join(out, "model.onnx"))
    logits, greedy, decode, gai, worst = [], [], [], [], None
    for k, p in enumerate(prompts):
        lg, gen, dec = o.generate(p, n_dec)
        if src != "llama-text":
            d = float(np.max(np.abs(lg - np.array(hf["logits"][k]))))
            worst = d if worst is None else max(worst, d)
        logits.append(rounded(lg))
        greedy.append(gen)
        decode.append(rounded(dec))
        gai.append(genai_greedy(out, p))
    agree = [g[:len(a)] == a for g, a in zip(greedy, gai)]
    vs_hf = "n/a" if worst is None else f"{worst:.3g}, greedy equal {greedy == hf['greedy']}"
    print(f"{name}: onnxruntime vs transformers: max |logit diff| {vs_hf}; onnxruntime-genai "
          f"greedy equal: {agree}; greedy min margin {o.margin:.3g}")
    return {"model": name, "source": src,
            "builder": f"onnxruntime_genai.models.builder {og.__version__}",
            "builder_args": " ".join(args + [f"{k}={v}" for k, v in extra.items()]),
            "onnxruntime_version": ort.__version__, "vs_transformers_max_abs": worst,
            "greedy_min_margin": o.margin,
            "prompts": prompts, "logits": logits, "greedy": greedy,
            "decode_logits": decode, "genai_greedy": gai}


def fix_genai_config(out, cfg):
    """The builder adds the stand-in tokenizer's <|endoftext|> (id 0) to eos_token_id;
    the checkpoint's own eos is what the model has."""
    path = os.path.join(out, "genai_config.json")
    g = json.load(open(path))
    g["model"]["eos_token_id"] = cfg["eos_token_id"]
    json.dump(g, open(path, "w"), indent=4)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for name, (src, args, extra, separate_rope) in VARIANTS.items():
            hf, cfg = make_hf_dir(os.path.join(tmp, name), src)
            out = os.path.join(tmp, name, "out")
            run_builder(hf, out, os.path.join(tmp, "cache"), args, extra, separate_rope)
            files = ["model.onnx", "model.onnx.data", "genai_config.json"]
            if src != "llama-text":
                fix_genai_config(out, cfg)
            oracle = record(name, out)
            dst = os.path.join(ROOT, "tests", "fixtures", name)
            os.makedirs(dst, exist_ok=True)
            for f in files:
                shutil.copy(os.path.join(out, f), dst)
            if src == "llama-text":  # its own tokenizer (the builder's re-save adds <unk>)
                shutil.copy(os.path.join(TOK, "tokenizer.json"), dst)
            with open(os.path.join(dst, "oracle.json"), "w") as f:
                json.dump(oracle, f, separators=(",", ":"))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--run-builder":
        builder_main(sys.argv[2:])
    else:
        main()
