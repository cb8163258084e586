/* onnx_ops_shape: lowering of the ONNX shape and data-movement ops. Every shape-valued
 * operand (Reshape's shape, axes, Slice bounds, pads, repeats, ...) must be constant by
 * the time the node is lowered (earlier constant nodes fold as they are lowered); it is
 * resolved here with ONNX's rules (0 and -1 in Reshape, clamping in Slice, negative axes)
 * into the explicit attributes of the n-d ops. Shape, Size, ConstantOfShape, Range and
 * EyeLike produce constants directly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_internal.h"
#include "ir_alloc.h"

#define A(name) ir_attr_intern(name)
#define MAXV IR_MAX_ATTR_INTS

/* The int list given as attribute `name` (before opset `input_since`) or as input
 * `input`; *n = -1 when neither is present. */
static ir_status ints_arg(onnx_imp *im, const char *name, int input, int64_t input_since,
                          int64_t *vals, int *n) {
  *n = -1;
  if (im->opset < input_since) {
    const int64_t *v = imp_attr_ints(im, name, n);
    if (*n > MAXV) return imp_fail(im, IR_UNSUPPORTED, "'%s' has %d values", name, *n);
    if (*n > 0) memcpy(vals, v, (size_t)*n * sizeof *vals);
    return IR_OK;
  }
  int32_t t = imp_in(im, input);
  return t < 0 ? IR_OK : imp_const_ints(im, t, name, vals, MAXV, n);
}

static ir_status bind_reshape(onnx_imp *im, int32_t x, int rank, const int64_t *shape) {
  if (x < 0) return im->d->status;
  ir_attr a[1] = {IR_AIS(A("shape"), shape, rank)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_RESHAPE, NULL, &x, 1, a, 1, NULL));
}

static ir_status lower_reshape(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0), s = x >= 0 ? imp_in_req(im, 1) : -1;
  int64_t in[IR_MAX_RANK], shape[MAXV];
  int n, r, neg = -1;
  if (s < 0) return im->d->status;
  r = imp_shape(im, x, in);
  ir_status st = imp_const_ints(im, s, "shape", shape, MAXV, &n);
  if (st != IR_OK) return st;
  if (n > IR_MAX_RANK) return imp_fail(im, IR_UNSUPPORTED, "rank %d exceeds %d", n, IR_MAX_RANK);
  bool allowzero = imp_attr_i(im, "allowzero", 0) != 0;
  int64_t known = 1;
  for (int i = 0; i < n; i++) {
    if (shape[i] == 0 && !allowzero) {
      if (i >= r)
        return imp_fail(im, IR_BAD_FORMAT, "shape copies dim %d of a rank-%d input", i, r);
      shape[i] = in[i];
    }
    if (shape[i] == -1) {
      if (neg >= 0) return imp_fail(im, IR_BAD_FORMAT, "shape has two -1 entries");
      neg = i;
    } else if (shape[i] < 0) {
      return imp_fail(im, IR_BAD_FORMAT, "shape has a negative entry");
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      return imp_fail(im, IR_BAD_FORMAT, "the shape's size overflows");
    }
  }
  if (neg >= 0) shape[neg] = known ? ir_nd_numel(r, in) / known : 0;
  return bind_reshape(im, x, n, shape);
}

static ir_status lower_flatten(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t in[IR_MAX_RANK], shape[2] = {1, 1};
  int axis;
  if (x < 0) return im->d->status;
  int r = imp_shape(im, x, in);
  int64_t ax = imp_attr_i(im, "axis", 1);
  if (ax != r && !imp_axis(im, ax, r, &axis)) return im->d->status;
  if (ax == r) axis = r;
  for (int i = 0; i < r; i++) shape[i < axis ? 0 : 1] *= in[i];
  return bind_reshape(im, x, 2, shape);
}

