#!/usr/bin/env bash
# test_bench_cpu: tools/bench-cpu end to end in its smoke mode (a tiny fixture model, a few
# tokens, one repeat, no llama.cpp): it must build the plan, run every measurement and
# print the table and a JSON object with every figure present and positive and every
# target stated. Timings are never compared with anything.
# usage: test_bench_cpu.sh INFC INFERRT FIXTURES_DIR TMP_DIR
set -u
INFC=$1 FIX=$3 TMP=$4/bench_cpu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(dirname "$INFC")
rm -rf "$TMP" && mkdir -p "$TMP"
fail=0
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
B=("$ROOT/tools/bench-cpu" --smoke --no-llamacpp --build "$BUILD" --model "$FIX/llama-gqa-f32"
   --threads 2)
"${B[@]}" >"$TMP/table.txt" 2>"$TMP/err" || bad "table: $(cat "$TMP/err")"
grep -q "decode / roofline" "$TMP/table.txt" || bad "table has no roofline row"
grep -q "< 50 ms" "$TMP/table.txt" || bad "table does not state the load target"
"${B[@]}" --json >"$TMP/out.json" 2>"$TMP/err" || bad "json: $(cat "$TMP/err")"
python3 - "$TMP/out.json" <<'PY' || bad "json content"
import json, sys
r = json.load(open(sys.argv[1]))
o = r["ours"]
for k in ("load_ms", "prefill_tps", "decode_tps", "batch_tps", "peak_rss_bytes",
          "weight_bytes", "kv_bytes", "kv_token_bytes"):
    assert o[k] > 0, k
assert r["membw_gbps"] > 0 and r["roofline_tps"] > 0 and r["threads"] == 2
assert r["decode_step_bytes"] > o["weight_bytes"]  # the KV of the context counts too
assert [x["metric"].split(" ")[0] for x in r["rows"]] == \
    ["prefill", "prefill", "decode,", "decode", "decode,", "plan", "peak"], r["rows"]
assert r["peak"]["f32_gflops"] > 0 and r["peak"]["int8_gops"] > 0
# int8: the tile unit's rate where AMX runs (far above the vector units'), else theirs
pk = r["peak"]
assert pk["int8_gops"] >= pk["int8_vector_gops"] > 0
assert (pk["int8"] == "amx-int8") == (pk["int8_gops"] != pk["int8_vector_gops"])
assert r["macs_per_token"] > 0 and r["prefill_roofline_tps"] > 0  # from the fixture's config
assert all(x["target"] for x in r["rows"])
assert "llamacpp" not in r
PY
# the GGUF block layout on request (infc build --no-repack), recorded in the JSON
"${B[@]}" --no-repack --json >"$TMP/nr.json" 2>"$TMP/err" || bad "--no-repack: $(cat "$TMP/err")"
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["repack"] is False and json.load(open(sys.argv[2]))["repack"] is True' \
  "$TMP/nr.json" "$TMP/out.json" || bad "--no-repack not recorded"
# a longer prompt than the default workload's
"${B[@]}" --prompt 24 --json >"$TMP/p24.json" 2>"$TMP/err" || bad "--prompt: $(cat "$TMP/err")"
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["workload"]["prompt"] == 24' \
  "$TMP/p24.json" || bad "--prompt 24 not in the workload"
# attention alone, every cache dtype: a time and a finite checksum
for kv in f32 f16 int8; do
  "$BUILD/bench_cpu" attn --threads 2 --ctx 100 --batch 2 --kv-dtype "$kv" --repeats 1 \
    >"$TMP/attn.json" 2>"$TMP/err" || bad "attn $kv: $(cat "$TMP/err")"
  python3 -c 'import json,math,sys; r=json.load(open(sys.argv[1])); assert r["us"] > 0 and math.isfinite(r["checksum"]) and r["kv_dtype"] == sys.argv[2], r' \
    "$TMP/attn.json" "$kv" || bad "attn $kv output: $(cat "$TMP/attn.json")"
done
"$BUILD/bench_cpu" attn --heads 10 --kv-heads 3 >/dev/null 2>&1 && bad "attn took 10 heads over 3 kv heads"
echo "test_bench_cpu: $fail failed"
[ "$fail" -eq 0 ]
