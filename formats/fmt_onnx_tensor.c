/* fmt_onnx_tensor: TensorProto decoding (inline raw or typed data, or external data through
 * the caller's resolver), dtype mapping, and reading / writing standalone TensorProto files. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_onnx_tensor.h"
#include "ir_file.h"
#include "ir_op_nd.h"
#include "onnx.pb-c.h"
#include "ir_alloc.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "raw ONNX tensor data is little-endian; this frontend reads it in place"
#endif

enum {
  OT_FLOAT = 1,
  OT_UINT8 = 2,
  OT_INT8 = 3,
  OT_UINT16 = 4,
  OT_INT16 = 5,
  OT_INT32 = 6,
  OT_INT64 = 7,
  OT_STRING = 8,
  OT_BOOL = 9,
  OT_FLOAT16 = 10,
  OT_DOUBLE = 11,
  OT_UINT32 = 12,
  OT_UINT64 = 13,
  OT_BFLOAT16 = 16,
};

static const char *const k_onnx_types[] = {
    "undefined",      "float",      "uint8",          "int8",       "uint16",   "int16",
    "int32",          "int64",      "string",         "bool",       "float16",  "double",
    "uint32",         "uint64",     "complex64",      "complex128", "bfloat16", "float8e4m3fn",
    "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "uint4",      "int4",     "float4e2m1",
    "float8e8m0",     "uint2",      "int2",
};

const char *fmt_onnx_dtype_name(int32_t t) {
  return t >= 0 && t < (int32_t)(sizeof k_onnx_types / sizeof *k_onnx_types) ? k_onnx_types[t]
                                                                             : "unknown";
}

bool fmt_onnx_dtype_to_ir(int32_t t, ir_dtype *out, bool *out_bool) {
  *out_bool = t == OT_BOOL;
  switch (t) {
  case OT_FLOAT: *out = IR_F32; return true;
  case OT_UINT8:
  case OT_BOOL: *out = IR_U8; return true;
  case OT_INT8: *out = IR_I8; return true;
  case OT_INT32: *out = IR_I32; return true;
  case OT_INT64: *out = IR_I64; return true;
  case OT_FLOAT16: *out = IR_F16; return true;
  case OT_BFLOAT16: *out = IR_BF16; return true;
  default: *out = IR_DTYPE_INVALID; return false;
  }
}

int32_t fmt_onnx_dtype_from_ir(ir_dtype dt, bool is_bool) {
  switch (dt) {
  case IR_F32: return OT_FLOAT;
  case IR_U8: return is_bool ? OT_BOOL : OT_UINT8;
  case IR_I8: return OT_INT8;
  case IR_I32: return OT_INT32;
  case IR_I64: return OT_INT64;
  case IR_F16: return OT_FLOAT16;
  case IR_BF16: return OT_BFLOAT16;
  default: return 0;
  }
}

static const char *tname(const Onnx__TensorProto *tp) {
  return tp->name && tp->name[0] ? tp->name : "(unnamed)";
}

/* Parses a non-negative decimal; false on anything else. */
static bool parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || s[0] == '-') return false;
  *out = v;
  return true;
}

static ir_status decode_external(const Onnx__TensorProto *tp, fmt_onnx_ext_fn ext, void *ctx,
                                 fmt_onnx_dense *out, ir_diag *d) {
  const char *loc = NULL;
  uint64_t offset = 0, length = out->nbytes;
  if (!ext)
    return ir_diag_set(d, IR_UNSUPPORTED, "tensor '%s': external data outside a model", tname(tp));
  for (size_t i = 0; i < tp->n_external_data; i++) {
    const char *k = tp->external_data[i]->key, *v = tp->external_data[i]->value;
    bool ok = true;
    if (!k || !v) ok = false;
    else if (!strcmp(k, "location")) loc = v;
    else if (!strcmp(k, "offset")) ok = parse_u64(v, &offset);
    else if (!strcmp(k, "length")) ok = parse_u64(v, &length);
    if (!ok)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': bad external_data entry '%s'", tname(tp),
                         k ? k : "");
  }
  if (!loc)
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': external data has no location", tname(tp));
  if (length != out->nbytes)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor '%s': external length %" PRIu64 " but the shape "
                       "needs %" PRIu64 " bytes",
                       tname(tp), length, out->nbytes);
  const uint8_t *p;
  ir_status st = ext(ctx, loc, offset, length, &p, d);
  if (st != IR_OK) {
    ir_diag_prefix(d, "tensor '%s'", tname(tp));
    return st;
  }
  out->data = p;
  if ((uintptr_t)p % 16 && out->nbytes) { /* kernels read typed values: realign */
    if (!(out->owned = ir_malloc(out->nbytes))) return ir_diag_set(d, IR_OOM, "out of memory");
    memcpy(out->owned, p, out->nbytes);
    out->data = out->owned;
  }
  return IR_OK;
}

