/* kn_matmul: y = x . W^T + bias, cache-blocked and threaded over (m, n) output tiles.
 * x86-64 picks AVX-512 or AVX2+FMA kernels at run time (build with KN_MATMUL_MAX_ISA=0
 * or 1 to cap that, or call kn_matmul_set_max_isa); a portable C path covers everything
 * else. W is f32, f16, bf16, or block-quantized (q8_0, q4_0, q4_1) and converted to f32
 * in registers: x stays f32. kn_matmul_bf16x multiplies bf16 W by x rounded to bf16 (once
 * a call), f32 sums, on AVX512-BF16's vdpbf16ps where the CPU has it. */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kn_bf16.h"
#include "kn_cpu.h"
#include "kn_quant.h"
#include "ir_alloc.h"

/* Batch invariance rests on one rule: every y element is a single dot product in a
 * fixed order -- 16 lanes strided over k (lane l takes k-indices = l mod 16), folded
 * as (l, l+8), (l, l+4), (l, l+2), (0, 1), then the k % 16 tail added in order, then
 * the bias.  Tiles, kernel shapes, thread counts and m only decide which outputs are
 * computed together, never how one is summed.  The AVX2 and AVX-512 kernels follow
 * the same order with FMA, so they agree bit for bit.
 *
 * Block-quantized W (k a multiple of 32, so no tail) is dequantized in registers to the
 * exact f32 values kn_dequant_row gives (w = d*q, or fma(d, q, m) for Q4_1) and then
 * summed in the f32 order above, so a quantized matmul is bit for bit the f32 matmul of
 * its dequantized W on the same path (and a plan built with --dtype f32 agrees).
 *
 * kn_matmul_bf16x has an order of its own, that of AVX512-BF16's vdpbf16ps (bf16 products, f32
 * sums, as oneDNN and llama.cpp compute bf16 weights): x is rounded to bf16 (nearest-even,
 * NaN kept quiet, subnormal to signed zero: vcvtneps2bf16's rounding), k is padded with
 * zeros to a multiple of 32, and lane l of 16 takes the pairs p = l mod 16 of k-indices
 * (2p, 2p+1): acc = fma(x[2p+1], w[2p+1], acc), then acc = fma(x[2p], w[2p], acc), each
 * with subnormal inputs and result flushed to zero; then the fold above, then the bias.
 * The CPUs without the instruction compute the same steps with f32 FMAs (under MXCSR's
 * DAZ and FTZ on x86), so every path agrees bit for bit there too (checked against the
 * instruction on a CPU that has it: test_matmul_bf16). */
enum {
  KN_MM_LANES = 16,
  KN_MM_MAX_R = 4,                /* largest kernel shape: rows of x ... */
  KN_MM_MAX_C = 8,                /* ... and rows of W computed together */
  KN_MM_TILE_ALIGN = 8,           /* n tiles are multiples of every kernel's width */
  KN_MM_W_TILE_BYTES = 256 << 10, /* a W tile stays in L2 while x rows sweep over it */
  KN_MM_M_TILE = 64,
  KN_MM_TASKS_PER_THREAD = 4,
  KN_MM_SERIAL_FLOPS = 1 << 18, /* below this, waking the pool costs more than it saves */
  KN_MM_KC = 256,               /* portable path: W values converted per stack chunk */
  KN_MM_QRUN = 16,              /* AVX-512 quantized path: blocks whose scales convert ahead */
  KN_MM_PANEL_BYTES = 32 << 10, /* a converted panel aims to stay in L1 ... */
  KN_MM_PANEL_FLOATS = 32768,   /* ... and never exceeds this stack buffer (128 KiB) */
  KN_MM_PANEL_MAX_COLS = 16,
  /* W rows are streamed once per call: ask for the bytes this far ahead into L2, so the
   * lines are on their way while the current ones are being multiplied (the hardware
   * prefetchers ramp up too slowly over the short rows of a decode GEMV) */
  KN_MM_PREFETCH_BYTES = 8192,
  KN_MM_X16_COLS = 16,            /* bf16x16: the columns of a W group (one zmm of y) */
  KN_MM_X16_GROUPS = 4,           /* ... and the groups a kernel call computes */
  KN_MM_X16_MAX_R = 6,            /* ... for up to this many x rows */
  KN_MM_X16_KB = 1024,            /* ... over this many pairs of k at a time (256 KiB of W, L2) */
  KN_MM_X16_TBLOCK = 16,          /* the tile order's block of pairs (an AMX tile's rows) */
  KN_MM_Q16_M_TILE = 512,         /* rows a W tile serves: block W converted to bf16x16, and AMX */
  KN_MM_BF16_STEP = 16,           /* bf16 path: pair words (32 k-indices) a lane step */
  KN_MM_BF16_STACK_WORDS = 16384, /* x rows of a few-row call converted on the stack */
  KN_MM_BF16_GRAIN = 1 << 14,     /* x values a converting task takes at least */
};

#ifndef KN_MATMUL_MAX_ISA
#define KN_MATMUL_MAX_ISA 3 /* 0 portable, 1 AVX2, 2 AVX-512, 3 that and AMX-INT8 */
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && KN_MATMUL_MAX_ISA > 0
#define KN_MM_X86 1
#include <immintrin.h>
#else
#define KN_MM_X86 0
#endif
/* cpuid on any x86 build, whatever the cap: kn_cpu_has_amx also serves the W8A8 kernels */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

/* Computes the mr x nr dot products of rows xr[r] with rows wr[c] into out[r * nr + c].
 * Row pointers may repeat (edge tiles); each output is still summed independently. */
typedef void (*mm_kern_fn)(const float *const *xr, const void *const *wr, int64_t k, float *out);

typedef struct mm_kernels {
  int mr, nr; /* the blocked kernel: mr rows of x against nr rows of W */
  mm_kern_fn block;
  int nr1; /* the single-row kernel (decode, and m % mr leftovers) */
  mm_kern_fn row;
} mm_kernels;

/* Converts one W row of k values to the exact f32 values the kernels of its ISA use. */
typedef void (*mm_deq_fn)(const void *w, int64_t k, float *out);

/* The panel path, for several x rows against non-f32 W: a panel of W rows is converted
 * once to f32 (in L1) and then swept by every x row of the tile with the f32 kernels of
 * the same ISA. Those sum in the order the W type's own kernels use over the same
 * values, so the path changes speed only, never bits. */
typedef struct mm_panel_kernels {
  int mr, nr; /* f32 kernel: mr rows of x against nr panel rows */
  mm_kern_fn block;
  mm_kern_fn left[KN_MM_MAX_R]; /* left[r]: r rows (0 < r < mr) against nr panel rows */
  mm_deq_fn deq[6];             /* by mm_dtype_index; [0] (f32) unused */
  /* The path is taken from this many x rows of f16/bf16 W, and of block-quantized W (whose
   * conversion costs more, so it pays sooner), as measured on each ISA. */
  int64_t min_m, min_m_q;
} mm_panel_kernels;

static inline float mm_w_scalar(const void *w, ir_dtype dt, int64_t i) {
  if (dt == IR_F32) return ((const float *)w)[i];
  uint16_t h = ((const uint16_t *)w)[i];
  return dt == IR_BF16 ? ir_bf16_to_f32(h) : ir_f16_to_f32(h);
}

/* ---- portable C ------------------------------------------------------------------- */

/* Fuse only where the target fuses natively, so the portable order is one fixed thing
 * per target rather than whatever contraction the compiler picks per loop. */
#ifdef FP_FAST_FMAF
#define MM_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define MM_MADD(a, b, c) ((a) * (b) + (c))
#endif

static inline float mm_fold16(float *v) {
  for (int w = KN_MM_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) v[l] += v[l + w];
  return v[0];
}

static inline float mm_tail_c(const float *x, const void *w, ir_dtype dt, int64_t i, int64_t k,
                              float s) {
  for (; i < k; i++) s = MM_MADD(x[i], mm_w_scalar(w, dt, i), s);
  return s;
}

/* f16/bf16/quantized rows are widened a chunk at a time into a stack buffer so the
 * multiply-add loop stays a plain f32 loop the compiler vectorises. Chunks start at
 * multiples of KN_MM_KC, so quantized ones start on a block. */
static inline const float *mm_w_chunk(const void *w, ir_dtype dt, int64_t i0, int64_t n,
                                      float *buf) {
  if (dt == IR_F32) return (const float *)w + i0;
  if (ir_dtype_is_quant(dt)) {
    kn_dequant_row((const uint8_t *)w + i0 / KN_QBLOCK * kn_quant_block_bytes(dt), dt, buf, n);
    return buf;
  }
  for (int64_t i = 0; i < n; i++) buf[i] = mm_w_scalar(w, dt, i0 + i);
  return buf;
}

static inline __attribute__((always_inline)) void mm_body_c(const float *const *xr,
                                                            const void *const *wr, int64_t k,
                                                            float *out, ir_dtype dt, int mr,
                                                            int nr) {
  float acc[KN_MM_MAX_R][KN_MM_MAX_C][KN_MM_LANES] = {{{0}}};
  float buf[KN_MM_MAX_C][KN_MM_KC];
  int64_t kf = k - k % KN_MM_LANES;
  for (int64_t k0 = 0; k0 < kf; k0 += KN_MM_KC) {
    int64_t kn = kf - k0 < KN_MM_KC ? kf - k0 : KN_MM_KC;
    const float *wp[KN_MM_MAX_C];
    for (int c = 0; c < nr; c++) wp[c] = mm_w_chunk(wr[c], dt, k0, kn, buf[c]);
    for (int64_t i = 0; i < kn; i += KN_MM_LANES)
      for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++)
          for (int l = 0; l < KN_MM_LANES; l++)
            acc[r][c][l] = MM_MADD(xr[r][k0 + i + l], wp[c][i + l], acc[r][c][l]);
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++)
      out[r * nr + c] = mm_tail_c(xr[r], wr[c], dt, kf, k, mm_fold16(acc[r][c]));
}

#define MM_INST_C(name, dt, mr, nr)                                                                \
  static void name(const float *const *xr, const void *const *wr, int64_t k, float *out) {         \
    mm_body_c(xr, wr, k, out, dt, mr, nr);                                                         \
  }
MM_INST_C(mm_c_f32_2x2, IR_F32, 2, 2)
MM_INST_C(mm_c_f32_1x4, IR_F32, 1, 4)
MM_INST_C(mm_c_f16_2x2, IR_F16, 2, 2)
MM_INST_C(mm_c_f16_1x4, IR_F16, 1, 4)
MM_INST_C(mm_c_bf16_2x2, IR_BF16, 2, 2)
MM_INST_C(mm_c_bf16_1x4, IR_BF16, 1, 4)

MM_INST_C(mm_c_q8_0_2x2, IR_Q8_0, 2, 2)
MM_INST_C(mm_c_q8_0_1x4, IR_Q8_0, 1, 4)
MM_INST_C(mm_c_q4_0_2x2, IR_Q4_0, 2, 2)
MM_INST_C(mm_c_q4_0_1x4, IR_Q4_0, 1, 4)
MM_INST_C(mm_c_q4_1_2x2, IR_Q4_1, 2, 2)
MM_INST_C(mm_c_q4_1_1x4, IR_Q4_1, 1, 4)
MM_INST_C(mm_c_f32_1x2, IR_F32, 1, 2)

#define MM_DEQ_C(name, dt)                                                                         \
  static void name(const void *w, int64_t k, float *out) { kn_dequant_row(w, dt, out, k); }
MM_DEQ_C(mm_deq_c_f16, IR_F16)
MM_DEQ_C(mm_deq_c_bf16, IR_BF16)
MM_DEQ_C(mm_deq_c_q8_0, IR_Q8_0)
MM_DEQ_C(mm_deq_c_q4_0, IR_Q4_0)
MM_DEQ_C(mm_deq_c_q4_1, IR_Q4_1)

static const mm_panel_kernels k_panel_c = {
    2,
    2,
    mm_c_f32_2x2,
    {NULL, mm_c_f32_1x2},
    {NULL, mm_deq_c_f16, mm_deq_c_bf16, mm_deq_c_q8_0, mm_deq_c_q4_0, mm_deq_c_q4_1},
    8,
    8};

/* ---- bf16 W: bf16 products, f32 sums (the order above) ------------------------------ */

/* Words (pairs of bf16) an x row of k values takes: k padded to a multiple of 32. */
static int64_t mm_bf16_words(int64_t k) {
  return (k + 2 * KN_MM_BF16_STEP - 1) / (2 * KN_MM_BF16_STEP) * KN_MM_BF16_STEP;
}

/* One x row as bf16 pairs (word p: x[2p] low, x[2p+1] high), zero past k. */
static void mm_bf16_row(const float *x, int64_t k, uint32_t *out) {
  int64_t kw = mm_bf16_words(k);
  for (int64_t p = 0; p < kw; p++) {
    uint32_t lo = 2 * p < k ? kn_bf16_round(x[2 * p]) : 0;
    uint32_t hi = 2 * p + 1 < k ? kn_bf16_round(x[2 * p + 1]) : 0;
    out[p] = lo | hi << 16;
  }
}

/* W pair p of a row of k bf16 values, zero past k. */
static inline uint32_t mm_bf16_wpair(const uint16_t *w, int64_t k, int64_t p) {
  uint32_t lo = 2 * p < k ? w[2 * p] : 0, hi = 2 * p + 1 < k ? w[2 * p + 1] : 0;
  return lo | hi << 16;
}

