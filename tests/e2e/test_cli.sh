#!/usr/bin/env bash
# test_cli: drives the real infc and inferrt binaries: help and version, build, inspect,
# generate (text and --json), and bad input of every kind: each must give exactly one
# "error:" line on stderr and exit 1 (never a crash, never a usage dump).
# usage: test_cli.sh INFC INFERRT FIXTURES_DIR TMP_DIR
set -u
INFC=$1 INFERRT=$2 FIX=$3 TMP=$4/cli
rm -rf "$TMP" && mkdir -p "$TMP"
source "$(dirname "$0")/tlib.sh"

# --- help and version ---------------------------------------------------------------
check "infc --version" '"$INFC" --version | grep -q "^infc [0-9]"'
check "inferrt --version" '"$INFERRT" --version | grep -q "^inferrt [0-9]"'
check "infc --help" '"$INFC" --help | grep -q "build"'
check "infc build --help" '"$INFC" build --help | grep -q -- "--dump-ir"'
check "infc inspect --help" '"$INFC" inspect --help | grep -q -- "--tensors"'
check "inferrt --help" '"$INFERRT" --help | grep -q generate'
check "inferrt generate --help" '"$INFERRT" generate --help | grep -q -- "--prompt-ids"'

# --- the happy path -------------------------------------------------------------------
M=$FIX/llama-gqa-f32
check "build" '"$INFC" build "$M" -o "$TMP/m.plan" >"$TMP/build.txt" && grep -q "ops" "$TMP/build.txt"'
check "onnx LLM recognised" '"$INFC" build "$FIX/onnx-llama-gqa/model.onnx" -o "$TMP/o.plan" | grep -q "recognised: 2 attention blocks -> paged attention, GQA 4/2"'
check "inspect" '"$INFC" inspect "$TMP/m.plan" >"$TMP/inspect.txt" && grep -q "format:      2.0" "$TMP/inspect.txt" && grep -q "heads 4 (kv 2)" "$TMP/inspect.txt" && grep -q "options:" "$TMP/inspect.txt"'
check "inspect --tensors" '"$INFC" inspect --tensors "$TMP/m.plan" | grep -q "model.layers.0.self_attn.qkv_proj.weight"'
check "dump-ir" '"$INFC" build "$M" -o "$TMP/d.plan" --dump-ir >"$TMP/dump.txt" && grep -q "=== after fuse_add_rms_norm" "$TMP/dump.txt" && grep -q "add_rms_norm(" "$TMP/dump.txt"'
cat >"$TMP/build.yaml" <<'YAML'
dtype: bf16
max_tokens: 128
passes:
  fuse: false
