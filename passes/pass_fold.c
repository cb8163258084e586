/* pass_fold: constant folding. A cast, add or mul whose inputs are all weights is
 * evaluated at build time into a new weight (owned by the graph); the node goes, and so
 * does any source weight nobody else reads. Model templates rely on it to turn
 * bf16 norm weights into the f32 the kernels read, and to dequantize block-quantized
 * weights when a float plan dtype is asked for, at no run-time cost. */
#include <stdlib.h>

#include "ir_alloc.h"
#include "ir_lazy.h"
#include "kn_quant.h"
#include "pass.h"

/* A cast whose output is larger than this is a recipe made when the plan is written (a
 * whole checkpoint converted to another dtype would otherwise sit in memory). */
#define FOLD_EAGER_MAX (1u << 20)

/* Any weight dtype, block-quantized ones included (so casting a quantized weight to a
 * float dtype dequantizes it at build time). */
static float load(const void *p, ir_dtype t, uint64_t i) { return kn_dequant_one(p, t, i); }

static void store(void *p, ir_dtype t, uint64_t i, float v) {
  switch (t) {
  case IR_F32: ((float *)p)[i] = v; break;
  case IR_F16: ((uint16_t *)p)[i] = ir_f32_to_f16(v); break;
  case IR_BF16: ((uint16_t *)p)[i] = ir_f32_to_bf16(v); break;
  default: break;
  }
}

/* ---- the lazy cast: rows of the input converted a chunk at a time ---------------------- */

typedef struct lz_cast {
  ir_lazy z;
  ir_wref in;
  ir_dtype to;
  int64_t k; /* values per row */
} lz_cast;

static ir_status cast_fill(ir_lazy *z, int64_t r0, int64_t r1, void *dst, ir_diag *d) {
  lz_cast *c = (lz_cast *)z;
  uint64_t rb = ir_wref_row_bytes(&c->in);
  int64_t step = ir_wref_chunk_rows(&c->in, 4u << 20);
  uint8_t *src = ir_malloc(rb * (uint64_t)step + 1);
  float *row = ir_malloc((size_t)c->k * sizeof *row + 1);
  ir_status st = src && row ? IR_OK : ir_diag_set(d, IR_OOM, "out of memory casting a weight");
  for (int64_t r = r0; r < r1 && st == IR_OK; r += step) {
    int64_t hi = r + step < r1 ? r + step : r1;
    st = ir_wref_read(&c->in, r, hi, src, d);
    for (int64_t j = r; j < hi && st == IR_OK; j++) {
      const uint8_t *in = src + rb * (uint64_t)(j - r);
      if (ir_dtype_is_quant(c->in.dtype)) kn_dequant_row(in, c->in.dtype, row, c->k);
      else
        for (int64_t i = 0; i < c->k; i++) row[i] = load(in, c->in.dtype, (uint64_t)i);
      for (int64_t i = 0; i < c->k; i++)
        store(dst, c->to, (uint64_t)(j - r0) * (uint64_t)c->k + (uint64_t)i, row[i]);
    }
  }
  ir_free(src);
  ir_free(row);
  return st;
}

/* The output of cast node n as a recipe over its input. False on OOM. */
static bool lazy_cast(ir_graph *g, const ir_node *n) {
  ir_tensor *out = &g->tensors[n->out[0]];
  lz_cast *c = ir_calloc(1, sizeof *c);
  if (!c) return false;
  c->in = ir_wref_of(&g->tensors[n->in[0]]);
  c->to = out->dtype;
  int64_t rows = ir_wref_rows(&c->in);
  c->k = rows ? (int64_t)(ir_tensor_elems(g, out, NULL) / (uint64_t)rows) : 0;
  c->z = (ir_lazy){.fill = cast_fill,
                   .drop = ir_lazy_free,
                   .rows = rows,
                   .row_bytes = ir_dtype_bytes(c->to, (uint64_t)c->k),
                   .row_align = 1};
  if (!ir_graph_adopt_lazy(g, &c->z)) return false;
  out->lazy = &c->z;
  out->data = NULL;
  out->nbytes = c->z.row_bytes * (uint64_t)rows;
  return true;
}

