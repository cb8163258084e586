/* kn_quant: the block-quantized weight types (ggml layouts, see ir_dtype.h), decoded
 * block by block. Every type is read as x[i] = d * q[i] + m over a block of 32 values:
 *   Q8_0: q = int8,          m = 0      x = d * q
 *   Q4_0: q = nibble - 8,    m = 0      x = d * q  (low nibbles: values 0..15, high: 16..31)
 *   Q4_1: q = nibble,        m = min    x = fma(d, q, m), rounded once
 * q is an exact small integer held in a float. Blocks need no alignment. These values
 * are the contract: the matmul kernels dequantize in registers to exactly them. */
#ifndef KN_QUANT_H
#define KN_QUANT_H

#include <math.h>
#include <stdint.h>

#include "ir_dtype.h"

enum { KN_QBLOCK = 32 };

static inline int kn_quant_block_bytes(ir_dtype dt) {
  return dt == IR_Q8_0 ? 34 : dt == IR_Q4_0 ? 18 : dt == IR_Q4_1 ? 20 : 0;
}

static inline float kn_quant_f16(const uint8_t *p) {
  return ir_f16_to_f32((uint16_t)(p[0] | (uint16_t)p[1] << 8));
}

/* Decodes one block: q[32], the scale d and the offset m. */
static inline void kn_quant_block(const uint8_t *blk, ir_dtype dt, float *q, float *d, float *m) {
  *d = kn_quant_f16(blk);
  *m = 0.0f;
  if (dt == IR_Q8_0) {
    for (int i = 0; i < KN_QBLOCK; i++) q[i] = (float)(int8_t)blk[2 + i];
    return;
  }
  const uint8_t *qs = blk + (dt == IR_Q4_1 ? 4 : 2);
  int off = dt == IR_Q4_1 ? 0 : 8;
  if (dt == IR_Q4_1) *m = kn_quant_f16(blk + 2);
  for (int i = 0; i < KN_QBLOCK / 2; i++) {
    q[i] = (float)((qs[i] & 0x0f) - off);
    q[i + KN_QBLOCK / 2] = (float)((qs[i] >> 4) - off);
  }
}

static inline float kn_quant_value(ir_dtype dt, float q, float d, float m) {
  return dt == IR_Q4_1 ? fmaf(d, q, m) : d * q;
}

/* out[0, n) = values [0, n) of a row of dtype dt (f32, f16, bf16 or a block type, with n
 * a whole number of blocks) as f32. */
void kn_dequant_row(const void *src, ir_dtype dt, float *out, int64_t n);

/* Quantizes n values (a whole number of blocks) of x into blocks of dt (q8_0, q4_0,
 * q4_1) at dst, with ggml's reference quantizers byte for byte (gguf-py's numpy port is
 * the test oracle): q8_0 d = max|x| / 127, q = roundf(x / d); q4_0 d = -x_m / 8 for x_m
 * the value of largest magnitude, q = min(15, trunc(x / d + 8.5)); q4_1 d = (max - min)
 * / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)); d and m stored as f16. */
void kn_quant_row(const float *x, ir_dtype dt, void *dst, int64_t n);

/* The 8-row interleaved layouts (IR_*_X8, see ir_dtype.h): bytes before the codes in a
 * group (the 8 d, and the 8 m of Q4_1), each row's code bytes, and where code byte i of
 * row r (0..7) of a group sits among the codes: 4 bytes of each row in turn. */
static inline int kn_x8_head(ir_dtype base) { return base == IR_Q4_1 ? 32 : 16; }
static inline int kn_x8_codes(ir_dtype base) { return base == IR_Q8_0 ? 32 : 16; }
static inline int kn_x8_code_at(int r, int i) { return 32 * (i / 4) + 4 * r + i % 4; }

/* rows (a multiple of 8) x k values of base blocks at src rewritten interleaved at dst
 * (the same number of bytes; src and dst do not overlap). */
void kn_x8_pack(const void *src, ir_dtype base, int64_t rows, int64_t k, void *dst);

/* rows (a multiple of 16) x k (even) bf16 values at src rewritten as IR_BF16_X16 at dst:
 * row group g, pair p, row i at uint32 (g * k / 2 + p) * 16 + i (the same bytes). */
void kn_x16_pack(const uint16_t *src, int64_t rows, int64_t k, void *dst);

/* Block b of row `row` of an interleaved tensor with k values a row, in the base layout. */
void kn_x8_block(const void *src, ir_dtype base, int64_t k, int64_t row, int64_t b, uint8_t *blk);

/* out[0, k) = row `row` of a tensor of dtype dt (any kn_dequant_row type, or an
 * interleaved one) with k values a row, as f32. */
void kn_dequant_row_at(const void *src, ir_dtype dt, int64_t row, int64_t k, float *out);

/* Value i of a tensor stored as dt (flat row-major index; blocks run along the last
 * dim, which holds whole blocks). */
float kn_dequant_one(const void *src, ir_dtype dt, uint64_t i);

#endif
