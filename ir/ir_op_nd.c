/* ir_op_nd: names and shape/type inference of the n-d generic ops, elementwise, reduction
 * and data-movement families (matmul, norms, attention: ir_op_nd_nn.c).
 *
 * Contracts. Shapes are static; "num" = f32|i64|i32|i8|u8, "any" = num|f16|bf16; bool
 * values are u8 holding 0 or 1. Broadcasting is numpy's. Axes are normalised to [0, rank).
 *   reshape(x any; shape[])                      -> shape (same element count)
 *   cast(x any; to any, bool)                    -> like x, dtype to; bool=1: x != 0
 *   neg abs relu sign (x num)                    -> like x
 *   clip(x num; min, max)                        -> like x
 *   sqrt reciprocal exp log tanh sigmoid erf sin cos tan asin acos atan sinh cosh asinh
 *     acosh atanh floor ceil round softplus softsign mish hard_swish (x f32) -> like x
 *   gelu(x f32; approximate 0|1 tanh), elu celu thresholded_relu leaky_relu(alpha),
 *     selu(alpha, gamma), hard_sigmoid(alpha, beta) (x f32) -> like x
 *   not(x u8) -> u8;  isnan(x f32) -> u8;  isinf(x f32; detect_neg, detect_pos) -> u8
 *   add sub mul div pow min max (a num, b like a)   -> broadcast, dtype of a
 *     (integer div truncates; division by zero gives 0)
 *   mod(a num, b like a; fmod)                   -> broadcast (fmod=0: sign of b)
 *   and or xor (a u8, b u8)                      -> broadcast u8
 *   equal less less_equal greater greater_equal (a num, b like a) -> broadcast u8
 *   prelu(x f32, slope f32 broadcasting to x)    -> like x
 *   where(cond u8, x any, y like x)              -> broadcast of all three
 *   reduce_{sum,mean,max,min,prod,l1,l2,log_sum,log_sum_exp,sum_square}(x f32;
 *     axes[] (sorted, distinct, may be empty: nothing reduced), keepdims) -> reduced
 *   argmax argmin(x num; axis, keepdims, select_last) -> reduced, i64
 *   softmax log_softmax hardmax(x f32; axis, flat) -> like x (flat=1: over axes >= axis)
 *   cumsum(x f32|i64|i32; axis, exclusive, reverse) -> like x
 *   transpose(x any; perm[rank])                 -> permuted
 *   concat(x0..xn any, same rank; axis)          -> summed along axis
 *   split(x any; axis, split[n_out])             -> n_out pieces along axis
 *   slice(x any; starts[rank], steps[rank] != 0, shape[rank]) -> shape; element j of
 *     axis i reads x at starts[i] + j*steps[i], which must lie inside x
 *   expand(x any; shape[])                       -> broadcast(x, shape)
 *   tile(x any; repeats[rank])                   -> dims * repeats
 *   pad(x any; pads[2*rank] begins then ends (negative crops), mode 0 constant |
 *     1 reflect | 2 edge | 3 wrap, value)        -> dims + begins + ends
 *   gather(x any, idx i64|i32; axis)             -> x[:axis] + idx + x[axis+1:]
 *   gather_elements(x any, idx i64|i32 same rank; axis) -> like idx
 *   trilu(x any, rank >= 2; upper, k)            -> like x
 * Runtime index operands (gather, gather_elements) may be negative (counted from the end);
 * out-of-range values fail the run. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ir_op_nd_infer.h"

typedef enum nd_kind {
  K_RESHAPE,
  K_CAST,
  K_UNARY_N,
  K_UNARY_F,
  K_NOT,
  K_TEST,
  K_BIN_N,
  K_BIN_B,
  K_CMP,
  K_PRELU,
  K_WHERE,
  K_REDUCE,
  K_ARG,
  K_SOFTMAX,
  K_CUMSUM,
  K_NN,
  K_TRANSPOSE,
  K_CONCAT,
  K_SPLIT,
  K_SLICE,
  K_EXPAND,
  K_TILE,
  K_PAD,
  K_GATHER,
  K_GATHER_EL,
  K_TRILU,
} nd_kind;

typedef struct nd_info {
  const char *name;
  nd_kind kind;
} nd_info;

/* An n-d op's slot in k_nd: the first range, then the second. */
#define ND_SLOT(op)                                                                                \
  ((op) <= IR_OP_ND_LAST ? (op)-IR_OP_ND_FIRST                                                     \
                         : (op)-IR_OP_ND2_FIRST + (IR_OP_ND_LAST - IR_OP_ND_FIRST + 1))
