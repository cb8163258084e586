/* onnx_ops_nn: lowering of ONNX linear algebra, reductions, softmax, normalisations,
 * Attention and RotaryEmbedding onto the n-d ops. These compute in f32: f16/bf16 operands
 * are widened and the results narrowed back to the input's dtype. Opset differences
 * (axes as attribute or input, Softmax's 2-d coercion before opset 13) are resolved here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_internal.h"

#define A(name) ir_attr_intern(name)

static bool is_half(ir_dtype t) { return t == IR_F16 || t == IR_BF16; }

/* Input i widened to f32 (-1 when absent; when required and absent, d is set). */
static int32_t fin(onnx_imp *im, int i, bool required) {
  int32_t t = required ? imp_in_req(im, i) : imp_in(im, i);
  return t < 0 ? t : imp_f32(im, t);
}

/* Binds output k, narrowed back to dt when dt is a half type. */
static ir_status bind_as(onnx_imp *im, int k, int32_t t, ir_dtype dt) {
  if (t < 0) return im->d->status;
  return imp_bind(im, k, is_half(dt) ? imp_cast(im, t, dt) : t);
}

/* How many outputs the node wants: one past the last non-empty one. */
static int wanted_outputs(const onnx_imp *im) {
  int n = 1;
  for (int k = 0; k < imp_n_out(im); k++)
    if (imp_out_wanted(im, k)) n = k + 1;
  return n;
}

static ir_status bind_all(onnx_imp *im, const int32_t *outs, int n, const ir_dtype *dts) {
  ir_status st = IR_OK;
  for (int k = 0; k < n && st == IR_OK; k++) st = bind_as(im, k, outs[k], dts[k]);
  return st;
}

static ir_status lower_matmul(onnx_imp *im, int arg) {
  int32_t a = imp_in_req(im, 0), b = a >= 0 ? imp_in_req(im, 1) : -1;
  if (b < 0) return im->d->status;
  ir_dtype dt = imp_t(im, a)->dtype;
  int32_t in[2] = {imp_f32(im, a), imp_f32(im, b)};
  return bind_as(im, 0, imp_emit(im, IR_OP_ND_MATMUL, NULL, in, 2, NULL, 0, NULL), dt);
}

