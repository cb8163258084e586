#!/usr/bin/env python3
"""gen_random_gguf: a GGUF file of a real model's shape with seeded random weights, for
speed measurements where the real weights are not at hand (tools/bench-cpu --gguf FILE).
Speed depends on the shapes, the weight types and the context only, so the figures hold
for the real model; the text it writes means nothing (bench-cpu decodes a fixed number
of tokens). The file is what llama.cpp's converter writes for the architecture: its
metadata keys, tensor names, 1-d tensors in f32, matrices in --type; the vocabulary is
placeholder SentencePiece tokens ("<t0>", ...) so llama.cpp and infc both load it.

usage: tools/gen_random_gguf.py --preset qwen3-0.6b [--type q8_0|q4_1|f16|f32] -o FILE
       (needs: pip install gguf numpy)
"""
import argparse

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

PRESETS = {
    # Qwen3-0.6B: 28 layers, hidden 1024, 16 q heads of 128 over 8 kv heads, q/k norm,
    # tied embeddings, rope theta 1e6
    "qwen3-0.6b": dict(arch="qwen3", layers=28, hidden=1024, ffn=3072, heads=16, kv_heads=8,
                       head_dim=128, vocab=151936, ctx=40960, theta=1e6, eps=1e-6,
                       qk_norm=True, tied=True),
    # Qwen2.5-0.5B: q/k/v biases, head_dim 64
    "qwen2.5-0.5b": dict(arch="qwen2", layers=24, hidden=896, ffn=4864, heads=14, kv_heads=2,
                         head_dim=64, vocab=151936, ctx=32768, theta=1e6, eps=1e-6,
                         qk_norm=False, tied=True, bias=True),
    # Gemma 3 1B (text): 26 layers, sliding window 512 with a full layer every 6th, 4 q
    # heads of 256 over 1 kv head, q/k norms, vocab 262144
    "gemma3-1b": dict(arch="gemma3", layers=26, hidden=1152, ffn=6912, heads=4, kv_heads=1,
                      head_dim=256, vocab=262144, ctx=32768, theta=1e6, eps=1e-6,
                      qk_norm=True, tied=True, window=512),
    # Gemma 2 2B: window 4096 every other layer, soft caps 50 (scores) and 30 (logits)
    "gemma2-2b": dict(arch="gemma2", layers=26, hidden=2304, ffn=9216, heads=8, kv_heads=4,
                      head_dim=256, vocab=256000, ctx=8192, theta=1e4, eps=1e-6,
                      qk_norm=False, tied=True, window=4096, caps=(50.0, 30.0)),
    # small Gemma shapes for checking llama.cpp's reading of the archs against ours
    # (tools/check-llamacpp-logits.py): windows of 64 that a 200-token prompt crosses, a
    # full layer every 6th (gemma3: layers 5 and 11), caps that bite (weights std 0.2)
    "gemma3-check": dict(arch="gemma3", layers=12, hidden=256, ffn=512, heads=4, kv_heads=2,
                         head_dim=64, vocab=2048, ctx=1024, theta=1e6, eps=1e-6, qk_norm=True,
                         tied=True, window=64, std=0.2),
    "gemma2-check": dict(arch="gemma2", layers=4, hidden=256, ffn=512, heads=4, kv_heads=2,
                         head_dim=64, vocab=2048, ctx=1024, theta=1e4, eps=1e-6, qk_norm=False,
                         tied=True, window=64, caps=(4.0, 6.0), std=0.2),
}
TYPES = {"q8_0": T.Q8_0, "q4_1": T.Q4_1, "q4_0": T.Q4_0, "f16": T.F16, "f32": T.F32}


def matrix(rng, rows, cols, qtype, std=0.02):
    w = (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float32)
    if qtype == T.F32:
        return w, None
    if qtype == T.F16:
        return w.astype(np.float16), None
    return quants.quantize(w, qtype), qtype


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--type", choices=sorted(TYPES), default="q8_0")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    p, qt = PRESETS[a.preset], TYPES[a.type]
    rng = np.random.default_rng(a.seed)
    arch = p["arch"]
    w = GGUFWriter(a.output, arch)
    w.add_name(f"random {a.preset}")
    w.add_block_count(p["layers"])
    w.add_context_length(p["ctx"])
    w.add_embedding_length(p["hidden"])
    w.add_feed_forward_length(p["ffn"])
    w.add_head_count(p["heads"])
    w.add_head_count_kv(p["kv_heads"])
    w.add_key_length(p["head_dim"])
    w.add_value_length(p["head_dim"])
    w.add_rope_freq_base(p["theta"])
    w.add_layer_norm_rms_eps(p["eps"])
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(p["vocab"])])
    w.add_token_scores([0.0] * p["vocab"])
    w.add_token_types([1] * p["vocab"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    gemma = arch in ("gemma2", "gemma3")
    if gemma:  # norms are stored as 1 + w by the converter: ones are w = 0
        w.add_sliding_window(p["window"])
    if "caps" in p:
        w.add_attn_logit_softcapping(p["caps"][0])
        w.add_final_logit_softcapping(p["caps"][1])
    std = p.get("std", 0.02)

    def add(name, data, raw):
        if raw is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=raw)

    H, hd = p["hidden"], p["head_dim"]
    add("token_embd.weight", *matrix(rng, p["vocab"], H, qt, std))
    add("output_norm.weight", np.ones(H, np.float32), None)
    if not p["tied"]:
        add("output.weight", *matrix(rng, p["vocab"], H, qt, std))
    for l in range(p["layers"]):
        b = f"blk.{l}."
        add(b + "attn_norm.weight", np.ones(H, np.float32), None)
        add(b + "ffn_norm.weight", np.ones(H, np.float32), None)
        if gemma:
            add(b + "post_attention_norm.weight", np.ones(H, np.float32), None)
            add(b + "post_ffw_norm.weight", np.ones(H, np.float32), None)
        for n, rows, cols in (("attn_q", p["heads"] * hd, H), ("attn_k", p["kv_heads"] * hd, H),
                              ("attn_v", p["kv_heads"] * hd, H),
                              ("attn_output", H, p["heads"] * hd), ("ffn_gate", p["ffn"], H),
                              ("ffn_up", p["ffn"], H), ("ffn_down", H, p["ffn"])):
            add(b + n + ".weight", *matrix(rng, rows, cols, qt, std))
            if p.get("bias") and n in ("attn_q", "attn_k", "attn_v"):
                add(b + n + ".bias", (rng.standard_normal(rows) * 0.02).astype(np.float32), None)
        if p["qk_norm"]:
            add(b + "attn_q_norm.weight", np.ones(hd, np.float32), None)
            add(b + "attn_k_norm.weight", np.ones(hd, np.float32), None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.output}: random {a.preset}, matrices {a.type}")


if __name__ == "__main__":
    main()
