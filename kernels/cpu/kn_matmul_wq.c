/* kn_matmul_wq: y = x . W^T + bias for int8 / int4 weights with separate scales and zero
 * points (weight-only: dequantized in registers, f32 sums), and W8A8 (per-row int8
 * activations, int32 sums with VNNI). Run-time dispatch to AVX-512 / AVX2 (+ VNNI) with a
 * portable C fallback; threaded over (m, n) output tiles like kn_matmul. */
#include "kn_matmul_wq.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "ir_alloc.h"
#include "kn_cpu.h"
#include "kn_transpose.h"

/* Weight-only order (batch invariance): as kn_matmul, every y element is one dot product
 * in a fixed order -- 16 lanes strided over k, folded (l, l+8), (l, l+4), (l, l+2),
 * (0, 1), the k % 16 tail added in order, then the bias. The AVX2 and AVX-512 kernels
 * both use FMA in that order, so they agree with each other and with kn_matmul on the
 * dequantized W bit for bit. They need k and group multiples of 16 (a 16-value chunk then
 * has one scale); other shapes take the portable path.
 *
 * W8A8: each row of x is quantized by itself (its scale depends on that row only) and
 * the integer dot is exact, so the result does not depend on order at all. VNNI's
 * vpdpbusd multiplies unsigned by signed bytes: W goes in as the unsigned operand
 * (q + 128, a sign-bit flip in the register) and 128 * sum(xq) is taken off again.
 * Blocks of 16 rows of a prefill tile go to AMX-INT8 where the CPU and the OS allow it:
 * TDPBSSD multiplies signed by signed bytes into exact int32 sums, the same values. */
enum {
  WQ_LANES = 16,
  WQ_MAX_R = 4,
  WQ_MAX_C = 8,
  WQ_SERIAL_FLOPS = 1 << 18,
  WQ_RUN = 16,              /* SIMD paths: groups whose scales and zeros are read ahead into f32 */
  WQ_PREFETCH_BYTES = 8192, /* W bytes asked for ahead into L2, as kn_matmul does */
  /* W8A8 prefill on the interleaved tile (w8x_tile): x rows and 16-column groups a
   * kernel call, 16 columns a group, the fewest x rows that take it */
  W8X_R = 6,
  W8X_G = 4,
  W8X_COLS = 16,
  W8X_MIN_M = 16,
  W8X_M_TILE = 512, /* x rows of a tile: each tile packs its W once */
};

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define WQ_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define WQ_X86 0
#endif

typedef struct wq_args wq_args;
/* Weight-only: the mr x nr dot products of rows xr[r] with W rows rows[c]. */
typedef void (*wq_fn)(const wq_args *a, const float *const *xr, const int64_t *rows, float *out);
/* W8A8: exact sum_l xq[r][l] * wr[c][l] into out[r * nr + c]; xs[r] = sum_l xq[r][l]. */
typedef void (*w8_fn)(const int8_t *const *xq, const int32_t *xs, const int8_t *const *wr,
                      int64_t k, int32_t *out);
/* Quantizes one row of x (see kn_matmul_w8a8). */
typedef void (*w8_quant_fn)(const float *x, int64_t k, int8_t *q, float *scale, int32_t *sum);

typedef struct wq_kernels {
  int mr, nr; /* the blocked kernel */
  int nr1;    /* the single-row kernel (decode, and m % mr leftovers) */
  wq_fn block, row;
  w8_fn block8, row8;
  w8_quant_fn quant;
  bool amx; /* W8A8: 16-row blocks of a tile on AMX-INT8 (block8 / row8 take the rest) */
  bool x16; /* W8A8 prefill: the tile's W repacked 16 rows interleaved (w8x_tile) */
} wq_kernels;

struct wq_args {
  uint8_t *x16_buf; /* w8x_tile's scratch (64-aligned), x16_bytes a thread, or NULL */
  int64_t x16_bytes;
  void *x16_block; /* the allocation it lies in */
  int8_t *x16_xq;  /* x rows quantized once for every tile, x16_xstride bytes apart */
  float *x16_sx;   /* their scales */
  int32_t *x16_xs; /* and code sums */
  int64_t x16_xstride;
  int8_t *amx_xv; /* AMX: the x rows of every whole 16-row block quantized and packed once a
                   * call (w8_amx_prep), nkb steps a block, or NULL */
  float *amx_sx;  /* their scales */
  float *y;
  const float *x;
  const kn_wq *w;
  const float *bias;
  int64_t m, n, k;     /* n: columns of y (rows of W, or half of them with swiglu) */
  bool swiglu;         /* y[:, j] = silu(z[:, j]) * z[:, n + j] (kn_matmul_swiglu) */
  int64_t ng;          /* groups per row: k / group */
  int64_t w_row_bytes; /* bytes of one row of q */
  kn_mm_tiles tiles;   /* as kn_matmul cuts its tasks */
  const wq_kernels *kern;
};

/* ---- scalar access (the reference for every path) -------------------------------------- */

static inline float wq_scale(const kn_wq *w, int64_t ng, int64_t j, int64_t g) {
  int64_t i = j * ng + g;
  return w->st == IR_F16 ? ir_f16_to_f32(((const uint16_t *)w->scales)[i])
                         : ((const float *)w->scales)[i];
}

static inline float wq_zero(const kn_wq *w, int64_t ng, int64_t j, int64_t g) {
  if (!w->zp) return w->qt == IR_I4 ? 8.0f : 0.0f;
  int64_t i = j * ng + g;
  switch (w->zt) {
  case IR_I8: return ((const int8_t *)w->zp)[i];
  case IR_F16: return ir_f16_to_f32(((const uint16_t *)w->zp)[i]);
  case IR_F32: return ((const float *)w->zp)[i];
  default: return ((const uint8_t *)w->zp)[i];
  }
}

static inline int wq_q(const kn_wq *w, int64_t k, int64_t j, int64_t i) {
  if (w->qt == IR_I8) return ((const int8_t *)w->q)[j * k + i];
  uint8_t b = ((const uint8_t *)w->q)[(j * k + i) / 2]; /* k is even: rows start on a byte */
  return i & 1 ? b >> 4 : b & 15;
}

/* E4M3 codes' values, filled once (f8_lut_init) before a matmul reads them. */
static float g_f8_lut[256];
static pthread_once_t g_f8_once = PTHREAD_ONCE_INIT;

static void f8_lut_fill(void) {
  for (int i = 0; i < 256; i++) g_f8_lut[i] = ir_f8e4m3_to_f32((uint8_t)i);
}

static void f8_lut_init(void) { pthread_once(&g_f8_once, f8_lut_fill); }

float kn_wq_value(const kn_wq *w, int64_t k, int64_t row, int64_t col) {
  int64_t ng = k / w->group, g = col / w->group;
  if (w->qt == IR_F8_E4M3) /* zero point 0: the code's value times the scale */
    return ir_f8e4m3_to_f32(((const uint8_t *)w->q)[row * k + col]) * wq_scale(w, ng, row, g);
  return ((float)wq_q(w, k, row, col) - wq_zero(w, ng, row, g)) * wq_scale(w, ng, row, g);
}

/* ---- portable C ------------------------------------------------------------------------ */

#ifdef FP_FAST_FMAF
#define WQ_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define WQ_MADD(a, b, c) ((a) * (b) + (c))
#endif

static inline float wq_fold16(float *v) {
  for (int w = WQ_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) v[l] += v[l + w];
  return v[0];
}

static inline __attribute__((always_inline)) void wq_body_c(const wq_args *a,
                                                            const float *const *xr,
                                                            const int64_t *rows, float *out, int mr,
                                                            int nr) {
  float acc[WQ_MAX_R][WQ_MAX_C][WQ_LANES] = {{{0}}};
  float wv[WQ_MAX_C][WQ_LANES];
  const int64_t k = a->k, kf = k - k % WQ_LANES;
  const bool f8 = a->w->qt == IR_F8_E4M3 && a->w->group == k; /* one scale a row: a table */
  float f8s[WQ_MAX_C];
  for (int c = 0; f8 && c < nr; c++) f8s[c] = wq_scale(a->w, 1, rows[c], 0);
  for (int64_t i = 0; i < kf; i += WQ_LANES) {
    for (int c = 0; c < nr; c++)
      for (int l = 0; l < WQ_LANES; l++)
        wv[c][l] = f8 ? g_f8_lut[((const uint8_t *)a->w->q)[rows[c] * k + i + l]] * f8s[c]
                      : kn_wq_value(a->w, k, rows[c], i + l);
    for (int r = 0; r < mr; r++)
      for (int c = 0; c < nr; c++)
        for (int l = 0; l < WQ_LANES; l++)
          acc[r][c][l] = WQ_MADD(xr[r][i + l], wv[c][l], acc[r][c][l]);
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) {
      float s = wq_fold16(acc[r][c]);
      for (int64_t i = kf; i < k; i++) s = WQ_MADD(xr[r][i], kn_wq_value(a->w, k, rows[c], i), s);
      out[r * nr + c] = s;
    }
}

static void wq_c_2x2(const wq_args *a, const float *const *xr, const int64_t *rows, float *out) {
  wq_body_c(a, xr, rows, out, 2, 2);
}
static void wq_c_1x4(const wq_args *a, const float *const *xr, const int64_t *rows, float *out) {
  wq_body_c(a, xr, rows, out, 1, 4);
}

