/* ir_lazy: lazy weights, their graph ownership, and the two recipes that only move bytes
 * (concatenation and column shards). The recipes that compute live with their passes. */
#include "ir_lazy.h"

#include <string.h>

#include "ir_alloc.h"

int64_t ir_wref_rows(const ir_wref *w) { return w->rank ? w->dims[0] : 1; }

uint64_t ir_wref_row_bytes(const ir_wref *w) {
  int64_t rows = ir_wref_rows(w);
  return rows > 0 ? w->nbytes / (uint64_t)rows : 0;
}

ir_wref ir_wref_of(const ir_tensor *t) {
  ir_wref w = {
      .dtype = t->dtype, .rank = t->rank, .nbytes = t->nbytes, .data = t->data, .lazy = t->lazy};
  for (int k = 0; k < t->rank; k++) w.dims[k] = t->dims[k].n;
  return w;
}

ir_status ir_wref_read(const ir_wref *w, int64_t r0, int64_t r1, void *dst, ir_diag *d) {
  uint64_t rb = ir_wref_row_bytes(w);
  int64_t rows = ir_wref_rows(w);
  if (r0 < 0 || r1 < r0 || r1 > rows)
    return ir_diag_set(d, IR_INVALID_ARG, "weight rows [%lld, %lld) of %lld", (long long)r0,
                       (long long)r1, (long long)rows);
  if (r0 == r1) return IR_OK;
  if (!w->lazy) {
    if (!w->data) return ir_diag_set(d, IR_INVALID_ARG, "a weight without data");
    memcpy(dst, (const uint8_t *)w->data + rb * (uint64_t)r0, rb * (uint64_t)(r1 - r0));
    return IR_OK;
  }
  ir_lazy *z = w->lazy;
  int64_t a = z->row_align > 1 ? z->row_align : 1;
  int64_t lo = r0 / a * a, hi = r1 % a && r1 != rows ? (r1 / a + 1) * a : r1;
  if (hi > rows) hi = rows;
  if (lo == r0 && hi == r1) return z->fill(z, r0, r1, dst, d);
  uint8_t *tmp = ir_malloc(rb * (uint64_t)(hi - lo));
  if (!tmp) return ir_diag_set(d, IR_OOM, "out of memory reading a weight");
  ir_status st = z->fill(z, lo, hi, tmp, d);
  if (st == IR_OK) memcpy(dst, tmp + rb * (uint64_t)(r0 - lo), rb * (uint64_t)(r1 - r0));
  ir_free(tmp);
  return st;
}

int64_t ir_wref_chunk_rows(const ir_wref *w, uint64_t bytes) {
  uint64_t rb = ir_wref_row_bytes(w);
  int64_t a = w->lazy && w->lazy->row_align > 1 ? w->lazy->row_align : 1;
  int64_t n = rb ? (int64_t)(bytes / rb) : ir_wref_rows(w);
  n = n / a * a;
  return n < a ? a : n;
}

void ir_lazy_free(ir_lazy *z) { ir_free(z); }

bool ir_graph_adopt_lazy(ir_graph *g, ir_lazy *z) {
  if (!z) return false;
  if (g->n_lazies == g->cap_lazies) {
    int32_t cap = g->cap_lazies ? g->cap_lazies * 2 : 16;
    ir_lazy **p = ir_realloc(g->lazies, (size_t)cap * sizeof *p);
    if (!p) {
      z->drop(z);
      return false;
    }
    g->lazies = p, g->cap_lazies = cap;
  }
  g->lazies[g->n_lazies++] = z;
  return true;
}

int32_t ir_graph_add_lazy_weight(ir_graph *g, const char *name, ir_dtype dt, int rank,
                                 const int64_t *shape, ir_lazy *z) {
  if (!ir_graph_adopt_lazy(g, z)) return -1;
  int32_t id =
      ir_graph_add_weight(g, name, dt, rank, shape, NULL, z->row_bytes * (uint64_t)z->rows);
  if (id >= 0) g->tensors[id].lazy = z;
  return id;
}

