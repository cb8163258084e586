/* kn_matmul: y = x . W^T + bias, cache-blocked and threaded over (m, n) output tiles.
 * x86-64 picks AVX-512 or AVX2+FMA kernels at run time (build with KN_MATMUL_MAX_ISA=0
 * or 1 to cap that); a portable C path covers everything else. */
#include <math.h>
#include <stdbool.h>

#include "kn_cpu.h"

/* Batch invariance rests on one rule: every y element is a single dot product in a
 * fixed order -- 16 lanes strided over k (lane l takes k-indices = l mod 16), folded
 * as (l, l+8), (l, l+4), (l, l+2), (0, 1), then the k % 16 tail added in order, then
 * the bias.  Tiles, kernel shapes, thread counts and m only decide which outputs are
 * computed together, never how one is summed.  The AVX2 and AVX-512 kernels follow
 * the same order with FMA, so they agree bit for bit. */
enum {
  KN_MM_LANES = 16,
  KN_MM_MAX_R = 4,               /* largest kernel shape: rows of x ... */
  KN_MM_MAX_C = 8,               /* ... and rows of W computed together */
  KN_MM_TILE_ALIGN = 8,          /* n tiles are multiples of every kernel's width */
  KN_MM_W_TILE_BYTES = 256 << 10, /* a W tile stays in L2 while x rows sweep over it */
  KN_MM_M_TILE = 64,
  KN_MM_TASKS_PER_THREAD = 4,
  KN_MM_SERIAL_FLOPS = 1 << 18,  /* below this, waking the pool costs more than it saves */
  KN_MM_KC = 256,                /* portable path: W values converted per stack chunk */
};

#ifndef KN_MATMUL_MAX_ISA
#define KN_MATMUL_MAX_ISA 2 /* 0 portable, 1 AVX2, 2 AVX-512 */
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && KN_MATMUL_MAX_ISA > 0
#define KN_MM_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define KN_MM_X86 0
#endif

/* Computes the mr x nr dot products of rows xr[r] with rows wr[c] into out[r * nr + c].
 * Row pointers may repeat (edge tiles); each output is still summed independently. */
typedef void (*mm_kern_fn)(const float *const *xr, const void *const *wr, int64_t k,
                           float *out);

typedef struct mm_kernels {
  int mr, nr;      /* the blocked kernel: mr rows of x against nr rows of W */
  mm_kern_fn block;
  int nr1;         /* the single-row kernel (decode, and m % mr leftovers) */
  mm_kern_fn row;
} mm_kernels;

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

/* f16/bf16 rows are widened a chunk at a time into a stack buffer so the multiply-add
 * loop stays a plain f32 loop the compiler vectorises. */
static inline const float *mm_w_chunk(const void *w, ir_dtype dt, int64_t i0, int64_t n,
                                      float *buf) {
  if (dt == IR_F32) return (const float *)w + i0;
  for (int64_t i = 0; i < n; i++) buf[i] = mm_w_scalar(w, dt, i0 + i);
  return buf;
}

static inline __attribute__((always_inline)) void
mm_body_c(const float *const *xr, const void *const *wr, int64_t k, float *out, ir_dtype dt,
          int mr, int nr) {
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

#define MM_INST_C(name, dt, mr, nr)                                                        \
  static void name(const float *const *xr, const void *const *wr, int64_t k, float *out) { \
    mm_body_c(xr, wr, k, out, dt, mr, nr);                                                 \
  }
MM_INST_C(mm_c_f32_2x2, IR_F32, 2, 2)
MM_INST_C(mm_c_f32_1x4, IR_F32, 1, 4)
MM_INST_C(mm_c_f16_2x2, IR_F16, 2, 2)
MM_INST_C(mm_c_f16_1x4, IR_F16, 1, 4)
MM_INST_C(mm_c_bf16_2x2, IR_BF16, 2, 2)
MM_INST_C(mm_c_bf16_1x4, IR_BF16, 1, 4)

static const mm_kernels k_mm_c[3] = {
    {2, 2, mm_c_f32_2x2, 4, mm_c_f32_1x4},
    {2, 2, mm_c_f16_2x2, 4, mm_c_f16_1x4},
    {2, 2, mm_c_bf16_2x2, 4, mm_c_bf16_1x4},
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

MM_AVX2_INLINE float mm_tail_fma(const float *x, const void *w, ir_dtype dt, int64_t i,
                                 int64_t k, float s) {
  for (; i < k; i++) s = fmaf(x[i], mm_w_scalar(w, dt, i), s);
  return s;
}

/* Lanes 0-7 live in lo, 8-15 in hi; lo + hi is the order's first fold. */
MM_AVX2_INLINE void mm_body_avx2(const float *const *xr, const void *const *wr, int64_t k,
                                 float *out, ir_dtype dt, int mr, int nr) {
  __m256 lo[KN_MM_MAX_R][KN_MM_MAX_C], hi[KN_MM_MAX_R][KN_MM_MAX_C];
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + KN_MM_LANES <= k; i += KN_MM_LANES)
    for (int c = 0; c < nr; c++) {
      __m256 wl = mm_w8_avx2(wr[c], i, dt), wh = mm_w8_avx2(wr[c], i + 8, dt);
      for (int r = 0; r < mr; r++) {
        lo[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[r] + i), wl, lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[r] + i + 8), wh, hi[r][c]);
      }
    }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++)
      out[r * nr + c] = mm_tail_fma(xr[r], wr[c], dt, i, k,
                                    mm_fold8_avx(_mm256_add_ps(lo[r][c], hi[r][c])));
}

