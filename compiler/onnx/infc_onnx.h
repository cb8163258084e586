/* infc_onnx: the ONNX frontend. Loads a ModelProto (protobuf-c over an mmap of the file;
 * external data files beside it mapped too), checks it, and lowers its graph as it is to
 * the n-d generic IR ops, ready for the pass pipeline. Shapes are static in the IR: symbolic
 * input dims take sizes from bindings (the LLM recognition's specializations, the points of
 * a dynamic-shape profile: infc_onnx_profile.h), and shape arithmetic folds at import.
 *
 * Errors name the file and the node: "model.onnx: node 'Attn_3': op 'GroupQueryAttention'
 * (domain com.microsoft, opset 1) is not supported". Operators the frontend lacks, dtypes
 * the IR lacks and unbound symbolic input dims are IR_UNSUPPORTED; malformed models
 * IR_BAD_FORMAT. */
#ifndef INFC_ONNX_H
#define INFC_ONNX_H

#include <stdbool.h>
#include <stdint.h>

#include "fmt_onnx_tensor.h"
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

/* Loads (maps and unpacks) `path` without lowering it; errors name the file. */
ir_status infc_onnx_load(const char *path, infc_onnx **out, ir_diag *d);
/* XXH3 of the model file and its external data: 16 hex digits + NUL into out. */
void infc_onnx_hash(const infc_onnx *m, char *out);

/* A graph input fixed to a value at build time: the input becomes a constant, so shape
 * operands fed as inputs (a Reshape target, Slice bounds, ...) can be resolved. The
 * value must have the input's dtype and its declared fixed dims (its symbolic dims take
 * the value's extents). With value NULL the input stays an input and only its shape is
 * fixed: `shape` (rank values) gives every dim, symbolic ones included (a specialization,
 * as the LLM recognition imports a graph at a few sizes). */
typedef struct infc_onnx_binding {
  const char *name;
  const fmt_onnx_tensor *value;
  int rank;
  const int64_t *shape;
} infc_onnx_binding;

/* infc_onnx_import with bindings (every binding must name a graph input). */
ir_status infc_onnx_import_bound(const char *path, const ir_model_config *limits,
                                 const infc_onnx_binding *binds, int n_binds, infc_onnx **out_model,
                                 ir_graph **out_graph, char *out_hash, ir_diag *d);

/* The graph of an already loaded model, lowered with bindings as infc_onnx_import_bound
 * does; m stays the caller's and must outlive the graph. Importing one model at several
 * bindings (the LLM recognition's sizes, a shape profile's points) unpacks it once. */
ir_status infc_onnx_import_loaded(infc_onnx *m, const ir_model_config *limits,
                                  const infc_onnx_binding *binds, int n_binds, ir_graph **out_graph,
                                  ir_diag *d);

#endif
