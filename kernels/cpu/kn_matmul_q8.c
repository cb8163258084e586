/* kn_matmul_q8: block-quantized W (q8_0, q4_0, q4_1) against x quantized to int8 per
 * block of 32 values, summed in integers (llama.cpp's q8_1 scheme on the CPU). */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kn_cpu.h"
#include "kn_quant.h"
#include "ir_alloc.h"

/* The order, which every path follows (so they agree bit for bit, and a row's result
 * never depends on m, the tile or the thread count): per x row and block b,
 *   amax = max |x|, dx = amax / 127, q = rint(x * (127 / amax)) clamped to [-127, 127]
 *   (all zero when amax is 0), sx = dx * sum(q);
 * per output, 8 f32 lanes: lane l of block b is the exact integer
 *   p = sum_{j<4} wq[4l + j] * q[4l + j]   (wq: the block's int8 / nibble codes, minus 8
 *   for q4_0), added as acc[l] = fma(dw * dx, (float)p, acc[l]); for q4_1 also
 *   mterm = fma(mw, sx, mterm) in block order. Then y = fold(acc) + mterm (+ bias) with
 * the fold (l, l+4), (l, l+2), (0, 1). On AVX2 that is vpmaddubsw + vpmaddwd per block
 * (no int16 saturation: |w| <= 128, |q| <= 127), the lanes of llama.cpp's own kernels. */
/* The 8-row interleaved weights (IR_*_X8, written by the repack pass) have an order of
 * their own, the same on every path: per output and block b the exact integer
 *   p = sum_{i<32} wq[i] * q[i]
 * (one sum a block, not eight lane sums: each row's products of a block add up in its
 * own int32 lane, exact in any order), acc = fma(dw * dx, (float)p, acc) in block order,
 * for q4_1 mterm = fma(mw, sx, mterm); y = acc + mterm (+ bias). */
enum {
  Q8_LANES = 8,
  Q8_MAX_R = 4,
  Q8X8_MAX_R = 8, /* x rows one x8 kernel call takes (AVX-512: 8, the others 4) */
  Q8_MAX_C = 4,
  Q8_PREFETCH_BYTES = 8192,  /* W bytes asked for ahead into L2 (as kn_matmul) */
  Q8_SERIAL_FLOPS = 1 << 18, /* below this, waking the pool costs more than it saves */
  Q8_QUANT_GRAIN = 1 << 14,  /* x values a quantizing chunk takes at least */
  Q8_AMX_ROWS = 16,          /* an AMX kernel call: 16 x rows against 16 W rows (two x8 groups) */
  Q8_AMX_COLS = 16,
  Q8_AMX_AHEAD = 4, /* blocks a B is decoded before its product (and ring slots) */
  Q8_AMX_LAG = 3,   /* blocks a product waits before it is scaled (< Q8_AMX_AHEAD) */
  Q8_AMX_PAIRS = 8, /* group pairs one AMX call streams through */
};

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define Q8_X86 1
#include <immintrin.h>
#else
#define Q8_X86 0
#endif

/* One block of a quantized x row: the codes, dx and sx (llama.cpp's block_q8_1, with
 * f32 scales). A row is k / 32 of them. */
typedef struct q8_xblock {
  int8_t q[KN_QBLOCK];
  float d, s;
  int32_t isum; /* sum(q), for the x8 q4_0 kernels' offset */
} q8_xblock;

/* Quantized rows of x. */
typedef struct q8_rows {
  const q8_xblock *r[Q8X8_MAX_R];
} q8_rows;

/* Rows [r0, ..) of x. */
static inline q8_rows q8_rows_from(const q8_rows *x, int r0) {
  q8_rows o = {0};
  for (int r = r0; r < Q8X8_MAX_R; r++) o.r[r - r0] = x->r[r];
  return o;
}

/* The mr x nr dot products of rows x[r] with W rows wr[c] (nb blocks) into
 * out[r * nr + c]. */
typedef void (*q8_fn)(const q8_rows *x, const uint8_t *const *wr, int64_t nb, float *out);

/* Quantizes one row of x (k values) into k / 32 blocks. */
typedef void (*q8_quant_fn)(const float *x, int64_t k, q8_xblock *out);

typedef struct q8_kernels {
  int mr, nr, nr1; /* blocked kernel mr x nr; single-row kernel 1 x nr1 */
  q8_fn block, row;
  q8_quant_fn quant;
} q8_kernels;

/* Comparisons, not fmaxf/fminf: NaN is skipped by the max and clamps to -127, as in the
 * AVX2 version. */
static void q8_quantize_c(const float *x, int64_t k, q8_xblock *out) {
  for (int64_t b = 0; b < k / KN_QBLOCK; b++) {
    const float *xb = x + b * KN_QBLOCK;
    float amax = 0.0f;
    for (int i = 0; i < KN_QBLOCK; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < KN_QBLOCK; i++) {
      float v = rintf(xb[i] * id);
      v = v > -127.0f ? v : -127.0f;
      v = v < 127.0f ? v : 127.0f;
      out[b].q[i] = (int8_t)v;
      sum += (int)v;
    }
    out[b].d = amax / 127.0f;
    out[b].s = out[b].d * (float)sum;
    out[b].isum = sum;
  }
}

/* ---- portable C (the reference) ------------------------------------------------------ */

static inline float q8_fold(float *v, float mterm) {
  for (int w = Q8_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) v[l] += v[l + w];
  return v[0] + mterm;
}

static inline __attribute__((always_inline)) void q8_body_c(const q8_rows *x,
                                                            const uint8_t *const *wr, int64_t nb,
                                                            float *out, ir_dtype dt, int mr,
                                                            int nr) {
  float acc[Q8_MAX_R][Q8_MAX_C][Q8_LANES] = {{{0}}}, mterm[Q8_MAX_R][Q8_MAX_C] = {{0}};
  const int bb = kn_quant_block_bytes(dt);
  for (int64_t b = 0; b < nb; b++)
    for (int c = 0; c < nr; c++) {
      float wq[KN_QBLOCK], dw, mw; /* the block's codes (small exact integers), d and m */
      kn_quant_block(wr[c] + b * bb, dt, wq, &dw, &mw);
      for (int r = 0; r < mr; r++) {
        const q8_xblock *xb = x->r[r] + b;
        const int8_t *xq = xb->q;
        float sc = dw * xb->d;
        for (int l = 0; l < Q8_LANES; l++) {
          int p = 0;
          for (int j = 4 * l; j < 4 * l + 4; j++) p += (int)wq[j] * xq[j];
          acc[r][c][l] = fmaf(sc, (float)p, acc[r][c][l]);
        }
        if (dt == IR_Q4_1) mterm[r][c] = fmaf(mw, xb->s, mterm[r][c]);
      }
    }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) out[r * nr + c] = q8_fold(acc[r][c], mterm[r][c]);
}

#define Q8_INST_C(name, dt, mr, nr)                                                                \
  static void name(const q8_rows *x, const uint8_t *const *wr, int64_t nb, float *out) {           \
    q8_body_c(x, wr, nb, out, dt, mr, nr);                                                         \
  }
Q8_INST_C(q8_c_q8_0_2x4, IR_Q8_0, 2, 4)
Q8_INST_C(q8_c_q8_0_1x4, IR_Q8_0, 1, 4)
Q8_INST_C(q8_c_q4_0_2x4, IR_Q4_0, 2, 4)
Q8_INST_C(q8_c_q4_0_1x4, IR_Q4_0, 1, 4)
Q8_INST_C(q8_c_q4_1_2x4, IR_Q4_1, 2, 4)
Q8_INST_C(q8_c_q4_1_1x4, IR_Q4_1, 1, 4)

static const q8_kernels k_q8_c[3] = {
    {2, 4, 4, q8_c_q8_0_2x4, q8_c_q8_0_1x4, q8_quantize_c},
    {2, 4, 4, q8_c_q4_0_2x4, q8_c_q4_0_1x4, q8_quantize_c},
    {2, 4, 4, q8_c_q4_1_2x4, q8_c_q4_1_1x4, q8_quantize_c},
};