#define MM_INST_AVX2(name, dt, mr, nr)                                                     \
  static MM_AVX2 void name(const float *const *xr, const void *const *wr, int64_t k,      \
                           float *out) {                                                   \
    mm_body_avx2(xr, wr, k, out, dt, mr, nr);                                              \
  }
MM_INST_AVX2(mm_avx2_f32_2x2, IR_F32, 2, 2)
MM_INST_AVX2(mm_avx2_f32_1x4, IR_F32, 1, 4)
MM_INST_AVX2(mm_avx2_f16_2x2, IR_F16, 2, 2)
MM_INST_AVX2(mm_avx2_f16_1x4, IR_F16, 1, 4)
MM_INST_AVX2(mm_avx2_bf16_2x2, IR_BF16, 2, 2)
MM_INST_AVX2(mm_avx2_bf16_1x4, IR_BF16, 1, 4)

static const mm_kernels k_mm_avx2[3] = {
    {2, 2, mm_avx2_f32_2x2, 4, mm_avx2_f32_1x4},
    {2, 2, mm_avx2_f16_2x2, 4, mm_avx2_f16_1x4},
    {2, 2, mm_avx2_bf16_2x2, 4, mm_avx2_bf16_1x4},
};
#endif

/* ---- x86: AVX-512F ---------------------------------------------------------------- */
#if KN_MM_X86 && KN_MATMUL_MAX_ISA >= 2
#define MM_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define MM_AVX512_INLINE                                                                   \
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
      __m512 wv = mm_w16_avx512(wr[c], i, dt);
      for (int r = 0; r < mr; r++)
        acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[r] + i), wv, acc[r][c]);
    }
  for (int r = 0; r < mr; r++)
    for (int c = 0; c < nr; c++)
      out[r * nr + c] = mm_tail_fma(xr[r], wr[c], dt, i, k, mm_fold16_avx512(acc[r][c]));
}

#define MM_INST_AVX512(name, dt, mr, nr)                                                   \
  static MM_AVX512 void name(const float *const *xr, const void *const *wr, int64_t k,    \
                             float *out) {                                                 \
    mm_body_avx512(xr, wr, k, out, dt, mr, nr);                                            \
  }
MM_INST_AVX512(mm_avx512_f32_4x4, IR_F32, 4, 4)
MM_INST_AVX512(mm_avx512_f32_1x8, IR_F32, 1, 8)
MM_INST_AVX512(mm_avx512_f16_4x4, IR_F16, 4, 4)
MM_INST_AVX512(mm_avx512_f16_1x8, IR_F16, 1, 8)
MM_INST_AVX512(mm_avx512_bf16_4x4, IR_BF16, 4, 4)
MM_INST_AVX512(mm_avx512_bf16_1x8, IR_BF16, 1, 8)

static const mm_kernels k_mm_avx512[3] = {
    {4, 4, mm_avx512_f32_4x4, 8, mm_avx512_f32_1x8},
    {4, 4, mm_avx512_f16_4x4, 8, mm_avx512_f16_1x8},
    {4, 4, mm_avx512_bf16_4x4, 8, mm_avx512_bf16_1x8},
};
#endif

/* ---- dispatch and tiling ---------------------------------------------------------- */

#if KN_MM_X86
/* Asked of cpuid directly: not every compiler's __builtin_cpu_supports knows "f16c". */
static bool mm_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

/* The choice depends only on the CPU, so it is the same for every call of a process. */
static const mm_kernels *mm_pick(ir_dtype wt) {
  int d = wt == IR_F32 ? 0 : wt == IR_F16 ? 1 : 2;
#if KN_MM_X86
  bool base = __builtin_cpu_supports("fma") && mm_has_f16c();
#if KN_MATMUL_MAX_ISA >= 2
  if (base && __builtin_cpu_supports("avx512f")) return &k_mm_avx512[d];
#endif
  if (base && __builtin_cpu_supports("avx2")) return &k_mm_avx2[d];
#endif
  return &k_mm_c[d];
}

