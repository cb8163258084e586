/* kn_nd_reduce: reductions over any set of axes, argmax/argmin, softmax / log_softmax /
 * hardmax and cumsum. Sums accumulate in double in index order, so a result depends only
 * on its own inputs, never on the thread count. */
#include <math.h>

#include "kn_nd_util.h"

enum { KN_RED_MIN_WORK = 8192 };

/* [outer, n, inner] view of x around one axis (or, flat, around every axis from it on). */
static void split3(const kn_view *x, int axis, bool flat, int64_t *outer, int64_t *n,
                   int64_t *inner) {
  *outer = *n = *inner = 1;
  for (int i = 0; i < x->rank; i++) {
    if (i < axis) *outer *= x->shape[i];
    else if (i == axis || flat) *n *= x->shape[i];
    else *inner *= x->shape[i];
  }
}

/* --- reduce ---------------------------------------------------------------------------- */

typedef struct red_args {
  ir_op op;
  const float *x;
  float *y;
  int nk, nr;
  int64_t kshape[IR_MAX_RANK], kstride[IR_MAX_RANK]; /* kept dims of x */
  int64_t rshape[IR_MAX_RANK], rstride[IR_MAX_RANK]; /* reduced dims of x */
  int64_t rows, last, last_stride;                   /* reduced runs: count, length, step */
} red_args;

static int64_t odometer(const int64_t *shape, const int64_t *stride, int n, int64_t idx) {
  int64_t off = 0;
  for (int i = n - 1; i >= 0; i--) {
    off += (idx % shape[i]) * stride[i];
    idx /= shape[i];
  }
  return off;
}

/* Folds every reduced value at base into the accumulator of `op` (m: the max, for
 * log_sum_exp's second pass). */
static double red_fold(const red_args *a, int64_t base, ir_op op, double m) {
  double acc = op == IR_OP_ND_REDUCE_PROD  ? 1.0
               : op == IR_OP_ND_REDUCE_MAX ? -INFINITY
               : op == IR_OP_ND_REDUCE_MIN ? INFINITY
                                           : 0.0;
  for (int64_t r = 0; r < a->rows; r++) {
    const float *x = a->x + base + odometer(a->rshape, a->rstride, a->nr - 1, r);
    for (int64_t i = 0; i < a->last; i++) {
      double v = x[i * a->last_stride];
      switch (op) {
      case IR_OP_ND_REDUCE_MAX: acc = v > acc || v != v ? v : acc; break;
      case IR_OP_ND_REDUCE_MIN: acc = v < acc || v != v ? v : acc; break;
      case IR_OP_ND_REDUCE_PROD: acc *= v; break;
      case IR_OP_ND_REDUCE_L1: acc += fabs(v); break;
      case IR_OP_ND_REDUCE_L2:
      case IR_OP_ND_REDUCE_SUM_SQUARE: acc += v * v; break;
      case IR_OP_ND_REDUCE_LOG_SUM_EXP: acc += exp(v - m); break;
      default: acc += v; break;
      }
    }
  }
  return acc;
}

static float red_one(const red_args *a, int64_t base) {
  double count = (double)(a->rows * a->last);
  switch (a->op) {
  case IR_OP_ND_REDUCE_MEAN: return (float)(red_fold(a, base, a->op, 0) / count);
  case IR_OP_ND_REDUCE_L2: return (float)sqrt(red_fold(a, base, a->op, 0));
  case IR_OP_ND_REDUCE_LOG_SUM: return (float)log(red_fold(a, base, a->op, 0));
  case IR_OP_ND_REDUCE_LOG_SUM_EXP: {
    double m = red_fold(a, base, IR_OP_ND_REDUCE_MAX, 0);
    if (isinf(m)) return (float)m;
    return (float)(m + log(red_fold(a, base, a->op, m)));
  }
  default: return (float)red_fold(a, base, a->op, 0);
  }
}

static void red_task(void *arg, int64_t b, int64_t e, int tid) {
  const red_args *a = arg;
  for (int64_t o = b; o < e; o++) a->y[o] = red_one(a, odometer(a->kshape, a->kstride, a->nk, o));
}

void kn_nd_reduce(kn_pool *p, ir_op op, uint32_t axes, const kn_view *y, const kn_view *x) {
  red_args a = {.op = op, .x = x->data, .y = y->data, .rows = 1, .last = 1, .last_stride = 0};
  int64_t st[IR_MAX_RANK];
  kn_strides(x, st);
  for (int i = 0; i < x->rank; i++) {
    if (axes & (1u << i)) {
      a.rshape[a.nr] = x->shape[i];
      a.rstride[a.nr++] = st[i];
    } else {
      a.kshape[a.nk] = x->shape[i];
      a.kstride[a.nk++] = st[i];
    }
  }
  if (a.nr > 0) {
    a.last = a.rshape[a.nr - 1];
    a.last_stride = a.rstride[a.nr - 1];
    for (int i = 0; i < a.nr - 1; i++) a.rows *= a.rshape[i];
  }
  if (a.last == 0) a.rows = 0;
  int64_t per = a.rows * a.last;
  kn_parallel_for(p, kn_numel(y), kn_grain(per, KN_RED_MIN_WORK), red_task, &a);
}

