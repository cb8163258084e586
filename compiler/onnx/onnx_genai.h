/* onnx_genai: what the GenAI recogniser's files share: the matcher state, graph lookup
 * helpers, the weight store and the contrib-op checks (attributes, MatMulNBits
 * dequantization, the RoPE cos/sin caches). Internal to compiler/onnx. */
#ifndef ONNX_GENAI_H
#define ONNX_GENAI_H

#include <stdbool.h>
#include <stddef.h>

#include "llama.h"
#include "onnx_internal.h"

typedef const Onnx__NodeProto gx_node;

typedef struct gx_vmap {
  const char *name;
  int idx; /* >= 0: producing node; < 0: initializer -(idx + 1) */
} gx_vmap;

typedef struct gx_weight {
  char name[96]; /* the HF name the Llama template asks for */
  model_tensor t;
} gx_weight;

typedef struct gx {
  infc_onnx *m;
  const Onnx__GraphProto *gp;
  gx_vmap *map;
  size_t n_map;
  ir_diag *d;
  ir_status st;
  int layer; /* for messages; -1 outside the layers */
  model_llama_params p;
  gx_weight *w;
  int n_w, cap_w;
  void **owned; /* buffers the graph adopts (transposed, dequantized, split weights) */
  int n_owned, cap_owned;
  /* what was seen, for the summary */
  int n_gqa, n_nbits, n_matmul;
  int64_t nbits_block;
  bool nbits_zp, nbits_mixed, packed_qkv, rope_node, skip_norm, quant_embed;
  const char *cos, *sin; /* the cos/sin caches checked so far */
  const char *embed_t;   /* the [hidden, vocab] matrix the embedding transposes (tied) */
  struct gx_qw *qw;      /* MatMulNBits weights that may stay packed */
  int n_qw, cap_qw, n_nbits_packable;
  bool keep_int4; /* MatMulNBits -> the int4 matmul (else dequantized: --dtype) */
  ir_dtype wdt;   /* the build's weight dtype (IR_DTYPE_INVALID: as stored) */
  int64_t rope_rows;
} gx;

/* --- lookup (onnx_genai_util.c) ------------------------------------------------------ */

bool gx_map_build(gx *G);
gx_node *gx_producer(const gx *G, const char *v);
bool gx_is_op(gx_node *n, const char *op);
const char *gx_in(gx_node *n, size_t i);  /* "" when absent */
const char *gx_out(gx_node *n, size_t i); /* "" when absent */
/* v with Cast and Identity nodes in front of it looked through. */
const char *gx_skip(const gx *G, const char *v);
bool gx_same(const gx *G, const char *a, const char *b);
bool gx_graph_input(const gx *G, const char *v);
bool gx_graph_output(const gx *G, const char *v);
/* The constant behind v (an initializer or a Constant node), decoded; false if none. */
bool gx_const(gx *G, const char *v, onnx_dense *out);
/* The i-th node (from index `from`) of type op taking v (through casts) as input `slot`
 * (-1: any input); its index or -1. */
int gx_consumer(const gx *G, const char *v, const char *op, int slot, size_t from);

/* Failure for the current layer ("layer 3: ..."): the first one set wins. */
ir_status gx_fail(gx *G, ir_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Failure naming a node: "node 'x': op 'Y' ..." */
ir_status gx_fail_node(gx *G, gx_node *n, ir_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* --- attributes ---------------------------------------------------------------------- */

const Onnx__AttributeProto *gx_attr(gx_node *n, const char *name);
int64_t gx_attr_i(gx_node *n, const char *name, int64_t def);
float gx_attr_f(gx_node *n, const char *name, float def);
/* Refuses (naming it) any attribute of n not in the NULL-terminated list `known`. */
bool gx_attrs_known(gx *G, gx_node *n, const char *const *known);
/* Refuses an int attribute whose value is not `want` (absent: def). why: what the value
 * would mean ("sliding-window attention"). */
bool gx_attr_i_is(gx *G, gx_node *n, const char *name, int64_t def, int64_t want, const char *why);
bool gx_attr_f_is(gx *G, gx_node *n, const char *name, float def, float want, const char *why);

/* --- weights (onnx_genai_weights.c) ------------------------------------------------- */

/* Keeps buf until the graph adopts it (or frees it on failure). */
bool gx_keep(gx *G, void *buf);
/* Records a tensor under an HF name (data borrowed from the model or kept). */
void gx_add(gx *G, const char *hf, ir_dtype dt, int rank, const int64_t *shape, const void *data);
/* Records the constant behind v (a [n] norm weight or bias, or a [V, H] embedding). */
void gx_add_const(gx *G, const char *hf, const char *v, int rank, const int64_t *shape);
bool gx_find(void *ctx, const char *name, model_tensor *out);

/* A projection's weight as the template wants it: [n, k] row-major (transposed from a
 * MatMul's [k, n], dequantized from MatMulNBits). data kept by G. */
typedef struct gx_mat {
  gx_node *node;
  ir_dtype dt;
  int64_t n, k;
  const uint8_t *data;
  /* A MatMulNBits source whose K is a whole number of blocks, kept for the packed path
   * (q NULL otherwise): codes [n, k / 2] (two a byte, low nibble first), scales [n, k /
   * group] of st, zero points [n, k / group] u8 unpacked (NULL: 8). */
  const uint8_t *q;
  const void *scales;
  ir_dtype st;
  const uint8_t *zp;
  int64_t group;
} gx_mat;

/* The [k, n] constant behind v as [n, k] (kept by G); false if v is not constant, with
 * G->st set if it is but is no float matrix. */
bool gx_const_transposed(gx *G, const char *v, gx_mat *out);
/* Whether n is a projection: MatMul by a constant 2-D matrix, or MatMulNBits. */
bool gx_is_proj(gx *G, gx_node *n);
/* Reads projection node n's weight. False with G->st set on failure. */
bool gx_mat_read(gx *G, gx_node *n, gx_mat *out);
/* A com.microsoft GatherBlockQuantized table (4-bit, blocks along the row) dequantized
 * to [rows, row length] f32. */
bool gx_embed_read(gx *G, gx_node *n, gx_mat *out);
/* Records rows [r0, r0 + rows) of mat under hf. */
void gx_mat_add(gx *G, const char *hf, const gx_mat *mat, int64_t r0, int64_t rows);

/* Checks a cos/sin cache pair against cos(pos * theta^(-2i/d)) and sets rope_theta
 * (first call) or checks it is the same pair (later calls). node: for messages. */
bool gx_rope_caches(gx *G, gx_node *node, const char *cos, const char *sin);

/* --- packed int4 (onnx_genai_quant.c) ------------------------------------------------ */

/* Remembers rows [r0, r0 + rows) of a MatMulNBits weight recorded under hf. */
void gx_qw_note(gx *G, const char *hf, const gx_mat *mat, int64_t r0, int64_t rows);
/* Rewires each matmul of g that reads a noted weight (the template was given an f32
 * stand-in: zeros when G->keep_int4) to the IR's weight-only int4 matmul over the packed
 * codes; dead stand-ins are left to dce. Returns how many matmuls were rewired, or -1
 * with d set (also when a noted weight is read by no matmul). */
int gx_qw_rewire(gx *G, ir_graph *g);

/* bos, eos and the context length from genai_config.json / config.json beside path. */
void gx_read_config(gx *G, const char *path);

#endif
