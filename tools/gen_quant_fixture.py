#!/usr/bin/env python3
"""gen_quant_fixture: the oracle for kn_quant_row (infc --quant q8_0|q4_0|q4_1).

Writes tests/fixtures/quant-blocks/blocks.json: rows of f32 values (as IEEE bit patterns,
so nothing is lost in text) and the q8_0, q4_0 and q4_1 blocks gguf-py's quantizers (the
numpy port of ggml's reference C) make of them, as hex. The rows hold random values at
several scales and the edge cases: a zero block, equal values (q4_1's d = 0), the largest
magnitude negative and positive, exact halves at the rounding boundaries, values far
apart in one block.

usage: tools/gen_quant_fixture.py  (needs: pip install gguf numpy)
"""
import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rows():
    rng = np.random.default_rng(7)
    out = [rng.standard_normal(32 * 8) * s for s in (1.0, 0.02, 300.0)]
    edge = [np.zeros(32), np.full(32, 0.75), np.full(32, -3.0)]
    b = rng.standard_normal(32)
    b[5] = -9.0  # largest magnitude negative (q4_0's d > 0)
    edge.append(b)
    b = rng.standard_normal(32)
    b[30] = 9.0
    edge.append(b)
    edge.append(np.array([(i - 16) * 0.5 for i in range(32)]))  # halves: rounding ties
    edge.append(np.array([127.0 * (i % 3 - 1) + 0.5 * i for i in range(32)]))
    b = rng.standard_normal(32) * 1e-3
    b[0] = 1e4  # far apart
    edge.append(b)
    b = rng.standard_normal(32)
    b[3], b[9] = 4.0, -4.0  # equal magnitudes: the first is the one
    edge.append(b)
    out.append(np.concatenate(edge))
    return [r.astype(np.float32) for r in out]


def main():
    data = []
    for r in rows():
        entry = {"bits": [int(v) for v in r.view(np.uint32)]}
        for name, t in (("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("q4_1", T.Q4_1)):
            entry[name] = quants.quantize(r.reshape(1, -1), t).tobytes().hex()
        data.append(entry)
    path = os.path.join(ROOT, "tests", "fixtures", "quant-blocks", "blocks.json")
    with open(path, "w") as f:
        json.dump({"generator": "tools/gen_quant_fixture.py (gguf-py quants)", "rows": data}, f)
        f.write("\n")
    print(f"wrote {path}: {len(data)} rows")


if __name__ == "__main__":
    main()
