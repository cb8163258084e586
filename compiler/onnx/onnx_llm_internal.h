/* onnx_llm_internal: what the causal-LM recogniser's files share (onnx_llm.c: the
 * decoder patterns and the entry point; onnx_llm_graph.c: walking the ONNX graph by data
 * flow; onnx_llm_rope.c: the RoPE forms). Internal to compiler/onnx. */
#ifndef ONNX_LLM_INTERNAL_H
#define ONNX_LLM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "llama.h"
#include "onnx_internal.h"

typedef const Onnx__NodeProto node_t;

typedef struct vmap {
  const char *name;
  int idx; /* >= 0: producing node; < 0: initializer -(idx + 1) */
} vmap;

typedef struct lm_weight {
  char name[96];
  model_tensor t;
} lm_weight;

typedef enum lm_rope_kind { LM_ROPE_UNKNOWN, LM_ROPE_HALF, LM_ROPE_PAIRS } lm_rope_kind;

typedef struct lm {
  infc_onnx *m;
  const Onnx__GraphProto *gp;
  vmap *map;
  size_t n_map;
  size_t pos;        /* nodes are matched in order from here */
  int layer;         /* for messages */
  double scale;      /* of the attention scores, checked against head_dim */
  int64_t half;      /* head_dim / 2, from the rope table */
  lm_rope_kind rope; /* the layout of the rope table (first layer) */
  bool rope_cached;  /* that table a precomputed constant gathered by position */
  int n_past;        /* past-KV Concats matched (two per layer, or none) */
  const char **past; /* their graph inputs and present outputs, 2 per Concat */
  ir_diag *d;
  ir_status st;
  model_llama_params p;
  lm_weight *w;
  int n_w, cap_w;
  void **owned; /* buffers the graph adopts (transposed weights, decoded copies) */
  int n_owned, cap_owned;
} lm;

/* --- onnx_llm_graph.c: values, producers, constants ---------------------------------- */

/* Indexes every initializer and node output by name; false when out of memory. */
bool lm_build_map(lm *L);
const vmap *lm_lookup(const lm *L, const char *v);
/* The node producing v; NULL for graph inputs and initializers. */
node_t *lm_producer(const lm *L, const char *v);
bool lm_is_op(node_t *n, const char *op);
/* Input i of n, "" when absent. */
const char *lm_in(node_t *n, size_t i);
/* v with Cast and Identity nodes in front of it looked through. */
const char *lm_skip(const lm *L, const char *v);
bool lm_same(const lm *L, const char *a, const char *b);
/* v with data-movement nodes (reshape, transpose, expand, unsqueeze, cast...) looked
 * through. */
const char *lm_movement_src(const lm *L, const char *v);
/* The constant behind v (an initializer or a Constant node, through data movement),
 * decoded; out->owned is the caller's. */
bool lm_const_tensor(lm *L, const char *v, onnx_dense *out);
/* Up to max f32/i64/i32 constant values of v as doubles; *n their count. */
bool lm_const_values(lm *L, const char *v, double *vals, int max, int *n);
bool lm_const_scalar(lm *L, const char *v, double *out);
/* Shape of the constant behind v: its rank, or -1 when v is not constant. */
int lm_const_shape(lm *L, const char *v, int64_t *shape);
/* The first node at or after `from` with op type `op` taking (a Cast of) v as input. */
int lm_consumer(const lm *L, const char *v, const char *op, size_t from);
/* The first `op` node at or after `from`, or -1. */
int lm_find_op(const lm *L, const char *op, size_t from);
/* Whether some producer within `depth` steps above v is an `op` node. */
bool lm_has_ancestor(const lm *L, const char *v, const char *op, int depth);
/* Whether v is one of the graph's inputs. */
bool lm_is_graph_input(const lm *L, const char *v);
/* The value's int attribute `name` (def when absent). */
int64_t lm_attr_int(node_t *n, const char *name, int64_t def);
/* Records an IR_UNSUPPORTED error ("layer N: ...") unless one is already set. */
ir_status lm_fail(lm *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --- onnx_llm_rope.c ----------------------------------------------------------------- */

/* RoPE of the projection output `p` as seen at attention operand `v` (through data
 * movement, repeat_kv and a past-KV Concat): Add(Mul(x, cos), Mul(rot(x), sin)) with rot
 * rotate-half (Concat(-x[d/2:], x[:d/2])) or adjacent pairs (x[2i], x[2i+1]) ->
 * (-x[2i+1], x[2i]). The first match also reads the cos table (cos(pos * inv_freq), its
 * two halves concatenated or its entries stacked in pairs), checks theta^(-2i/d) and
 * sets rope_theta, rope_interleaved and L->half; later ones must agree. *half gets
 * head_dim / 2. */
bool lm_match_rope(lm *L, const char *v, const char *p, int64_t *half);

/* An attention K or V operand back to the new tokens' value: through data movement and
 * an optimum-style past-KV Concat(past input, new, axis 2), which the paged KV cache
 * replaces (recorded in L->past). NULL with L->st set when such a Concat is malformed. */
const char *lm_kv_new(lm *L, const char *v);

#endif