static ir_status lower_gemm(onnx_imp *im, int arg) {
  int32_t in[3] = {fin(im, 0, true), fin(im, 1, true), fin(im, 2, false)};
  if (in[0] < 0 || in[1] < 0) return im->d->status;
  ir_dtype dt = imp_t(im, imp_in(im, 0))->dtype;
  ir_attr a[4] = {IR_AF(A("alpha"), imp_attr_f(im, "alpha", 1.0f)),
                  IR_AF(A("beta"), imp_attr_f(im, "beta", 1.0f)),
                  IR_AI(A("trans_a"), imp_attr_i(im, "transA", 0)),
                  IR_AI(A("trans_b"), imp_attr_i(im, "transB", 0))};
  return bind_as(im, 0, imp_emit(im, IR_OP_ND_GEMM, NULL, in, in[2] >= 0 ? 3 : 2, a, 4, NULL), dt);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static ir_status lower_reduce(onnx_imp *im, int arg) {
  ir_op op = (ir_op)arg;
  int32_t x = imp_in_req(im, 0);
  int64_t s[IR_MAX_RANK], axes[IR_MAX_ATTR_INTS];
  int n = -1;
  if (x < 0) return im->d->status;
  ir_dtype dt = imp_t(im, x)->dtype;
  int r = imp_shape(im, x, s);
  if (im->opset < (op == IR_OP_ND_REDUCE_SUM ? 13 : 18)) {
    const int64_t *v = imp_attr_ints(im, "axes", &n);
    if (n > r) return imp_fail(im, IR_BAD_FORMAT, "%d axes for rank %d", n, r);
    if (n > 0) memcpy(axes, v, (size_t)n * sizeof *axes);
  } else if (imp_in(im, 1) >= 0) {
    ir_status st = imp_const_ints(im, imp_in(im, 1), "axes", axes, IR_MAX_ATTR_INTS, &n);
    if (st != IR_OK) return st;
  }
  if (n <= 0) {
    if (imp_attr_i(im, "noop_with_empty_axes", 0)) return imp_bind(im, 0, x);
    for (n = 0; n < r; n++) axes[n] = n;
  }
  for (int i = 0; i < n; i++) {
    int a;
    if (!imp_axis(im, axes[i], r, &a)) return im->d->status;
    axes[i] = a;
  }
  qsort(axes, (size_t)n, sizeof *axes, cmp_i64);
  for (int i = 1; i < n; i++)
    if (axes[i] == axes[i - 1])
      return imp_fail(im, IR_BAD_FORMAT, "axis %lld repeats", (long long)axes[i]);
  ir_attr a[2] = {IR_AIS(A("axes"), axes, n), IR_AI(A("keepdims"), imp_attr_i(im, "keepdims", 1))};
  int32_t in = imp_f32(im, x);
  return bind_as(im, 0, imp_emit(im, op, NULL, &in, 1, a, 2, NULL), dt);
}

static ir_status lower_arg(onnx_imp *im, int arg) {
  int32_t x = fin(im, 0, true);
  int64_t s[IR_MAX_RANK];
  int axis;
  if (x < 0 || !imp_axis(im, imp_attr_i(im, "axis", 0), imp_shape(im, x, s), &axis))
    return im->d->status;
  ir_attr a[3] = {IR_AI(A("axis"), axis), IR_AI(A("keepdims"), imp_attr_i(im, "keepdims", 1)),
                  IR_AI(A("select_last"), imp_attr_i(im, "select_last_index", 0))};
  return imp_bind(im, 0, imp_emit(im, (ir_op)arg, NULL, &x, 1, a, 3, NULL));
}

static ir_status lower_softmax(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t s[IR_MAX_RANK];
  int axis;
  if (x < 0) return im->d->status;
  bool flat = im->opset < 13; /* before 13: coerced to 2-d at axis */
  ir_dtype dt = imp_t(im, x)->dtype;
  if (!imp_axis(im, imp_attr_i(im, "axis", flat ? 1 : -1), imp_shape(im, x, s), &axis))
    return im->d->status;
  ir_attr a[2] = {IR_AI(A("axis"), axis), IR_AI(A("flat"), flat)};
  int32_t in = imp_f32(im, x);
  return bind_as(im, 0, imp_emit(im, (ir_op)arg, NULL, &in, 1, a, 2, NULL), dt);
}

static ir_status lower_cumsum(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0), at = x >= 0 ? imp_in_req(im, 1) : -1;
  int64_t s[IR_MAX_RANK];
  double av;
  int axis;
  if (at < 0 || imp_const_scalar(im, at, "axis", &av) != IR_OK ||
      !imp_axis(im, (int64_t)av, imp_shape(im, x, s), &axis))
    return im->d->status;
  ir_dtype dt = imp_t(im, x)->dtype;
  ir_attr a[3] = {IR_AI(A("axis"), axis), IR_AI(A("exclusive"), imp_attr_i(im, "exclusive", 0)),
                  IR_AI(A("reverse"), imp_attr_i(im, "reverse", 0))};
  int32_t in = imp_f32(im, x);
  return bind_as(im, 0, imp_emit(im, IR_OP_ND_CUMSUM, NULL, &in, 1, a, 3, NULL), dt);
}

/* LayerNormalization (arg 0) and RMSNormalization (arg 1). */
static ir_status lower_norm(onnx_imp *im, int arg) {
  bool rms = arg != 0;
  int32_t in[3] = {fin(im, 0, true), fin(im, 1, true), rms ? -1 : fin(im, 2, false)}, outs[3];
  int n_out = rms ? 1 : wanted_outputs(im);
  int64_t s[IR_MAX_RANK];
  int axis;
  if (in[0] < 0 || in[1] < 0 ||
      !imp_axis(im, imp_attr_i(im, "axis", -1), imp_shape(im, in[0], s), &axis))
    return im->d->status;
  ir_dtype dt = imp_t(im, imp_in(im, 0))->dtype;
  ir_attr a[3] = {IR_AI(A("axis"), axis), IR_AF(A("eps"), imp_attr_f(im, "epsilon", 1e-5f)),
                  IR_AI(A("n_out"), n_out)};
  ir_op op = rms ? IR_OP_ND_RMS_NORM : IR_OP_ND_LAYER_NORM;
  if (imp_emit(im, op, NULL, in, in[2] >= 0 ? 3 : 2, a, 3, outs) < 0) return im->d->status;
  const ir_dtype dts[3] = {dt, IR_F32, IR_F32}; /* mean and inv_std stay f32 (stash type) */
  return bind_all(im, outs, n_out, dts);
}

