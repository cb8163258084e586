/* onnx_ops_compose: ONNX ops lowered as compositions of other n-d ops, with no kernel of
 * their own: global pooling (reductions), inference-mode BatchNormalization (a per-channel
 * multiply-add whose constant half folds at build time), InstanceNormalization and
 * MeanVarianceNormalization (normalisations over spatial axes), DepthToSpace and
 * SpaceToDepth (reshape, transpose, reshape) and Shrink (compares and selects). */
#include <math.h>
#include <string.h>

#include "onnx_internal.h"

#define A(name) ir_attr_intern(name)

static int32_t binary(onnx_imp *im, ir_op op, int32_t a, int32_t b) {
  if (a < 0 || b < 0) return -1;
  return imp_emit(im, op, "op", (int32_t[]){a, b}, 2, NULL, 0, NULL);
}

static int32_t unary(onnx_imp *im, ir_op op, int32_t x) {
  return x < 0 ? -1 : imp_emit(im, op, "op", &x, 1, NULL, 0, NULL);
}

static int32_t scalar(onnx_imp *im, float v) { return imp_weight(im, "c", IR_F32, 0, NULL, &v); }

/* A per-channel vector [C] reshaped to [C, 1, ...] to broadcast over x[1:] of rank r. */
static int32_t per_channel(onnx_imp *im, int32_t v, int r) {
  int64_t s[IR_MAX_RANK] = {0}, c[IR_MAX_RANK];
  if (v < 0) return -1;
  imp_shape(im, v, c);
  s[0] = c[0];
  for (int i = 1; i < r - 1; i++) s[i] = 1;
  return imp_reshape(im, imp_f32(im, v), r - 1, s);
}

/* Reduction over axes [2, rank) keeping dims: GlobalAveragePool / GlobalMaxPool. */
static int32_t reduce_spatial(onnx_imp *im, ir_op op, int32_t x, int first) {
  int64_t s[IR_MAX_RANK], axes[IR_MAX_RANK];
  int r = imp_shape(im, x, s), n = 0;
  for (int i = first; i < r; i++) axes[n++] = i;
  ir_attr a[2] = {IR_AIS(A("axes"), axes, n), IR_AI(A("keepdims"), 1)};
  return imp_emit(im, op, "reduce", &x, 1, a, 2, NULL);
}

static ir_status lower_global_pool(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  if (x < 0) return im->d->status;
  ir_dtype dt = imp_t(im, x)->dtype;
  return imp_bind(im, 0, imp_cast(im, reduce_spatial(im, (ir_op)arg, imp_f32(im, x), 2), dt));
}

/* y = x * a + b with a = scale / sqrt(var + eps), b = bias - mean * a (folded when the
 * statistics are constants, as they are in exported inference graphs). */
static ir_status lower_batch_norm(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  if (x < 0) return im->d->status;
  if (imp_attr_i(im, "training_mode", 0) || imp_out_wanted(im, 1) || imp_out_wanted(im, 2))
    return imp_fail(im, IR_UNSUPPORTED, "training-mode BatchNormalization is not supported");
  int64_t s[IR_MAX_RANK];
  int r = imp_shape(im, x, s);
  if (r < 2) return imp_fail(im, IR_BAD_FORMAT, "BatchNormalization needs rank >= 2");
  int32_t v[4];
  for (int i = 0; i < 4; i++) v[i] = per_channel(im, imp_in_req(im, i + 1), r);
  if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0) return im->d->status;
  float eps = imp_attr_f(im, "epsilon", 1e-5f);
  int32_t a = binary(im, IR_OP_ND_DIV, v[0],
                     unary(im, IR_OP_ND_SQRT, binary(im, IR_OP_ND_ADD, v[3], scalar(im, eps))));
  int32_t b = binary(im, IR_OP_ND_SUB, v[1], binary(im, IR_OP_ND_MUL, v[2], a));
  ir_dtype dt = imp_t(im, x)->dtype;
  int32_t y = binary(im, IR_OP_ND_ADD, binary(im, IR_OP_ND_MUL, imp_f32(im, x), a), b);
  return imp_bind(im, 0, imp_cast(im, y, dt));
}

