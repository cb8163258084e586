/* pass_fuse_add_rms_norm: y = add(a, b); z = rms_norm(y, w)  ->  (z, y) = add_rms_norm(a, b, w).
 * The residual add and the norm read the hidden state once instead of twice. The fused
 * node takes the add's place, so both of its outputs exist before any former user. */
#include <stdlib.h>

#include "pass.h"

/* The first rms_norm after node `add_i` reading the add's output, or -1. */
static int32_t find_norm_user(const ir_graph *g, int32_t add_i) {
  int32_t y = g->nodes[add_i].out[0];
  for (int32_t j = add_i + 1; j < g->n_nodes; j++) {
    const ir_node *n = &g->nodes[j];
    if (n->op == IR_OP_RMS_NORM && n->in[0] == y) return j;
  }
  return -1;
}

static bool available_at(const ir_graph *g, int32_t t, int32_t node) {
  return t >= 0 && g->tensors[t].producer < node;
}

static bool try_fuse(ir_graph *g, int32_t i, bool *dead) {
  ir_node *add = &g->nodes[i];
  if (add->op != IR_OP_ADD || g->tensors[add->out[0]].dtype != IR_F32) return false;
  const ir_tensor *a = &g->tensors[add->in[0]], *b = &g->tensors[add->in[1]];
  if (a->rank != b->rank) return false; /* only the same-shape residual form */
  for (int k = 0; k < a->rank; k++)
    if (a->dims[k].sym != b->dims[k].sym || a->dims[k].n != b->dims[k].n) return false;
  int32_t j = find_norm_user(g, i);
  if (j < 0 || dead[j] || !available_at(g, g->nodes[j].in[1], i)) return false;
  ir_node *norm = &g->nodes[j];
  int32_t sum = add->out[0], z = norm->out[0];
  add->op = IR_OP_ADD_RMS_NORM;
  add->in[2] = norm->in[1];
  add->n_in = 3;
  add->out[0] = z;
  add->out[1] = sum;
  add->n_out = 2;
  add->attrs[0] = IR_AF(ir_attr_intern("eps"), ir_node_attr_f(norm, "eps", 1e-6));
  add->n_attrs = 1;
  g->tensors[z].producer = i;
  norm->n_out = 0;
  dead[j] = true;
  return true;
}

ir_status pass_fuse_add_rms_norm(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  bool *dead = calloc((size_t)g->n_nodes + 1, sizeof *dead);
  if (!dead) return ir_diag_set(d, IR_OOM, "fuse: out of memory");
  int fused = 0;
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (!dead[i] && try_fuse(g, i, dead)) fused++;
  bool ok = pass_compact(g, dead, NULL, NULL);
  free(dead);
  if (!ok) return ir_diag_set(d, IR_OOM, "fuse: out of memory");
  pass_log_add(log, "fuse_add_rms_norm: fused %d residual adds into their norms", fused);
  return IR_OK;
}