/* Values stored in int32_data (every type narrower than 32 bits, and int32). */
static ir_status decode_int32(const Onnx__TensorProto *tp, fmt_onnx_dense *out, uint64_t n,
                              ir_diag *d) {
  if (tp->n_int32_data != n)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor '%s': %zu int32_data values for %" PRIu64 " elements", tname(tp),
                       tp->n_int32_data, n);
  if (!(out->owned = ir_malloc(out->nbytes ? out->nbytes : 1)))
    return ir_diag_set(d, IR_OOM, "out of memory");
  for (uint64_t i = 0; i < n; i++) {
    int32_t v = tp->int32_data[i];
    switch (out->dt) {
    case IR_I32: ((int32_t *)out->owned)[i] = v; break;
    case IR_I8: ((int8_t *)out->owned)[i] = (int8_t)v; break;
    case IR_U8: ((uint8_t *)out->owned)[i] = out->is_bool ? v != 0 : (uint8_t)v; break;
    default: ((uint16_t *)out->owned)[i] = (uint16_t)v; break; /* f16 / bf16 bits */
    }
  }
  out->data = out->owned;
  return IR_OK;
}

static ir_status decode_inline(const Onnx__TensorProto *tp, fmt_onnx_dense *out, uint64_t n,
                               ir_diag *d) {
  if (tp->has_raw_data) {
    if (tp->raw_data.len != out->nbytes)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "tensor '%s': %zu bytes of raw_data, the shape needs "
                         "%" PRIu64,
                         tname(tp), tp->raw_data.len, out->nbytes);
    out->data = tp->raw_data.data;
    return IR_OK;
  }
  switch (tp->data_type) {
  case OT_FLOAT:
    if (tp->n_float_data != n) break;
    out->data = tp->float_data;
    return IR_OK;
  case OT_INT64:
    if (tp->n_int64_data != n) break;
    out->data = tp->int64_data;
    return IR_OK;
  default: return decode_int32(tp, out, n, d);
  }
  return ir_diag_set(d, IR_BAD_FORMAT,
                     "tensor '%s': its data does not match its %" PRIu64 " elements", tname(tp), n);
}

ir_status fmt_onnx_tensor_decode(const Onnx__TensorProto *tp, fmt_onnx_ext_fn ext, void *ext_ctx,
                                 fmt_onnx_dense *out, ir_diag *d) {
  static const uint64_t empty[1];
  memset(out, 0, sizeof *out);
  if (!fmt_onnx_dtype_to_ir(tp->data_type, &out->dt, &out->is_bool))
    return ir_diag_set(d, IR_UNSUPPORTED, "tensor '%s': dtype %s is not supported", tname(tp),
                       fmt_onnx_dtype_name(tp->data_type));
  if (tp->n_dims > IR_MAX_RANK)
    return ir_diag_set(d, IR_UNSUPPORTED, "tensor '%s': rank %zu exceeds %d", tname(tp), tp->n_dims,
                       IR_MAX_RANK);
  if (tp->segment) return ir_diag_set(d, IR_UNSUPPORTED, "tensor '%s': segmented", tname(tp));
  out->rank = (int)tp->n_dims;
  for (int i = 0; i < out->rank; i++) out->shape[i] = tp->dims[i];
  int64_t n = ir_nd_numel(out->rank, out->shape);
  if (n < 0 || (uint64_t)n > (1ull << 58))
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': bad dims", tname(tp));
  out->nbytes = ir_dtype_bytes(out->dt, (uint64_t)n);
  out->data = empty;
  if (n == 0) return IR_OK;
  if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
    return decode_external(tp, ext, ext_ctx, out, d);
  return decode_inline(tp, out, (uint64_t)n, d);
}

/* --- TensorProto files ------------------------------------------------------------------- */

