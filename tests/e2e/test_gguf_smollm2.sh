#!/usr/bin/env bash
# test_gguf_smollm2: the real SmolLM2-135M-Instruct Q4_1 GGUF (Q4_1 matrices, a Q8_0 tied
# embedding) through infc build and inferrt generate. The golden ids are llama.cpp's
# greedy output on the weights dequantized to F32 (tools/check-llamacpp.py), which a plan
# with f32 activations (--act-dtype f32) must give exactly. The default CPU plan (int8
# activations per 32 values, as llama.cpp's own quantized kernels) must answer the same,
# and stay batch-invariant: drafts change none of its tokens. Needs the model in the cache
# (tools/get-smollm2) or at $INFC_SMOLLM2; without it the test says so and exits 77 (skipped): it
# never downloads.
# usage: test_gguf_smollm2.sh INFC INFERRT FIXTURES_DIR TMP_DIR
set -u
INFC=$1 INFERRT=$2 TMP=$4/gguf-smollm2
MODEL=${INFC_SMOLLM2:-${XDG_CACHE_HOME:-$HOME/.cache}/infc/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -s "$MODEL" ]; then
  echo "skipped: no $MODEL (run tools/get-smollm2 to fetch it)"
  exit 77
fi
rm -rf "$TMP" && mkdir -p "$TMP"
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1" >&2; fi; }

# "The capital of France is" -> " Paris.\n\nThe answer is: ..." then <|im_end|>
FRANCE_IDS=504,3575,282,4649,314
FRANCE_OUT=7042,30,198,198,504,2988,314,42,216,34,32,33,40,29,32,33,29,34,34,216,33,34,42,33,34,42,37,35,30,2
# ChatML: translate 'good morning, how are you?' into French (first 32 generated ids)
CHAT_IDS=1,4093,198,8241,12837,637,12018,5738,28,638,359,346,27285,618,3432,30,2,198,1,520,9531,198
CHAT_OUT=46719,393,271,14047,28,16718,393,271,14047,24583,28,16718,393,271,14047,24583,28,16718,393,271,14047,24583,28,16718,393,271,14047,24583,28,16718,393,271

ids() { sed -n 's/.*"generated_ids":\[\([0-9,]*\)\].*/\1/p'; }

check "build" '"$INFC" build "$MODEL" -o "$TMP/q.plan" --max-context 256 --act-dtype f32 >/dev/null'
check "inspect shows the quantized weights" \
  '"$INFC" inspect "$TMP/q.plan" | grep -q "q8_0.*q4_1"'
check "build with int8 activations (the default)" \
  '"$INFC" build "$MODEL" -o "$TMP/qi.plan" --max-context 256 | grep -q "act_int8: 121 q8_0/q4_0/q4_1 matmuls" &&
   "$INFC" inspect "$TMP/qi.plan" | grep -q "act_dtype=int8"'
# the default CPU plan interleaves the 121 matmul weights (the tied embedding among them,
# which the lookup reads in that layout too); --no-repack keeps GGUF's, and answers the same
check "default plan: weights interleaved by 8 rows" \
  '"$INFC" build "$MODEL" -o "$TMP/qi.plan" --max-context 256 | grep -q "repack: 121 weights" &&
   "$INFC" inspect "$TMP/qi.plan" | grep -q "q8_0x8.*q4_1x8"'
check "--no-repack: GGUF blocks, france answers Paris" \
  '"$INFC" build "$MODEL" -o "$TMP/qn.plan" --max-context 256 --no-repack | grep -vq "repack:" &&
   "$INFC" inspect "$TMP/qn.plan" | grep -q "q8_0.*q4_1" && ! "$INFC" inspect "$TMP/qn.plan" | grep -q "x8" &&
   "$INFERRT" generate "$TMP/qn.plan" --prompt-ids $FRANCE_IDS -n 8 --json | ids | grep -q "^7042,30,198,198,504,"'
check "int8 activations: france answers Paris" \
  '"$INFERRT" generate "$TMP/qi.plan" --prompt-ids $FRANCE_IDS -n 8 --json | ids | grep -q "^7042,30,198,198,504,"'
check "int8 activations: drafts change no token" \
  '[ "$("$INFERRT" generate "$TMP/qi.plan" --prompt-ids $CHAT_IDS -n 32 --json | ids)" = \
     "$("$INFERRT" generate "$TMP/qi.plan" --prompt-ids $CHAT_IDS -n 32 --spec-tokens 4 --json | ids)" ]'
check "france greedy" \
  '[ "$("$INFERRT" generate "$TMP/q.plan" --prompt-ids $FRANCE_IDS -n 64 --json | ids)" = "$FRANCE_OUT" ]'
check "chat greedy" \
  '[ "$("$INFERRT" generate "$TMP/q.plan" --prompt-ids $CHAT_IDS -n 32 --json | ids)" = "$CHAT_OUT" ]'

