#!/usr/bin/env python3
"""Export the safetensors fixtures to ONNX with torch's default (dynamo) exporter, as a
new user would today, and record onnxruntime's outputs on each file as its oracle.

Runs in a scratch venv, never in CI (the fixtures it writes are committed):

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch transformers onnx \
        onnxruntime onnxscript safetensors numpy
    /tmp/tv/bin/python tools/gen_onnx_dynamo_fixtures.py [NAME ...]   # from the repo root

Checked with torch 2.15, transformers 5.25, onnx 1.23, onnxscript 0.7, onnxruntime 1.32.
Each fixture under tests/fixtures/ is `torch.onnx.export(..., dynamo=True)` (opset 20, the
exporter's optimizer on, dynamic batch and sequence dims) of one HF model class with one
attention implementation, in one of two interfaces:
  - full sequence: input_ids [batch, seq] -> logits [batch, seq, vocab] (no KV cache; the
    model builds positions and the causal mask itself);
  - with past: optimum's decoder-with-past interface: input_ids, attention_mask
    [batch, past + seq], position_ids, past_key_values.{i}.key/.value
    [batch, kv_heads, past, head_dim] -> logits, present.{i}.key/.value.
A name ending in -extdata keeps its weights in external data (model.onnx.data beside it);
one ending in -f16 is the model in float16 (weights and activations, as model.half());
one ending in -opset23 is exported at opset 23, where the exporter emits the Attention,
RotaryEmbedding and RMSNormalization ops.
Sliding-window models (Mistral, Gemma 2/3) are exported full-sequence only: with past KV,
torch.export specializes transformers' sliding cache to contexts shorter than the window, so
onnxruntime's own outputs past it are no oracle.
oracle.json holds onnxruntime's logits at every position of the source fixture's prompts and
a 32-token greedy continuation (format of tools/gen_onnx_fixtures.py): with past, the prompt
runs in two chunks and decoding feeds the presents back, and the logits of the first decode
steps are recorded too.
"""
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

from onnx_oracle import FIX, head_dim, kv_shape, past_names, write_oracle





def load(src, attn):
    return AutoModelForCausalLM.from_pretrained(os.path.join(FIX, src), dtype=torch.float32,
                                                attn_implementation=attn).eval()


