"""onnx_oracle: onnxruntime as the oracle of an exported causal-LM ONNX fixture (shared by
tools/gen_onnx_dynamo_fixtures.py and tools/gen_onnx_optimum_fixtures.py).

write_oracle runs the file on the source fixture's prompts and writes oracle.json beside it:
onnxruntime's logits at every prompt position and a 32-token greedy continuation. With past
KV (inputs past_key_values.{i}.key/.value) the prompt runs in two chunks (the first with
past 0, the second fed the first's presents) and decoding feeds the presents back; the
logits of the first decode steps are recorded too ("decode_logits"). Without, the whole
sequence is recomputed per step. attention_mask and position_ids are fed when the graph has
them.
"""
import json
import os

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
NUM_GENERATE = 32
DECODE_LOGITS = 4


def head_dim(cfg):
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def kv_shape(cfg, batch, past):
    return (batch, cfg.num_key_value_heads, past, head_dim(cfg))


def past_names(cfg, prefix):
    return [f"{prefix}.{i}.{k}" for i in range(cfg.num_hidden_layers) for k in ("key", "value")]


class Runner:
    def __init__(self, path, cfg):
        self.sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.cfg = cfg
        self.names = {i.name for i in self.sess.get_inputs()}
        self.past = any(n.startswith("past_key_values.") for n in self.names)

    def start(self):
        self.ids = []
        self.kv = [np.zeros(kv_shape(self.cfg, 1, 0), np.float32)
                   for _ in range(2 * self.cfg.num_hidden_layers)]

    def run(self, feed):
        return self.sess.run(None, {k: v for k, v in feed.items() if k in self.names})

    def feed(self, new):
        """Logits [len(new), vocab] of the new tokens after everything fed so far."""
        p = len(self.ids) if self.past else 0
        self.ids += list(new)
        ids = new if self.past else self.ids
        feed = {"input_ids": np.array([ids], dtype=np.int64),
                "attention_mask": np.ones((1, len(self.ids)), dtype=np.int64),
                "position_ids": np.arange(p, len(self.ids), dtype=np.int64)[None]}
        if not self.past:
            return self.run(feed)[0][0][-len(new):]
        feed.update(zip(past_names(self.cfg, "past_key_values"), self.kv))
        out = self.run(feed)
        self.kv = out[1:]
        assert self.kv[0].shape[2] == len(self.ids)
        return out[0][0]


def record(runner, prompts):
    logits, greedy, decode = [], [], []
    for p in prompts:
        runner.start()
        cut = len(p) // 2 if runner.past and len(p) > 1 else len(p)
        lg = runner.feed(p[:cut])
        if cut < len(p):
            lg = np.concatenate([lg, runner.feed(p[cut:])])
        logits.append(lg)
        gen, steps, last = [], [], lg[-1]
        for i in range(NUM_GENERATE):
            gen.append(int(np.argmax(last)))
            last = runner.feed([gen[-1]])[-1]
            if i < DECODE_LOGITS:
                steps.append(last)
        greedy.append(gen)
        decode.append(steps)
    return logits, greedy, decode


def rows(a):
    return [[round(float(v), 6) for v in row] for row in a]


def write_oracle(name, cfg, path, src, exporter):
    runner = Runner(path, cfg)
    hf = json.load(open(os.path.join(FIX, src, "oracle.json")))
    logits, greedy, decode = record(runner, hf["prompts"])
    worst = max(float(np.max(np.abs(lg - np.array(w)))) for lg, w in zip(logits, hf["logits"]))
    print(f"{name}: onnxruntime vs transformers ({src}): max |logit diff| {worst:.3g}, "
          f"greedy equal: {greedy == hf['greedy']}")
    out = {"model": name, "source": src, "exporter": exporter,
           "onnxruntime_version": ort.__version__, "past_kv": runner.past,
           "prompts": hf["prompts"], "logits": [rows(lg) for lg in logits], "greedy": greedy}
    if runner.past:
        out["decode_logits"] = [rows(s) for s in decode]
    with open(os.path.join(os.path.dirname(path), "oracle.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