ir_status ir_graph_materialize_tensor(ir_graph *g, int32_t ti, ir_diag *d) {
  ir_tensor *t = &g->tensors[ti];
  if (t->kind != IR_TENSOR_WEIGHT || !t->lazy) return IR_OK;
  void *buf = ir_malloc(t->nbytes ? t->nbytes : 1);
  if (!buf || !ir_graph_adopt(g, buf))
    return ir_diag_set(d, IR_OOM, "out of memory making weight '%s'", t->name);
  ir_wref w = ir_wref_of(t);
  ir_status st = ir_wref_read(&w, 0, ir_wref_rows(&w), buf, d);
  if (st != IR_OK) return st;
  t->data = buf;
  t->lazy = NULL;
  return IR_OK;
}

ir_status ir_graph_materialize(ir_graph *g, ir_diag *d) {
  for (int32_t i = 0; i < g->n_tensors; i++) {
    ir_status st = ir_graph_materialize_tensor(g, i, d);
    if (st != IR_OK) return st;
  }
  return IR_OK;
}

/* ---- concat --------------------------------------------------------------------------- */

typedef struct lz_concat {
  ir_lazy z;
  int n;
  ir_wref in[];
} lz_concat;

static ir_status concat_fill(ir_lazy *z, int64_t r0, int64_t r1, void *dst, ir_diag *d) {
  lz_concat *c = (lz_concat *)z;
  int64_t base = 0;
  uint8_t *o = dst;
  for (int i = 0; i < c->n && r0 < r1; i++) {
    int64_t rows = ir_wref_rows(&c->in[i]);
    if (r0 < base + rows) {
      int64_t hi = r1 < base + rows ? r1 : base + rows;
      ir_status st = ir_wref_read(&c->in[i], r0 - base, hi - base, o, d);
      if (st != IR_OK) return st;
      o += z->row_bytes * (uint64_t)(hi - r0);
      r0 = hi;
    }
    base += rows;
  }
  return IR_OK;
}

ir_lazy *ir_lazy_concat(const ir_wref *in, int n) {
  lz_concat *c = ir_calloc(1, sizeof *c + (size_t)n * sizeof *in);
  if (!c) return NULL;
  c->n = n;
  memcpy(c->in, in, (size_t)n * sizeof *in);
  int64_t rows = 0;
  for (int i = 0; i < n; i++) rows += ir_wref_rows(&in[i]);
  c->z = (ir_lazy){.fill = concat_fill,
                   .drop = ir_lazy_free,
                   .rows = rows,
                   .row_bytes = n ? ir_wref_row_bytes(&in[0]) : 0,
                   .row_align = 1};
  return &c->z;
}

/* ---- column shards ---------------------------------------------------------------------- */

typedef struct lz_cols {
  ir_lazy z;
  ir_wref in;
  uint64_t off, len;
} lz_cols;

static ir_status cols_fill(ir_lazy *z, int64_t r0, int64_t r1, void *dst, ir_diag *d) {
  lz_cols *c = (lz_cols *)z;
  uint64_t rb = ir_wref_row_bytes(&c->in);
  if (!c->in.lazy) { /* borrowed bytes: copy the slices straight out */
    for (int64_t r = r0; r < r1; r++)
      memcpy((uint8_t *)dst + c->len * (uint64_t)(r - r0),
             (const uint8_t *)c->in.data + rb * (uint64_t)r + c->off, c->len);
    return IR_OK;
  }
  uint8_t *row = ir_malloc(rb ? rb : 1);
  if (!row) return ir_diag_set(d, IR_OOM, "out of memory");
  ir_status st = IR_OK;
  for (int64_t r = r0; r < r1 && st == IR_OK; r++) {
    st = ir_wref_read(&c->in, r, r + 1, row, d);
    memcpy((uint8_t *)dst + c->len * (uint64_t)(r - r0), row + c->off, c->len);
  }
  ir_free(row);
  return st;
}

ir_lazy *ir_lazy_cols(const ir_wref *w, uint64_t off, uint64_t len) {
  lz_cols *c = ir_calloc(1, sizeof *c);
  if (!c) return NULL;
  c->in = *w, c->off = off, c->len = len;
  c->z = (ir_lazy){.fill = cols_fill,
                   .drop = ir_lazy_free,
                   .rows = ir_wref_rows(w),
                   .row_bytes = len,
                   .row_align = 1};
  return &c->z;
}
