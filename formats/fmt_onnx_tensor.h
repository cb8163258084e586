/* fmt_onnx_tensor: ONNX TensorProto messages: dtype mapping, decoding (inline raw or typed
 * data; external data through a resolver the caller gives), and reading / writing
 * standalone TensorProto files (`inferrt run`'s inputs and outputs, the conformance
 * runner). The ONNX frontend (compiler/onnx) decodes its initializers through here. */
#ifndef FMT_ONNX_TENSOR_H
#define FMT_ONNX_TENSOR_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"

typedef struct fmt_onnx_tensor fmt_onnx_tensor;

/* --- TensorProto files -------------------------------------------------------------- */

/* A dense tensor read from a TensorProto. BOOL reads as u8 with is_bool set; UINT16 reads
 * as bf16 bits with raw16 set (older ONNX test data stores bfloat16 values that way; the
 * IR has no uint16, so a caller that wants a real uint16 must refuse raw16). */
struct fmt_onnx_tensor {
  char *name; /* owned; "" when the proto has none */
  ir_dtype dtype;
  bool is_bool, raw16;
  int rank;
  int64_t shape[IR_MAX_RANK];
  void *data; /* owned, nbytes */
  uint64_t nbytes;
};

/* Reads a serialized TensorProto (inline data only). Free with fmt_onnx_tensor_free. */
ir_status fmt_onnx_tensor_load(const char *path, fmt_onnx_tensor *out, ir_diag *d);
void fmt_onnx_tensor_free(fmt_onnx_tensor *t);
/* Writes a TensorProto with raw_data. is_bool writes u8 data as BOOL. */
ir_status fmt_onnx_tensor_save(const char *path, const char *name, ir_dtype dt, bool is_bool,
                               int rank, const int64_t *shape, const void *data, ir_diag *d);

/* ONNX TensorProto.DataType <-> IR dtype. Returns false for types the IR lacks; BOOL maps
 * to u8 with *out_bool set. */
bool fmt_onnx_dtype_to_ir(int32_t onnx_type, ir_dtype *out, bool *out_bool);
int32_t fmt_onnx_dtype_from_ir(ir_dtype dt, bool is_bool);
const char *fmt_onnx_dtype_name(int32_t onnx_type);

/* --- decoding one TensorProto message ------------------------------------------------ */

/* A decoded tensor: data borrowed from the message or a mapping, or `owned` (malloc'd,
 * to be freed or adopted by the caller) when it had to be converted or realigned. */
typedef struct fmt_onnx_dense {
  ir_dtype dt;
  bool is_bool;
  int rank;
  int64_t shape[IR_MAX_RANK];
  const void *data;
  uint64_t nbytes;
  void *owned;
} fmt_onnx_dense;

/* Resolves external data: `length` bytes at `offset` of the file `location` (relative to
 * the model). *out points into a mapping that outlives the decoded tensor. */
typedef ir_status (*fmt_onnx_ext_fn)(void *ctx, const char *location, uint64_t offset,
                                     uint64_t length, const uint8_t **out, ir_diag *d);

struct Onnx__TensorProto;
/* Decodes tp. External data goes through ext (NULL: refused). */
ir_status fmt_onnx_tensor_decode(const struct Onnx__TensorProto *tp, fmt_onnx_ext_fn ext,
                                 void *ext_ctx, fmt_onnx_dense *out, ir_diag *d);

#endif
