/* kn_transpose: the in-place transpose of 16 AVX-512 registers of 16 lanes (register i's
 * lane j becomes register j's lane i), for the kernels that turn rows into lanes: the
 * queries of attention's queries-in-lanes groups, the W8A8 tile packing (dwords of bytes,
 * through casts; a transpose moves bits, so any 32-bit lanes). Three rounds of unpacks and
 * 128-bit shuffles: 64 instructions. */
#ifndef KN_TRANSPOSE_H
#define KN_TRANSPOSE_H

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>

static inline __attribute__((target("avx512f"), always_inline)) void kn_transpose16x16(__m512 *r) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) /* pairs of rows, 32-bit interleaved */
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 16; i += 4) /* u[i + e]: element e of rows i .. i+3, each 128 bits */
    for (int h = 0; h < 2; h++) {
      __m512d a = _mm512_castps_pd(t[i + h]), b = _mm512_castps_pd(t[i + 2 + h]);
      u[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      u[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  for (int e = 0; e < 4; e++) { /* columns e, e + 4, e + 8, e + 12 */
    __m512 v0 = _mm512_shuffle_f32x4(u[e], u[4 + e], _MM_SHUFFLE(2, 0, 2, 0));
    __m512 v1 = _mm512_shuffle_f32x4(u[e], u[4 + e], _MM_SHUFFLE(3, 1, 3, 1));
    __m512 v2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(2, 0, 2, 0));
    __m512 v3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(3, 1, 3, 1));
    r[e] = _mm512_shuffle_f32x4(v0, v2, _MM_SHUFFLE(2, 0, 2, 0));
    r[e + 8] = _mm512_shuffle_f32x4(v0, v2, _MM_SHUFFLE(3, 1, 3, 1));
    r[e + 4] = _mm512_shuffle_f32x4(v1, v3, _MM_SHUFFLE(2, 0, 2, 0));
    r[e + 12] = _mm512_shuffle_f32x4(v1, v3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}
#endif

#endif