static inline __attribute__((always_inline)) void w8_body_c(const int8_t *const *xq,
                                                            const int8_t *const *wr, int64_t k,
                                                            int32_t *out, int mr, int nr) {
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) {
      int32_t s = 0; /* |xq|, |q| <= 127 and k <= 32768: no overflow */
      for (int64_t i = 0; i < k; i++) s += (int32_t)xq[r][i] * wr[c][i];
      out[r * nr + c] = s;
    }
}

static void w8_c_2x2(const int8_t *const *xq, const int32_t *xs, const int8_t *const *wr, int64_t k,
                     int32_t *out) {
  (void)xs;
  w8_body_c(xq, wr, k, out, 2, 2);
}
static void w8_c_1x4(const int8_t *const *xq, const int32_t *xs, const int8_t *const *wr, int64_t k,
                     int32_t *out) {
  (void)xs;
  w8_body_c(xq, wr, k, out, 1, 4);
}

/* max|x| ignoring NaN, then v = x * (127 / amax) clamped as max(v, -127), min(v, 127)
 * (the operand order of maxps/minps, so the SIMD paths give the same bytes), rounded to
 * nearest even. */
static void w8_quant_c(const float *x, int64_t k, int8_t *q, float *scale, int32_t *sum) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; i++) {
    float v = fabsf(x[i]);
    amax = v > amax ? v : amax;
  }
  float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t s = 0;
  for (int64_t i = 0; i < k; i++) {
    float v = x[i] * inv;
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    q[i] = (int8_t)lrintf(v);
    s += q[i];
  }
  *scale = amax / 127.0f;
  *sum = s;
}

/* ---- x86: AVX2 + FMA (+ AVX-VNNI for W8A8) ---------------------------------------------- */
#if WQ_X86
#define WQ_AVX2 __attribute__((target("avx2,fma,f16c")))
#define WQ_AVX2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* Prefetches W ahead of p (never faults: past the end it only wastes a request). */
static inline void wq_prefetch(const void *p) {
  _mm_prefetch((const char *)p + WQ_PREFETCH_BYTES, _MM_HINT_T1);
}

WQ_AVX2_INLINE float wq_fold8_avx(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(a);
}

/* 16 int4 values (8 bytes, element 2t low nibble of byte t) as 16 bytes in element order. */
WQ_AVX2_INLINE __m128i wq_nibbles16(const uint8_t *p) {
  __m128i v = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(0x0f);
  return _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
}

/* q of values i..i+15 of a row as f32, in two halves. */
WQ_AVX2_INLINE void wq_q16_avx2(const uint8_t *row, int64_t i, ir_dtype qt, __m256 *lo,
                                __m256 *hi) {
  __m128i b;
  if (qt == IR_I4) {
    b = wq_nibbles16(row + i / 2);
    *lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    *hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
  } else {
    b = _mm_loadu_si128((const __m128i *)(row + i));
    *lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    *hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
  }
}

/* Scales and zeros of groups [g0, g0 + cnt) of W row j as f32, ahead of their use:
 * F16C converts a half in one instruction where ir_f16_to_f32 branches. */
WQ_AVX2_INLINE void wq_params(const kn_wq *w, int64_t ng, int64_t j, int64_t g0, int cnt, float *s,
                              float *z) {
  int64_t b = j * ng + g0;
  for (int t = 0; t < cnt; t++)
    s[t] = w->st == IR_F16 ? _cvtsh_ss(((const uint16_t *)w->scales)[b + t])
                           : ((const float *)w->scales)[b + t];
  for (int t = 0; t < cnt; t++)
    z[t] = !w->zp            ? (w->qt == IR_I4 ? 8.0f : 0.0f)
           : w->zt == IR_F16 ? _cvtsh_ss(((const uint16_t *)w->zp)[b + t])
                             : wq_zero(w, ng, j, g0 + t);
}

/* Lanes 0-7 in lo, 8-15 in hi; a run of groups at a time, each group's scale and zero
 * broadcast once for its chunks. */
WQ_AVX2_INLINE void wq_body_avx2(const wq_args *a, const float *const *xr, const int64_t *rows,
                                 float *out, ir_dtype qt, int mr, int nr) {
  const kn_wq *w = a->w;
  __m256 lo[WQ_MAX_R][WQ_MAX_C], hi[WQ_MAX_R][WQ_MAX_C];
  const uint8_t *qr[WQ_MAX_C];
  float s[WQ_MAX_C][WQ_RUN], z[WQ_MAX_C][WQ_RUN];
  const int64_t group = w->group;
  bool sub = w->zp || qt == IR_I4;
  for (int c = 0; c < nr; c++) qr[c] = (const uint8_t *)w->q + rows[c] * a->w_row_bytes;
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < a->ng; g0 += WQ_RUN) {
    int run = a->ng - g0 < WQ_RUN ? (int)(a->ng - g0) : WQ_RUN;
    for (int c = 0; c < nr; c++) wq_params(w, a->ng, rows[c], g0, run, s[c], z[c]);
    for (int t = 0; t < run; t++)
      for (int64_t i = (g0 + t) * group; i < (g0 + t + 1) * group; i += WQ_LANES)
        for (int c = 0; c < nr; c++) {
          __m256 ql, qh, sv = _mm256_set1_ps(s[c][t]), zv = _mm256_set1_ps(z[c][t]);
          wq_prefetch(qr[c] + (qt == IR_I4 ? i / 2 : i));
          wq_q16_avx2(qr[c], i, qt, &ql, &qh);
          __m256 wl = _mm256_mul_ps(sub ? _mm256_sub_ps(ql, zv) : ql, sv);
          __m256 wh = _mm256_mul_ps(sub ? _mm256_sub_ps(qh, zv) : qh, sv);
          for (int r = 0; r < mr; r++) {
            lo[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[r] + i), wl, lo[r][c]);
            hi[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[r] + i + 8), wh, hi[r][c]);
          }
        }
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) out[r * nr + c] = wq_fold8_avx(_mm256_add_ps(lo[r][c], hi[r][c]));
}

#define WQ_INST_AVX2(name, qt, mr, nr)                                                             \
  static WQ_AVX2 void name(const wq_args *a, const float *const *xr, const int64_t *rows,          \
                           float *out) {                                                           \
    wq_body_avx2(a, xr, rows, out, qt, mr, nr);                                                    \
  }
WQ_INST_AVX2(wq_avx2_i8_2x2, IR_I8, 2, 2)
WQ_INST_AVX2(wq_avx2_i8_1x4, IR_I8, 1, 4)
WQ_INST_AVX2(wq_avx2_i4_2x2, IR_I4, 2, 2)
WQ_INST_AVX2(wq_avx2_i4_1x4, IR_I4, 1, 4)

WQ_AVX2_INLINE int32_t wq_hsum8_epi32(__m256i v) {
  __m128i a = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0x4e));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0xb1));
  return _mm_cvtsi128_si32(a);
}

static WQ_AVX2 void w8_quant_avx2(const float *x, int64_t k, int8_t *q, float *scale,
                                  int32_t *sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 am = _mm256_setzero_ps();
  int64_t i = 0, kf = k - k % 8;
  for (; i < kf; i += 8) am = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), am);
  float lane[8], amax = 0.0f;
  _mm256_storeu_ps(lane, am);
  for (int l = 0; l < 8; l++) amax = lane[l] > amax ? lane[l] : amax;
  for (; i < k; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
  float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  __m256 iv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i acc = _mm256_setzero_si256();
  for (i = 0; i < kf; i += 8) {
    __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv), lo), hi);
    __m256i qi = _mm256_cvtps_epi32(v);
    acc = _mm256_add_epi32(acc, qi);
    __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
    _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(p, p));
  }
  int32_t s = wq_hsum8_epi32(acc);
  for (; i < k; i++) {
    float v = x[i] * inv;
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    q[i] = (int8_t)lrintf(v);
    s += q[i];
  }
  *scale = amax / 127.0f;
  *sum = s;
}

/* Without VNNI: vpmaddubsw multiplies |w| (unsigned) by x with w's sign, pairs summed
 * into int16 (at most 2 * 128 * 127: no saturation), vpmaddwd sums those into int32. The
 * k % 32 tail in scalar. */
WQ_AVX2_INLINE void w8_body_avx2(const int8_t *const *xq, const int8_t *const *wr, int64_t k,
                                 int32_t *out, int mr, int nr) {
  __m256i acc[WQ_MAX_R][WQ_MAX_C];
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t kf = k - k % 32;
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) acc[r][c] = _mm256_setzero_si256();
  for (int64_t i = 0; i < kf; i += 32) {
    __m256i xv[WQ_MAX_R];
    for (int r = 0; r < mr; r++) xv[r] = _mm256_loadu_si256((const __m256i *)(xq[r] + i));
    for (int c = 0; c < nr; c++) {
      wq_prefetch(wr[c] + i);
      __m256i wv = _mm256_loadu_si256((const __m256i *)(wr[c] + i)), aw = _mm256_abs_epi8(wv);
      for (int r = 0; r < mr; r++) {
        __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[r], wv));
        acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(p, ones));
      }
    }
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) {
      int32_t tail = 0;
      for (int64_t i = kf; i < k; i++) tail += (int32_t)xq[r][i] * wr[c][i];
      out[r * nr + c] = wq_hsum8_epi32(acc[r][c]) + tail;
    }
}