static ir_status lower_squeeze(onnx_imp *im, int arg) {
  bool unsq = arg != 0;
  int32_t x = imp_in_req(im, 0);
  int64_t in[IR_MAX_RANK], axes[MAXV], shape[IR_MAX_RANK];
  int n, out_rank = 0;
  if (x < 0) return im->d->status;
  int r = imp_shape(im, x, in);
  ir_status st = ints_arg(im, "axes", 1, 13, axes, &n);
  if (st != IR_OK) return st;
  int rr = unsq ? r + (n > 0 ? n : 0) : r;
  if (rr > IR_MAX_RANK) return imp_fail(im, IR_UNSUPPORTED, "rank %d exceeds %d", rr, IR_MAX_RANK);
  uint32_t mask = 0;
  for (int i = 0; i < n; i++) {
    int a;
    if (!imp_axis(im, axes[i], rr, &a)) return im->d->status;
    if (mask & (1u << a)) return imp_fail(im, IR_BAD_FORMAT, "axis %d repeats", a);
    mask |= 1u << a;
  }
  if (unsq) {
    if (n < 0) return imp_fail(im, IR_BAD_FORMAT, "Unsqueeze needs axes");
    for (int i = 0, k = 0; i < rr; i++) shape[out_rank++] = mask & (1u << i) ? 1 : in[k++];
  } else {
    for (int i = 0; i < r; i++) {
      bool drop = n > 0 ? (mask & (1u << i)) != 0 : in[i] == 1;
      if (drop && in[i] != 1)
        return imp_fail(im, IR_BAD_FORMAT, "cannot squeeze dim %d of size %lld", i,
                        (long long)in[i]);
      if (!drop) shape[out_rank++] = in[i];
    }
  }
  return bind_reshape(im, x, out_rank, shape);
}

static ir_status lower_transpose(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t in[IR_MAX_RANK], perm[IR_MAX_RANK];
  int n;
  if (x < 0) return im->d->status;
  int r = imp_shape(im, x, in);
  const int64_t *p = imp_attr_ints(im, "perm", &n);
  if (n >= 0 && n != r) return imp_fail(im, IR_BAD_FORMAT, "perm has %d entries for rank %d", n, r);
  for (int i = 0; i < r; i++) perm[i] = n >= 0 ? (p[i] < 0 ? p[i] + r : p[i]) : r - 1 - i;
  ir_attr a[1] = {IR_AIS(A("perm"), perm, r)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_TRANSPOSE, NULL, &x, 1, a, 1, NULL));
}

static ir_status lower_concat(onnx_imp *im, int arg) {
  int32_t in[IR_MAX_IO], acc = -1;
  int n = imp_n_in(im), k = 0, axis;
  int64_t s[IR_MAX_RANK];
  if (!imp_attr_req(im, "axis")) return im->d->status;
  int32_t x0 = imp_in_req(im, 0);
  if (x0 < 0 || !imp_axis(im, imp_attr_i(im, "axis", 0), imp_shape(im, x0, s), &axis))
    return im->d->status;
  ir_attr a[1] = {IR_AI(A("axis"), axis)};
  for (int i = 0; i < n; i++) { /* groups of IR_MAX_IO inputs, chained */
    int32_t t = imp_in(im, i);
    if (t < 0) continue;
    in[k++] = t;
    if (k == IR_MAX_IO || i == n - 1) {
      acc = imp_emit(im, IR_OP_ND_CONCAT, k == n ? NULL : "concat", in, k, a, 1, NULL);
      if (acc < 0) return im->d->status;
      in[0] = acc;
      k = 1;
    }
  }
  return imp_bind(im, 0, acc);
}

