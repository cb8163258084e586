/* kn_nd_shape: data movement in any dtype (elements copied by size): copy, transpose,
 * concat, split, slice, expand, tile, pad, gather, gather_elements, trilu. Threaded over
 * output rows where the work can be large. */
#include <stdio.h>

#include "kn_nd_util.h"

enum { KN_MOVE_MIN_WORK = 32768 };

void kn_nd_copy(const kn_view *y, const kn_view *x) {
  size_t bytes = (size_t)kn_numel(y) * kn_esize(y->dt);
  if (bytes && y->data != x->data) memcpy(y->data, x->data, bytes);
}

/* Maps output rows to input element offsets through per-dim input strides `ist` of the
 * output's dims (the inner dim's stride is `ist[rank-1]`). */
typedef struct map_args {
  const kn_view *y, *x;
  int64_t ist[IR_MAX_RANK]; /* input element stride per output dim */
  int64_t base;             /* input offset of output element 0 */
} map_args;

static void map_task(void *arg, int64_t b, int64_t e, int tid) {
  const map_args *a = arg;
  const kn_view *y = a->y;
  int last = y->rank - 1;
  int64_t inner = y->shape[last], s = a->ist[last];
  size_t es = kn_esize(y->dt);
  const char *src = a->x->data;
  char *dst = y->data;
  for (int64_t r = b; r < e; r++) {
    int64_t off = a->base, rr = r;
    for (int d = last - 1; d >= 0; d--) {
      off += (rr % y->shape[d]) * a->ist[d];
      rr /= y->shape[d];
    }
    char *o = dst + (size_t)(r * inner) * es;
    if (s == 1) {
      memcpy(o, src + (size_t)off * es, (size_t)inner * es);
      continue;
    }
    for (int64_t i = 0; i < inner; i++)
      kn_copy_elem(o + (size_t)i * es, src + (size_t)(off + i * s) * es, es);
  }
}

static void run_map(kn_pool *p, map_args *a) {
  if (a->y->rank == 0) {
    kn_copy_elem(a->y->data, (const char *)a->x->data + (size_t)a->base * kn_esize(a->y->dt),
                 kn_esize(a->y->dt));
    return;
  }
  int64_t inner = a->y->shape[a->y->rank - 1], rows = inner ? kn_numel(a->y) / inner : 0;
  kn_parallel_for(p, rows, kn_grain(inner, KN_MOVE_MIN_WORK), map_task, a);
}

void kn_nd_transpose(kn_pool *p, const kn_view *y, const kn_view *x, const int64_t *perm) {
  int64_t st[IR_MAX_RANK];
  kn_strides(x, st);
  map_args a = {.y = y, .x = x};
  for (int i = 0; i < y->rank; i++) a.ist[i] = st[perm[i]];
  run_map(p, &a);
}

void kn_nd_slice(kn_pool *p, const kn_view *y, const kn_view *x, const int64_t *starts,
                 const int64_t *steps) {
  int64_t st[IR_MAX_RANK];
  kn_strides(x, st);
  map_args a = {.y = y, .x = x};
  for (int i = 0; i < y->rank; i++) {
    a.ist[i] = st[i] * steps[i];
    if (y->shape[i]) a.base += starts[i] * st[i];
  }
  if (kn_numel(y)) run_map(p, &a);
}

void kn_nd_expand(kn_pool *p, const kn_view *y, const kn_view *x) {
  int64_t st[IR_MAX_RANK];
  kn_strides(x, st);
  map_args a = {.y = y, .x = x};
  int off = y->rank - x->rank;
  for (int i = 0; i < y->rank; i++) a.ist[i] = i < off || x->shape[i - off] == 1 ? 0 : st[i - off];
  run_map(p, &a);
}

/* Concatenation and split move whole runs of `axis..` elements per outer index. */
void kn_nd_concat(const kn_view *y, const kn_view *xs, int n, int axis) {
  size_t es = kn_esize(y->dt);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; i++) outer *= y->shape[i];
  for (int i = axis + 1; i < y->rank; i++) inner *= y->shape[i];
  char *dst = y->data;
  for (int64_t o = 0; o < outer; o++)
    for (int k = 0; k < n; k++) {
      size_t run = (size_t)(xs[k].shape[axis] * inner) * es;
      if (run) memcpy(dst, (const char *)xs[k].data + (size_t)o * run, run);
      dst += run;
    }
}

void kn_nd_split(const kn_view *ys, int n, const kn_view *x, int axis) {
  size_t es = kn_esize(x->dt);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; i++) outer *= x->shape[i];
  for (int i = axis + 1; i < x->rank; i++) inner *= x->shape[i];
  const char *src = x->data;
  for (int64_t o = 0; o < outer; o++)
    for (int k = 0; k < n; k++) {
      size_t run = (size_t)(ys[k].shape[axis] * inner) * es;
      if (run && ys[k].data) memcpy((char *)ys[k].data + (size_t)o * run, src, run);
      src += run;
    }
}

/* Index of output coordinate j of a dim of extent n padded by `begin` in `mode`; -1 for
 * the constant value. */
static int64_t pad_src(int64_t j, int64_t begin, int64_t n, int mode) {
  int64_t s = j - begin;
  if (s >= 0 && s < n) return s;
  switch (mode) {
  case 1: /* reflect, without repeating the edge */
    while (s < 0 || s >= n) s = s < 0 ? -s : 2 * (n - 1) - s;
    return s;
  case 2: return s < 0 ? 0 : n - 1;
  case 3: return ((s % n) + n) % n;
  default: return -1;
  }
}

