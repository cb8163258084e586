/* pass_fold_nd: build-time evaluation of n-d nodes whose inputs are constants. */
#include <stdlib.h>

#include "kn_nd.h"
#include "pass_fold_nd.h"
#include "ir_alloc.h"
#include "ir_lazy.h"

static bool foldable(const ir_graph *g, const ir_node *n, uint64_t *out_bytes) {
  if (!ir_op_is_nd(n->op) || n->n_out < 1) return false;
  uint64_t in_bytes = 0, out_bytes_ = 0;
  for (int k = 0; k < n->n_in; k++) {
    if (n->in[k] < 0) continue;
    const ir_tensor *t = &g->tensors[n->in[k]];
    if (t->kind != IR_TENSOR_WEIGHT) return false;
    in_bytes += t->nbytes;
  }
  for (int k = 0; k < n->n_out; k++) out_bytes_ += ir_tensor_bytes(g, &g->tensors[n->out[k]], NULL);
  *out_bytes = out_bytes_;
  return out_bytes_ <= in_bytes + PASS_FOLD_ND_MAX_GROWTH;
}

ir_status pass_fold_nd_node(ir_graph *g, int32_t ni, bool *out_folded, ir_diag *d) {
  ir_node *n = &g->nodes[ni];
  uint64_t total;
  *out_folded = false;
  if (!foldable(g, n, &total)) return IR_OK;
  const void *in[IR_MAX_IO] = {0};
  void *out[IR_MAX_IO] = {0};
  for (int k = 0; k < n->n_in; k++) { /* a lazy input (a large folded cast) made now */
    ir_status st = n->in[k] >= 0 ? ir_graph_materialize_tensor(g, n->in[k], d) : IR_OK;
    if (st != IR_OK) return st;
    in[k] = n->in[k] >= 0 ? g->tensors[n->in[k]].data : NULL;
  }
  for (int k = 0; k < n->n_out; k++) {
    uint64_t bytes = ir_tensor_bytes(g, &g->tensors[n->out[k]], NULL);
    if (!(out[k] = ir_calloc(1, bytes ? bytes : 1)) || !ir_graph_adopt(g, out[k]))
      return ir_diag_set(d, IR_OOM, "fold: out of memory");
  }
  ir_status st = kn_nd_exec(NULL, g, n, in, out, d);
  if (st != IR_OK) return st;
  for (int k = 0; k < n->n_out; k++) {
    ir_tensor *t = &g->tensors[n->out[k]];
    t->kind = IR_TENSOR_WEIGHT;
    t->data = out[k];
    t->nbytes = ir_tensor_bytes(g, t, NULL);
    t->producer = -1;
  }
  n->n_out = 0;
  *out_folded = true;
  return IR_OK;
}

ir_status pass_fold_nd(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  bool *dead = ir_calloc((size_t)g->n_nodes + 1, sizeof *dead);
  if (!dead) return ir_diag_set(d, IR_OOM, "fold_nd: out of memory");
  int folded = 0;
  ir_status st = IR_OK;
  for (int32_t i = 0; st == IR_OK && i < g->n_nodes; i++) {
    st = pass_fold_nd_node(g, i, &dead[i], d);
    folded += dead[i];
  }
  bool ok = st == IR_OK && pass_compact(g, dead, NULL, NULL);
  ir_free(dead);
  if (st != IR_OK) return st;
  if (!ok) return ir_diag_set(d, IR_OOM, "fold_nd: out of memory");
  pass_log_add(log, "fold_nd: folded %d n-d nodes into constants", folded);
  return IR_OK;
}