#define ND(op) [ND_SLOT(IR_OP_ND_##op)]
static const nd_info k_nd[ND_SLOT(IR_OP_ND2_LAST) + 1] = {
    ND(RESHAPE) = {"nd.reshape", K_RESHAPE},
    ND(CAST) = {"nd.cast", K_CAST},
    ND(NEG) = {"nd.neg", K_UNARY_N},
    ND(ABS) = {"nd.abs", K_UNARY_N},
    ND(SQRT) = {"nd.sqrt", K_UNARY_F},
    ND(RECIPROCAL) = {"nd.reciprocal", K_UNARY_F},
    ND(EXP) = {"nd.exp", K_UNARY_F},
    ND(LOG) = {"nd.log", K_UNARY_F},
    ND(TANH) = {"nd.tanh", K_UNARY_F},
    ND(SIGMOID) = {"nd.sigmoid", K_UNARY_F},
    ND(ERF) = {"nd.erf", K_UNARY_F},
    ND(RELU) = {"nd.relu", K_UNARY_N},
    ND(SIN) = {"nd.sin", K_UNARY_F},
    ND(COS) = {"nd.cos", K_UNARY_F},
    ND(TAN) = {"nd.tan", K_UNARY_F},
    ND(ASIN) = {"nd.asin", K_UNARY_F},
    ND(ACOS) = {"nd.acos", K_UNARY_F},
    ND(ATAN) = {"nd.atan", K_UNARY_F},
    ND(SINH) = {"nd.sinh", K_UNARY_F},
    ND(COSH) = {"nd.cosh", K_UNARY_F},
    ND(ASINH) = {"nd.asinh", K_UNARY_F},
    ND(ACOSH) = {"nd.acosh", K_UNARY_F},
    ND(ATANH) = {"nd.atanh", K_UNARY_F},
    ND(FLOOR) = {"nd.floor", K_UNARY_F},
    ND(CEIL) = {"nd.ceil", K_UNARY_F},
    ND(ROUND) = {"nd.round", K_UNARY_F},
    ND(SIGN) = {"nd.sign", K_UNARY_N},
    ND(SOFTPLUS) = {"nd.softplus", K_UNARY_F},
    ND(SOFTSIGN) = {"nd.softsign", K_UNARY_F},
    ND(GELU) = {"nd.gelu", K_UNARY_F},
    ND(ELU) = {"nd.elu", K_UNARY_F},
    ND(SELU) = {"nd.selu", K_UNARY_F},
    ND(LEAKY_RELU) = {"nd.leaky_relu", K_UNARY_F},
    ND(HARD_SIGMOID) = {"nd.hard_sigmoid", K_UNARY_F},
    ND(HARD_SWISH) = {"nd.hard_swish", K_UNARY_F},
    ND(THRESHOLDED_RELU) = {"nd.thresholded_relu", K_UNARY_F},
    ND(CELU) = {"nd.celu", K_UNARY_F},
    ND(MISH) = {"nd.mish", K_UNARY_F},
    ND(CLIP) = {"nd.clip", K_UNARY_N},
    ND(NOT) = {"nd.not", K_NOT},
    ND(ISNAN) = {"nd.isnan", K_TEST},
    ND(ISINF) = {"nd.isinf", K_TEST},
    ND(ADD) = {"nd.add", K_BIN_N},
    ND(SUB) = {"nd.sub", K_BIN_N},
    ND(MUL) = {"nd.mul", K_BIN_N},
    ND(DIV) = {"nd.div", K_BIN_N},
    ND(POW) = {"nd.pow", K_BIN_N},
    ND(MOD) = {"nd.mod", K_BIN_N},
    ND(MIN) = {"nd.min", K_BIN_N},
    ND(MAX) = {"nd.max", K_BIN_N},
    ND(AND) = {"nd.and", K_BIN_B},
    ND(OR) = {"nd.or", K_BIN_B},
    ND(XOR) = {"nd.xor", K_BIN_B},
    ND(EQUAL) = {"nd.equal", K_CMP},
    ND(LESS) = {"nd.less", K_CMP},
    ND(LESS_EQUAL) = {"nd.less_equal", K_CMP},
    ND(GREATER) = {"nd.greater", K_CMP},
    ND(GREATER_EQUAL) = {"nd.greater_equal", K_CMP},
    ND(PRELU) = {"nd.prelu", K_PRELU},
    ND(WHERE) = {"nd.where", K_WHERE},
    ND(REDUCE_SUM) = {"nd.reduce_sum", K_REDUCE},
    ND(REDUCE_MEAN) = {"nd.reduce_mean", K_REDUCE},
    ND(REDUCE_MAX) = {"nd.reduce_max", K_REDUCE},
    ND(REDUCE_MIN) = {"nd.reduce_min", K_REDUCE},
    ND(REDUCE_PROD) = {"nd.reduce_prod", K_REDUCE},
    ND(REDUCE_L1) = {"nd.reduce_l1", K_REDUCE},
    ND(REDUCE_L2) = {"nd.reduce_l2", K_REDUCE},
    ND(REDUCE_LOG_SUM) = {"nd.reduce_log_sum", K_REDUCE},
    ND(REDUCE_LOG_SUM_EXP) = {"nd.reduce_log_sum_exp", K_REDUCE},
    ND(REDUCE_SUM_SQUARE) = {"nd.reduce_sum_square", K_REDUCE},
    ND(ARGMAX) = {"nd.argmax", K_ARG},
    ND(ARGMIN) = {"nd.argmin", K_ARG},
    ND(SOFTMAX) = {"nd.softmax", K_SOFTMAX},
    ND(LOG_SOFTMAX) = {"nd.log_softmax", K_SOFTMAX},
    ND(HARDMAX) = {"nd.hardmax", K_SOFTMAX},
    ND(CUMSUM) = {"nd.cumsum", K_CUMSUM},
    ND(MATMUL) = {"nd.matmul", K_NN},
    ND(GEMM) = {"nd.gemm", K_NN},
    ND(TRANSPOSE) = {"nd.transpose", K_TRANSPOSE},
    ND(CONCAT) = {"nd.concat", K_CONCAT},
    ND(SPLIT) = {"nd.split", K_SPLIT},
    ND(SLICE) = {"nd.slice", K_SLICE},
    ND(EXPAND) = {"nd.expand", K_EXPAND},
    ND(TILE) = {"nd.tile", K_TILE},
    ND(PAD) = {"nd.pad", K_PAD},
    ND(GATHER) = {"nd.gather", K_GATHER},
    ND(GATHER_ELEMENTS) = {"nd.gather_elements", K_GATHER_EL},
    ND(TRILU) = {"nd.trilu", K_TRILU},
    ND(LAYER_NORM) = {"nd.layer_norm", K_NN},
    ND(SKIP_LAYER_NORM) = {"nd.skip_layer_norm", K_NN},
    ND(RMS_NORM) = {"nd.rms_norm", K_NN},
    ND(ATTENTION) = {"nd.attention", K_NN},
    ND(ROTARY_EMBEDDING) = {"nd.rotary_embedding", K_NN},
    ND(CONV) = {"nd.conv", K_NN},
    ND(POOL) = {"nd.pool", K_NN},
};
#undef ND

