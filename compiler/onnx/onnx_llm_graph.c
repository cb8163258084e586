/* onnx_llm_graph: walking an ONNX graph by data flow for the causal-LM recogniser:
 * values by name, their producers and consumers, constants behind them. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_llm_internal.h"
#include "ir_alloc.h"

static int vmap_cmp(const void *a, const void *b) {
  return strcmp(((const vmap *)a)->name, ((const vmap *)b)->name);
}

bool lm_build_map(lm *L) {
  size_t n = L->gp->n_initializer;
  for (size_t i = 0; i < L->gp->n_node; i++) n += L->gp->node[i]->n_output;
  L->map = ir_calloc(n ? n : 1, sizeof *L->map);
  if (!L->map) return false;
  for (size_t i = 0; i < L->gp->n_initializer; i++)
    if (L->gp->initializer[i]->name)
      L->map[L->n_map++] = (vmap){L->gp->initializer[i]->name, -(int)i - 1};
  for (size_t i = 0; i < L->gp->n_node; i++)
    for (size_t k = 0; k < L->gp->node[i]->n_output; k++)
      if (L->gp->node[i]->output[k][0])
        L->map[L->n_map++] = (vmap){L->gp->node[i]->output[k], (int)i};
  qsort(L->map, L->n_map, sizeof *L->map, vmap_cmp);
  return true;
}

const vmap *lm_lookup(const lm *L, const char *v) {
  vmap key = {v, 0};
  return v ? bsearch(&key, L->map, L->n_map, sizeof *L->map, vmap_cmp) : NULL;
}

node_t *lm_producer(const lm *L, const char *v) {
  const vmap *e = lm_lookup(L, v);
  return e && e->idx >= 0 ? L->gp->node[e->idx] : NULL;
}

bool lm_is_op(node_t *n, const char *op) { return n && n->op_type && !strcmp(n->op_type, op); }

const char *lm_in(node_t *n, size_t i) { return i < n->n_input ? n->input[i] : ""; }

/* v with Cast and Identity nodes in front of it looked through. */
const char *lm_skip(const lm *L, const char *v) {
  node_t *n;
  while ((n = lm_producer(L, v)) && (lm_is_op(n, "Cast") || lm_is_op(n, "Identity")))
    v = lm_in(n, 0);
  return v;
}

bool lm_same(const lm *L, const char *a, const char *b) {
  return !strcmp(lm_skip(L, a), lm_skip(L, b));
}

static bool is_movement(node_t *n) {
  static const char *const ops[] = {"Reshape", "Transpose", "Expand",   "Unsqueeze",
                                    "Squeeze", "Cast",      "Identity", "Flatten"};
  for (size_t i = 0; n && i < sizeof ops / sizeof ops[0]; i++)
    if (lm_is_op(n, ops[i])) return true;
  return false;
}

/* v with data-movement nodes (reshape, transpose, expand, ...) looked through.
 */
const char *lm_movement_src(const lm *L, const char *v) {
  node_t *n;
  while ((n = lm_producer(L, v)) && is_movement(n)) v = lm_in(n, 0);
  return v;
}

/* The constant behind v (an initializer or a Constant node), decoded. */
bool lm_const_tensor(lm *L, const char *v, onnx_dense *out) {
  v = lm_movement_src(L, v);
  const vmap *e = lm_lookup(L, v);
  const Onnx__TensorProto *tp = NULL;
  if (e && e->idx < 0) tp = L->gp->initializer[-e->idx - 1];
  else if (e && lm_is_op(L->gp->node[e->idx], "Constant")) {
    node_t *n = L->gp->node[e->idx];
    for (size_t i = 0; i < n->n_attribute; i++)
      if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, "value")) tp = n->attribute[i]->t;
  }
  ir_diag ignore = {0};
  return tp && onnx_tensor_decode(tp, L->m, out, &ignore) == IR_OK;
}

bool lm_const_values(lm *L, const char *v, double *vals, int max, int *n) {
  onnx_dense t;
  if (!lm_const_tensor(L, v, &t)) return false;
  int64_t cnt = ir_nd_numel(t.rank, t.shape);
  bool ok = cnt >= 1 && cnt <= max;
  for (int64_t i = 0; ok && i < cnt; i++) {
    if (t.dt == IR_F32) vals[i] = ((const float *)t.data)[i];
    else if (t.dt == IR_I64) vals[i] = (double)((const int64_t *)t.data)[i];
    else if (t.dt == IR_I32) vals[i] = ((const int32_t *)t.data)[i];
    else ok = false;
  }
  *n = (int)cnt;
  ir_free(t.owned);
  return ok;
}

bool lm_const_scalar(lm *L, const char *v, double *out) {
  int n;
  return lm_const_values(L, v, out, 1, &n);
}

/* The first node at or after `from` with op type `op` taking (a Cast of) v as
 * input. */
int lm_consumer(const lm *L, const char *v, const char *op, size_t from) {
  for (size_t i = from; i < L->gp->n_node; i++) {
    node_t *n = L->gp->node[i];
    if (!lm_is_op(n, op)) continue;
    for (size_t k = 0; k < n->n_input; k++)
      if (n->input[k][0] && lm_same(L, n->input[k], v)) return (int)i;
  }
  return -1;
}

ir_status lm_fail(lm *L, const char *fmt, ...) {
  if (L->st != IR_OK) return L->st;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (L->layer >= 0) L->st = ir_diag_set(L->d, IR_UNSUPPORTED, "layer %d: %s", L->layer, msg);
  else L->st = ir_diag_set(L->d, IR_UNSUPPORTED, "%s", msg);
  return L->st;
}

/* Shape of the constant behind v: rank, or -1 when v is not constant. */
int lm_const_shape(lm *L, const char *v, int64_t *shape) {
  onnx_dense t;
  if (!lm_const_tensor(L, v, &t)) return -1;
  memcpy(shape, t.shape, sizeof t.shape);
  ir_free(t.owned);
  return t.rank;
}

/* Whether some producer within `depth` steps above v is an `op` node. */
bool lm_has_ancestor(const lm *L, const char *v, const char *op, int depth) {
  node_t *n = lm_producer(L, v);
  if (!n || depth < 0) return false;
  if (lm_is_op(n, op)) return true;
  for (size_t k = 0; k < n->n_input; k++)
    if (n->input[k][0] && lm_has_ancestor(L, n->input[k], op, depth - 1)) return true;
  return false;
}

int lm_find_op(const lm *L, const char *op, size_t from) {
  for (size_t i = from; i < L->gp->n_node; i++)
    if (lm_is_op(L->gp->node[i], op)) return (int)i;
  return -1;
}

bool lm_is_graph_input(const lm *L, const char *v) {
  for (size_t i = 0; v && i < L->gp->n_input; i++)
    if (L->gp->input[i]->name && !strcmp(L->gp->input[i]->name, v)) return true;
  return false;
}

int64_t lm_attr_int(node_t *n, const char *name, int64_t def) {
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name) &&
        n->attribute[i]->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT)
      return n->attribute[i]->i;
  return def;
}
