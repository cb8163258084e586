#!/usr/bin/python3
"""Export the tiny Llama fixture to ONNX and record onnxruntime's outputs as the oracle.

    /usr/bin/python3 -m pip install --break-system-packages onnx onnxruntime
    /usr/bin/python3 tools/gen_onnx_fixtures.py          # from the repo root

Reads tests/fixtures/llama-gqa-f32 (made by tools/gen_fixtures.py) and writes
tests/fixtures/onnx-llama-gqa/:
  model.onnx   torch.onnx.export of LlamaForCausalLM (eager attention, no past KV):
               inputs input_ids [batch, seq] and position_ids [batch, seq] (i64),
               output logits [batch, seq, vocab] f32; weights inline.
  oracle.json  onnxruntime's logits at every position of the same prompts as the HF
               oracle, and a 32-token greedy continuation computed by onnxruntime
               (full recompute each step).
"""
import json
import os

import numpy as np
import onnxruntime as ort
import torch
from transformers import LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "fixtures", "llama-gqa-f32")
OUT = os.path.join(ROOT, "tests", "fixtures", "onnx-llama-gqa")
NUM_GENERATE = 32


class Prefill(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids):
        return self.model(input_ids=input_ids, position_ids=position_ids,
                          use_cache=False, return_dict=False)[0]


def export(model, path):
    ids = torch.tensor([[1, 5, 7, 9]], dtype=torch.int64)
    pos = torch.arange(4, dtype=torch.int64)[None]
    torch.onnx.export(Prefill(model), (ids, pos), path, opset_version=17,
                      input_names=["input_ids", "position_ids"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                    "position_ids": {0: "batch", 1: "seq"},
                                    "logits": {0: "batch", 1: "seq"}},
                      do_constant_folding=True)


def run(sess, ids):
    ids = np.array([ids], dtype=np.int64)
    pos = np.arange(ids.shape[1], dtype=np.int64)[None]
    return sess.run(["logits"], {"input_ids": ids, "position_ids": pos})[0][0]


def main():
    os.makedirs(OUT, exist_ok=True)
    model = LlamaForCausalLM.from_pretrained(SRC, torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
    path = os.path.join(OUT, "model.onnx")
    with torch.no_grad():
        export(model, path)
    hf = json.load(open(os.path.join(SRC, "oracle.json")))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    logits, greedy, worst = [], [], 0.0
    for p, want in zip(hf["prompts"], hf["logits"]):
        lg = run(sess, p)
        worst = max(worst, float(np.max(np.abs(lg - np.array(want)))))
        logits.append([[round(float(v), 6) for v in row] for row in lg])
        ids, gen = list(p), []
        for _ in range(NUM_GENERATE):
            t = int(np.argmax(run(sess, ids)[-1]))
            gen.append(t)
            ids.append(t)
        greedy.append(gen)
    agree = greedy == hf["greedy"]
    print(f"onnxruntime vs transformers: max |logit diff| {worst:.3g}, greedy equal: {agree}")
    oracle = {"model": "onnx-llama-gqa", "source": "llama-gqa-f32",
              "exporter": f"torch.onnx.export (torch {torch.__version__}, opset 17)",
              "onnxruntime_version": ort.__version__, "prompts": hf["prompts"],
              "logits": logits, "greedy": greedy}
    with open(os.path.join(OUT, "oracle.json"), "w") as f:
        json.dump(oracle, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
