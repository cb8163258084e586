/* infc_onnx: the ONNX frontend. Loads a ModelProto (protobuf-c over an mmap of the file;
 * external data files beside it mapped too), checks it, and lowers its graph to the n-d
 * generic IR ops with static shapes (shape arithmetic folded at import), ready for the
 * pass pipeline. Also reads and writes serialized TensorProto files (`inferrt run`, the
 * conformance runner).
 *
 * Errors name the file and the node: "model.onnx: node 'Attn_3': op 'GroupQueryAttention'
 * (domain com.microsoft, opset 1) is not supported". Operators the frontend lacks, dtypes
 * the IR lacks and symbolic input dims are IR_UNSUPPORTED; malformed models IR_BAD_FORMAT. */
#ifndef INFC_ONNX_H
#define INFC_ONNX_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"

#define INFC_ONNX_MAX_OPSET 24 /* newest ai.onnx opset this frontend knows */

typedef struct infc_onnx infc_onnx;

/* True if path names an ONNX model (".onnx"). */
bool infc_onnx_is_source(const char *path);

/* Loads `path` and lowers it. *out_model holds the mappings the graph's weights point
 * into: close it only after the graph is destroyed. Both are owned by the caller.
 * limits (may be NULL: all 1) supplies the step limits recorded in the graph's config; a
 * generic graph has no symbolic dims, so they size nothing. Its arch becomes "generic".
 * out_hash receives 16 hex digits + NUL (XXH3 of the model file and its external data). */
ir_status infc_onnx_import(const char *path, const ir_model_config *limits, infc_onnx **out_model,
                           ir_graph **out_graph, char *out_hash, ir_diag *d);
void infc_onnx_close(infc_onnx *m);

typedef struct infc_onnx_tensor infc_onnx_tensor;

/* A graph input fixed to a value at build time: the input becomes a constant, so shape
 * operands fed as inputs (a Reshape target, Slice bounds, ...) can be resolved. The
 * value must have the input's dtype and shape. */
typedef struct infc_onnx_binding {
  const char *name;
  const infc_onnx_tensor *value;
} infc_onnx_binding;

/* infc_onnx_import with bindings (every binding must name a graph input). */
ir_status infc_onnx_import_bound(const char *path, const ir_model_config *limits,
                                 const infc_onnx_binding *binds, int n_binds,
                                 infc_onnx **out_model, ir_graph **out_graph, char *out_hash,
                                 ir_diag *d);

/* --- TensorProto files -------------------------------------------------------------- */

/* A dense tensor read from a TensorProto. BOOL reads as u8 with is_bool set; UINT16 reads
 * as bf16 bits with raw16 set (older ONNX test data stores bfloat16 values that way; the
 * IR has no uint16, so a caller that wants a real uint16 must refuse raw16). */
struct infc_onnx_tensor {
  char *name; /* owned; "" when the proto has none */
  ir_dtype dtype;
  bool is_bool, raw16;
  int rank;
  int64_t shape[IR_MAX_RANK];
  void *data; /* owned, nbytes */
  uint64_t nbytes;
};

/* Reads a serialized TensorProto (inline data only). Free with infc_onnx_tensor_free. */
ir_status infc_onnx_tensor_load(const char *path, infc_onnx_tensor *out, ir_diag *d);
void infc_onnx_tensor_free(infc_onnx_tensor *t);
/* Writes a TensorProto with raw_data. is_bool writes u8 data as BOOL. */
ir_status infc_onnx_tensor_save(const char *path, const char *name, ir_dtype dt, bool is_bool,
                                int rank, const int64_t *shape, const void *data, ir_diag *d);

/* ONNX TensorProto.DataType <-> IR dtype. Returns false for types the IR lacks; BOOL maps
 * to u8 with *out_bool set. */
bool infc_onnx_dtype_to_ir(int32_t onnx_type, ir_dtype *out, bool *out_bool);
int32_t infc_onnx_dtype_from_ir(ir_dtype dt, bool is_bool);
const char *infc_onnx_dtype_name(int32_t onnx_type);

#endif