/* W pairs [p, p + 16) of the nr rows (the k tail), with zeros past k. */
static inline void mm_bf16_wtail(const void *const *wr, int64_t k, int64_t p, int nr,
                                 uint32_t (*t)[KN_MM_BF16_STEP], const uint16_t **tw) {
  for (int c = 0; c < nr; c++) {
    for (int l = 0; l < KN_MM_BF16_STEP; l++) t[c][l] = mm_bf16_wpair(wr[c], k, p + l);
    tw[c] = (const uint16_t *)t[c]; /* (read from pair 0: the step's wp) */
  }
}

/* One lane step, vdpbf16ps's: the odd product first, each fused and flushed. */
static inline float mm_bf16_step(uint32_t x, uint32_t w, float acc) {
  acc = kn_fma_ftz(kn_bf16_f32(x >> 16), kn_bf16_f32(w >> 16), acc);
  return kn_fma_ftz(kn_bf16_f32(x & 0xffffu), kn_bf16_f32(w & 0xffffu), acc);
}

/* xr: rows of bf16 pairs (mm_bf16_row, cast); wr: W rows of k bf16 values. */
static inline __attribute__((always_inline)) void mm_bf16_body_c(const float *const *xr,
                                                                 const void *const *wr, int64_t k,
                                                                 float *out, int mr, int nr) {
  float acc[KN_MM_MAX_R][KN_MM_MAX_C][KN_MM_LANES] = {{{0}}};
  int64_t kw = mm_bf16_words(k);
  for (int64_t p0 = 0; p0 < kw; p0 += KN_MM_BF16_STEP)
    for (int r = 0; r < mr; r++)
      for (int c = 0; c < nr; c++)
        for (int l = 0; l < KN_MM_LANES; l++)
          acc[r][c][l] = mm_bf16_step(((const uint32_t *)xr[r])[p0 + l],
                                      mm_bf16_wpair(wr[c], k, p0 + l), acc[r][c][l]);
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) out[r * nr + c] = mm_fold16(acc[r][c]);
}

#define MM_INST_BF16_C(name, mr, nr)                                                               \
  static void name(const float *const *xr, const void *const *wr, int64_t k, float *out) {         \
    mm_bf16_body_c(xr, wr, k, out, mr, nr);                                                        \
  }
MM_INST_BF16_C(mm_c_bf16x_2x2, 2, 2)
MM_INST_BF16_C(mm_c_bf16x_1x4, 1, 4)
static const mm_kernels k_bf16x_c = {2, 2, mm_c_bf16x_2x2, 4, mm_c_bf16x_1x4};

/* Indexed by mm_dtype_index. */
static const mm_kernels k_mm_c[6] = {
    {2, 2, mm_c_f32_2x2, 4, mm_c_f32_1x4},   {2, 2, mm_c_f16_2x2, 4, mm_c_f16_1x4},
    {2, 2, mm_c_bf16_2x2, 4, mm_c_bf16_1x4}, {2, 2, mm_c_q8_0_2x2, 4, mm_c_q8_0_1x4},
    {2, 2, mm_c_q4_0_2x2, 4, mm_c_q4_0_1x4}, {2, 2, mm_c_q4_1_2x2, 4, mm_c_q4_1_1x4},
};

/* ---- x86: AVX2 + FMA + F16C ------------------------------------------------------- */
#if KN_MM_X86
#define MM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define MM_AVX2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

MM_AVX2_INLINE __m256 mm_w8_avx2(const void *w, int64_t i, ir_dtype dt) {
  if (dt == IR_F32) return _mm256_loadu_ps((const float *)w + i);
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
  if (dt == IR_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Folds lanes (l, l+4), (l, l+2), (0, 1) of an 8-lane partial: the tail of the order. */
MM_AVX2_INLINE float mm_fold8_avx(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(a);
}

/* Prefetches W ahead of p (never faults: past the end it only wastes a request). */
static inline void mm_prefetch_w(const void *p) {
  _mm_prefetch((const char *)p + KN_MM_PREFETCH_BYTES, _MM_HINT_T1);
}

MM_AVX2_INLINE float mm_tail_fma(const float *x, const void *w, ir_dtype dt, int64_t i, int64_t k,
                                 float s) {
  for (; i < k; i++) s = fmaf(x[i], mm_w_scalar(w, dt, i), s);
  return s;
}

/* Pins v to a register here, so the compiler cannot fold its load into every FMA that
 * uses it: a value used by several FMAs is then loaded once, not once per use. The
 * kernels are bound by loads (two a cycle), not FMAs, when operands are reloaded. */
#define MM_KEEP(v) __asm__("" : "+x"(v))

/* Lanes 0-7 live in lo, 8-15 in hi; lo + hi is the order's first fold. Each 16 values of
 * an x row and of a W row are loaded once per call: mr + nr pairs of loads for the
 * mr x nr pairs of FMAs. */
MM_AVX2_INLINE void mm_body_avx2(const float *const *xr, const void *const *wr, int64_t k,
                                 float *out, ir_dtype dt, int mr, int nr) {
  __m256 lo[KN_MM_MAX_R][KN_MM_MAX_C], hi[KN_MM_MAX_R][KN_MM_MAX_C];
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + KN_MM_LANES <= k; i += KN_MM_LANES) {
    __m256 xl[KN_MM_MAX_R], xh[KN_MM_MAX_R];
    for (int r = 0; r < mr; r++) {
      xl[r] = _mm256_loadu_ps(xr[r] + i), xh[r] = _mm256_loadu_ps(xr[r] + i + 8);
      if (nr > 1) {
        MM_KEEP(xl[r]);
        MM_KEEP(xh[r]);
      }
    }
    for (int c = 0; c < nr; c++) {
      mm_prefetch_w((const char *)wr[c] + i * (dt == IR_F32 ? 4 : 2));
      __m256 wl = mm_w8_avx2(wr[c], i, dt), wh = mm_w8_avx2(wr[c], i + 8, dt);
      if (mr > 1) {
        MM_KEEP(wl);
        MM_KEEP(wh);
      }
      for (int r = 0; r < mr; r++) {
        lo[r][c] = _mm256_fmadd_ps(xl[r], wl, lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(xh[r], wh, hi[r][c]);
      }
    }
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++)
      out[r * nr + c] =
          mm_tail_fma(xr[r], wr[c], dt, i, k, mm_fold8_avx(_mm256_add_ps(lo[r][c], hi[r][c])));
}

#define MM_INST_AVX2(name, dt, mr, nr)                                                             \
  static MM_AVX2 void name(const float *const *xr, const void *const *wr, int64_t k, float *out) { \
    mm_body_avx2(xr, wr, k, out, dt, mr, nr);                                                      \
  }
MM_INST_AVX2(mm_avx2_f32_2x2, IR_F32, 2, 2)
MM_INST_AVX2(mm_avx2_f32_1x4, IR_F32, 1, 4)
MM_INST_AVX2(mm_avx2_f16_2x2, IR_F16, 2, 2)
MM_INST_AVX2(mm_avx2_f16_1x4, IR_F16, 1, 4)
MM_INST_AVX2(mm_avx2_bf16_2x2, IR_BF16, 2, 2)
MM_INST_AVX2(mm_avx2_bf16_1x4, IR_BF16, 1, 4)

/* The 16 nibbles of a Q4 block as bytes: values 0..15 in lo, 16..31 in hi (minus 8 for
 * Q4_0), so every block type is 32 signed bytes from here on. */
MM_AVX2_INLINE void mm_q4_bytes(const uint8_t *qs, ir_dtype dt, __m128i *lo, __m128i *hi) {
  __m128i v = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0x0f);
  *lo = _mm_and_si128(v, mask);
  *hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
  if (dt == IR_Q4_0) {
    *lo = _mm_sub_epi8(*lo, _mm_set1_epi8(8));
    *hi = _mm_sub_epi8(*hi, _mm_set1_epi8(8));
  }
}

MM_AVX2_INLINE __m256 mm_i8x8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* The d and m of a block (m = 0 unless Q4_1), converted together. */
MM_AVX2_INLINE __m128 mm_block_dm(const uint8_t *blk, ir_dtype dt) {
  uint32_t dm = 0;
  memcpy(&dm, blk, dt == IR_Q4_1 ? 4 : 2);
  return _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
}

/* w[g] = values 8g..8g+7 of the block, dequantized as kn_dequant_row does. */
MM_AVX2_INLINE void mm_qblock_avx2(const uint8_t *blk, ir_dtype dt, __m256 *w) {
  __m128i a, b;
  __m128 dm = mm_block_dm(blk, dt);
  __m256 d = _mm256_broadcastss_ps(dm), m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
  if (dt == IR_Q8_0) {
    a = _mm_loadu_si128((const __m128i *)(blk + 2));
    b = _mm_loadu_si128((const __m128i *)(blk + 18));
  } else {
    mm_q4_bytes(blk + (dt == IR_Q4_1 ? 4 : 2), dt, &a, &b);
  }
  __m256 q[4] = {mm_i8x8_ps(a), mm_i8x8_ps(_mm_srli_si128(a, 8)), mm_i8x8_ps(b),
                 mm_i8x8_ps(_mm_srli_si128(b, 8))};
  for (int g = 0; g < 4; g++)
    w[g] = dt == IR_Q4_1 ? _mm256_fmadd_ps(d, q[g], m) : _mm256_mul_ps(d, q[g]);
}

/* The f32 order with lanes 0-7 in lo and 8-15 in hi, over dequantized blocks. */
MM_AVX2_INLINE void mm_qbody_avx2(const float *const *xr, const void *const *wr, int64_t k,
                                  float *out, ir_dtype dt, int mr, int nr) {
  __m256 lo[KN_MM_MAX_R][KN_MM_MAX_C], hi[KN_MM_MAX_R][KN_MM_MAX_C];
  const int64_t bb = kn_quant_block_bytes(dt);
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / KN_QBLOCK; b++)
    for (int c = 0; c < nr; c++) {
      __m256 w[4];
      mm_prefetch_w((const uint8_t *)wr[c] + b * bb);
      mm_qblock_avx2((const uint8_t *)wr[c] + b * bb, dt, w);
      for (int r = 0; r < mr; r++) {
        const float *x = xr[r] + b * KN_QBLOCK;
        lo[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x), w[0], lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8), w[1], hi[r][c]);
        lo[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16), w[2], lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x + 24), w[3], hi[r][c]);
      }
    }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) out[r * nr + c] = mm_fold8_avx(_mm256_add_ps(lo[r][c], hi[r][c]));
}

#define MM_INST_QAVX2(name, dt, mr, nr)                                                            \
  static MM_AVX2 void name(const float *const *xr, const void *const *wr, int64_t k, float *out) { \
    mm_qbody_avx2(xr, wr, k, out, dt, mr, nr);                                                     \
  }
MM_INST_QAVX2(mm_avx2_q8_0_2x2, IR_Q8_0, 2, 2)
MM_INST_QAVX2(mm_avx2_q8_0_1x4, IR_Q8_0, 1, 4)
MM_INST_QAVX2(mm_avx2_q4_0_2x2, IR_Q4_0, 2, 2)
MM_INST_QAVX2(mm_avx2_q4_0_1x4, IR_Q4_0, 1, 4)
MM_INST_QAVX2(mm_avx2_q4_1_2x2, IR_Q4_1, 2, 2)
MM_INST_QAVX2(mm_avx2_q4_1_1x4, IR_Q4_1, 1, 4)

/* MXCSR's DAZ and FTZ, for the bf16 order's flushing on FMAs that do not flush: set
 * around a kernel's steps, the accumulators passed through an empty asm after setting and
 * before restoring so that no FMA of the steps moves out from between. */
#define MM_CSR_FLUSH 0x8040u /* (with rounding to nearest even: the 0x6000 bits cleared) */
#define MM_CSR(csr) (((csr) & ~0x6000u) | MM_CSR_FLUSH)
#define MM_PIN(v) __asm__ volatile("" : "+v"(v))

/* The bf16 order on AVX2: lanes 0-7 (pair words p0..p0+7) in lo, 8-15 in hi; a word's
 * high half is the odd value (w & 0xffff0000 its f32), the low half the even (w << 16). */
