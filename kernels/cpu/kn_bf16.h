/* kn_bf16: the scalar steps of the bf16 order (AVX512-BF16's vcvtneps2bf16 and vdpbf16ps),
 * shared by the bf16 matmuls and bf16 attention: rounding to bf16, and a product added
 * with subnormal inputs and results flushed to zero. The portable paths compute these; the
 * vector ones the same steps on the instructions or under MXCSR's DAZ and FTZ. */
#ifndef KN_BF16_H
#define KN_BF16_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* f rounded to bf16 as vcvtneps2bf16 does: nearest even, NaN kept quiet, a subnormal f to
 * its signed zero. */
static inline uint16_t kn_bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40u); /* quiet NaN */
  if (!(u & 0x7f800000u)) return (uint16_t)(u >> 16 & 0x8000u); /* zero, subnormal: +-0 */
  return (uint16_t)((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}

/* A subnormal f32 (given or computed) as its signed zero. */
static inline float kn_ftz(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (!(u & 0x7f800000u)) u &= 0x80000000u;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The f32 value of bf16 h (the low 16 bits), a subnormal read as zero. */
static inline float kn_bf16_f32(uint32_t h) {
  uint32_t u = h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return kn_ftz(f);
}

/* f rounded to bf16, as an f32. */
static inline float kn_bf16_value(float f) { return kn_bf16_f32(kn_bf16_round(f)); }

/* fma(a, b, c) with DAZ and FTZ as x86 applies them: a subnormal c is read as its signed
 * zero (as are a and b: bf16 values here are never subnormal), and a result is tiny when,
 * rounded to 24 bits with an unbounded exponent, it is below FLT_MIN, which rounding on the
 * subnormal grid (fmaf) misses for exact results in [FLT_MIN (1 - 2^-24), FLT_MIN (1 -
 * 2^-25)): fmaf gives FLT_MIN there. a * b (bf16 values) is exact in double; near FLT_MIN
 * so is the sum. (Round to nearest even, as vdpbf16ps: the portable path assumes the
 * default mode.) */
static inline float kn_fma_ftz(float a, float b, float c) {
  c = kn_ftz(c);
  float r = fmaf(a, b, c);
  if (fabsf(r) == FLT_MIN && fabs((double)a * b + c) < (double)FLT_MIN * (1.0 - 0x1p-25))
    return r < 0 ? -0.0f : 0.0f;
  return kn_ftz(r);
}

#endif