/* The x8 kernels: mr rows of x against the 8 rows of each of ng (1 or 2) consecutive
 * interleaved groups (nb blocks each) into out[r * ldo + c], c < 8 * ng. */
typedef void (*q8x8_fn)(const q8_rows *x, int mr, const uint8_t *grp, int ng, int64_t nb,
                        float *out, int64_t ldo);

/* The AMX kernel: 16 rows quantized ahead (x0, x0 + nb, ..) against np <= Q8_AMX_PAIRS
 * group pairs grp[q] (nb blocks each) into out[q] + r * ldo + c, c < 16; the tile
 * configuration loaded. */
typedef void (*q8amx_fn)(const q8_xblock *x0, const uint8_t *const *grp, float *const *out, int np,
                         int64_t nb, int64_t ldo);

static void q8x8_c(const q8_rows *x, int mr, const uint8_t *grp, int ng, int64_t nb, float *out,
                   int64_t ldo, ir_dtype dt) {
  const int bb = kn_quant_block_bytes(dt);
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < 8 * ng; c++) {
      float acc = 0.0f, mterm = 0.0f;
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = grp + (c / 8 * nb + b) * 8 * bb;
        const q8_xblock *xb = x->r[r] + b;
        const uint8_t *codes = g + kn_x8_head(dt);
        int p = 0;
        for (int i = 0; i < KN_QBLOCK; i++) {
          int w = dt == IR_Q8_0 ? (int8_t)codes[kn_x8_code_at(c % 8, i)]
                                : codes[kn_x8_code_at(c % 8, i % 16)];
          if (dt != IR_Q8_0) w = (i < 16 ? w & 15 : w >> 4) - (dt == IR_Q4_0 ? 8 : 0);
          p += w * xb->q[i];
        }
        acc = fmaf(kn_quant_f16(g + 2 * (c % 8)) * xb->d, (float)p, acc);
        if (dt == IR_Q4_1) mterm = fmaf(kn_quant_f16(g + 16 + 2 * (c % 8)), xb->s, mterm);
      }
      out[r * ldo + c] = acc + mterm;
    }
}

static void q8x8_c_q8_0(const q8_rows *x, int mr, const uint8_t *g, int ng, int64_t nb, float *o,
                        int64_t ldo) {
  q8x8_c(x, mr, g, ng, nb, o, ldo, IR_Q8_0);
}
static void q8x8_c_q4_0(const q8_rows *x, int mr, const uint8_t *g, int ng, int64_t nb, float *o,
                        int64_t ldo) {
  q8x8_c(x, mr, g, ng, nb, o, ldo, IR_Q4_0);
}
static void q8x8_c_q4_1(const q8_rows *x, int mr, const uint8_t *g, int ng, int64_t nb, float *o,
                        int64_t ldo) {
  q8x8_c(x, mr, g, ng, nb, o, ldo, IR_Q4_1);
}
static const q8x8_fn k_q8x8_c[3] = {q8x8_c_q8_0, q8x8_c_q4_0, q8x8_c_q4_1};

/* ---- x86: AVX2 ----------------------------------------------------------------------- */
#if Q8_X86
#define Q8_AVX2 __attribute__((target("avx2,fma,f16c")))
#define Q8_AVX2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

static inline uint32_t q8_ld32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

Q8_AVX2_INLINE float q8_fold_avx(__m256 v, float mterm) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(a) + mterm;
}

/* A block's codes as 32 bytes in element order (q4: low nibbles are elements 0..15, high
 * nibbles 16..31), unsigned for q4_1 and signed otherwise; its dw and mw. */
Q8_AVX2_INLINE __m256i q8_wbytes_avx2(const uint8_t *blk, ir_dtype dt, __m128 *dm) {
  uint32_t h = 0;
  memcpy(&h, blk, dt == IR_Q4_1 ? 4 : 2);
  *dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)h));
  if (dt == IR_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
  __m128i v = _mm_loadu_si128((const __m128i *)(blk + (dt == IR_Q4_1 ? 4 : 2)));
  __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
  return dt == IR_Q4_0 ? _mm256_sub_epi8(w, _mm256_set1_epi8(8)) : w;
}

/* The 8 lane sums of one block as f32 (exact). */
Q8_AVX2_INLINE __m256 q8_dot_avx2(__m256i w, __m256i xq, ir_dtype dt) {
  __m256i p16 = dt == IR_Q4_1 ? _mm256_maddubs_epi16(w, xq)
                              : _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xq, w));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* The m of a q4_1 block for nr = 2 or 4 columns, column c in lane c: lane c of mv[r] is
 * output (r, c)'s chain of fma(mw, sx, .) in block order, the reference's scalar chains
 * run side by side. dm[c] holds (d, m, 0, 0). */
Q8_AVX2_INLINE __m128 q8_mcols_avx2(const __m128 *dm, int nr) {
  __m128 t01 = _mm_unpacklo_ps(dm[0], dm[1]); /* (d0 d1 m0 m1) */
  if (nr == 2) return _mm_movehl_ps(t01, t01);
  return _mm_movehl_ps(_mm_unpacklo_ps(dm[2], dm[3]), t01);
}

Q8_AVX2_INLINE void q8_body_avx2(const q8_rows *x, const uint8_t *const *wr, int64_t nb, float *out,
                                 ir_dtype dt, int mr, int nr) {
  __m256 acc[Q8_MAX_R][Q8_MAX_C];
  __m128 mv[Q8_MAX_R][(Q8_MAX_C + 3) / 4];
  const int bb = kn_quant_block_bytes(dt);
  for (int r = 0; r < mr; r++) {
    for (int c = 0; c < nr; c++) acc[r][c] = _mm256_setzero_ps();
    for (int c = 0; c < (nr + 3) / 4; c++) mv[r][c] = _mm_setzero_ps();
  }
  for (int64_t b = 0; b < nb; b++) {
    __m256i xq[Q8_MAX_R];
    for (int r = 0; r < mr; r++) xq[r] = _mm256_loadu_si256((const __m256i *)x->r[r][b].q);
    __m128 dm[Q8_MAX_C];
    for (int c = 0; c < nr; c++) {
      const uint8_t *blk = wr[c] + b * bb;
      if (!(b & 1)) _mm_prefetch((const char *)blk + Q8_PREFETCH_BYTES, _MM_HINT_T1);
      __m256i w = q8_wbytes_avx2(blk, dt, &dm[c]);
      __m256 dw = _mm256_broadcastss_ps(dm[c]);
      for (int r = 0; r < mr; r++) {
        __m256 sc = _mm256_mul_ps(dw, _mm256_broadcast_ss(&x->r[r][b].d));
        acc[r][c] = _mm256_fmadd_ps(sc, q8_dot_avx2(w, xq[r], dt), acc[r][c]);
      }
    }
    if (dt == IR_Q4_1)
      for (int c = 0; c < (nr + 3) / 4; c++) {
        __m128 mc = q8_mcols_avx2(dm + 4 * c, nr < 4 ? nr : 4);
        for (int r = 0; r < mr; r++)
          mv[r][c] = _mm_fmadd_ps(mc, _mm_broadcast_ss(&x->r[r][b].s), mv[r][c]);
      }
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) {
      __m128 m = mv[r][c / 4];
      m = c % 4 == 0   ? m
          : c % 4 == 1 ? _mm_movehdup_ps(m)
          : c % 4 == 2 ? _mm_movehl_ps(m, m)
                       : _mm_shuffle_ps(m, m, 3);
      out[r * nr + c] = q8_fold_avx(acc[r][c], dt == IR_Q4_1 ? _mm_cvtss_f32(m) : 0.0f);
    }
}

#define Q8_INST_AVX2(name, dt, mr, nr)                                                             \
  static Q8_AVX2 void name(const q8_rows *x, const uint8_t *const *wr, int64_t nb, float *out) {   \
    q8_body_avx2(x, wr, nb, out, dt, mr, nr);                                                      \
  }
/* 4 x 2 blocks (the kernels are bound by vpmaddubsw/vpmaddwd issue, so every shape from
 * 2 x 2 to 4 x 2 ran within 10% on a SmolLM2 prefill); 1 x 4 for a row (1 x 8: no faster) */
