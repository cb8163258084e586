/* pass_fold_nd: constant folding of the n-d generic ops. A node whose inputs are all
 * weights is evaluated at build time with the CPU kernels (kn_nd_exec, the same code the
 * runtime would run) and its outputs become weights owned by the graph. The ONNX frontend
 * calls pass_fold_nd_node as it lowers each node, so the shape arithmetic exporters emit
 * (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) is resolved before the next node's
 * shapes are inferred; pass_fold_nd sweeps a whole graph. */
#ifndef PASS_FOLD_ND_H
#define PASS_FOLD_ND_H

#include "pass.h"

/* Folding never creates more than this many bytes of new constant data per node beyond
 * the size of the node's inputs (so an Expand of a scalar to a huge shape stays a node). */
#define PASS_FOLD_ND_MAX_GROWTH (64ull << 20)

/* Evaluates n-d node ni if every input is a weight (or absent) and the outputs stay
 * within the growth limit. On success its outputs are weights and the node writes
 * nothing (n_out = 0: the caller removes it); *out_folded tells whether it folded. */
ir_status pass_fold_nd_node(ir_graph *g, int32_t ni, bool *out_folded, ir_diag *d);

/* Folds every foldable n-d node, in order (so chains fold in one sweep), then compacts. */
ir_status pass_fold_nd(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);

#endif