const char *ir_op_nd_name(ir_op op) {
  const char *nm = ir_op_is_nd(op) ? k_nd[ND_SLOT(op)].name : NULL;
  return nm ? nm : "invalid";
}

/* --- shape helpers -------------------------------------------------------------------- */

bool ir_nd_static_shape(const ir_tensor *t, int64_t *shape) {
  for (int i = 0; i < t->rank; i++) {
    if (t->dims[i].sym != IR_SYM_NONE || t->dims[i].n < 0) return false;
    shape[i] = t->dims[i].n;
  }
  return true;
}

bool ir_nd_broadcast(int ra, const int64_t *a, int rb, const int64_t *b, int *out_rank,
                     int64_t *out) {
  int r = ra > rb ? ra : rb;
  int64_t tmp[IR_MAX_RANK]; /* out may alias a or b */
  if (r > IR_MAX_RANK) return false;
  for (int i = 0; i < r; i++) {
    int64_t x = i < r - ra ? 1 : a[i - (r - ra)], y = i < r - rb ? 1 : b[i - (r - rb)];
    if (x != y && x != 1 && y != 1) return false;
    tmp[i] = x == 1 ? y : x;
  }
  memcpy(out, tmp, (size_t)r * sizeof *out);
  *out_rank = r;
  return true;
}

int64_t ir_nd_numel(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0 || (shape[i] && n > INT64_MAX / shape[i])) return -1;
    n *= shape[i];
  }
  return n;
}

/* --- context helpers (ir_op_nd_infer.h) ------------------------------------------------ */