Q8_INST_AVX2(q8_avx2_q8_0_4x2, IR_Q8_0, 4, 2)
Q8_INST_AVX2(q8_avx2_q8_0_1x4, IR_Q8_0, 1, 4)
Q8_INST_AVX2(q8_avx2_q4_0_4x2, IR_Q4_0, 4, 2)
Q8_INST_AVX2(q8_avx2_q4_0_1x4, IR_Q4_0, 1, 4)
Q8_INST_AVX2(q8_avx2_q4_1_4x2, IR_Q4_1, 4, 2)
Q8_INST_AVX2(q8_avx2_q4_1_1x4, IR_Q4_1, 1, 4)

/* q8_quantize_c's arithmetic 8 lanes at a time: max_ps(v, m) returns m when v is NaN,
 * and round_ps to nearest is rintf in the default rounding mode. */
static Q8_AVX2 void q8_quantize_avx2(const float *x, int64_t k, q8_xblock *out) {
  const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f);
  const __m256 hi = _mm256_set1_ps(127.0f);
  for (int64_t b = 0; b < k / KN_QBLOCK; b++) {
    const float *xb = x + b * KN_QBLOCK;
    __m256 v[4], m = _mm256_setzero_ps();
    for (int g = 0; g < 4; g++) {
      v[g] = _mm256_loadu_ps(xb + 8 * g);
      m = _mm256_max_ps(_mm256_andnot_ps(sign, v[g]), m);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float amax = _mm_cvtss_f32(h), id = amax > 0.0f ? 127.0f / amax : 0.0f;
    __m256 vid = _mm256_set1_ps(id);
    __m256i c[4], sum = _mm256_setzero_si256();
    for (int g = 0; g < 4; g++) {
      __m256 r =
          _mm256_round_ps(_mm256_mul_ps(v[g], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      c[g] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
      sum = _mm256_add_epi32(sum, c[g]);
    }
    /* packs interleave the 128-bit halves: (0 1 4 5 2 3 6 7) in dwords, put back in order */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out[b].q, p);
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    out[b].d = amax / 127.0f;
    out[b].isum = _mm_cvtsi128_si32(t);
    out[b].s = out[b].d * (float)out[b].isum;
  }
}

static const q8_kernels k_q8_avx2[3] = {
    {4, 2, 4, q8_avx2_q8_0_4x2, q8_avx2_q8_0_1x4, q8_quantize_avx2},
    {4, 2, 4, q8_avx2_q4_0_4x2, q8_avx2_q4_0_1x4, q8_quantize_avx2},
    {4, 2, 4, q8_avx2_q4_1_4x2, q8_avx2_q4_1_1x4, q8_quantize_avx2},
};

/* x8, one block of one x row: the 8 rows' exact sums p in row order. A 32-byte load of the
 * codes holds 4 positions of all 8 rows (ir_dtype.h), each row's in its own 32-bit lane, so
 * vpmaddubsw against x's 4 codes there, broadcast, leaves each row's products in its lane
 * and no horizontal add is needed. pl: the block's codes as the multiplies take them,
 * decoded once for all x rows. Nibble types: the low nibbles of load j (pl[j]) are
 * positions 4j .. 4j+3, the high ones (pl[4 + j]) 16 + 4j ..; the pair sums add in int16
 * (|sum| <= 16 * 15 * 127 = 30480, exact) and one vpmaddwd makes the int32 lanes. q8_0:
 * pl[j] = |w| against sign(x, w), pair sums up to 2 * 128 * 127: each load widens alone. */
Q8_AVX2_INLINE void q8x8_decode_avx2(const uint8_t *g, ir_dtype dt, __m256i *pl) {
  const uint8_t *codes = g + kn_x8_head(dt);
  const __m256i lo4 = _mm256_set1_epi8(15);
  for (int j = 0; j < (dt == IR_Q8_0 ? 8 : 4); j++) {
    __m256i w = _mm256_loadu_si256((const __m256i *)(codes + 32 * j));
    if (dt == IR_Q8_0) {
      pl[j] = _mm256_abs_epi8(w);
      continue;
    }
    pl[j] = _mm256_and_si256(w, lo4);
    pl[4 + j] = _mm256_and_si256(_mm256_srli_epi16(w, 4), lo4);
  }
}

Q8_AVX2_INLINE __m256i q8x8_sums_avx2(const uint8_t *g, const __m256i *pl, const q8_xblock *xb,
                                      ir_dtype dt) {
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t *xq = (const uint8_t *)xb->q, *codes = g + kn_x8_head(dt);
  if (dt == IR_Q8_0) {
    __m256i t = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
      __m256i w = _mm256_loadu_si256((const __m256i *)(codes + 32 * j));
      __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32((int)q8_ld32(xq + 4 * j)), w);
      t = _mm256_add_epi32(t, _mm256_madd_epi16(_mm256_maddubs_epi16(pl[j], xs), ones));
    }
    return t;
  }
  __m256i u0 = _mm256_setzero_si256(), u1 = _mm256_setzero_si256();
  for (int j = 0; j < 8; j += 2) { /* broadcasts from memory: loads, not shuffles */
    __m256i x0 = _mm256_set1_epi32((int)q8_ld32(xq + 4 * j));
    __m256i x1 = _mm256_set1_epi32((int)q8_ld32(xq + 4 * j + 4));
    u0 = _mm256_add_epi16(u0, _mm256_maddubs_epi16(pl[j], x0));
    u1 = _mm256_add_epi16(u1, _mm256_maddubs_epi16(pl[j + 1], x1));
  }
  __m256i t = _mm256_madd_epi16(_mm256_add_epi16(u0, u1), ones);
  /* q4_0's codes are nibble - 8: the 8 * sum(q) comes off in integers */
  return dt == IR_Q4_0 ? _mm256_sub_epi32(t, _mm256_set1_epi32(8 * xb->isum)) : t;
}

/* The x8 body: one group's 8 columns, the block's codes decoded once for the mr rows. */
Q8_AVX2_INLINE void q8x8_body_avx2(const q8_rows *x, const uint8_t *grp, int64_t nb, float *out,
                                   int64_t ldo, ir_dtype dt, int mr) {
  const int sb = 8 * kn_quant_block_bytes(dt);
  __m256 acc[Q8_MAX_R], mt[Q8_MAX_R];
  for (int r = 0; r < mr; r++) acc[r] = mt[r] = _mm256_setzero_ps();
  const char *pf = (const char *)grp + Q8_PREFETCH_BYTES; /* the next line asked for */
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *g = grp + b * sb;
    for (; pf < (const char *)g + sb + Q8_PREFETCH_BYTES; pf += 64) /* each line once */
      _mm_prefetch(pf, _MM_HINT_T1);
    __m256i pl[8];
    q8x8_decode_avx2(g, dt, pl);
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g));
    __m256 mw = dt == IR_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16)))
                              : _mm256_setzero_ps();
    for (int r = 0; r < mr; r++) {
      const q8_xblock *xb = x->r[r] + b;
      __m256 p = _mm256_cvtepi32_ps(q8x8_sums_avx2(g, pl, xb, dt));
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), p, acc[r]);
      if (dt == IR_Q4_1) mt[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->s), mt[r]);
    }
  }
  for (int r = 0; r < mr; r++) _mm256_storeu_ps(out + ldo * r, _mm256_add_ps(acc[r], mt[r]));
}

/* body(x, grp, nb, out, ldo, dt, mr) with mr a constant in each case. */
#define Q8X8_BY_MR(body, x, g, nb, o, ldo, dt, mr)                                                 \
  switch (mr) {                                                                                    \
  case 4: body(x, g, nb, o, ldo, dt, 4); break;                                                    \
  case 3: body(x, g, nb, o, ldo, dt, 3); break;                                                    \
  case 2: body(x, g, nb, o, ldo, dt, 2); break;                                                    \
  default: body(x, g, nb, o, ldo, dt, 1); break;                                                   \
  }

