/* kn_quant: dequantization of rows and single values (build-time folding, embedding
 * lookups, casts). */
#include "kn_quant.h"

#include <string.h>

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
      for (int i = 0; i < KN_QBLOCK; i++)
        out[b * KN_QBLOCK + i] = kn_quant_value(dt, q[i], d, m);
    }
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
    kn_quant_block((const uint8_t *)src + i / KN_QBLOCK * (uint64_t)kn_quant_block_bytes(dt), dt,
                   q, &d, &m);
    return kn_quant_value(dt, q[i % KN_QBLOCK], d, m);
  }
  default: return 0.0f;
  }
}