MM_AVX2_INLINE void mm_bf16_split_avx2(__m256i v, __m256 *odd, __m256 *even) {
  *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
  *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

MM_AVX2_INLINE void mm_bf16_step_avx2(const float *const *xr, const uint16_t *const *w, int64_t p,
                                      int64_t wp, __m256 (*lo)[KN_MM_MAX_C],
                                      __m256 (*hi)[KN_MM_MAX_C], int mr, int nr) {
  __m256 xo[KN_MM_MAX_R][2], xe[KN_MM_MAX_R][2];
  for (int r = 0; r < mr; r++)
    for (int h = 0; h < 2; h++)
      mm_bf16_split_avx2(_mm256_loadu_si256((const __m256i *)((const uint32_t *)xr[r] + p + 8 * h)),
                         &xo[r][h], &xe[r][h]);
  for (int c = 0; c < nr; c++) {
    mm_prefetch_w(w[c] + 2 * wp);
    __m256 wo[2], we[2];
    for (int h = 0; h < 2; h++)
      mm_bf16_split_avx2(_mm256_loadu_si256((const __m256i *)(w[c] + 2 * wp + 16 * h)), &wo[h],
                         &we[h]);
    for (int r = 0; r < mr; r++) {
      lo[r][c] = _mm256_fmadd_ps(xo[r][0], wo[0], lo[r][c]);
      hi[r][c] = _mm256_fmadd_ps(xo[r][1], wo[1], hi[r][c]);
      lo[r][c] = _mm256_fmadd_ps(xe[r][0], we[0], lo[r][c]);
      hi[r][c] = _mm256_fmadd_ps(xe[r][1], we[1], hi[r][c]);
    }
  }
}

MM_AVX2_INLINE void mm_bf16_body_avx2(const float *const *xr, const void *const *wr, int64_t k,
                                      float *out, int mr, int nr) {
  __m256 lo[KN_MM_MAX_R][KN_MM_MAX_C], hi[KN_MM_MAX_R][KN_MM_MAX_C];
  const uint16_t *w[KN_MM_MAX_C];
  const int64_t kw = mm_bf16_words(k), full = k / (2 * KN_MM_BF16_STEP) * KN_MM_BF16_STEP;
  for (int c = 0; c < nr; c++) w[c] = wr[c];
  unsigned csr = _mm_getcsr();
  _mm_setcsr(MM_CSR(csr));
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) {
      lo[r][c] = hi[r][c] = _mm256_setzero_ps();
      MM_PIN(lo[r][c]);
      MM_PIN(hi[r][c]);
    }
  int64_t p = 0;
  for (; p < full; p += KN_MM_BF16_STEP) mm_bf16_step_avx2(xr, w, p, p, lo, hi, mr, nr);
  if (p < kw) {
    _Alignas(32) uint32_t t[KN_MM_MAX_C][KN_MM_BF16_STEP];
    const uint16_t *tw[KN_MM_MAX_C];
    mm_bf16_wtail(wr, k, p, nr, t, tw);
    mm_bf16_step_avx2(xr, tw, p, 0, lo, hi, mr, nr);
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) {
      MM_PIN(lo[r][c]);
      MM_PIN(hi[r][c]);
    }
  _mm_setcsr(csr);
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) out[r * nr + c] = mm_fold8_avx(_mm256_add_ps(lo[r][c], hi[r][c]));
}

#define MM_INST_BF16_AVX2(name, mr, nr)                                                            \
  static MM_AVX2 void name(const float *const *xr, const void *const *wr, int64_t k, float *out) { \
    mm_bf16_body_avx2(xr, wr, k, out, mr, nr);                                                     \
  }
MM_INST_BF16_AVX2(mm_avx2_bf16x_2x2, 2, 2)
MM_INST_BF16_AVX2(mm_avx2_bf16x_1x4, 1, 4)
static const mm_kernels k_bf16x_avx2 = {2, 2, mm_avx2_bf16x_2x2, 4, mm_avx2_bf16x_1x4};

static const mm_kernels k_mm_avx2[6] = {
    {2, 2, mm_avx2_f32_2x2, 4, mm_avx2_f32_1x4},   {2, 2, mm_avx2_f16_2x2, 4, mm_avx2_f16_1x4},
    {2, 2, mm_avx2_bf16_2x2, 4, mm_avx2_bf16_1x4}, {2, 2, mm_avx2_q8_0_2x2, 4, mm_avx2_q8_0_1x4},
    {2, 2, mm_avx2_q4_0_2x2, 4, mm_avx2_q4_0_1x4}, {2, 2, mm_avx2_q4_1_2x2, 4, mm_avx2_q4_1_1x4},
};

MM_INST_AVX2(mm_avx2_f32_1x2, IR_F32, 1, 2)

MM_AVX2_INLINE void mm_deq_avx2(const void *w, int64_t k, float *out, ir_dtype dt) {
  if (ir_dtype_is_quant(dt)) {
    const int64_t bb = kn_quant_block_bytes(dt);
    for (int64_t b = 0; b < k / KN_QBLOCK; b++) {
      __m256 v[4];
      mm_qblock_avx2((const uint8_t *)w + b * bb, dt, v);
      for (int g = 0; g < 4; g++) _mm256_storeu_ps(out + b * KN_QBLOCK + 8 * g, v[g]);
    }
    return;
  }
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) _mm256_storeu_ps(out + i, mm_w8_avx2(w, i, dt));
  for (; i < k; i++) out[i] = mm_w_scalar(w, dt, i);
}

#define MM_DEQ_AVX2(name, dt)                                                                      \
  static MM_AVX2 void name(const void *w, int64_t k, float *out) { mm_deq_avx2(w, k, out, dt); }
MM_DEQ_AVX2(mm_deq_avx2_f16, IR_F16)
MM_DEQ_AVX2(mm_deq_avx2_bf16, IR_BF16)
MM_DEQ_AVX2(mm_deq_avx2_q8_0, IR_Q8_0)
MM_DEQ_AVX2(mm_deq_avx2_q4_0, IR_Q4_0)
MM_DEQ_AVX2(mm_deq_avx2_q4_1, IR_Q4_1)

static const mm_panel_kernels k_panel_avx2 = {
    2,
    2,
    mm_avx2_f32_2x2,
    {NULL, mm_avx2_f32_1x2},
    {NULL, mm_deq_avx2_f16, mm_deq_avx2_bf16, mm_deq_avx2_q8_0, mm_deq_avx2_q4_0, mm_deq_avx2_q4_1},
    /* SmolLM2 steps of m tokens on 2 cores: f16 W, the direct 2x2 kernel is 10-12% faster
     * at every m up to 64; Q4_1 W, the panel is 20-28% faster from m = 3 */
    INT64_MAX,
    3};
#endif

/* ---- x86: AVX-512F ---------------------------------------------------------------- */
#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 2
#define MM_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define MM_AVX512_INLINE                                                                           \
  static inline __attribute__((target("avx512f,avx2,fma,f16c"), always_inline))

MM_AVX512_INLINE __m512 mm_w16_avx512(const void *w, int64_t i, ir_dtype dt) {
  if (dt == IR_F32) return _mm512_loadu_ps((const float *)w + i);
  __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
  if (dt == IR_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

MM_AVX512_INLINE float mm_fold16_avx512(__m512 v) {
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return mm_fold8_avx(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}

/* One zmm accumulator per output holds the 16 lanes of the order directly. */
MM_AVX512_INLINE void mm_body_avx512(const float *const *xr, const void *const *wr, int64_t k,
                                     float *out, ir_dtype dt, int mr, int nr) {
  __m512 acc[KN_MM_MAX_R][KN_MM_MAX_C];
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) acc[r][c] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + KN_MM_LANES <= k; i += KN_MM_LANES)
    for (int c = 0; c < nr; c++) {
      mm_prefetch_w((const char *)wr[c] + i * (dt == IR_F32 ? 4 : 2));
      __m512 wv = mm_w16_avx512(wr[c], i, dt);
      for (int r = 0; r < mr; r++)
        acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[r] + i), wv, acc[r][c]);
    }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++)
      out[r * nr + c] = mm_tail_fma(xr[r], wr[c], dt, i, k, mm_fold16_avx512(acc[r][c]));
}

#define MM_INST_AVX512(name, dt, mr, nr)                                                           \
  static MM_AVX512 void name(const float *const *xr, const void *const *wr, int64_t k,             \
                             float *out) {                                                         \
    mm_body_avx512(xr, wr, k, out, dt, mr, nr);                                                    \
  }
MM_INST_AVX512(mm_avx512_f32_4x4, IR_F32, 4, 4)
MM_INST_AVX512(mm_avx512_f32_1x8, IR_F32, 1, 8)
MM_INST_AVX512(mm_avx512_f16_4x4, IR_F16, 4, 4)
MM_INST_AVX512(mm_avx512_f16_1x8, IR_F16, 1, 8)
MM_INST_AVX512(mm_avx512_bf16_4x4, IR_BF16, 4, 4)
MM_INST_AVX512(mm_avx512_bf16_1x8, IR_BF16, 1, 8)

MM_AVX512_INLINE __m512 mm_i8x16_ps(__m128i v) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
}

/* w[0] = values 0..15 of the block, w[1] = values 16..31, dequantized as kn_dequant_row
 * does, given the block's d and m as f32 in memory (broadcast loads cost no shuffle). A
 * Q4 block takes 16 distinct values: they are computed once into a table and looked up
 * by nibble (vpermps reads only the low 4 bits of each index). */
MM_AVX512_INLINE void mm_qblock_avx512(const uint8_t *blk, ir_dtype dt, const float *dm,
                                       __m512 *w) {
  __m512 d = _mm512_set1_ps(dm[0]);
  if (dt == IR_Q8_0) {
    w[0] = _mm512_mul_ps(d, mm_i8x16_ps(_mm_loadu_si128((const __m128i *)(blk + 2))));
    w[1] = _mm512_mul_ps(d, mm_i8x16_ps(_mm_loadu_si128((const __m128i *)(blk + 18))));
    return;
  }
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 table = dt == IR_Q4_1 ? _mm512_fmadd_ps(d, iota, _mm512_set1_ps(dm[1]))
                               : _mm512_mul_ps(d, _mm512_sub_ps(iota, _mm512_set1_ps(8.0f)));
  const uint8_t *qs = blk + (dt == IR_Q4_1 ? 4 : 2);
  __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
  w[0] = _mm512_permutexvar_ps(idx, table);
  w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), table);
}

/* One zmm accumulator per output: the f32 order over dequantized blocks. The scales of
 * a run of blocks are converted to f32 first, each f16 pair in one instruction. */
MM_AVX512_INLINE void mm_qbody_avx512(const float *const *xr, const void *const *wr, int64_t k,
                                      float *out, ir_dtype dt, int mr, int nr) {
  __m512 acc[KN_MM_MAX_R][KN_MM_MAX_C];
  _Alignas(64) float dm[KN_MM_MAX_C][2 * KN_MM_QRUN]; /* d, m (garbage unless Q4_1) */
  const int64_t bb = kn_quant_block_bytes(dt), nb = k / KN_QBLOCK;
  const __m512i offs =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32((int)bb));
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) acc[r][c] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += KN_MM_QRUN) {
    int run = nb - b0 < KN_MM_QRUN ? (int)(nb - b0) : KN_MM_QRUN;
    __mmask16 live = (__mmask16)((1u << run) - 1u);
    /* The first 4 bytes of each block in one gather: 16 half pairs, widened together. */
    for (int c = 0; c < nr; c++) {
      const uint8_t *base = (const uint8_t *)wr[c] + b0 * bb;
      for (int64_t o = 0; o < run * bb; o += 64) mm_prefetch_w(base + o);
      __m512i h = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offs, base, 1);
      _mm512_store_ps(dm[c], _mm512_cvtph_ps(_mm512_castsi512_si256(h)));
      _mm512_store_ps(dm[c] + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)));
    }
    for (int j = 0; j < run; j++)
      for (int c = 0; c < nr; c++) {
        __m512 w[2];
        mm_qblock_avx512((const uint8_t *)wr[c] + (b0 + j) * bb, dt, dm[c] + 2 * j, w);
        for (int r = 0; r < mr; r++) {
          const float *x = xr[r] + (b0 + j) * KN_QBLOCK;
          acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(x), w[0], acc[r][c]);
          acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16), w[1], acc[r][c]);
        }
      }
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) out[r * nr + c] = mm_fold16_avx512(acc[r][c]);
}

#define MM_INST_QAVX512(name, dt, mr, nr)                                                          \
  static MM_AVX512 void name(const float *const *xr, const void *const *wr, int64_t k,             \
                             float *out) {                                                         \
    mm_qbody_avx512(xr, wr, k, out, dt, mr, nr);                                                   \
  }
MM_INST_QAVX512(mm_avx512_q8_0_4x4, IR_Q8_0, 4, 4)
MM_INST_QAVX512(mm_avx512_q8_0_1x8, IR_Q8_0, 1, 8)
MM_INST_QAVX512(mm_avx512_q4_0_4x4, IR_Q4_0, 4, 4)
MM_INST_QAVX512(mm_avx512_q4_0_1x8, IR_Q4_0, 1, 8)
MM_INST_QAVX512(mm_avx512_q4_1_4x4, IR_Q4_1, 4, 4)
MM_INST_QAVX512(mm_avx512_q4_1_1x8, IR_Q4_1, 1, 8)

/* The bf16 order on AVX-512F: one zmm a lane set, odd and even values split as on AVX2. */
MM_AVX512_INLINE void mm_bf16_step_avx512(const float *const *xr, const uint16_t *const *w,
                                          int64_t p, int64_t wp, __m512 (*acc)[KN_MM_MAX_C], int mr,
                                          int nr) {
  const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
  __m512 xo[KN_MM_MAX_R], xe[KN_MM_MAX_R];
  for (int r = 0; r < mr; r++) {
    __m512i v = _mm512_loadu_si512((const uint32_t *)xr[r] + p);
    xo[r] = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
    xe[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  for (int c = 0; c < nr; c++) {
    mm_prefetch_w(w[c] + 2 * wp);
    __m512i v = _mm512_loadu_si512(w[c] + 2 * wp);
    __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
    __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    for (int r = 0; r < mr; r++) {
      acc[r][c] = _mm512_fmadd_ps(xo[r], wo, acc[r][c]);
      acc[r][c] = _mm512_fmadd_ps(xe[r], we, acc[r][c]);
    }
  }
}

MM_AVX512_INLINE void mm_bf16_body_avx512(const float *const *xr, const void *const *wr, int64_t k,
                                          float *out, int mr, int nr) {
  __m512 acc[KN_MM_MAX_R][KN_MM_MAX_C];
  const uint16_t *w[KN_MM_MAX_C];
  const int64_t kw = mm_bf16_words(k), full = k / (2 * KN_MM_BF16_STEP) * KN_MM_BF16_STEP;
  for (int c = 0; c < nr; c++) w[c] = wr[c];
  unsigned csr = _mm_getcsr();
  _mm_setcsr(MM_CSR(csr));
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) {
      acc[r][c] = _mm512_setzero_ps();
      MM_PIN(acc[r][c]);
    }
  int64_t p = 0;
  for (; p < full; p += KN_MM_BF16_STEP) mm_bf16_step_avx512(xr, w, p, p, acc, mr, nr);
  if (p < kw) {
    _Alignas(64) uint32_t t[KN_MM_MAX_C][KN_MM_BF16_STEP];
    const uint16_t *tw[KN_MM_MAX_C];
    mm_bf16_wtail(wr, k, p, nr, t, tw);
    mm_bf16_step_avx512(xr, tw, p, 0, acc, mr, nr);
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) MM_PIN(acc[r][c]);
  _mm_setcsr(csr);
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) out[r * nr + c] = mm_fold16_avx512(acc[r][c]);
}

