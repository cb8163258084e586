#!/usr/bin/env python3
"""check-llamacpp-logits: our logits against llama.cpp's on one GGUF, position by position.

For a GGUF without a real vocabulary (tools/gen_random_gguf.py's presets: the
gemma2-check / gemma3-check shapes have windows of 64 and soft caps that bite), feeds
seeded random token ids through both engines teacher-forced and compares the logits of
every position: the largest |ours - llama.cpp| / max |llama.cpp| of a row, and how often
the argmax agrees. It checks how we read an architecture's GGUF form (norms, rope bases,
sliding-window pattern, scales, soft caps) against llama.cpp's own reading of it, where
no HF checkpoint of the file exists. An f32 GGUF with --act-dtype f32 is the
like-for-like case: both compute in f32, and only summation order differs.

usage: tools/check-llamacpp-logits.py --gguf FILE [--build DIR] [--len 200] [--seed 1]
                                     [--threads 2] [--act-dtype f32|auto] [--tol 1e-3]
       exits 1 when a row differs by more than --tol or an argmax differs.
Needs: pip install llama-cpp-python numpy.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"check-llamacpp-logits: {' '.join(cmd[:3])} ...: {r.stderr.strip()}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--len", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--act-dtype", choices=["f32", "auto"], default="f32")
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()
    import llama_cpp

    # an f32 KV cache on both sides (llama.cpp's default is f16; type 0 is GGML_TYPE_F32)
    llm = llama_cpp.Llama(a.gguf, n_ctx=max(512, a.len + 8), n_batch=max(512, a.len + 8),
                          n_threads=a.threads, logits_all=True, verbose=False, type_k=0,
                          type_v=0)
    vocab = llm.n_vocab()
    ids = np.random.default_rng(a.seed).integers(3, vocab, a.len).tolist()
    llm.reset()
    llm.eval(ids)
    ref = np.array(llm.scores[:len(ids)], dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "m.plan")
        run([os.path.join(a.build, "infc"), "build", a.gguf, "-o", plan, "--act-dtype",
             a.act_dtype, "--max-context", str(max(512, a.len + 8))])
        out = os.path.join(tmp, "logits.f32")
        run([os.path.join(a.build, "dump_logits"), plan, "--ids", ",".join(map(str, ids)),
             "--threads", str(a.threads), "--out", out])
        ours = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
    rel = np.max(np.abs(ref - ours), axis=1) / np.abs(ref).max(axis=1)
    agree = np.argmax(ref, 1) == np.argmax(ours, 1)
    print(f"{os.path.basename(a.gguf)}: {len(ids)} positions, max |ours - llama.cpp| / "
          f"max |llama.cpp| per row {rel.max():.3g} (position {int(rel.argmax())}), "
          f"argmax agreement {agree.mean() * 100:.1f}%")
    worst = np.argsort(rel)[-3:][::-1]
    print("  worst rows: " + ", ".join(f"{int(i)}: {rel[i]:.3g}" for i in worst))
    return 0 if rel.max() <= a.tol and agree.all() else 1


if __name__ == "__main__":
    sys.exit(main())