#define Q8X8_INST_AVX2(name, dt)                                                                   \
  static Q8_AVX2 void name(const q8_rows *x, int mr, const uint8_t *g, int ng, int64_t nb,         \
                           float *o, int64_t ldo) {                                                \
    for (int h = 0; h < ng; h++) /* mr <= Q8_MAX_R: q8x8_pick's rows */                            \
      Q8X8_BY_MR(q8x8_body_avx2, x, g + h * nb * 8 * kn_quant_block_bytes(dt), nb, o + 8 * h, ldo, \
                 dt, mr)                                                                           \
  }
Q8X8_INST_AVX2(q8x8_avx2_q8_0, IR_Q8_0)
Q8X8_INST_AVX2(q8x8_avx2_q4_0, IR_Q4_0)
Q8X8_INST_AVX2(q8x8_avx2_q4_1, IR_Q4_1)
static const q8x8_fn k_q8x8_avx2[3] = {q8x8_avx2_q8_0, q8x8_avx2_q4_0, q8x8_avx2_q4_1};

/* ---- x86: AVX-512 VNNI --------------------------------------------------------------- */
/* vpdpbusd sums four u8 x s8 products into an int32 lane: the lane sums p above, exact,
 * so these kernels give the AVX2 bits. Signed W codes go in offset (q8_0: w ^ 0x80 is
 * w + 128) or as they are (q4_0: the nibble, w + 8), and the offset times the lane's sum
 * of x comes off again in int32. Four W columns are worked at once:
 *   q4: one register holds the four columns' 16 nibble bytes; its low nibbles against x's
 *       first 16 codes (broadcast to each 128-bit lane) give lanes 0..3 of every column,
 *       its high nibbles against the last 16 give lanes 4..7 (two accumulators);
 *   q8_0: a register holds two columns' 32 codes against x's 32 codes in both halves.
 * Each lane keeps the reference's own fma chain over blocks; the fold adds the same pairs. */
#define Q8_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))
#define Q8_VNNI_INLINE                                                                             \
  static inline __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni"), always_inline))

Q8_VNNI_INLINE uint16_t q8_ld16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

/* The 16 bytes at offset off of four columns, column c in 128-bit lane c. */
Q8_VNNI_INLINE __m512i q8_cols16_vnni(const uint8_t *const *wr, int64_t off) {
  __m256i a = _mm256_loadu2_m128i((const __m128i *)(wr[1] + off), (const __m128i *)(wr[0] + off));
  __m256i b = _mm256_loadu2_m128i((const __m128i *)(wr[3] + off), (const __m128i *)(wr[2] + off));
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* The f16 d of four columns' blocks at offset off, as f32 (d0 d1 d2 d3). */
Q8_VNNI_INLINE __m128 q8_d4_vnni(const uint8_t *const *wr, int64_t off) {
  __m128i h = _mm_setr_epi16((short)q8_ld16(wr[0] + off), (short)q8_ld16(wr[1] + off),
                             (short)q8_ld16(wr[2] + off), (short)q8_ld16(wr[3] + off), 0, 0, 0, 0);
  return _mm_cvtph_ps(h);
}

/* Lane 0 of each 128-bit lane: the reference fold of the 8 lanes lo[l], hi[l] (lanes 0..3
 * and 4..7 of a column in one 128-bit lane of each). */
Q8_VNNI_INLINE __m512 q8_fold4_vnni(__m512 lo, __m512 hi) {
  __m512 a = _mm512_add_ps(lo, hi);
  a = _mm512_add_ps(a, _mm512_shuffle_ps(a, a, 0x4e));
  return _mm512_add_ps(a, _mm512_shuffle_ps(a, a, 0xb1));
}

Q8_VNNI_INLINE void q8_body_vnni_q4(const q8_rows *x, const uint8_t *const *wr, int64_t nb,
                                    float *out, ir_dtype dt, int mr) {
  const bool q41 = dt == IR_Q4_1;
  const int bb = kn_quant_block_bytes(dt), qoff = q41 ? 4 : 2;
  const __m512i nib = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
  const __m512i zero = _mm512_setzero_si512();
  /* column c's d into 128-bit lane c: from (d0 m0 d1 m1 ..) for q4_1, (d0 d1 ..) for q4_0 */
  const __m512i didx = q41 ? _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6)
                           : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m256i midx = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
  __m512 alo[Q8_MAX_R], ahi[Q8_MAX_R];
  __m128 mv[Q8_MAX_R];
  for (int r = 0; r < mr; r++) alo[r] = ahi[r] = _mm512_setzero_ps(), mv[r] = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const int64_t off = b * bb;
    if (!(b & 1))
      for (int c = 0; c < 4; c++)
        _mm_prefetch((const char *)wr[c] + off + Q8_PREFETCH_BYTES, _MM_HINT_T1);
    __m512i z = q8_cols16_vnni(wr, off + qoff);
    __m512i wlo = _mm512_and_si512(z, nib);
    __m512i whi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
    __m512 d;
    __m128 m = _mm_setzero_ps();
    if (q41) {
      __m128i h = _mm_setr_epi32((int)q8_ld32(wr[0] + off), (int)q8_ld32(wr[1] + off),
                                 (int)q8_ld32(wr[2] + off), (int)q8_ld32(wr[3] + off));
      __m256 dm = _mm256_cvtph_ps(h);
      d = _mm512_permutexvar_ps(didx, _mm512_castps256_ps512(dm));
      m = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(dm, midx));
    } else {
      d = _mm512_permutexvar_ps(didx, _mm512_castps128_ps512(q8_d4_vnni(wr, off)));
    }
    for (int r = 0; r < mr; r++) {
      const q8_xblock *xb = x->r[r] + b;
      __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xb->q));
      __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb->q + 16)));
      __m512i plo = _mm512_dpbusd_epi32(zero, wlo, xlo);
      __m512i phi = _mm512_dpbusd_epi32(zero, whi, xhi);
      if (!q41) { /* q4_0's codes are nibble - 8 */
        plo = _mm512_sub_epi32(plo, _mm512_dpbusd_epi32(zero, eight, xlo));
        phi = _mm512_sub_epi32(phi, _mm512_dpbusd_epi32(zero, eight, xhi));
      }
      __m512 sc = _mm512_mul_ps(d, _mm512_set1_ps(xb->d));
      alo[r] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(plo), alo[r]);
      ahi[r] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(phi), ahi[r]);
      if (q41) mv[r] = _mm_fmadd_ps(m, _mm_set1_ps(xb->s), mv[r]);
    }
  }
  for (int r = 0; r < mr; r++) {
    float v[16], mt[4];
    _mm512_storeu_ps(v, q8_fold4_vnni(alo[r], ahi[r]));
    _mm_storeu_ps(mt, mv[r]);
    for (int c = 0; c < 4; c++) out[r * 4 + c] = v[4 * c] + (q41 ? mt[c] : 0.0f);
  }
}

Q8_VNNI_INLINE void q8_body_vnni_q8_0(const q8_rows *x, const uint8_t *const *wr, int64_t nb,
                                      float *out, int mr) {
  const int bb = kn_quant_block_bytes(IR_Q8_0);
  const __m512i flip = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
  const __m512i ia = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i ib = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  __m512 acc[Q8_MAX_R][2];
  for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const int64_t off = b * bb;
    if (!(b & 1))
      for (int c = 0; c < 4; c++)
        _mm_prefetch((const char *)wr[c] + off + Q8_PREFETCH_BYTES, _MM_HINT_T1);
    __m512i w[2];
    for (int h = 0; h < 2; h++) {
      __m256i c0 = _mm256_loadu_si256((const __m256i *)(wr[2 * h] + off + 2));
      __m256i c1 = _mm256_loadu_si256((const __m256i *)(wr[2 * h + 1] + off + 2));
      w[h] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1), flip);
    }
    __m512 d4 = _mm512_castps128_ps512(q8_d4_vnni(wr, off));
    __m512 d[2] = {_mm512_permutexvar_ps(ia, d4), _mm512_permutexvar_ps(ib, d4)};
    for (int r = 0; r < mr; r++) {
      const q8_xblock *xb = x->r[r] + b;
      __m512i xq = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->q));
      __m512i corr = _mm512_dpbusd_epi32(zero, flip, xq); /* 128 times the lane's x sum */
      __m512 dx = _mm512_set1_ps(xb->d);
      for (int h = 0; h < 2; h++) {
        __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, w[h], xq), corr);
        acc[r][h] = _mm512_fmadd_ps(_mm512_mul_ps(d[h], dx), _mm512_cvtepi32_ps(p), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < mr; r++)
    for (int h = 0; h < 2; h++) {
      /* lanes 0..7 are column 2h, 8..15 column 2h + 1: (l, l + 4) within each half */
      __m512 a = acc[r][h];
      __m512 t = _mm512_shuffle_f32x4(a, a, 0xb1);
      float v[16];
      _mm512_storeu_ps(v, q8_fold4_vnni(a, t));
      out[r * 4 + 2 * h] = v[0] + 0.0f;
      out[r * 4 + 2 * h + 1] = v[8] + 0.0f;
    }
}

