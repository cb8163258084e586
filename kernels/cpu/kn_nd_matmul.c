/* kn_nd_matmul: numpy-style batched matmul with broadcast batch dims, and gemm. One
 * output row per task: the row's k-reduction order is fixed (k ascending), so results do
 * not depend on the thread count. The inner loop runs along the output row (vectorised);
 * LLM projections with constant weights take the fused matmul op instead. */
#include "kn_nd_util.h"

enum { KN_MM_MIN_WORK = 16384 };

typedef struct mm_args {
  const float *a, *b;
  float *y;
  int64_t m, k, n;
  /* batch: output batch index -> a and b matrix offsets */
  int nb;
  int64_t bshape[IR_MAX_RANK], astride[IR_MAX_RANK], bstride[IR_MAX_RANK];
  /* gemm */
  float alpha, beta;
  bool ta, tb;
  const float *c; /* NULL: no c */
  int64_t c_row, c_col;
} mm_args;

/* y_row[0..n) = sum_k a_row[k * sa] * b[k * sbk + j * sbn]; sbn is 1 for the fast path. */
static void mm_row(float *restrict y, const float *restrict a, int64_t sa, const float *restrict b,
                   int64_t sbk, int64_t sbn, int64_t k, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = 0.0f;
  if (sbn == 1) {
    for (int64_t kk = 0; kk < k; kk++) {
      const float av = a[kk * sa], *br = b + kk * sbk;
      for (int64_t j = 0; j < n; j++) y[j] += av * br[j];
    }
    return;
  }
  for (int64_t j = 0; j < n; j++) { /* b transposed: dot products */
    float s = 0.0f;
    for (int64_t kk = 0; kk < k; kk++) s += a[kk * sa] * b[kk * sbk + j * sbn];
    y[j] = s;
  }
}

static void mm_task(void *arg, int64_t b, int64_t e, int tid) {
  const mm_args *x = arg;
  for (int64_t r = b; r < e; r++) {
    int64_t bi = r / x->m, i = r % x->m, ao = 0, bo = 0;
    for (int d = x->nb - 1; d >= 0; d--) {
      int64_t idx = bi % x->bshape[d];
      bi /= x->bshape[d];
      ao += idx * x->astride[d];
      bo += idx * x->bstride[d];
    }
    mm_row(x->y + r * x->n, x->a + ao + i * x->k, 1, x->b + bo, x->n, 1, x->k, x->n);
  }
}

/* Batch strides of operand v (matrix dims excluded) against the output's batch dims. */
static void batch_strides(const kn_view *v, int vm, int nb, int64_t *out) {
  int vb = v->rank - vm; /* v's batch dims */
  int64_t s = 1;
  for (int i = v->rank - 1; i >= vb; i--) s *= v->shape[i];
  for (int d = nb - 1, i = vb - 1; d >= 0; d--, i--) {
    out[d] = i >= 0 && v->shape[i] != 1 ? s : 0;
    if (i >= 0) s *= v->shape[i];
  }
}

void kn_nd_matmul(kn_pool *p, const kn_view *y, const kn_view *a, const kn_view *b) {
  mm_args x = {.a = a->data, .b = b->data, .y = y->data};
  x.m = a->rank == 1 ? 1 : a->shape[a->rank - 2];
  x.k = a->shape[a->rank - 1];
  x.n = b->rank == 1 ? 1 : b->shape[b->rank - 1];
  int am = a->rank == 1 ? 1 : 2, bm = b->rank == 1 ? 1 : 2;
  int ab = a->rank - am, bb = b->rank - bm;
  x.nb = ab > bb ? ab : bb;
  int64_t batches = 1;
  for (int d = 0; d < x.nb; d++) {
    int ia = d - (x.nb - ab), ib = d - (x.nb - bb);
    int64_t ea = ia >= 0 ? a->shape[ia] : 1, eb = ib >= 0 ? b->shape[ib] : 1;
    x.bshape[d] = ea == 1 ? eb : ea;
    batches *= x.bshape[d];
  }
  batch_strides(a, am, x.nb, x.astride);
  batch_strides(b, bm, x.nb, x.bstride);
  kn_parallel_for(p, batches * x.m, kn_grain(x.n * x.k, KN_MM_MIN_WORK), mm_task, &x);
}

static void gemm_task(void *arg, int64_t b, int64_t e, int tid) {
  const mm_args *x = arg;
  /* a element (i, kk): trans_a ? a[kk, i] : a[i, kk]; b element (kk, j) likewise. */
  int64_t sa = x->ta ? x->m : 1, sbk = x->tb ? 1 : x->n, sbn = x->tb ? x->k : 1;
  for (int64_t i = b; i < e; i++) {
    float *y = x->y + i * x->n;
    mm_row(y, x->a + (x->ta ? i : i * x->k), sa, x->b, sbk, sbn, x->k, x->n);
    const float *c = x->c ? x->c + i * x->c_row : NULL;
    for (int64_t j = 0; j < x->n; j++)
      y[j] = x->alpha * y[j] + (c ? x->beta * c[j * x->c_col] : 0.0f);
  }
}

void kn_nd_gemm(kn_pool *p, const kn_view *y, const kn_view *a, const kn_view *b, const kn_view *c,
                float alpha, float beta, bool trans_a, bool trans_b) {
  mm_args x = {.a = a->data,
               .b = b->data,
               .y = y->data,
               .alpha = alpha,
               .beta = beta,
               .ta = trans_a,
               .tb = trans_b,
               .c = c && c->data ? c->data : NULL};
  x.m = y->shape[0];
  x.n = y->shape[1];
  x.k = trans_a ? a->shape[0] : a->shape[1];
  if (x.c && c->rank == 2) { /* c broadcasts to [m, n]: 0 strides along extent-1 dims */
    x.c_row = c->shape[0] != 1 ? c->shape[1] : 0;
    x.c_col = c->shape[1] != 1 ? 1 : 0;
  } else if (x.c && c->rank == 1) {
    x.c_col = c->shape[0] != 1 ? 1 : 0;
  }
  kn_parallel_for(p, x.m, kn_grain(x.n * x.k, KN_MM_MIN_WORK), gemm_task, &x);
}
