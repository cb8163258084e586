/* kn_quant: dequantization of rows and single values (build-time folding, embedding
 * lookups, casts). */
#include "kn_quant.h"

#include <math.h>
#include <string.h>

static void put_f16(uint8_t *p, float v) {
  uint16_t h = ir_f32_to_f16(v);
  p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

/* The multiplies and adds are separate statements, as in ggml's reference C: a fused
 * multiply-add would round once and could move a code across a boundary. */
static void quant_block(const float *x, ir_dtype dt, uint8_t *blk) {
  if (dt == IR_Q8_0) {
    float amax = 0.0f;
    for (int i = 0; i < KN_QBLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(blk, d);
    for (int i = 0; i < KN_QBLOCK; i++) {
      volatile float t = x[i] * id;
      blk[2 + i] = (uint8_t)(int8_t)roundf(t);
    }
    return;
  }
  float lo = x[0], hi = x[0], big = x[0];
  for (int i = 1; i < KN_QBLOCK; i++) {
    lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;
    if (fabsf(x[i]) > fabsf(big)) big = x[i]; /* the first of equal magnitudes, as argmax */
  }
  float d = dt == IR_Q4_0 ? big / -8.0f : (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  float base = dt == IR_Q4_0 ? 0.0f : lo, add = dt == IR_Q4_0 ? 8.5f : 0.5f;
  put_f16(blk, d);
  if (dt == IR_Q4_1) put_f16(blk + 2, lo);
  uint8_t *qs = blk + (dt == IR_Q4_1 ? 4 : 2);
  for (int i = 0; i < KN_QBLOCK / 2; i++) {
    int c[2];
    for (int h = 0; h < 2; h++) {
      volatile float t = (x[i + h * KN_QBLOCK / 2] - base) * id;
      float v = t + add;
      c[h] = v >= 15.0f ? 15 : v <= 0.0f ? 0 : (int)v;
    }
    qs[i] = (uint8_t)(c[0] | c[1] << 4);
  }
}

void kn_quant_row(const float *x, ir_dtype dt, void *dst, int64_t n) {
  int bb = kn_quant_block_bytes(dt);
  for (int64_t b = 0; b < n / KN_QBLOCK; b++)
    quant_block(x + b * KN_QBLOCK, dt, (uint8_t *)dst + b * bb);
}

void kn_dequant_row(const void *src, ir_dtype dt, float *out, int64_t n) {
  if (dt == IR_F32) {
    memcpy(out, src, (size_t)n * sizeof(float));
  } else if (dt == IR_F16 || dt == IR_BF16) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
      out[i] = dt == IR_F16 ? ir_f16_to_f32(h[i]) : ir_bf16_to_f32(h[i]);
  } else {
    const uint8_t *blk = src;
    int bb = kn_quant_block_bytes(dt);
    for (int64_t b = 0; b < n / KN_QBLOCK; b++, blk += bb) {
      float q[KN_QBLOCK], d, m;
      kn_quant_block(blk, dt, q, &d, &m);
      for (int i = 0; i < KN_QBLOCK; i++) out[b * KN_QBLOCK + i] = kn_quant_value(dt, q[i], d, m);
    }
  }
}

/* Group g, block b: 8 * bb bytes at (g * nb + b) * 8 * bb, as ir_dtype.h lays out. */
static uint8_t *x8_group(const void *base_ptr, ir_dtype base, int64_t k, int64_t g, int64_t b) {
  int64_t nb = k / KN_QBLOCK, bb = kn_quant_block_bytes(base);
  return (uint8_t *)base_ptr + (g * nb + b) * 8 * bb;
}

void kn_x8_pack(const void *src, ir_dtype base, int64_t rows, int64_t k, void *dst) {
  int64_t nb = k / KN_QBLOCK, bb = kn_quant_block_bytes(base);
  int head = kn_x8_head(base), nc = kn_x8_codes(base);
  if (bb < nc + 2) return; /* not a base block type */
  for (int64_t g = 0; g < rows / 8; g++)
    for (int64_t b = 0; b < nb; b++) {
      uint8_t *o = x8_group(dst, base, k, g, b);
      for (int r = 0; r < 8; r++) {
        const uint8_t *blk = (const uint8_t *)src + ((g * 8 + r) * nb + b) * bb;
        memcpy(o + 2 * r, blk, 2);                               /* d */
        if (base == IR_Q4_1) memcpy(o + 16 + 2 * r, blk + 2, 2); /* m */
        for (int i = 0; i < nc; i++) o[head + kn_x8_code_at(r, i)] = blk[bb - nc + i];
      }
    }
}

void kn_x8_block(const void *src, ir_dtype base, int64_t k, int64_t row, int64_t b, uint8_t *blk) {
  const uint8_t *grp = x8_group(src, base, k, row / 8, b);
  int r = (int)(row % 8), bb = kn_quant_block_bytes(base), nc = kn_x8_codes(base);
  if (bb < nc + 2 || bb > 34) return; /* not a base block type */
  memcpy(blk, grp + 2 * r, 2);
  if (base == IR_Q4_1) memcpy(blk + 2, grp + 16 + 2 * r, 2);
  for (int i = 0; i < nc; i++) blk[bb - nc + i] = grp[kn_x8_head(base) + kn_x8_code_at(r, i)];
}

void kn_dequant_row_at(const void *src, ir_dtype dt, int64_t row, int64_t k, float *out) {
  if (!ir_dtype_is_x8(dt)) {
    kn_dequant_row((const char *)src + (uint64_t)row * ir_dtype_bytes(dt, (uint64_t)k), dt, out, k);
    return;
  }
  ir_dtype base = ir_dtype_x8_base(dt);
  for (int64_t b = 0; b < k / KN_QBLOCK; b++) {
    uint8_t blk[34] = {0};
    float q[KN_QBLOCK], d, m;
    kn_x8_block(src, base, k, row, b, blk);
    kn_quant_block(blk, base, q, &d, &m);
    for (int i = 0; i < KN_QBLOCK; i++) out[b * KN_QBLOCK + i] = kn_quant_value(base, q[i], d, m);
  }
}

float kn_dequant_one(const void *src, ir_dtype dt, uint64_t i) {
  switch (dt) {
  case IR_F32: return ((const float *)src)[i];
  case IR_F16: return ir_f16_to_f32(((const uint16_t *)src)[i]);
  case IR_BF16: return ir_bf16_to_f32(((const uint16_t *)src)[i]);
  case IR_Q8_0:
  case IR_Q4_0:
  case IR_Q4_1: {
    float q[KN_QBLOCK], d, m;
    kn_quant_block((const uint8_t *)src + i / KN_QBLOCK * (uint64_t)kn_quant_block_bytes(dt), dt, q,
                   &d, &m);
    return kn_quant_value(dt, q[i % KN_QBLOCK], d, m);
  }
  default: return 0.0f;
  }
}

void kn_x16_pack(const uint16_t *src, int64_t rows, int64_t k, void *dst) {
  uint16_t *o = dst;
  for (int64_t g = 0; g < rows / 16; g++)
    for (int64_t p = 0; p < k / 2; p++)
      for (int i = 0; i < 16; i++, o += 2) {
        const uint16_t *r = src + (g * 16 + i) * k + 2 * p;
        o[0] = r[0], o[1] = r[1];
      }
}