#define Q8_INST_VNNI_Q4(name, dt, mr)                                                              \
  static Q8_VNNI void name(const q8_rows *x, const uint8_t *const *wr, int64_t nb, float *out) {   \
    q8_body_vnni_q4(x, wr, nb, out, dt, mr);                                                       \
  }
#define Q8_INST_VNNI_Q8(name, mr)                                                                  \
  static Q8_VNNI void name(const q8_rows *x, const uint8_t *const *wr, int64_t nb, float *out) {   \
    q8_body_vnni_q8_0(x, wr, nb, out, mr);                                                         \
  }
Q8_INST_VNNI_Q8(q8_vnni_q8_0_4x4, 4)
Q8_INST_VNNI_Q8(q8_vnni_q8_0_1x4, 1)
Q8_INST_VNNI_Q4(q8_vnni_q4_0_4x4, IR_Q4_0, 4)
Q8_INST_VNNI_Q4(q8_vnni_q4_0_1x4, IR_Q4_0, 1)
Q8_INST_VNNI_Q4(q8_vnni_q4_1_4x4, IR_Q4_1, 4)
Q8_INST_VNNI_Q4(q8_vnni_q4_1_1x4, IR_Q4_1, 1)

static const q8_kernels k_q8_vnni[3] = {
    {4, 4, 4, q8_vnni_q8_0_4x4, q8_vnni_q8_0_1x4, q8_quantize_avx2},
    {4, 4, 4, q8_vnni_q4_0_4x4, q8_vnni_q4_0_1x4, q8_quantize_avx2},
    {4, 4, 4, q8_vnni_q4_1_4x4, q8_vnni_q4_1_1x4, q8_quantize_avx2},
};

/* x8 with vpdpbusd, two groups (16 W rows) a register: load j of each group's codes side
 * by side, decoded once a block for the mr rows (q8_0: w ^ 0x80 = w + 128, less 128 *
 * sum(q) after); vpdpbusd against x's 4 codes there, broadcast, adds each row's 4 products
 * in its lane, and eight of them (two chains) make the block's exact sums p: the AVX2 and
 * C bits. A lone group takes the AVX2 body. */
Q8_VNNI_INLINE __m512i q8_ld2x256(const uint8_t *a, const uint8_t *b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                            _mm256_loadu_si256((const __m256i *)b), 1);
}

Q8_VNNI_INLINE __m512 q8_ld2xf16(const uint8_t *a, const uint8_t *b) {
  return _mm512_cvtph_ps(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                              _mm_loadu_si128((const __m128i *)b), 1));
}

Q8_VNNI_INLINE void q8x8_pair_vnni(const q8_rows *x, const uint8_t *grp, int64_t nb, float *out,
                                   int64_t ldo, ir_dtype dt, int mr) {
  const int sb = 8 * kn_quant_block_bytes(dt), head = kn_x8_head(dt);
  const int64_t gs = nb * sb; /* the second group */
  __m512 acc[Q8X8_MAX_R], mt[Q8X8_MAX_R];
  for (int r = 0; r < mr; r++) acc[r] = mt[r] = _mm512_setzero_ps();
  const char *pf = (const char *)grp + Q8_PREFETCH_BYTES;
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *g = grp + b * sb, *g2 = g + gs;
    for (; pf < (const char *)g + sb + Q8_PREFETCH_BYTES; pf += 64) {
      _mm_prefetch(pf, _MM_HINT_T1);
      _mm_prefetch(pf + gs, _MM_HINT_T1);
    }
    __m512i w[8];
    if (dt == IR_Q8_0) {
      const __m512i flip = _mm512_set1_epi8((char)0x80);
      for (int j = 0; j < 8; j++)
        w[j] = _mm512_xor_si512(q8_ld2x256(g + head + 32 * j, g2 + head + 32 * j), flip);
    } else {
      const __m512i nib = _mm512_set1_epi8(15);
      for (int j = 0; j < 4; j++) {
        __m512i z = q8_ld2x256(g + head + 32 * j, g2 + head + 32 * j);
        w[j] = _mm512_and_si512(z, nib);
        w[4 + j] = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
      }
    }
    __m512 dw = q8_ld2xf16(g, g2);
    __m512 mw = dt == IR_Q4_1 ? q8_ld2xf16(g + 16, g2 + 16) : _mm512_setzero_ps();
    for (int r = 0; r < mr; r++) {
      const q8_xblock *xb = x->r[r] + b;
      const uint8_t *xq = (const uint8_t *)xb->q; /* broadcast from memory, in vpdpbusd */
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32((int)q8_ld32(xq + 4 * j)));
        s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32((int)q8_ld32(xq + 4 * j + 4)));
      }
      __m512i p = _mm512_add_epi32(s0, s1);
      if (dt != IR_Q4_1) /* the offset: 128 (q8_0's flip) or 8 (q4_0's nibble) times sum(q) */
        p = _mm512_sub_epi32(p, _mm512_set1_epi32((dt == IR_Q8_0 ? 128 : 8) * xb->isum));
      acc[r] =
          _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), _mm512_cvtepi32_ps(p), acc[r]);
      if (dt == IR_Q4_1) mt[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb->s), mt[r]);
    }
  }
  for (int r = 0; r < mr; r++) _mm512_storeu_ps(out + ldo * r, _mm512_add_ps(acc[r], mt[r]));
}

#define Q8X8_INST_VNNI(name, dt)                                                                   \
  static Q8_VNNI void name(const q8_rows *x, int mr, const uint8_t *g, int ng, int64_t nb,         \
                           float *o, int64_t ldo) {                                                \
    if (ng == 2) {                                                                                 \
      switch (mr) {                                                                                \
      case 8: q8x8_pair_vnni(x, g, nb, o, ldo, dt, 8); break;                                      \
      case 7: q8x8_pair_vnni(x, g, nb, o, ldo, dt, 7); break;                                      \
      case 6: q8x8_pair_vnni(x, g, nb, o, ldo, dt, 6); break;                                      \
      case 5: q8x8_pair_vnni(x, g, nb, o, ldo, dt, 5); break;                                      \
      default: Q8X8_BY_MR(q8x8_pair_vnni, x, g, nb, o, ldo, dt, mr)                                \
      }                                                                                            \
    } else { /* a lone group: the AVX2 body, four rows a call */                                   \
      int m4 = mr < Q8_MAX_R ? mr : Q8_MAX_R;                                                      \
      Q8X8_BY_MR(q8x8_body_avx2, x, g, nb, o, ldo, dt, m4)                                         \
      if (mr > Q8_MAX_R) { /* the row pointers copied only here */                                 \
        q8_rows xr = q8_rows_from(x, Q8_MAX_R);                                                    \
        Q8X8_BY_MR(q8x8_body_avx2, &xr, g, nb, o + Q8_MAX_R * ldo, ldo, dt, mr - Q8_MAX_R)         \
      }                                                                                            \
    }                                                                                              \
  }