static ir_status lower_skip_norm(onnx_imp *im, int arg) {
  int32_t in[5], outs[4];
  for (int i = 0; i < 5; i++) in[i] = fin(im, i, i < 3);
  if (in[0] < 0 || in[1] < 0 || in[2] < 0) return im->d->status;
  int n_in = in[4] >= 0 ? 5 : in[3] >= 0 ? 4 : 3, n_out = wanted_outputs(im);
  ir_dtype dt = imp_t(im, imp_in(im, 0))->dtype;
  ir_attr a[2] = {IR_AF(A("eps"), imp_attr_f(im, "epsilon", 1e-12f)), IR_AI(A("n_out"), n_out)};
  if (imp_emit(im, IR_OP_ND_SKIP_LAYER_NORM, NULL, in, n_in, a, 2, outs) < 0) return im->d->status;
  const ir_dtype dts[4] = {dt, IR_F32, IR_F32, dt};
  return bind_all(im, outs, n_out, dts);
}

static ir_status lower_attention(onnx_imp *im, int arg) {
  int32_t in[7], outs[4];
  int n_in = 3;
  for (int i = 0; i < 7; i++) {
    in[i] = i == 3 || i == 6 ? imp_in(im, i) : fin(im, i, i < 3);
    if (in[i] >= 0) n_in = i + 1;
  }
  if (in[0] < 0 || in[1] < 0 || in[2] < 0) return im->d->status;
  if (in[3] >= 0 && is_half(imp_t(im, in[3])->dtype)) in[3] = imp_f32(im, in[3]);
  ir_dtype dt = imp_t(im, imp_in(im, 0))->dtype;
  int64_t qs[IR_MAX_RANK], hq = imp_attr_i(im, "q_num_heads", 0);
  int qr = imp_shape(im, in[0], qs);
  if (qr == 3 && (!imp_attr_req(im, "q_num_heads") || !imp_attr_req(im, "kv_num_heads")))
    return im->d->status;
  int64_t head = qr == 4 ? qs[3] : hq > 0 ? qs[2] / hq : 0;
  if (head <= 0) return imp_fail(im, IR_BAD_FORMAT, "cannot tell the head size");
  float scale = imp_attr(im, "scale") ? imp_attr_f(im, "scale", 1.0f) : 1.0f / sqrtf((float)head);
  int n_out = wanted_outputs(im);
  ir_attr a[7] = {IR_AI(A("q_num_heads"), hq),
                  IR_AI(A("kv_num_heads"), imp_attr_i(im, "kv_num_heads", 0)),
                  IR_AF(A("scale"), scale),
                  IR_AF(A("softcap"), imp_attr_f(im, "softcap", 0.0f)),
                  IR_AI(A("is_causal"), imp_attr_i(im, "is_causal", 0)),
                  IR_AI(A("qk_mode"), imp_attr_i(im, "qk_matmul_output_mode", 0)),
                  IR_AI(A("n_out"), n_out)};
  if (imp_emit(im, IR_OP_ND_ATTENTION, NULL, in, n_in, a, 7, outs) < 0) return im->d->status;
  const ir_dtype dts[4] = {dt, dt, dt, dt};
  return bind_all(im, outs, n_out, dts);
}

