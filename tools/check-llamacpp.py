#!/usr/bin/env python3
"""check-llamacpp: infc/inferrt against llama.cpp (PyPI llama-cpp-python) on one GGUF.

For 10 prompts (token ids from llama.cpp's own tokenizer, plain text and the ChatML chat
form), greedy-decodes up to N tokens with both engines and reports how many tokens agree
before the first divergence; then teacher-forces a longer text through both and reports
how often the next-token argmax agrees; then decode tokens/s at batch 1 for both.

Two llama.cpp references: the GGUF as given (llama.cpp quantizes activations to 8 bits
per 32 values for its quantized dot products, as our default CPU plans do: --act-dtype
auto), and, when gguf-py is installed (pip install gguf), the same weights dequantized
exactly to an F32 GGUF, where llama.cpp computes in f32 as a plan built with
--act-dtype f32 does: the like-for-like check for that path.

Our side: `infc build` makes the plan, `inferrt generate --json` decodes, and
`dump_logits` (a tool target built by CMake next to them) writes per-position logits.

usage: tools/check-llamacpp.py [--gguf FILE] [--build DIR] [--threads 2] [-n 64]
                              [--act-dtype auto|int8|f32]
       (default --gguf: whatever tools/get-smollm2 prints)
Needs: pip install llama-cpp-python numpy [gguf].
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPTS = [
    ("text", "The capital of France is"),
    ("text", "Once upon a time, in a small village by the sea, there lived"),
    ("text", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("text", "The three primary colors are"),
    ("text", "Water boils at 100 degrees Celsius at sea level because"),
    ("chat", "What is the tallest mountain in the world?"),
    ("chat", "Write a haiku about autumn leaves."),
    ("chat", "Explain photosynthesis to a ten-year-old in two sentences."),
    ("chat", "List three tips for staying focused while studying."),
    ("chat", "Translate 'good morning, how are you?' into French."),
]

LONG_TEXT = (
    "The history of computing is a story of people trying to make machines do arithmetic "
    "faster and more reliably than humans could. Early mechanical calculators, such as "
    "Pascal's adding machine and Leibniz's stepped reckoner, could add and multiply, but "
    "they were slow and expensive. In the nineteenth century Charles Babbage designed the "
    "Analytical Engine, a general-purpose machine with a memory and a mill, and Ada "
    "Lovelace wrote what many consider the first program for it. The engine was never "
    "finished. A century later, electronic computers built from vacuum tubes filled whole "
    "rooms, consumed enormous amounts of power and broke down often. The invention of the "
    "transistor, and then of the integrated circuit, made computers smaller, cheaper and "
    "far more dependable. Today a phone in a pocket holds more computing power than all "
    "the machines of the 1960s put together, and programs written by millions of people "
    "run on it every day. Yet the basic ideas, a processor that follows instructions and a "
    "memory that holds both the program and its data, are the ones those early pioneers "
    "described."
)


def chat(text):
    return "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"check-llamacpp: {' '.join(cmd[:2])} failed:\n{r.stderr}")
    return r.stdout


def last_logits(llm):
    import llama_cpp
    p = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(p, shape=(llm.n_vocab(),))


def llama_greedy(llm, ids, n, eos):
    llm.reset()
    llm.eval(ids)
    out = []
    while len(out) < n:
        tok = int(np.argmax(last_logits(llm)))  # lowest id on ties, as ours
        out.append(tok)
        if tok == eos:
            break
        llm.eval([tok])
    return out


def ours_generate(build, plan, ids, n, threads, ignore_eos=False):
    cmd = [os.path.join(build, "inferrt"), "generate", plan, "--prompt-ids",
           ",".join(map(str, ids)), "-n", str(n), "--json", "--threads", str(threads)]
    if ignore_eos:
        cmd.append("--ignore-eos")
    return json.loads(run(cmd))


def common_prefix(a, b):
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return k


def greedy_section(llm, args, plan, eos, label):
    print(f"== greedy vs llama.cpp on {label}, up to {args.n} tokens (stopping at eos {eos}) ==")
    ok32, refs = 0, []
    for kind, text in PROMPTS:
        ids = llm.tokenize((chat(text) if kind == "chat" else text).encode(), add_bos=False,
                           special=True)
        ref = llama_greedy(llm, ids, args.n, eos)
        refs.append(ref)
        ours = ours_generate(args.build, plan, ids, args.n, args.threads)["generated_ids"]
        k = common_prefix(ref, ours)
        same = ref == ours
        # "first 32 identical": 32 matching tokens, or identical sequences that ended sooner
        first32 = k >= 32 or same
        ok32 += first32
        tail = "identical" if same else f"diverge: llama.cpp {ref[k:k + 3]}, ours {ours[k:k + 3]}"
        print(f"  [{kind}] {text[:40]!r:44} {len(ids):3d} ids, {k:2d}/{len(ref):2d} match ({tail})")
    print(f"  first 32 tokens identical on {ok32}/{len(PROMPTS)} prompts")
    return refs


def teacher_forced(llm_all, args, plan, label):
    ids = llm_all.tokenize(LONG_TEXT.encode(), add_bos=False, special=False)
    llm_all.reset()
    llm_all.eval(ids)
    ref = np.array(llm_all.scores[:len(ids)], dtype=np.float32)
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        run([os.path.join(args.build, "dump_logits"), plan, "--ids", ",".join(map(str, ids)),
             "--threads", str(args.threads), "--out", f.name])
        ours = np.fromfile(f.name, dtype=np.float32).reshape(len(ids), -1)
    agree = float(np.mean(np.argmax(ref, 1) == np.argmax(ours, 1)))
    scale = np.abs(ref).max(axis=1, keepdims=True)
    rel = float(np.max(np.abs(ref - ours) / scale))
    print(f"== teacher-forced vs llama.cpp on {label}, {len(ids)} tokens of text ==")
    print(f"  next-token argmax agreement {agree * 100:.1f}%; max |logit diff| / max |logit| "
          f"per row {rel:.3g}")
    return ref


def llama_decode_tps(llm, ids, n):
    """Decode tokens/s by llama.cpp's own eval timer (no Python overhead), and by wall."""
    import llama_cpp
    llm.reset()
    llm.eval(ids)
    llama_cpp.llama_perf_context_reset(llm.ctx)
    t0 = time.perf_counter()
    for _ in range(n - 1):  # as inferrt: n - 1 decode steps after the prefill
        llm.eval([int(np.argmax(last_logits(llm)))])
    wall = (n - 1) / (time.perf_counter() - t0)
    perf = llama_cpp.llama_perf_context(llm.ctx)
    own = perf.n_eval / (perf.t_eval_ms / 1e3) if perf.n_eval and perf.t_eval_ms > 0 else wall
    return own, wall