Q8X8_INST_VNNI(q8x8_vnni_q8_0, IR_Q8_0)
Q8X8_INST_VNNI(q8x8_vnni_q4_0, IR_Q4_0)
Q8X8_INST_VNNI(q8x8_vnni_q4_1, IR_Q4_1)
static const q8x8_fn k_q8x8_vnni[3] = {q8x8_vnni_q8_0, q8x8_vnni_q4_0, q8x8_vnni_q4_1};

/* ---- x86: AMX-INT8 ------------------------------------------------------------------ */
/* x8 on the tile unit: 16 x rows against two groups (16 W rows), one block a tile product.
 *   A (16 rows x 32 bytes): block b's codes of the 16 x rows, loaded straight from the
 *     rows quantized ahead (a row's blocks are contiguous, so one stride apart);
 *   B (8 rows x 64 bytes): row j holds 4 positions of each of the 16 W rows, 4 bytes a
 *     row, which is AMX's layout of B and the pair kernel's w[j] (decoded into memory);
 *   C (16 x 16 int32): the exact sums p of the 16 x 16 outputs.
 * tdpbsud (signed x, unsigned nibbles) for q4, tdpbssd for q8_0 (signed codes as they are);
 * q4_0's offset comes off as in the pair kernel. C leaves through memory and takes the pair
 * kernel's f32 steps in block order, so the bits are the C reference's. */
#define Q8_AMX_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,amx-tile,amx-int8"
#define Q8_AMX __attribute__((target(Q8_AMX_TARGET)))
#define Q8_AMX_INLINE static inline __attribute__((target(Q8_AMX_TARGET), always_inline))
/* The tile instructions as asm that says which memory it reads and writes (the compiler's
 * own intrinsics do not): tile t, base p, row stride s. */
#define Q8_TILE_LOAD(t, p, s)                                                                      \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(p), "r"((int64_t)(s)) : "memory")
#define Q8_TILE_STORE(t, p, s)                                                                     \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(p), "r"((int64_t)(s)) : "memory")
#define Q8_TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define Q8_TDPBSUD(c, a, b) __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define Q8_TDPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

/* Tiles 0 and 3 are A, 1 and 4 B, 2 and 5 C. */
Q8_AMX_INLINE void q8_amx_config(void) {
  kn_amx_cfg cfg = {.palette = 1};
  for (int s = 0; s < 2; s++) {
    cfg.rows[3 * s] = Q8_AMX_ROWS, cfg.colsb[3 * s] = KN_QBLOCK;
    cfg.rows[3 * s + 1] = KN_QBLOCK / 4, cfg.colsb[3 * s + 1] = 4 * Q8_AMX_COLS;
    cfg.rows[3 * s + 2] = Q8_AMX_ROWS, cfg.colsb[3 * s + 2] = 4 * Q8_AMX_COLS;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

/* Block b's B: the two groups' codes at g, g2 as the tile takes them, into wb. */
Q8_AMX_INLINE void q8_amx_decode(const uint8_t *g, const uint8_t *g2, ir_dtype dt, uint8_t *wb) {
  const uint8_t *c = g + kn_x8_head(dt), *c2 = g2 + kn_x8_head(dt);
  __m512i *o = (__m512i *)wb;
  if (dt == IR_Q8_0) {
    for (int j = 0; j < 8; j++) _mm512_store_si512(o + j, q8_ld2x256(c + 32 * j, c2 + 32 * j));
    return;
  }
  const __m512i nib = _mm512_set1_epi8(15);
  for (int j = 0; j < 4; j++) {
    __m512i z = q8_ld2x256(c + 32 * j, c2 + 32 * j);
    _mm512_store_si512(o + j, _mm512_and_si512(z, nib));
    _mm512_store_si512(o + 4 + j, _mm512_and_si512(_mm512_srli_epi16(z, 4), nib));
  }
}

/* One block's product: B from wb, A from the 16 rows at xa (xs bytes apart), into C of
 * tile set s; q8_amx_store stores it after the next product is issued. */
Q8_AMX_INLINE void q8_amx_product(const int8_t *xa, int64_t xs, const uint8_t *wb, ir_dtype dt,
                                  int s) {
  if (s == 0) {
    Q8_TILE_LOAD(1, wb, 64);
    Q8_TILE_LOAD(0, xa, xs);
    Q8_TILE_ZERO(2);
    if (dt == IR_Q8_0) Q8_TDPBSSD(2, 0, 1);
    else Q8_TDPBSUD(2, 0, 1);
  } else {
    Q8_TILE_LOAD(4, wb, 64);
    Q8_TILE_LOAD(3, xa, xs);
    Q8_TILE_ZERO(5);
    if (dt == IR_Q8_0) Q8_TDPBSSD(5, 3, 4);
    else Q8_TDPBSUD(5, 3, 4);
  }
}

Q8_AMX_INLINE void q8_amx_store(int32_t *c, int s) {
  if (s == 0) Q8_TILE_STORE(2, c, 64);
  else Q8_TILE_STORE(5, c, 64);
}

/* 16 rows (x0, x0 + nb, ..: rows quantized ahead) against np group pairs, grp[q] into
 * out[q] + r * ldo + c (c < 16), as one stream of np * nb block products. The tile
 * configuration must be loaded. A value crossing between the vector and the tile units
 * goes through memory, where a load takes it only once the store has retired: so B is
 * decoded Q8_AMX_AHEAD products before it is used and a product scaled Q8_AMX_LAG after,
 * from rings of Q8_AMX_AHEAD slots; the stream runs on over pair boundaries. */
Q8_AMX_INLINE void q8_amx_stream(const q8_xblock *x0, const uint8_t *const *grp, float *const *out,
                                 int np, int64_t nb, int64_t ldo, ir_dtype dt) {
  const int sb = 8 * kn_quant_block_bytes(dt);
  const int64_t gs = nb * sb, xs = nb * (int64_t)sizeof(q8_xblock), nt = np * nb;
  _Alignas(64) uint8_t wb[Q8_AMX_AHEAD][8 * 64];
  _Alignas(64) int32_t c[Q8_AMX_AHEAD][Q8_AMX_ROWS * Q8_AMX_COLS];
  if (dt == IR_Q4_1) /* the m terms first, their own fma chains in block order, into out */
    for (int q = 0; q < np; q++) {
      __m512 mt[Q8_AMX_ROWS];
#pragma GCC unroll 16
      for (int r = 0; r < Q8_AMX_ROWS; r++) mt[r] = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = grp[q] + b * sb;
        __m512 mw = q8_ld2xf16(g + 16, g + gs + 16);
#pragma GCC unroll 16
        for (int r = 0; r < Q8_AMX_ROWS; r++)
          mt[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x0[r * nb + b].s), mt[r]);
      }
#pragma GCC unroll 16
      for (int r = 0; r < Q8_AMX_ROWS; r++) _mm512_storeu_ps(out[q] + ldo * r, mt[r]);
    }
  int64_t ub = 0, tb = 0; /* the blocks of the next decode (of pair uq) and product */
  int uq = 0;
  for (int64_t t = 0; t < nt && t < Q8_AMX_AHEAD; t++) {
    const uint8_t *g = grp[uq] + ub * sb;
    q8_amx_decode(g, g + gs, dt, wb[t]);
    if (++ub == nb) ub = 0, uq++;
  }
  __m512 acc[Q8_AMX_ROWS];
  int64_t pb = -Q8_AMX_LAG; /* the block scaled next, of pair pq */
  int pq = 0;
  for (int64_t t = 0; t < nt + Q8_AMX_LAG; t++, pb++) {
    const int slot = (int)(t % Q8_AMX_AHEAD);
    if (t < nt) {
      q8_amx_product(x0[tb].q, xs, wb[slot], dt, (int)(t & 1));
      if (t > 0) q8_amx_store(c[(t - 1) % Q8_AMX_AHEAD], (int)((t - 1) & 1));
      if (++tb == nb) tb = 0;
      if (uq < np) {
        const uint8_t *g = grp[uq] + ub * sb;
        const char *pf = (const char *)g + Q8_PREFETCH_BYTES; /* as the VNNI kernels */
        for (int l = 0; l < sb; l += 64) {
          _mm_prefetch(pf + l, _MM_HINT_T1);
          _mm_prefetch(pf + l + gs, _MM_HINT_T1);
        }
        q8_amx_decode(g, g + gs, dt, wb[slot]);
        if (++ub == nb) ub = 0, uq++;
      }
    }
    if (t == nt) q8_amx_store(c[(t - 1) % Q8_AMX_AHEAD], (int)((t - 1) & 1));
    if (pb < 0) continue;
    if (pb == 0) {
#pragma GCC unroll 16
      for (int r = 0; r < Q8_AMX_ROWS; r++) acc[r] = _mm512_setzero_ps();
    }
    const int32_t *cb = c[(t - Q8_AMX_LAG) % Q8_AMX_AHEAD];
    const uint8_t *g = grp[pq] + pb * sb;
    __m512 dw = q8_ld2xf16(g, g + gs);
#pragma GCC unroll 16
    for (int r = 0; r < Q8_AMX_ROWS; r++) {
      const q8_xblock *xb = x0 + r * nb + pb;
      __m512i p = _mm512_load_si512((const __m512i *)(cb + Q8_AMX_COLS * r));
      if (dt == IR_Q4_0) p = _mm512_sub_epi32(p, _mm512_set1_epi32(8 * xb->isum));
      acc[r] =
          _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), _mm512_cvtepi32_ps(p), acc[r]);
    }
    if (pb + 1 < nb) continue;
    float *o = out[pq];
