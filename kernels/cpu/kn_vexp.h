/* kn_vexp: e^x in f32 for x <= 0, the one exp of the softmax-like kernels (attention, the
 * logits' log-sum-exp): x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts), e^r by a
 * degree-7 polynomial (Cephes expf, within 2 ulp), times 2^n built in the exponent bits.
 * Below -87 (under 2^-125, against a sum >= 1) it returns 0, so -inf gives 0; NaN stays
 * NaN. The scalar form and the 8-lane AVX2 form do the same operations in the same order,
 * so they give the same bits wherever the scalar madd is a fused one (FP_FAST_FMAF). */
#ifndef KN_VEXP_H
#define KN_VEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef FP_FAST_FMAF
#define KN_VEXP_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define KN_VEXP_MADD(a, b, c) ((a) * (b) + (c))
#endif

#define KN_VEXP_MIN (-87.0f)
#define KN_VEXP_LOG2E 1.44269504088896341f
#define KN_VEXP_LN2_HI 0.693359375f
#define KN_VEXP_LN2_LO (-2.12194440e-4f)
#define KN_VEXP_ROUND 12582912.0f /* 1.5 * 2^23: adding and subtracting it rounds to integer */
static const float k_kn_vexp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                        4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float kn_vexp(float x) {
  if (isnan(x)) return x;
  if (x < KN_VEXP_MIN) return 0.0f;
  float n = (x * KN_VEXP_LOG2E + KN_VEXP_ROUND) - KN_VEXP_ROUND;
  float r = KN_VEXP_MADD(n, -KN_VEXP_LN2_HI, x);
  r = KN_VEXP_MADD(n, -KN_VEXP_LN2_LO, r);
  float p = k_kn_vexp_poly[0];
  for (int i = 1; i < 6; i++) p = KN_VEXP_MADD(p, r, k_kn_vexp_poly[i]);
  float y = KN_VEXP_MADD(p, r * r, r) + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

static inline __attribute__((target("avx2,fma"), always_inline)) __m256 kn_vexp8(__m256 v) {
  __m256 keep = _mm256_cmp_ps(v, _mm256_set1_ps(KN_VEXP_MIN), _CMP_GE_OQ);
  __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  __m256 t = _mm256_mul_ps(v, _mm256_set1_ps(KN_VEXP_LOG2E));
  __m256 nf =
      _mm256_sub_ps(_mm256_add_ps(t, _mm256_set1_ps(KN_VEXP_ROUND)), _mm256_set1_ps(KN_VEXP_ROUND));
  __m256 r = _mm256_fmadd_ps(nf, _mm256_set1_ps(-KN_VEXP_LN2_HI), v);
  r = _mm256_fmadd_ps(nf, _mm256_set1_ps(-KN_VEXP_LN2_LO), r);
  __m256 p = _mm256_set1_ps(k_kn_vexp_poly[0]);
  for (int i = 1; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(k_kn_vexp_poly[i]));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  /* below the cut nf may be far out of range; the result is masked to 0 there anyway */
  __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_max_ps(nf, _mm256_set1_ps(-127.0f))),
                       _mm256_set1_epi32(127)),
      23);
  __m256 out = _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), keep);
  return _mm256_blendv_ps(out, v, nan);
}

/* kn_vexp8 on 16 lanes, operation for operation (masks for the compares). */
static inline __attribute__((target("avx512f"), always_inline)) __m512 kn_vexp16(__m512 v) {
  __mmask16 keep = _mm512_cmp_ps_mask(v, _mm512_set1_ps(KN_VEXP_MIN), _CMP_GE_OQ);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  __m512 t = _mm512_mul_ps(v, _mm512_set1_ps(KN_VEXP_LOG2E));
  __m512 nf =
      _mm512_sub_ps(_mm512_add_ps(t, _mm512_set1_ps(KN_VEXP_ROUND)), _mm512_set1_ps(KN_VEXP_ROUND));
  __m512 r = _mm512_fmadd_ps(nf, _mm512_set1_ps(-KN_VEXP_LN2_HI), v);
  r = _mm512_fmadd_ps(nf, _mm512_set1_ps(-KN_VEXP_LN2_LO), r);
  __m512 p = _mm512_set1_ps(k_kn_vexp_poly[0]);
  for (int i = 1; i < 6; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(k_kn_vexp_poly[i]));
  __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_max_ps(nf, _mm512_set1_ps(-127.0f))),
                       _mm512_set1_epi32(127)),
      23);
  __m512 out = _mm512_maskz_mov_ps(keep, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
  return _mm512_mask_blend_ps(nan, out, v);
}
#endif

#endif
