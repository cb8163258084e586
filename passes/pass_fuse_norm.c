/* pass_fuse_add_rms_norm: y = add(a, b); z = rms_norm(y, w)  ->  (z, y) = add_rms_norm(a, b, w).
 * The residual add and the norm read the hidden state once instead of twice. The fused
 * node takes the add's place, so both of its outputs exist before any former user.
 * The final norm sits behind gather_rows (logit rows only); rms_norm works row by row, so
 * gather then norm equals norm then gather bit for bit: the two swap, and the last
 * residual add fuses with the final norm like every other. */
#include <stdlib.h>

#include "pass.h"
#include "ir_alloc.h"

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

/* z = gather_rows(y, rows) at j, read only by u = rms_norm(z, w) at k, with y the output
 * of an add read only by the gather  ->  n = rms_norm(y, w) at j, u = gather_rows(n, rows)
 * at k. The nodes trade places (names and all); n is a new tensor shaped like y. */
static int swap_gather_norm(ir_graph *g, int32_t j) {
  const ir_node *gn = &g->nodes[j];
  if (gn->op != IR_OP_GATHER_ROWS) return 0;
  int32_t y = gn->in[0], k = -1, yp = g->tensors[y].producer;
  if (yp < 0 || g->nodes[yp].op != IR_OP_ADD || pass_count_uses(g, y, NULL) != 1 ||
      pass_count_uses(g, gn->out[0], &k) != 1 || k < 0 || g->nodes[k].op != IR_OP_RMS_NORM ||
      g->nodes[k].in[0] != gn->out[0] || !available_at(g, g->nodes[k].in[1], j))
    return 0;
  const ir_tensor *ty = &g->tensors[y];
  char name[160];
  snprintf(name, sizeof name, "%s.all_rows", g->nodes[k].name);
  int32_t n = ir_graph_add_tensor(g, name, IR_F32, ty->rank, ty->dims, IR_TENSOR_ACT);
  if (n < 0) return -1;
  ir_node gather = g->nodes[j], norm = g->nodes[k];
  norm.in[0] = y;
  gather.in[0] = n;
  gather.out[0] = norm.out[0];
  norm.out[0] = n;
  g->nodes[j] = norm;
  g->nodes[k] = gather;
  g->tensors[n].producer = j;
  g->tensors[gather.out[0]].producer = k;
  return 1;
}

ir_status pass_fuse_add_rms_norm(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  int swapped = 0;
  for (int32_t j = 0; j < g->n_nodes; j++) {
    int r = swap_gather_norm(g, j);
    if (r < 0) return ir_diag_set(d, IR_OOM, "fuse: out of memory");
    swapped += r;
  }
  bool *dead = ir_calloc((size_t)g->n_nodes + 1, sizeof *dead);
  if (!dead) return ir_diag_set(d, IR_OOM, "fuse: out of memory");
  int fused = 0;
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (!dead[i] && try_fuse(g, i, dead)) fused++;
  bool ok = pass_compact(g, dead, NULL, NULL);
  ir_free(dead);
  if (!ok) return ir_diag_set(d, IR_OOM, "fuse: out of memory");
  pass_log_add(log,
               "fuse_add_rms_norm: fused %d residual adds into their norms (%d norms moved "
               "before their gather_rows)",
               fused, swapped);
  return IR_OK;
}
