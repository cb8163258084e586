/* ir_profile: a generic program's dynamic shapes (ir_profile in ir.h): checking a profile
 * against its graph, solving the symbols from an input's shape, and specializing a working
 * copy of the graph to a point of the ranges. */
#ifndef IR_PROFILE_H
#define IR_PROFILE_H

#include "ir.h"

/* off + sum coef[k] * syms[k]. */
int64_t ir_affine_eval(const ir_affine *a, int n_syms, const int64_t *syms);

/* The entry of dim k of tensor t, or NULL when that dim does not depend on the symbols. */
const ir_affine *ir_profile_dim(const ir_profile *p, int32_t t, int k);
/* An entry's value with every symbol at its minimum (the smallest the dim gets). */
int64_t ir_profile_at_min(const ir_profile *p, const ir_affine *a);

/* The profile against its graph: symbols with 1 <= min <= max, entries naming activation or
 * input dims (coefficients >= 0, so no tensor outgrows its planned size) and int attribute
 * values, each giving the graph's stored value at the maxima. OK when g has no profile. */
ir_status ir_profile_verify(const ir_graph *g, ir_diag *d);

/* The symbol values input tensor t's shape implies, merged into syms (known[k] tells which
 * are set; a conflict with an earlier value is an error). Fails naming the dim and its
 * range when the shape is outside the profile. */
ir_status ir_profile_solve(const ir_graph *g, int32_t t, int rank, const int64_t *shape,
                           int64_t *syms, bool *known, ir_diag *d);

/* A working copy of g (tensors, nodes and the attribute values the profile touches are
 * its own; names, weights and everything else are g's). Free with ir_profile_instance_free. */
ir_graph *ir_profile_instance(const ir_graph *g);
void ir_profile_instance_free(ir_graph *w);

/* Sets w's dims and attributes to their values at syms and checks every node's shapes
 * there (ir_op_infer); fails naming the node that does not hold. */
ir_status ir_profile_instance_set(const ir_graph *g, ir_graph *w, const int64_t *syms, ir_diag *d);

#endif