static ir_status lower_split(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0), outs[IR_MAX_IO];
  int64_t in[IR_MAX_RANK], sizes[MAXV];
  int n, axis, no = imp_n_out(im);
  if (x < 0 || !imp_axis(im, imp_attr_i(im, "axis", 0), imp_shape(im, x, in), &axis))
    return im->d->status;
  if (no < 1 || no > IR_MAX_IO) return imp_fail(im, IR_UNSUPPORTED, "%d outputs", no);
  ir_status st = ints_arg(im, "split", 1, 13, sizes, &n);
  if (st != IR_OK) return st;
  if (n < 0) { /* equal parts; the last smaller if it must be (opset 18 num_outputs) */
    int64_t part = (in[axis] + no - 1) / no;
    for (int i = 0; i < no; i++) sizes[i] = in[axis] - i * part < part ? in[axis] - i * part : part;
    n = no;
  }
  if (n != no) return imp_fail(im, IR_BAD_FORMAT, "split has %d sizes for %d outputs", n, no);
  ir_attr a[2] = {IR_AI(A("axis"), axis), IR_AIS(A("split"), sizes, n)};
  if (imp_emit(im, IR_OP_ND_SPLIT, NULL, &x, 1, a, 2, outs) < 0) return im->d->status;
  for (int i = 0; i < no && st == IR_OK; i++) st = imp_bind(im, i, outs[i]);
  return st;
}

/* ONNX Slice bounds for one axis of extent n: clamped start, step and element count. */
static void slice_axis(int64_t n, int64_t start, int64_t end, int64_t step, int64_t *out_start,
                       int64_t *out_len) {
  if (start < 0) start += n;
  if (end < 0) end += n;
  if (step > 0) {
    start = start < 0 ? 0 : start > n ? n : start;
    end = end < 0 ? 0 : end > n ? n : end;
  } else {
    start = start < 0 ? -1 : start > n - 1 ? n - 1 : start;
    end = end < -1 ? -1 : end > n - 1 ? n - 1 : end;
  }
  int64_t len = step > 0 ? (end - start + step - 1) / step : (start - end + (-step) - 1) / (-step);
  *out_len = len > 0 ? len : 0;
  *out_start = *out_len ? start : 0;
}

static ir_status lower_slice(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t in[IR_MAX_RANK], st4[4][MAXV], starts[IR_MAX_RANK], steps[IR_MAX_RANK],
      shape[IR_MAX_RANK];
  int cnt[4] = {-1, -1, -1, -1};
  static const char *const names[4] = {"starts", "ends", "axes", "steps"};
  if (x < 0) return im->d->status;
  int r = imp_shape(im, x, in);
  for (int k = 0; k < 4; k++) {
    ir_status s = ints_arg(im, names[k], k + 1, 10, st4[k], &cnt[k]);
    if (s != IR_OK) return s;
  }
  if (cnt[0] < 0 || cnt[1] != cnt[0] || (cnt[2] >= 0 && cnt[2] != cnt[0]) ||
      (cnt[3] >= 0 && cnt[3] != cnt[0]))
    return imp_fail(im, IR_BAD_FORMAT, "starts, ends, axes and steps differ in length");
  for (int i = 0; i < r; i++) starts[i] = 0, steps[i] = 1, shape[i] = in[i];
  uint32_t seen = 0;
  for (int i = 0; i < cnt[0]; i++) {
    int axis;
    if (!imp_axis(im, cnt[2] >= 0 ? st4[2][i] : i, r, &axis)) return im->d->status;
    int64_t step = cnt[3] >= 0 ? st4[3][i] : 1;
    if (step == 0 || (seen & (1u << axis)))
      return imp_fail(im, IR_BAD_FORMAT, "bad slice on axis %d", axis);
    seen |= 1u << axis;
    steps[axis] = step;
    slice_axis(in[axis], st4[0][i], st4[1][i], step, &starts[axis], &shape[axis]);
  }
  ir_attr a[3] = {IR_AIS(A("starts"), starts, r), IR_AIS(A("steps"), steps, r),
                  IR_AIS(A("shape"), shape, r)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_SLICE, NULL, &x, 1, a, 3, NULL));
}

static ir_status lower_expand(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0), s = x >= 0 ? imp_in_req(im, 1) : -1;
  int64_t shape[MAXV];
  int n;
  if (s < 0) return im->d->status;
  ir_status st = imp_const_ints(im, s, "shape", shape, MAXV, &n);
  if (st != IR_OK) return st;
  ir_attr a[1] = {IR_AIS(A("shape"), shape, n)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_EXPAND, NULL, &x, 1, a, 1, NULL));
}