static WQ_AVX2 void w8_avx2_2x4(const int8_t *const *xq, const int32_t *xs, const int8_t *const *wr,
                                int64_t k, int32_t *out) {
  (void)xs;
  w8_body_avx2(xq, wr, k, out, 2, 4);
}
static WQ_AVX2 void w8_avx2_1x4(const int8_t *const *xq, const int32_t *xs, const int8_t *const *wr,
                                int64_t k, int32_t *out) {
  (void)xs;
  w8_body_avx2(xq, wr, k, out, 1, 4);
}

#define WQ_VNNI256 __attribute__((target("avx2,fma,f16c,avxvnni")))
#define WQ_VNNI256_INLINE                                                                          \
  static inline __attribute__((target("avx2,fma,f16c,avxvnni"), always_inline))

/* 32 bytes a step with vpdpbusd; the k % 32 tail in scalar, its xq sum taken out of the
 * correction. */
WQ_VNNI256_INLINE void w8_body_vnni256(const int8_t *const *xq, const int32_t *xs,
                                       const int8_t *const *wr, int64_t k, int32_t *out, int mr,
                                       int nr) {
  __m256i acc[WQ_MAX_R][WQ_MAX_C];
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  const int64_t kf = k - k % 32;
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) acc[r][c] = _mm256_setzero_si256();
  for (int64_t i = 0; i < kf; i += 32) {
    __m256i xv[WQ_MAX_R];
    for (int r = 0; r < mr; r++) xv[r] = _mm256_loadu_si256((const __m256i *)(xq[r] + i));
    for (int c = 0; c < nr; c++) {
      wq_prefetch(wr[c] + i);
      __m256i wv = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wr[c] + i)), flip);
      for (int r = 0; r < mr; r++) acc[r][c] = _mm256_dpbusd_avx_epi32(acc[r][c], wv, xv[r]);
    }
  }
  for (int r = 0; r < mr; r++) {
    int32_t tail_x = 0;
    for (int64_t i = kf; i < k; i++) tail_x += xq[r][i];
    for (int c = 0; c < nr; c++) {
      int32_t tail = 0;
      for (int64_t i = kf; i < k; i++) tail += (int32_t)xq[r][i] * wr[c][i];
      /* wrapping arithmetic: the true value fits in int32 even where the biased sum may not */
      uint32_t v =
          (uint32_t)wq_hsum8_epi32(acc[r][c]) - 128u * (uint32_t)(xs[r] - tail_x) + (uint32_t)tail;
      out[r * nr + c] = (int32_t)v;
    }
  }
}

static WQ_VNNI256 void w8_vnni256_2x4(const int8_t *const *xq, const int32_t *xs,
                                      const int8_t *const *wr, int64_t k, int32_t *out) {
  w8_body_vnni256(xq, xs, wr, k, out, 2, 4);
}
static WQ_VNNI256 void w8_vnni256_1x4(const int8_t *const *xq, const int32_t *xs,
                                      const int8_t *const *wr, int64_t k, int32_t *out) {
  w8_body_vnni256(xq, xs, wr, k, out, 1, 4);
}

/* ---- x86: AVX-512F (+ AVX512-VNNI for W8A8) -------------------------------------------- */
#define WQ_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#define WQ_AVX512_INLINE                                                                           \
  static inline __attribute__((target("avx512f,avx512bw,avx2,fma,f16c"), always_inline))

WQ_AVX512_INLINE float wq_fold16_avx512(__m512 v) {
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return wq_fold8_avx(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}

/* One zmm accumulator per output. An int4 chunk is a lookup of its 16 nibbles in the
 * group's table (v - z) * s, v = 0..15 (vpermps reads the low 4 bits of each index): the
 * same products as dequantizing value by value. */
WQ_AVX512_INLINE void wq_body_avx512(const wq_args *a, const float *const *xr, const int64_t *rows,
                                     float *out, ir_dtype qt, int mr, int nr) {
  const kn_wq *w = a->w;
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[WQ_MAX_R][WQ_MAX_C];
  const uint8_t *qr[WQ_MAX_C];
  float s[WQ_MAX_C][WQ_RUN], z[WQ_MAX_C][WQ_RUN];
  const int64_t group = w->group;
  bool sub = w->zp != NULL;
  for (int c = 0; c < nr; c++) qr[c] = (const uint8_t *)w->q + rows[c] * a->w_row_bytes;
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) acc[r][c] = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < a->ng; g0 += WQ_RUN) {
    int run = a->ng - g0 < WQ_RUN ? (int)(a->ng - g0) : WQ_RUN;
    for (int c = 0; c < nr; c++) wq_params(w, a->ng, rows[c], g0, run, s[c], z[c]);
    for (int t = 0; t < run; t++) {
      __m512 tab[WQ_MAX_C]; /* int4: the group's 16 values; int8: unused */
      if (qt == IR_I4)
        for (int c = 0; c < nr; c++)
          tab[c] =
              _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(z[c][t])), _mm512_set1_ps(s[c][t]));
      for (int64_t i = (g0 + t) * group; i < (g0 + t + 1) * group; i += WQ_LANES)
        for (int c = 0; c < nr; c++) {
          __m512 wv;
          wq_prefetch(qr[c] + (qt == IR_I4 ? i / 2 : i));
          if (qt == IR_I4) {
            wv = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(wq_nibbles16(qr[c] + i / 2)), tab[c]);
          } else {
            __m512 q = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qr[c] + i))));
            wv = _mm512_mul_ps(sub ? _mm512_sub_ps(q, _mm512_set1_ps(z[c][t])) : q,
                               _mm512_set1_ps(s[c][t]));
          }
          for (int r = 0; r < mr; r++)
            acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[r] + i), wv, acc[r][c]);
        }
    }
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) out[r * nr + c] = wq_fold16_avx512(acc[r][c]);
}

#define WQ_INST_AVX512(name, qt, mr, nr)                                                           \
  static WQ_AVX512 void name(const wq_args *a, const float *const *xr, const int64_t *rows,        \
                             float *out) {                                                         \
    wq_body_avx512(a, xr, rows, out, qt, mr, nr);                                                  \
  }
WQ_INST_AVX512(wq_avx512_i8_4x4, IR_I8, 4, 4)
WQ_INST_AVX512(wq_avx512_i8_1x8, IR_I8, 1, 8)
WQ_INST_AVX512(wq_avx512_i4_4x4, IR_I4, 4, 4)
WQ_INST_AVX512(wq_avx512_i4_1x8, IR_I4, 1, 8)

static WQ_AVX512 void w8_quant_avx512(const float *x, int64_t k, int8_t *q, float *scale,
                                      int32_t *sum) {
  __m512 am = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {
    __mmask16 mk = k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - i)) - 1);
    am = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(mk, x + i)), am);
  }
  float amax = _mm512_reduce_max_ps(am); /* lanes are >= 0 and not NaN: order-free */
  float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  __m512 iv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  __m512i acc = _mm512_setzero_si512();
  for (int64_t i = 0; i < k; i += 16) {
    __mmask16 mk = k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - i)) - 1);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + i), iv);
    __m512i qi = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi));
    acc = _mm512_add_epi32(acc, qi); /* masked-off lanes are 0 */
    _mm512_mask_cvtepi32_storeu_epi8(q + i, mk, qi);
  }
  *scale = amax / 127.0f;
  *sum = _mm512_reduce_add_epi32(acc);
}

#define WQ_VNNI512 __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define WQ_VNNI512_INLINE                                                                          \
  static inline __attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))

/* out[i] = the sum of v[i]'s 16 lanes for 16 accumulators at once (a transposing tree: 4
 * or 8 accumulators an add; integer sums are exact in any order). Over a short k (576: nine
 * steps) a 4 x 4 call otherwise spends about as many instructions reducing as summing. */
WQ_VNNI512_INLINE void w8_fold16x16_vnni512(const __m512i *v, int32_t *out) {
  __m512i t[8], u[4], w[2];
  for (int j = 0; j < 8; j++)
    t[j] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2 * j], v[2 * j + 1], 0x44),
                            _mm512_shuffle_i32x4(v[2 * j], v[2 * j + 1], 0xee));
  for (int j = 0; j < 4; j++)
    u[j] = _mm512_add_epi32(_mm512_shuffle_i32x4(t[2 * j], t[2 * j + 1], 0x88),
                            _mm512_shuffle_i32x4(t[2 * j], t[2 * j + 1], 0xdd));
  for (int j = 0; j < 2; j++) {
    __m512 a = _mm512_castsi512_ps(u[2 * j]), b = _mm512_castsi512_ps(u[2 * j + 1]);
    w[j] = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x44)),
                            _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xee)));
  }
  __m512 a = _mm512_castsi512_ps(w[0]), b = _mm512_castsi512_ps(w[1]);
  __m512i x = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
                               _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xdd)));
  const __m512i to = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(out, _mm512_permutexvar_epi32(to, x));
}

/* One 64-byte step of the mr x nr sums; the last step of a row is a masked load (zero
 * bytes add nothing), full steps pass an all-ones mask (plain loads). A macro, not a
 * function taking acc: GCC 12 then keeps the accumulators on the stack. The operands are
 * pinned to registers (loaded once, not folded into every vpdpbusd that reads them). */
#define WQ_PIN(v) __asm__("" : "+v"(v))
/* acc += vpdpbusd(u, s) in place: GCC 12's intrinsic copies the accumulator through a
 * scratch register around every one of a 4 x 4 block's. */