def speed(llm, args, plan):
    """Best of a few alternating runs: the machine may be shared, the best is the least
    disturbed measurement of each."""
    ids = llm.tokenize(b"The history of computing is a story of", add_bos=False)
    n, ours, ref, ref_wall = args.n, 0.0, 0.0, 0.0
    for _ in range(args.repeats):
        r = ours_generate(args.build, plan, ids, n, args.threads, ignore_eos=True)
        ours = max(ours, r["timings"]["decode_tokens_per_s"])
        own, wall = llama_decode_tps(llm, ids, n)
        ref, ref_wall = max(ref, own), max(ref_wall, wall)
    print(f"== decode speed, batch 1, {args.threads} threads, {n} tokens, best of "
          f"{args.repeats} ==")
    print(f"  inferrt {ours:.1f} tok/s, llama.cpp {ref:.1f} tok/s by its eval timer "
          f"({ref_wall:.1f} by wall clock through Python); ratio {ours / ref:.2f}")


def dequantize_gguf(src, dst):
    """Writes src with every tensor dequantized to F32 (gguf-py); False without gguf-py."""
    try:
        from gguf import GGUFReader, GGUFValueType, GGUFWriter
        from gguf.quants import dequantize
    except ImportError:
        print("(gguf-py not installed: skipping the dequantized-F32 reference)")
        return False
    r = GGUFReader(src)
    w = GGUFWriter(dst, r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vt, sub_type=sub)
    for t in r.tensors:
        data = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape([int(x) for x in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3, help="speed runs (best is kept)")
    ap.add_argument("--act-dtype", default="auto",
                    help="infc build --act-dtype: int8 (auto on the CPU) or f32 activations")
    args = ap.parse_args()
    import llama_cpp

    gguf = args.gguf or run([os.path.join(ROOT, "tools", "get-smollm2")]).strip()
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "model.plan")
        run([os.path.join(args.build, "infc"), "build", gguf, "-o", plan,
             "--max-context", str(args.ctx), "--act-dtype", args.act_dtype])
        refs = [("the GGUF as given", gguf)]
        f32 = os.path.join(tmp, "dequantized-f32.gguf")
        if dequantize_gguf(gguf, f32):
            refs.append(("its weights dequantized to F32", f32))
        print(f"model {gguf}; llama-cpp-python {llama_cpp.__version__}")
        greedy, forced = [], []
        for label, path in refs:
            # f32 KV cache on both sides, so that only the matmul arithmetic can differ
            common = dict(model_path=path, n_ctx=args.ctx, n_threads=args.threads,
                          n_threads_batch=args.threads, seed=0, verbose=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
            llm = llama_cpp.Llama(**common)
            greedy.append(greedy_section(llm, args, plan, llm.token_eos(), label))
            llm_all = llama_cpp.Llama(logits_all=True, **common)
            forced.append(teacher_forced(llm_all, args, plan, label))
            del llm_all
            if path == gguf:
                speed(llm, args, plan)
            del llm
        if len(greedy) == 2:  # how far llama.cpp's 8-bit activations move llama.cpp itself
            same = [common_prefix(a, b) >= 32 or a == b for a, b in zip(*greedy)]
            agree = float(np.mean(forced[0].argmax(1) == forced[1].argmax(1)))
            print(f"== llama.cpp on the GGUF vs llama.cpp on the dequantized F32 copy ==\n"
                  f"  greedy: first 32 tokens identical on {sum(same)}/{len(same)} prompts; "
                  f"teacher-forced argmax agreement {agree * 100:.1f}%")


if __name__ == "__main__":
    main()