static ir_status lower_tile(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0), s = x >= 0 ? imp_in_req(im, 1) : -1;
  int64_t rep[MAXV];
  int n;
  if (s < 0) return im->d->status;
  ir_status st = imp_const_ints(im, s, "repeats", rep, MAXV, &n);
  if (st != IR_OK) return st;
  ir_attr a[1] = {IR_AIS(A("repeats"), rep, n)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_TILE, NULL, &x, 1, a, 1, NULL));
}

static ir_status lower_pad(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t in[IR_MAX_RANK], raw[MAXV], axes[MAXV], pads[2 * IR_MAX_RANK] = {0};
  int n, na = -1;
  char mode[16];
  double value = 0;
  if (x < 0) return im->d->status;
  int r = imp_shape(im, x, in);
  ir_status st = ints_arg(im, "pads", 1, 11, raw, &n);
  if (st == IR_OK && im->opset >= 11 && imp_in(im, 2) >= 0)
    st = imp_const_scalar(im, imp_in(im, 2), "constant_value", &value);
  if (st == IR_OK && im->opset >= 18 && imp_in(im, 3) >= 0)
    st = imp_const_ints(im, imp_in(im, 3), "axes", axes, MAXV, &na);
  if (st != IR_OK) return st;
  if (im->opset < 11) value = imp_attr_f(im, "value", 0.0f);
  int k = na >= 0 ? na : r;
  if (n != 2 * k) return imp_fail(im, IR_BAD_FORMAT, "pads has %d values for %d axes", n, k);
  for (int i = 0; i < k; i++) {
    int axis = i;
    if (na >= 0 && !imp_axis(im, axes[i], r, &axis)) return im->d->status;
    pads[axis] = raw[i];
    pads[axis + r] = raw[i + k];
  }
  imp_attr_s(im, "mode", mode, sizeof mode);
  int m = !mode[0] || !strcmp(mode, "constant") ? 0
          : !strcmp(mode, "reflect")            ? 1
          : !strcmp(mode, "edge")               ? 2
          : !strcmp(mode, "wrap")               ? 3
                                                : -1;
  if (m < 0) return imp_fail(im, IR_UNSUPPORTED, "pad mode '%s'", mode);
  ir_attr a[3] = {IR_AIS(A("pads"), pads, 2 * r), IR_AI(A("mode"), m), IR_AF(A("value"), value)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_PAD, NULL, &x, 1, a, 3, NULL));
}

static ir_status lower_gather(onnx_imp *im, int arg) {
  int32_t in[2] = {imp_in_req(im, 0), imp_in_req(im, 1)};
  int64_t s[IR_MAX_RANK];
  int axis;
  if (in[0] < 0 || in[1] < 0 ||
      !imp_axis(im, imp_attr_i(im, "axis", 0), imp_shape(im, in[0], s), &axis))
    return im->d->status;
  ir_attr a[1] = {IR_AI(A("axis"), axis)};
  return imp_bind(im, 0, imp_emit(im, (ir_op)arg, NULL, in, 2, a, 1, NULL));
}

/* Row i of constant indices idx [.., k] as a flat offset into dims ds[0..k) (negative
 * indices count from the end); false, with the node's error set, when one is outside. */
static bool flat_index(onnx_imp *im, const ir_tensor *idx, int64_t i, int64_t k, const int64_t *ds,
                       int64_t *out) {
  int64_t f = 0;
  for (int64_t j = 0; j < k; j++) {
    int64_t v = idx->dtype == IR_I64 ? ((const int64_t *)idx->data)[i * k + j]
                                     : ((const int32_t *)idx->data)[i * k + j];
    if (v < -ds[j] || v >= ds[j]) {
      imp_fail(im, IR_INVALID_ARG, "index %lld is outside dim %lld of extent %lld", (long long)v,
               (long long)j, (long long)ds[j]);
      return false;
    }
    f = f * ds[j] + (v < 0 ? v + ds[j] : v);
  }
  *out = f;
  return true;
}