#pragma GCC unroll 16
    for (int r = 0; r < Q8_AMX_ROWS; r++) {
      __m512 m = dt == IR_Q4_1 ? _mm512_loadu_ps(o + ldo * r) : _mm512_setzero_ps();
      _mm512_storeu_ps(o + ldo * r, _mm512_add_ps(acc[r], m));
    }
    pb = -1, pq++;
  }
}

#define Q8_INST_AMX(name, dt)                                                                      \
  static Q8_AMX void name(const q8_xblock *x0, const uint8_t *const *grp, float *const *out,       \
                          int np, int64_t nb, int64_t ldo) {                                       \
    q8_amx_stream(x0, grp, out, np, nb, ldo, dt);                                                  \
  }
Q8_INST_AMX(q8_amx_q8_0, IR_Q8_0)
Q8_INST_AMX(q8_amx_q4_0, IR_Q4_0)
Q8_INST_AMX(q8_amx_q4_1, IR_Q4_1)

static const q8amx_fn k_q8amx[3] = {q8_amx_q8_0, q8_amx_q4_0, q8_amx_q4_1};

static bool q8_has_vnni(void) {
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v < 0) {
    v = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
    atomic_store_explicit(&cached, v, memory_order_relaxed);
  }
  return v;
}
#endif

/* ---- dispatch and tiling ------------------------------------------------------------- */

/* The kernel tables' index of a block type: q8_0, q4_0, q4_1. */
static int q8_kind(ir_dtype wt) { return wt == IR_Q8_0 ? 0 : wt == IR_Q4_0 ? 1 : 2; }

static const q8_kernels *q8_pick(ir_dtype wt) {
  int d = q8_kind(wt);
#if Q8_X86
  int isa = kn_cpu_isa();
  if (isa >= 2 && q8_has_vnni()) return &k_q8_vnni[d];
  if (isa >= 1) return &k_q8_avx2[d];
#endif
  return &k_q8_c[d];
}

/* The x8 kernel for this CPU; *align: the column tiles it wants (two groups at once),
 * *rows: the x rows it takes at most (a group's codes decoded once for them all). */
static q8x8_fn q8x8_pick(ir_dtype base, int *align, int *rows) {
  int d = q8_kind(base);
  *align = 8;
  *rows = Q8_MAX_R;
#if Q8_X86
  int isa = kn_cpu_isa();
  if (isa >= 2 && q8_has_vnni()) {
    *align = 16;
    *rows = Q8X8_MAX_R;
    return k_q8x8_vnni[d];
  }
  if (isa >= 1) return k_q8x8_avx2[d];
#endif
  return k_q8x8_c[d];
}

typedef struct q8_args {
  float *y;
  const float *x;
  const uint8_t *w;
  const float *bias;
  int64_t m, n, k; /* n: columns of y */
  int64_t w_row_bytes;
  bool swiglu; /* y[:, j] = silu(z[:, j]) * z[:, n + j]: W has 2n rows */
  kn_mm_tiles tiles;
  const q8_kernels *kern;
  q8x8_fn x8;   /* W interleaved by 8 rows (n a multiple of 8): its kernel, else NULL */
  q8amx_fn amx; /* x8 on AMX for the 16-row blocks of a tile (rows quantized ahead), or NULL */
  int x8_rows;  /* x rows the x8 kernel takes at once at most */
  const q8_xblock *xq; /* every row quantized once by the caller, or NULL: per tile */
} q8_args;

/* x8: rows [i0, i0 + mr) against columns [j0, j0 + 8 ng) (ng groups), straight into y
 * (then y = z + bias, as kn_mm_store); with swiglu the gate and the up groups side by side
 * into kn_mm_store's epilogue. */
static void q8x8_block(const q8_args *a, const q8_rows *xs, int mr, int64_t i0, int64_t j0,
                       int ng) {
  int64_t nb = a->k / KN_QBLOCK;
  const int nc = 8 * ng;
  const float *b = a->bias;
  float *y = a->y + i0 * a->n + j0;
  if (!a->swiglu) {
    a->x8(xs, mr, a->w + j0 * a->w_row_bytes, ng, nb, y, a->n);
    for (int r = 0; b && r < mr; r++)
      for (int c = 0; c < nc; c++) y[r * a->n + c] += b[j0 + c];
    return;
  }
  float acc[Q8X8_MAX_R * 32];
  for (int h = 0; h < 2; h++)
    a->x8(xs, mr, a->w + (j0 + h * a->n) * a->w_row_bytes, ng, nb, acc + nc * h, 2 * nc);
  kn_mm_store(y, a->n, acc, mr, 2 * nc, nc, nc, b ? b + j0 : NULL, b ? b + a->n + j0 : NULL, true);
}

#if Q8_X86
/* AMX: 16 rows from i0 (quantized ahead, at x0) against the pairs of columns [j0, j1)
 * (j1 - j0 a multiple of 16, at most 16 * Q8_AMX_PAIRS; swiglu: half that), as
 * q8x8_block: straight into y (then the bias), or the gate and up pairs side by side into
 * the epilogue. */
static void q8amx_block(const q8_args *a, const q8_xblock *x0, int64_t i0, int64_t j0, int64_t j1) {
  const int64_t nb = a->k / KN_QBLOCK, nc = j1 - j0;
  const float *b = a->bias;
  float *y = a->y + i0 * a->n + j0;
  const uint8_t *grp[Q8_AMX_PAIRS];
  float *out[Q8_AMX_PAIRS];
  int np = 0;
  if (!a->swiglu) {
    for (int64_t j = j0; j < j1; j += Q8_AMX_COLS, np++)
      grp[np] = a->w + j * a->w_row_bytes, out[np] = y + (j - j0);
    a->amx(x0, grp, out, np, nb, a->n);
    for (int r = 0; b && r < Q8_AMX_ROWS; r++)
      for (int64_t c = 0; c < nc; c++) y[r * a->n + c] += b[j0 + c];
    return;
  }
  float acc[Q8_AMX_ROWS * Q8_AMX_PAIRS * Q8_AMX_COLS]; /* gate | up, 2 nc a row */
  for (int64_t j = j0; j < j1; j += Q8_AMX_COLS)
    for (int h = 0; h < 2; h++, np++)
      grp[np] = a->w + (j + h * a->n) * a->w_row_bytes, out[np] = acc + (j - j0) + h * nc;
  a->amx(x0, grp, out, np, nb, 2 * nc);
  kn_mm_store(y, a->n, acc, Q8_AMX_ROWS, 2 * (int)nc, (int)nc, nc, b ? b + j0 : NULL,
              b ? b + a->n + j0 : NULL, true);
}

/* Rows [i0, i1) of a tile in blocks of 16 on AMX against columns [j0, j1) (whole groups; a
 * lone one at the end takes the x8 kernel, 8 rows a call); returns the first row left.
 * The tile configuration is loaded per call, so any thread can run this, and released. */