ir_status nd_fail(nd_ctx *c, ir_status st, const char *fmt, ...) {
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ir_diag_set(c->d, st, "node '%s' (%s): %s", c->n->name, ir_op_name(c->n->op), msg);
}

static void dtype_list(uint32_t dtypes, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int t = 1; t < IR_DTYPE_COUNT && o < len; t++)
    if (dtypes & IR_DT_BIT(t))
      o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? "|" : "", ir_dtype_name((ir_dtype)t));
}

ir_status nd_input(nd_ctx *c, int i, bool required, uint32_t dtypes, nd_in *out) {
  memset(out, 0, sizeof *out);
  if (i >= c->n->n_in || c->n->in[i] < 0) {
    if (required) return nd_fail(c, IR_BAD_FORMAT, "missing input %d", i);
    return IR_OK;
  }
  if (c->n->in[i] >= c->g->n_tensors)
    return nd_fail(c, IR_BAD_FORMAT, "input %d refers to no tensor", i);
  const ir_tensor *t = &c->g->tensors[c->n->in[i]];
  if (t->rank < 0 || t->rank > IR_MAX_RANK || !ir_nd_static_shape(t, out->s))
    return nd_fail(c, IR_UNSUPPORTED, "input '%s' has a symbolic or bad shape", t->name);
  if (!ir_dtype_valid(t->dtype) || !(dtypes & IR_DT_BIT(t->dtype))) {
    char want[96];
    dtype_list(dtypes, want, sizeof want);
    return nd_fail(c, IR_UNSUPPORTED, "input '%s' is %s; the op takes %s", t->name,
                   ir_dtype_name(t->dtype), want);
  }
  out->t = t;
  out->rank = t->rank;
  return IR_OK;
}

void nd_output(nd_ctx *c, int i, ir_dtype dt, int rank, const int64_t *shape) {
  c->out_dt[i] = dt;
  c->out_rank[i] = rank;
  for (int k = 0; k < rank; k++) c->out_dims[i][k] = (ir_dim){.n = shape[k], .sym = IR_SYM_NONE};
  if (*c->out_n < i + 1) *c->out_n = i + 1;
}

int64_t nd_attr_i(nd_ctx *c, const char *name, int64_t def) {
  return ir_node_attr_i(c->n, name, def);
}

double nd_attr_f(nd_ctx *c, const char *name, double def) {
  return ir_node_attr_f(c->n, name, def);
}

const int64_t *nd_attr_ints(nd_ctx *c, const char *name, int want, int *out_n) {
  int n = 0;
  const int64_t *v = ir_node_attr_ints(c->n, name, &n);
  if (!v && !(ir_node_has_attr(c->n, name) && n == 0 && want <= 0)) {
    nd_fail(c, IR_BAD_FORMAT, "needs int-list attribute '%s'", name);
    return NULL;
  }
  if (want >= 0 && n != want) {
    nd_fail(c, IR_BAD_FORMAT, "attribute '%s' has %d values, expected %d", name, n, want);
    return NULL;
  }
  if (out_n) *out_n = n;
  static const int64_t empty[1] = {0};
  return v ? v : empty;
}

bool nd_axis(nd_ctx *c, int64_t axis, int rank, int *out) {
  if (axis < -rank || axis >= (rank ? rank : 1)) {
    nd_fail(c, IR_BAD_FORMAT, "axis %lld is out of range for rank %d", (long long)axis, rank);
    return false;
  }
  *out = (int)(axis < 0 ? axis + rank : axis);
  return true;
}

bool nd_n_out(nd_ctx *c, int lo, int hi, int *out) {
  int64_t n = nd_attr_i(c, "n_out", lo);
  if (n < lo || n > hi) {
    nd_fail(c, IR_BAD_FORMAT, "n_out %lld is outside [%d, %d]", (long long)n, lo, hi);
    return false;
  }
  *out = (int)n;
  return true;
}

/* --- elementwise -------------------------------------------------------------------- */

static ir_status infer_reshape(nd_ctx *c) {
  nd_in x;
  int n;
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st != IR_OK) return st;
  const int64_t *shape = nd_attr_ints(c, "shape", -1, &n);
  if (!shape) return c->d->status;
  if (n > IR_MAX_RANK) return nd_fail(c, IR_UNSUPPORTED, "rank %d exceeds %d", n, IR_MAX_RANK);
  if (ir_nd_numel(n, shape) != ir_nd_numel(x.rank, x.s))
    return nd_fail(c, IR_BAD_FORMAT, "shape attribute does not hold the input's %lld elements",
                   (long long)ir_nd_numel(x.rank, x.s));
  nd_output(c, 0, x.t->dtype, n, shape);
  return IR_OK;
}

