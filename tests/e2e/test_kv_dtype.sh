#!/usr/bin/env bash
# test_kv_dtype: `--kv-dtype int8` and `f16` (the int8 and f16 KV caches) end to end on the tiny text fixture
# (trained BPE vocabulary, random weights): every runtime command takes it, perplexity with
# it stays close to the f32 cache of the same plan, bench reports the pool in tokens per
# MiB for both dtypes, and a bad value is refused with one clear message.
# usage: test_kv_dtype.sh INFC INFERRT FIXTURES_DIR TMP_DIR
set -u
INFC=$1 INFERRT=$2 FIX=$3 TMP=$4/kv_dtype
rm -rf "$TMP" && mkdir -p "$TMP"
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1" >&2; fi; }
field() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" "$2"; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }
gt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 > b + 0) }'; }
P=$TMP/m.plan

check "build" '"$INFC" build "$FIX/llama-text" --dtype f32 -o "$P" -q'
for c in generate bench serve batch perplexity; do
  check "$c --help lists --kv-dtype" '"$INFERRT" $c --help | grep -q -- "--kv-dtype"'
done
check "perplexity int8 vs f32 cache" \
  '"$INFERRT" perplexity "$P" --kv-dtype int8 --ref "$P" --file "$FIX/quality/public-domain.txt" --ctx 128 --max-tokens 600 --threads 2 --json > "$TMP/ppl.json"'
# The int8 cache only perturbs attention a little: same perplexity within 1%, and top-1
# agreement far above what a broken cache (or chance, 1/2006) would give.
check "int8 cache perplexity within 1%" 'lt "$(field delta_pct "$TMP/ppl.json" | tr -d -)" 1'
check "int8 cache top-1 agreement" 'gt "$(field top1_agreement "$TMP/ppl.json")" 0.9'
check "int8 cache is not the f32 cache" 'gt "$(field kl "$TMP/ppl.json")" 0'
check "perplexity f16 vs f32 cache" \
  '"$INFERRT" perplexity "$P" --kv-dtype f16 --ref "$P" --file "$FIX/quality/public-domain.txt" --ctx 128 --max-tokens 600 --threads 2 --json > "$TMP/ppl16.json"'
# f16 rounding of K and V (11-bit mantissa) moves logits far less than int8 does.
check "f16 cache perplexity within 0.2%" 'lt "$(field delta_pct "$TMP/ppl16.json" | tr -d -)" 0.2'
check "f16 cache top-1 agreement" 'gt "$(field top1_agreement "$TMP/ppl16.json")" 0.97'
check "f16 cache closer than int8" 'lt "$(field kl "$TMP/ppl16.json")" "$(field kl "$TMP/ppl.json")"'
check "generate f16" \
  '"$INFERRT" generate "$P" --prompt "Once upon" -n 6 --ignore-eos --kv-dtype f16 --json | grep -q "\"generated_ids\":\[[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*\]"'
check "generate int8" \
  '"$INFERRT" generate "$P" --prompt "Once upon" -n 6 --ignore-eos --kv-dtype int8 --json | grep -q "\"generated_ids\":\[[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*\]"'
check "bench reports the pool" \
  '"$INFERRT" bench "$P" --requests 2 --prompt-len 8 --output-len 4 --kv-tokens 256 --kv-dtype int8 --threads 2 > "$TMP/bench.txt" && grep -q "^kv cache *int8, 256 tokens" "$TMP/bench.txt" && grep -q "tokens per MiB: f32 [0-9]*, f16 [0-9]*, int8 [0-9]*" "$TMP/bench.txt"'
check "bad --kv-dtype refused" \
  '! "$INFERRT" generate "$P" --prompt x --kv-dtype fp8 2> "$TMP/err" && [ $(wc -l < "$TMP/err") -eq 1 ] && grep -q "error: --kv-dtype: expected f32, f16 or int8" "$TMP/err"'

echo "kv_dtype: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