/* --- argmax / argmin ------------------------------------------------------------------- */

typedef struct arg_args {
  const kn_view *x;
  int64_t *y;
  int64_t n, inner;
  bool is_max, last;
} arg_args;

static void arg_task(void *arg, int64_t b, int64_t e, int tid) {
  const arg_args *a = arg;
  for (int64_t o = b; o < e; o++) {
    int64_t base = (o / a->inner) * a->n * a->inner + o % a->inner, best = 0;
    double bv = kn_get_f64(a->x->data, a->x->dt, base);
    for (int64_t k = 1; k < a->n; k++) {
      double v = kn_get_f64(a->x->data, a->x->dt, base + k * a->inner);
      bool better = a->is_max ? (a->last ? v >= bv : v > bv) : (a->last ? v <= bv : v < bv);
      if (better) {
        bv = v;
        best = k;
      }
    }
    a->y[o] = best;
  }
}

void kn_nd_arg(kn_pool *p, bool is_max, int axis, bool select_last, const kn_view *y,
               const kn_view *x) {
  int64_t outer, n, inner;
  split3(x, axis, false, &outer, &n, &inner);
  arg_args a = {x, y->data, n, inner, is_max, select_last};
  kn_parallel_for(p, outer * inner, kn_grain(n, KN_RED_MIN_WORK), arg_task, &a);
}

/* --- softmax family -------------------------------------------------------------------- */

typedef struct sm_args {
  ir_op op;
  const float *x;
  float *y;
  int64_t n, inner;
} sm_args;

static void sm_lane(const sm_args *a, const float *x, float *y) {
  int64_t n = a->n, s = a->inner, arg = 0;
  float m = -INFINITY;
  for (int64_t i = 0; i < n; i++)
    if (x[i * s] > m) {
      m = x[i * s];
      arg = i;
    }
  if (a->op == IR_OP_ND_HARDMAX) {
    for (int64_t i = 0; i < n; i++) y[i * s] = i == arg ? 1.0f : 0.0f;
    return;
  }
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += exp((double)x[i * s] - m);
  if (a->op == IR_OP_ND_LOG_SOFTMAX) {
    float ls = (float)log(sum);
    for (int64_t i = 0; i < n; i++) y[i * s] = x[i * s] - m - ls;
  } else {
    for (int64_t i = 0; i < n; i++) y[i * s] = (float)(exp((double)x[i * s] - m) / sum);
  }
}

static void sm_task(void *arg, int64_t b, int64_t e, int tid) {
  const sm_args *a = arg;
  for (int64_t l = b; l < e; l++) {
    int64_t off = (l / a->inner) * a->n * a->inner + l % a->inner;
    sm_lane(a, a->x + off, a->y + off);
  }
}

void kn_nd_softmax(kn_pool *p, ir_op op, int axis, bool flat, const kn_view *y, const kn_view *x) {
  int64_t outer, n, inner;
  split3(x, axis, flat, &outer, &n, &inner);
  sm_args a = {op, x->data, y->data, n, inner};
  kn_parallel_for(p, outer * inner, kn_grain(n, KN_RED_MIN_WORK), sm_task, &a);
}

/* --- cumsum ---------------------------------------------------------------------------- */

typedef struct cs_args {
  const kn_view *x, *y;
  int64_t n, inner;
  bool excl, rev;
} cs_args;

static void cs_task(void *arg, int64_t b, int64_t e, int tid) {
  const cs_args *a = arg;
  bool fl = a->x->dt == IR_F32;
  for (int64_t l = b; l < e; l++) {
    int64_t base = (l / a->inner) * a->n * a->inner + l % a->inner;
    double fs = 0;
    int64_t is = 0;
    for (int64_t k = 0; k < a->n; k++) {
      int64_t i = base + (a->rev ? a->n - 1 - k : k) * a->inner;
      double fv = fl ? ((const float *)a->x->data)[i] : 0;
      int64_t iv = fl ? 0 : kn_get_i64(a->x->data, a->x->dt, i);
      if (!a->excl) fs += fv, is = (int64_t)((uint64_t)is + (uint64_t)iv);
      if (fl) ((float *)a->y->data)[i] = (float)fs;
      else kn_set_i64(a->y->data, a->y->dt, i, is);
      if (a->excl) fs += fv, is = (int64_t)((uint64_t)is + (uint64_t)iv);
    }
  }
}

void kn_nd_cumsum(kn_pool *p, int axis, bool exclusive, bool reverse, const kn_view *y,
                  const kn_view *x) {
  int64_t outer, n, inner;
  split3(x, axis, false, &outer, &n, &inner);
  cs_args a = {x, y, n, inner, exclusive, reverse};
  kn_parallel_for(p, outer * inner, kn_grain(n, KN_RED_MIN_WORK), cs_task, &a);
}
