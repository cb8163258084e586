/* pass_pipeline: runs the passes in order, verifying the graph after each one and
 * printing it when --dump-ir asked for it, and logs the op count each one changed. */
#include "pass.h"
#include "pass_fold_nd.h"
#include "pass_quantize.h"

typedef ir_status (*pass_fn)(ir_graph *, const pass_opts *, pass_log *, ir_diag *);

typedef struct pass_entry {
  const char *name;
  pass_fn fn;
  bool enabled;
} pass_entry;

ir_status pass_pipeline_run(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  bool fuse = o->fuse;
  unsigned skip = o->no_fuse;
  /* rope first: the qkv merge needs the attention to read the projections directly */
  const pass_entry passes[] = {
      {"fold", pass_fold, o->fold},
      {"fold_nd", pass_fold_nd, o->fold},
      {"dce", pass_dce, true},
      {"fuse_rope_attention", pass_fuse_rope_attention, fuse && !(skip & PASS_FUSE_ROPE_ATTENTION)},
      {"fuse_qkv", pass_fuse_qkv, fuse && !(skip & PASS_FUSE_QKV)},
      {"fuse_gate_up", pass_fuse_gate_up, fuse && !(skip & PASS_FUSE_GATE_UP)},
      {"fuse_add_rms_norm", pass_fuse_add_rms_norm, fuse && !(skip & PASS_FUSE_ADD_RMS_NORM)},
      /* after fusion: fused q/k/v and gate/up weights are quantized whole */
      {"quantize", pass_quantize, o->quant && o->quant->scheme != PASS_QUANT_NONE},
      {"act_int8", pass_act_int8, o->act_int8},
      {"act_bf16", pass_act_bf16, o->act_bf16 || o->attn_bf16},
      {"repack", pass_repack, (o->act_int8 || o->act_bf16) && o->repack},
      {"memory_plan", pass_memory_plan, true},
      {"capture_plan", pass_capture_plan, o->capture_plan},
  };
  enum { N_PASSES = sizeof passes / sizeof *passes };
  int delta[N_PASSES] = {0}, before = g->n_nodes;
  if (o->dump_ir) {
    fprintf(o->dump_ir, "=== input (%d nodes) ===\n", g->n_nodes);
    ir_graph_print(g, o->dump_ir);
  }
  for (size_t i = 0; i < N_PASSES; i++) {
    if (!passes[i].enabled) continue;
    int n0 = g->n_nodes;
    ir_status st = passes[i].fn(g, o, log, d);
    delta[i] = g->n_nodes - n0;
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
  pass_results *r = &log->res;
  r->nodes_before = before, r->nodes_after = g->n_nodes, r->n_deltas = 0;
  for (int i = 0; i < N_PASSES; i++)
    if (delta[i] && r->n_deltas < PASS_MAX_PASSES)
      r->deltas[r->n_deltas].pass = passes[i].name, r->deltas[r->n_deltas++].delta = delta[i];
  char line[256];
  pass_results_line(r, PASS_LINE_OPS, line, sizeof line);
  pass_log_add(log, "%s", line);
  return IR_OK;
}