/* GatherND (batch_dims 0) with constant indices [..., k]: the data's first k dims
 * flattened into one, and a Gather of the flat row numbers computed here. Indices that
 * are runtime values are refused. */
static ir_status lower_gather_nd(onnx_imp *im, int arg) {
  (void)arg;
  int32_t x = imp_in_req(im, 0), it = imp_in_req(im, 1);
  if (x < 0 || it < 0) return im->d->status;
  if (imp_attr_i(im, "batch_dims", 0) != 0)
    return imp_fail(im, IR_UNSUPPORTED, "batch_dims %lld is not supported (only 0)",
                    (long long)imp_attr_i(im, "batch_dims", 0));
  const ir_tensor *idx = imp_t(im, it);
  if (!imp_is_const(im, it) || (idx->dtype != IR_I64 && idx->dtype != IR_I32))
    return imp_fail(im, IR_UNSUPPORTED, "indices ('%s') must be a constant int64/int32 tensor",
                    idx->name);
  int64_t ds[IR_MAX_RANK], is[IR_MAX_RANK];
  int r = imp_shape(im, x, ds), q = imp_shape(im, it, is);
  int64_t k = q > 0 ? is[q - 1] : -1;
  if (q < 1 || k < 1 || k > r || q - 1 + (r - k) + 1 > IR_MAX_RANK)
    return imp_fail(im, IR_BAD_FORMAT, "indices' last dim %lld does not fit data of rank %d",
                    (long long)k, r);
  int64_t rows = ir_nd_numel(q - 1, is), flat_n = ir_nd_numel((int)k, ds);
  if (rows < 0 || flat_n < 0 || rows > ((int64_t)1 << 26))
    return imp_fail(im, IR_UNSUPPORTED, "too many indices");
  int64_t *flat = ir_malloc((size_t)(rows ? rows : 1) * sizeof *flat);
  if (!flat) return imp_fail(im, IR_OOM, "out of memory");
  for (int64_t i = 0; i < rows; i++)
    if (!flat_index(im, idx, i, k, ds, &flat[i])) {
      ir_free(flat);
      return im->d->status;
    }
  int32_t ft = imp_weight(im, "flat_indices", IR_I64, q - 1, is, flat);
  ir_free(flat);
  int64_t shape[IR_MAX_RANK];
  shape[0] = flat_n;
  for (int j = (int)k; j < r; j++) shape[1 + j - k] = ds[j];
  int32_t in[2] = {imp_reshape(im, x, 1 + r - (int)k, shape), ft};
  if (ft < 0 || in[0] < 0) return im->d->status;
  ir_attr a[1] = {IR_AI(A("axis"), 0)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_GATHER, NULL, in, 2, a, 1, NULL));
}

/* ScatterND (reduction none) of constants, evaluated here: the IR has no scatter op, and
 * exporters emit it on build-time values (a mask's construction). Runtime operands are
 * refused. */
