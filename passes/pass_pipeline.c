/* pass_pipeline: runs the passes in order, verifying the graph after each one and
 * printing it when --dump-ir asked for it. */
#include "pass.h"
#include "pass_fold_nd.h"

typedef ir_status (*pass_fn)(ir_graph *, const pass_opts *, pass_log *, ir_diag *);

typedef struct pass_entry {
  const char *name;
  pass_fn fn;
  bool enabled;
} pass_entry;

ir_status pass_pipeline_run(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  const pass_entry passes[] = {
      {"fold", pass_fold, o->fold},
      {"fold_nd", pass_fold_nd, o->fold},
      {"dce", pass_dce, true},
      {"fuse_add_rms_norm", pass_fuse_add_rms_norm, o->fuse},
      {"memory_plan", pass_memory_plan, true},
  };
  if (o->dump_ir) {
    fprintf(o->dump_ir, "=== input (%d nodes) ===\n", g->n_nodes);
    ir_graph_print(g, o->dump_ir);
  }
  for (size_t i = 0; i < sizeof passes / sizeof *passes; i++) {
    if (!passes[i].enabled) continue;
    ir_status st = passes[i].fn(g, o, log, d);
    if (st == IR_OK) st = ir_graph_verify(g, d);
    if (st != IR_OK) {
      ir_diag_prefix(d, "pass %s", passes[i].name);
      return st;
    }
    if (o->dump_ir) {
      fprintf(o->dump_ir, "=== after %s (%d nodes) ===\n", passes[i].name, g->n_nodes);
      ir_graph_print(g, o->dump_ir);
    }
  }
  return IR_OK;
}