#define WQ_DPBUSD(acc, u, s) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s))
#define W8_STEP_VNNI512(i, mk)                                                                     \
  do {                                                                                             \
    __m512i xv[WQ_MAX_R];                                                                          \
    for (int r = 0; r < mr; r++) {                                                                 \
      xv[r] = _mm512_maskz_loadu_epi8((mk), xq[r] + (i));                                          \
      if (nr > 1) WQ_PIN(xv[r]);                                                                   \
    }                                                                                              \
    for (int c = 0; c < nr; c++) {                                                                 \
      wq_prefetch(wr[c] + (i));                                                                    \
      __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8((mk), wr[c] + (i)), flip);             \
      if (mr > 1) WQ_PIN(wv);                                                                      \
      for (int r = 0; r < mr; r++) WQ_DPBUSD(acc[r][c], wv, xv[r]);                                \
    }                                                                                              \
  } while (0)

/* 64 bytes a step (W8_STEP_VNNI512): the 1 x 8 row kernel. */
WQ_VNNI512_INLINE void w8_body_vnni512(const int8_t *const *xq, const int32_t *xs,
                                       const int8_t *const *wr, int64_t k, int32_t *out, int mr,
                                       int nr) {
  __m512i acc[WQ_MAX_R][WQ_MAX_C];
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) acc[r][c] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const __mmask64 tail = k % 64 ? ((__mmask64)1 << (k % 64)) - 1 : ~(__mmask64)0;
  for (int64_t i = 0; i < k; i += 64) W8_STEP_VNNI512(i, k - i >= 64 ? ~(__mmask64)0 : tail);
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++)
      out[r * nr + c] =
          (int32_t)((uint32_t)_mm512_reduce_add_epi32(acc[r][c]) - 128u * (uint32_t)xs[r]);
}

/* The 4 x 4 block with its sixteen sums in named registers: GCC 12 keeps an array of
 * them (w8_body_vnni512's) on the stack, a load and a store around every vpdpbusd. */
#define W8_COL4(c, a0, a1, a2, a3)                                                                 \
  do {                                                                                             \
    wq_prefetch(wr[c] + i);                                                                        \
    __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, wr[c] + i), flip);                   \
    WQ_DPBUSD(a0, wv, x0);                                                                         \
    WQ_DPBUSD(a1, wv, x1);                                                                         \
    WQ_DPBUSD(a2, wv, x2);                                                                         \
    WQ_DPBUSD(a3, wv, x3);                                                                         \
  } while (0)
static WQ_VNNI512 void w8_vnni512_4x4(const int8_t *const *xq, const int32_t *xs,
                                      const int8_t *const *wr, int64_t k, int32_t *out) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const __mmask64 tail = k % 64 ? ((__mmask64)1 << (k % 64)) - 1 : ~(__mmask64)0;
  __m512i v[16];
  for (int j = 0; j < 16; j++) v[j] = _mm512_setzero_si512();
  __m512i a00 = v[0], a01 = v[0], a02 = v[0], a03 = v[0], a10 = v[0], a11 = v[0], a12 = v[0],
          a13 = v[0], a20 = v[0], a21 = v[0], a22 = v[0], a23 = v[0], a30 = v[0], a31 = v[0],
          a32 = v[0], a33 = v[0];
  for (int64_t i = 0; i < k; i += 64) {
    __mmask64 mk = k - i >= 64 ? ~(__mmask64)0 : tail;
    __m512i x0 = _mm512_maskz_loadu_epi8(mk, xq[0] + i),
            x1 = _mm512_maskz_loadu_epi8(mk, xq[1] + i),
            x2 = _mm512_maskz_loadu_epi8(mk, xq[2] + i),
            x3 = _mm512_maskz_loadu_epi8(mk, xq[3] + i);
    W8_COL4(0, a00, a10, a20, a30);
    W8_COL4(1, a01, a11, a21, a31);
    W8_COL4(2, a02, a12, a22, a32);
    W8_COL4(3, a03, a13, a23, a33);
  }
  v[0] = a00, v[1] = a01, v[2] = a02, v[3] = a03, v[4] = a10, v[5] = a11, v[6] = a12, v[7] = a13;
  v[8] = a20, v[9] = a21, v[10] = a22, v[11] = a23, v[12] = a30, v[13] = a31, v[14] = a32;
  v[15] = a33;
  w8_fold16x16_vnni512(v, out);
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 4; c++)
      out[r * 4 + c] = (int32_t)((uint32_t)out[r * 4 + c] - 128u * (uint32_t)xs[r]);
}
/* One x row against 8 W rows (decode): each W row read through before the next, so the
 * W bytes stream in order (a 64-byte step of each of the 8 rows in turn had kept 8 streams
 * in flight: half the memory rate); two chains a row, the integer sums exact in any order. */
static WQ_VNNI512 void w8_vnni512_1x8(const int8_t *const *xq, const int32_t *xs,
                                      const int8_t *const *wr, int64_t k, int32_t *out) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const __mmask64 tail = k % 64 ? ((__mmask64)1 << (k % 64)) - 1 : ~(__mmask64)0;
  for (int c = 0; c < 8; c++) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0;
    int64_t i = 0;
    for (; i + 128 <= k; i += 128) {
      wq_prefetch(wr[c] + i);
      wq_prefetch(wr[c] + i + 64);
      __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(wr[c] + i), flip);
      __m512i w1 = _mm512_xor_si512(_mm512_loadu_si512(wr[c] + i + 64), flip);
      WQ_DPBUSD(a0, w0, _mm512_loadu_si512(xq[0] + i));
      WQ_DPBUSD(a1, w1, _mm512_loadu_si512(xq[0] + i + 64));
    }
    for (; i < k; i += 64) {
      __mmask64 mk = k - i >= 64 ? ~(__mmask64)0 : tail;
      __m512i w0 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, wr[c] + i), flip);
      WQ_DPBUSD(a0, w0, _mm512_maskz_loadu_epi8(mk, xq[0] + i));
    }
    out[c] = (int32_t)((uint32_t)_mm512_reduce_add_epi32(_mm512_add_epi32(a0, a1)) -
                       128u * (uint32_t)xs[0]);
  }
}

/* ---- W8A8 prefill on AVX512-VNNI: the W tile interleaved ---------------------------------
 * A prefill's tile (up to W8X_M_TILE rows of x against a W tile that stays in L2) first
 * rewrites its W rows 16 at a time with the 4 bytes of each k quad side by side (the
 * sign bit flipped: w + 128 as unsigned, vpdpbusd's unsigned operand): a 64-byte load is
 * then one quad of 16 output columns, against a broadcast quad of an x row, so each
 * output's integer sum grows in its own lane with no horizontal sums (the 4 x 4 kernel
 * spent a third of its time in them and in the flips). The packing costs one pass over
 * the tile's W, against the tile's rows of products. The sums are the exact integers of
 * every other path, so are the results: (float)(sum - 128 * sum(xq)) * (sx * sw), the
 * bias, the swiglu gate (kn_silu_mul_n). */

/* dst (kq quads of 64 bytes) = W rows w[0 .. nv) (row stride k; rows nv .. 15 zero, as the
 * bytes past k), quad p holding bytes 4p .. 4p+3 of the 16 rows, sign bits flipped. */
static WQ_VNNI512 void w8x_pack(const int8_t *w, int64_t k, int nv, int64_t kq, uint8_t *dst) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  for (int64_t i = 0; i < k; i += 64) {
    __mmask64 mk = k - i >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (k - i)) - 1;
    __m512 r[16]; /* 16 rows of 16 quads; transposed, 16 quads of 16 rows */
    for (int c = 0; c < 16; c++)
      r[c] = _mm512_castsi512_ps(c < nv ? _mm512_maskz_loadu_epi8(mk, w + c * k + i)
                                        : _mm512_setzero_si512());
    kn_transpose16x16(r);
    for (int q = 0; q < 16 && i / 4 + q < kq; q++)
      _mm512_store_si512((__m512i *)(dst + (i / 4 + q) * 64),
                         _mm512_xor_si512(_mm512_castps_si512(r[q]), flip));
  }
}

/* out[r * 64 + 16 g + c] = the sums of rows xr[r < 6] (zero-padded to kq quads) against
 * the 16 columns of each group wg[g < 4] (w + 128: 128 * sum(xq) still to take off). The
 * 24 sums in named registers (WQ_DPBUSD): GCC 12 keeps an array of them on the stack, and
 * with the intrinsic copies each through a scratch register. Fewer rows repeat a row. */
#define W8X_ROW(r, a0, a1, a2, a3)                                                                 \
  do {                                                                                             \
    int32_t q4;                                                                                    \
    memcpy(&q4, xr[r] + 4 * p, 4);                                                                 \
    __m512i xv = _mm512_set1_epi32(q4);                                                            \
    WQ_DPBUSD(a0, w0, xv);                                                                         \
    WQ_DPBUSD(a1, w1, xv);                                                                         \
    WQ_DPBUSD(a2, w2, xv);                                                                         \
    WQ_DPBUSD(a3, w3, xv);                                                                         \
  } while (0)
#define W8X_PUT(r, a0, a1, a2, a3)                                                                 \
  do {                                                                                             \
    _mm512_storeu_si512(out + (r)*64, a0), _mm512_storeu_si512(out + (r)*64 + 16, a1);             \
    _mm512_storeu_si512(out + (r)*64 + 32, a2), _mm512_storeu_si512(out + (r)*64 + 48, a3);        \
  } while (0)
