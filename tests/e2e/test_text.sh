#!/usr/bin/env bash
# test_text: text in, text out through the real binaries, against HF oracles.
#  - `inferrt generate --prompt/--chat` on tests/fixtures/llama-text: prompt ids, greedy
#    ids and decoded text equal transformers' (tools/gen_text_fixture.py);
#  - `inferrt tokenize/detokenize --tokenizer tokenizer.json` equal HF tokenizers on the
#    corpus (tools/gen_tokenizer_fixtures.py), from --text and from standard input;
#  - bad text input gives one error line.
# usage: test_text.sh INFC INFERRT FIXTURES_DIR TMP_DIR
set -u
INFC=$1 INFERRT=$2 FIX=$3 TMP=$4/text
rm -rf "$TMP" && mkdir -p "$TMP"
"$INFC" build "$FIX/llama-text" -o "$TMP/t.plan" -q || { echo "build failed"; exit 1; }
python3 - "$INFERRT" "$TMP/t.plan" "$FIX" <<'PY'
import json, subprocess, sys
inferrt, plan, fix = sys.argv[1:4]
passed = failed = 0
def check(ok, what):
    global passed, failed
    if ok: passed += 1
    else:
        failed += 1
        print("FAIL:", what)
def run(args, stdin=None):
    return subprocess.run([inferrt] + args, input=stdin, capture_output=True)

oracle = json.load(open(f"{fix}/llama-text/oracle.json", encoding="utf-8"))
for case in oracle["cases"]:
    n = str(len(case["generated_ids"]))
    if "prompt" in case:
        args = ["generate", plan, "--prompt", case["prompt"]]
    else:
        msgs = case["chat"]
        args = ["generate", plan, "--chat", msgs[-1]["content"]]
        if msgs[0]["role"] == "system":
            args += ["--system", msgs[0]["content"]]
    r = run(args + ["-n", n, "--ignore-eos", "--json"])
    check(r.returncode == 0, f"{args}: rc {r.returncode} {r.stderr[-300:]}")
    if r.returncode: continue
    out = json.loads(r.stdout)
    check(out["prompt_ids"] == case["prompt_ids"], f"{args}: prompt ids {out['prompt_ids']} != {case['prompt_ids']}")
    check(out["generated_ids"] == case["generated_ids"], f"{args}: generated ids differ")
    check(out["text"] == case["text"], f"{args}: text {out['text']!r} != {case['text']!r}")
    plain = run(args + ["-n", n, "--ignore-eos"])  # streamed text on stdout
    check(plain.stdout.decode() == case["text"] + "\n", f"{args}: streamed text differs")

# stop strings cut the text before the stop and end with finish_reason "stop"
case = oracle["cases"][0]
stop = case["text"][5:9]
r = run(["generate", plan, "--prompt", case["prompt"], "-n", "24", "--ignore-eos", "--json", "--stop", stop])
out = json.loads(r.stdout)
check(out["finish_reason"] == "stop" and out["text"] == case["text"][:case["text"].find(stop)],
      f"stop string: {out}")

# constrained generation: the text follows the grammar (oracles: re and json); a grammar
# greedy decoding already follows changes no token; bad grammars are one error line
import re, tempfile
r = run(["generate", plan, "--prompt", "x", "-n", "20", "--temperature", "1", "--seed", "4",
         "--grammar", 'root ::= [0-9]{2,3} "-" ("ab" | "c")', "--json"])
out = json.loads(r.stdout) if r.returncode == 0 else {}
check(out.get("finish_reason") == "stop" and re.fullmatch(r"[0-9]{2,3}-(ab|c)", out.get("text", "")),
      f"--grammar: {out} {r.stderr[-300:]}")
r = run(["generate", plan, "--prompt", "x", "-n", "20", "--temperature", "1", "--seed", "6",
         "--regex", r"[a-f]{2}\d+\.(ok|no)", "--json"])
out = json.loads(r.stdout) if r.returncode == 0 else {}
check(re.fullmatch(r"[a-f]{2}\d+\.(ok|no)", out.get("text", ""), re.ASCII) is not None or
      (out.get("finish_reason") == "length" and re.fullmatch(r"[a-f]{2}\d*", out.get("text", ""))),
      f"--regex: {out} {r.stderr[-300:]}")
