#!/usr/bin/env bash
# test_verify_plan: a flipped byte in the weights section. Opening a model (generate) does
# not hash the weights (fast load, documented in inferrt.h), so the plan must be refused
# by the on-demand checks: `inferrt verify` and `infc inspect`, each with one error line
# naming the weights checksum; the intact plan passes both. A flipped metadata byte is
# still refused at open.
# usage: test_verify_plan.sh INFC INFERRT FIXTURES_DIR TMP_DIR
set -u
INFC=$1 INFERRT=$2 FIX=$3 TMP=$4/verify_plan
rm -rf "$TMP" && mkdir -p "$TMP"
source "$(dirname "$0")/tlib.sh"

check "build" '"$INFC" build "$FIX/llama-gqa-f32" -o "$TMP/m.plan" >/dev/null'
python3 - "$TMP/m.plan" "$TMP" <<'PY'
import sys
src, out = sys.argv[1], sys.argv[2]
b = bytearray(open(src, 'rb').read())
meta_off = int.from_bytes(b[24:32], 'little')
w_off, w_size = int.from_bytes(b[40:48], 'little'), int.from_bytes(b[48:56], 'little')
assert w_size > 0
w = bytearray(b); w[w_off + w_size // 2] ^= 0x40; open(out + '/weights.plan', 'wb').write(w)
m = bytearray(b); m[meta_off + 10] ^= 0xff; open(out + '/meta.plan', 'wb').write(m)
PY
check "verify intact" '"$INFERRT" verify "$TMP/m.plan" | grep -q ": ok"'
check "inspect intact" '"$INFC" inspect "$TMP/m.plan" >/dev/null'
expect_error "verify corrupt weights" "weights checksum mismatch" "$INFERRT" verify "$TMP/weights.plan"
expect_error "inspect corrupt weights" "weights checksum mismatch" "$INFC" inspect "$TMP/weights.plan"
expect_error "generate corrupt metadata" "metadata checksum" "$INFERRT" generate "$TMP/meta.plan" --prompt-ids 1
check "generate opens without hashing weights" '"$INFERRT" generate "$TMP/weights.plan" --prompt-ids 1 -n 1 >/dev/null 2>&1'
expect_error "verify usage" "usage" "$INFERRT" verify
check "verify --help" '"$INFERRT" verify --help | grep -q "weights"'

echo "test_verify_plan: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