YAML
check "build: ops before and after the passes" 'grep -q "^infc: ops: 34 -> 18 (fuse_rope_attention -4, fuse_qkv -4, fuse_gate_up -4, fuse_add_rms_norm -4)" "$TMP/build.txt"'
check "build --no-fuse=LIST" '"$INFC" build "$M" -o "$TMP/n.plan" --no-fuse=qkv,gate_up | grep -q "^infc: ops: 34 -> 26 (fuse_rope_attention -4, fuse_add_rms_norm -4)" && "$INFC" inspect "$TMP/n.plan" | grep -q "no_fuse=qkv,gate_up"'
check "build -c yaml" '"$INFC" build "$M" -o "$TMP/y.plan" -c "$TMP/build.yaml" -q && "$INFC" inspect "$TMP/y.plan" | grep -q "dtype=bf16 max_tokens=128" && ! "$INFC" inspect --ir "$TMP/y.plan" | grep -q "add_rms_norm("'
check "generate ids" '[ "$("$INFERRT" generate "$TMP/m.plan" --prompt-ids 1,2,3 -n 5 2>/dev/null | tr -cd , | wc -c)" -eq 4 ]'
"$INFERRT" generate "$TMP/m.plan" --prompt-ids 297,257,270 -n 8 --json >"$TMP/gen.json" 2>/dev/null
check "generate --json" 'python3 -c "
import json,sys
o=json.load(open(sys.argv[1]))
assert o[\"prompt_ids\"]==[297,257,270] and len(o[\"generated_ids\"])==8
assert o[\"finish_reason\"] in (\"length\",\"stop\")
t=o[\"timings\"]; assert all(k in t for k in (\"load_ms\",\"prefill_tokens_per_s\",\"decode_tokens_per_s\"))
" "$TMP/gen.json"'
check "sampling is seeded" '[ "$("$INFERRT" generate "$TMP/m.plan" --prompt-ids 5 -n 16 --temperature 0.9 --top-k 40 --top-p 0.95 --seed 7 2>/dev/null)" = "$("$INFERRT" generate "$TMP/m.plan" --prompt-ids 5 -n 16 --temperature 0.9 --top-k 40 --top-p 0.95 --seed 7 --threads 1 2>/dev/null)" ]'

# --- bad checkpoints --------------------------------------------------------------------
mkdir -p "$TMP/trunc" "$TMP/garbage" "$TMP/nokey" "$TMP/empty"
cp "$M/config.json" "$TMP/trunc/" && head -c 100000 "$M/model.safetensors" >"$TMP/trunc/model.safetensors"
expect_error "truncated safetensors" "truncated" "$INFC" build "$TMP/trunc" -o "$TMP/x.plan"
cp "$M/config.json" "$TMP/garbage/" && printf '\x20\x00\x00\x00\x00\x00\x00\x00{"a": not json at all       }' >"$TMP/garbage/model.safetensors"
expect_error "corrupt safetensors header" "model.safetensors" "$INFC" build "$TMP/garbage" -o "$TMP/x.plan"
cp "$M/model.safetensors" "$TMP/nokey/" && python3 -c "
import json,sys; c=json.load(open(sys.argv[1])); del c['num_hidden_layers']; json.dump(c,open(sys.argv[2],'w'))" "$M/config.json" "$TMP/nokey/config.json"
expect_error "config.json missing key" "missing key 'num_hidden_layers'" "$INFC" build "$TMP/nokey" -o "$TMP/x.plan"
expect_error "no config.json" "config.json" "$INFC" build "$TMP/empty" -o "$TMP/x.plan"
expect_error "no such source" "no such file" "$INFC" build "$TMP/nothing-here" -o "$TMP/x.plan"
expect_error "unknown fusion" "'swiglu' is not one of rope_attention, qkv, gate_up, add_rms_norm" "$INFC" build "$M" -o "$TMP/x.plan" --no-fuse=qkv,swiglu
printf 'dtype: int3\n' >"$TMP/bad.yaml"
expect_error "bad yaml option" "dtype" "$INFC" build "$M" -o "$TMP/x.plan" -c "$TMP/bad.yaml"
printf 'passes:\n  fold: true\n  repack: maybe\n' >"$TMP/bad2.yaml"
expect_error "bad nested yaml option names its own line" "yaml: line 3: option 'passes.repack': 'maybe' is not true or false" \
  "$INFC" build "$M" -o "$TMP/x.plan" -c "$TMP/bad2.yaml"
check "no partial plan left" '[ ! -e "$TMP/x.plan" ] && [ ! -e "$TMP/x.plan.tmp" ]'

# --- bad plans -------------------------------------------------------------------------
python3 - "$TMP/m.plan" "$TMP" <<'PY'
import sys
src, out = sys.argv[1], sys.argv[2]
b = bytearray(open(src, 'rb').read())
m = bytearray(b); m[0:8] = b'NOTAPLAN'; open(out + '/magic.plan', 'wb').write(m)
v = bytearray(b); v[8:12] = (9).to_bytes(4, 'little'); open(out + '/version.plan', 'wb').write(v)
meta_off = int.from_bytes(b[24:32], 'little')
c = bytearray(b); c[meta_off + 10] ^= 0xff; open(out + '/checksum.plan', 'wb').write(c)
open(out + '/trunc.plan', 'wb').write(b[:len(b) // 2])
PY
expect_error "plan wrong magic" "bad magic" "$INFERRT" generate "$TMP/magic.plan" --prompt-ids 1
expect_error "plan wrong version" "format version 9" "$INFERRT" generate "$TMP/version.plan" --prompt-ids 1
expect_error "plan bad checksum" "checksum" "$INFERRT" generate "$TMP/checksum.plan" --prompt-ids 1
expect_error "plan truncated" "truncated" "$INFERRT" generate "$TMP/trunc.plan" --prompt-ids 1
expect_error "inspect bad plan" "bad magic" "$INFC" inspect "$TMP/magic.plan"
expect_error "missing plan" "cannot open" "$INFERRT" generate "$TMP/none.plan" --prompt-ids 1

# --- bad requests ----------------------------------------------------------------------
expect_error "token out of vocabulary" "outside the vocabulary" "$INFERRT" generate "$TMP/m.plan" --prompt-ids 1,300
expect_error "malformed ids" "--prompt-ids" "$INFERRT" generate "$TMP/m.plan" --prompt-ids 1,x
expect_error "repetition penalty range" "--repetition-penalty" "$INFERRT" generate "$TMP/m.plan" --prompt-ids 1 --repetition-penalty 3
expect_error "presence penalty range" "--presence-penalty" "$INFERRT" generate "$TMP/m.plan" --prompt-ids 1 --presence-penalty -2.5
expect_error "malformed logit bias" "--logit-bias" "$INFERRT" generate "$TMP/m.plan" --prompt-ids 1 --logit-bias 5
expect_error "logit bias range" "--logit-bias" "$INFERRT" generate "$TMP/m.plan" --prompt-ids 1 --logit-bias 5:101
expect_error "logit bias out of vocabulary" "vocabulary" "$INFERRT" generate "$TMP/m.plan" --prompt-ids 1 --logit-bias 300:1
expect_error "stop token id out of vocabulary" "vocabulary" "$INFERRT" generate "$TMP/m.plan" --prompt-ids 1 --stop-token-ids 300
expect_error "min tokens over max" "min_tokens" "$INFERRT" generate "$TMP/m.plan" --prompt-ids 1 -n 4 --min-tokens 5
check "bench, sampled" '"$INFERRT" bench "$TMP/m.plan" --requests 3 --prompt-len 4 --output-len 5 --temperature 0.8 --top-p 0.9 --top-k 20 --threads 2 --json >"$TMP/bench.json" && grep -q "\"temperature\":0.8" "$TMP/bench.json" && grep -q "\"output_tokens\":15," "$TMP/bench.json"'
expect_error "bench, bad --top-p" "--top-p" "$INFERRT" bench "$TMP/m.plan" --top-p 1.5
check "bench, speculative" '"$INFERRT" bench "$TMP/m.plan" --requests 4 --prompt-len 6 --output-len 40 --spec-tokens 4 --spec-ngram 1:2 --spec-always --threads 2 --json >"$TMP/spec.json" && grep -q "\"output_tokens\":160," "$TMP/spec.json" && grep -q "\"spec_draft_tokens\":[1-9]" "$TMP/spec.json"'
gen_ids() { "$INFERRT" generate "$TMP/m.plan" --prompt-ids 5,6,7,5,6 -n 40 --ignore-eos --temperature 0.9 --seed 3 --threads 2 --json "$@" | sed -n 's/.*"generated_ids":\[\([0-9,]*\)\].*/\1/p'; }
check "generate, drafts change no sampled token" '[ -n "$(gen_ids)" ] && [ "$(gen_ids)" = "$(gen_ids --spec-tokens 4 --spec-ngram 1:2)" ] && "$INFERRT" generate "$TMP/m.plan" --prompt-ids 5,6,7,5,6 -n 40 --ignore-eos --temperature 0.9 --seed 3 --spec-tokens 4 --spec-ngram 1:2 --json | grep -q "\"spec_draft_tokens\":[1-9]"'
check "serve, batch list --spec-tokens" '"$INFERRT" serve --help | grep -q -- "--spec-tokens K" && "$INFERRT" batch --help | grep -q -- "--spec-ngram MIN:MAX"'
check "bench, drafts weighed by their cost (the default)" '"$INFERRT" bench "$TMP/m.plan" --requests 4 --prompt-len 6 --output-len 40 --spec-tokens 4 --spec-ngram 1:2 --threads 2 --json >"$TMP/specw.json" && grep -q "\"output_tokens\":160," "$TMP/specw.json" && "$INFERRT" serve --help | grep -q -- "--spec-always"'
expect_error "bench, too many drafts" "--spec-tokens" "$INFERRT" bench "$TMP/m.plan" --spec-tokens 17
expect_error "serve, bad n-gram range" "--spec-ngram" "$INFERRT" serve "$TMP/m.plan" --spec-ngram 3:2
long=$(python3 -c "print(','.join(['1']*300))")
expect_error "prompt longer than context" "context" "$INFERRT" generate "$TMP/m.plan" --prompt-ids "$long"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