static ir_status infer_cast(nd_ctx *c) {
  nd_in x;
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st != IR_OK) return st;
  ir_dtype to = (ir_dtype)nd_attr_i(c, "to", 0);
  if (!ir_dtype_valid(to) || !(IR_DT_ANY & IR_DT_BIT(to)))
    return nd_fail(c, IR_UNSUPPORTED, "cannot cast to %s", ir_dtype_name(to));
  nd_output(c, 0, to, x.rank, x.s);
  return IR_OK;
}

static ir_status infer_unary(nd_ctx *c, uint32_t in_dtypes, ir_dtype out_dt) {
  nd_in x;
  ir_status st = nd_input(c, 0, true, in_dtypes, &x);
  if (st != IR_OK) return st;
  nd_output(c, 0, out_dt ? out_dt : x.t->dtype, x.rank, x.s);
  return IR_OK;
}

static ir_status infer_broadcast_n(nd_ctx *c, int n_in, const uint32_t *dtypes, ir_dtype out_dt,
                                   int same_from) {
  nd_in in[3];
  int rank = 0;
  int64_t shape[IR_MAX_RANK];
  for (int i = 0; i < n_in; i++) {
    ir_status st = nd_input(c, i, true, dtypes[i], &in[i]);
    if (st != IR_OK) return st;
    if (i > same_from && in[i].t->dtype != in[same_from].t->dtype)
      return nd_fail(c, IR_BAD_FORMAT, "inputs '%s' and '%s' differ in dtype",
                     in[same_from].t->name, in[i].t->name);
    if (i == 0) {
      rank = in[0].rank;
      memcpy(shape, in[0].s, sizeof shape);
    } else if (!ir_nd_broadcast(rank, shape, in[i].rank, in[i].s, &rank, shape)) {
      return nd_fail(c, IR_BAD_FORMAT, "input '%s' does not broadcast with the others",
                     in[i].t->name);
    }
  }
  nd_output(c, 0, out_dt ? out_dt : in[n_in - 1].t->dtype, rank, shape);
  return IR_OK;
}

static ir_status infer_prelu(nd_ctx *c) {
  const uint32_t dt[2] = {IR_DT_BIT(IR_F32), IR_DT_BIT(IR_F32)};
  ir_status st = infer_broadcast_n(c, 2, dt, IR_F32, 0);
  if (st != IR_OK) return st;
  const ir_tensor *x = &c->g->tensors[c->n->in[0]];
  bool same = c->out_rank[0] == x->rank;
  for (int i = 0; same && i < x->rank; i++) same = c->out_dims[0][i].n == x->dims[i].n;
  return same ? IR_OK : nd_fail(c, IR_BAD_FORMAT, "slope must broadcast to the input's shape");
}

/* --- reductions ---------------------------------------------------------------------- */

/* Output shape of reducing `axes` (mask) of x: dropped, or kept as 1. */
static int reduced_shape(const nd_in *x, uint32_t mask, bool keep, int64_t *out) {
  int r = 0;
  for (int i = 0; i < x->rank; i++) {
    if (!(mask & (1u << i))) out[r++] = x->s[i];
    else if (keep) out[r++] = 1;
  }
  return r;
}

static ir_status infer_reduce(nd_ctx *c) {
  nd_in x;
  int n;
  ir_status st = nd_input(c, 0, true, IR_DT_BIT(IR_F32), &x);
  if (st != IR_OK) return st;
  const int64_t *axes = nd_attr_ints(c, "axes", -1, &n);
  if (!axes) return c->d->status;
  uint32_t mask = 0;
  for (int i = 0; i < n; i++) {
    if (axes[i] < 0 || axes[i] >= x.rank || (i && axes[i] <= axes[i - 1]))
      return nd_fail(c, IR_BAD_FORMAT, "axes must be sorted, distinct and in [0, %d)", x.rank);
    mask |= 1u << axes[i];
  }
  int64_t shape[IR_MAX_RANK];
  int r = reduced_shape(&x, mask, nd_attr_i(c, "keepdims", 1) != 0, shape);
  nd_output(c, 0, IR_F32, r, shape);
  return IR_OK;
}