static WQ_VNNI512 void w8x_kernel(const int8_t *const *xr, const uint8_t *const *wg, int64_t kq,
                                  int32_t *out) {
  const __m512i z = _mm512_setzero_si512();
  __m512i a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z, a20 = z, a21 = z,
          a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z, a40 = z, a41 = z, a42 = z, a43 = z,
          a50 = z, a51 = z, a52 = z, a53 = z;
  for (int64_t p = 0; p < kq; p++) {
    __m512i w0 = _mm512_load_si512((const __m512i *)(wg[0] + p * 64));
    __m512i w1 = _mm512_load_si512((const __m512i *)(wg[1] + p * 64));
    __m512i w2 = _mm512_load_si512((const __m512i *)(wg[2] + p * 64));
    __m512i w3 = _mm512_load_si512((const __m512i *)(wg[3] + p * 64));
    W8X_ROW(0, a00, a01, a02, a03);
    W8X_ROW(1, a10, a11, a12, a13);
    W8X_ROW(2, a20, a21, a22, a23);
    W8X_ROW(3, a30, a31, a32, a33);
    W8X_ROW(4, a40, a41, a42, a43);
    W8X_ROW(5, a50, a51, a52, a53);
  }
  W8X_PUT(0, a00, a01, a02, a03);
  W8X_PUT(1, a10, a11, a12, a13);
  W8X_PUT(2, a20, a21, a22, a23);
  W8X_PUT(3, a30, a31, a32, a33);
  W8X_PUT(4, a40, a41, a42, a43);
  W8X_PUT(5, a50, a51, a52, a53);
}
#undef W8X_ROW
#undef W8X_PUT

/* z[c] = (float)(s[c] - 128 xs) * (sx * sw[c]) (+ b[c]) for c < 16: w8_deq's steps; b is
 * read for c < nb only (the columns that exist). */
static WQ_VNNI512 void w8x_deq16(float *z, const int32_t *s, int32_t xs, float sx, const float *sw,
                                 const float *b, int64_t nb) {
  __m512i dot =
      _mm512_sub_epi32(_mm512_loadu_si512(s), _mm512_set1_epi32((int32_t)(128u * (uint32_t)xs)));
  __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(dot),
                           _mm512_mul_ps(_mm512_set1_ps(sx), _mm512_loadu_ps(sw)));
  if (b) {
    __mmask16 m = nb >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nb) - 1u);
    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b));
  }
  _mm512_storeu_ps(z, v);
}
#endif

/* ---- dispatch --------------------------------------------------------------------------- */

/* Weight-only [isa][i8, i4]; W8A8 [isa]. Only the fields each table is read for are set. */
static const wq_kernels k_wq_c = {2,        2,        4,          wq_c_2x2, wq_c_1x4,
                                  w8_c_2x2, w8_c_1x4, w8_quant_c, false,    false};
#if WQ_X86
static const wq_kernels k_wq_simd[2][2] = {
    {{2, 2, 4, wq_avx2_i8_2x2, wq_avx2_i8_1x4, NULL, NULL, NULL, false, false},
     {2, 2, 4, wq_avx2_i4_2x2, wq_avx2_i4_1x4, NULL, NULL, NULL, false, false}},
    {{4, 4, 8, wq_avx512_i8_4x4, wq_avx512_i8_1x8, NULL, NULL, NULL, false, false},
     {4, 4, 8, wq_avx512_i4_4x4, wq_avx512_i4_1x8, NULL, NULL, NULL, false, false}},
};
/* Level 1 without AVX-VNNI */
static const wq_kernels k_w8_avx2 = {
    2, 4, 4, NULL, NULL, w8_avx2_2x4, w8_avx2_1x4, w8_quant_avx2, false, false};
static const wq_kernels k_w8_simd[3] = {
    {2, 4, 4, NULL, NULL, w8_vnni256_2x4, w8_vnni256_1x4, w8_quant_avx2, false, false},
    {4, 4, 8, NULL, NULL, w8_vnni512_4x4, w8_vnni512_1x8, w8_quant_avx512, false, true},
    {4, 4, 8, NULL, NULL, w8_vnni512_4x4, w8_vnni512_1x8, w8_quant_avx512, true, false},
};

static bool wq_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

#endif

/* Best levels the CPU offers, found once (cpuid is slow under a hypervisor): bits 0-1
 * weight-only (0, 1 AVX2, 2 AVX-512), bits 2-3 W8A8 (0, 1 AVX2 -- AVX-VNNI where the CPU
 * has it, bit 4 --, 2 AVX512-VNNI, 3 that and AMX-INT8). */
static int wq_cpu_levels(void) {
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return v;
  int wo = 0, w8 = 0;
#if WQ_X86
  bool base = __builtin_cpu_supports("fma") && wq_has_f16c() && __builtin_cpu_supports("avx2");
  bool avx512 = base && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  wo = avx512 ? 2 : base ? 1 : 0;
  w8 = avx512 && __builtin_cpu_supports("avx512vnni") ? (kn_cpu_has_amx() ? 3 : 2) : base ? 1 : 0;
  bool vnni256 = base && __builtin_cpu_supports("avxvnni");
#else
  bool vnni256 = false;
#endif
  v = wo | w8 << 2 | vnni256 << 4;
  atomic_store_explicit(&cached, v, memory_order_relaxed);
  return v;
}

static _Atomic int g_wq_max_isa = 3;

int kn_matmul_wq_set_max_isa(int isa) {
  return atomic_exchange(&g_wq_max_isa, isa < 0 ? 0 : isa > 3 ? 3 : isa);
}

static int wq_level(bool w8a8) {
  int lv = wq_cpu_levels(), cap = atomic_load_explicit(&g_wq_max_isa, memory_order_relaxed);
  lv = w8a8 ? lv >> 2 & 3 : lv & 3;
  return lv < cap ? lv : cap;
}

const char *kn_matmul_w8a8_path(void) {
  static const char *const names[4] = {"portable", "avx-vnni", "avx512-vnni", "amx-int8"};
  int lv = wq_level(true);
  return lv == 1 && !(wq_cpu_levels() >> 4 & 1) ? "avx2" : names[lv];
}

static const wq_kernels *wq_pick(const kn_wq *w, int64_t k, bool w8a8) {
  int lv = wq_level(w8a8);
#if WQ_X86
  if (w8a8 && lv == 1 && !(wq_cpu_levels() >> 4 & 1)) return &k_w8_avx2;
  if (w8a8 && lv > 0) return &k_w8_simd[lv - 1];
  if (!w8a8 && lv > 0 && k % WQ_LANES == 0 && w->group % WQ_LANES == 0 && w->qt != IR_F8_E4M3)
    return &k_wq_simd[lv - 1][w->qt == IR_I4];
#else
  (void)w, (void)k, (void)lv;
#endif
  return &k_wq_c;
}

/* ---- tiling and threads ------------------------------------------------------------------ */

/* Output columns a kernel call of nr W rows covers: nr, or nr / 2 gate rows with their
 * nr / 2 up rows. */
static int wq_cols(const wq_args *a, int nr) { return a->swiglu ? nr / 2 : nr; }

/* The W rows of columns [j0, j0 + cols) clipped at j1: missing ones repeat j0 (their
 * outputs are dropped); with swiglu the up rows follow the gate rows. */
static int64_t wq_rows(const wq_args *a, int nr, int64_t j0, int64_t j1, int64_t *rows) {
  int cols = wq_cols(a, nr);
  int64_t nv = j1 - j0 < cols ? j1 - j0 : cols;
  for (int c = 0; c < nr; c++) {
    int64_t j = j0 + (c % cols < nv ? c % cols : 0);
    rows[c] = c >= cols ? j + a->n : j;
  }
  return nv;
}

/* y[i0 + r, j0 + c] from the dot products z of one call (bias and epilogue); with gates
 * (swiglu), the gate and up values (bias added) are gathered there instead (kn_mm_gates:
 * a kernel call's two or four columns at a time had spent a fifth of a W8A8 prefill in
 * the gate's set-up). */
static void wq_store(const wq_args *a, const float *z, int mr, int nr, int64_t nv, int64_t i0,
                     int64_t j0, kn_mm_gates *gates) {
  const float *b = a->bias;
  if (gates) {
    kn_mm_gates_put(gates, z, mr, nr, wq_cols(a, nr), nv, j0, b ? b + j0 : NULL,
                    b ? b + a->n + j0 : NULL);
    return;
  }
  kn_mm_store(a->y + i0 * a->n + j0, a->n, z, mr, nr, wq_cols(a, nr), nv, b ? b + j0 : NULL,
              b ? b + a->n + j0 : NULL, a->swiglu);
}

/* The gathered columns of rows [i0, i0 + mr) gated into y. */
static void wq_gate(const wq_args *a, const kn_mm_gates *gates, int mr, int64_t i0, int64_t je) {
  _Static_assert((int)WQ_MAX_R <= (int)KN_MM_GATE_ROWS, "a kernel call's rows fit kn_mm_gates");
  kn_mm_gates_apply(gates, a->y + i0 * a->n + gates->j0, a->n, mr, je);
}

/* Columns a tile's row group sweeps before gating: the whole tile, or (swiglu) a gather. */
static int64_t wq_span(const wq_args *a, int64_t j0, int64_t j1) {
  return a->swiglu ? KN_MM_GATE_COLS : j1 - j0;
}