static ir_status lower_scatter_nd(onnx_imp *im, int arg) {
  (void)arg;
  int32_t x = imp_in_req(im, 0), it = imp_in_req(im, 1), u = imp_in_req(im, 2);
  if (x < 0 || it < 0 || u < 0) return im->d->status;
  char red[16];
  imp_attr_s(im, "reduction", red, sizeof red);
  if (red[0] && strcmp(red, "none"))
    return imp_fail(im, IR_UNSUPPORTED, "reduction '%s' is not supported", red);
  const ir_tensor *X = imp_t(im, x), *I = imp_t(im, it), *U = imp_t(im, u);
  if (!imp_is_const(im, x) || !imp_is_const(im, it) || !imp_is_const(im, u))
    return imp_fail(im, IR_UNSUPPORTED,
                    "only a ScatterND of constants is supported (it is evaluated at build time)");
  if ((I->dtype != IR_I64 && I->dtype != IR_I32) || U->dtype != X->dtype)
    return imp_fail(im, IR_BAD_FORMAT,
                    "indices must be int64/int32 and updates of the data's dtype");
  int64_t ds[IR_MAX_RANK], is[IR_MAX_RANK], us[IR_MAX_RANK];
  int r = imp_shape(im, x, ds), q = imp_shape(im, it, is), ur = imp_shape(im, u, us);
  int64_t k = q > 0 ? is[q - 1] : -1;
  if (q < 1 || k < 1 || k > r || ur != q - 1 + r - (int)k)
    return imp_fail(im, IR_BAD_FORMAT, "indices [.., %lld] do not fit data of rank %d",
                    (long long)k, r);
  for (int j = 0; j < q - 1; j++)
    if (us[j] != is[j]) return imp_fail(im, IR_BAD_FORMAT, "updates' shape does not match indices");
  for (int j = (int)k; j < r; j++)
    if (us[q - 1 + j - k] != ds[j])
      return imp_fail(im, IR_BAD_FORMAT, "updates' shape does not match the data");
  int64_t rows = ir_nd_numel(q - 1, is), slice = ir_nd_numel(r - (int)k, ds + k);
  size_t es = ir_dtype_bytes(X->dtype, 1);
  uint8_t *buf = ir_malloc(X->nbytes ? X->nbytes : 1);
  if (!buf) return imp_fail(im, IR_OOM, "out of memory");
  memcpy(buf, X->data, X->nbytes);
  for (int64_t i = 0; i < rows; i++) {
    int64_t f;
    if (!flat_index(im, I, i, k, ds, &f)) {
      ir_free(buf);
      return im->d->status;
    }
    memcpy(buf + (size_t)(f * slice) * es, (const uint8_t *)U->data + (size_t)(i * slice) * es,
           (size_t)slice * es);
  }
  int32_t t = imp_weight(im, "scatter", X->dtype, r, ds, buf);
  ir_free(buf);
  return imp_bind(im, 0, t);
}

static ir_status lower_trilu(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0), kt = imp_in(im, 1);
  double k = 0;
  if (x < 0 || (kt >= 0 && imp_const_scalar(im, kt, "k", &k) != IR_OK)) return im->d->status;
  ir_attr a[2] = {IR_AI(A("upper"), imp_attr_i(im, "upper", 1)), IR_AI(A("k"), (int64_t)k)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_TRILU, NULL, &x, 1, a, 2, NULL));
}

/* --- ops that produce constants ----------------------------------------------------- */

static ir_status lower_shape(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t s[IR_MAX_RANK];
  if (x < 0) return im->d->status;
  int r = imp_shape(im, x, s);
  int64_t b = imp_attr_i(im, "start", 0), e = imp_attr_i(im, "end", r);
  if (b < 0) b += r;
  if (e < 0) e += r;
  b = b < 0 ? 0 : b > r ? r : b;
  e = e < b ? b : e > r ? r : e;
  int64_t n = e - b;
  return imp_bind(im, 0, imp_weight(im, "shape", IR_I64, 1, &n, s + b));
}

static ir_status lower_size(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t s[IR_MAX_RANK];
  if (x < 0) return im->d->status;
  int64_t n = ir_nd_numel(imp_shape(im, x, s), s);
  return imp_bind(im, 0, imp_weight(im, "size", IR_I64, 0, NULL, &n));
}

/* The tensor attribute `name` as a weight (its data borrowed from the model, which
 * outlives the graph), or -1 when absent (d unset). */
static int32_t tensor_attr(onnx_imp *im, const char *name) {
  const Onnx__AttributeProto *at = imp_attr(im, name);
  onnx_dense dn;
  if (!at || !at->t) return -1;
  if (onnx_tensor_decode(at->t, im->m, &dn, im->d) != IR_OK) return -1;
  if (dn.owned && !ir_graph_adopt(im->g, dn.owned)) {
    imp_fail(im, IR_OOM, "out of memory");
    return -1;
  }
  int32_t t = ir_graph_add_weight(im->g, name, dn.dt, dn.rank, dn.shape, dn.data, dn.nbytes);
  if (t < 0) imp_fail(im, IR_OOM, "out of memory");
  return t;
}

