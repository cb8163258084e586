#!/usr/bin/python3
"""Export tiny Llama-family fixtures to ONNX and record onnxruntime's outputs as the oracle.

    /usr/bin/python3 -m pip install --break-system-packages onnx onnxruntime 'numpy<2'
    /usr/bin/python3 tools/gen_onnx_fixtures.py [NAME ...]     # from the repo root

Reads the safetensors fixtures made by tools/gen_fixtures.py and writes, under
tests/fixtures/ (all of them, or only the NAMEs given):
  onnx-llama-gqa/      torch.onnx.export of LlamaForCausalLM (llama-gqa-f32, eager attention),
                       no past KV: inputs input_ids, position_ids [batch, seq] (i64), output
                       logits [batch, seq, vocab] f32.
  onnx-llama-past/     the same model exported optimum-style WITH past KV: inputs input_ids,
                       attention_mask [batch, total_len], position_ids,
                       past_key_values.{i}.key/.value [batch, kv_heads, past_len, head_dim];
                       outputs logits and present.{i}.key/.value.
  onnx-qwen2-past/     Qwen2ForCausalLM (qwen2-bias-bf16 in f32: q/k/v bias, MQA 4/1, tied
                       embeddings) exported with past KV like onnx-llama-past. transformers
                       4.44's Qwen2 gathers RoPE from precomputed cos/sin tables by position.
  onnx-llama-rope-interleaved/
                       llama-gqa-f32 with the q/k rows permuted as llama.cpp's converter does
                       and RoPE computed on adjacent pairs (2i, 2i+1) (GPT-J style), no past
                       KV. Mathematically the same function as the source model, so its logits
                       also match llama-gqa-f32's transformers oracle.
  onnx-mlp/            a small MLP (static shapes): not an LLM, builds in generic mode.
  onnx-llama-gelu/     a 1-layer Llama whose MLP is GELU, not SwiGLU (dynamic axes): an
                       LLM-looking graph infc must refuse with a clear error.
  onnx-llama-gelu-static/
                       the same with static shapes [1, 4]: not servable as an LLM either, but
                       it builds in generic mode.
  onnx-llama-extra-input/
                       the 1-layer Llama with SwiGLU plus a graph input it does not read
                       ("cache_position"): refused, naming the input.
Each LLM fixture has oracle.json: onnxruntime's logits at every position of the source
fixture's prompts and a 32-token greedy continuation. With past KV, onnxruntime runs the
prompt in two chunks (the first with past_len 0, the second fed the first's presents) and
then decodes one token per call feeding the presents back; the logits of the first
4 decode steps are recorded too ("decode_logits"). Without past KV it recomputes
the whole sequence per step.
"""
import os
import sys

import torch
import transformers.models.llama.modeling_llama as modeling_llama
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM

from onnx_oracle import write_oracle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
OPSET = 17


# --- models -------------------------------------------------------------------------------

def load_llama(src):
    return LlamaForCausalLM.from_pretrained(os.path.join(FIX, src), torch_dtype=torch.float32,
                                            attn_implementation="eager").eval()


def load_qwen2(src):
    return Qwen2ForCausalLM.from_pretrained(os.path.join(FIX, src), torch_dtype=torch.float32,
                                            attn_implementation="eager").eval()


def permute_rows(w, n_head):
    """llama.cpp's q/k permutation: row pairs (i, i + d/2) of each head become (2i, 2i+1)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rotate_every_two(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


@torch.no_grad()
def interleaved_rotary_forward(self, x, position_ids):
    inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.stack((freqs, freqs), dim=-1).flatten(-2)  # f0 f0 f1 f1 ...
    return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)


def interleaved_llama():
    model = load_llama("llama-gqa-f32")
    cfg = model.config
    for layer in model.model.layers:
        a = layer.self_attn
        a.q_proj.weight.data = permute_rows(a.q_proj.weight.data, cfg.num_attention_heads)
        a.k_proj.weight.data = permute_rows(a.k_proj.weight.data, cfg.num_key_value_heads)
    return model


def tiny_llama(act="silu"):
    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=64, hidden_act=act,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg).eval()


# --- export -------------------------------------------------------------------------------

class Prefill(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids):
        return self.model(input_ids=input_ids, position_ids=position_ids,
                          use_cache=False, return_dict=False)[0]


class WithPast(torch.nn.Module):
    """optimum's decoder-with-past signature over a legacy (tuple) cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.n_layers = model.config.num_hidden_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        pkv = tuple((past[2 * i], past[2 * i + 1]) for i in range(self.n_layers))
        logits, present = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                     position_ids=position_ids, past_key_values=pkv,
                                     use_cache=True, return_dict=False)
        return (logits, *[t for kv in present for t in kv])


def kv_shape(cfg, past_len):
    hd = cfg.hidden_size // cfg.num_attention_heads
    return (1, cfg.num_key_value_heads, past_len, hd)


