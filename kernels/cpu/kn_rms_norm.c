/* kn_rms_norm: RMSNorm and the fused residual-add + RMSNorm.  Operation order follows HF
 * (variance in f32, then x * rsqrt(var + eps), then * weight) so outputs match it closely. */
#include <math.h>

#include "kn_cpu.h"

/* One row is a few thousand values; a chunk of rows this size outweighs a pool wake. */
enum { KN_NORM_MIN_WORK = 16384, KN_NORM_LANES = 16 };

typedef struct norm_args {
  float *out;
  float *out_sum;
  const float *x; /* rms_norm input, or the first addend */
  const float *b; /* second addend; NULL for plain rms_norm */
  const float *w;
  int64_t dim;
  float eps;
} norm_args;

/* The row functions are compiled twice, for the baseline and for AVX-512 (the same C: the
 * compiler vectorizes the same operations wider, each lane's order unchanged, and C11
 * mode contracts no multiply-add), and picked at run time: the same bits either way. */
#define NORM_INLINE static inline __attribute__((always_inline))

/* Sixteen fixed lanes, folded in a fixed tree: vectorisable without -ffast-math, and
 * the order depends only on dim, so every row's result is reproducible. */
NORM_INLINE float norm_sum_squares(const float *restrict x, int64_t dim) {
  float acc[KN_NORM_LANES] = {0};
  int64_t i = 0;
  for (; i + KN_NORM_LANES <= dim; i += KN_NORM_LANES)
    for (int l = 0; l < KN_NORM_LANES; l++) acc[l] += x[i + l] * x[i + l];
  for (int w = KN_NORM_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) acc[l] += acc[l + w];
  float s = acc[0];
  for (; i < dim; i++) s += x[i] * x[i];
  return s;
}

/* out may alias x: each element is read before it is written. */
NORM_INLINE void norm_row_body(float *out, const float *x, const float *restrict w, int64_t dim,
                               float eps) {
  float var = norm_sum_squares(x, dim) / (float)dim;
  float inv = 1.0f / sqrtf(var + eps);
  for (int64_t i = 0; i < dim; i++) out[i] = w[i] * (x[i] * inv);
}

/* Rows [begin, end): out_sum = x + b first when b is set, then the norm of it (or of x). */
NORM_INLINE void norm_rows_body(const norm_args *a, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; r++) {
    int64_t o = r * a->dim;
    const float *src = a->x + o;
    if (a->b) { /* the sum lands in out_sum first, then is normalised from there */
      /* (in locals: through a's fields the compiler reloaded every pointer each element) */
      float *sum = a->out_sum + o;
      const float *xa = a->x + o, *xb = a->b + o;
      int64_t i = 0;
      for (; i + KN_NORM_LANES <= a->dim;
           i += KN_NORM_LANES) { /* (sum may be xa: read, then write) */
        float t[KN_NORM_LANES];
        for (int l = 0; l < KN_NORM_LANES; l++) t[l] = xa[i + l] + xb[i + l];
        for (int l = 0; l < KN_NORM_LANES; l++) sum[i + l] = t[l];
      }
      for (; i < a->dim; i++) sum[i] = xa[i] + xb[i];
      src = sum;
    }
    norm_row_body(a->out + o, src, a->w, a->dim, a->eps);
  }
}

static void norm_rows_base(const norm_args *a, int64_t begin, int64_t end) {
  norm_rows_body(a, begin, end);
}
static void norm_row_base(float *out, const float *x, const float *w, int64_t dim, float eps) {
  norm_row_body(out, x, w, dim, eps);
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define NORM_AVX512 __attribute__((target("avx512f,avx2")))
static NORM_AVX512 void norm_rows_avx512(const norm_args *a, int64_t begin, int64_t end) {
  norm_rows_body(a, begin, end);
}
static NORM_AVX512 void norm_row_avx512(float *out, const float *x, const float *w, int64_t dim,
                                        float eps) {
  norm_row_body(out, x, w, dim, eps);
}
#define NORM_WIDE (kn_cpu_isa() >= 2)
#else
#define NORM_WIDE 0
#define norm_rows_avx512 norm_rows_base
#define norm_row_avx512 norm_row_base
#endif

static void norm_row(float *out, const float *x, const float *w, int64_t dim, float eps) {
  if (NORM_WIDE) norm_row_avx512(out, x, w, dim, eps);
  else norm_row_base(out, x, w, dim, eps);
}

static void norm_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const norm_args *a = arg;
  if (NORM_WIDE) norm_rows_avx512(a, begin, end);
  else norm_rows_base(a, begin, end);
}

void kn_rms_norm_row(float *out, const float *x, const float *w, int64_t dim, float eps) {
  norm_row(out, x, w, dim, eps);
}

static int64_t norm_grain(int64_t dim) { return dim > 0 ? 1 + KN_NORM_MIN_WORK / dim : 1; }

void kn_rms_norm(kn_pool *p, float *out, const float *x, const float *w, int64_t n, int64_t dim,
                 float eps) {
  norm_args a = {.out = out, .x = x, .w = w, .dim = dim, .eps = eps};
  kn_parallel_for(p, n, norm_grain(dim), norm_task, &a);
}

void kn_add_rms_norm(kn_pool *p, float *out, float *out_sum, const float *a, const float *b,
                     const float *w, int64_t n, int64_t dim, float eps) {
  norm_args args = {.out = out, .out_sum = out_sum, .x = a, .b = b, .w = w, .dim = dim, .eps = eps};
  kn_parallel_for(p, n, norm_grain(dim), norm_task, &args);
}
