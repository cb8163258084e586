/* ir_op_nd: the n-d generic ops (IR_OP_ND_*): names, shape and type inference, and the
 * static-shape helpers the frontends, folding and kernels share.
 *
 * Every n-d op works on tensors with static dims only (no IR_SYM_*). Shape-valued
 * operands (reshape targets, axes, perms, pads, slice bounds) are attributes resolved at
 * build time, never runtime tensors, so every output shape is known when the plan is
 * written. Op contracts are documented in ir_op_nd.c and ir_op_nd_nn.c next to their
 * checkers. */
#ifndef IR_OP_ND_H
#define IR_OP_ND_H

#include "ir.h"

/* Bit masks of dtypes, for "which dtypes does this op take". */
#define IR_DT_BIT(t) (1u << (unsigned)(t))
#define IR_DT_INTS (IR_DT_BIT(IR_I64) | IR_DT_BIT(IR_I32) | IR_DT_BIT(IR_I8) | IR_DT_BIT(IR_U8))
#define IR_DT_NUM (IR_DT_BIT(IR_F32) | IR_DT_INTS)
#define IR_DT_ANY (IR_DT_NUM | IR_DT_BIT(IR_F16) | IR_DT_BIT(IR_BF16))

const char *ir_op_nd_name(ir_op op);

/* ir_op_infer for n-d ops (same contract). */
ir_status ir_op_nd_infer(const ir_graph *g, const ir_node *n, ir_dtype *out_dt, int *out_rank,
                         ir_dim (*out_dims)[IR_MAX_RANK], int *out_n, ir_diag *d);

/* The static extents of t into shape (IR_MAX_RANK entries); false if any dim is
 * symbolic. */
bool ir_nd_static_shape(const ir_tensor *t, int64_t *shape);

/* numpy broadcasting of two shapes (right-aligned; each pair equal or one of them 1);
 * out may alias a or b.
 * Writes the result's rank and extents; false if they do not broadcast. */
bool ir_nd_broadcast(int ra, const int64_t *a, int rb, const int64_t *b, int *out_rank,
                     int64_t *out);

/* Product of n extents; -1 if it overflows int64 or an extent is negative. */
int64_t ir_nd_numel(int rank, const int64_t *shape);

#endif