static ir_status lower_rotary(onnx_imp *im, int arg) {
  int32_t in[4] = {fin(im, 0, true), fin(im, 1, true), fin(im, 2, true), imp_in(im, 3)};
  if (in[0] < 0 || in[1] < 0 || in[2] < 0) return im->d->status;
  ir_dtype dt = imp_t(im, imp_in(im, 0))->dtype;
  int64_t s[IR_MAX_RANK];
  if (imp_shape(im, in[0], s) == 3 && !imp_attr_req(im, "num_heads")) return im->d->status;
  ir_attr a[3] = {IR_AI(A("interleaved"), imp_attr_i(im, "interleaved", 0)),
                  IR_AI(A("num_heads"), imp_attr_i(im, "num_heads", 0)),
                  IR_AI(A("rot_dim"), imp_attr_i(im, "rotary_embedding_dim", 0))};
  int32_t y = imp_emit(im, IR_OP_ND_ROTARY_EMBEDDING, NULL, in, in[3] >= 0 ? 4 : 3, a, 3, NULL);
  return bind_as(im, 0, y, dt);
}

/* A window op's strides, dilations and pads for k spatial dims of x with kernel ks,
 * auto_pad resolved here (shapes are static at import). */
static ir_status window_pads(onnx_imp *im, int32_t x, int k, const int64_t *ks, int64_t *st,
                             int64_t *dil, int64_t *pads) {
  int n = 0;
  const int64_t *v;
  int64_t xs[IR_MAX_RANK];
  imp_shape(im, x, xs);
  for (int i = 0; i < k; i++) st[i] = dil[i] = 1, pads[i] = pads[k + i] = 0;
  if ((v = imp_attr_ints(im, "strides", &n)) && n != k)
    return imp_fail(im, IR_BAD_FORMAT, "strides has %d values for %d spatial dims", n, k);
  for (int i = 0; v && i < k; i++) st[i] = v[i];
  if ((v = imp_attr_ints(im, "dilations", &n)) && n != k)
    return imp_fail(im, IR_BAD_FORMAT, "dilations has %d values for %d spatial dims", n, k);
  for (int i = 0; v && i < k; i++) dil[i] = v[i];
  char ap[32];
  imp_attr_s(im, "auto_pad", ap, sizeof ap);
  if (!ap[0] || !strcmp(ap, "NOTSET")) {
    if ((v = imp_attr_ints(im, "pads", &n)) && n != 2 * k)
      return imp_fail(im, IR_BAD_FORMAT, "pads has %d values for %d spatial dims", n, k);
    for (int i = 0; v && i < 2 * k; i++) pads[i] = v[i];
  } else if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
    for (int i = 0; i < k; i++) {
      if (st[i] < 1) return imp_fail(im, IR_BAD_FORMAT, "stride %lld", (long long)st[i]);
      int64_t out = (xs[2 + i] + st[i] - 1) / st[i];
      int64_t total = (out - 1) * st[i] + (ks[i] - 1) * dil[i] + 1 - xs[2 + i];
      if (total < 0) total = 0;
      bool upper = !strcmp(ap, "SAME_UPPER");
      pads[i] = upper ? total / 2 : total - total / 2;
      pads[k + i] = total - pads[i];
    }
  } else if (strcmp(ap, "VALID")) {
    return imp_fail(im, IR_UNSUPPORTED, "auto_pad '%s'", ap);
  }
  return IR_OK;
}

static ir_status lower_conv(onnx_imp *im, int arg) {
  (void)arg;
  int32_t in[3] = {fin(im, 0, true), fin(im, 1, true), fin(im, 2, false)};
  if (in[0] < 0 || in[1] < 0) return im->d->status;
  ir_dtype dt = imp_t(im, imp_in(im, 0))->dtype;
  int64_t ws[IR_MAX_RANK], st[3], dil[3], pads[6];
  int r = imp_shape(im, in[1], ws), k = r - 2, n = 0;
  if (k < 1 || k > 3) return imp_fail(im, IR_UNSUPPORTED, "%d spatial dims (1 to 3 are)", k);
  const int64_t *kshape = imp_attr_ints(im, "kernel_shape", &n);
  for (int i = 0; kshape && i < k && i < n; i++)
    if (kshape[i] != ws[2 + i])
      return imp_fail(im, IR_BAD_FORMAT, "kernel_shape differs from the weight's");
  ir_status s = window_pads(im, in[0], k, ws + 2, st, dil, pads);
  if (s != IR_OK) return s;
  ir_attr a[4] = {IR_AIS(A("strides"), st, k), IR_AIS(A("pads"), pads, 2 * k),
                  IR_AIS(A("dilations"), dil, k), IR_AI(A("group"), imp_attr_i(im, "group", 1))};
  return bind_as(im, 0, imp_emit(im, IR_OP_ND_CONV, NULL, in, in[2] >= 0 ? 3 : 2, a, 4, NULL), dt);
}

