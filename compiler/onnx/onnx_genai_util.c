/* onnx_genai_util: graph lookup, attribute checks and messages for the GenAI
 * recogniser. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_genai.h"
#include "ir_alloc.h"

static int vmap_cmp(const void *a, const void *b) {
  return strcmp(((const gx_vmap *)a)->name, ((const gx_vmap *)b)->name);
}

bool gx_map_build(gx *G) {
  size_t n = G->gp->n_initializer;
  for (size_t i = 0; i < G->gp->n_node; i++) n += G->gp->node[i]->n_output;
  G->map = ir_calloc(n ? n : 1, sizeof *G->map);
  if (!G->map) return false;
  for (size_t i = 0; i < G->gp->n_initializer; i++)
    if (G->gp->initializer[i]->name)
      G->map[G->n_map++] = (gx_vmap){G->gp->initializer[i]->name, -(int)i - 1};
  for (size_t i = 0; i < G->gp->n_node; i++)
    for (size_t k = 0; k < G->gp->node[i]->n_output; k++)
      if (G->gp->node[i]->output[k][0])
        G->map[G->n_map++] = (gx_vmap){G->gp->node[i]->output[k], (int)i};
  qsort(G->map, G->n_map, sizeof *G->map, vmap_cmp);
  return true;
}

static const gx_vmap *lookup(const gx *G, const char *v) {
  gx_vmap key = {v, 0};
  return v && v[0] ? bsearch(&key, G->map, G->n_map, sizeof *G->map, vmap_cmp) : NULL;
}

gx_node *gx_producer(const gx *G, const char *v) {
  const gx_vmap *e = lookup(G, v);
  return e && e->idx >= 0 ? G->gp->node[e->idx] : NULL;
}

bool gx_is_op(gx_node *n, const char *op) { return n && n->op_type && !strcmp(n->op_type, op); }

const char *gx_in(gx_node *n, size_t i) { return i < n->n_input ? n->input[i] : ""; }

const char *gx_out(gx_node *n, size_t i) { return i < n->n_output ? n->output[i] : ""; }

const char *gx_skip(const gx *G, const char *v) {
  gx_node *n;
  int guard = 0;
  while ((n = gx_producer(G, v)) && (gx_is_op(n, "Cast") || gx_is_op(n, "Identity")) &&
         guard++ < 64)
    v = gx_in(n, 0);
  return v;
}

bool gx_same(const gx *G, const char *a, const char *b) {
  return a[0] && b[0] && !strcmp(gx_skip(G, a), gx_skip(G, b));
}

bool gx_graph_input(const gx *G, const char *v) {
  for (size_t i = 0; i < G->gp->n_input; i++)
    if (G->gp->input[i]->name && !strcmp(G->gp->input[i]->name, v)) return true;
  return false;
}

bool gx_graph_output(const gx *G, const char *v) {
  for (size_t i = 0; i < G->gp->n_output; i++)
    if (G->gp->output[i]->name && !strcmp(G->gp->output[i]->name, v)) return true;
  return false;
}

bool gx_const(gx *G, const char *v, onnx_dense *out) {
  const gx_vmap *e = lookup(G, gx_skip(G, v));
  const Onnx__TensorProto *tp = NULL;
  if (e && e->idx < 0) tp = G->gp->initializer[-e->idx - 1];
  else if (e && gx_is_op(G->gp->node[e->idx], "Constant")) {
    const Onnx__AttributeProto *a = gx_attr(G->gp->node[e->idx], "value");
    tp = a ? a->t : NULL;
  }
  ir_diag ignore = {0};
  return tp && onnx_tensor_decode(tp, G->m, out, &ignore) == IR_OK;
}

int gx_consumer(const gx *G, const char *v, const char *op, int slot, size_t from) {
  for (size_t i = from; i < G->gp->n_node; i++) {
    gx_node *n = G->gp->node[i];
    if (!gx_is_op(n, op)) continue;
    for (size_t k = 0; k < n->n_input; k++)
      if ((slot < 0 || (size_t)slot == k) && gx_same(G, n->input[k], v)) return (int)i;
  }
  return -1;
}

static ir_status vfail(gx *G, ir_status st, const char *node_part, const char *fmt, va_list ap) {
  if (G->st != IR_OK) return G->st;
  char msg[400];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (G->layer >= 0) G->st = ir_diag_set(G->d, st, "layer %d: %s%s", G->layer, node_part, msg);
  else G->st = ir_diag_set(G->d, st, "%s%s", node_part, msg);
  return G->st;
}

ir_status gx_fail(gx *G, ir_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(G, st, "", fmt, ap);
  va_end(ap);
  return G->st;
}

ir_status gx_fail_node(gx *G, gx_node *n, ir_status st, const char *fmt, ...) {
  char part[300];
  snprintf(part, sizeof part, "node '%s': op '%s' ", n->name ? n->name : "",
           n->op_type ? n->op_type : "");
  va_list ap;
  va_start(ap, fmt);
  vfail(G, st, part, fmt, ap);
  va_end(ap);
  return G->st;
}

/* --- attributes ---------------------------------------------------------------------- */

const Onnx__AttributeProto *gx_attr(gx_node *n, const char *name) {
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name)) return n->attribute[i];
  return NULL;
}

int64_t gx_attr_i(gx_node *n, const char *name, int64_t def) {
  const Onnx__AttributeProto *a = gx_attr(n, name);
  return a && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT ? a->i : def;
}

float gx_attr_f(gx_node *n, const char *name, float def) {
  const Onnx__AttributeProto *a = gx_attr(n, name);
  return a && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT ? a->f : def;
}

bool gx_attrs_known(gx *G, gx_node *n, const char *const *known) {
  for (size_t i = 0; i < n->n_attribute; i++) {
    const char *name = n->attribute[i]->name ? n->attribute[i]->name : "";
    bool ok = false;
    for (const char *const *k = known; *k && !ok; k++) ok = !strcmp(*k, name);
    if (!ok) {
      gx_fail_node(G, n, IR_UNSUPPORTED, "attribute '%s' is not supported", name);
      return false;
    }
  }
  return true;
}

bool gx_attr_i_is(gx *G, gx_node *n, const char *name, int64_t def, int64_t want, const char *why) {
  const Onnx__AttributeProto *a = gx_attr(n, name);
  if (a && a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT) {
    gx_fail_node(G, n, IR_BAD_FORMAT, "attribute '%s' is not an int", name);
    return false;
  }
  int64_t v = a ? a->i : def;
  if (v == want) return true;
  gx_fail_node(G, n, IR_UNSUPPORTED, "attribute '%s' = %lld is not supported (%s)", name,
               (long long)v, why);
  return false;
}

bool gx_attr_f_is(gx *G, gx_node *n, const char *name, float def, float want, const char *why) {
  const Onnx__AttributeProto *a = gx_attr(n, name);
  if (a && a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT) {
    gx_fail_node(G, n, IR_BAD_FORMAT, "attribute '%s' is not a float", name);
    return false;
  }
  float v = a ? a->f : def;
  if (v == want) return true;
  gx_fail_node(G, n, IR_UNSUPPORTED, "attribute '%s' = %g is not supported (%s)", name, (double)v,
               why);
  return false;
}
