#!/usr/bin/env python3
"""gpu_bench: the PyTorch half of tools/gpu-check (issue 9), run with the lent machine's own
python3 (torch + transformers). Every number it prints it measured in this run.

  bandwidth                 device-to-device copy: GB/s counting bytes read + written
  matmul                    bf16 8192^3 matrix product: TFLOP/s on random data
  model OUT_DIR             SmolLM2-135M as config.json + model.safetensors: a local copy if
                            $SMOLLM2_DIR or the Hugging Face cache has one, else the same
                            architecture with seeded random weights (prints which)
  generate DIR --batch B    transformers generate, greedy: decode tokens/s at batch B
  prefill DIR --tokens N    one forward pass over N prompt tokens: tokens/s
  greedy DIR --ids 1,2 -n K greedy ids (f32 on the device) for comparison with inferrt
Output: one JSON object on stdout. --device cpu runs the torch parts on the CPU (dry run)."""
import argparse
import glob
import json
import os
import statistics
import sys
import time

SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05, "rope_theta": 100000.0, "tie_word_embeddings": True,
    "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False,
    "mlp_bias": False, "initializer_range": 0.041666666666666664, "torch_dtype": "bfloat16",
}


def timed(fn, dev, reps):
    """Median seconds of fn() over reps runs after one warm-up (device events on CUDA)."""
    import torch
    fn()
    ts = []
    for _ in range(reps):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def cmd_bandwidth(a):
    import torch
    n = (2 << 30) // 4 if a.device == "cuda" else (64 << 20) // 4
    x = torch.rand(n, device=a.device)
    y = torch.empty_like(x)
    t = timed(lambda: y.copy_(x), a.device, 20)
    return {"bandwidth_GBps": 2 * n * 4 / t / 1e9, "bytes": 2 * n * 4}


def cmd_matmul(a):
    import torch
    n = 8192 if a.device == "cuda" else 512
    dt = torch.bfloat16 if a.device == "cuda" else torch.float32
    x, y = torch.randn(n, n, device=a.device, dtype=dt), torch.randn(n, n, device=a.device, dtype=dt)
    t = timed(lambda: x @ y, a.device, 10)
    return {"matmul_TFLOPs": 2 * n ** 3 / t / 1e12, "n": n, "dtype": str(dt)}


def find_local():
    cands = [os.environ.get("SMOLLM2_DIR", "")]
    hub = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
    for name in ("SmolLM2-135M-Instruct", "SmolLM2-135M"):
        cands += sorted(glob.glob(f"{hub}/hub/models--HuggingFaceTB--{name}/snapshots/*"))
    for c in cands:
        if c and os.path.exists(os.path.join(c, "config.json")) and glob.glob(os.path.join(c, "*.safetensors")):
            return c
    return None


def cmd_model(a):
    local = find_local()
    if local:
        return {"model": local, "weights": "SmolLM2-135M (local copy)"}
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(20261129)
    cfg = LlamaConfig(**{k: v for k, v in SMOLLM2_135M.items() if k not in ("architectures", "model_type", "torch_dtype")})
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(a.out, safe_serialization=True)
    with open(os.path.join(a.out, "config.json")) as f:
        c = json.load(f)
    c["torch_dtype"] = "bfloat16"
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    return {"model": a.out, "weights": "SmolLM2-135M architecture, seeded random weights "
            "(no local copy of the checkpoint on this machine)"}


def load(a, dtype):
    import torch
    from transformers import AutoModelForCausalLM
    import transformers
    # loaded in the dtype it runs in (an 8B checkpoint in f32 would be 32 GB first);
    # transformers before 4.56 names the argument torch_dtype
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    m = AutoModelForCausalLM.from_pretrained(a.dir, **{key: dtype})
    return m.to(device=a.device, dtype=dtype).eval()


def cmd_generate(a):
    import torch
    m = load(a, torch.bfloat16 if a.device == "cuda" else torch.float32)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, m.config.vocab_size, (a.batch, a.prompt_len), generator=g).to(a.device)
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        gen = lambda n: m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        gen(4)  # warm-up
        t_pf = timed(lambda: m(ids, attention_mask=mask), a.device, 3)
        t = timed(lambda: gen(a.new), a.device, 1)
    return {"batch": a.batch, "new_tokens": a.new, "seconds": t, "prefill_seconds": t_pf,
            "decode_tokens_per_s": a.batch * a.new / max(t - t_pf, 1e-9)}


def cmd_prefill(a):
    import torch
    m = load(a, torch.bfloat16 if a.device == "cuda" else torch.float32)
    ids = torch.randint(3, m.config.vocab_size, (1, a.tokens), generator=torch.Generator().manual_seed(3)).to(a.device)
    with torch.inference_mode():
        t = timed(lambda: m(ids), a.device, 5)
    return {"tokens": a.tokens, "prefill_tokens_per_s": a.tokens / t}


def cmd_greedy(a):
    import torch
    m = load(a, torch.float32)
    ids = torch.tensor([[int(x) for x in a.ids.split(",")]], device=a.device)
    with torch.inference_mode():
        out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.n,
                         min_new_tokens=a.n, do_sample=False, pad_token_id=0, eos_token_id=None)
    return {"generated_ids": out[0, ids.shape[1]:].tolist()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("bandwidth")
    sub.add_parser("matmul")
    s = sub.add_parser("model")
    s.add_argument("out")
    s = sub.add_parser("generate")
    s.add_argument("dir")
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--prompt-len", type=int, default=32)
    s.add_argument("--new", type=int, default=128)
    s = sub.add_parser("prefill")
    s.add_argument("dir")
    s.add_argument("--tokens", type=int, default=512)
    s = sub.add_parser("greedy")
    s.add_argument("dir")
    s.add_argument("--ids", required=True)
    s.add_argument("-n", type=int, default=32)
    a = p.parse_args()
    if a.cmd != "model" or not find_local():
        import torch
        if a.device is None:
            a.device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {"bandwidth": cmd_bandwidth, "matmul": cmd_matmul, "model": cmd_model,
           "generate": cmd_generate, "prefill": cmd_prefill, "greedy": cmd_greedy}[a.cmd](a)
    out["device"] = a.device
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