/* Rows [i0, i0 + mr) of x against the W rows of columns [j0, j1). */
static void wq_block(const wq_args *a, wq_fn fn, int mr, int nr, int64_t i0, int64_t j0, int64_t j1,
                     kn_mm_gates *gates) {
  const float *xr[WQ_MAX_R] = {0};
  int64_t rows[WQ_MAX_C];
  float acc[WQ_MAX_R * WQ_MAX_C];
  int64_t nv = wq_rows(a, nr, j0, j1, rows);
  for (int r = 0; r < mr; r++) xr[r] = a->x + (i0 + r) * a->k;
  fn(a, xr, rows, acc);
  wq_store(a, acc, mr, nr, nv, i0, j0, gates);
}

/* A W8A8 dot product scaled back (every path: the bits do not depend on the path). */
static inline float w8_deq(int32_t dot, float sx, float sw) { return (float)dot * (sx * sw); }

/* The same for W8A8, with rows of x already quantized (xq, per-row scale sx and sum xs). */
static void w8_block(const wq_args *a, w8_fn fn, int mr, int nr, int64_t i0, int64_t j0, int64_t j1,
                     const int8_t *const *xq, const float *sx, const int32_t *xs,
                     kn_mm_gates *gates) {
  const int8_t *wr[WQ_MAX_C];
  int64_t rows[WQ_MAX_C];
  int32_t acc[WQ_MAX_R * WQ_MAX_C];
  float z[WQ_MAX_R * WQ_MAX_C];
  int64_t nv = wq_rows(a, nr, j0, j1, rows);
  for (int c = 0; c < nr; c++) wr[c] = (const int8_t *)a->w->q + rows[c] * a->k;
  fn(xq, xs, wr, a->k, acc);
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++)
      z[r * nr + c] = w8_deq(acc[r * nr + c], sx[r], wq_scale(a->w, 1, rows[c], 0));
  wq_store(a, z, mr, nr, nv, i0, j0, gates);
}

static void wq_tile(const wq_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const wq_kernels *kn = a->kern;
  kn_mm_gates gates;
  for (int64_t i = i0; i < i1;) {
    int mr = i + kn->mr <= i1 ? kn->mr : 1, nr = mr > 1 ? kn->nr : kn->nr1;
    for (int64_t jz = j0; jz < j1; jz += wq_span(a, j0, j1)) {
      int64_t je = j1 - jz < wq_span(a, j0, j1) ? j1 : jz + wq_span(a, j0, j1);
      gates.j0 = jz;
      for (int64_t j = jz; j < je; j += wq_cols(a, nr))
        wq_block(a, mr > 1 ? kn->block : kn->row, mr, nr, i, j, je, a->swiglu ? &gates : NULL);
      if (a->swiglu) wq_gate(a, &gates, mr, i, je);
    }
    i += mr;
  }
}

/* Rows are quantized here, per tile, onto the stack: recomputing them for each n tile
 * costs k per row against n_tile * k for the products, and needs no scratch. */
static void w8_tile(const wq_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const wq_kernels *kn = a->kern;
  int8_t buf[WQ_MAX_R * KN_W8A8_MAX_K];
  const int8_t *xq[WQ_MAX_R];
  float sx[WQ_MAX_R];
  int32_t xs[WQ_MAX_R];
  for (int64_t i = i0; i < i1;) {
    int mr = i + kn->mr <= i1 ? kn->mr : 1, nr = mr > 1 ? kn->nr : kn->nr1;
    for (int r = 0; r < mr; r++) {
      kn->quant(a->x + (i + r) * a->k, a->k, buf + r * a->k, &sx[r], &xs[r]);
      xq[r] = buf + r * a->k;
    }
    kn_mm_gates gates;
    for (int64_t jz = j0; jz < j1; jz += wq_span(a, j0, j1)) {
      int64_t je = j1 - jz < wq_span(a, j0, j1) ? j1 : jz + wq_span(a, j0, j1);
      gates.j0 = jz;
      for (int64_t j = jz; j < je; j += wq_cols(a, nr))
        w8_block(a, mr > 1 ? kn->block8 : kn->row8, mr, nr, i, j, je, xq, sx, xs,
                 a->swiglu ? &gates : NULL);
      if (a->swiglu) wq_gate(a, &gates, mr, i, je);
    }
    i += mr;
  }
}

/* ---- x86: AMX-INT8 for the 16-row blocks of a W8A8 tile --------------------------------- */
#if WQ_X86
/* Tiles, all 16 rows x 64 bytes: 0-3 C (int32; tile 2 x + b for x block x, W block b);
 * 4-5 two blocks of 16 W rows as they lie in memory (64 bytes of k a row); 6-7 two blocks
 * of 16 x rows packed for TDPBSSD: row t of a step is dword t of each of the 16 rows, so
 * C[w][r] sums W[w][l] * xq[r][l]. W as the left operand needs no repacking; x is packed
 * once per pass as it is quantized. */
enum {
  WQ_AMX_X_BYTES = 128 << 10, /* packed x of one pass (stack): AMX takes k <= 8192 */
  WQ_AMX_MAX_ROWS = 64,       /* rows per pass: kn_mm_tiles_plan's largest mb */
  WQ_AMX_STEP = 1024,         /* one 16 x 64-byte tile */
};

#define WQ_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw")))
#define WQ_AMX_INLINE                                                                              \
  static inline __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw"), always_inline))
/* GCC's tile loads and ldtilecfg do not tell the compiler which memory they read: make
 * the buffers' stores happen before them. */
#define WQ_AMX_BARRIER() __asm__ volatile("" ::: "memory")

/* C += W blocks w0 (w1) at stride ws x x blocks x0 (x0 + xstep) over nkb 64-byte steps. */
WQ_AMX_INLINE void w8_amx_steps(const int8_t *w0, const int8_t *w1, int64_t ws, const int8_t *x0,
                                int64_t xstep, int64_t nkb, int nw, int nx) {
  for (int64_t kb = 0; kb < nkb; kb++) {
    _tile_loadd(4, w0 + kb * 64, ws);
    if (nw > 1) _tile_loadd(5, w1 + kb * 64, ws);
    _tile_loadd(6, x0 + kb * WQ_AMX_STEP, 64);
    _tile_dpbssd(0, 4, 6);
    if (nw > 1) _tile_dpbssd(1, 5, 6);
    if (nx > 1) {
      _tile_loadd(7, x0 + xstep + kb * WQ_AMX_STEP, 64);
      _tile_dpbssd(2, 4, 7);
      if (nw > 1) _tile_dpbssd(3, 5, 7);
    }
  }
}

/* nw W blocks x nx x blocks into c (tile t at c + t * 256, 16 int32 a row). The k % 64
 * tail of W comes from tail (zero-padded), so no load reads past a W row; x's padding is
 * zero too. */
WQ_AMX_INLINE void w8_amx_kernel(const int8_t *const *wb, const int8_t *tail, int64_t k,
                                 const int8_t *xb, int64_t nkb, int32_t *c, int nw, int nx) {
  const int64_t kf = k / 64, xstep = nkb * WQ_AMX_STEP;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  w8_amx_steps(wb[0], wb[1], k, xb, xstep, kf, nw, nx);
  if (kf < nkb) w8_amx_steps(tail, tail + WQ_AMX_STEP, 64, xb + kf * WQ_AMX_STEP, xstep, 1, nw, nx);
  _tile_stored(0, c, 64);
  if (nw > 1) _tile_stored(1, c + 256, 64);
  if (nx > 1) _tile_stored(2, c + 512, 64);
  if (nx > 1 && nw > 1) _tile_stored(3, c + 768, 64);
}

/* z[t] = w8_deq(c[16 t], sx, sw[t]) for t < v: a column of a C tile (one x row against
 * the W rows) into a row of z, the same two roundings as w8_deq. */
WQ_AMX_INLINE void w8_amx_deq16(float *z, const int32_t *c, int64_t v, float sx, const float *sw) {
  const __m512i idx =
      _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
  __mmask16 mk = v >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << v) - 1);
  __m512i dot = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mk, idx, c, 4);
  __m512 d = _mm512_cvtepi32_ps(dot);
  __m512 s = _mm512_mul_ps(_mm512_set1_ps(sx), _mm512_maskz_loadu_ps(mk, sw));
  _mm512_mask_storeu_ps(z, mk, _mm512_mul_ps(d, s));
}

/* The columns [j0, j1) one panel covers (32, or 16 gate with their 16 up rows) against
 * mr packed rows of x from row i0. A W block is 16 consecutive rows inside W: at the end
 * of W it starts earlier and its outputs are read from row off on. */