#define MM_INST_BF16_AVX512(name, mr, nr)                                                          \
  static MM_AVX512 void name(const float *const *xr, const void *const *wr, int64_t k,             \
                             float *out) {                                                         \
    mm_bf16_body_avx512(xr, wr, k, out, mr, nr);                                                   \
  }
MM_INST_BF16_AVX512(mm_avx512_bf16x_4x4, 4, 4)
MM_INST_BF16_AVX512(mm_avx512_bf16x_1x8, 1, 8)
static const mm_kernels k_bf16x_avx512 = {4, 4, mm_avx512_bf16x_4x4, 8, mm_avx512_bf16x_1x8};

/* The bf16 order in vdpbf16ps itself (AVX512-BF16): one instruction a lane step. */
#define MM_BF16DP __attribute__((target("avx512f,avx512bf16,avx2,fma,f16c")))
#define MM_BF16DP_INLINE                                                                           \
  static inline __attribute__((target("avx512f,avx512bf16,avx2,fma,f16c"), always_inline))

MM_BF16DP_INLINE void mm_bf16_step_dp(const float *const *xr, const uint16_t *const *w, int64_t p,
                                      int64_t wp, __m512 (*acc)[KN_MM_MAX_C], int mr, int nr) {
  __m512i xv[KN_MM_MAX_R];
  for (int r = 0; r < mr; r++) {
    xv[r] = _mm512_loadu_si512((const uint32_t *)xr[r] + p);
    if (nr > 1) MM_PIN(xv[r]);
  }
  for (int c = 0; c < nr; c++) {
    mm_prefetch_w(w[c] + 2 * wp);
    __m512i wv = _mm512_loadu_si512(w[c] + 2 * wp);
    if (mr > 1) MM_PIN(wv);
    for (int r = 0; r < mr; r++)
      acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)xv[r], (__m512bh)wv);
  }
}

/* out[i] = mm_fold16_avx512(v[i]) for 16 accumulators at once: the same pairs, (l, l+8),
 * (l, l+4), (l, l+2), (0, 1), added for four or eight accumulators an instruction (IEEE
 * addition is commutative, so the bits are those of the one-by-one fold), then one
 * permute to out's order. A 4 x 4 kernel call over a short k (576) otherwise spends as
 * many instructions folding as multiplying. */
MM_AVX512_INLINE void mm_fold16x16_avx512(const __m512 *v, float *out) {
  __m512 t[8], u[4], w[2];
  for (int j = 0; j < 8; j++) /* [v2j lanes l + l+8 | v2j+1's] */
    t[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xee));
  for (int j = 0; j < 4; j++) /* 128-bit lane q: v4j+q's l + l+4 */
    u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0xdd));
  for (int j = 0; j < 2; j++) /* lane q: (l, l+2) of v8j+q, then of v8j+4+q */
    w[j] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0x44),
                         _mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0xee));
  __m512 x = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), /* lane q, i: v4i+q */
                           _mm512_shuffle_ps(w[0], w[1], 0xdd));
  const __m512i to = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(to, x));
}

MM_BF16DP_INLINE void mm_bf16_body_dp(const float *const *xr, const void *const *wr, int64_t k,
                                      float *out, int mr, int nr) {
  __m512 acc[KN_MM_MAX_R][KN_MM_MAX_C];
  const uint16_t *w[KN_MM_MAX_C];
  const int64_t kw = mm_bf16_words(k), full = k / (2 * KN_MM_BF16_STEP) * KN_MM_BF16_STEP;
  for (int c = 0; c < nr; c++) w[c] = wr[c];
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) acc[r][c] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p < full; p += KN_MM_BF16_STEP) mm_bf16_step_dp(xr, w, p, p, acc, mr, nr);
  if (p < kw) {
    _Alignas(64) uint32_t t[KN_MM_MAX_C][KN_MM_BF16_STEP];
    const uint16_t *tw[KN_MM_MAX_C];
    mm_bf16_wtail(wr, k, p, nr, t, tw);
    mm_bf16_step_dp(xr, tw, p, 0, acc, mr, nr);
  }
  if (mr * nr == 16) {
    __m512 v[16];
    for (int r = 0; r < mr; r++)
      for (int c = 0; c < nr; c++) v[r * nr + c] = acc[r][c];
    mm_fold16x16_avx512(v, out);
    return;
  }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) out[r * nr + c] = mm_fold16_avx512(acc[r][c]);
}

#define MM_INST_BF16_DP(name, mr, nr)                                                              \
  static MM_BF16DP void name(const float *const *xr, const void *const *wr, int64_t k,             \
                             float *out) {                                                         \
    mm_bf16_body_dp(xr, wr, k, out, mr, nr);                                                       \
  }
MM_INST_BF16_DP(mm_dp_bf16_4x4, 4, 4)
/* One x row against 8 W rows (decode): each W row read through before the next, so W
 * streams in order (8 rows a 64-byte step each in turn kept 8 streams in flight, well
 * under the memory rate); each output's steps are the same, so are its bits. */
static MM_BF16DP void mm_dp_bf16_1x8(const float *const *xr, const void *const *wr, int64_t k,
                                     float *out) {
  for (int c = 0; c < 8; c++) mm_bf16_body_dp(xr, wr + c, k, out + c, 1, 1);
}
static const mm_kernels k_mm_bf16dp = {4, 4, mm_dp_bf16_4x4, 8, mm_dp_bf16_1x8};

/* mm_bf16_row with vcvtne2ps2bf16 (the same rounding, checked by test_matmul_bf16). */
static MM_BF16DP void mm_bf16_row_dp(const float *x, int64_t k, uint32_t *out) {
  int64_t i = 0;
  for (; i + 2 * KN_MM_BF16_STEP <= k; i += 2 * KN_MM_BF16_STEP)
    _mm512_storeu_si512(out + i / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16),
                                                                  _mm512_loadu_ps(x + i)));
  if (i < mm_bf16_words(k) * 2) mm_bf16_row(x + i, k - i, out + i / 2);
}

static const mm_kernels k_mm_avx512[6] = {
    {4, 4, mm_avx512_f32_4x4, 8, mm_avx512_f32_1x8},
    {4, 4, mm_avx512_f16_4x4, 8, mm_avx512_f16_1x8},
    {4, 4, mm_avx512_bf16_4x4, 8, mm_avx512_bf16_1x8},
    {4, 4, mm_avx512_q8_0_4x4, 8, mm_avx512_q8_0_1x8},
    {4, 4, mm_avx512_q4_0_4x4, 8, mm_avx512_q4_0_1x8},
    {4, 4, mm_avx512_q4_1_4x4, 8, mm_avx512_q4_1_1x8},
};

MM_INST_AVX512(mm_avx512_f32_1x4, IR_F32, 1, 4)
MM_INST_AVX512(mm_avx512_f32_2x4, IR_F32, 2, 4)
MM_INST_AVX512(mm_avx512_f32_3x4, IR_F32, 3, 4)

MM_AVX512_INLINE void mm_deq_avx512(const void *w, int64_t k, float *out, ir_dtype dt) {
  if (ir_dtype_is_quant(dt)) {
    const int64_t bb = kn_quant_block_bytes(dt);
    for (int64_t b = 0; b < k / KN_QBLOCK; b++) {
      const uint8_t *blk = (const uint8_t *)w + b * bb;
      float dm[4];
      __m512 v[2];
      _mm_storeu_ps(dm, mm_block_dm(blk, dt));
      mm_qblock_avx512(blk, dt, dm, v);
      _mm512_storeu_ps(out + b * KN_QBLOCK, v[0]);
      _mm512_storeu_ps(out + b * KN_QBLOCK + 16, v[1]);
    }
    return;
  }
  int64_t i = 0;
  for (; i + KN_MM_LANES <= k; i += KN_MM_LANES) _mm512_storeu_ps(out + i, mm_w16_avx512(w, i, dt));
  for (; i < k; i++) out[i] = mm_w_scalar(w, dt, i);
}

#define MM_DEQ_AVX512(name, dt)                                                                    \
  static MM_AVX512 void name(const void *w, int64_t k, float *out) { mm_deq_avx512(w, k, out, dt); }
MM_DEQ_AVX512(mm_deq_avx512_f16, IR_F16)
MM_DEQ_AVX512(mm_deq_avx512_bf16, IR_BF16)
MM_DEQ_AVX512(mm_deq_avx512_q8_0, IR_Q8_0)
MM_DEQ_AVX512(mm_deq_avx512_q4_0, IR_Q4_0)
MM_DEQ_AVX512(mm_deq_avx512_q4_1, IR_Q4_1)

static const mm_panel_kernels k_panel_avx512 = {
    4,
    4,
    mm_avx512_f32_4x4,
    {NULL, mm_avx512_f32_1x4, mm_avx512_f32_2x4, mm_avx512_f32_3x4},
    {NULL, mm_deq_avx512_f16, mm_deq_avx512_bf16, mm_deq_avx512_q8_0, mm_deq_avx512_q4_0,
     mm_deq_avx512_q4_1},
    8,
    8};
#endif

/* ---- dispatch and tiling ---------------------------------------------------------- */

#if KN_MM_X86
/* Asked of cpuid directly: not every compiler's __builtin_cpu_supports knows "f16c". */
static bool mm_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

/* AMX-TILE and AMX-INT8 (cpuid 7.0 edx bits 24, 25), and Linux's leave to use the tile
 * data (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, process-wide, asked once): without
 * it the first tile instruction faults. */
bool kn_cpu_has_amx(void) {
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return v;
  v = 0;
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && defined(SYS_arch_prctl)
  unsigned a, b, c, d;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & 1u << 24) && (d & 1u << 25))
    v = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#endif
  atomic_store_explicit(&cached, v, memory_order_relaxed);
  return v;
}

/* The best instruction set the CPU offers (0, 1, 2, 3), found once: cpuid is slow, and
 * under a hypervisor each one is a VM exit. Every thread finds the same value, so the
 * first-use race is benign; it is atomic to stay defined. */
static int mm_cpu_isa(void) {
  static _Atomic int cached = -1;
  int isa = atomic_load_explicit(&cached, memory_order_relaxed);
  if (isa >= 0) return isa;
  isa = 0;
#if KN_MM_X86
  bool base = __builtin_cpu_supports("fma") && mm_has_f16c();
  if (base && __builtin_cpu_supports("avx2")) isa = 1;
#if KN_MATMUL_MAX_ISA >= 2
  if (base && __builtin_cpu_supports("avx512f")) isa = 2;
#endif
#if KN_MATMUL_MAX_ISA >= 3
  if (isa == 2 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni") &&
      kn_cpu_has_amx())
    isa = 3;
#endif
#endif
  atomic_store_explicit(&cached, isa, memory_order_relaxed);
  return isa;
}

static _Atomic int g_mm_max_isa = KN_MATMUL_MAX_ISA;

int kn_matmul_set_max_isa(int isa) {
  int cap = isa < 0 ? 0 : isa > KN_MATMUL_MAX_ISA ? KN_MATMUL_MAX_ISA : isa;
  return atomic_exchange(&g_mm_max_isa, cap);
}

static int mm_dtype_index(ir_dtype wt) {
  switch (wt) {
  case IR_F16: return 1;
  case IR_BF16: return 2;
  case IR_Q8_0: return 3;
  case IR_Q4_0: return 4;
  case IR_Q4_1: return 5;
  default: return 0;
  }
}

/* AVX512-BF16 (cpuid 7.1 eax bit 5), asked once. */
static bool mm_cpu_has_bf16dp(void) {
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return v;
  v = 0;
#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 2
  unsigned a, b, c, d;
  v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && a >= 1 &&
      __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & 1u << 5);
#endif
  atomic_store_explicit(&cached, v, memory_order_relaxed);
  return v;
}

/* The choice depends only on the CPU (and the cap), so it is the same for every call
 * of a process unless a test changes the cap. */
static int mm_isa(void) {
  int isa = mm_cpu_isa(), cap = atomic_load_explicit(&g_mm_max_isa, memory_order_relaxed);
  return isa > cap ? cap : isa;
}

int kn_cpu_isa(void) { return mm_isa(); }

bool kn_cpu_has_avx512bf16(void) { return mm_cpu_has_bf16dp(); }

static _Atomic bool g_mm_bf16dp = true;

bool kn_matmul_use_bf16dp(bool on) { return atomic_exchange(&g_mm_bf16dp, on); }

bool kn_matmul_bf16dp(void) {
  return mm_isa() >= 2 && mm_cpu_has_bf16dp() &&
         atomic_load_explicit(&g_mm_bf16dp, memory_order_relaxed);
}

static const mm_kernels *mm_pick(ir_dtype wt) {
  int d = mm_dtype_index(wt), isa = mm_isa();
#if KN_MM_X86
#if KN_MATMUL_MAX_ISA >= 2
  if (isa >= 2) return &k_mm_avx512[d];
#endif
  if (isa >= 1) return &k_mm_avx2[d];
#endif
  (void)isa;
  return &k_mm_c[d];
}