class Full(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


class WithPast(torch.nn.Module):
    """optimum's decoder-with-past interface over transformers' DynamicCache."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.n = model.config.num_hidden_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache(config=self.model.config)
        for i in range(self.n):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=cache, use_cache=True)
        pkv = out.past_key_values
        return (out.logits, *[t for i in range(self.n)
                              for t in (pkv.layers[i].keys, pkv.layers[i].values)])


def export(model, path, with_past, external=False, opset=None):
    cfg = model.config
    kw = {"opset_version": opset} if opset else {}
    batch = torch.export.Dim("batch", max=64)
    seq = torch.export.Dim("seq", max=cfg.max_position_embeddings)
    if not with_past:
        ids = torch.tensor([[1, 5, 7, 9, 11], [2, 4, 6, 8, 10]], dtype=torch.int64)
        torch.onnx.export(Full(model), (ids,), path, dynamo=True, external_data=external,
                          input_names=["input_ids"], output_names=["logits"],
                          dynamic_shapes={"input_ids": {0: batch, 1: seq}}, **kw)
        return
    past_len, n = 3, 4
    total = torch.export.Dim("total", max=cfg.max_position_embeddings)
    pastd = torch.export.Dim("past", max=cfg.max_position_embeddings)
    ids = torch.tensor([[1, 5, 7, 9], [2, 4, 6, 8]], dtype=torch.int64)
    mask = torch.ones(2, past_len + n, dtype=torch.int64)
    pos = torch.arange(past_len, past_len + n, dtype=torch.int64)[None].expand(2, -1)
    past = [torch.randn(*kv_shape(cfg, 2, past_len)) for _ in range(2 * cfg.num_hidden_layers)]
    ins = ["input_ids", "attention_mask", "position_ids"] + past_names(cfg, "past_key_values")
    outs = ["logits"] + past_names(cfg, "present")
    shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
              tuple([{0: batch, 2: pastd}] * len(past)))
    torch.onnx.export(WithPast(model), (ids, mask, pos, *past), path, dynamo=True,
                      external_data=external, input_names=ins, output_names=outs,
                      dynamic_shapes=shapes, **kw)


# --- an independent Llama in plain torch ------------------------------------------------

class PlainLlama(torch.nn.Module):
    """Llama written without transformers, the way other code bases do: one fused qkv
    Linear, GQA by repeat_interleave, positions from arange inside the graph (offset by the
    past length), a triu mask, rsqrt norms; with past, the KV cache is (input_ids, *past)."""

    def __init__(self, hf):
        super().__init__()
        cfg = hf.config
        self.cfg, self.n = cfg, cfg.num_hidden_layers
        self.h, self.kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, head_dim(cfg)
        self.eps = cfg.rms_norm_eps
        m = hf.model
        self.emb = m.embed_tokens.weight
        self.qkv = torch.nn.ParameterList()
        self.rest = torch.nn.ParameterList()
        for l in m.layers:
            a = l.self_attn
            self.qkv.append(torch.nn.Parameter(torch.cat(
                [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0)))
            self.rest.extend([l.input_layernorm.weight, a.o_proj.weight,
                              l.post_attention_layernorm.weight, l.mlp.gate_proj.weight,
                              l.mlp.up_proj.weight, l.mlp.down_proj.weight])
        self.norm, self.head = m.norm.weight, hf.lm_head.weight
        inv = 1.0 / (cfg.rope_parameters["rope_theta"]
                     ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        self.register_buffer("inv_freq", inv)

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x, cos, sin):
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return x * cos + torch.cat((-x2, x1), -1) * sin

    def forward(self, input_ids, *past):
        b, s = input_ids.shape
        p = past[0].shape[2] if past else 0
        pos = torch.arange(p, p + s, dtype=torch.float32)
        f = torch.outer(pos, self.inv_freq)
        cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
        mask = torch.triu(torch.full((s, p + s), float("-inf")), diagonal=p + 1)
        x, presents = torch.nn.functional.embedding(input_ids, self.emb), []
        g = self.h // self.kv
        for i in range(self.n):
            w_in, w_o, w_post, w_g, w_u, w_d = self.rest[6 * i: 6 * i + 6]
            q, k, v = (self.rms(x, w_in) @ self.qkv[i].T).split(
                [self.h * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
            q = self.rope(q.view(b, s, self.h, self.hd).transpose(1, 2), cos, sin)
            k = self.rope(k.view(b, s, self.kv, self.hd).transpose(1, 2), cos, sin)
            v = v.view(b, s, self.kv, self.hd).transpose(1, 2)
            if past:
                k, v = torch.cat((past[2 * i], k), 2), torch.cat((past[2 * i + 1], v), 2)
                presents += [k, v]
            att = (q @ k.repeat_interleave(g, 1).transpose(2, 3)) / self.hd ** 0.5 + mask
            o = att.softmax(-1) @ v.repeat_interleave(g, 1)
            x = x + o.transpose(1, 2).reshape(b, s, -1) @ w_o.T
            hh = self.rms(x, w_post)
            x = x + (torch.nn.functional.silu(hh @ w_g.T) * (hh @ w_u.T)) @ w_d.T
        logits = self.rms(x, self.norm) @ self.head.T
        return (logits, *presents) if past else logits


def export_plain(model, path, with_past):
    cfg = model.config
    plain = PlainLlama(model).eval()
    batch = torch.export.Dim("batch", max=64)
    seq = torch.export.Dim("seq", max=cfg.max_position_embeddings)
    ids = torch.tensor([[1, 5, 7, 9], [2, 4, 6, 8]], dtype=torch.int64)
    if not with_past:
        torch.onnx.export(plain, (ids,), path, dynamo=True, external_data=False,
                          input_names=["input_ids"], output_names=["logits"],
                          dynamic_shapes=({0: batch, 1: seq},))
        return
    pastd = torch.export.Dim("past", max=cfg.max_position_embeddings)
    past = [torch.randn(*kv_shape(cfg, 2, 3)) for _ in range(2 * cfg.num_hidden_layers)]
    torch.onnx.export(plain, (ids, *past), path, dynamo=True, external_data=False,
                      input_names=["input_ids"] + past_names(cfg, "past_key_values"),
                      output_names=["logits"] + past_names(cfg, "present"),
                      dynamic_shapes=({0: batch, 1: seq}, tuple([{0: batch, 2: pastd}] * len(past))))


# --- fixtures: name -> (source fixture, attention, with past) -----------------------------

FIXTURES = {
    "onnx-dynamo-llama-eager": ("llama-gqa-f32", "eager", False),
    "onnx-dynamo-llama-sdpa": ("llama-gqa-f32", "sdpa", False),
    "onnx-dynamo-llama-eager-past": ("llama-gqa-f32", "eager", True),
    "onnx-dynamo-llama-sdpa-past": ("llama-gqa-f32", "sdpa", True),
    "onnx-dynamo-qwen2-eager": ("qwen2-bias-bf16", "eager", False),
    "onnx-dynamo-qwen2-sdpa-past": ("qwen2-bias-bf16", "sdpa", True),
    "onnx-dynamo-qwen2-sdpa": ("qwen2-bias-bf16", "sdpa", False),
    "onnx-dynamo-qwen2-eager-past": ("qwen2-bias-bf16", "eager", True),
    "onnx-dynamo-qwen3-eager": ("qwen3-qknorm-bf16", "eager", False),
    "onnx-dynamo-qwen3-sdpa": ("qwen3-qknorm-bf16", "sdpa", False),
    "onnx-dynamo-qwen3-eager-past": ("qwen3-qknorm-bf16", "eager", True),
    "onnx-dynamo-qwen3-sdpa-past": ("qwen3-qknorm-bf16", "sdpa", True),
    "onnx-dynamo-phi3-sdpa": ("phi3-fused-f32", "sdpa", False),
    "onnx-dynamo-smollm3-sdpa-past": ("smollm3-nope-f32", "sdpa", True),
    "onnx-dynamo-llama3-rope-sdpa": ("llama3-rope-f32", "sdpa", False),
    "onnx-dynamo-mistral-swa-eager": ("mistral-swa-f32", "eager", False),
    "onnx-dynamo-gemma2-eager": ("gemma2-softcap-f32", "eager", False),
    "onnx-dynamo-gemma3-sdpa": ("gemma3-local-f32", "sdpa", False),
    "onnx-dynamo-phi3-eager-past": ("phi3-fused-f32", "eager", True),
    "onnx-dynamo-smollm3-eager": ("smollm3-nope-f32", "eager", False),
    "onnx-dynamo-llama-sdpa-past-extdata": ("llama-gqa-f32", "sdpa", True),
    "onnx-dynamo-llama-sdpa-opset23": ("llama-gqa-f32", "sdpa", False),
    "onnx-dynamo-qwen3-sdpa-past-opset23": ("qwen3-qknorm-bf16", "sdpa", True),
    "onnx-dynamo-llama-sdpa-f16": ("llama-gqa-f32", "sdpa", False),
    "onnx-plain-llama": ("llama-gqa-f32", "plain", False),
    "onnx-plain-llama-past": ("llama-gqa-f32", "plain", True),
}


# --- generic graphs with a dynamic batch ----------------------------------------------

GENERIC_BATCHES = (1, 5, 64)


def mlp():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 8), torch.nn.Softmax(-1)), (16,)


def cnn():
    torch.manual_seed(12)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)), (3, 16, 16)


GENERIC = {"onnx-dynamo-mlp": mlp, "onnx-dynamo-cnn": cnn}


def gen_generic(name):
    """model.onnx with input x [batch, ...] -> y; batch_N/input_0.pb and output_0.pb (the
    ONNX test-data layout): seeded inputs and onnxruntime's outputs at each batch size."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
    net, shape = GENERIC[name]()
    net = net.eval()
    for m in net.modules():  # BatchNorm with statistics that are not the identity
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    out = os.path.join(FIX, name)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "model.onnx")
    batch = torch.export.Dim("batch", max=64)
    torch.onnx.export(net, (torch.randn(2, *shape),), path, dynamo=True, external_data=False,
                      input_names=["x"], output_names=["y"], dynamic_shapes=({0: batch},))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for b in GENERIC_BATCHES:
        x = rng.standard_normal((b, *shape)).astype(np.float32)
        y = sess.run(None, {"x": x})[0]
        d = os.path.join(out, f"batch_{b}")
        os.makedirs(d, exist_ok=True)
        onnx.save_tensor(numpy_helper.from_array(x, "x"), os.path.join(d, "input_0.pb"))
        onnx.save_tensor(numpy_helper.from_array(y, "y"), os.path.join(d, "output_0.pb"))
    print(f"{name}: onnxruntime outputs at batch {', '.join(map(str, GENERIC_BATCHES))}")


def main():
    names = sys.argv[1:] or list(FIXTURES) + list(GENERIC)
    for n in names:
        if n not in FIXTURES and n not in GENERIC:
            sys.exit(f"unknown fixture {n!r}; known: {', '.join(list(FIXTURES) + list(GENERIC))}")
    for n in names:
        if n in GENERIC:
            gen_generic(n)
            continue
        src, attn, with_past = FIXTURES[n]
        model = load(src, "eager" if attn == "plain" else attn)
        if n.endswith("-f16"):
            model = model.half()
        os.makedirs(os.path.join(FIX, n), exist_ok=True)
        path = os.path.join(FIX, n, "model.onnx")
        if attn == "plain":
            export_plain(model, path, with_past)
        else:
            export(model, path, with_past, external=n.endswith("-extdata"),
                   opset=23 if n.endswith("-opset23") else None)
        exporter = (f"torch.onnx.export(dynamo=True) (torch {torch.__version__}, "
                    + (f"transformers {transformers.__version__}, attention {attn})"
                       if attn != "plain" else
                       "plain-torch Llama, tools/gen_onnx_dynamo_fixtures.py's PlainLlama)"))
        write_oracle(n, model.config, path, src, exporter)


if __name__ == "__main__":
    main()
