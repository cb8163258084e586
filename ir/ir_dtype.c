/* ir_dtype: names and sizes. */
#include "ir_dtype.h"

static const char *const k_names[IR_DTYPE_COUNT] = {
    [IR_DTYPE_INVALID] = "invalid",
    [IR_F32] = "f32",
    [IR_F16] = "f16",
    [IR_BF16] = "bf16",
    [IR_I64] = "i64",
    [IR_I32] = "i32",
    [IR_I8] = "i8",
    [IR_U8] = "u8",
    [IR_I4] = "i4",
    [IR_Q8_0] = "q8_0",
    [IR_Q4_0] = "q4_0",
    [IR_Q4_1] = "q4_1",
    [IR_Q8_0_X8] = "q8_0x8",
    [IR_Q4_0_X8] = "q4_0x8",
    [IR_Q4_1_X8] = "q4_1x8",
    [IR_F8_E4M3] = "f8_e4m3",
    [IR_BF16_X16] = "bf16x16",
};

int ir_dtype_block(ir_dtype t) { return ir_dtype_is_blocks(t) ? 32 : 1; }

bool ir_dtype_is_quant(ir_dtype t) { return t == IR_Q8_0 || t == IR_Q4_0 || t == IR_Q4_1; }

bool ir_dtype_is_x8(ir_dtype t) { return t == IR_Q8_0_X8 || t == IR_Q4_0_X8 || t == IR_Q4_1_X8; }

bool ir_dtype_is_x16(ir_dtype t) { return t == IR_BF16_X16; }

bool ir_dtype_is_blocks(ir_dtype t) { return ir_dtype_is_quant(t) || ir_dtype_is_x8(t); }

ir_dtype ir_dtype_x8_base(ir_dtype t) {
  return t == IR_Q8_0_X8 ? IR_Q8_0 : t == IR_Q4_0_X8 ? IR_Q4_0 : t == IR_Q4_1_X8 ? IR_Q4_1 : t;
}

ir_dtype ir_dtype_x8_of(ir_dtype t) {
  return t == IR_Q8_0   ? IR_Q8_0_X8
         : t == IR_Q4_0 ? IR_Q4_0_X8
         : t == IR_Q4_1 ? IR_Q4_1_X8
                        : IR_DTYPE_INVALID;
}

bool ir_dtype_valid(ir_dtype t) { return t > IR_DTYPE_INVALID && t < IR_DTYPE_COUNT; }

const char *ir_dtype_name(ir_dtype t) { return ir_dtype_valid(t) ? k_names[t] : "invalid"; }

ir_dtype ir_dtype_from_name(const char *name) {
  for (int t = 1; t < IR_DTYPE_COUNT; t++)
    if (strcmp(name, k_names[t]) == 0) return (ir_dtype)t;
  return IR_DTYPE_INVALID;
}

uint64_t ir_dtype_bytes(ir_dtype t, uint64_t n) {
  if (n > UINT64_MAX / 8) return UINT64_MAX; /* saturates, as ir_tensor_elems does */
  switch (t) {
  case IR_F32:
  case IR_I32: return n * 4;
  case IR_F16:
  case IR_BF16:
  case IR_BF16_X16: return n * 2;
  case IR_I64: return n * 8;
  case IR_I8:
  case IR_U8:
  case IR_F8_E4M3: return n;
  case IR_I4: return (n + 1) / 2;
  case IR_Q8_0:
  case IR_Q8_0_X8: return n % 32 ? 0 : n / 32 * 34;
  case IR_Q4_0:
  case IR_Q4_0_X8: return n % 32 ? 0 : n / 32 * 18;
  case IR_Q4_1:
  case IR_Q4_1_X8: return n % 32 ? 0 : n / 32 * 20;
  default: return 0;
  }
}