static ir_status lower_constant_of_shape(onnx_imp *im, int arg) {
  int32_t s = imp_in_req(im, 0);
  int64_t shape[MAXV];
  int n;
  if (s < 0) return im->d->status;
  ir_status st = imp_const_ints(im, s, "shape", shape, MAXV, &n);
  if (st != IR_OK) return st;
  int32_t v = tensor_attr(im, "value");
  if (v < 0 && im->d->status) return im->d->status;
  if (v < 0) {
    float zero = 0;
    v = imp_weight(im, "zero", IR_F32, 0, NULL, &zero);
  }
  int64_t vs[IR_MAX_RANK];
  if (ir_nd_numel(imp_shape(im, v, vs), vs) != 1)
    return imp_fail(im, IR_BAD_FORMAT, "value must hold one element");
  v = imp_reshape(im, v, 0, NULL);
  ir_attr a[1] = {IR_AIS(A("shape"), shape, n)};
  return imp_bind(im, 0, imp_emit(im, IR_OP_ND_EXPAND, NULL, &v, 1, a, 1, NULL));
}

static ir_status lower_constant(onnx_imp *im, int arg) {
  const Onnx__AttributeProto *at;
  int32_t t = tensor_attr(im, "value");
  if (t >= 0 || im->d->status) return t >= 0 ? imp_bind(im, 0, t) : im->d->status;
  if ((at = imp_attr(im, "value_float")) && at->has_f)
    return imp_bind(im, 0, imp_weight(im, "value", IR_F32, 0, NULL, &at->f));
  if ((at = imp_attr(im, "value_int")) && at->has_i)
    return imp_bind(im, 0, imp_weight(im, "value", IR_I64, 0, NULL, &at->i));
  if ((at = imp_attr(im, "value_floats"))) {
    int64_t n = (int64_t)at->n_floats;
    return imp_bind(im, 0, imp_weight(im, "value", IR_F32, 1, &n, at->floats));
  }
  if ((at = imp_attr(im, "value_ints"))) {
    int64_t n = (int64_t)at->n_ints;
    return imp_bind(im, 0, imp_weight(im, "value", IR_I64, 1, &n, at->ints));
  }
  return imp_fail(im, IR_UNSUPPORTED, "Constant needs a tensor, float(s) or int(s) value");
}

static ir_status lower_range(onnx_imp *im, int arg) {
  double v[3];
  static const char *const what[3] = {"start", "limit", "delta"};
  int32_t t[3];
  for (int i = 0; i < 3; i++)
    if ((t[i] = imp_in_req(im, i)) < 0 || imp_const_scalar(im, t[i], what[i], &v[i]) != IR_OK)
      return im->d->status;
  ir_dtype dt = imp_t(im, t[0])->dtype;
  if (v[2] == 0) return imp_fail(im, IR_BAD_FORMAT, "delta is zero");
  double cnt = ceil((v[1] - v[0]) / v[2]);
  int64_t n = cnt > 0 ? (int64_t)cnt : 0;
  if (n > (1 << 26)) return imp_fail(im, IR_UNSUPPORTED, "range of %lld values", (long long)n);
  uint64_t bytes = ir_dtype_bytes(dt, (uint64_t)n);
  void *buf = ir_malloc(bytes ? bytes : 1);
  if (!buf) return imp_fail(im, IR_OOM, "out of memory");
  bool is_int = dt == IR_I64 || dt == IR_I32 || dt == IR_I8 || dt == IR_U8;
  for (int64_t i = 0; i < n; i++) {
    double x = is_int ? v[0] + (double)i * v[2] : (double)((float)v[0] + (float)i * (float)v[2]);
    switch (dt) {
    case IR_F32: ((float *)buf)[i] = (float)x; break;
    case IR_I64: ((int64_t *)buf)[i] = (int64_t)x; break;
    case IR_I32: ((int32_t *)buf)[i] = (int32_t)x; break;
    default: ir_free(buf); return imp_fail(im, IR_UNSUPPORTED, "Range over %s", ir_dtype_name(dt));
    }
  }
  int32_t r = imp_weight(im, "range", dt, 1, &n, buf);
  ir_free(buf);
  return imp_bind(im, 0, r);
}

