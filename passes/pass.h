/* pass: the compiler's graph-to-graph passes and the pipeline that runs them.
 * Each pass rewrites the graph in place, leaves it valid (the pipeline verifies after
 * every pass), and appends one line saying what it changed to the pass log. */
#ifndef PASS_H
#define PASS_H

#include <stdbool.h>
#include <stdio.h>

#include "ir.h"

typedef struct pass_opts {
  bool fold;      /* constant folding */
  bool fuse;      /* fusion passes */
  FILE *dump_ir;  /* when set, the IR is printed here after each pass */
} pass_opts;

/* A growing list of one-line summaries ("dce: removed 3 nodes, 1 tensor"). */
typedef struct pass_log {
  char **lines;
  int n;
} pass_log;

void pass_log_add(pass_log *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pass_log_free(pass_log *log);

ir_status pass_dce(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
ir_status pass_fold(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
ir_status pass_fuse_add_rms_norm(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
ir_status pass_memory_plan(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);

/* fold -> dce -> fuse -> dce -> memory plan, verifying after each. */
ir_status pass_pipeline_run(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);

/* --- helpers shared by passes ----------------------------------------------------------- */

/* Replaces every use of tensor `from` (node inputs and graph outputs) with `to`. */
void pass_replace_uses(ir_graph *g, int32_t from, int32_t to);
/* Removes nodes with dead[i] set and then every tensor no live node or graph
 * input/output refers to, renumbering indices. dead may be NULL. Returns the counts. */
bool pass_compact(ir_graph *g, const bool *dead, int32_t *out_nodes_removed,
                  int32_t *out_tensors_removed);

#endif