ir_status fmt_onnx_tensor_load(const char *path, fmt_onnx_tensor *out, ir_diag *d) {
  char *buf = NULL;
  size_t len = 0;
  fmt_onnx_dense dn = {0};
  memset(out, 0, sizeof *out);
  struct stat sb; /* read exactly the file: infc_read_file allocates its bound up front */
  ir_status st = stat(path, &sb) != 0 ? ir_diag_set(d, IR_IO, "cannot open: %s", strerror(errno))
                 : sb.st_size > (1ll << 31) ? ir_diag_set(d, IR_UNSUPPORTED, "larger than 2 GiB")
                                            : IR_OK;
  if (st == IR_OK) st = ir_file_read(path, (size_t)sb.st_size, &buf, &len, d);
  Onnx__TensorProto *tp = NULL;
  unsigned long fails = ir_alloc_failures();
  if (st == IR_OK && !(tp = onnx__tensor_proto__unpack(&ir_pb_alloc, len, (const uint8_t *)buf)))
    st = ir_alloc_failed_since(fails)
             ? ir_diag_set(d, IR_OOM, "out of memory")
             : ir_diag_set(d, IR_BAD_FORMAT, "not a serialized TensorProto");
  if (st == IR_OK && tp->data_type == OT_UINT16) { /* bfloat16 bits, in older test data */
    tp->data_type = OT_BFLOAT16;
    out->raw16 = true;
  }
  if (st == IR_OK) st = fmt_onnx_tensor_decode(tp, NULL, NULL, &dn, d);
  if (st == IR_OK) {
    out->name = ir_strdup(tp->name ? tp->name : "");
    out->data = ir_malloc(dn.nbytes ? dn.nbytes : 1);
    if (!out->name || !out->data) st = ir_diag_set(d, IR_OOM, "out of memory");
  }
  if (st == IR_OK) {
    memcpy(out->data, dn.data, dn.nbytes);
    out->dtype = dn.dt;
    out->is_bool = dn.is_bool;
    out->rank = dn.rank;
    memcpy(out->shape, dn.shape, sizeof out->shape);
    out->nbytes = dn.nbytes;
  }
  ir_free(dn.owned);
  if (tp) onnx__tensor_proto__free_unpacked(tp, &ir_pb_alloc);
  ir_free(buf);
  if (st != IR_OK) {
    fmt_onnx_tensor_free(out);
    ir_diag_prefix(d, "%s", path);
  }
  return st;
}

void fmt_onnx_tensor_free(fmt_onnx_tensor *t) {
  if (!t) return;
  ir_free(t->name);
  ir_free(t->data);
  memset(t, 0, sizeof *t);
}

ir_status fmt_onnx_tensor_save(const char *path, const char *name, ir_dtype dt, bool is_bool,
                               int rank, const int64_t *shape, const void *data, ir_diag *d) {
  Onnx__TensorProto tp;
  onnx__tensor_proto__init(&tp);
  int64_t dims[IR_MAX_RANK];
  int64_t n = ir_nd_numel(rank, shape);
  tp.data_type = fmt_onnx_dtype_from_ir(dt, is_bool);
  if (!tp.data_type || rank < 0 || rank > IR_MAX_RANK || n < 0)
    return ir_diag_set(d, IR_INVALID_ARG, "%s: cannot write a %s tensor", path, ir_dtype_name(dt));
  for (int i = 0; i < rank; i++) dims[i] = shape[i];
  tp.has_data_type = 1;
  tp.n_dims = (size_t)rank;
  tp.dims = dims;
  tp.name = (char *)name;
  tp.has_raw_data = 1;
  tp.raw_data.len = (size_t)ir_dtype_bytes(dt, (uint64_t)n);
  tp.raw_data.data = (uint8_t *)data;
  size_t size = onnx__tensor_proto__get_packed_size(&tp);
  uint8_t *buf = ir_malloc(size ? size : 1);
  if (!buf) return ir_diag_set(d, IR_OOM, "out of memory");
  onnx__tensor_proto__pack(&tp, buf);
  FILE *f = fopen(path, "wb");
  bool ok = f && fwrite(buf, 1, size, f) == size;
  if (f && fclose(f) != 0) ok = false;
  ir_free(buf);
  if (!ok) return ir_diag_set(d, IR_IO, "%s: cannot write: %s", path, strerror(errno));
  return IR_OK;
}