static ir_status infer_arg(nd_ctx *c) {
  nd_in x;
  int axis;
  ir_status st = nd_input(c, 0, true, IR_DT_NUM, &x);
  if (st != IR_OK) return st;
  if (!nd_axis(c, nd_attr_i(c, "axis", 0), x.rank, &axis)) return c->d->status;
  if (x.rank == 0 || x.s[axis] == 0)
    return nd_fail(c, IR_BAD_FORMAT, "argmax/argmin over an empty axis");
  int64_t shape[IR_MAX_RANK];
  int r = reduced_shape(&x, 1u << axis, nd_attr_i(c, "keepdims", 1) != 0, shape);
  nd_output(c, 0, IR_I64, r, shape);
  return IR_OK;
}

static ir_status infer_axis_op(nd_ctx *c, uint32_t dtypes) {
  nd_in x;
  int axis;
  ir_status st = nd_input(c, 0, true, dtypes, &x);
  if (st != IR_OK) return st;
  if (x.rank == 0) return nd_fail(c, IR_BAD_FORMAT, "needs an input of rank >= 1");
  if (!nd_axis(c, nd_attr_i(c, "axis", -1), x.rank, &axis)) return c->d->status;
  nd_output(c, 0, x.t->dtype, x.rank, x.s);
  return IR_OK;
}

/* --- data movement ------------------------------------------------------------------- */

static ir_status infer_transpose(nd_ctx *c) {
  nd_in x;
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st != IR_OK) return st;
  const int64_t *perm = nd_attr_ints(c, "perm", x.rank, NULL);
  if (!perm) return c->d->status;
  int64_t shape[IR_MAX_RANK];
  uint32_t seen = 0;
  for (int i = 0; i < x.rank; i++) {
    if (perm[i] < 0 || perm[i] >= x.rank || (seen & (1u << perm[i])))
      return nd_fail(c, IR_BAD_FORMAT, "perm is not a permutation of [0, %d)", x.rank);
    seen |= 1u << perm[i];
    shape[i] = x.s[perm[i]];
  }
  nd_output(c, 0, x.t->dtype, x.rank, shape);
  return IR_OK;
}

static ir_status infer_concat(nd_ctx *c) {
  nd_in x0, xi;
  int axis;
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x0);
  if (st != IR_OK) return st;
  if (x0.rank == 0) return nd_fail(c, IR_BAD_FORMAT, "cannot concatenate scalars");
  if (!nd_axis(c, nd_attr_i(c, "axis", 0), x0.rank, &axis)) return c->d->status;
  int64_t shape[IR_MAX_RANK];
  memcpy(shape, x0.s, sizeof shape);
  for (int i = 1; i < c->n->n_in; i++) {
    if ((st = nd_input(c, i, true, IR_DT_BIT(x0.t->dtype), &xi)) != IR_OK) return st;
    bool ok = xi.rank == x0.rank;
    for (int k = 0; ok && k < x0.rank; k++) ok = k == axis || xi.s[k] == x0.s[k];
    if (!ok)
      return nd_fail(c, IR_BAD_FORMAT, "input '%s' does not match the first input's shape",
                     xi.t->name);
    shape[axis] += xi.s[axis];
  }
  nd_output(c, 0, x0.t->dtype, x0.rank, shape);
  return IR_OK;
}

static ir_status infer_split(nd_ctx *c) {
  nd_in x;
  int axis, n;
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st != IR_OK) return st;
  if (x.rank == 0 || !nd_axis(c, nd_attr_i(c, "axis", 0), x.rank, &axis))
    return nd_fail(c, IR_BAD_FORMAT, "bad split axis");
  const int64_t *sizes = nd_attr_ints(c, "split", -1, &n);
  if (!sizes) return c->d->status;
  if (n < 1 || n > IR_MAX_IO) return nd_fail(c, IR_UNSUPPORTED, "%d outputs", n);
  int64_t total = 0, shape[IR_MAX_RANK];
  memcpy(shape, x.s, sizeof shape);
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0) return nd_fail(c, IR_BAD_FORMAT, "negative split size");
    total += sizes[i];
    shape[axis] = sizes[i];
    nd_output(c, i, x.t->dtype, x.rank, shape);
  }
  if (total != x.s[axis])
    return nd_fail(c, IR_BAD_FORMAT, "split sizes add up to %lld, the axis has %lld",
                   (long long)total, (long long)x.s[axis]);
  return IR_OK;
}