static WQ_AMX void w8_amx_panel(const wq_args *a, const int8_t *xv, int64_t nkb, int64_t mr,
                                const float *sx, int64_t i0, int64_t j0, int64_t j1) {
  const int64_t k = a->k, nrow = a->swiglu ? 2 * a->n : a->n;
  const int cols = wq_cols(a, 32);
  const int64_t nv = j1 - j0 < cols ? j1 - j0 : cols;
  const int64_t r0[2] = {j0, a->swiglu ? a->n + j0 : j0 + 16};
  const int64_t vb[2] = {a->swiglu || nv < 16 ? nv : 16, a->swiglu ? nv : nv - 16};
  const int nw = vb[1] > 0 ? 2 : 1;
  const int8_t *wb[2];
  int64_t off[2] = {0, 0};
  float sw[32];
  _Alignas(64) int8_t tail[2 * WQ_AMX_STEP];
  _Alignas(64) int32_t c[4 * 256];
  float z[16 * 32];
  for (int b = 0; b < nw; b++) {
    int64_t s = r0[b] + 16 <= nrow ? r0[b] : nrow - 16;
    off[b] = r0[b] - s;
    wb[b] = (const int8_t *)a->w->q + s * k;
    for (int64_t t = 0; t < vb[b]; t++) sw[b * 16 + t] = wq_scale(a->w, 1, r0[b] + t, 0);
  }
  if (nw == 1) wb[1] = wb[0];
  if (k % 64) {
    memset(tail, 0, sizeof tail);
    for (int b = 0; b < nw; b++)
      for (int t = 0; t < 16; t++)
        memcpy(tail + b * WQ_AMX_STEP + t * 64, wb[b] + t * k + k / 64 * 64, (size_t)(k % 64));
  }
  WQ_AMX_BARRIER();
  for (int64_t x = 0; x < mr; x += 32) {
    const int8_t *xb = xv + x / 16 * nkb * WQ_AMX_STEP;
    int nx = mr - x >= 32 ? 2 : 1;
    if (nw == 2 && nx == 2) w8_amx_kernel(wb, tail, k, xb, nkb, c, 2, 2);
    else if (nw == 2) w8_amx_kernel(wb, tail, k, xb, nkb, c, 2, 1);
    else if (nx == 2) w8_amx_kernel(wb, tail, k, xb, nkb, c, 1, 2);
    else w8_amx_kernel(wb, tail, k, xb, nkb, c, 1, 1);
    for (int bx = 0; bx < nx; bx++) {
      for (int r = 0; r < 16; r++)
        for (int b = 0; b < nw; b++)
          w8_amx_deq16(z + r * 32 + b * 16, c + (bx * 2 + b) * 256 + off[b] * 16 + r, vb[b],
                       sx[x + bx * 16 + r], sw + b * 16);
      wq_store(a, z, 16, 32, nv, i0 + x + bx * 16, j0, NULL);
    }
  }
}

/* The 16 bytes of rows (a, b, c, d) at dword t of v's 128-bit lane t / 4 (v[t % 4]) go to
 * dst + t * 64: 4 rows of a 64-byte step into the packed layout. */
#define WQ_AMX_PUT4(dst, v, j)                                                                     \
  do {                                                                                             \
    __m512i v_ = (v);                                                                              \
    _mm_storeu_si128((__m128i *)((dst) + (j)*64), _mm512_castsi512_si128(v_));                     \
    _mm_storeu_si128((__m128i *)((dst) + ((j) + 4) * 64), _mm512_extracti32x4_epi32(v_, 1));       \
    _mm_storeu_si128((__m128i *)((dst) + ((j) + 8) * 64), _mm512_extracti32x4_epi32(v_, 2));       \
    _mm_storeu_si128((__m128i *)((dst) + ((j) + 12) * 64), _mm512_extracti32x4_epi32(v_, 3));      \
  } while (0)

/* Rows r..r+3 of a pass (quantized and zero-padded, kp = nkb * 64 bytes apart) into their
 * packed block: per step a 4 x 16 dword transpose in registers. */
static WQ_AMX void w8_amx_pack4(int8_t *xv, int64_t nkb, int64_t r, const int8_t *rows) {
  int8_t *dst = xv + r / 16 * nkb * WQ_AMX_STEP + r % 16 * 4;
  const int64_t kp = nkb * 64;
  for (int64_t kb = 0; kb < nkb; kb++, dst += WQ_AMX_STEP) {
    const int8_t *p = rows + kb * 64;
    __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + kp);
    __m512i c = _mm512_loadu_si512(p + 2 * kp), d = _mm512_loadu_si512(p + 3 * kp);
    __m512i ab0 = _mm512_unpacklo_epi32(a, b), ab1 = _mm512_unpackhi_epi32(a, b);
    __m512i cd0 = _mm512_unpacklo_epi32(c, d), cd1 = _mm512_unpackhi_epi32(c, d);
    WQ_AMX_PUT4(dst, _mm512_unpacklo_epi64(ab0, cd0), 0);
    WQ_AMX_PUT4(dst, _mm512_unpackhi_epi64(ab0, cd0), 1);
    WQ_AMX_PUT4(dst, _mm512_unpacklo_epi64(ab1, cd1), 2);
    WQ_AMX_PUT4(dst, _mm512_unpackhi_epi64(ab1, cd1), 3);
  }
}

/* w8_tile_amx's work, where AMX applies: rows [i0, i1) in passes of up to `per` rows. The
 * tile configuration is loaded per call, so any thread can run this, and released after. */
static WQ_AMX int64_t w8_amx_rows(const wq_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                                  int64_t per, int64_t nkb) {
  const int64_t k = a->k;
  _Alignas(64) int8_t xv[WQ_AMX_X_BYTES];
  _Alignas(64) int8_t rows[4 * (WQ_AMX_X_BYTES / 16)]; /* 4 rows of kp <= 8192 bytes */
  float sx[WQ_AMX_MAX_ROWS];
  kn_amx_cfg cfg = {.palette = 1};
  for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  WQ_AMX_BARRIER();
  _tile_loadconfig(&cfg);
  int64_t i = i0;
  while (i1 - i >= 16) {
    int64_t mr = (i1 - i) / 16 * 16 < per ? (i1 - i) / 16 * 16 : per;
    for (int64_t r = 0; r < mr; r += 4) {
      for (int q = 0; q < 4; q++) {
        int8_t *row = rows + q * nkb * 64;
        int32_t xs;
        a->kern->quant(a->x + (i + r + q) * k, k, row, &sx[r + q], &xs);
        memset(row + k, 0, (size_t)(nkb * 64 - k));
      }
      w8_amx_pack4(xv, nkb, r, rows);
    }
    for (int64_t j = j0; j < j1; j += wq_cols(a, 32)) w8_amx_panel(a, xv, nkb, mr, sx, i, j, j1);
    i += mr;
  }
  _tile_release();
  return i;
}

/* The same over x packed once a call (a->amx_xv): every whole 16-row block of the tile. */
static WQ_AMX int64_t w8_amx_rows_pre(const wq_args *a, int64_t i0, int64_t i1, int64_t j0,
                                      int64_t j1, int64_t nkb) {
  kn_amx_cfg cfg = {.palette = 1};
  for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  WQ_AMX_BARRIER();
  _tile_loadconfig(&cfg);
  const int64_t mr = (i1 - i0) / 16 * 16; /* (i0 a multiple of 16: tiles of 64 rows) */
  const int8_t *xv = a->amx_xv + i0 / 16 * nkb * WQ_AMX_STEP;
  for (int64_t j = j0; j < j1; j += wq_cols(a, 32))
    w8_amx_panel(a, xv, nkb, mr, a->amx_sx + i0, i0, j, j1);
  _tile_release();
  return i0 + mr;
}

/* Whole 16-row blocks [begin, end) of x quantized and packed (w8_amx_rows' steps) into
 * a->amx_xv and a->amx_sx. */
static WQ_AMX void w8_amx_prep(const wq_args *a, int64_t begin, int64_t end) {
  const int64_t k = a->k, nkb = (k + 63) / 64;
  _Alignas(64) int8_t rows[4 * (WQ_AMX_X_BYTES / 16)]; /* 4 rows of kp <= 8192 bytes */
  for (int64_t b = begin; b < end; b++) {
    int8_t *xv = a->amx_xv + b * nkb * WQ_AMX_STEP;
    for (int64_t r = 0; r < 16; r += 4) {
      for (int q = 0; q < 4; q++) {
        int8_t *row = rows + q * nkb * 64;
        int32_t xs;
        a->kern->quant(a->x + (b * 16 + r + q) * k, k, row, &a->amx_sx[b * 16 + r + q], &xs);
        memset(row + k, 0, (size_t)(nkb * 64 - k));
      }
      w8_amx_pack4(xv, nkb, r, rows);
    }
  }
}

static void w8_amx_prep_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  w8_amx_prep(arg, begin, end);
}

/* Rows [i0, i1) of a tile in blocks of 16 on AMX; returns the first row left to w8_tile
 * (i0 where AMX does not apply: no AMX, under 16 rows, k over 8192, W under 16 rows). The
 * checks stay out of the AVX-512/AMX function: an instrumented build (ASan) poisons its
 * stack arrays with AVX-512 stores on entry, which a CPU without AVX-512 cannot run. */
static int64_t w8_tile_amx(const wq_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t k = a->k, nkb = (k + 63) / 64;
  if (k <= 0) return i0;
  int64_t per = WQ_AMX_X_BYTES / (nkb * 64) / 16 * 16;
  if (per > WQ_AMX_MAX_ROWS) per = WQ_AMX_MAX_ROWS;
  if (!a->kern->amx || i1 - i0 < 16 || per < 16 || (a->swiglu ? 2 : 1) * a->n < 16) return i0;
  if (a->amx_xv) return w8_amx_rows_pre(a, i0, i1, j0, j1, nkb);
  return w8_amx_rows(a, i0, i1, j0, j1, per, nkb);
}
#endif

#if WQ_X86
/* The scratch of one thread: the tile's packed W groups (gate, then up) and their scales. */
static int64_t w8x_layout(int64_t k, int64_t cols, bool swiglu, int64_t *w_bytes,
                          int64_t *s_bytes) {
  int64_t kq = (k + 3) / 4, ng = (cols + W8X_COLS - 1) / W8X_COLS * (swiglu ? 2 : 1);
  *w_bytes = ng * kq * 64;
  *s_bytes = (ng * W8X_COLS * (int64_t)sizeof(float) + 63) / 64 * 64;
  return *w_bytes + *s_bytes;
}

