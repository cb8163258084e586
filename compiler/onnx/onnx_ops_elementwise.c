/* onnx_ops_elementwise: lowering of ONNX elementwise ops (unary, binary with numpy
 * broadcasting, variadic Sum/Mean/Max/Min, Where, Cast, Clip, Identity, Dropout) onto the
 * n-d ops. f16/bf16 operands of ops that compute in f32 are widened and the result
 * narrowed back, so the kernels only ever see f32 floats. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "onnx_internal.h"

#define A(name) ir_attr_intern(name)

static bool is_half(ir_dtype t) { return t == IR_F16 || t == IR_BF16; }

static bool int_capable(ir_op op) {
  return op == IR_OP_ND_NEG || op == IR_OP_ND_ABS || op == IR_OP_ND_RELU || op == IR_OP_ND_SIGN;
}

/* Attributes of the parametric activations, with ONNX's defaults. */
static int unary_attrs(onnx_imp *im, ir_op op, ir_attr *a) {
  char s[16];
  switch (op) {
  case IR_OP_ND_ELU:
  case IR_OP_ND_CELU:
  case IR_OP_ND_THRESHOLDED_RELU: a[0] = IR_AF(A("alpha"), imp_attr_f(im, "alpha", 1.0f)); return 1;
  case IR_OP_ND_LEAKY_RELU: a[0] = IR_AF(A("alpha"), imp_attr_f(im, "alpha", 0.01f)); return 1;
  case IR_OP_ND_SELU:
    a[0] = IR_AF(A("alpha"), imp_attr_f(im, "alpha", 1.67326319217681884765625f));
    a[1] = IR_AF(A("gamma"), imp_attr_f(im, "gamma", 1.05070102214813232421875f));
    return 2;
  case IR_OP_ND_HARD_SIGMOID:
    a[0] = IR_AF(A("alpha"), imp_attr_f(im, "alpha", 0.2f));
    a[1] = IR_AF(A("beta"), imp_attr_f(im, "beta", 0.5f));
    return 2;
  case IR_OP_ND_GELU:
    imp_attr_s(im, "approximate", s, sizeof s);
    a[0] = IR_AI(A("approximate"), !strcmp(s, "tanh"));
    return 1;
  case IR_OP_ND_ISINF:
    a[0] = IR_AI(A("detect_neg"), imp_attr_i(im, "detect_negative", 1));
    a[1] = IR_AI(A("detect_pos"), imp_attr_i(im, "detect_positive", 1));
    return 2;
  default: return 0;
  }
}

static ir_status lower_unary(onnx_imp *im, int arg) {
  ir_op op = (ir_op)arg;
  int32_t x = imp_in_req(im, 0);
  if (x < 0) return im->d->status;
  ir_dtype dt = imp_t(im, x)->dtype;
  bool widen = is_half(dt) || (dt != IR_F32 && !int_capable(op) && op != IR_OP_ND_NOT);
  if (widen && !is_half(dt))
    return imp_fail(im, IR_UNSUPPORTED, "op '%s' on %s is not supported", im->node->op_type,
                    ir_dtype_name(dt));
  ir_attr a[4];
  int na = unary_attrs(im, op, a);
  int32_t y = imp_emit(im, op, NULL, (int32_t[]){widen ? imp_f32(im, x) : x}, 1, a, na, NULL);
  bool test = op == IR_OP_ND_ISNAN || op == IR_OP_ND_ISINF;
  return imp_bind(im, 0, widen && !test ? imp_cast(im, y, dt) : y);
}

static bool is_compare(ir_op op) { return op >= IR_OP_ND_EQUAL && op <= IR_OP_ND_GREATER_EQUAL; }

/* One binary node, with f16/bf16 (and mixed-dtype Pow) computed in f32. */
static int32_t binary(onnx_imp *im, ir_op op, int32_t a, int32_t b) {
  if (a < 0 || b < 0) return -1;
  ir_dtype da = imp_t(im, a)->dtype, db = imp_t(im, b)->dtype;
  bool widen = is_half(da) || is_half(db) || (op == IR_OP_ND_POW && da != db);
  ir_attr at[1] = {IR_AI(A("fmod"), imp_attr_i(im, "fmod", 0))};
  int32_t in[2] = {widen ? imp_cast(im, a, IR_F32) : a, widen ? imp_cast(im, b, IR_F32) : b};
  int32_t y = imp_emit(im, op, NULL, in, 2, at, op == IR_OP_ND_MOD, NULL);
  return widen && !is_compare(op) ? imp_cast(im, y, da) : y;
}