static ir_status infer_slice(nd_ctx *c) {
  nd_in x;
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st != IR_OK) return st;
  const int64_t *starts = nd_attr_ints(c, "starts", x.rank, NULL);
  const int64_t *steps = starts ? nd_attr_ints(c, "steps", x.rank, NULL) : NULL;
  const int64_t *shape = steps ? nd_attr_ints(c, "shape", x.rank, NULL) : NULL;
  if (!shape) return c->d->status;
  for (int i = 0; i < x.rank; i++) {
    if (steps[i] == 0 || shape[i] < 0) return nd_fail(c, IR_BAD_FORMAT, "bad slice on axis %d", i);
    if (shape[i] == 0) continue;
    int64_t last = starts[i] + (shape[i] - 1) * steps[i];
    if (starts[i] < 0 || starts[i] >= x.s[i] || last < 0 || last >= x.s[i])
      return nd_fail(c, IR_BAD_FORMAT, "slice on axis %d reads outside the input", i);
  }
  nd_output(c, 0, x.t->dtype, x.rank, shape);
  return IR_OK;
}

static ir_status infer_expand(nd_ctx *c) {
  nd_in x;
  int n, rank;
  int64_t out[IR_MAX_RANK];
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st != IR_OK) return st;
  const int64_t *shape = nd_attr_ints(c, "shape", -1, &n);
  if (!shape) return c->d->status;
  if (n > IR_MAX_RANK || !ir_nd_broadcast(x.rank, x.s, n, shape, &rank, out))
    return nd_fail(c, IR_BAD_FORMAT, "input does not broadcast to the shape attribute");
  nd_output(c, 0, x.t->dtype, rank, out);
  return IR_OK;
}

static ir_status infer_tile(nd_ctx *c) {
  nd_in x;
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st != IR_OK) return st;
  const int64_t *rep = nd_attr_ints(c, "repeats", x.rank, NULL);
  if (!rep) return c->d->status;
  int64_t shape[IR_MAX_RANK];
  for (int i = 0; i < x.rank; i++) {
    if (rep[i] < 0 || (rep[i] && x.s[i] > INT64_MAX / rep[i]))
      return nd_fail(c, IR_BAD_FORMAT, "bad repeat count on axis %d", i);
    shape[i] = x.s[i] * rep[i];
  }
  nd_output(c, 0, x.t->dtype, x.rank, shape);
  return IR_OK;
}

static ir_status infer_pad(nd_ctx *c) {
  nd_in x;
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st != IR_OK) return st;
  const int64_t *pads = nd_attr_ints(c, "pads", 2 * x.rank, NULL);
  if (!pads) return c->d->status;
  int64_t mode = nd_attr_i(c, "mode", 0), shape[IR_MAX_RANK];
  if (mode < 0 || mode > 3)
    return nd_fail(c, IR_BAD_FORMAT, "unknown pad mode %lld", (long long)mode);
  for (int i = 0; i < x.rank; i++) {
    int64_t b = pads[i], e = pads[i + x.rank];
    shape[i] = x.s[i] + b + e;
    if (shape[i] < 0 || b < -x.s[i] || e < -x.s[i])
      return nd_fail(c, IR_BAD_FORMAT, "pads crop axis %d below zero", i);
    int64_t lim = mode == 1 ? x.s[i] - 1 : mode == 3 ? x.s[i] : INT64_MAX;
    if (mode && (b > lim || e > lim || (x.s[i] == 0 && (b > 0 || e > 0))))
      return nd_fail(c, IR_UNSUPPORTED, "pad mode %lld cannot pad axis %d by that much",
                     (long long)mode, i);
  }
  nd_output(c, 0, x.t->dtype, x.rank, shape);
  return IR_OK;
}

static ir_status infer_gather(nd_ctx *c, bool elements) {
  nd_in x, idx;
  int axis;
  uint32_t it = IR_DT_BIT(IR_I64) | IR_DT_BIT(IR_I32);
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st == IR_OK) st = nd_input(c, 1, true, it, &idx);
  if (st != IR_OK) return st;
  if (x.rank == 0) return nd_fail(c, IR_BAD_FORMAT, "cannot gather from a scalar");
  if (!nd_axis(c, nd_attr_i(c, "axis", 0), x.rank, &axis)) return c->d->status;
  if (elements) {
    bool ok = idx.rank == x.rank;
    for (int i = 0; ok && i < x.rank; i++) ok = i == axis || idx.s[i] <= x.s[i];
    if (!ok) return nd_fail(c, IR_BAD_FORMAT, "indices do not fit the data's shape");
    nd_output(c, 0, x.t->dtype, idx.rank, idx.s);
    return IR_OK;
  }
  int rank = x.rank - 1 + idx.rank;
  if (rank > IR_MAX_RANK) return nd_fail(c, IR_UNSUPPORTED, "result rank %d", rank);
  int64_t shape[IR_MAX_RANK];
  int r = 0;
  for (int i = 0; i < axis; i++) shape[r++] = x.s[i];
  for (int i = 0; i < idx.rank; i++) shape[r++] = idx.s[i];
  for (int i = axis + 1; i < x.rank; i++) shape[r++] = x.s[i];
  if (x.s[axis] == 0 && ir_nd_numel(idx.rank, idx.s) > 0)
    return nd_fail(c, IR_BAD_FORMAT, "gathering from an empty axis");
  nd_output(c, 0, x.t->dtype, rank, shape);
  return IR_OK;
}

