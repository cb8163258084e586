/* pass_fuse_rope_attention: the rope of q and of k folded into the attention that reads
 * them. The attention kernel already writes the KV cache; now it rotates k on the way in
 * and q on the stack, so neither rotated copy is stored and two ops per layer go. A per-head
 * RMSNorm of q and of k before the rope (Qwen3) folds in the same way, after it. */
#include <stdlib.h>

#include "pass.h"
#include "ir_alloc.h"

/* The rope node producing input k of attention a, if it can fold into a: a rope over
 * `heads` heads of a's head_dim, read by nothing else. -1 otherwise. */
static int32_t foldable_rope(const ir_graph *g, const ir_node *a, int k, int64_t heads) {
  if (k >= a->n_in || a->in[k] < 0) return -1;
  int32_t ri = g->tensors[a->in[k]].producer;
  if (ri < 0) return -1;
  const ir_node *r = &g->nodes[ri];
  if (r->op != IR_OP_ROPE || ir_node_attr_i(r, "n_heads", 0) != heads ||
      ir_node_attr_i(r, "head_dim", 0) != ir_node_attr_i(a, "head_dim", -1) ||
      pass_count_uses(g, r->out[0], NULL) != 1)
    return -1;
  return ri;
}

static bool try_fuse(ir_graph *g, int32_t ai, bool *dead) {
  ir_node *a = &g->nodes[ai];
  if (a->op != IR_OP_ATTENTION || a->n_in != 3 || a->in[1] < 0 || a->in[2] < 0) return false;
  int32_t rq = foldable_rope(g, a, 0, ir_node_attr_i(a, "n_heads", 0));
  int32_t rk = foldable_rope(g, a, 1, ir_node_attr_i(a, "n_kv_heads", 0));
  if (rq < 0 || rk < 0 || rq == rk || dead[rq] || dead[rk]) return false;
  const ir_node *q = &g->nodes[rq], *k = &g->nodes[rk];
  int64_t rot = ir_node_attr_i(q, "rot_dim", 0), neox = ir_node_attr_i(q, "neox", 1);
  /* one rotation for both: same positions, table, rotated dims and pairing */
  if (q->in[1] != k->in[1] || q->in[2] != k->in[2] || rot != ir_node_attr_i(k, "rot_dim", 0) ||
      neox != ir_node_attr_i(k, "neox", 1) || a->n_attrs + 2 > IR_MAX_ATTRS)
    return false;
  a->in[0] = q->in[0];
  a->in[1] = k->in[0];
  a->in[3] = q->in[1];
  a->in[4] = q->in[2];
  a->n_in = 5;
  a->attrs[a->n_attrs++] = IR_AI(ir_attr_intern("rot_dim"), rot);
  a->attrs[a->n_attrs++] = IR_AI(ir_attr_intern("neox"), neox);
  g->nodes[rq].n_out = 0;
  g->nodes[rk].n_out = 0;
  dead[rq] = dead[rk] = true;
  return true;
}

/* The rms_norm producing input k of attention a, if it can fold into a: a norm in slices of
 * a's head_dim, read by nothing else. -1 otherwise. */
static int32_t foldable_norm(const ir_graph *g, const ir_node *a, int k) {
  if (a->in[k] < 0) return -1;
  int32_t ni = g->tensors[a->in[k]].producer;
  if (ni < 0) return -1;
  const ir_node *n = &g->nodes[ni];
  if (n->op != IR_OP_RMS_NORM || n->n_in != 2 || n->in[1] < 0 ||
      g->tensors[n->in[1]].dims[0].n != ir_node_attr_i(a, "head_dim", -1) ||
      pass_count_uses(g, n->out[0], NULL) != 1)
    return -1;
  return ni;
}

/* The q and k norms into attention a (rope folded or absent: the norms come first). */
static bool try_fuse_norm(ir_graph *g, int32_t ai, bool *dead) {
  ir_node *a = &g->nodes[ai];
  if (a->op != IR_OP_ATTENTION || (a->n_in != 3 && a->n_in != 5) || a->in[1] < 0 || a->in[2] < 0 ||
      a->n_attrs + 1 > IR_MAX_ATTRS)
    return false;
  int32_t nq = foldable_norm(g, a, 0), nk = foldable_norm(g, a, 1);
  if (nq < 0 || nk < 0 || nq == nk || dead[nq] || dead[nk]) return false;
  const ir_node *q = &g->nodes[nq], *k = &g->nodes[nk];
  double eps = ir_node_attr_f(q, "eps", 1e-6);
  if (eps != ir_node_attr_f(k, "eps", 1e-6)) return false;
  if (a->n_in == 3) a->in[3] = a->in[4] = -1;
  a->in[0] = q->in[0];
  a->in[1] = k->in[0];
  a->in[5] = q->in[1];
  a->in[6] = k->in[1];
  a->n_in = 7;
  a->attrs[a->n_attrs++] = IR_AF(ir_attr_intern("qk_eps"), eps);
  g->nodes[nq].n_out = 0;
  g->nodes[nk].n_out = 0;
  dead[nq] = dead[nk] = true;
  return true;
}

/* One sweep of `fuse` over the attention nodes, the folded nodes then removed: how many
 * fused, or -1 on OOM. */
static int sweep(ir_graph *g, bool (*fuse)(ir_graph *, int32_t, bool *)) {
  bool *dead = ir_calloc((size_t)g->n_nodes + 1, sizeof *dead);
  if (!dead) return -1;
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) n += fuse(g, i, dead);
  bool ok = pass_compact(g, dead, NULL, NULL);
  ir_free(dead);
  return ok ? n : -1;
}

ir_status pass_fuse_rope_attention(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  /* the ropes first: a norm is foldable once its output feeds the attention alone */
  int fused = sweep(g, try_fuse), normed = fused < 0 ? -1 : sweep(g, try_fuse_norm);
  if (normed < 0) return ir_diag_set(d, IR_OOM, "fuse_rope_attention: out of memory");
  pass_log_add(log, "fuse_rope_attention: folded the q/k rope into %d attention nodes", fused);
  if (normed)
    pass_log_add(log, "fuse_rope_attention: folded the q/k norm into %d attention nodes", normed);
  return IR_OK;
}