/* layer_norm over the spatial axes with unit scale, then the per-channel affine. */
static ir_status lower_instance_norm(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  if (x < 0) return im->d->status;
  int64_t s[IR_MAX_RANK];
  int r = imp_shape(im, x, s);
  if (r < 3) return imp_fail(im, IR_BAD_FORMAT, "InstanceNormalization needs rank >= 3");
  int32_t sc = per_channel(im, imp_in_req(im, 1), r), bias = per_channel(im, imp_in_req(im, 2), r);
  if (sc < 0 || bias < 0) return im->d->status;
  ir_dtype dt = imp_t(im, x)->dtype;
  ir_attr a[3] = {IR_AI(A("axis"), 2), IR_AF(A("eps"), imp_attr_f(im, "epsilon", 1e-5f)),
                  IR_AI(A("n_out"), 1)};
  int32_t in[2] = {imp_f32(im, x), scalar(im, 1.0f)};
  int32_t y = imp_emit(im, IR_OP_ND_LAYER_NORM, "norm", in, 2, a, 3, NULL);
  y = binary(im, IR_OP_ND_ADD, binary(im, IR_OP_ND_MUL, y, sc), bias);
  return imp_bind(im, 0, imp_cast(im, y, dt));
}

/* (x - mean) / sqrt(mean((x - mean)^2) + 1e-9) over `axes` (default [0, 2, 3]). */
static ir_status lower_mvn(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t s[IR_MAX_RANK], axes[IR_MAX_RANK] = {0, 2, 3};
  int n;
  if (x < 0) return im->d->status;
  int r = imp_shape(im, x, s);
  const int64_t *v = imp_attr_ints(im, "axes", &n);
  if (n < 0) n = 3;
  else if (n > r) return imp_fail(im, IR_BAD_FORMAT, "too many axes");
  else memcpy(axes, v, (size_t)n * sizeof *axes);
  uint32_t seen = 0;
  for (int i = 0; i < n; i++) {
    int ax;
    if (!imp_axis(im, axes[i], r, &ax) || (seen & (1u << ax)))
      return im->d->status ? im->d->status : imp_fail(im, IR_BAD_FORMAT, "axis repeats");
    seen |= 1u << ax;
  }
  for (int i = 0, k = 0; i < r; i++) /* sorted, as reductions want them */
    if (seen & (1u << i)) axes[k++] = i;
  ir_dtype dt = imp_t(im, x)->dtype;
  ir_attr a[2] = {IR_AIS(A("axes"), axes, n), IR_AI(A("keepdims"), 1)};
  int32_t xf = imp_f32(im, x);
  int32_t mean = imp_emit(im, IR_OP_ND_REDUCE_MEAN, "mean", &xf, 1, a, 2, NULL);
  int32_t dev = binary(im, IR_OP_ND_SUB, xf, mean);
  int32_t sq = binary(im, IR_OP_ND_MUL, dev, dev);
  int32_t var = sq < 0 ? -1 : imp_emit(im, IR_OP_ND_REDUCE_MEAN, "var", &sq, 1, a, 2, NULL);
  int32_t den = unary(im, IR_OP_ND_SQRT, binary(im, IR_OP_ND_ADD, var, scalar(im, 1e-9f)));
  return imp_bind(im, 0, imp_cast(im, binary(im, IR_OP_ND_DIV, dev, den), dt));
}

