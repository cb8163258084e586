/* pass_dce: dead-code elimination. A node is live if a graph output depends on it or
 * it has a side effect (attention writes the KV cache); unused weights are dropped too,
 * so checkpoint tensors the program never reads do not reach the plan. */
#include <stdlib.h>

#include "pass.h"
#include "ir_alloc.h"

static bool has_side_effect(ir_op op) { return op == IR_OP_ATTENTION; }

ir_status pass_dce(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  bool *live_t = ir_calloc((size_t)g->n_tensors + 1, sizeof *live_t);
  bool *dead = ir_calloc((size_t)g->n_nodes + 1, sizeof *dead);
  if (!live_t || !dead) {
    ir_free(live_t), ir_free(dead);
    return ir_diag_set(d, IR_OOM, "dce: out of memory");
  }
  for (int32_t i = 0; i < g->n_outputs; i++) live_t[g->outputs[i]] = true;
  /* Nodes are in topological order: one backward sweep finds every live node. */
  for (int32_t i = g->n_nodes - 1; i >= 0; i--) {
    const ir_node *n = &g->nodes[i];
    bool live = has_side_effect(n->op);
    for (int k = 0; k < n->n_out && !live; k++) live = live_t[n->out[k]];
    dead[i] = !live;
    if (!live) continue;
    for (int k = 0; k < n->n_in; k++)
      if (n->in[k] >= 0) live_t[n->in[k]] = true;
  }
  int32_t rn = 0, rt = 0;
  bool ok = pass_compact(g, dead, &rn, &rt);
  ir_free(live_t), ir_free(dead);
  if (!ok) return ir_diag_set(d, IR_OOM, "dce: out of memory");
  pass_log_add(log, "dce: removed %d nodes and %d tensors", rn, rt);
  return IR_OK;
}