/* The kernels of bf16 W with bf16 activations. */
static const mm_kernels *mm_pick_bf16x(void) {
  int isa = mm_isa();
#if KN_MM_X86
#if KN_MATMUL_MAX_ISA >= 2
  if (kn_matmul_bf16dp()) return &k_mm_bf16dp;
  if (isa >= 2) return &k_bf16x_avx512;
#endif
  if (isa >= 1) return &k_bf16x_avx2;
#endif
  (void)isa;
  return &k_bf16x_c;
}

static const mm_panel_kernels *mm_pick_panel(void) {
  int isa = mm_isa();
#if KN_MM_X86
#if KN_MATMUL_MAX_ISA >= 2
  if (isa >= 2) return &k_panel_avx512;
#endif
  if (isa >= 1) return &k_panel_avx2;
#endif
  (void)isa;
  return &k_panel_c;
}

typedef struct mm_args {
  float *y;
  const float *x;
  int64_t x_stride; /* floats from one x row to the next: k, or bf16 W's pair words */
  const char *w;
  const float *bias;
  int64_t m, n, k; /* n: columns of y */
  int64_t w_row_bytes;
  bool swiglu;        /* y[:, j] = silu(z[:, j]) * z[:, n + j]: W has 2n rows */
  bool x16;           /* W is IR_BF16_X16 (x as bf16 pairs): mm_x16_tile's path */
  bool amx;           /* ... on AMX-BF16: mm_x16_amx_tile's, x in tile blocks (mm_xpack_at) */
  ir_dtype qt;        /* block W converted to bf16x16 a tile at a time (kn_matmul_bf16q), or 0 */
  const char *qw;     /* ... that W */
  int64_t w_g0, up_g; /* x16: the group a->w starts at; groups from a gate group to its up */
  int64_t m_tile;     /* rows of a task at most (0: KN_MM_M_TILE) */
  kn_mm_tiles tiles;
  const mm_kernels *kern;
  const mm_panel_kernels *panel; /* the panel path, or NULL */
  mm_deq_fn deq;                 /* panel: W row -> f32 */
  int64_t panel_cols;            /* panel: columns of y per converted panel */
} mm_args;

/* Where a kernel call finds the W row of y column j (h = 1: its swiglu up row): in the
 * weights (j_org 0, up = n rows), or in a converted panel that starts at column j_org. */
typedef struct mm_wsrc {
  const char *base;
  int64_t j_org, stride, up;
} mm_wsrc;

static const void *mm_wrow(const mm_wsrc *s, int64_t j, int h) {
  return s->base + (j - s->j_org + h * s->up) * s->stride;
}

/* Columns of y one kernel call of width nr computes: the swiglu epilogue spends half of
 * the W rows on gate and half on up. */
static int mm_cols(const mm_args *a, int nr) { return a->swiglu ? nr / 2 : nr; }

/* Runs one kernel call for rows [i0, i0 + mr) of x and columns [j0, j0 + cols) of y,
 * clipped at j1: missing W rows repeat row j0 and their outputs are dropped. With gates,
 * the swiglu matmul's gate and up values (bias added) are gathered there instead. */
static void mm_block(const mm_args *a, const mm_wsrc *ws, mm_kern_fn fn, int mr, int nr, int64_t i0,
                     int64_t j0, int64_t j1, kn_mm_gates *gates) {
  const float *xr[KN_MM_MAX_R] = {0};
  const void *wr[KN_MM_MAX_C] = {0};
  float acc[KN_MM_MAX_R * KN_MM_MAX_C];
  int nc = mm_cols(a, nr);
  int64_t nv = j1 - j0 < nc ? j1 - j0 : nc;
  for (int r = 0; r < mr; r++) xr[r] = a->x + (i0 + r) * a->x_stride;
  for (int c = 0; c < nc; c++) {
    wr[c] = mm_wrow(ws, j0 + (c < nv ? c : 0), 0);
    if (a->swiglu) wr[nc + c] = mm_wrow(ws, j0 + (c < nv ? c : 0), 1);
  }
  fn(xr, wr, a->k, acc);
  const float *b = a->bias;
  if (gates) {
    kn_mm_gates_put(gates, acc, mr, nr, nc, nv, j0, b ? b + j0 : NULL, b ? b + a->n + j0 : NULL);
    return;
  }
  kn_mm_store(a->y + i0 * a->n + j0, a->n, acc, mr, nr, nc, nv, b ? b + j0 : NULL,
              b ? b + a->n + j0 : NULL, a->swiglu);
}

/* Rows [i0, i0 + mr) against columns [j0, j1) in kernel calls of width nr; the swiglu
 * matmul gates KN_MM_GATE_COLS columns at a time (kn_mm_gates). */
static void mm_rows(const mm_args *a, const mm_wsrc *ws, mm_kern_fn fn, int mr, int nr, int64_t i0,
                    int64_t j0, int64_t j1) {
  int cb = mm_cols(a, nr);
  if (!a->swiglu) {
    for (int64_t j = j0; j < j1; j += cb) mm_block(a, ws, fn, mr, nr, i0, j, j1, NULL);
    return;
  }
  _Static_assert((int)KN_MM_MAX_R <= (int)KN_MM_GATE_ROWS, "a kernel call's rows fit kn_mm_gates");
  kn_mm_gates gates;
  for (gates.j0 = j0; gates.j0 < j1; gates.j0 += KN_MM_GATE_COLS) {
    int64_t je = gates.j0 + KN_MM_GATE_COLS < j1 ? gates.j0 + KN_MM_GATE_COLS : j1;
    for (int64_t j = gates.j0; j < je; j += cb) mm_block(a, ws, fn, mr, nr, i0, j, je, &gates);
    kn_mm_gates_apply(&gates, a->y + i0 * a->n + gates.j0, a->n, mr, je);
  }
}

/* Panels of W rows, converted to f32 once, swept by every x row of the tile. A panel's
 * rows: gate rows of columns [pj, pj + panel_cols), then (swiglu) their up rows. */
static void mm_tile_panel(const mm_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  _Alignas(64) float panel[KN_MM_PANEL_FLOATS];
  const mm_panel_kernels *pk = a->panel;
  int64_t pc = a->panel_cols;
  for (int64_t pj = j0; pj < j1; pj += pc) {
    int64_t pe = pj + pc < j1 ? pj + pc : j1;
    for (int h = 0; h < (a->swiglu ? 2 : 1); h++)
      for (int64_t j = pj; j < pe; j++)
        a->deq(a->w + (j + h * a->n) * a->w_row_bytes, a->k, panel + (j - pj + h * pc) * a->k);
    mm_wsrc ws = {(const char *)panel, pj, a->k * (int64_t)sizeof(float), pc};
    int64_t i = i0;
    for (; i + pk->mr <= i1; i += pk->mr) mm_rows(a, &ws, pk->block, pk->mr, pk->nr, i, pj, pe);
    if (i < i1) mm_rows(a, &ws, pk->left[i1 - i], (int)(i1 - i), pk->nr, i, pj, pe);
  }
}

/* x rows sweep the tile in groups of mr (in L1) over W rows that stay in L2. */
static void mm_tile(const mm_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (a->panel) {
    mm_tile_panel(a, i0, i1, j0, j1);
    return;
  }
  const mm_kernels *kn = a->kern;
  const mm_wsrc ws = {a->w, 0, a->w_row_bytes, a->n};
  int64_t i = i0;
  for (; i + kn->mr <= i1; i += kn->mr) mm_rows(a, &ws, kn->block, kn->mr, kn->nr, i, j0, j1);
  for (; i < i1; i++) mm_rows(a, &ws, kn->row, 1, kn->nr1, i, j0, j1);
}

/* ---- bf16x16 W: bf16 products, f32 sums, one chain an output ---------------------------- */
/* IR_BF16_X16 (ir_dtype.h) has its own order, the same on every path: y = the chain over
 * the k/2 pairs p of acc = fma(x[2p+1], w[2p+1], acc), then acc = fma(x[2p], w[2p], acc),
 * subnormal inputs and results flushed to zero (vdpbf16ps's step; x rounded to bf16 as
 * for kn_matmul_bf16x), then the bias. Lanes are 16 output columns (a W group), so no
 * horizontal sums; a kernel call runs up to 6 x rows against 4 groups (24 accumulators),
 * and with one chain an output a row's result never depends on the rows beside it. */

/* out[r * 64 + 16 g + i] += rows xr[0 .. mr) against groups wg[0 .. 4) over kp pairs (the
 * chain goes on from out's partial sums: a k block at a time, the same bits). */
typedef void (*mm_x16_fn)(const uint32_t *const *xr, const uint32_t *const *wg, int64_t kp,
                          float *out);

static inline __attribute__((always_inline)) void mm_x16_body_c(const uint32_t *const *xr,
                                                                const uint32_t *const *wg,
                                                                int64_t kp, float *out, int mr) {
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++)
      for (int i = 0; i < KN_MM_X16_COLS; i++) {
        float acc = out[r * 64 + 16 * g + i];
        for (int64_t p = 0; p < kp; p++) acc = mm_bf16_step(xr[r][p], wg[g][p * 16 + i], acc);
        out[r * 64 + 16 * g + i] = acc;
      }
}

#define MM_X16_C(name, mr)                                                                         \
  static void name(const uint32_t *const *xr, const uint32_t *const *wg, int64_t kp, float *out) { \
    mm_x16_body_c(xr, wg, kp, out, mr);                                                            \
  }
MM_X16_C(mm_x16_c_1, 1)
MM_X16_C(mm_x16_c_2, 2)
static const mm_x16_fn k_x16_c[KN_MM_X16_MAX_R + 1] = {
    NULL, mm_x16_c_1, mm_x16_c_2, mm_x16_c_2, mm_x16_c_2, mm_x16_c_2, mm_x16_c_2};

#if KN_MM_X86
/* AVX2: a group is two ymm (lo: rows 0-7 of the group, hi: 8-15), under DAZ/FTZ. */
MM_AVX2_INLINE void mm_x16_body_avx2(const uint32_t *const *xr, const uint32_t *const *wg,
                                     int64_t kp, float *out, int mr) {
  __m256 acc[2][KN_MM_X16_GROUPS][2];
  unsigned csr = _mm_getcsr();
  _mm_setcsr(MM_CSR(csr));
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++)
      for (int h = 0; h < 2; h++) {
        acc[r][g][h] = _mm256_loadu_ps(out + r * 64 + 16 * g + 8 * h);
        MM_PIN(acc[r][g][h]);
      }
  for (int64_t p = 0; p < kp; p++) {
    __m256 xo[2], xe[2];
    for (int r = 0; r < mr; r++) {
      uint32_t v = xr[r][p];
      xo[r] = _mm256_castsi256_ps(_mm256_set1_epi32((int)(v & 0xffff0000u)));
      xe[r] = _mm256_castsi256_ps(_mm256_set1_epi32((int)(v << 16)));
    }
    for (int g = 0; g < KN_MM_X16_GROUPS; g++)
      for (int h = 0; h < 2; h++) {
        __m256 wo, we;
        mm_bf16_split_avx2(_mm256_loadu_si256((const __m256i *)(wg[g] + p * 16 + 8 * h)), &wo, &we);
        for (int r = 0; r < mr; r++) {
          acc[r][g][h] = _mm256_fmadd_ps(xo[r], wo, acc[r][g][h]);
          acc[r][g][h] = _mm256_fmadd_ps(xe[r], we, acc[r][g][h]);
        }
      }
  }
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++)
      for (int h = 0; h < 2; h++) MM_PIN(acc[r][g][h]);
  _mm_setcsr(csr);
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++)
      for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + r * 64 + 16 * g + 8 * h, acc[r][g][h]);
}

#define MM_X16_AVX2(name, mr)                                                                      \
  static MM_AVX2 void name(const uint32_t *const *xr, const uint32_t *const *wg, int64_t kp,       \
                           float *out) {                                                           \
    mm_x16_body_avx2(xr, wg, kp, out, mr);                                                         \
  }
MM_X16_AVX2(mm_x16_avx2_1, 1)
MM_X16_AVX2(mm_x16_avx2_2, 2)
static const mm_x16_fn k_x16_avx2[KN_MM_X16_MAX_R + 1] = {
    NULL, mm_x16_avx2_1, mm_x16_avx2_2, mm_x16_avx2_2, mm_x16_avx2_2, mm_x16_avx2_2, mm_x16_avx2_2};

#if KN_MATMUL_MAX_ISA >= 2
/* AVX512-BF16: one vdpbf16ps a (row, group, pair), x's pair broadcast from memory. */
MM_BF16DP_INLINE void mm_x16_body_dp(const uint32_t *const *xr, const uint32_t *const *wg,
                                     int64_t kp, float *out, int mr) {
  if (mr == 1) { /* decode: a group at a time, so W streams in order (as mm_dp_bf16_1x8) */
    for (int g = 0; g < KN_MM_X16_GROUPS; g++) {
      __m512 a = _mm512_loadu_ps(out + 16 * g);
      for (int64_t p = 0; p < kp; p++) {
        mm_prefetch_w(wg[g] + p * 16);
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32((int)xr[0][p]),
                             (__m512bh)_mm512_loadu_si512(wg[g] + p * 16));
      }
      _mm512_storeu_ps(out + 16 * g, a);
    }
    return;
  }
  __m512 acc[KN_MM_X16_MAX_R][KN_MM_X16_GROUPS];
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++) acc[r][g] = _mm512_loadu_ps(out + r * 64 + 16 * g);
  for (int64_t p = 0; p < kp; p++) {
    __m512i w[KN_MM_X16_GROUPS];
    for (int g = 0; g < KN_MM_X16_GROUPS; g++) {
      mm_prefetch_w(wg[g] + p * 16);
      w[g] = _mm512_loadu_si512(wg[g] + p * 16);
    }
    for (int r = 0; r < mr; r++) {
      __m512i xv = _mm512_set1_epi32((int)xr[r][p]);
      for (int g = 0; g < KN_MM_X16_GROUPS; g++)
        acc[r][g] = _mm512_dpbf16_ps(acc[r][g], (__m512bh)xv, (__m512bh)w[g]);
    }
  }
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++) _mm512_storeu_ps(out + r * 64 + 16 * g, acc[r][g]);
}

