#!/usr/bin/env python3
"""llama.cpp's tokenization of the tokenizer corpus with SmolLM2's GGUF vocabulary, as the
oracle for the engine's GGUF tokenizer (tests/unit/test_gguf_vocab.c).

Run: pip install llama-cpp-python; python3 tools/gen_smollm2_tok_fixture.py
Writes tests/fixtures/tokenizers/smollm2-gguf/expected.json: per corpus line (split after
every newline, as the other tokenizer fixtures), the ids of
Llama(vocab_only=True).tokenize(line, add_bos=False, special=False), and of a few strings
with special tokens parsed (special=True).
"""
import json
import os
import subprocess

import llama_cpp

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizers", "smollm2-gguf", "expected.json")
SPECIAL = ["<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
           "<|endoftext|>text after<|im_end|>"]


def main():
    gguf = subprocess.run([os.path.join(ROOT, "tools", "get-smollm2")], check=True,
                          capture_output=True, text=True).stdout.strip()
    llm = llama_cpp.Llama(model_path=gguf, vocab_only=True, verbose=False)
    text = open(os.path.join(ROOT, "tests", "fixtures", "tokenizers", "corpus.txt"),
                encoding="utf-8", newline="").read()
    lines = [l + "\n" for l in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    if not lines[-1]:
        lines.pop()
    data = {"llama_cpp_python": llama_cpp.__version__,
            "lines": [llm.tokenize(l.encode(), add_bos=False, special=False) for l in lines],
            "special": [{"text": s, "ids": llm.tokenize(s.encode(), add_bos=False, special=True)}
                        for s in SPECIAL]}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
    print(f"{len(lines)} lines -> {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