static ir_status lower_eye_like(onnx_imp *im, int arg) {
  int32_t x = imp_in_req(im, 0);
  int64_t s[IR_MAX_RANK];
  ir_dtype dt;
  bool is_bool;
  if (x < 0) return im->d->status;
  if (imp_shape(im, x, s) != 2) return imp_fail(im, IR_BAD_FORMAT, "EyeLike takes a 2-d input");
  dt = imp_t(im, x)->dtype;
  int32_t want = (int32_t)imp_attr_i(im, "dtype", 1);
  if (imp_attr(im, "dtype") && !fmt_onnx_dtype_to_ir(want, &dt, &is_bool))
    return imp_fail(im, IR_UNSUPPORTED, "EyeLike: dtype %s is not supported",
                    fmt_onnx_dtype_name(want));
  int64_t k = imp_attr_i(im, "k", 0), n = 0;
  uint64_t es = ir_dtype_bytes(dt, 1);
  if (s[0] < 0 || s[1] < 0 || __builtin_mul_overflow(s[0], s[1], &n) || n > (1 << 28) / 8)
    return imp_fail(im, IR_UNSUPPORTED,
                    "EyeLike: a %lld x %lld constant is too large (at most "
                    "2^25 values)",
                    (long long)s[0], (long long)s[1]);
  uint8_t *buf = ir_calloc((size_t)(n ? n : 1), es);
  if (!buf) return imp_fail(im, IR_OOM, "out of memory");
  float onef = 1.0f;
  uint16_t one16 = dt == IR_F16 ? ir_f32_to_f16(1.0f) : ir_f32_to_bf16(1.0f);
  int64_t one64 = 1;
  for (int64_t i = 0; i < s[0]; i++) {
    int64_t j = i + k;
    if (j < 0 || j >= s[1]) continue;
    uint8_t *p = buf + (size_t)(i * s[1] + j) * es;
    if (dt == IR_F32) memcpy(p, &onef, 4);
    else if (dt == IR_F16 || dt == IR_BF16) memcpy(p, &one16, 2);
    else memcpy(p, &one64, es); /* little-endian: the low bytes of 1 */
  }
  int32_t t = imp_weight(im, "eye", dt, 2, s, buf);
  ir_free(buf);
  return imp_bind(im, 0, t);
}

const onnx_op onnx_ops_shape[] = {
    {"", "Reshape", 5, lower_reshape, 0},
    {"", "Flatten", 1, lower_flatten, 0},
    {"", "Squeeze", 1, lower_squeeze, 0},
    {"", "Unsqueeze", 1, lower_squeeze, 1},
    {"", "Transpose", 1, lower_transpose, 0},
    {"", "Concat", 4, lower_concat, 0},
    {"", "Split", 2, lower_split, 0},
    {"", "Slice", 1, lower_slice, 0},
    {"", "Expand", 8, lower_expand, 0},
    {"", "Tile", 6, lower_tile, 0},
    {"", "Pad", 2, lower_pad, 0},
    {"", "Gather", 1, lower_gather, IR_OP_ND_GATHER},
    {"", "GatherElements", 11, lower_gather, IR_OP_ND_GATHER_ELEMENTS},
    {"", "GatherND", 11, lower_gather_nd, 0},
    {"", "ScatterND", 11, lower_scatter_nd, 0},
    {"", "Trilu", 14, lower_trilu, 0},
    {"", "Shape", 1, lower_shape, 0},
    {"", "Size", 1, lower_size, 0},
    {"", "ConstantOfShape", 9, lower_constant_of_shape, 0},
    {"", "Constant", 1, lower_constant, 0},
    {"", "Range", 11, lower_range, 0},
    {"", "EyeLike", 9, lower_eye_like, 0},
    {NULL, NULL, 0, NULL, 0},
};
