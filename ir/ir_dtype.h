/* ir_dtype: element types of tensors, their sizes, names and scalar conversions. */
#ifndef IR_DTYPE_H
#define IR_DTYPE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Values are stored in plan files: append only, never renumber. */
typedef enum ir_dtype {
  IR_DTYPE_INVALID = 0,
  IR_F32 = 1,
  IR_F16 = 2,
  IR_BF16 = 3,
  IR_I64 = 4,
  IR_I32 = 5,
  IR_I8 = 6,
  IR_U8 = 7,
  IR_I4 = 8, /* packed two per byte, low nibble first */
  /* Block-quantized weights, GGUF/ggml layouts, 32 values per block along the last dim:
   * Q8_0 {f16 d; int8 q[32]} (34 B): x = d*q
   * Q4_0 {f16 d; u8 qs[16]} (18 B): x = d*(nibble - 8), low nibbles are values 0..15
   * Q4_1 {f16 d; f16 m; u8 qs[16]} (20 B): x = d*nibble + m */
  IR_Q8_0 = 9,
  IR_Q4_0 = 10,
  IR_Q4_1 = 11,
  /* The same blocks with 8 rows interleaved (a CPU layout the compiler's repack pass
   * writes; rank 2, rows a multiple of 8). Rows 8g .. 8g+7 keep the bytes rows 8g .. 8g+7
   * take in the base layout; within them block b of the 8 rows is one group:
   *   the 8 d (f16), for Q4_1 then the 8 m (f16), then the 8 rows' codes (32 B of Q8_0,
   *   16 B of nibbles of Q4_0 / Q4_1 each) 4 bytes of each row in turn: code bytes
   *   4j .. 4j+3 of rows 0 .. 7 make 32 bytes, j = 0, 1, ... So a 32-byte load holds the
   *   same 4 (Q8_0) or 4 + 4 (nibbles: low 4j .., high 16 + 4j ..) positions of all 8
   *   rows, and a multiply-add against x's 4 codes there broadcast leaves each row's sum
   *   in its lane. (Plan format 1 had each row's codes whole, a layout of its own.) */
  IR_Q8_0_X8 = 12,
  IR_Q4_0_X8 = 13,
  IR_Q4_1_X8 = 14,
  /* FP8 E4M3 (OCP "fn": bias 7, no infinities, 0x7f / 0xff NaN, largest 448): the codes of
   * --quant fp8 weights, scaled per output channel by a separate f32 tensor. */
  IR_F8_E4M3 = 15,
  /* bf16 with 16 rows interleaved by pairs (a CPU layout the repack pass writes for the
   * matmuls that take bf16 activations; rank 2, rows a multiple of 16, k even): rows
   * 16g .. 16g+15 keep the bytes they take in the base layout, as k/2 runs of 64 bytes, run p
   * holding values 2p and 2p+1 of each of the 16 rows in turn: one 64-byte load is a
   * vdpbf16ps operand whose lane i is row 16g+i, and 16 runs (1 KiB) one AMX-BF16 B tile.
   * The kernels sum it in the CPU's bf16 order (kn_matmul_x16_order). */
  IR_BF16_X16 = 16,
  IR_DTYPE_COUNT
} ir_dtype;

const char *ir_dtype_name(ir_dtype t);
ir_dtype ir_dtype_from_name(const char *name); /* "f32", "bf16", ...; INVALID if unknown */
bool ir_dtype_valid(ir_dtype t);
/* Bytes for n elements (int4 rounds up to whole bytes). 0 for an invalid dtype, and for
 * a block type when n is not a whole number of blocks. */
uint64_t ir_dtype_bytes(ir_dtype t, uint64_t n);
/* Values per block: 32 for the block-quantized types, 1 otherwise. */
int ir_dtype_block(ir_dtype t);
bool ir_dtype_is_quant(ir_dtype t);
/* The 8-row interleaved block types, and the base type of one (itself otherwise). */
bool ir_dtype_is_x8(ir_dtype t);
/* A block-quantized type in either layout (ir_dtype_is_quant or ir_dtype_is_x8). */
bool ir_dtype_is_blocks(ir_dtype t);
ir_dtype ir_dtype_x8_base(ir_dtype t);
/* The interleaved type of a base block type (INVALID for others). */
ir_dtype ir_dtype_x8_of(ir_dtype t);

/* The 16-row interleaved bf16 type. */
bool ir_dtype_is_x16(ir_dtype t);

/* E4M3 -> f32, exact. */
static inline float ir_f8e4m3_to_f32(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80u) << 24, exp = (b >> 3) & 15u, man = b & 7u, u;
  if (exp == 15 && man == 7) {
    u = sign | 0x7fc00000u; /* NaN */
  } else if (exp == 0) {
    float f = (float)man * (1.0f / 512.0f); /* subnormal: man * 2^-9 */
    return sign ? -f : f;
  } else {
    u = sign | ((exp + 127 - 7) << 23) | (man << 20);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* f32 -> E4M3, round to nearest even, saturating at +-448 (NaN stays NaN). */
static inline uint8_t ir_f32_to_f8e4m3(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448 (and inf): the largest */
  if (a < 0x3c800000u) { /* below 2^-6: a subnormal code, man * 2^-9 */
    float x;
    memcpy(&x, &a, 4);
    float q = x * 512.0f; /* exact: a power-of-two scale */
    uint32_t r = (uint32_t)q;
    float rem = q - (float)r;
    if (rem > 0.5f || (rem == 0.5f && (r & 1))) r++;
    return (uint8_t)(sign | r); /* r == 8 is the smallest normal, 0x08: still right */
  }
  uint32_t r = a - ((uint32_t)(127 - 7) << 23); /* rebias exponent 127 -> 7 */
  r = (r + 0x7ffffu + ((r >> 20) & 1u)) >> 20;
  if (r > 0x7e) r = 0x7e;
  return (uint8_t)(sign | r);
}

static inline float ir_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t ir_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float ir_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: renormalise */
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        exp--;
      }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest even, overflow to inf, NaN preserved. */
static inline uint16_t ir_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520 */
  if (a < 0x38800000u) {                                   /* subnormal or zero in f16 */
    if (a < 0x33000000u) return (uint16_t)sign;
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    int shift = 113 - (int)(a >> 23) + 13;
    uint32_t half = 1u << (shift - 1);
    uint32_t r = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
  r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  return (uint16_t)(sign | r);
}

#endif