typedef struct mm_args {
  float *y;
  const float *x;
  const char *w;
  const float *bias;
  int64_t m, n, k;
  int64_t w_row_bytes;
  int64_t mb, nb;  /* tile sizes */
  int64_t n_tiles; /* tiles along n; task t is m tile t / n_tiles, n tile t % n_tiles */
  const mm_kernels *kern;
} mm_args;

/* Runs one kernel call for rows [i0, i0 + mr) of x and [j0, j0 + nr) of W, clipped at
 * j1: missing W rows repeat row j0 and their outputs are dropped. */
static void mm_block(const mm_args *a, mm_kern_fn fn, int mr, int nr, int64_t i0, int64_t j0,
                     int64_t j1) {
  const float *xr[KN_MM_MAX_R] = {0};
  const void *wr[KN_MM_MAX_C] = {0};
  float acc[KN_MM_MAX_R * KN_MM_MAX_C];
  int64_t nv = j1 - j0 < nr ? j1 - j0 : nr;
  for (int r = 0; r < mr; r++) xr[r] = a->x + (i0 + r) * a->k;
  for (int c = 0; c < nr; c++) wr[c] = a->w + (j0 + (c < nv ? c : 0)) * a->w_row_bytes;
  fn(xr, wr, a->k, acc);
  for (int r = 0; r < mr; r++) {
    float *y = a->y + (i0 + r) * a->n + j0;
    for (int64_t c = 0; c < nv; c++)
      y[c] = a->bias ? acc[r * nr + c] + a->bias[j0 + c] : acc[r * nr + c];
  }
}

/* x rows sweep the tile in groups of mr (in L1) over W rows that stay in L2. */
static void mm_tile(const mm_args *a, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const mm_kernels *kn = a->kern;
  int64_t i = i0;
  for (; i + kn->mr <= i1; i += kn->mr)
    for (int64_t j = j0; j < j1; j += kn->nr) mm_block(a, kn->block, kn->mr, kn->nr, i, j, j1);
  for (; i < i1; i++)
    for (int64_t j = j0; j < j1; j += kn->nr1) mm_block(a, kn->row, 1, kn->nr1, i, j, j1);
}

static void mm_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const mm_args *a = arg;
  for (int64_t t = begin; t < end; t++) {
    int64_t i0 = t / a->n_tiles * a->mb, j0 = t % a->n_tiles * a->nb;
    int64_t i1 = i0 + a->mb < a->m ? i0 + a->mb : a->m;
    int64_t j1 = j0 + a->nb < a->n ? j0 + a->nb : a->n;
    mm_tile(a, i0, i1, j0, j1);
  }
}

static int64_t mm_round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

/* Tile sizes change only which outputs share a task, so they are free to follow the
 * cache and the thread count. */
static void mm_plan(mm_args *a, int n_threads) {
  int64_t nb = KN_MM_W_TILE_BYTES / (a->w_row_bytes > 0 ? a->w_row_bytes : 1);
  nb = nb / KN_MM_TILE_ALIGN * KN_MM_TILE_ALIGN;
  if (nb < KN_MM_TILE_ALIGN) nb = KN_MM_TILE_ALIGN;
  a->mb = a->m < KN_MM_M_TILE ? a->m : KN_MM_M_TILE;
  int64_t m_tiles = (a->m + a->mb - 1) / a->mb;
  int64_t want = (int64_t)n_threads * KN_MM_TASKS_PER_THREAD;
  if (n_threads > 1 && m_tiles * ((a->n + nb - 1) / nb) < want) {
    int64_t per = mm_round_up((a->n * m_tiles + want - 1) / want, KN_MM_TILE_ALIGN);
    nb = per < nb ? per : nb;
  }
  a->nb = nb;
  a->n_tiles = (a->n + nb - 1) / nb;
}

void kn_matmul(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt,
               const float *bias, int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0) return;
  mm_args a = {.y = y, .x = x, .w = w, .bias = bias, .m = m, .n = n, .k = k,
               .w_row_bytes = k * (wt == IR_F32 ? 4 : 2), .kern = mm_pick(wt)};
  mm_plan(&a, kn_pool_threads(p));
  int64_t tasks = a.n_tiles * ((m + a.mb - 1) / a.mb);
  int64_t flops = 2 * m * n * k;
  kn_parallel_for(p, tasks, flops < KN_MM_SERIAL_FLOPS ? tasks : 1, mm_task, &a);
}