check "chat greedy with prompt-lookup drafts" \
  '"$INFERRT" generate "$TMP/q.plan" --prompt-ids $CHAT_IDS -n 32 --spec-tokens 4 --json >"$TMP/spec-gen.json" &&
   [ "$(ids <"$TMP/spec-gen.json")" = "$CHAT_OUT" ] && grep -q "\"spec_accepted_tokens\":[1-9]" "$TMP/spec-gen.json"'

# Speculative decoding by prompt lookup changes no token: the chat prompt (whose greedy
# output repeats itself) greedy and sampled with a seed, through inferrt batch with and
# without drafts; the drafted run must have kept some.
for t in 0 0.8; do
  echo "{\"custom_id\": \"t$t\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"prompt\": [$CHAT_IDS], \"max_tokens\": 40, \"temperature\": $t, \"seed\": 11}}"
done >"$TMP/spec.jsonl"
texts() { sed 's/.*"text":\("[^"]*"\).*/\1/' "$1" | sort; }
check "speculative decoding keeps the tokens" \
  '"$INFERRT" batch "$TMP/qi.plan" --input "$TMP/spec.jsonl" --output "$TMP/plain.out" --threads 2 --no-progress &&
   "$INFERRT" batch "$TMP/qi.plan" --input "$TMP/spec.jsonl" --output "$TMP/spec.out" --threads 2 --spec-tokens 4 --spec-always 2>"$TMP/spec.log" &&
   [ "$(texts "$TMP/plain.out")" = "$(texts "$TMP/spec.out")" ] && [ "$(wc -l <"$TMP/spec.out")" = 2 ] &&
   grep -q "speculation: [0-9]* draft tokens, [1-9][0-9]* kept" "$TMP/spec.log"'

# Constrained decoding on the real model: asked in plain words, greedy SmolLM2 answers in
# prose ("The capital of France is Paris."); under a JSON Schema the same question comes
# back as an object of that schema (checked with Python's json) naming Paris.
echo '{"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
  "country": {"type": "string", "maxLength": 40}}, "required": ["city", "country"]}' >"$TMP/cap.json"
check "JSON Schema on SmolLM2: an object naming Paris" \
  '"$INFERRT" generate "$TMP/qi.plan" --chat "What is the capital of France? Answer in JSON with the city and its country." \
     --json-schema-file "$TMP/cap.json" -n 60 --json >"$TMP/cap.out" &&
   python3 -c "import json, sys; d = json.load(open(sys.argv[1])); v = json.loads(d[\"text\"]);
assert d[\"finish_reason\"] == \"stop\" and list(v) == [\"city\", \"country\"] and v[\"city\"] == \"Paris\", d" "$TMP/cap.out"'

# Function calling on the real model (inferrt batch, the server's request path): asked about
# the weather in Paris with a weather and a clock tool, SmolLM2 under tool_choice "required"
# (one call) picks get_weather, and under a named tool_choice calls it for Paris; the
# arguments are JSON of the tool's schema (Python's json).
python3 - "$TMP/tools.jsonl" <<'PY'
import json, sys
w = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                    "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
t = {"type": "function", "function": {"name": "get_time", "description": "Get the local time in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}}}
msgs = [{"role": "user", "content": "What is the weather like in Paris today?"}]
with open(sys.argv[1], "w") as f:
    for cid, choice in (("required", "required"), ("named", {"type": "function", "function": {"name": "get_weather"}})):
        body = {"messages": msgs, "tools": [w, t], "tool_choice": choice, "parallel_tool_calls": False,
                "temperature": 0, "max_tokens": 80}
        f.write(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
PY
check "tools on SmolLM2: get_weather called for Paris" \
  '"$INFC" build "$MODEL" -o "$TMP/tools.plan" --max-context 1024 -q &&
   "$INFERRT" batch "$TMP/tools.plan" --input "$TMP/tools.jsonl" --output "$TMP/tools.out" --threads 2 --no-progress >/dev/null &&
   python3 -c "import json, sys
res = {o[\"custom_id\"]: o[\"response\"][\"body\"][\"choices\"][0] for o in map(json.loads, open(sys.argv[1]))}
for cid, fin in ((\"required\", \"tool_calls\"), (\"named\", \"stop\")):
    ch = res[cid]; calls = ch[\"message\"][\"tool_calls\"]; args = json.loads(calls[0][\"function\"][\"arguments\"])
    assert ch[\"finish_reason\"] == fin and len(calls) == 1 and calls[0][\"function\"][\"name\"] == \"get_weather\", ch
    assert args[\"city\"] == \"Paris\" and set(args) <= {\"city\", \"unit\"}, args" "$TMP/tools.out"'

echo "test_gguf_smollm2: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