/* x rows [begin, end) quantized (zero-padded to x16_xstride) for w8x_tile. */
static void w8x_quant_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const wq_args *a = arg;
  for (int64_t i = begin; i < end; i++) {
    int8_t *q = a->x16_xq + i * a->x16_xstride;
    a->kern->quant(a->x + i * a->k, a->k, q, &a->x16_sx[i], &a->x16_xs[i]);
    memset(q + a->k, 0, (size_t)(a->x16_xstride - a->k));
  }
}

/* Rows [i0, i1) against columns [j0, j1) of W8A8 on the interleaved tile (see w8x_pack). */
static void w8x_tile(const wq_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int tid) {
  const int64_t k = a->k, kq = (k + 3) / 4, cols = j1 - j0, gb = kq * 64;
  const int64_t ngc = (cols + W8X_COLS - 1) / W8X_COLS; /* gate (or plain) groups */
  int64_t wb, sb;
  w8x_layout(k, cols, a->swiglu, &wb, &sb);
  uint8_t *buf = a->x16_buf + (int64_t)tid * a->x16_bytes;
  float *sw = (float *)(buf + wb);
  for (int h = 0; h < (a->swiglu ? 2 : 1); h++)
    for (int64_t g = 0; g < ngc; g++) {
      int64_t j = j0 + g * W8X_COLS, nv = j1 - j < W8X_COLS ? j1 - j : W8X_COLS;
      const int8_t *w = (const int8_t *)a->w->q + (j + h * a->n) * k;
      w8x_pack(w, k, (int)nv, kq, buf + (h * ngc + g) * gb);
      for (int64_t c = 0; c < W8X_COLS; c++)
        sw[(h * ngc + g) * W8X_COLS + c] = c < nv ? wq_scale(a->w, 1, j + h * a->n + c, 0) : 0.0f;
    }
  const float *b = a->bias;
  const int ng = a->swiglu ? W8X_G / 2 : W8X_G; /* output groups a call */
  for (int64_t i = i0; i < i1; i += W8X_R) {
    int mr = i1 - i < W8X_R ? (int)(i1 - i) : W8X_R;
    const int8_t *xr[W8X_R]; /* rows past mr repeat row i (their sums dropped) */
    for (int r = 0; r < W8X_R; r++) xr[r] = a->x16_xq + (i + (r < mr ? r : 0)) * a->x16_xstride;
    const float *sx = a->x16_sx + i;
    const int32_t *xs = a->x16_xs + i;
    for (int64_t g0 = 0; g0 < ngc; g0 += ng) {
      const uint8_t *wg[W8X_G];
      int64_t have = ngc - g0 < ng ? ngc - g0 : ng;
      for (int g = 0; g < ng; g++) {
        int64_t gi = g0 + (g < have ? g : have - 1); /* missing groups repeat the last */
        wg[g] = buf + gi * gb;
        if (a->swiglu) wg[ng + g] = buf + (ngc + gi) * gb;
      }
      _Alignas(64) int32_t s[W8X_R * 64];
      w8x_kernel(xr, wg, kq, s);
      int64_t j = j0 + g0 * W8X_COLS, nv = j1 - j < ng * W8X_COLS ? j1 - j : ng * W8X_COLS;
      for (int r = 0; r < mr; r++) {
        _Alignas(64) float z[64];
        float *y = a->y + (i + r) * a->n + j;
        for (int g = 0; g < (a->swiglu ? 2 * ng : ng); g++) {
          int64_t gg = g % ng < have ? g % ng : have - 1; /* (a missing group: the last) */
          int64_t gi = g < ng ? g0 + gg : ngc + g0 + gg;  /* the scale's group */
          int64_t bj = g < ng ? j + g * W8X_COLS : a->n + j + (g - ng) * W8X_COLS;
          int64_t left = nv - (g % ng) * W8X_COLS; /* columns of the group that exist */
          w8x_deq16(z + 16 * g, s + r * 64 + 16 * g, xs[r], sx[r], sw + gi * W8X_COLS,
                    b && left > 0 ? b + bj : NULL, left);
        }
        if (a->swiglu) kn_silu_mul_n(y, z, z + ng * W8X_COLS, nv);
        else memcpy(y, z, (size_t)nv * sizeof *y);
      }
    }
  }
}
#endif

static void wq_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const wq_args *a = arg;
  for (int64_t t = begin; t < end; t++) {
    int64_t i0, i1, j0, j1;
    kn_mm_tile_bounds(&a->tiles, t, &i0, &i1, &j0, &j1);
    wq_tile(a, i0, i1, j0, j1);
  }
}

static void w8_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const wq_args *a = arg;
  for (int64_t t = begin; t < end; t++) {
    int64_t i0, i1, j0, j1;
    kn_mm_tile_bounds(&a->tiles, t, &i0, &i1, &j0, &j1);
#if WQ_X86
    if (a->x16_buf) {
      w8x_tile(a, i0, i1, j0, j1, tid);
      continue;
    }
    i0 = w8_tile_amx(a, i0, i1, j0, j1);
#endif
    w8_tile(a, i0, i1, j0, j1);
  }
}

static void wq_run(kn_pool *p, float *y, const float *x, const kn_wq *w, const float *bias,
                   int64_t m, int64_t n, int64_t k, int act, bool w8a8) {
  bool swiglu = act == KN_WQ_ACT_SWIGLU;
  if (m <= 0 || n <= 0) return;
  wq_args a = {.y = y,
               .x = x,
               .w = w,
               .bias = bias,
               .m = m,
               .n = swiglu ? n / 2 : n,
               .k = k,
               .swiglu = swiglu,
               .ng = k / w->group,
               .w_row_bytes = (int64_t)ir_dtype_bytes(w->qt, (uint64_t)k),
               .kern = wq_pick(w, k, w8a8)};
  bool x16 = w8a8 && a.kern->x16 && m >= W8X_MIN_M && k > 0;
  a.tiles = kn_mm_tiles_plan_m(a.m, a.n, a.w_row_bytes * (swiglu ? 2 : 1), kn_pool_threads(p),
                               x16 ? W8X_COLS * (swiglu ? 2 : 4) : 8,
                               x16 ? W8X_M_TILE : 64); /* x16: whole kernel calls a tile */
  int64_t tasks = a.tiles.n_tasks, flops = 2 * m * n * k;
#if WQ_X86
  if (x16) { /* w8x_tile's scratch a thread and x quantized (without them, the other kernels) */
    int64_t wb, sb, nt = kn_pool_threads(p);
    a.x16_bytes = (w8x_layout(k, a.tiles.nb, swiglu, &wb, &sb) + 63) / 64 * 64;
    a.x16_xstride = ((k + 3) / 4 * 4 + 63) / 64 * 64;
    int64_t xb = m * a.x16_xstride, total = a.x16_bytes * nt + xb + m * 8;
    a.x16_block = ir_malloc((size_t)(total + 63));
    if (a.x16_block) {
      a.x16_buf = (uint8_t *)(((uintptr_t)a.x16_block + 63) & ~(uintptr_t)63);
      a.x16_xq = (int8_t *)(a.x16_buf + a.x16_bytes * nt);
      a.x16_sx = (float *)(a.x16_buf + a.x16_bytes * nt + xb);
      a.x16_xs = (int32_t *)(a.x16_sx + m);
      kn_parallel_for(p, m, 1 + (1 << 14) / k, w8x_quant_task, &a);
    }
  }
  /* AMX: x quantized and packed once, not once per column tile (each tile had redone its
   * rows: 15% of a SmolLM2 W8A8 prefill); the same values, so the same bits */
  void *amx_block = NULL;
  const int64_t nkb = (k + 63) / 64, nblk = m / 16;
  if (w8a8 && !a.x16_buf && a.kern->amx && nblk > 0 && k > 0 && nkb * 64 * 16 <= WQ_AMX_X_BYTES &&
      (swiglu ? 2 : 1) * a.n >= 16 && a.tiles.n_tiles > 1) {
    amx_block = ir_malloc((size_t)(nblk * nkb * WQ_AMX_STEP + m * 4 + 64));
    if (amx_block) {
      a.amx_xv = (int8_t *)(((uintptr_t)amx_block + 63) & ~(uintptr_t)63);
      a.amx_sx = (float *)(a.amx_xv + nblk * nkb * WQ_AMX_STEP);
      kn_parallel_for(p, nblk, 1, w8_amx_prep_task, &a);
    }
  }
#endif
  kn_parallel_for(p, tasks, flops < WQ_SERIAL_FLOPS ? tasks : 1, w8a8 ? w8_task : wq_task, &a);
  ir_free(a.x16_block);
#if WQ_X86
  ir_free(amx_block);
#endif
}

void kn_matmul_wq(kn_pool *p, float *y, const float *x, const kn_wq *w, const float *bias,
                  int64_t m, int64_t n, int64_t k, int act) {
  if (w->qt == IR_F8_E4M3) f8_lut_init();
  wq_run(p, y, x, w, bias, m, n, k, act, false);
}

void kn_matmul_w8a8(kn_pool *p, float *y, const float *x, const kn_wq *w, const float *bias,
                    int64_t m, int64_t n, int64_t k, int act) {
  wq_run(p, y, x, w, bias, m, n, k, act, true);
}
