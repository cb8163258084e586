#!/bin/bash
# `infc build model.onnx` + `inferrt run` end to end on ONNX node tests: outputs written as
# TensorProto files must match the expected ones (compared by `conformance --compare`),
# and bad invocations must fail with one error line.
# usage: test_cli_run.sh INFC RUN CONFORMANCE NODE_DIR TMP   (RUN takes `run PLAN ...`)
set -u
INFC=$1 RUN=$2 CONF=$3 NODE=$4 TMP=$5/cli_run
if [ ! -d "$NODE" ]; then echo "skipped: $NODE is absent"; exit 77; fi
rm -rf "$TMP" && mkdir -p "$TMP"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

for t in test_add_bcast test_matmul_3d test_softmax_axis_1 test_gather_0 test_where_example; do
  dir=$NODE/$t
  [ -d "$dir" ] || { fail "$t missing"; continue; }
  "$INFC" build "$dir/model.onnx" -o "$TMP/$t.plan" -q || { fail "$t: build"; continue; }
  args=()
  for f in "$dir"/test_data_set_0/input_*.pb; do args+=(--input "$f"); done
  mkdir -p "$TMP/$t.out"
  "$RUN" run "$TMP/$t.plan" "${args[@]}" --output-dir "$TMP/$t.out" -q || { fail "$t: run"; continue; }
  for e in "$dir"/test_data_set_0/output_*.pb; do
    "$CONF" --compare "$e" "$TMP/$t.out/$(basename "$e")" || fail "$t: $(basename "$e")"
  done
done

# Inputs by name, in any order.
t=test_add_bcast dir=$NODE/test_add_bcast
if [ -d "$dir" ]; then
  "$RUN" run "$TMP/$t.plan" --input y="$dir/test_data_set_0/input_1.pb" \
    --input x="$dir/test_data_set_0/input_0.pb" -o "$TMP/$t.out" -q &&
    "$CONF" --compare "$dir/test_data_set_0/output_0.pb" "$TMP/$t.out/output_0.pb" ||
    fail "inputs by name"
  # A missing input and a wrong-shaped one are refused with one error line.
  out=$("$RUN" run "$TMP/$t.plan" --input "$dir/test_data_set_0/input_0.pb" 2>&1) && fail "missing input accepted"
  echo "$out" | grep -q "^inferrt: error: input 'y' was not given" || fail "missing input message: $out"
  out=$("$RUN" run "$TMP/$t.plan" --input x="$dir/test_data_set_0/input_1.pb" \
        --input y="$dir/test_data_set_0/input_1.pb" 2>&1) && fail "wrong shape accepted"
  echo "$out" | grep -q "^inferrt: error: .*input 'x' takes f32\[3,4,5\]" || fail "shape message: $out"
fi

# An unsupported op fails the build naming the op, node and opset.
dir=$NODE/test_convtranspose
if [ -d "$dir" ]; then
  out=$("$INFC" build "$dir/model.onnx" -o "$TMP/conv.plan" 2>&1) && fail "convtranspose accepted"
  echo "$out" | grep -q "^infc: error: .*model.onnx: node .*: op 'ConvTranspose' (domain ai.onnx, opset [0-9]*) is not supported" ||
    fail "unsupported message: $out"
fi

# A dynamic batch: one plan runs every batch size in its range, and refuses the others.
FIX=$(cd "$(dirname "$0")/../fixtures" && pwd)
dir=$FIX/onnx-dynamo-cnn
"$INFC" build "$dir/model.onnx" -o "$TMP/cnn.plan" -q || fail "cnn: build"
for b in 1 5 64; do
  mkdir -p "$TMP/cnn.$b"
  "$RUN" run "$TMP/cnn.plan" --input "$dir/batch_$b/input_0.pb" -o "$TMP/cnn.$b" -q &&
    "$CONF" --compare "$dir/batch_$b/output_0.pb" "$TMP/cnn.$b/output_0.pb" || fail "cnn: batch $b"
done
"$INFC" build "$dir/model.onnx" -o "$TMP/cnn-2-4.plan" --shape x=2..4x3x16x16 -q || fail "cnn: --shape"
out=$("$RUN" run "$TMP/cnn-2-4.plan" --input "$dir/batch_5/input_0.pb" 2>&1) && fail "batch 5 accepted by 2..4"
echo "$out" | grep -q "^inferrt: error: .*dim 0 ('batch') is 5, outside the plan's range 2..4" ||
  fail "range message: $out"

[ $fails -eq 0 ] && echo "cli run: all checks passed"
exit $((fails > 0))
