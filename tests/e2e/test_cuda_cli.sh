#!/usr/bin/env bash
# test_cuda_cli: --device and CUDA plans through the real binaries, on any machine. A CPU
# plan refuses --device cuda; an unknown device is refused; a CUDA plan (where NVRTC can
# build one) runs with --device cpu exactly as the CPU plan and, without a GPU, fails
# with one clear error line ("no CUDA device found; run with --device cpu or build a CPU
# plan") and exit 1 (where libinferrt_cuda.so was built; else "not installed"). infc builds
# int4 MatMulNBits into a CUDA plan and refuses nodes the GPU has no kernel for (W8A8).
# usage: test_cuda_cli.sh INFC INFERRT FIXTURES_DIR TMP_DIR
set -u
INFC=$1 INFERRT=$2 FIX=$3 TMP=$4/cuda_cli
rm -rf "$TMP" && mkdir -p "$TMP"
source "$(dirname "$0")/tlib.sh"

M=$FIX/llama-gqa-f32
GEN=(generate --prompt-ids 1,5,9,2 -n 8)
check "build cpu" '"$INFC" build "$M" -o "$TMP/cpu.plan" -q'
check "help lists --device" '"$INFERRT" generate --help | grep -q -- "--device DEV" && "$INFERRT" bench --help | grep -q -- "--no-cuda-graphs"'
expect_error "cpu plan on cuda" "needs a CUDA plan" "$INFERRT" "${GEN[0]}" "$TMP/cpu.plan" "${GEN[@]:1}" --device cuda
expect_error "decode buckets need cuda" "need --target cuda" "$INFC" build "$M" -o "$TMP/x.plan" --decode-buckets 1,2
expect_error "int8 activations are a CPU path" "a CPU path" "$INFC" build "$M" -o "$TMP/x.plan" --target cuda --act-dtype int8
expect_error "bad act_dtype" "'f8' is not one of auto, f32, int8" "$INFC" build "$M" -o "$TMP/x.plan" --act-dtype f8
expect_error "bad attn_dtype" "'f16' is not one of auto, f32, bf16" "$INFC" build "$M" -o "$TMP/x.plan" --attn-dtype f16
expect_error "bf16 attention is a CPU path" "a CPU path" "$INFC" build "$M" -o "$TMP/x.plan" --target cuda --attn-dtype bf16
expect_error "unknown device" "device 'tpu'" "$INFERRT" "${GEN[0]}" "$TMP/cpu.plan" "${GEN[@]:1}" --device tpu
check "cpu plan --device cpu" '"$INFERRT" "${GEN[@]:0:1}" "$TMP/cpu.plan" "${GEN[@]:1}" --device cpu --json >"$TMP/a.json" 2>/dev/null && grep -q "\"device\":\"cpu\"" "$TMP/a.json"'

if "$INFC" build "$M" -o "$TMP/cuda.plan" --target cuda -q 2>"$TMP/build.err"; then
  check "cuda plan --device cpu" '"$INFERRT" "${GEN[@]:0:1}" "$TMP/cuda.plan" "${GEN[@]:1}" --device cpu --json >"$TMP/b.json" 2>/dev/null'
  check "same ids on the cpu" 'diff <(grep -o "\"generated_ids\":\[[0-9,]*\]" "$TMP/a.json") <(grep -o "\"generated_ids\":\[[0-9,]*\]" "$TMP/b.json") >/dev/null'
  check "capture plan: default decode graphs" '"$INFC" inspect "$TMP/cuda.plan" | grep -q "^cuda graphs: decode batch 1,2,4,8,16,32,64$"'
  check "capture plan: --decode-buckets" '"$INFC" build "$M" -o "$TMP/cuda_b.plan" --target cuda --decode-buckets 1,3,8 -q && "$INFC" inspect "$TMP/cuda_b.plan" | grep -q "^cuda graphs: decode batch 1,3,8$"'
  expect_error "capture plan: past the limits" "decode bucket 100 is outside 1..64" "$INFC" build "$M" -o "$TMP/x.plan" --target cuda --decode-buckets 1,100
  if ! ldconfig -p 2>/dev/null | grep -q "libcuda\.so\.1"; then
    lib=$(dirname "$INFERRT")/libinferrt_cuda.so
    needle="not installed"
    [ -e "$lib" ] && needle="no CUDA device found; run with --device cpu or build a CPU plan"
    expect_error "cuda plan, no gpu" "$needle" "$INFERRT" "${GEN[0]}" "$TMP/cuda.plan" "${GEN[@]:1}"
    expect_error "cuda plan, --device cuda, no gpu" "$needle" "$INFERRT" "${GEN[0]}" "$TMP/cuda.plan" "${GEN[@]:1}" --device cuda
    expect_error "bench, no gpu" "$needle" "$INFERRT" bench "$TMP/cuda.plan" --requests 2
  else
    echo "a GPU driver is present: the no-GPU errors are not checked here (tests/gpu are)"
  fi
  # Weight-only int4 (MatMulNBits) has a GPU kernel (gemv_wq.cu): the CUDA plan builds.
  Q4=$FIX/onnx-genai-int4/model.onnx
  check "cuda build, int4 weights" '"$INFC" build "$Q4" -o "$TMP/g.plan" --target cuda -q'
  check "int4 cuda plan --device cpu" '"$INFC" build "$Q4" -o "$TMP/g_cpu.plan" -q && diff <("$INFERRT" generate "$TMP/g.plan" "${GEN[@]:1}" --device cpu --json 2>/dev/null | grep -o "\"generated_ids\":\[[0-9,]*\]") <("$INFERRT" generate "$TMP/g_cpu.plan" "${GEN[@]:1}" --json 2>/dev/null | grep -o "\"generated_ids\":\[[0-9,]*\]") >/dev/null'
else
  echo "skipped CUDA plans: $(head -1 "$TMP/build.err")"
fi
# Nodes the GPU has no kernel for are refused when the plan is built, not when it is opened:
# W8A8, and int8 groups that are not whole 16-byte loads (this fixture's k).
expect_error "cuda build, --quant w8a8" "W8A8" "$INFC" build "$M" -o "$TMP/q.plan" --target cuda --quant w8a8 -q
expect_error "cuda build, --quant int8, k" "multiple of 32 (int4) or 16 (int8, fp8)" "$INFC" build "$M" -o "$TMP/q.plan" --target cuda --quant int8 -q
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
