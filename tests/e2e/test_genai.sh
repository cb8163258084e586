#!/usr/bin/env bash
# test_genai: ONNX Runtime GenAI model-builder output through the real binaries: `infc
# build` prints what it recognised (GroupQueryAttention, MatMulNBits kept int4), `inferrt
# generate` continues the prompt with onnxruntime's greedy tokens (the fixture's oracle),
# and a graph with an attribute infc cannot honour gives one error line naming the node,
# the op and the attribute, exit 1.
# usage: test_genai.sh INFC INFERRT FIXTURES_DIR TMP_DIR
set -u
INFC=$1 INFERRT=$2 FIX=$3 TMP=$4/genai-e2e
rm -rf "$TMP" && mkdir -p "$TMP"
source "$(dirname "$0")/tlib.sh"

M=$FIX/onnx-genai-int4
check "build prints the recognition" '"$INFC" build "$M/model.onnx" -o "$TMP/g.plan" >"$TMP/build.txt" &&
  grep -q "recognised: 2 GroupQueryAttention blocks -> paged attention, GQA 4/2" "$TMP/build.txt" &&
  grep -q "11 MatMulNBits int4 bs32 zp 8 -> int4 matmul" "$TMP/build.txt"'
# prompt 1 of the oracle and the first 8 of onnxruntime's greedy tokens after it
check "generate continues as onnxruntime" '"$INFERRT" generate "$TMP/g.plan" \
  --prompt-ids 297,257,270,66,51,160,188 -n 8 --ignore-eos --json >"$TMP/gen.json" &&
  grep -q "\"generated_ids\":\[184,45,283,277,236,63,289,45\]" "$TMP/gen.json"'
check "the oracle says so too" 'grep -q "\[184,45,283,277,236,63,289,45," "$M/oracle.json"'

# softcap 30 on every GroupQueryAttention: a byte-level edit of the attribute's float
# (0.0 -> 30.0) in a copy of the graph; the weights file is shared.
cp "$M/model.onnx.data" "$TMP/"
python3 - "$M/model.onnx" "$TMP/model.onnx" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
# AttributeProto{name: "softcap", f: 0.0, type: FLOAT}: field 1 (name), field 2 (f, fixed32)
old = b"\x0a\x07softcap\x15" + struct.pack("<f", 0.0)
assert old in data, "no softcap attribute"
open(sys.argv[2], "wb").write(data.replace(old, b"\x0a\x07softcap\x15" + struct.pack("<f", 30.0)))
EOF
"$INFC" build "$TMP/model.onnx" -o "$TMP/bad.plan" >"$TMP/out" 2>"$TMP/err"
rc=$?
check "softcap refused" '[ $rc -eq 1 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] &&
  grep -q "error:.*node .*GroupQueryAttention.: op .GroupQueryAttention. attribute .softcap. = 30 is not supported" "$TMP/err"'

echo "test_genai: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