/* DepthToSpace (arg 0: DCR or CRD by `mode`) and SpaceToDepth (arg 1) on [N, C, H, W]. */
static ir_status lower_depth_space(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t s[IR_MAX_RANK], b = imp_attr_i(im, "blocksize", 0);
  char mode[8];
  if (x < 0) return im->d->status;
  if (imp_shape(im, x, s) != 4 || b <= 0 || b > 4096)
    return imp_fail(im, IR_BAD_FORMAT, "needs a 4-d input and a blocksize in 1..4096");
  imp_attr_s(im, "mode", mode, sizeof mode);
  int64_t n = s[0], c = s[1], h = s[2], w = s[3];
  int64_t mid[6], perm[6], out[4];
  if (arg == 0) {
    if (c % (b * b)) return imp_fail(im, IR_BAD_FORMAT, "channels not divisible by blocksize^2");
    bool crd = !strcmp(mode, "CRD");
    int64_t m_dcr[6] = {n, b, b, c / (b * b), h, w}, m_crd[6] = {n, c / (b * b), b, b, h, w};
    int64_t p_dcr[6] = {0, 3, 4, 1, 5, 2}, p_crd[6] = {0, 1, 4, 2, 5, 3};
    memcpy(mid, crd ? m_crd : m_dcr, sizeof mid);
    memcpy(perm, crd ? p_crd : p_dcr, sizeof perm);
    int64_t o[4] = {n, c / (b * b), h * b, w * b};
    memcpy(out, o, sizeof out);
  } else {
    if (h % b || w % b)
      return imp_fail(im, IR_BAD_FORMAT, "spatial dims not divisible by blocksize");
    int64_t m[6] = {n, c, h / b, b, w / b, b}, p[6] = {0, 3, 5, 1, 2, 4};
    int64_t o[4] = {n, c * b * b, h / b, w / b};
    memcpy(mid, m, sizeof mid);
    memcpy(perm, p, sizeof perm);
    memcpy(out, o, sizeof out);
  }
  int32_t t = imp_reshape(im, x, 6, mid);
  ir_attr a[1] = {IR_AIS(A("perm"), perm, 6)};
  t = t < 0 ? -1 : imp_emit(im, IR_OP_ND_TRANSPOSE, "transpose", &t, 1, a, 1, NULL);
  return imp_bind(im, 0, t < 0 ? -1 : imp_reshape(im, t, 4, out));
}

/* y = x < -lambd ? x + bias : x > lambd ? x - bias : 0. */
static ir_status lower_shrink(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  if (x < 0) return im->d->status;
  ir_dtype dt = imp_t(im, x)->dtype;
  if (dt != IR_F32 && dt != IR_F16 && dt != IR_BF16)
    return imp_fail(im, IR_UNSUPPORTED, "Shrink on %s", ir_dtype_name(dt));
  float l = imp_attr_f(im, "lambd", 0.5f), bias = imp_attr_f(im, "bias", 0.0f);
  int32_t xf = imp_f32(im, x), zero = scalar(im, 0.0f);
  int32_t lo = binary(im, IR_OP_ND_LESS, xf, scalar(im, -l));
  int32_t hi = binary(im, IR_OP_ND_GREATER, xf, scalar(im, l));
  int32_t up = binary(im, IR_OP_ND_ADD, xf, scalar(im, bias));
  int32_t dn = binary(im, IR_OP_ND_SUB, xf, scalar(im, bias));
  int32_t y = -1;
  if (lo >= 0 && hi >= 0 && up >= 0 && dn >= 0) {
    int32_t inner =
        imp_emit(im, IR_OP_ND_WHERE, "where", (int32_t[]){hi, dn, zero}, 3, NULL, 0, NULL);
    if (inner >= 0)
      y = imp_emit(im, IR_OP_ND_WHERE, "where", (int32_t[]){lo, up, inner}, 3, NULL, 0, NULL);
  }
  return imp_bind(im, 0, imp_cast(im, y, dt));
}

const onnx_op onnx_ops_compose[] = {
    {"", "GlobalAveragePool", 1, lower_global_pool, IR_OP_ND_REDUCE_MEAN},
    {"", "GlobalMaxPool", 1, lower_global_pool, IR_OP_ND_REDUCE_MAX},
    {"", "BatchNormalization", 1, lower_batch_norm, 0},
    {"", "InstanceNormalization", 1, lower_instance_norm, 0},
    {"", "MeanVarianceNormalization", 9, lower_mvn, 0},
    {"", "DepthToSpace", 1, lower_depth_space, 0},
    {"", "SpaceToDepth", 1, lower_depth_space, 1},
    {"", "Shrink", 9, lower_shrink, 0},
    {NULL, NULL, 0, NULL, 0},
};
