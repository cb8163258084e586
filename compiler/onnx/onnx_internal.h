/* onnx_internal: what the ONNX frontend's files share: the loaded model, TensorProto
 * decoding, and the importer context with the helpers every op lowering uses.
 * Internal to compiler/onnx. */
#ifndef ONNX_INTERNAL_H
#define ONNX_INTERNAL_H

#include <stddef.h>

#include "infc_onnx.h"
#include "ir_op_nd.h"
#include "onnx.pb-c.h"

#define ONNX_MAX_EXT_FILES 1024

typedef struct onnx_ext_file {
  char *location; /* as written in the model, relative to its directory */
  const uint8_t *map;
  size_t size;
} onnx_ext_file;

struct infc_onnx {
  char *path;
  char dir[4096]; /* the model's directory, resolved (realpath) */
  const uint8_t *map;
  size_t map_size;
  Onnx__ModelProto *model;
  onnx_ext_file *ext;
  int n_ext;
};

typedef fmt_onnx_dense onnx_dense;

/* Decodes tp (formats/fmt_onnx_tensor). External data is resolved through m (NULL:
 * refused). */
ir_status onnx_tensor_decode(const Onnx__TensorProto *tp, infc_onnx *m, onnx_dense *out,
                             ir_diag *d);

/* onnx_load.c: maps and unpacks the model; resolves an external data location.
 * (infc_onnx_hash, infc_onnx.h: the model's hash.) */
ir_status onnx_model_load(const char *path, infc_onnx **out, ir_diag *d);
ir_status onnx_ext_resolve(infc_onnx *m, const char *location, uint64_t offset, uint64_t length,
                           const uint8_t **out, ir_diag *d);

/* --- the importer ------------------------------------------------------------------- */

typedef struct onnx_names onnx_names; /* value name -> tensor index */

typedef struct onnx_imp {
  infc_onnx *m;
  ir_graph *g;
  onnx_names *names;
  int64_t opset; /* ai.onnx */
  const Onnx__NodeProto *node;
  int node_index;
  char where[320];                /* "node 'name'" for messages */
  int n_tmp;                      /* intermediate tensors made for this node */
  int32_t first_tensor;           /* tensors from this index on were made for this node */
  const infc_onnx_binding *binds; /* graph inputs fixed to values */
  int n_binds;
  ir_diag *d;
} onnx_imp;

typedef ir_status (*onnx_lower_fn)(onnx_imp *im, int arg);

typedef struct onnx_op {
  const char *domain; /* "" (ai.onnx) or "com.microsoft" */
  const char *name;
  int since; /* first opset of the domain that has it */
  onnx_lower_fn fn;
  int arg; /* passed to fn: usually the ir_op */
} onnx_op;

/* Op tables of the lowering files, each ending with a {NULL} entry. */
extern const onnx_op onnx_ops_elementwise[];
extern const onnx_op onnx_ops_shape[];
extern const onnx_op onnx_ops_nn[];
extern const onnx_op onnx_ops_compose[];

/* Error for the current node: "node 'x': <message>". */
ir_status imp_fail(onnx_imp *im, ir_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Inputs: count, the tensor of input i (-1 when absent or ""), and the same but failing
 * when a required one is absent. */
int imp_n_in(const onnx_imp *im);
int32_t imp_in(onnx_imp *im, int i);
int32_t imp_in_req(onnx_imp *im, int i);
const ir_tensor *imp_t(const onnx_imp *im, int32_t t);
/* Whether output k of the node is wanted (exists and is not ""). */
bool imp_out_wanted(const onnx_imp *im, int k);
int imp_n_out(const onnx_imp *im);

/* Attributes of the current node. */
const Onnx__AttributeProto *imp_attr(const onnx_imp *im, const char *name);
int64_t imp_attr_i(const onnx_imp *im, const char *name, int64_t def);
float imp_attr_f(const onnx_imp *im, const char *name, float def);
/* String attribute into buf ("" when absent). */
void imp_attr_s(const onnx_imp *im, const char *name, char *buf, size_t len);
/* Int list attribute: NULL with *n = -1 when absent. */
const int64_t *imp_attr_ints(const onnx_imp *im, const char *name, int *n);
bool imp_attr_req(onnx_imp *im, const char *name);

/* Values of a constant integer tensor (a weight of any int dtype), at most max of them.
 * Fails naming `what` when the tensor is not constant. */
ir_status imp_const_ints(onnx_imp *im, int32_t t, const char *what, int64_t *vals, int max, int *n);
/* The single value of a constant scalar-like tensor as double. */
ir_status imp_const_scalar(onnx_imp *im, int32_t t, const char *what, double *out);
bool imp_is_const(const onnx_imp *im, int32_t t);

/* A new weight (data copied into memory the graph owns). */
int32_t imp_weight(onnx_imp *im, const char *suffix, ir_dtype dt, int rank, const int64_t *shape,
                   const void *data);
/* Adds an IR node for the current ONNX node (name: the node's, plus /suffix for helper
 * nodes), folding it at once when its inputs are constant. Returns its first output
 * (all outputs in outs, if non-NULL), or -1 with d set. */
int32_t imp_emit(onnx_imp *im, ir_op op, const char *suffix, const int32_t *in, int n_in,
                 const ir_attr *attrs, int n_attrs, int32_t *outs);
/* Binds ONNX output k of the node to tensor t (renaming t after it when the lowering
 * made t). */
ir_status imp_bind(onnx_imp *im, int k, int32_t t);

/* Casts t to dt (no node when it already is). */
int32_t imp_cast(onnx_imp *im, int32_t t, ir_dtype dt);
/* f16/bf16 tensors widened to f32 (others unchanged), for ops that compute in f32. */
int32_t imp_f32(onnx_imp *im, int32_t t);
/* Reshape t to the given shape. */
int32_t imp_reshape(onnx_imp *im, int32_t t, int rank, const int64_t *shape);
/* Static shape of t. */
int imp_shape(const onnx_imp *im, int32_t t, int64_t *shape);
/* Normalises axis against rank; fails (d set) when out of range. */
bool imp_axis(onnx_imp *im, int64_t axis, int rank, int *out);

#endif