static ir_status infer_trilu(nd_ctx *c) {
  nd_in x;
  ir_status st = nd_input(c, 0, true, IR_DT_ANY, &x);
  if (st != IR_OK) return st;
  if (x.rank < 2) return nd_fail(c, IR_BAD_FORMAT, "needs rank >= 2");
  nd_output(c, 0, x.t->dtype, x.rank, x.s);
  return IR_OK;
}

/* --- dispatch ------------------------------------------------------------------------ */

static ir_status infer_elementwise(nd_ctx *c, nd_kind k) {
  static const uint32_t num2[2] = {IR_DT_NUM, IR_DT_NUM};
  static const uint32_t bool2[2] = {IR_DT_BIT(IR_U8), IR_DT_BIT(IR_U8)};
  static const uint32_t where3[3] = {IR_DT_BIT(IR_U8), IR_DT_ANY, IR_DT_ANY};
  switch (k) {
  case K_UNARY_N: return infer_unary(c, IR_DT_NUM, IR_DTYPE_INVALID);
  case K_UNARY_F: return infer_unary(c, IR_DT_BIT(IR_F32), IR_DTYPE_INVALID);
  case K_NOT: return infer_unary(c, IR_DT_BIT(IR_U8), IR_U8);
  case K_TEST: return infer_unary(c, IR_DT_BIT(IR_F32), IR_U8);
  case K_BIN_N: return infer_broadcast_n(c, 2, num2, IR_DTYPE_INVALID, 0);
  case K_BIN_B: return infer_broadcast_n(c, 2, bool2, IR_U8, 0);
  case K_CMP: return infer_broadcast_n(c, 2, num2, IR_U8, 0);
  case K_PRELU: return infer_prelu(c);
  case K_WHERE: return infer_broadcast_n(c, 3, where3, IR_DTYPE_INVALID, 1);
  default: return nd_fail(c, IR_UNSUPPORTED, "not an elementwise op");
  }
}

ir_status ir_op_nd_infer(const ir_graph *g, const ir_node *n, ir_dtype *out_dt, int *out_rank,
                         ir_dim (*out_dims)[IR_MAX_RANK], int *out_n, ir_diag *d) {
  ir_diag local = {0};
  nd_ctx c = {g, n, d ? d : &local, out_dt, out_rank, out_dims, out_n};
  *out_n = 0;
  if (!ir_op_is_nd(n->op)) return nd_fail(&c, IR_UNSUPPORTED, "not an n-d op");
  nd_kind k = k_nd[ND_SLOT(n->op)].kind;
  switch (k) {
  case K_RESHAPE: return infer_reshape(&c);
  case K_CAST: return infer_cast(&c);
  case K_REDUCE: return infer_reduce(&c);
  case K_ARG: return infer_arg(&c);
  case K_SOFTMAX: return infer_axis_op(&c, IR_DT_BIT(IR_F32));
  case K_CUMSUM:
    return infer_axis_op(&c, IR_DT_BIT(IR_F32) | IR_DT_BIT(IR_I64) | IR_DT_BIT(IR_I32));
  case K_NN: return nd_infer_nn(&c);
  case K_TRANSPOSE: return infer_transpose(&c);
  case K_CONCAT: return infer_concat(&c);
  case K_SPLIT: return infer_split(&c);
  case K_SLICE: return infer_slice(&c);
  case K_EXPAND: return infer_expand(&c);
  case K_TILE: return infer_tile(&c);
  case K_PAD: return infer_pad(&c);
  case K_GATHER: return infer_gather(&c, false);
  case K_GATHER_EL: return infer_gather(&c, true);
  case K_TRILU: return infer_trilu(&c);
  default: return infer_elementwise(&c, k);
  }
}
