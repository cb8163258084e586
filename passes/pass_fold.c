/* pass_fold: constant folding. A cast, add or mul whose inputs are all weights is
 * evaluated at build time into a new weight (owned by the graph); the node goes, and so
 * does any source weight nobody else reads. Model templates rely on it to turn
 * bf16 norm weights into the f32 the kernels read, and to dequantize block-quantized
 * weights when a float plan dtype is asked for, at no run-time cost. */
#include <stdlib.h>

#include "kn_quant.h"
#include "pass.h"
#include "ir_alloc.h"

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
    uint64_t nbytes;
    void *buf = evaluate(g, n, &nbytes);
    if (!buf || !ir_graph_adopt(g, buf)) {
      ir_free(dead);
      return ir_diag_set(d, IR_OOM, "fold: out of memory");
    }
    ir_tensor *out = &g->tensors[n->out[0]];
    /* The output becomes a weight in place, so later nodes fold in the same sweep. */
    out->kind = IR_TENSOR_WEIGHT;
    out->data = buf;
    out->nbytes = nbytes;
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
