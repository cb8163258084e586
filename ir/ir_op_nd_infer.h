/* ir_op_nd_infer: helpers shared by the n-d op checkers (ir_op_nd.c, ir_op_nd_nn.c).
 * Internal to ir/. */
#ifndef IR_OP_ND_INFER_H
#define IR_OP_ND_INFER_H

#include "ir_op_nd.h"

typedef struct nd_ctx {
  const ir_graph *g;
  const ir_node *n;
  ir_diag *d;
  ir_dtype *out_dt;
  int *out_rank;
  ir_dim (*out_dims)[IR_MAX_RANK];
  int *out_n;
} nd_ctx;

/* A static view of one input. */
typedef struct nd_in {
  const ir_tensor *t; /* NULL when an optional input is absent */
  int rank;
  int64_t s[IR_MAX_RANK];
} nd_in;

/* Sets d with "node 'name' (op): <message>" and returns st. */
ir_status nd_fail(nd_ctx *c, ir_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Input i into *out. Absent optional inputs give out->t == NULL. Fails on a missing
 * required input, a bad index, a symbolic dim, or a dtype outside `dtypes`
 * (IR_UNSUPPORTED: the op cannot take it). */
ir_status nd_input(nd_ctx *c, int i, bool required, uint32_t dtypes, nd_in *out);
/* Declares output i. */
void nd_output(nd_ctx *c, int i, ir_dtype dt, int rank, const int64_t *shape);
/* The attribute, or def when absent; *_req fail when it is absent. */
int64_t nd_attr_i(nd_ctx *c, const char *name, int64_t def);
double nd_attr_f(nd_ctx *c, const char *name, double def);
/* An int list of exactly `want` values (want < 0: any count, written to *out_n). */
const int64_t *nd_attr_ints(nd_ctx *c, const char *name, int want, int *out_n);
/* axis in [-rank, rank) normalised to [0, rank); false (with d set) if out of range. */
bool nd_axis(nd_ctx *c, int64_t axis, int rank, int *out);
/* Number of outputs from the n_out attribute, checked against [lo, hi]. */
bool nd_n_out(nd_ctx *c, int lo, int hi, int *out);

/* ir_op_nd_nn.c: matmul, gemm, norms, attention, rotary embedding. */
ir_status nd_infer_nn(nd_ctx *c);

#endif