#define MM_X16_DP(name, mr)                                                                        \
  static MM_BF16DP void name(const uint32_t *const *xr, const uint32_t *const *wg, int64_t kp,     \
                             float *out) {                                                         \
    mm_x16_body_dp(xr, wg, kp, out, mr);                                                           \
  }
MM_X16_DP(mm_x16_dp_1, 1)
MM_X16_DP(mm_x16_dp_2, 2)
MM_X16_DP(mm_x16_dp_3, 3)
MM_X16_DP(mm_x16_dp_4, 4)
MM_X16_DP(mm_x16_dp_5, 5)
MM_X16_DP(mm_x16_dp_6, 6)
static const mm_x16_fn k_x16_dp[KN_MM_X16_MAX_R + 1] = {
    NULL, mm_x16_dp_1, mm_x16_dp_2, mm_x16_dp_3, mm_x16_dp_4, mm_x16_dp_5, mm_x16_dp_6};

/* AVX-512F: the same steps with f32 FMAs under DAZ/FTZ. */
MM_AVX512_INLINE void mm_x16_body_avx512(const uint32_t *const *xr, const uint32_t *const *wg,
                                         int64_t kp, float *out, int mr) {
  __m512 acc[3][KN_MM_X16_GROUPS];
  const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
  unsigned csr = _mm_getcsr();
  _mm_setcsr(MM_CSR(csr));
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++) {
      acc[r][g] = _mm512_loadu_ps(out + r * 64 + 16 * g);
      MM_PIN(acc[r][g]);
    }
  for (int64_t p = 0; p < kp; p++) {
    __m512 xo[3], xe[3];
    for (int r = 0; r < mr; r++) {
      uint32_t v = xr[r][p];
      xo[r] = _mm512_castsi512_ps(_mm512_set1_epi32((int)(v & 0xffff0000u)));
      xe[r] = _mm512_castsi512_ps(_mm512_set1_epi32((int)(v << 16)));
    }
    for (int g = 0; g < KN_MM_X16_GROUPS; g++) {
      __m512i v = _mm512_loadu_si512(wg[g] + p * 16);
      __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
      __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      for (int r = 0; r < mr; r++) {
        acc[r][g] = _mm512_fmadd_ps(xo[r], wo, acc[r][g]);
        acc[r][g] = _mm512_fmadd_ps(xe[r], we, acc[r][g]);
      }
    }
  }
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++) MM_PIN(acc[r][g]);
  _mm_setcsr(csr);
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++) _mm512_storeu_ps(out + r * 64 + 16 * g, acc[r][g]);
}

#define MM_X16_AVX512(name, mr)                                                                    \
  static MM_AVX512 void name(const uint32_t *const *xr, const uint32_t *const *wg, int64_t kp,     \
                             float *out) {                                                         \
    mm_x16_body_avx512(xr, wg, kp, out, mr);                                                       \
  }
MM_X16_AVX512(mm_x16_avx512_1, 1)
MM_X16_AVX512(mm_x16_avx512_2, 2)
MM_X16_AVX512(mm_x16_avx512_3, 3)
static const mm_x16_fn k_x16_avx512[KN_MM_X16_MAX_R + 1] = {NULL,
                                                            mm_x16_avx512_1,
                                                            mm_x16_avx512_2,
                                                            mm_x16_avx512_3,
                                                            mm_x16_avx512_3,
                                                            mm_x16_avx512_3,
                                                            mm_x16_avx512_3};
#endif
#endif

/* ---- bf16x16 W in the tile order (AMX-BF16's) ------------------------------------------ */
/* On a CPU with AMX-BF16, IR_BF16_X16 sums in the order of the tile instruction,
 * tdpbf16ps, on every path there (kn_matmul_x16_order): the pairs go in blocks of 16 from
 * the first (the last block may be short); in a block the even products (x[2p] w[2p]) make
 * one chain and the odd products another, each from +0 by FMAs, and acc += (even + odd);
 * subnormal inputs and results flushed to zero, round to nearest even, then the bias.
 * That is what the instruction computes for a 16-pair tile, bit for bit (checked against
 * it in test_matmul_bf16); its pseudocode in the manual, one chain of alternating products,
 * is not. A block's chains never see another row, so a row's result is its own whatever
 * the rows beside it. A short last block is the instruction's over zero pairs (x's zero
 * words, W's zero-padded copy): each adds +0, which changes a chain only where it holds
 * -0 (a tiny negative result flushed), to +0; the other paths add that +0 once. */

static inline __attribute__((always_inline)) void mm_x16t_body_c(const uint32_t *const *xr,
                                                                 const uint32_t *const *wg,
                                                                 int64_t kp, float *out, int mr) {
  for (int r = 0; r < mr; r++)
    for (int g = 0; g < KN_MM_X16_GROUPS; g++)
      for (int i = 0; i < KN_MM_X16_COLS; i++) {
        float acc = out[r * 64 + 16 * g + i];
        for (int64_t b = 0; b < kp; b += KN_MM_X16_TBLOCK) {
          float e = 0.0f, o = 0.0f;
          for (int64_t p = b; p < kp && p < b + KN_MM_X16_TBLOCK; p++) {
            uint32_t xv = xr[r][p], wv = wg[g][p * 16 + i];
            e = kn_fma_ftz(kn_bf16_f32(xv & 0xffffu), kn_bf16_f32(wv & 0xffffu), e);
            o = kn_fma_ftz(kn_bf16_f32(xv >> 16), kn_bf16_f32(wv >> 16), o);
          }
          if (kp - b < KN_MM_X16_TBLOCK) /* a short block's zero pairs: -0 + +0 is +0 */
            e = 0.0f + e, o = 0.0f + o;
          acc = kn_ftz(kn_ftz(acc) + kn_ftz(e + o));
        }
        out[r * 64 + 16 * g + i] = acc;
      }
}

#define MM_X16T_C(name, mr)                                                                        \
  static void name(const uint32_t *const *xr, const uint32_t *const *wg, int64_t kp, float *out) { \
    mm_x16t_body_c(xr, wg, kp, out, mr);                                                           \
  }
MM_X16T_C(mm_x16t_c_1, 1)
MM_X16T_C(mm_x16t_c_2, 2)
static const mm_x16_fn k_x16t_c[KN_MM_X16_MAX_R + 1] = {
    NULL, mm_x16t_c_1, mm_x16t_c_2, mm_x16t_c_2, mm_x16t_c_2, mm_x16t_c_2, mm_x16t_c_2};

#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 2
/* AVX-512F: the two chains of a (row, group) in two zmm, f32 FMAs under DAZ/FTZ; the
 * running sums wait in out between blocks. Decode (m = 1) and the rows AMX leaves. */
MM_AVX512_INLINE void mm_x16t_body_avx512(const uint32_t *const *xr, const uint32_t *const *wg,
                                          int64_t kp, float *out, int mr) {
  const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
  unsigned csr = _mm_getcsr();
  _mm_setcsr(MM_CSR(csr));
  for (int64_t b = 0; b < kp; b += KN_MM_X16_TBLOCK) {
    const int64_t be = kp - b < KN_MM_X16_TBLOCK ? kp : b + KN_MM_X16_TBLOCK;
    __m512 e[2][KN_MM_X16_GROUPS], o[2][KN_MM_X16_GROUPS];
    for (int r = 0; r < mr; r++)
      for (int g = 0; g < KN_MM_X16_GROUPS; g++) {
        e[r][g] = _mm512_setzero_ps(), o[r][g] = _mm512_setzero_ps();
        MM_PIN(e[r][g]);
        MM_PIN(o[r][g]);
      }
    for (int64_t p = b; p < be; p++) {
      __m512 xo[2], xe[2];
      for (int r = 0; r < mr; r++) {
        uint32_t v = xr[r][p];
        xo[r] = _mm512_castsi512_ps(_mm512_set1_epi32((int)(v & 0xffff0000u)));
        xe[r] = _mm512_castsi512_ps(_mm512_set1_epi32((int)(v << 16)));
      }
      for (int g = 0; g < KN_MM_X16_GROUPS; g++) {
        mm_prefetch_w(wg[g] + p * 16);
        __m512i v = _mm512_loadu_si512(wg[g] + p * 16);
        __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
        __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        for (int r = 0; r < mr; r++) {
          e[r][g] = _mm512_fmadd_ps(xe[r], we, e[r][g]);
          o[r][g] = _mm512_fmadd_ps(xo[r], wo, o[r][g]);
        }
      }
    }
    if (be - b < KN_MM_X16_TBLOCK) /* a short block's zero pairs: -0 + +0 is +0 */
      for (int r = 0; r < mr; r++)
        for (int g = 0; g < KN_MM_X16_GROUPS; g++) {
          e[r][g] = _mm512_add_ps(_mm512_setzero_ps(), e[r][g]);
          o[r][g] = _mm512_add_ps(_mm512_setzero_ps(), o[r][g]);
        }
    for (int r = 0; r < mr; r++)
      for (int g = 0; g < KN_MM_X16_GROUPS; g++) {
        float *d = out + r * 64 + 16 * g;
        __m512 acc = _mm512_add_ps(_mm512_loadu_ps(d), _mm512_add_ps(e[r][g], o[r][g]));
        MM_PIN(acc);
        _mm512_storeu_ps(d, acc);
      }
  }
  _mm_setcsr(csr);
}

#define MM_X16T_AVX512(name, mr)                                                                   \
  static MM_AVX512 void name(const uint32_t *const *xr, const uint32_t *const *wg, int64_t kp,     \
                             float *out) {                                                         \
    mm_x16t_body_avx512(xr, wg, kp, out, mr);                                                      \
  }
MM_X16T_AVX512(mm_x16t_avx512_1, 1)
MM_X16T_AVX512(mm_x16t_avx512_2, 2)
static const mm_x16_fn k_x16t_avx512[KN_MM_X16_MAX_R + 1] = {NULL,
                                                             mm_x16t_avx512_1,
                                                             mm_x16t_avx512_2,
                                                             mm_x16t_avx512_2,
                                                             mm_x16t_avx512_2,
                                                             mm_x16t_avx512_2,
                                                             mm_x16t_avx512_2};

/* AMX-BF16: 32 x rows (two A tiles) against two W groups (two B tiles: a group's 16
 * pairs of 16 columns are one 1 KiB tile as they lie), four C tiles; tiles 0-3 C (row
 * block a, group b: 2a + b), 4-5 A, 6-7 B. The C tiles hold the running sums over all of
 * k. Rows past a block's count are not configured, so no load reads past x's rows; a
 * short last block of pairs comes from a zero-padded copy of W (x's words are zero there
 * already: mm_bf16_words). */
#define MM_AMX_TARGET "amx-tile,amx-bf16,avx512f,avx512bw,avx2,fma,f16c"
#define MM_AMX __attribute__((target(MM_AMX_TARGET)))
#define MM_AMX_INLINE static inline __attribute__((target(MM_AMX_TARGET), always_inline))
/* GCC's tile loads, stores and ldtilecfg do not tell the compiler which memory they touch:
 * make the buffers' stores happen before them and their loads after. */
#define MM_AMX_BARRIER() __asm__ volatile("" ::: "memory")

MM_AMX_INLINE void mm_amx_config(int r0, int r1) {
  kn_amx_cfg cfg = {.palette = 1};
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64;
  cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = (uint8_t)r0;
  cfg.rows[2] = cfg.rows[3] = cfg.rows[5] = (uint8_t)(r1 ? r1 : r0);
  cfg.rows[6] = cfg.rows[7] = KN_MM_X16_TBLOCK;
  MM_AMX_BARRIER();
  _tile_loadconfig(&cfg);
}

/* C (tiles 0-3) = x row blocks x0 (x1) against groups wa, wb over nb whole blocks, then
 * the short block from tail (2 KiB: wa's, then wb's) when there is one. A row block of r
 * rows holds its k blocks 16 r words apart, a row's 16 words 64 bytes apart
 * (mm_xpack_at); xs0, xs1: the blocks' strides in words. */