typedef struct pad_args {
  const kn_view *y, *x;
  const int64_t *pads;
  int mode;
  double value;
} pad_args;

static void pad_task(void *arg, int64_t b, int64_t e, int tid) {
  const pad_args *a = arg;
  const kn_view *y = a->y, *x = a->x;
  int r = y->rank;
  size_t es = kn_esize(y->dt);
  int64_t st[IR_MAX_RANK], idx[IR_MAX_RANK];
  char fill[8] = {0};
  kn_set_f64(fill, y->dt, 0, a->value);
  kn_strides(x, st);
  for (int64_t o = b; o < e; o++) {
    int64_t rem = o, off = 0;
    bool constant = false;
    for (int d = r - 1; d >= 0; d--) {
      idx[d] = rem % y->shape[d];
      rem /= y->shape[d];
      int64_t s = pad_src(idx[d], a->pads[d], x->shape[d], a->mode);
      if (s < 0) constant = true;
      else off += s * st[d];
    }
    char *dst = (char *)y->data + (size_t)o * es;
    kn_copy_elem(dst, constant ? fill : (const char *)x->data + (size_t)off * es, es);
  }
}

void kn_nd_pad(kn_pool *p, const kn_view *y, const kn_view *x, const int64_t *pads, int mode,
               double value) {
  pad_args a = {y, x, pads, mode, value};
  kn_parallel_for(p, kn_numel(y), KN_MOVE_MIN_WORK, pad_task, &a);
}

typedef struct tile_args {
  const kn_view *y, *x;
} tile_args;

static void tile_task(void *arg, int64_t b, int64_t e, int tid) {
  const tile_args *a = arg;
  const kn_view *y = a->y, *x = a->x;
  size_t es = kn_esize(y->dt);
  int64_t st[IR_MAX_RANK];
  kn_strides(x, st);
  for (int64_t o = b; o < e; o++) {
    int64_t rem = o, off = 0;
    for (int d = y->rank - 1; d >= 0; d--) {
      off += ((rem % y->shape[d]) % x->shape[d]) * st[d];
      rem /= y->shape[d];
    }
    kn_copy_elem((char *)y->data + (size_t)o * es, (const char *)x->data + (size_t)off * es, es);
  }
}

void kn_nd_tile(kn_pool *p, const kn_view *y, const kn_view *x) {
  tile_args a = {y, x};
  kn_parallel_for(p, kn_numel(y), KN_MOVE_MIN_WORK, tile_task, &a);
}

/* Reads index i of idx, checks it against n and makes it non-negative. */
static bool get_index(const kn_view *idx, int64_t i, int64_t n, int64_t *out, ir_diag *d) {
  int64_t v = kn_get_i64(idx->data, idx->dt, i);
  if (v < -n || v >= n) {
    ir_diag_set(d, IR_INVALID_ARG, "index %lld is out of range for an axis of %lld", (long long)v,
                (long long)n);
    return false;
  }
  *out = v < 0 ? v + n : v;
  return true;
}

bool kn_nd_gather(const kn_view *y, const kn_view *x, const kn_view *idx, int axis, ir_diag *d) {
  size_t es = kn_esize(x->dt);
  int64_t outer = 1, inner = 1, n = x->shape[axis], m = kn_numel(idx);
  for (int i = 0; i < axis; i++) outer *= x->shape[i];
  for (int i = axis + 1; i < x->rank; i++) inner *= x->shape[i];
  size_t run = (size_t)inner * es;
  char *dst = y->data;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < m; j++) {
      int64_t k;
      if (!get_index(idx, j, n, &k, d)) return false;
      if (run) memcpy(dst, (const char *)x->data + (size_t)(o * n + k) * run, run);
      dst += run;
    }
  return true;
}

bool kn_nd_gather_elements(const kn_view *y, const kn_view *x, const kn_view *idx, int axis,
                           ir_diag *d) {
  size_t es = kn_esize(x->dt);
  int64_t xs[IR_MAX_RANK], total = kn_numel(idx);
  kn_strides(x, xs);
  for (int64_t o = 0; o < total; o++) {
    int64_t rem = o, off = 0, k;
    for (int dd = idx->rank - 1; dd >= 0; dd--) {
      int64_t c = rem % idx->shape[dd];
      rem /= idx->shape[dd];
      if (dd != axis) off += c * xs[dd];
    }
    if (!get_index(idx, o, x->shape[axis], &k, d)) return false;
    off += k * xs[axis];
    kn_copy_elem((char *)y->data + (size_t)o * es, (const char *)x->data + (size_t)off * es, es);
  }
  return true;
}

void kn_nd_trilu(const kn_view *y, const kn_view *x, bool upper, int64_t k) {
  size_t es = kn_esize(x->dt);
  int64_t rows = x->shape[x->rank - 2], cols = x->shape[x->rank - 1];
  int64_t mats = rows > 0 && cols > 0 ? kn_numel(x) / (rows * cols) : 0;
  kn_nd_copy(y, x);
  for (int64_t m = 0; m < mats; m++)
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) {
        bool keep = upper ? j - i >= k : j - i <= k;
        if (!keep) memset((char *)y->data + (size_t)((m * rows + i) * cols + j) * es, 0, es);
      }
}
