#!/usr/bin/env python3
"""Writes a llama-architecture GGUF file as a Hugging Face checkpoint: config.json,
model.safetensors (float32, dequantized exactly), tokenizer.json, tokenizer_config.json.
So the safetensors frontend runs on real weights, and the model can be exported to ONNX.

Undoes llama.cpp's Q/K row permutation (GGUF llama stores q_proj/k_proj permuted for its
interleaved RoPE; HF uses rotate-half). Needs `pip install gguf numpy`.

usage: tools/gguf-to-hf.py model.gguf OUT_DIR
"""
import json
import os
import struct
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
         "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
         "ffn_norm": "post_attention_layernorm"}


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def unpermute(w, n_head):
    """Inverse of llama.cpp's permute for q/k projection rows."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(name):
    parts = name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{NAMES[parts[2]]}.{parts[3]}"
    return f"{NAMES[parts[0]]}.{parts[1]}"


def tensors(r, n_head, n_kv):
    out = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_kv)
        out[hf_name(t.name)] = np.ascontiguousarray(w)
    return out


def write_safetensors(path, ts):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for k, v in ts.items():
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for v in ts.values():
            f.write(v.tobytes())


def tokenizer(r):
    toks, types = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    assert field(r, "tokenizer.ggml.model") == "gpt2" and field(r, "tokenizer.ggml.pre") == "smollm"
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(toks) if types[i] == 3]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": {t: i for i, t in enumerate(toks)}, "merges": merges}}


def main():
    src, out = sys.argv[1], sys.argv[2]
    r = GGUFReader(src)
    assert field(r, "general.architecture") == "llama"
    n_head, n_kv = field(r, "llama.attention.head_count"), field(r, "llama.attention.head_count_kv")
    toks = field(r, "tokenizer.ggml.tokens")
    ts = tensors(r, n_head, n_kv)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "hidden_size": field(r, "llama.embedding_length"),
           "intermediate_size": field(r, "llama.feed_forward_length"),
           "num_hidden_layers": field(r, "llama.block_count"), "num_attention_heads": n_head,
           "num_key_value_heads": n_kv, "vocab_size": len(toks),
           "max_position_embeddings": field(r, "llama.context_length"),
           "rms_norm_eps": field(r, "llama.attention.layer_norm_rms_epsilon"),
           "rope_theta": field(r, "llama.rope.freq_base", 10000.0), "rope_scaling": None,
           "tie_word_embeddings": "lm_head.weight" not in ts, "attention_bias": False,
           "bos_token_id": field(r, "tokenizer.ggml.bos_token_id"),
           "eos_token_id": field(r, "tokenizer.ggml.eos_token_id"), "torch_dtype": "float32"}
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), ts)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump(tokenizer(r), open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
    json.dump({"bos_token": toks[cfg["bos_token_id"]], "eos_token": toks[cfg["eos_token_id"]],
               "add_bos_token": False, "chat_template": field(r, "tokenizer.chat_template"),
               "tokenizer_class": "GPT2Tokenizer"},
              open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    print(f"wrote {len(ts)} tensors to {out}")


if __name__ == "__main__":
    main()