static ir_status lower_binary(onnx_imp *im, int arg) {
  if (imp_attr_i(im, "broadcast", 0) && imp_attr(im, "axis"))
    return imp_fail(im, IR_UNSUPPORTED, "legacy broadcast with an axis (opset < 7)");
  int32_t a = imp_in_req(im, 0), b = a >= 0 ? imp_in_req(im, 1) : -1;
  if (b < 0) return im->d->status;
  return imp_bind(im, 0, binary(im, (ir_op)arg, a, b));
}

/* Sum, Mean, Max, Min over any number of inputs, as a chain of binary nodes. */
static ir_status lower_variadic(onnx_imp *im, int arg) {
  int n = imp_n_in(im);
  int32_t acc = imp_in_req(im, 0);
  ir_op op = arg == IR_OP_ND_DIV ? IR_OP_ND_ADD : (ir_op)arg; /* Mean: sum, then divide */
  for (int i = 1; i < n && acc >= 0; i++) acc = binary(im, op, acc, imp_in_req(im, i));
  if (acc >= 0 && arg == IR_OP_ND_DIV && n > 1) {
    ir_dtype dt = imp_t(im, acc)->dtype;
    float cnt = (float)n;
    int32_t c = imp_weight(im, "count", IR_F32, 0, NULL, &cnt);
    acc = binary(im, IR_OP_ND_DIV, acc, imp_cast(im, c, dt));
  }
  return acc < 0 ? im->d->status : imp_bind(im, 0, acc);
}

static ir_status lower_where(onnx_imp *im, int arg) {
  int32_t in[3];
  for (int i = 0; i < 3; i++)
    if ((in[i] = imp_in_req(im, i)) < 0) return im->d->status;
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_WHERE, NULL, in, 3, NULL, 0, NULL));
}

static ir_status cast_to(onnx_imp *im, int32_t x, ir_dtype to, bool to_bool) {
  if (x < 0) return im->d->status;
  if (imp_t(im, x)->dtype == to && !to_bool) return imp_bind(im, 0, x);
  ir_attr a[2] = {IR_AI(A("to"), to), IR_AI(A("bool"), to_bool)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_CAST, NULL, &x, 1, a, 2, NULL));
}

static ir_status lower_cast(onnx_imp *im, int arg) {
  ir_dtype to;
  bool to_bool;
  if (!imp_attr_req(im, "to")) return im->d->status;
  int64_t ot = imp_attr_i(im, "to", 0);
  if (!fmt_onnx_dtype_to_ir((int32_t)ot, &to, &to_bool))
    return imp_fail(im, IR_UNSUPPORTED, "cast to %s is not supported",
                    fmt_onnx_dtype_name((int32_t)ot));
  return cast_to(im, imp_in_req(im, 0), to, to_bool);
}

static ir_status lower_cast_like(onnx_imp *im, int arg) {
  int32_t like = imp_in_req(im, 1);
  if (like < 0) return im->d->status;
  return cast_to(im, imp_in_req(im, 0), imp_t(im, like)->dtype, false);
}

static ir_status lower_identity(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  if (x < 0) return im->d->status;
  ir_status st = imp_bind(im, 0, x);
  if (st == IR_OK && imp_out_wanted(im, 1)) { /* Dropout's mask: all kept */
    int64_t shape[IR_MAX_RANK], n;
    int rank = imp_shape(im, x, shape);
    n = ir_nd_numel(rank, shape);
    uint8_t one = 1;
    int32_t c = imp_weight(im, "one", IR_U8, 0, NULL, &one);
    ir_attr a[1] = {IR_AIS(A("shape"), shape, rank)};
    st = imp_bind(im, 1, n >= 0 ? imp_emit(im, IR_OP_ND_EXPAND, NULL, &c, 1, a, 1, NULL) : -1);
  }
  return st;
}

static ir_status lower_dropout(onnx_imp *im, int arg) {
  int32_t train = imp_in(im, 2);
  double v = 0;
  if (train >= 0 && (imp_const_scalar(im, train, "training_mode", &v) != IR_OK || v != 0))
    return im->d->status ? im->d->status
                         : imp_fail(im, IR_UNSUPPORTED, "training-mode dropout is not supported");
  return lower_identity(im, arg);
}