MM_AMX_INLINE void mm_amx_steps(const uint32_t *x0, int64_t xs0, const uint32_t *x1, int64_t xs1,
                                const uint32_t *wa, const uint32_t *wb, int64_t nb,
                                const uint32_t *tail, int two) {
  const int64_t step = KN_MM_X16_TBLOCK * KN_MM_X16_COLS;
  _tile_zero(0);
  _tile_zero(1);
  if (two) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t t = 0; t <= nb; t++) {
    const uint32_t *ba = wa + t * step, *bb = wb + t * step;
    if (t == nb) {
      if (!tail) break;
      ba = tail, bb = tail + step;
    }
    _tile_loadd(6, ba, 64);
    _tile_loadd(7, bb, 64);
    _tile_loadd(4, x0 + t * xs0, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, x1 + t * xs1, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
}

static MM_AMX void mm_amx_setup(int r0, int r1) { mm_amx_config(r0, r1); }
static MM_AMX void mm_amx_release(void) { _tile_release(); }

/* One block: rows [i, i + r0 + r1) (r1: the second A tile's rows, or 0) against groups wa,
 * wb into y's columns [j, j + cols) (swiglu: wa gate, wb up, 16 columns). Plain outputs
 * without a bias go from the tiles straight to y; the rest through c (32 x 32 floats),
 * added to and gated with AVX-512 (read back from a tile store, it waits for it). */
static MM_AMX void mm_amx_block(const mm_args *a, int64_t i, int r0, int r1, int64_t j,
                                int64_t cols, const uint32_t *wa, const uint32_t *wb, int64_t nb,
                                const uint32_t *tail, float *c) {
  const int64_t n = a->n;
  const uint32_t *x0 = (const uint32_t *)a->x + i * a->x_stride, *x1 = x0 + 16 * a->x_stride;
  const int rows = r0 + r1;
  MM_AMX_BARRIER();
  if (r1) mm_amx_steps(x0, 16 * r0, x1, 16 * r1, wa, wb, nb, tail, 1);
  else mm_amx_steps(x0, 16 * r0, x1, 0, wa, wb, nb, tail, 0);
  float *y = a->y + i * n + j;
  const float *b = a->bias;
  if (!a->swiglu && !b && cols == 2 * KN_MM_X16_COLS) {
    _tile_stored(0, y, n * 4);
    _tile_stored(1, y + 16, n * 4);
    if (r1) {
      _tile_stored(2, y + 16 * n, n * 4);
      _tile_stored(3, y + 16 * n + 16, n * 4);
    }
    MM_AMX_BARRIER();
    return;
  }
  /* c: the first 16 columns' rows (16 floats a row, gate with swiglu), then at c + 512 the
   * second 16's (up) */
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 512, 64);
  if (r1) {
    _tile_stored(2, c + 256, 64);
    _tile_stored(3, c + 768, 64);
  }
  MM_AMX_BARRIER();
  const int64_t half = KN_MM_X16_COLS;
  if (b) {
    __m512 b0 = _mm512_loadu_ps(b + j);
    __m512 b1 = a->swiglu     ? _mm512_loadu_ps(b + n + j)
                : cols > half ? _mm512_loadu_ps(b + j + half)
                              : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
      _mm512_store_ps(c + 16 * r, _mm512_add_ps(_mm512_load_ps(c + 16 * r), b0));
      _mm512_store_ps(c + 512 + 16 * r, _mm512_add_ps(_mm512_load_ps(c + 512 + 16 * r), b1));
    }
  }
  if (a->swiglu) {
    kn_silu_mul_n(c + 1024, c, c + 512, 16 * rows);
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(y + r * n, _mm512_load_ps(c + 1024 + 16 * r));
    return;
  }
  for (int r = 0; r < rows; r++) {
    _mm512_storeu_ps(y + r * n, _mm512_load_ps(c + 16 * r));
    if (cols > half) _mm512_storeu_ps(y + r * n + half, _mm512_load_ps(c + 512 + 16 * r));
  }
}

/* The tile's rows in blocks of 32 against its columns two groups at a time (swiglu: a
 * gate group and its up group, 16 columns of y). A row block meets every column block
 * before the next (its x in L1 while W streams from L2). */
static void mm_x16_amx_tile(const mm_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t kp = a->k / 2, gw = kp * KN_MM_X16_COLS, nb = kp / KN_MM_X16_TBLOCK;
  const int64_t rest = kp - nb * KN_MM_X16_TBLOCK;
  const int64_t step = a->swiglu ? KN_MM_X16_COLS : 2 * KN_MM_X16_COLS;
  const int64_t tw = 2 * KN_MM_X16_TBLOCK * KN_MM_X16_COLS; /* words of a block's tails */
  const uint32_t *w = (const uint32_t *)a->w;
  _Alignas(64) float c[32 * 48];
  /* the short blocks' W, zero-padded, per column block */
  uint32_t *tails = NULL;
  if (rest) {
    int64_t ncb = (j1 - j0 + step - 1) / step;
    tails = ir_malloc((size_t)(ncb * tw) * sizeof *tails);
    if (!tails) { /* no memory: no result */
      for (int64_t i = i0; i < i1; i++)
        for (int64_t j = j0; j < j1; j++) a->y[i * a->n + j] = NAN;
      return;
    }
    memset(tails, 0, (size_t)(ncb * tw) * sizeof *tails);
  }
  int cr0 = -1, cr1 = -1;
  for (int64_t i = i0; i < i1; i += 32) {
    int r0 = i1 - i < 16 ? (int)(i1 - i) : 16;
    int r1 = i1 - i - 16 <= 0 ? 0 : i1 - i - 16 < 16 ? (int)(i1 - i - 16) : 16;
    if (r0 != cr0 || r1 != cr1) mm_amx_setup(r0, r1), cr0 = r0, cr1 = r1;
    for (int64_t j = j0, cb = 0; j < j1; j += step, cb++) {
      const int64_t grp = j / KN_MM_X16_COLS, cols = j1 - j < step ? j1 - j : step;
      const uint32_t *wa = w + (grp - a->w_g0) * gw;
      const uint32_t *wb = a->swiglu ? wa + a->up_g * gw : (cols > KN_MM_X16_COLS ? wa + gw : wa);
      uint32_t *tail = rest ? tails + cb * tw : NULL;
      if (tail && i == i0) {
        memcpy(tail, wa + nb * KN_MM_X16_TBLOCK * KN_MM_X16_COLS, (size_t)rest * 64);
        memcpy(tail + tw / 2, wb + nb * KN_MM_X16_TBLOCK * KN_MM_X16_COLS, (size_t)rest * 64);
      }
      mm_amx_block(a, i, r0, r1, j, cols, wa, wb, nb, tail, c);
    }
  }
  if (cr0 >= 0) mm_amx_release();
  ir_free(tails);
}
#endif

/* AMX-BF16 (cpuid 7.0 edx bit 22) with the tile state Linux grants (kn_cpu_has_amx). */
bool kn_cpu_has_amx_bf16(void) {
  static _Atomic int cached = -1; /* asked once: under a hypervisor cpuid is a VM exit */
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return v;
  v = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a, b, c, d;
  v = kn_cpu_has_amx() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & 1u << 22);
#endif
  atomic_store_explicit(&cached, v, memory_order_relaxed);
  return v;
}

static _Atomic int g_mm_x16_order = -1; /* -1: the CPU's */

int kn_matmul_set_x16_order(int order) {
  return atomic_exchange(&g_mm_x16_order, order < 0 ? -1 : order ? KN_X16_TILE : KN_X16_CHAIN);
}

int kn_matmul_x16_order(void) {
  int o = atomic_load_explicit(&g_mm_x16_order, memory_order_relaxed);
  if (o >= 0) return o;
  return kn_cpu_has_amx_bf16() ? KN_X16_TILE : KN_X16_CHAIN;
}

/* Whether the tile order's tiles run on AMX now (the order, the CPU, the cap). */
static bool mm_x16_amx(void) {
#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 3
  return kn_matmul_x16_order() == KN_X16_TILE && mm_isa() >= 3 && kn_cpu_has_amx_bf16() &&
         mm_cpu_has_bf16dp();
#else
  return false;
#endif
}

/* The kernels by rows (k[r]: r rows at a time, at most; k[r] for fewer rows than its best
 * takes a smaller entry), and how many rows the best takes. */
static const mm_x16_fn *mm_x16_pick(int *best) {
  int isa = mm_isa();
  if (kn_matmul_x16_order() == KN_X16_TILE) {
#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 2
    if (isa >= 2) return *best = 2, k_x16t_avx512;
#endif
    return *best = 2, k_x16t_c;
  }
#if KN_MM_X86
#if KN_MATMUL_MAX_ISA >= 2
  if (kn_matmul_bf16dp()) return *best = 6, k_x16_dp;
  if (isa >= 2) return *best = 3, k_x16_avx512;
#endif
  if (isa >= 1) return *best = 2, k_x16_avx2;
#endif
  (void)isa;
  return *best = 2, k_x16_c;
}

/* Rows [i0, i1) (at most KN_MM_M_TILE) against columns [j0, j1) (multiples of 16 but
 * for n's end, n itself a multiple of 16): a call takes 4 groups (64 columns), or with
 * swiglu 2 gate groups and their 2 up groups (32 columns); missing groups repeat the last
 * one, their outputs dropped. Every row of the tile goes through one k block of the groups
 * before the next block (KN_MM_X16_KB pairs), the partial sums waiting in z. (SmolLM2 at
 * 512 tokens on 2 Zen 4 cores: blocks of 32 or 144 pairs, in L1, were 10% slower than
 * whole rows of 288, and 256-pair blocks of 288-pair rows 4% slower than whole rows; 1024
 * bounds the block of the long rows of larger models.) */
static void mm_x16_tile(const mm_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  int best;
  const mm_x16_fn *fns = mm_x16_pick(&best);
  const int64_t kp = a->k / 2, gw = kp * KN_MM_X16_COLS; /* words of a W group */
  const uint32_t *w = (const uint32_t *)a->w;
  const int ng = a->swiglu ? KN_MM_X16_GROUPS / 2 : KN_MM_X16_GROUPS; /* output groups */
  _Alignas(64) float z[KN_MM_M_TILE * 64];
  for (int64_t j = j0; j < j1; j += ng * KN_MM_X16_COLS) {
    int64_t cols = j1 - j < ng * KN_MM_X16_COLS ? j1 - j : ng * KN_MM_X16_COLS;
    int have = (int)((cols + KN_MM_X16_COLS - 1) / KN_MM_X16_COLS);
    const uint32_t *wg[KN_MM_X16_GROUPS];
    for (int g = 0; g < ng; g++) {
      int64_t grp = j / KN_MM_X16_COLS + (g < have ? g : have - 1);
      wg[g] = w + (grp - a->w_g0) * gw;
      if (a->swiglu) wg[ng + g] = wg[g] + a->up_g * gw;
    }
    memset(z, 0, (size_t)(i1 - i0) * 64 * sizeof *z);
    for (int64_t p0 = 0; p0 < kp; p0 += KN_MM_X16_KB) {
      int64_t pn = kp - p0 < KN_MM_X16_KB ? kp - p0 : KN_MM_X16_KB;
      const uint32_t *wk[KN_MM_X16_GROUPS];
      for (int g = 0; g < KN_MM_X16_GROUPS; g++) wk[g] = wg[g] + p0 * KN_MM_X16_COLS;
      for (int64_t i = i0; i < i1;) {
        int mr = i1 - i < best ? (int)(i1 - i) : best;
        const uint32_t *xr[KN_MM_X16_MAX_R];
        for (int r = 0; r < mr; r++) xr[r] = (const uint32_t *)a->x + (i + r) * a->x_stride + p0;
        fns[mr](xr, wk, pn, z + (i - i0) * 64);
        i += mr;
      }
    }
    const float *b = a->bias;
    for (int64_t i = i0; i < i1; i++) {
      float *y = a->y + i * a->n + j, *o = z + (i - i0) * 64;
      if (!a->swiglu) {
        for (int64_t c = 0; c < cols; c++) y[c] = b ? o[c] + b[j + c] : o[c];
        continue;
      }
      float *u = o + ng * KN_MM_X16_COLS; /* the up values, 32 columns on */
      if (b)
        for (int64_t c = 0; c < cols; c++) o[c] += b[j + c], u[c] += b[a->n + j + c];
      kn_silu_mul_n(y, o, u, cols);
    }
  }
}

static int64_t mm_round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

/* Rows [i0, i1) against a tile of bf16x16 groups (at a->w, group a->w_g0 first). */
static void mm_x16_rows(const mm_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 3
  if (a->amx) {
    mm_x16_amx_tile(a, i0, i1, j0, j1);
    return;
  }
#endif
  for (int64_t i = i0; i < i1; i += KN_MM_M_TILE) /* (mm_x16_tile's z holds that many) */
    mm_x16_tile(a, i, i1 - i < KN_MM_M_TILE ? i1 : i + KN_MM_M_TILE, j0, j1);
}

/* Block W: the tile's columns (and with swiglu their up rows) converted to bf16x16 groups
 * in buf (a->tiles.nb columns' worth, twice with swiglu), then summed as bf16 W. */
static void mm_q16_tile(const mm_args *a, uint32_t *buf, int64_t i0, int64_t i1, int64_t j0,
                        int64_t j1) {
  const int64_t gw = a->k / 2 * KN_MM_X16_COLS, g0 = j0 / KN_MM_X16_COLS;
  const int64_t ng = (j1 - j0 + KN_MM_X16_COLS - 1) / KN_MM_X16_COLS;
  for (int h = 0; h < (a->swiglu ? 2 : 1); h++)
    for (int64_t g = 0; g < ng; g++)
      kn_x16_dequant(a->qw, a->qt, a->k, g0 + g + h * (a->n / KN_MM_X16_COLS),
                     buf + (g + h * ng) * gw);
  mm_args c = *a;
  c.w = (const char *)buf, c.w_g0 = g0, c.up_g = ng;
  mm_x16_rows(&c, i0, i1, j0, j1);
}

static void mm_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const mm_args *a = arg;
  uint32_t *buf = NULL;
  if (a->qt) {
    int64_t cols = mm_round_up(a->tiles.nb, KN_MM_X16_COLS);
    buf = ir_malloc((size_t)(cols * (a->swiglu ? 2 : 1) * a->k / 2) * sizeof *buf + 64);
  }
  for (int64_t t = begin; t < end; t++) {
    int64_t i0, i1, j0, j1;
    kn_mm_tile_bounds(&a->tiles, t, &i0, &i1, &j0, &j1);
    if (a->qt) {
      if (buf) mm_q16_tile(a, (uint32_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63), i0, i1, j0, j1);
      else /* no memory: no result */
        for (int64_t i = i0; i < i1; i++)
          for (int64_t j = j0; j < j1; j++) a->y[i * a->n + j] = NAN;
      continue;
    }
    if (a->x16) mm_x16_rows(a, i0, i1, j0, j1);
    else mm_tile(a, i0, i1, j0, j1);
  }
  ir_free(buf);
}