static bool lazy_worthy(const ir_graph *g, const ir_node *n) {
  const ir_tensor *in = &g->tensors[n->in[0]], *out = &g->tensors[n->out[0]];
  if (n->op != IR_OP_CAST || ir_dtype_is_quant(out->dtype) || in->rank < 1) return false;
  ir_wref w = ir_wref_of(in);
  /* rows of whole blocks: a quantized input's row ends on a block */
  return ir_tensor_bytes(g, out, NULL) > FOLD_EAGER_MAX &&
         ir_wref_row_bytes(&w) * (uint64_t)ir_wref_rows(&w) == in->nbytes &&
         (!ir_dtype_is_quant(in->dtype) || in->rank == 2);
}

static bool foldable(const ir_graph *g, const ir_node *n) {
  if (n->op != IR_OP_CAST && n->op != IR_OP_ADD && n->op != IR_OP_MUL) return false;
  for (int k = 0; k < n->n_in; k++)
    if (n->in[k] < 0 || g->tensors[n->in[k]].kind != IR_TENSOR_WEIGHT) return false;
  return true;
}

/* Evaluates n into a fresh buffer shaped like its output. b broadcasts as the
 * verifier allows: same shape, one row along the last dim, or a scalar. */
static void *evaluate(const ir_graph *g, const ir_node *n, uint64_t *out_bytes) {
  const ir_tensor *out = &g->tensors[n->out[0]];
  const ir_tensor *a = &g->tensors[n->in[0]];
  uint64_t cnt = ir_tensor_elems(g, out, NULL);
  *out_bytes = ir_dtype_bytes(out->dtype, cnt);
  void *buf = ir_malloc(*out_bytes ? *out_bytes : 1);
  if (!buf) return NULL;
  const ir_tensor *b = n->n_in > 1 ? &g->tensors[n->in[1]] : NULL;
  uint64_t bn = b ? ir_tensor_elems(g, b, NULL) : 1;
  /* A quantized source is dequantized whole, once: by value it would decode a block
   * per element. (Only cast takes one; it has as many elements as its output.) */
  const void *ad = a->data;
  ir_dtype at = a->dtype;
  float *deq = NULL;
  if (ir_dtype_is_quant(at)) {
    if (!(deq = ir_malloc(cnt * sizeof *deq))) {
      ir_free(buf);
      return NULL;
    }
    kn_dequant_row(ad, at, deq, (int64_t)cnt);
    ad = deq, at = IR_F32;
  }
  for (uint64_t i = 0; i < cnt; i++) {
    float x = load(ad, at, i), r = x;
    if (b) {
      float y = load(b->data, b->dtype, bn == cnt ? i : i % bn);
      r = n->op == IR_OP_ADD ? x + y : x * y;
    }
    store(buf, out->dtype, i, r);
  }
  ir_free(deq);
  return buf;
}

ir_status pass_fold(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  int folded = 0;
  bool *dead = ir_calloc((size_t)g->n_nodes + 1, sizeof *dead);
  if (!dead) return ir_diag_set(d, IR_OOM, "fold: out of memory");
  for (int32_t i = 0; i < g->n_nodes; i++) {
    ir_node *n = &g->nodes[i];
    if (!foldable(g, n)) continue;
    ir_tensor *out = &g->tensors[n->out[0]];
    if (lazy_worthy(g, n)) {
      if (!lazy_cast(g, n)) {
        ir_free(dead);
        return ir_diag_set(d, IR_OOM, "fold: out of memory");
      }
    } else {
      ir_status st = IR_OK; /* small: made now, from inputs made now if they are lazy */
      for (int k = 0; k < n->n_in && st == IR_OK; k++)
        st = ir_graph_materialize_tensor(g, n->in[k], d);
      uint64_t nbytes;
      void *buf = st == IR_OK ? evaluate(g, n, &nbytes) : NULL;
      if (!buf || !ir_graph_adopt(g, buf)) {
        ir_free(dead);
        return st != IR_OK ? st : ir_diag_set(d, IR_OOM, "fold: out of memory");
      }
      out->data = buf;
      out->nbytes = nbytes;
    }
    /* The output becomes a weight in place, so later nodes fold in the same sweep. */
    out->kind = IR_TENSOR_WEIGHT;
    out->producer = -1;
    n->n_out = 0;
    dead[i] = true;
    folded++;
  }
  bool ok = pass_compact(g, dead, NULL, NULL);
  ir_free(dead);
  if (!ok) return ir_diag_set(d, IR_OOM, "fold: out of memory");
  pass_log_add(log, "fold: folded %d nodes into constants", folded);
  return IR_OK;
}
