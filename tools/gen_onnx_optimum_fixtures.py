#!/usr/bin/env python3
"""Export the safetensors fixtures with `optimum-cli export onnx`, as HF's documentation
tells users to, and record onnxruntime's outputs on each file as its oracle
(tools/onnx_oracle.py).

optimum-onnx pins transformers 4.57, so it runs in a venv of its own, never in CI (the
fixtures it writes are committed):

    python3 -m venv /tmp/ov && /tmp/ov/bin/pip install optimum-onnx==0.1.0 onnxruntime
    /tmp/ov/bin/python tools/gen_onnx_optimum_fixtures.py [NAME ...]   # from the repo root

Checked with optimum-onnx 0.1.0 (optimum 2.1.0), transformers 4.57.6, torch 2.15,
onnxruntime 1.32. Tasks: text-generation (input_ids, attention_mask, position_ids ->
logits) and text-generation-with-past (plus past_key_values.{i}.* -> present.{i}.*); the
exporter's default attention (SDPA). Only model.onnx (and config.json, read for the
context length and special tokens) are kept.
"""
import os
import shutil
import subprocess
import sys
import tempfile

from importlib.metadata import version

import transformers
from transformers import AutoConfig

from onnx_oracle import FIX, write_oracle

FIXTURES = {  # name -> (source fixture, task)
    "onnx-optimum-llama": ("llama-gqa-f32", "text-generation"),
    "onnx-optimum-llama-past": ("llama-gqa-f32", "text-generation-with-past"),
    "onnx-optimum-qwen2-past": ("qwen2-bias-bf16", "text-generation-with-past"),
}


def main():
    names = sys.argv[1:] or list(FIXTURES)
    for n in names:
        if n not in FIXTURES:
            sys.exit(f"unknown fixture {n!r}; known: {', '.join(FIXTURES)}")
    cli = os.path.join(os.path.dirname(sys.executable), "optimum-cli")
    for n in names:
        src, task = FIXTURES[n]
        out = os.path.join(FIX, n)
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([cli, "export", "onnx", "--model", os.path.join(FIX, src), "--task",
                            task, tmp], check=True)
            for f in ("model.onnx", "config.json"):
                shutil.copy(os.path.join(tmp, f), os.path.join(out, f))
        exporter = (f"optimum-cli export onnx --task {task} (optimum-onnx {version('optimum-onnx')}, "
                    f"transformers {transformers.__version__})")
        write_oracle(n, AutoConfig.from_pretrained(os.path.join(FIX, src)),
                     os.path.join(out, "model.onnx"), src, exporter)


if __name__ == "__main__":
    main()