kn_mm_tiles kn_mm_tiles_plan(int64_t m, int64_t n, int64_t col_bytes, int n_threads, int align) {
  return kn_mm_tiles_plan_m(m, n, col_bytes, n_threads, align, KN_MM_M_TILE);
}

kn_mm_tiles kn_mm_tiles_plan_m(int64_t m, int64_t n, int64_t col_bytes, int n_threads, int align,
                               int64_t m_tile) {
  kn_mm_tiles t = {.m = m, .n = n};
  if (align < KN_MM_TILE_ALIGN) align = KN_MM_TILE_ALIGN;
  int64_t nb = KN_MM_W_TILE_BYTES / (col_bytes > 0 ? col_bytes : 1);
  nb = nb / align * align;
  if (nb < align) nb = align;
  t.mb = m < m_tile ? m : m_tile;
  if (t.mb < 1) t.mb = 1;
  int64_t m_tiles = (m + t.mb - 1) / t.mb;
  int64_t want = (int64_t)n_threads * KN_MM_TASKS_PER_THREAD;
  if (n_threads > 1 && m_tiles * ((n + nb - 1) / nb) < want) {
    int64_t per = mm_round_up((n * m_tiles + want - 1) / want, align);
    nb = per < nb ? per : nb;
  }
  t.nb = nb;
  t.n_tiles = (n + nb - 1) / nb;
  t.n_tasks = t.n_tiles * m_tiles;
  return t;
}

void kn_mm_tile_bounds(const kn_mm_tiles *t, int64_t task, int64_t *i0, int64_t *i1, int64_t *j0,
                       int64_t *j1) {
  *i0 = task / t->n_tiles * t->mb;
  *j0 = task % t->n_tiles * t->nb;
  *i1 = *i0 + t->mb < t->m ? *i0 + t->mb : t->m;
  *j1 = *j0 + t->nb < t->n ? *j0 + t->nb : t->n;
}

/* Enough x rows against a non-f32 W (the ISA's min_m / min_m_q) take the panel path when
 * a panel of one kernel width fits the stack buffer; panels aim at KN_MM_PANEL_BYTES. */
static void mm_choose_panel(mm_args *a, ir_dtype wt) {
  const mm_panel_kernels *pk = mm_pick_panel();
  if (wt == IR_F32 || a->m < (ir_dtype_is_quant(wt) ? pk->min_m_q : pk->min_m) || a->k <= 0) return;
  int64_t cb = mm_cols(a, pk->nr), rows_per_col = a->swiglu ? 2 : 1;
  int64_t col_floats = rows_per_col * a->k;
  if (cb * col_floats > KN_MM_PANEL_FLOATS) return;
  int64_t cols = KN_MM_PANEL_BYTES / (col_floats * (int64_t)sizeof(float));
  cols = cols / cb * cb;
  if (cols < cb) cols = cb;
  if (cols > KN_MM_PANEL_MAX_COLS) cols = KN_MM_PANEL_MAX_COLS / cb * cb;
  a->panel = pk;
  a->deq = pk->deq[mm_dtype_index(wt)];
  a->panel_cols = cols;
}

static void mm_run(kn_pool *p, mm_args *a) {
  if (a->m <= 0 || a->n <= 0) return;
  /* x16: whole kernel calls a tile (4 groups; with swiglu 2 gate groups and their up
   * groups); tiles of 16-column multiples had left calls three quarters idle */
  int align = a->x16 ? KN_MM_X16_COLS * (a->swiglu ? 2 : 4) : KN_MM_TILE_ALIGN;
  a->tiles = kn_mm_tiles_plan_m(a->m, a->n, a->w_row_bytes * (a->swiglu ? 2 : 1),
                                kn_pool_threads(p), align, a->m_tile ? a->m_tile : KN_MM_M_TILE);
  int64_t tasks = a->tiles.n_tasks;
  int64_t flops = 2 * a->m * a->n * a->k * (a->swiglu ? 2 : 1);
  kn_parallel_for(p, tasks, flops < KN_MM_SERIAL_FLOPS ? tasks : 1, mm_task, a);
}

/* One x row as bf16 pairs, with the CPU's conversion where it has one. */
static void mm_bf16_convert(const float *x, int64_t k, uint32_t *out) {
#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 2
  if (kn_matmul_bf16dp()) {
    mm_bf16_row_dp(x, k, out);
    return;
  }
#endif
  mm_bf16_row(x, k, out);
}

/* Where word p of converted row i of m goes in the tile blocks AMX loads: rows in blocks
 * of 16 (the last one short: r rows), a block's rows kw words each, its k blocks (16 words
 * of each of its r rows) one after the other, so an A tile is 64 r contiguous bytes. */
static int64_t mm_xpack_at(int64_t i, int64_t p, int64_t m, int64_t kw) {
  const int64_t rb = i / 16, r = m - rb * 16 < 16 ? m - rb * 16 : 16;
  return rb * 16 * kw + (p / KN_MM_X16_TBLOCK) * r * KN_MM_X16_TBLOCK +
         (i % 16) * KN_MM_X16_TBLOCK + p % KN_MM_X16_TBLOCK;
}

#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 2
/* mm_bf16_row_dp into row i's tile blocks (mm_xpack_at), k's tail zero-padded. */
static MM_BF16DP void mm_bf16_row_pack_dp(const float *x, int64_t k, uint32_t *out, int64_t i,
                                          int64_t m) {
  const int64_t kw = mm_bf16_words(k);
  for (int64_t p = 0; p < kw; p += KN_MM_X16_TBLOCK) {
    const int64_t c = 2 * p; /* the first of 32 values */
    const __mmask16 lo = c + 16 <= k ? 0xffff : c >= k ? 0 : (__mmask16)((1u << (k - c)) - 1u);
    const __mmask16 hi = c + 32 <= k   ? 0xffff
                         : c + 16 >= k ? 0
                                       : (__mmask16)((1u << (k - c - 16)) - 1u);
    _mm512_store_si512(out + mm_xpack_at(i, p, m, kw),
                       (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + c + 16),
                                                    _mm512_maskz_loadu_ps(lo, x + c)));
  }
}
#endif

/* Row i of m (k values at x) as bf16 pairs into out: kw words in a row, or (pack, on AMX,
 * whose CPUs have AVX512-BF16: mm_x16_amx) in tile blocks. */
static void mm_bf16_convert_row(const float *x, int64_t k, uint32_t *out, int64_t i, int64_t m,
                                bool pack) {
  if (!pack) {
    mm_bf16_convert(x, k, out + i * mm_bf16_words(k));
    return;
  }
#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 2
  mm_bf16_row_pack_dp(x, k, out, i, m);
#endif
}

/* Rows [begin, end) of x as bf16 pairs (a->amx: in tile blocks). */
static void mm_bf16_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const mm_args *a = arg;
  for (int64_t i = begin; i < end; i++)
    mm_bf16_convert_row(a->x + i * a->k, a->k, (uint32_t *)a->y, i, a->m, a->amx);
}

/* bf16 W: x rounded to bf16 pairs once, not once per tile a row meets; a few rows on the
 * stack, more on the heap in parallel, or (without memory) a few rows at a time. */
static void mm_run_bf16(kn_pool *p, mm_args *a) {
  const int64_t kw = mm_bf16_words(a->k), rows = KN_MM_BF16_STACK_WORDS / kw;
  _Alignas(64) uint32_t stack[KN_MM_BF16_STACK_WORDS];
  /* (64 bytes more, to start the rows on a cache line: a tile row, or a vector, that
   * straddles two lines costs two loads) */
  uint32_t *heap = rows >= a->m ? NULL : ir_malloc((size_t)(a->m * kw) * sizeof *heap + 64);
  mm_args c = *a;
  c.x_stride = kw;
  if (heap) {
    uint32_t *rows0 = (uint32_t *)(((uintptr_t)heap + 63) & ~(uintptr_t)63);
    mm_args conv = {.y = (float *)rows0, .x = a->x, .k = a->k, .m = a->m, .amx = a->amx};
    kn_parallel_for(p, a->m, 1 + KN_MM_BF16_GRAIN / a->k, mm_bf16_task, &conv);
    c.x = (const float *)rows0;
    mm_run(p, &c);
    ir_free(heap);
    return;
  }
  if (rows < 1) { /* a row longer than the stack buffer and no memory: no result */
    for (int64_t i = 0; i < a->m * a->n; i++) a->y[i] = NAN;
    return;
  }
  for (int64_t i0 = 0; i0 < a->m; i0 += rows) {
    c.m = a->m - i0 < rows ? a->m - i0 : rows;
    for (int64_t i = 0; i < c.m; i++)
      mm_bf16_convert_row(a->x + (i0 + i) * a->k, a->k, stack, i, c.m, a->amx);
    c.x = (const float *)stack;
    c.y = a->y + i0 * a->n;
    mm_run(p, &c);
  }
}

static void mm_start(kn_pool *p, mm_args *a, ir_dtype wt) {
  a->x_stride = a->k;
  a->w_row_bytes = (int64_t)ir_dtype_bytes(wt, (uint64_t)a->k);
  a->kern = mm_pick(wt);
  mm_choose_panel(a, wt);
  mm_run(p, a);
}

void kn_matmul(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt, const float *bias,
               int64_t m, int64_t n, int64_t k) {
  mm_args a = {.y = y, .x = x, .w = w, .bias = bias, .m = m, .n = n, .k = k};
  mm_start(p, &a, wt);
}

void kn_matmul_swiglu(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt,
                      const float *bias, int64_t m, int64_t n, int64_t k) {
  mm_args a = {.y = y, .x = x, .w = w, .bias = bias, .m = m, .n = n, .k = k, .swiglu = true};
  mm_start(p, &a, wt);
}

/* y of a matmul with nothing to sum (k = 0): the bias (swiglu: of gate and up), as
 * kn_matmul gives it. */
static void mm_bf16_empty(kn_pool *p, float *y, const float *x, const void *w, const float *bias,
                          int64_t m, int64_t n, bool swiglu) {
  if (swiglu) kn_matmul_swiglu(p, y, x, w, IR_BF16, bias, m, n, 0);
  else kn_matmul(p, y, x, w, IR_BF16, bias, m, n, 0);
}

void kn_matmul_bf16x(kn_pool *p, float *y, const float *x, const uint16_t *w, const float *bias,
                     int64_t m, int64_t n, int64_t k, bool swiglu) {
  mm_args a = {.y = y,
               .x = x,
               .w = (const char *)w,
               .bias = bias,
               .m = m,
               .n = n,
               .k = k,
               .swiglu = swiglu,
               .w_row_bytes = k * 2,
               .kern = mm_pick_bf16x()};
  if (k == 0) mm_bf16_empty(p, y, x, w, bias, m, n, swiglu);
  else if (m > 0 && n > 0 && k > 0) mm_run_bf16(p, &a);
}

/* The arguments of a matmul on the bf16x16 paths (x as bf16 pairs; the tiles cut for a
 * column's k * 2 bytes of bf16 W); the caller says where W is. */
static mm_args mm_x16_args(float *y, const float *x, const float *bias, int64_t m, int64_t n,
                           int64_t k, bool swiglu) {
  return (mm_args){.y = y,
                   .x = x,
                   .bias = bias,
                   .m = m,
                   .n = n,
                   .k = k,
                   .swiglu = swiglu,
                   .x16 = true,
                   .amx = mm_x16_amx(),
                   .up_g = n / KN_MM_X16_COLS,
                   .w_row_bytes = k * 2};
}

void kn_matmul_bf16x16(kn_pool *p, float *y, const float *x, const void *w, const float *bias,
                       int64_t m, int64_t n, int64_t k, bool swiglu) {
  if (n % KN_MM_X16_COLS || k % 2 || k < 0) { /* (the IR refuses these) */
    for (int64_t i = 0; i < m * n; i++) y[i] = NAN;
    return;
  }
  if (k == 0) {
    mm_bf16_empty(p, y, x, w, bias, m, n, swiglu);
    return;
  }
  mm_args a = mm_x16_args(y, x, bias, m, n, k, swiglu);
  a.w = (const char *)w;
  /* AMX: a W tile (in L2) serves up to 512 rows, so a prefill streams W from memory once;
   * tiles of 64 rows had read it 8 times for 512, which bound Qwen3-0.6B's prefill */
  if (a.amx) a.m_tile = KN_MM_Q16_M_TILE;
  if (m > 0 && n > 0 && k > 0) mm_run_bf16(p, &a);
}

void kn_matmul_bf16q(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt,
                     const float *bias, int64_t m, int64_t n, int64_t k, bool swiglu) {
  if (!ir_dtype_is_blocks(wt) || n % KN_MM_X16_COLS || k % 32 || k <= 0 ||
      (ir_dtype_is_x8(wt) && n % 8)) { /* (the IR refuses these) */
    for (int64_t i = 0; i < m * n; i++) y[i] = NAN;
    return;
  }
  /* (the tiles are cut for a column's converted bytes, to keep in L2) */
  mm_args a = mm_x16_args(y, x, bias, m, n, k, swiglu);
  a.qt = wt, a.qw = w, a.m_tile = KN_MM_Q16_M_TILE;
  if (m > 0 && n > 0) mm_run_bf16(p, &a);
}