static Q8_AMX int64_t q8amx_rows(const q8_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t nb = a->k / KN_QBLOCK;
  const int64_t step = Q8_AMX_COLS * Q8_AMX_PAIRS / (a->swiglu ? 2 : 1); /* columns a call */
  q8_amx_config();
  int64_t i = i0;
  for (; i1 - i >= Q8_AMX_ROWS; i += Q8_AMX_ROWS) {
    const q8_xblock *x0 = a->xq + i * nb;
    for (int64_t j = j0; j < j1;) {
      int64_t je = j + step < j1 ? j + step : j1;
      je = j + (je - j) / Q8_AMX_COLS * Q8_AMX_COLS;
      if (je > j) {
        q8amx_block(a, x0, i, j, je);
        j = je;
        continue;
      }
      for (int h = 0; h < 2; h++) {
        q8_rows xs = {0};
        for (int r = 0; r < 8; r++) xs.r[r] = x0 + (8 * h + r) * nb;
        q8x8_block(a, &xs, 8, i + 8 * h, j, 1);
      }
      j += 8;
    }
  }
  __asm__ volatile("tilerelease" ::);
  return i;
}
#endif

/* Rows [i0, i0 + mr) of x (quantized in xs) against columns [j0, j0 + nr / h) of y,
 * clipped at j1: missing W rows repeat row j0 and their outputs are dropped. */
static void q8_block(const q8_args *a, const q8_rows *xs, q8_fn fn, int mr, int nr, int64_t i0,
                     int64_t j0, int64_t j1) {
  const uint8_t *wr[Q8_MAX_C];
  float acc[Q8_MAX_R * Q8_MAX_C];
  int nc = a->swiglu ? nr / 2 : nr;
  int64_t nv = j1 - j0 < nc ? j1 - j0 : nc;
  for (int c = 0; c < nc; c++) {
    int64_t j = j0 + (c < nv ? c : 0);
    wr[c] = a->w + j * a->w_row_bytes;
    if (a->swiglu) wr[nc + c] = a->w + (a->n + j) * a->w_row_bytes;
  }
  fn(xs, wr, a->k / KN_QBLOCK, acc);
  const float *b = a->bias;
  kn_mm_store(a->y + i0 * a->n + j0, a->n, acc, mr, nr, nc, nv, b ? b + j0 : NULL,
              b ? b + a->n + j0 : NULL, a->swiglu);
}

/* A tile: each group of x rows is quantized once (into L1), then sweeps the W columns. */
static void q8_tile(const q8_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  q8_xblock buf[Q8_MAX_R][KN_Q8_MAX_K / KN_QBLOCK];
  const q8_kernels *kn = a->kern;
  const int64_t k = a->k;
#if Q8_X86 /* the check stays out of the AMX function (ASan's AVX-512 stack poisoning) */
  if (a->amx && i1 - i0 >= Q8_AMX_ROWS) i0 = q8amx_rows(a, i0, i1, j0, j1);
#endif
  for (int64_t i = i0; i < i1;) {
    int mr = i1 - i >= kn->mr ? kn->mr : 1, nr = mr > 1 ? kn->nr : kn->nr1;
    if (a->x8) { /* more rows than 4 only from the rows quantized ahead */
      int cap = a->xq ? a->x8_rows : Q8_MAX_R;
      mr = i1 - i >= cap ? cap : (int)(i1 - i);
    }
    q8_rows xs = {0};
    for (int r = 0; r < mr; r++) {
      if (a->xq) {
        xs.r[r] = a->xq + (i + r) * (k / KN_QBLOCK);
        continue;
      }
      kn->quant(a->x + (i + r) * k, k, buf[r]);
      xs.r[r] = buf[r];
    }
    if (a->x8) { /* columns [j0, j1) are whole groups: tiles are multiples of 8 */
      for (int64_t j = j0; j < j1;) {
        int ng = j + 16 <= j1 ? 2 : 1;
        q8x8_block(a, &xs, mr, i, j, ng);
        j += 8 * ng;
      }
      i += mr;
      continue;
    }
    q8_fn fn = mr > 1 ? kn->block : kn->row;
    int cb = a->swiglu ? nr / 2 : nr;
    for (int64_t j = j0; j < j1; j += cb) q8_block(a, &xs, fn, mr, nr, i, j, j1);
    i += mr;
  }
}

/* Rows [begin, end) of x quantized into a->xq (which the tiles then only read). */
static void q8_quant_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const q8_args *a = arg;
  for (int64_t i = begin; i < end; i++)
    a->kern->quant(a->x + i * a->k, a->k, (q8_xblock *)a->xq + i * (a->k / KN_QBLOCK));
}

static void q8_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const q8_args *a = arg;
  for (int64_t t = begin; t < end; t++) {
    int64_t i0, i1, j0, j1;
    kn_mm_tile_bounds(&a->tiles, t, &i0, &i1, &j0, &j1);
    q8_tile(a, i0, i1, j0, j1);
  }
}

void kn_matmul_q8(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt,
                  const float *bias, int64_t m, int64_t n, int64_t k, bool swiglu) {
  q8x8_fn x8 = NULL;
  int align = 8, x8_rows = Q8_MAX_R;
  if (ir_dtype_is_x8(wt)) { /* (the IR checks n % 8 and act_int8) */
    if (n % 8 || k % KN_QBLOCK || k > KN_Q8_MAX_K) return;
    wt = ir_dtype_x8_base(wt);
    x8 = q8x8_pick(wt, &align, &x8_rows);
  }
  if (!ir_dtype_is_quant(wt) || k % KN_QBLOCK || k > KN_Q8_MAX_K) {
    /* not a q8 shape (the IR refuses these; kept total for direct callers) */
    if (swiglu) kn_matmul_swiglu(p, y, x, w, wt, bias, m, n, k);
    else kn_matmul(p, y, x, w, wt, bias, m, n, k);
    return;
  }
  if (m <= 0 || n <= 0) return;
  q8_args a = {.y = y,
               .x = x,
               .w = w,
               .bias = bias,
               .m = m,
               .n = n,
               .k = k,
               .w_row_bytes = (int64_t)ir_dtype_bytes(wt, (uint64_t)k),
               .swiglu = swiglu,
               .kern = q8_pick(wt),
               .x8 = x8,
               .x8_rows = x8_rows};
  /* Every row is quantized once here, not once per tile it meets: a decode matmul has 8
   * or more column tiles and the lm_head over a hundred (a batch of 16 sequences spent 8%
   * of its step quantizing the same rows again). A few rows (batch-1 decode) on the
   * stack; more on the heap, in parallel; without memory, each tile quantizes its own. */
  q8_xblock rows[Q8_MAX_R * (KN_Q8_MAX_K / KN_QBLOCK)], *heap = NULL;
  const int64_t nbk = k / KN_QBLOCK;
  if (m <= Q8_MAX_R) {
    for (int64_t i = 0; i < m; i++) a.kern->quant(x + i * k, k, rows + i * nbk);
    a.xq = rows;
  } else if ((heap = ir_malloc((size_t)(m * nbk) * sizeof *heap))) {
    a.xq = heap;
    kn_parallel_for(p, m, 1 + Q8_QUANT_GRAIN / k, q8_quant_task, &a);
  }
#if Q8_X86 /* (q8_tile sends it only tiles of 16 rows or more) */
  if (x8 && a.xq && kn_cpu_isa() >= 3) a.amx = k_q8amx[q8_kind(wt)];
#endif
  if (n % 16) align = 8; /* tiles of pairs only where every tile can hold them */
  a.tiles = kn_mm_tiles_plan(m, n, a.w_row_bytes * (swiglu ? 2 : 1), kn_pool_threads(p), align);
  int64_t tasks = a.tiles.n_tasks, flops = 2 * m * n * k * (swiglu ? 2 : 1);
  kn_parallel_for(p, tasks, flops < Q8_SERIAL_FLOPS ? tasks : 1, q8_task, &a);
  ir_free(heap);
}
