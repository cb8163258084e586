/* kn_nd_norm: layer_norm and rms_norm over the trailing axes from `axis`, and the
 * com.microsoft skip_layer_norm. Statistics accumulate in double over one row in index
 * order; scale and bias broadcast to the normalised dims. */
#include <math.h>

#include "kn_nd_util.h"

enum { KN_LN_MIN_WORK = 16384 };

/* Element strides of a scale/bias operand over the normalised dims [axis, rank) of x,
 * flattened to one run when it covers them densely. */
typedef struct bvec {
  const float *p;
  int nr;
  int64_t shape[IR_MAX_RANK], st[IR_MAX_RANK];
  bool dense, scalar;
} bvec;

static void bvec_init(bvec *v, const kn_view *t, const kn_view *x, int axis) {
  v->p = t && t->data ? t->data : NULL;
  if (!v->p) return;
  int64_t full[IR_MAX_RANK];
  kn_strides(t, full);
  v->nr = x->rank - axis;
  int off = v->nr - t->rank;
  int64_t cols = 1;
  for (int i = 0; i < v->nr; i++) {
    v->shape[i] = x->shape[axis + i];
    v->st[i] = i < off || t->shape[i - off] == 1 ? 0 : full[i - off];
    cols *= v->shape[i];
  }
  v->dense = kn_numel(t) == cols;
  v->scalar = kn_numel(t) == 1;
}

static float bvec_at(const bvec *v, int64_t j) {
  if (v->dense) return v->p[j];
  if (v->scalar) return v->p[0];
  int64_t off = 0;
  for (int i = v->nr - 1; i >= 0; i--) {
    off += (j % v->shape[i]) * v->st[i];
    j /= v->shape[i];
  }
  return v->p[off];
}

typedef struct ln_args {
  const float *x, *skip, *bias;
  float *y, *mean, *inv, *sum;
  bvec scale, shift;
  int64_t cols, skip_rows; /* skip: rows it holds (broadcast over the rest) */
  float eps;
  bool rms;
} ln_args;

static void ln_row(const ln_args *a, int64_t r) {
  const float *x = a->x + r * a->cols;
  if (a->skip) { /* skip_layer_norm: sum = x + skip + bias, normalised from there */
    float *s = a->sum + r * a->cols;
    const float *k = a->skip + (r % a->skip_rows) * a->cols;
    for (int64_t j = 0; j < a->cols; j++) s[j] = x[j] + k[j] + (a->bias ? a->bias[j] : 0.0f);
    x = s;
  }
  double s1 = 0, s2 = 0;
  for (int64_t j = 0; j < a->cols; j++) s1 += x[j];
  double mu = a->rms ? 0 : s1 / (double)a->cols;
  for (int64_t j = 0; j < a->cols; j++) s2 += ((double)x[j] - mu) * ((double)x[j] - mu);
  float inv = (float)(1.0 / sqrt(s2 / (double)a->cols + a->eps));
  float *y = a->y + r * a->cols;
  for (int64_t j = 0; j < a->cols; j++) {
    float v = (x[j] - (float)mu) * inv * bvec_at(&a->scale, j);
    y[j] = a->shift.p ? v + bvec_at(&a->shift, j) : v;
  }
  if (a->mean) a->mean[r] = (float)mu;
  if (a->inv) a->inv[r] = inv;
}

static void ln_task(void *arg, int64_t b, int64_t e, int tid) {
  for (int64_t r = b; r < e; r++) ln_row(arg, r);
}

static float *opt(const kn_view *v) { return v && v->data ? v->data : NULL; }

void kn_nd_layer_norm(kn_pool *p, const kn_view *y, const kn_view *mean, const kn_view *inv_std,
                      const kn_view *x, const kn_view *scale, const kn_view *bias, int axis,
                      float eps, bool rms) {
  ln_args a = {.x = x->data,
               .y = y->data,
               .mean = opt(mean),
               .inv = opt(inv_std),
               .eps = eps,
               .rms = rms,
               .cols = 1};
  for (int i = axis; i < x->rank; i++) a.cols *= x->shape[i];
  bvec_init(&a.scale, scale, x, axis);
  bvec_init(&a.shift, bias, x, axis);
  int64_t rows = a.cols ? kn_numel(x) / a.cols : 0;
  kn_parallel_for(p, rows, kn_grain(a.cols, KN_LN_MIN_WORK), ln_task, &a);
}

void kn_nd_skip_layer_norm(kn_pool *p, const kn_view *y, const kn_view *mean,
                           const kn_view *inv_std, const kn_view *sum, const kn_view *x,
                           const kn_view *skip, const kn_view *gamma, const kn_view *beta,
                           const kn_view *bias, float eps) {
  int axis = x->rank - 1;
  ln_args a = {.x = x->data,
               .skip = skip->data,
               .bias = opt(bias),
               .y = y->data,
               .mean = opt(mean),
               .inv = opt(inv_std),
               .sum = opt(sum),
               .eps = eps,
               .cols = x->shape[axis]};
  bvec_init(&a.scale, gamma, x, axis);
  bvec_init(&a.shift, beta, x, axis);
  a.skip_rows = a.cols ? kn_numel(skip) / a.cols : 1;
  if (a.skip_rows < 1) a.skip_rows = 1;
  int64_t rows = a.cols ? kn_numel(x) / a.cols : 0;
  /* The sum lands in the sum output, or in y (then normalised in place row by row). */
  if (!a.sum) a.sum = a.y;
  kn_parallel_for(p, rows, kn_grain(a.cols, KN_LN_MIN_WORK), ln_task, &a);
}