/* Clip: constant bounds become attributes; runtime bounds become max / min nodes. */
static ir_status lower_clip(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  if (x < 0) return im->d->status;
  double lo = -INFINITY, hi = INFINITY;
  int32_t bmin = -1, bmax = -1;
  if (im->opset < 11) {
    lo = imp_attr_f(im, "min", -FLT_MAX);
    hi = imp_attr_f(im, "max", FLT_MAX);
  } else {
    int32_t b[2] = {imp_in(im, 1), imp_in(im, 2)};
    for (int i = 0; i < 2; i++) {
      if (b[i] < 0) continue;
      double v;
      if (imp_is_const(im, b[i]) && imp_const_scalar(im, b[i], "bound", &v) == IR_OK)
        *(i ? &hi : &lo) = v;
      else *(i ? &bmax : &bmin) = b[i];
    }
  }
  ir_dtype dt = imp_t(im, x)->dtype;
  int32_t y = is_half(dt) ? imp_f32(im, x) : x;
  ir_attr a[2] = {IR_AF(A("min"), lo), IR_AF(A("max"), hi)};
  y = imp_emit(im, IR_OP_ND_CLIP, NULL, &y, 1, a, 2, NULL);
  if (bmin >= 0) y = binary(im, IR_OP_ND_MAX, y, imp_cast(im, bmin, imp_t(im, y)->dtype));
  if (bmax >= 0 && y >= 0) y = binary(im, IR_OP_ND_MIN, y, imp_cast(im, bmax, imp_t(im, y)->dtype));
  return imp_bind(im, 0, is_half(dt) ? imp_cast(im, y, dt) : y);
}

#define UN(name, since, op)                                                                        \
  { "", name, since, lower_unary, IR_OP_ND_##op }
#define BIN(name, since, op)                                                                       \
  { "", name, since, lower_binary, IR_OP_ND_##op }

const onnx_op onnx_ops_elementwise[] = {
    UN("Neg", 1, NEG),
    UN("Abs", 1, ABS),
    UN("Sqrt", 1, SQRT),
    UN("Reciprocal", 1, RECIPROCAL),
    UN("Exp", 1, EXP),
    UN("Log", 1, LOG),
    UN("Tanh", 1, TANH),
    UN("Sigmoid", 1, SIGMOID),
    UN("Erf", 9, ERF),
    UN("Relu", 1, RELU),
    UN("Sin", 7, SIN),
    UN("Cos", 7, COS),
    UN("Tan", 7, TAN),
    UN("Asin", 7, ASIN),
    UN("Acos", 7, ACOS),
    UN("Atan", 7, ATAN),
    UN("Sinh", 9, SINH),
    UN("Cosh", 9, COSH),
    UN("Asinh", 9, ASINH),
    UN("Acosh", 9, ACOSH),
    UN("Atanh", 9, ATANH),
    UN("Floor", 1, FLOOR),
    UN("Ceil", 1, CEIL),
    UN("Round", 11, ROUND),
    UN("Sign", 9, SIGN),
    UN("Softplus", 1, SOFTPLUS),
    UN("Softsign", 1, SOFTSIGN),
    UN("Gelu", 20, GELU),
    UN("Elu", 1, ELU),
    UN("Selu", 1, SELU),
    UN("LeakyRelu", 1, LEAKY_RELU),
    UN("HardSigmoid", 1, HARD_SIGMOID),
    UN("HardSwish", 14, HARD_SWISH),
    UN("ThresholdedRelu", 10, THRESHOLDED_RELU),
    UN("Celu", 12, CELU),
    UN("Mish", 18, MISH),
    UN("Not", 1, NOT),
    UN("IsNaN", 9, ISNAN),
    UN("IsInf", 10, ISINF),
    {"com.microsoft", "Gelu", 1, lower_unary, IR_OP_ND_GELU},
    BIN("Add", 1, ADD),
    BIN("Sub", 1, SUB),
    BIN("Mul", 1, MUL),
    BIN("Div", 1, DIV),
    BIN("Pow", 1, POW),
    BIN("Mod", 10, MOD),
    BIN("And", 1, AND),
    BIN("Or", 1, OR),
    BIN("Xor", 1, XOR),
    BIN("Equal", 1, EQUAL),
    BIN("Less", 1, LESS),
    BIN("LessOrEqual", 12, LESS_EQUAL),
    BIN("Greater", 1, GREATER),
    BIN("GreaterOrEqual", 12, GREATER_EQUAL),
    BIN("PRelu", 1, PRELU),
    {"", "Sum", 1, lower_variadic, IR_OP_ND_ADD},
    {"", "Mean", 1, lower_variadic, IR_OP_ND_DIV},
    {"", "Max", 1, lower_variadic, IR_OP_ND_MAX},
    {"", "Min", 1, lower_variadic, IR_OP_ND_MIN},
    {"", "Where", 9, lower_where, 0},
    {"", "Cast", 1, lower_cast, 0},
    {"", "CastLike", 15, lower_cast_like, 0},
    {"", "Clip", 1, lower_clip, 0},
    {"", "Identity", 1, lower_identity, 0},
    {"", "Dropout", 1, lower_dropout, 0},
    {NULL, NULL, 0, NULL, 0},
};