/* MaxPool (arg 0) and AveragePool (arg 1). */
static ir_status lower_pool(onnx_imp *im, int arg) {
  int32_t x = fin(im, 0, true);
  if (x < 0) return im->d->status;
  ir_dtype dt = imp_t(im, imp_in(im, 0))->dtype;
  int n = 0;
  const int64_t *ks = imp_attr_ints(im, "kernel_shape", &n);
  int64_t xs[IR_MAX_RANK], st[3], dil[3], pads[6];
  int k = imp_shape(im, x, xs) - 2;
  if (!ks || n != k || k < 1 || k > 3)
    return imp_fail(im, IR_UNSUPPORTED, "needs kernel_shape over 1 to 3 spatial dims");
  if (imp_n_out(im) > 1 && imp_out_wanted(im, 1))
    return imp_fail(im, IR_UNSUPPORTED, "the Indices output is not supported");
  if (imp_attr_i(im, "storage_order", 0))
    return imp_fail(im, IR_UNSUPPORTED, "storage_order 1 is not supported");
  ir_status s = window_pads(im, x, k, ks, st, dil, pads);
  if (s != IR_OK) return s;
  ir_attr a[7] = {IR_AIS(A("kernel"), ks, k),
                  IR_AIS(A("strides"), st, k),
                  IR_AIS(A("pads"), pads, 2 * k),
                  IR_AIS(A("dilations"), dil, k),
                  IR_AI(A("mode"), arg),
                  IR_AI(A("ceil_mode"), imp_attr_i(im, "ceil_mode", 0)),
                  IR_AI(A("count_include_pad"), imp_attr_i(im, "count_include_pad", 0))};
  return bind_as(im, 0, imp_emit(im, IR_OP_ND_POOL, NULL, &x, 1, a, 7, NULL), dt);
}

#define RED(name, since, op)                                                                       \
  { "", name, since, lower_reduce, IR_OP_ND_##op }

const onnx_op onnx_ops_nn[] = {
    {"", "MatMul", 1, lower_matmul, 0},
    {"", "Conv", 1, lower_conv, 0},
    {"", "MaxPool", 1, lower_pool, 0},
    {"", "AveragePool", 1, lower_pool, 1},
    {"", "Gemm", 1, lower_gemm, 0},
    RED("ReduceSum", 1, REDUCE_SUM),
    RED("ReduceMean", 1, REDUCE_MEAN),
    RED("ReduceMax", 1, REDUCE_MAX),
    RED("ReduceMin", 1, REDUCE_MIN),
    RED("ReduceProd", 1, REDUCE_PROD),
    RED("ReduceL1", 1, REDUCE_L1),
    RED("ReduceL2", 1, REDUCE_L2),
    RED("ReduceLogSum", 1, REDUCE_LOG_SUM),
    RED("ReduceLogSumExp", 1, REDUCE_LOG_SUM_EXP),
    RED("ReduceSumSquare", 1, REDUCE_SUM_SQUARE),
    {"", "ArgMax", 1, lower_arg, IR_OP_ND_ARGMAX},
    {"", "ArgMin", 1, lower_arg, IR_OP_ND_ARGMIN},
    {"", "Softmax", 1, lower_softmax, IR_OP_ND_SOFTMAX},
    {"", "LogSoftmax", 1, lower_softmax, IR_OP_ND_LOG_SOFTMAX},
    {"", "Hardmax", 1, lower_softmax, IR_OP_ND_HARDMAX},
    {"", "CumSum", 11, lower_cumsum, 0},
    {"", "LayerNormalization", 17, lower_norm, 0},
    {"", "RMSNormalization", 23, lower_norm, 1},
    {"com.microsoft", "SkipLayerNormalization", 1, lower_skip_norm, 0},
    {"", "Attention", 23, lower_attention, 0},
    {"", "RotaryEmbedding", 23, lower_rotary, 0},
    {NULL, NULL, 0, NULL, 0},
};
