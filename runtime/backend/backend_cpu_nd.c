/* backend_cpu_nd: the CPU backend's n-d generic ops (contracts: ir/ir_op_nd.c). */
#include "backend_cpu_nd.h"

#include "kn_nd.h"

static bool all_static(const ir_graph *g, const int32_t *ids, int n) {
  for (int k = 0; k < n; k++) {
    if (ids[k] < 0) continue;
    const ir_tensor *t = &g->tensors[ids[k]];
    for (int i = 0; i < t->rank; i++)
      if (t->dims[i].sym != IR_SYM_NONE) return false;
  }
  return true;
}

ir_status cpu_nd_check(const ir_graph *g, const ir_node *n, ir_diag *d) {
  if (!all_static(g, n->in, n->n_in) || !all_static(g, n->out, n->n_out))
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "cpu backend: node '%s' (%s) has symbolic dims; n-d "
                       "ops run on static shapes",
                       n->name, ir_op_name(n->op));
  return IR_OK;
}

ir_status cpu_nd_run(kn_pool *p, const ir_graph *g, int32_t ni, void *const *ptrs, ir_diag *d) {
  const ir_node *n = &g->nodes[ni];
  const void *in[IR_MAX_IO] = {0};
  void *out[IR_MAX_IO] = {0};
  for (int k = 0; k < n->n_in; k++) in[k] = n->in[k] >= 0 ? ptrs[n->in[k]] : NULL;
  for (int k = 0; k < n->n_out; k++) out[k] = ptrs[n->out[k]];
  return kn_nd_exec(p, g, n, in, out, d);
}