schema = {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, "x"]}},
          "required": ["a", "b"], "additionalProperties": False}
sf = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
json.dump(schema, sf)
sf.close()
for flags in (["--json-schema", json.dumps(schema)], ["--json-schema-file", sf.name]):
    r = run(["generate", plan, "--prompt", "y", "-n", "120", "--temperature", "0.9", "--json"] + flags)
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    try:
        v = json.loads(out.get("text", ""))
    except ValueError:
        v = None
    check(out.get("finish_reason") == "stop" and isinstance(v, dict) and list(v) == ["a", "b"] and
          isinstance(v["a"], bool) and v["b"] in (1, "x"), f"{flags[0]}: {out} {r.stderr[-300:]}")
for prompt in ("The", "Hello", "a", "1", "Once", "x", "y", "z"):  # greedy text in whole characters
    ref = json.loads(run(["generate", plan, "--prompt", prompt, "-n", "6", "--ignore-eos", "--json"]).stdout)
    if "\ufffd" not in ref["text"]:
        break
lit = json.dumps(ref["text"], ensure_ascii=False)[1:-1]
r = run(["generate", plan, "--prompt", prompt, "-n", "11", "--json", "--grammar", f'root ::= "{lit}"'])
out = json.loads(r.stdout) if r.returncode == 0 else {}
check("\ufffd" not in ref["text"] and out.get("generated_ids") == ref["generated_ids"] and
      out.get("finish_reason") == "stop", f"greedy inside a grammar: {out} vs {ref} {r.stderr[-300:]}")
for flags, needle in ((["--grammar", "root ::= a"], b"rule 'a' is used but not defined"),
                      (["--json-schema", '{"type": "number", "minimum": 3}'], b"'minimum'"),
                      (["--json-object", "--grammar", 'root ::= "a"'], b"only one of"),
                      (["--grammar-file", "/nonexistent"], b"cannot read")):
    r = run(["generate", plan, "--prompt", "x"] + flags)
    check(r.returncode != 0 and r.stderr.count(b"\n") == 1 and needle in r.stderr, f"{flags}: {r.stderr}")

tok = f"{fix}/tokenizers/gpt2/tokenizer.json"
exp = json.load(open(f"{fix}/tokenizers/gpt2/expected.json", encoding="utf-8"))
text = open(f"{fix}/tokenizers/corpus.txt", encoding="utf-8", newline="").read()
lines = [l + "\n" for l in text.split("\n")]  # as the fixture: split after every newline
lines[-1] = lines[-1][:-1]
for i in range(0, min(len(lines), len(exp["lines"])), 7):
    line = lines[i]
    if not line.strip("\n"): continue
    r = run(["tokenize", "--tokenizer", tok, "--text", line, "--json"])
    ids = json.loads(r.stdout)["ids"] if r.returncode == 0 else None
    check(ids == exp["lines"][i], f"tokenize line {i}: {ids} != {exp['lines'][i]}")
    if ids is None: continue
    r = run(["detokenize", "--tokenizer", tok, "--ids", ",".join(map(str, ids)), "--json"])
    check(r.returncode == 0 and json.loads(r.stdout)["text"] == line, f"detokenize line {i}")
r = run(["tokenize", plan, "--json"], stdin=lines[0].encode())
check(r.returncode == 0 and json.loads(r.stdout)["ids"] == exp["lines"][0],
      f"tokenize from stdin with a plan: {r.stdout[:200]} {r.stderr[-200:]}")
r = run(["tokenize", "--tokenizer", tok, "--text", "ok"], stdin=None)
check(r.returncode == 0 and r.stdout.strip() != b"", "tokenize plain output")
r = subprocess.run([inferrt, "tokenize", "--tokenizer", tok], input=b"bad \xff\xfe utf8", capture_output=True)
check(r.returncode == 1 and r.stderr.count(b"\n") == 1 and b"error:" in r.stderr, f"invalid UTF-8: {r.stderr}")
r = run(["generate", plan, "--chat", "hi", "--chat-template", "nonesuch"])
check(r.returncode == 1 and b"unknown chat template" in r.stderr, f"unknown template: {r.stderr}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
