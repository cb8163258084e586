#!/usr/bin/env python3
"""Token masks of the engine's grammars against llama.cpp's grammar sampler (the oracle),
on a real vocabulary. For every grammar of tests/fixtures/grammar/cases.json (the GBNF
ones as written; regular expressions, JSON mode and the JSON Schemas as the engine turns
them into GBNF, which llama.cpp then reads itself), every accepted string is tokenized by llama.cpp and, after
each of its token prefixes, the set of tokens allowed next is compared: ours from
build/grammar_mask, llama.cpp's from llama_sampler_init_grammar applied to the whole
vocabulary. Control tokens are left out (llama.cpp matches their text, the engine never
lets a grammar produce them).

usage: tools/check-grammar-llamacpp.py [--build build] [--gguf model.gguf] [--plan P]
                                      [--max-strings N]
needs: llama-cpp-python; the GGUF defaults to tools/get-smollm2's, the plan (for its
tokenizer) is built from it unless given."""
import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import tempfile

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def llama_mask(vocab, n_vocab, gbnf, prefix):
    smpl = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not smpl:
        raise RuntimeError("llama.cpp refused the grammar")
    out = []
    arr = (llama_cpp.llama_token_data * n_vocab)()
    for k in range(len(prefix) + 1):
        for i in range(n_vocab):
            arr[i].id, arr[i].logit, arr[i].p = i, 0.0, 0.0
        cur = llama_cpp.llama_token_data_array(data=arr, size=n_vocab, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
        out.append({arr[i].id for i in range(cur.size) if arr[i].logit != -math.inf})
        if k < len(prefix):
            if prefix[k] not in out[-1]:
                break
            llama_cpp.llama_sampler_accept(smpl, prefix[k])
    llama_cpp.llama_sampler_free(smpl)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--gguf")
    ap.add_argument("--plan")
    ap.add_argument("--max-strings", type=int, default=12)
    a = ap.parse_args()
    gguf = a.gguf or subprocess.run([os.path.join(ROOT, "tools", "get-smollm2")], check=True,
                                    capture_output=True, text=True).stdout.strip()
    tmp = tempfile.mkdtemp()
    plan = a.plan or os.path.join(tmp, "vocab.plan")
    if not a.plan:
        subprocess.run([os.path.join(a.build, "infc"), "build", gguf, "-o", plan], check=True,
                       capture_output=True)
    llm = llama_cpp.Llama(gguf, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    control = {i for i in range(n_vocab) if llama_cpp.llama_vocab_is_control(vocab, i)}
    cases = json.load(open(os.path.join(ROOT, "tests", "fixtures", "grammar", "cases.json")))
    total = bad = 0
    for gi, grp in enumerate(cases["groups"]):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            if "gbnf" in grp:
                f.write(grp["gbnf"])
                mode = "--gbnf"
            elif "regex" in grp:
                f.write(grp["regex"])
                mode = "--regex"
            elif "schema" in grp:
                json.dump(grp["schema"], f)
                mode = "--json-schema"
            else:
                mode = "--json-object"
        strings = [s for s, ok in grp["cases"] if ok][: a.max_strings]
        prefixes = [llm.tokenize(s.encode(), add_bos=False, special=False) for s in strings]
        lines = "".join(",".join(map(str, p[:k])) + "\n" for p in prefixes for k in range(len(p) + 1))
        r = subprocess.run([os.path.join(a.build, "grammar_mask"), plan, mode, f.name],
                           input=lines, capture_output=True, text=True)
        os.unlink(f.name)
        if r.returncode:
            print(r.stderr, file=sys.stderr)
            return 1
        out = r.stdout.splitlines()
        gbnf = json.loads(out[0])
        ours = iter(out[1:])
        n = miss = 0
        for p in prefixes:
            theirs = llama_mask(vocab, n_vocab, gbnf, p)
            for k in range(len(p) + 1):
                line = next(ours)
                mine = set() if line in ("", "reject") else set(map(int, line.split(",")))
                if k >= len(theirs):
                    continue
                n += 1
                t = theirs[k] - control
                if mine - control != t:
                    miss += 1
                    if miss <= 3:
                        print(f"  group {gi} prefix {p[:k]}: only ours {sorted(mine - t)[:10]}, "
                              f"only llama.cpp {sorted(t - mine)[:10]}")
        total += n
        bad += miss
        print(f"group {gi} ({grp['oracle'][:40]}): {n} prefixes, {miss} masks differ")
    print(f"{total} masks compared over {n_vocab} tokens, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