def past_names(cfg, prefix, suffix=("key", "value")):
    return [f"{prefix}.{i}.{k}" for i in range(cfg.num_hidden_layers) for k in suffix]


def export_prefill(model, path, dynamic=True):
    ids = torch.tensor([[1, 5, 7, 9]], dtype=torch.int64)
    pos = torch.arange(4, dtype=torch.int64)[None]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "position_ids": {0: "batch", 1: "seq"},
            "logits": {0: "batch", 1: "seq"}}
    torch.onnx.export(Prefill(model), (ids, pos), path, opset_version=OPSET,
                      input_names=["input_ids", "position_ids"], output_names=["logits"],
                      dynamic_axes=axes if dynamic else None, do_constant_folding=True)


def export_past(model, path):
    cfg = model.config
    past_len, seq = 3, 4
    ids = torch.tensor([[1, 5, 7, 9]], dtype=torch.int64)
    mask = torch.ones(1, past_len + seq, dtype=torch.int64)
    pos = torch.arange(past_len, past_len + seq, dtype=torch.int64)[None]
    past = [torch.randn(*kv_shape(cfg, past_len)) for _ in range(2 * cfg.num_hidden_layers)]
    ins = ["input_ids", "attention_mask", "position_ids"] + past_names(cfg, "past_key_values")
    outs = ["logits"] + past_names(cfg, "present")
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
            "position_ids": {0: "batch_size", 1: "sequence_length"},
            "logits": {0: "batch_size", 1: "sequence_length"}}
    for n in ins[3:]:
        axes[n] = {0: "batch_size", 2: "past_sequence_length"}
    for n in outs[1:]:
        axes[n] = {0: "batch_size", 2: "total_sequence_length"}
    torch.onnx.export(WithPast(model), (ids, mask, pos, *past), path, opset_version=OPSET,
                      input_names=ins, output_names=outs, dynamic_axes=axes,
                      do_constant_folding=True)


# --- onnxruntime oracle (tools/onnx_oracle.py) ---------------------------------------------

def oracle(name, model, path, src):
    write_oracle(name, model.config, path, src,
                 f"torch.onnx.export (torch {torch.__version__}, opset {OPSET})")


# --- fixtures -----------------------------------------------------------------------------

def out_path(name):
    os.makedirs(os.path.join(FIX, name), exist_ok=True)
    return os.path.join(FIX, name, "model.onnx")


def gen_llama_gqa(name):
    model = load_llama("llama-gqa-f32")
    export_prefill(model, out_path(name))
    oracle(name, model, out_path(name), "llama-gqa-f32")


def gen_llama_past(name):
    model = load_llama("llama-gqa-f32")
    export_past(model, out_path(name))
    oracle(name, model, out_path(name), "llama-gqa-f32")


def gen_qwen2_past(name):
    model = load_qwen2("qwen2-bias-bf16")
    export_past(model, out_path(name))
    oracle(name, model, out_path(name), "qwen2-bias-bf16")


def gen_rope_interleaved(name):
    model = interleaved_llama()
    saved = modeling_llama.rotate_half, modeling_llama.LlamaRotaryEmbedding.forward
    modeling_llama.rotate_half = rotate_every_two
    modeling_llama.LlamaRotaryEmbedding.forward = interleaved_rotary_forward
    try:
        export_prefill(model, out_path(name))
    finally:
        modeling_llama.rotate_half, modeling_llama.LlamaRotaryEmbedding.forward = saved
    oracle(name, model, out_path(name), "llama-gqa-f32")


def gen_mlp(name):
    torch.manual_seed(3)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    torch.onnx.export(mlp.eval(), (torch.randn(2, 8),), out_path(name), opset_version=OPSET,
                      input_names=["x"], output_names=["y"])


def gen_gelu(name):
    export_prefill(tiny_llama("gelu"), out_path(name))


def gen_gelu_static(name):
    export_prefill(tiny_llama("gelu"), out_path(name), dynamic=False)


def gen_extra_input(name):
    import onnx
    path = out_path(name)
    export_prefill(tiny_llama(), path)
    m = onnx.load(path)
    m.graph.input.append(onnx.helper.make_tensor_value_info("cache_position",
                                                            onnx.TensorProto.INT64, ["seq"]))
    onnx.save(m, path)


FIXTURES = {"onnx-llama-gqa": gen_llama_gqa, "onnx-llama-past": gen_llama_past,
            "onnx-qwen2-past": gen_qwen2_past,
            "onnx-llama-rope-interleaved": gen_rope_interleaved, "onnx-mlp": gen_mlp,
            "onnx-llama-gelu": gen_gelu, "onnx-llama-gelu-static": gen_gelu_static,
            "onnx-llama-extra-input": gen_extra_input}


def main():
    names = sys.argv[1:] or list(FIXTURES)
    for n in names:
        if n not in FIXTURES:
            sys.exit(f"unknown fixture {n!r}; known: {', '.join(FIXTURES)}")
    with torch.no_grad():
        for n in names:
            FIXTURES[n](n)


if __name__ == "__main__":
    main()
