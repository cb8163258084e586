/* onnx_import: lowers an ONNX graph to the n-d IR: initializers become weights, graph
 * inputs become static-shaped inputs, each node is lowered by the function its op table
 * entry names (onnx_ops_*.c), and nodes whose inputs are constant are evaluated on the
 * spot, so shape arithmetic resolves before the shapes that depend on it are inferred. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "onnx_internal.h"
#include "pass_fold_nd.h"
#include "ir_alloc.h"

/* --- value names ------------------------------------------------------------------------ */

struct onnx_names {
  const char **keys; /* borrowed from the model message */
  int32_t *vals;
  size_t cap, n;
};

static uint64_t hash_str(const char *s) { return XXH3_64bits(s, strlen(s)); }

static int32_t names_get(const onnx_names *nm, const char *key) {
  if (!nm->cap) return -1;
  for (size_t i = hash_str(key) & (nm->cap - 1);; i = (i + 1) & (nm->cap - 1)) {
    if (!nm->keys[i]) return -1;
    if (!strcmp(nm->keys[i], key)) return nm->vals[i];
  }
}

static bool names_grow(onnx_names *nm) {
  size_t cap = nm->cap ? nm->cap * 2 : 256;
  onnx_names nn = {ir_calloc(cap, sizeof(char *)), ir_calloc(cap, sizeof(int32_t)), cap, 0};
  if (!nn.keys || !nn.vals) {
    ir_free(nn.keys), ir_free(nn.vals);
    return false;
  }
  for (size_t i = 0; i < nm->cap; i++) {
    if (!nm->keys[i]) continue;
    size_t j = hash_str(nm->keys[i]) & (cap - 1);
    while (nn.keys[j]) j = (j + 1) & (cap - 1);
    nn.keys[j] = nm->keys[i];
    nn.vals[j] = nm->vals[i];
    nn.n++;
  }
  ir_free(nm->keys), ir_free(nm->vals);
  *nm = nn;
  return true;
}

static bool names_put(onnx_names *nm, const char *key, int32_t val) {
  if ((nm->n + 1) * 2 > nm->cap && !names_grow(nm)) return false;
  size_t i = hash_str(key) & (nm->cap - 1);
  while (nm->keys[i] && strcmp(nm->keys[i], key)) i = (i + 1) & (nm->cap - 1);
  if (!nm->keys[i]) nm->n++;
  nm->keys[i] = key;
  nm->vals[i] = val;
  return true;
}

/* --- helpers for the lowerings (onnx_internal.h) --------------------------------------- */

ir_status imp_fail(onnx_imp *im, ir_status st, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ir_diag_set(im->d, st, "%s: %s", im->where, msg);
}

int imp_n_in(const onnx_imp *im) { return (int)im->node->n_input; }
int imp_n_out(const onnx_imp *im) { return (int)im->node->n_output; }

int32_t imp_in(onnx_imp *im, int i) {
  if (i < 0 || (size_t)i >= im->node->n_input || !im->node->input[i][0]) return -1;
  return names_get(im->names, im->node->input[i]); /* checked to exist before lowering */
}

int32_t imp_in_req(onnx_imp *im, int i) {
  int32_t t = imp_in(im, i);
  if (t < 0) imp_fail(im, IR_BAD_FORMAT, "needs input %d", i);
  return t;
}

const ir_tensor *imp_t(const onnx_imp *im, int32_t t) { return &im->g->tensors[t]; }

bool imp_out_wanted(const onnx_imp *im, int k) {
  return k >= 0 && (size_t)k < im->node->n_output && im->node->output[k][0];
}

const Onnx__AttributeProto *imp_attr(const onnx_imp *im, const char *name) {
  for (size_t i = 0; i < im->node->n_attribute; i++)
    if (im->node->attribute[i]->name && !strcmp(im->node->attribute[i]->name, name))
      return im->node->attribute[i];
  return NULL;
}

int64_t imp_attr_i(const onnx_imp *im, const char *name, int64_t def) {
  const Onnx__AttributeProto *a = imp_attr(im, name);
  return a && a->has_i ? a->i : def;
}

float imp_attr_f(const onnx_imp *im, const char *name, float def) {
  const Onnx__AttributeProto *a = imp_attr(im, name);
  return a && a->has_f ? a->f : def;
}

void imp_attr_s(const onnx_imp *im, const char *name, char *buf, size_t len) {
  const Onnx__AttributeProto *a = imp_attr(im, name);
  size_t n = a && a->has_s ? a->s.len : 0;
  if (n >= len) n = len - 1;
  if (n) memcpy(buf, a->s.data, n);
  buf[n] = '\0';
}

const int64_t *imp_attr_ints(const onnx_imp *im, const char *name, int *n) {
  const Onnx__AttributeProto *a = imp_attr(im, name);
  if (!a) {
    *n = -1;
    return NULL;
  }
  *n = (int)a->n_ints;
  static const int64_t none[1] = {0};
  return a->n_ints ? a->ints : none;
}

bool imp_attr_req(onnx_imp *im, const char *name) {
  if (imp_attr(im, name)) return true;
  imp_fail(im, IR_BAD_FORMAT, "op '%s' needs attribute '%s'", im->node->op_type, name);
  return false;
}

bool imp_is_const(const onnx_imp *im, int32_t t) {
  return t >= 0 && im->g->tensors[t].kind == IR_TENSOR_WEIGHT;
}

static int64_t tensor_numel(const ir_tensor *t) {
  int64_t s[IR_MAX_RANK];
  return ir_nd_static_shape(t, s) ? ir_nd_numel(t->rank, s) : -1;
}

ir_status imp_const_ints(onnx_imp *im, int32_t t, const char *what, int64_t *vals, int max,
                         int *n) {
  const ir_tensor *x = imp_t(im, t);
  if (!imp_is_const(im, t))
    return imp_fail(im, IR_UNSUPPORTED,
                    "%s ('%s') must be a constant: the generic path needs "
                    "static shapes",
                    what, x->name);
  int64_t cnt = tensor_numel(x);
  if (cnt < 0 || cnt > max)
    return imp_fail(im, IR_UNSUPPORTED, "%s ('%s') has %lld values (at most %d)", what, x->name,
                    (long long)cnt, max);
  for (int64_t i = 0; i < cnt; i++) {
    switch (x->dtype) {
    case IR_I64: vals[i] = ((const int64_t *)x->data)[i]; break;
    case IR_I32: vals[i] = ((const int32_t *)x->data)[i]; break;
    case IR_I8: vals[i] = ((const int8_t *)x->data)[i]; break;
    case IR_U8: vals[i] = ((const uint8_t *)x->data)[i]; break;
    default:
      return imp_fail(im, IR_BAD_FORMAT, "%s ('%s') must be an integer tensor, not %s", what,
                      x->name, ir_dtype_name(x->dtype));
    }
  }
  *n = (int)cnt;
  return IR_OK;
}

ir_status imp_const_scalar(onnx_imp *im, int32_t t, const char *what, double *out) {
  const ir_tensor *x = imp_t(im, t);
  if (!imp_is_const(im, t) || tensor_numel(x) != 1)
    return imp_fail(im, IR_UNSUPPORTED, "%s ('%s') must be a constant with one value", what,
                    x->name);
  switch (x->dtype) {
  case IR_F32: *out = ((const float *)x->data)[0]; break;
  case IR_F16: *out = ir_f16_to_f32(((const uint16_t *)x->data)[0]); break;
  case IR_BF16: *out = ir_bf16_to_f32(((const uint16_t *)x->data)[0]); break;
  case IR_I64: *out = (double)((const int64_t *)x->data)[0]; break;
  case IR_I32: *out = ((const int32_t *)x->data)[0]; break;
  case IR_I8: *out = ((const int8_t *)x->data)[0]; break;
  case IR_U8: *out = ((const uint8_t *)x->data)[0]; break;
  default: return imp_fail(im, IR_UNSUPPORTED, "%s has dtype %s", what, ir_dtype_name(x->dtype));
  }
  return IR_OK;
}

static void base_name(const onnx_imp *im, char *buf, size_t len) {
  const Onnx__NodeProto *n = im->node;
  if (n && n->name && n->name[0]) snprintf(buf, len, "%s", n->name);
  else if (n) snprintf(buf, len, "%s_%d", n->op_type ? n->op_type : "node", im->node_index);
  else snprintf(buf, len, "output");
}

static void helper_name(onnx_imp *im, const char *suffix, char *buf, size_t len) {
  char base[256];
  base_name(im, base, sizeof base);
  if (suffix) snprintf(buf, len, "%s/%s%d", base, suffix, im->n_tmp++);
  else snprintf(buf, len, "%s", base);
}

int32_t imp_weight(onnx_imp *im, const char *suffix, ir_dtype dt, int rank, const int64_t *shape,
                   const void *data) {
  char name[320];
  uint64_t bytes = ir_dtype_bytes(dt, (uint64_t)ir_nd_numel(rank, shape));
  void *buf = ir_malloc(bytes ? bytes : 1);
  if (!buf || !ir_graph_adopt(im->g, buf)) {
    imp_fail(im, IR_OOM, "out of memory");
    return -1;
  }
  if (bytes) memcpy(buf, data, bytes);
  helper_name(im, suffix ? suffix : "const", name, sizeof name);
  int32_t t = ir_graph_add_weight(im->g, name, dt, rank, shape, buf, bytes);
  if (t < 0) imp_fail(im, IR_OOM, "out of memory");
  return t;
}

int32_t imp_emit(onnx_imp *im, ir_op op, const char *suffix, const int32_t *in, int n_in,
                 const ir_attr *attrs, int n_attrs, int32_t *outs) {
  char name[320];
  int32_t first = -1;
  helper_name(im, suffix, name, sizeof name);
  int32_t ni = ir_graph_add_node(im->g, op, name, in, n_in, attrs, n_attrs, &first, im->d);
  if (ni < 0) return -1;
  if (outs)
    for (int k = 0; k < im->g->nodes[ni].n_out; k++) outs[k] = im->g->nodes[ni].out[k];
  bool folded;
  if (pass_fold_nd_node(im->g, ni, &folded, im->d) != IR_OK) return -1;
  if (folded) { /* the node was the last one added: drop it, its outputs are weights now */
    ir_free(im->g->nodes[ni].name);
    im->g->n_nodes--;
  }
  return first;
}

ir_status imp_bind(onnx_imp *im, int k, int32_t t) {
  if (!imp_out_wanted(im, k)) return IR_OK;
  const char *name = im->node->output[k];
  if (t < 0) return im->d->status ? im->d->status : imp_fail(im, IR_BAD_FORMAT, "no value");
  if (t >= im->first_tensor) { /* made for this node: give it the ONNX name */
    char *nm = ir_strdup(name);
    if (!nm) return imp_fail(im, IR_OOM, "out of memory");
    ir_free(im->g->tensors[t].name);
    im->g->tensors[t].name = nm;
  }
  if (!names_put(im->names, name, t)) return imp_fail(im, IR_OOM, "out of memory");
  return IR_OK;
}

int32_t imp_cast(onnx_imp *im, int32_t t, ir_dtype dt) {
  if (t < 0 || imp_t(im, t)->dtype == dt) return t;
  ir_attr a[1] = {IR_AI(ir_attr_intern("to"), dt)};
  return imp_emit(im, IR_OP_ND_CAST, "cast", &t, 1, a, 1, NULL);
}

int32_t imp_f32(onnx_imp *im, int32_t t) {
  ir_dtype dt = t >= 0 ? imp_t(im, t)->dtype : IR_F32;
  return dt == IR_F16 || dt == IR_BF16 ? imp_cast(im, t, IR_F32) : t;
}

int imp_shape(const onnx_imp *im, int32_t t, int64_t *shape) {
  const ir_tensor *x = imp_t(im, t);
  ir_nd_static_shape(x, shape);
  return x->rank;
}

int32_t imp_reshape(onnx_imp *im, int32_t t, int rank, const int64_t *shape) {
  int64_t cur[IR_MAX_RANK];
  int r = imp_shape(im, t, cur);
  bool same = r == rank;
  for (int i = 0; same && i < r; i++) same = cur[i] == shape[i];
  if (same) return t;
  ir_attr a[1] = {IR_AIS(ir_attr_intern("shape"), shape, rank)};
  return imp_emit(im, IR_OP_ND_RESHAPE, "reshape", &t, 1, a, 1, NULL);
}

bool imp_axis(onnx_imp *im, int64_t axis, int rank, int *out) {
  if (axis < -rank || axis >= (rank ? rank : 1)) {
    imp_fail(im, IR_BAD_FORMAT, "axis %lld is out of range for rank %d", (long long)axis, rank);
    return false;
  }
  *out = (int)(axis < 0 ? axis + rank : axis);
  return true;
}

/* --- the graph -------------------------------------------------------------------------- */

static const onnx_op *const k_tables[] = {onnx_ops_elementwise, onnx_ops_shape, onnx_ops_nn,
                                          onnx_ops_compose};

static bool is_default_domain(const char *dom) {
  return !dom || !dom[0] || !strcmp(dom, "ai.onnx");
}

static const onnx_op *find_op(const char *domain, const char *op_type) {
  const char *dom = is_default_domain(domain) ? "" : domain;
  for (size_t t = 0; t < sizeof k_tables / sizeof *k_tables; t++)
    for (const onnx_op *o = k_tables[t]; o->name; o++)
      if (!strcmp(o->name, op_type) && !strcmp(o->domain, dom)) return o;
  return NULL;
}

/* The opset the model imports for a domain other than ai.onnx (0: none). */
static int64_t domain_opset(const onnx_imp *im, const char *domain) {
  const Onnx__ModelProto *mp = im->m->model;
  for (size_t i = 0; i < mp->n_opset_import; i++)
    if (mp->opset_import[i]->domain && !strcmp(mp->opset_import[i]->domain, domain))
      return mp->opset_import[i]->version;
  return 0;
}

static ir_status read_opsets(onnx_imp *im, const Onnx__ModelProto *mp) {
  for (size_t i = 0; i < mp->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
    if (is_default_domain(o->domain)) im->opset = o->version;
  }
  if (im->opset > INFC_ONNX_MAX_OPSET)
    return ir_diag_set(im->d, IR_UNSUPPORTED,
                       "ai.onnx opset %lld is newer than this build "
                       "supports (%d)",
                       (long long)im->opset, INFC_ONNX_MAX_OPSET);
  return IR_OK;
}

static ir_status add_initializers(onnx_imp *im, const Onnx__GraphProto *gp) {
  if (gp->n_sparse_initializer)
    return ir_diag_set(im->d, IR_UNSUPPORTED, "sparse initializers are not supported");
  for (size_t i = 0; i < gp->n_initializer; i++) {
    const Onnx__TensorProto *tp = gp->initializer[i];
    onnx_dense dn;
    if (!tp->name || !tp->name[0])
      return ir_diag_set(im->d, IR_BAD_FORMAT, "initializer %zu has no name", i);
    ir_status st = onnx_tensor_decode(tp, im->m, &dn, im->d);
    if (st != IR_OK) return st;
    if (dn.owned && !ir_graph_adopt(im->g, dn.owned))
      return ir_diag_set(im->d, IR_OOM, "out of memory");
    int32_t t = ir_graph_add_weight(im->g, tp->name, dn.dt, dn.rank, dn.shape, dn.data, dn.nbytes);
    if (t < 0 || !names_put(im->names, tp->name, t))
      return ir_diag_set(im->d, IR_OOM, "out of memory");
  }
  return IR_OK;
}

/* The input's declared dims, symbolic ones taken from `fixed` (rank values, or NULL). */
static ir_status input_shape(onnx_imp *im, const Onnx__ValueInfoProto *vi, const int64_t *fixed,
                             int fixed_rank, ir_dtype *dt, int *rank, ir_dim *dims) {
  const Onnx__TypeProto *tp = vi->type;
  bool is_bool;
  if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
    return ir_diag_set(im->d, IR_UNSUPPORTED, "graph input '%s' is not a tensor", vi->name);
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  if (!fmt_onnx_dtype_to_ir(tt->elem_type, dt, &is_bool))
    return ir_diag_set(im->d, IR_UNSUPPORTED, "graph input '%s': dtype %s is not supported",
                       vi->name, fmt_onnx_dtype_name(tt->elem_type));
  if (!tt->shape)
    return ir_diag_set(im->d, IR_UNSUPPORTED,
                       "graph input '%s' has no shape: the generic path "
                       "needs static shapes",
                       vi->name);
  if (tt->shape->n_dim > IR_MAX_RANK)
    return ir_diag_set(im->d, IR_UNSUPPORTED, "graph input '%s': rank %zu exceeds %d", vi->name,
                       tt->shape->n_dim, IR_MAX_RANK);
  *rank = (int)tt->shape->n_dim;
  if (fixed && fixed_rank != *rank)
    return ir_diag_set(im->d, IR_INVALID_ARG, "graph input '%s' has rank %d, not %d", vi->name,
                       *rank, fixed_rank);
  for (int k = 0; k < *rank; k++) {
    const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[k];
    bool known = dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
                 dm->dim_value >= 0;
    if (fixed && (fixed[k] < 0 || (known && fixed[k] != dm->dim_value)))
      return ir_diag_set(im->d, IR_INVALID_ARG, "graph input '%s': dim %d is %lld, not %lld",
                         vi->name, k, known ? (long long)dm->dim_value : -1LL, (long long)fixed[k]);
    if (fixed) {
      dims[k] = (ir_dim){.n = fixed[k], .sym = IR_SYM_NONE};
      continue;
    }
    if (!known)
      return ir_diag_set(im->d, IR_UNSUPPORTED,
                         "graph input '%s': dim %d is symbolic ('%s'): "
                         "the generic path needs static shapes",
                         vi->name, k,
                         dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM
                             ? dm->dim_param
                             : "?");
    dims[k] = (ir_dim){.n = dm->dim_value, .sym = IR_SYM_NONE};
  }
  return IR_OK;
}

/* A bound input becomes a weight holding the binding's value. */
static ir_status bind_input(onnx_imp *im, const char *name, const fmt_onnx_tensor *v, ir_dtype dt,
                            int rank, const ir_dim *dims) {
  bool same = v->dtype == dt && v->rank == rank;
  for (int k = 0; same && k < rank; k++) same = v->shape[k] == dims[k].n;
  if (!same)
    return ir_diag_set(im->d, IR_INVALID_ARG,
                       "binding for input '%s' does not match its dtype "
                       "and shape",
                       name);
  void *buf = ir_malloc(v->nbytes ? v->nbytes : 1);
  if (!buf || !ir_graph_adopt(im->g, buf)) return ir_diag_set(im->d, IR_OOM, "out of memory");
  if (v->nbytes) memcpy(buf, v->data, v->nbytes);
  int32_t t = ir_graph_add_weight(im->g, name, dt, rank, v->shape, buf, v->nbytes);
  if (t < 0 || !names_put(im->names, name, t)) return ir_diag_set(im->d, IR_OOM, "out of memory");
  return IR_OK;
}

static ir_status add_inputs(onnx_imp *im, const Onnx__GraphProto *gp) {
  for (int b = 0; b < im->n_binds; b++) {
    bool found = false;
    for (size_t i = 0; i < gp->n_input && !found; i++)
      found = gp->input[i]->name && !strcmp(gp->input[i]->name, im->binds[b].name);
    if (!found)
      return ir_diag_set(im->d, IR_INVALID_ARG, "no graph input '%s' to bind", im->binds[b].name);
  }
  for (size_t i = 0; i < gp->n_input; i++) {
    const Onnx__ValueInfoProto *vi = gp->input[i];
    if (!vi->name || !vi->name[0])
      return ir_diag_set(im->d, IR_BAD_FORMAT, "graph input %zu has no name", i);
    if (names_get(im->names, vi->name) >= 0) continue; /* an initializer: a constant */
    ir_dtype dt = IR_DTYPE_INVALID;
    int rank = 0;
    ir_dim dims[IR_MAX_RANK];
    const infc_onnx_binding *b = NULL;
    for (int k = 0; k < im->n_binds && !b; k++)
      if (!strcmp(im->binds[k].name, vi->name)) b = &im->binds[k];
    const fmt_onnx_tensor *bound = b ? b->value : NULL;
    ir_status st = input_shape(im, vi,
                               bound ? bound->shape
                               : b   ? b->shape
                                     : NULL,
                               bound ? bound->rank
                               : b   ? b->rank
                                     : 0,
                               &dt, &rank, dims);
    if (st != IR_OK) return st;
    if (bound) {
      if ((st = bind_input(im, vi->name, bound, dt, rank, dims)) != IR_OK) return st;
      continue;
    }
    int32_t t = ir_graph_add_input(im->g, vi->name, dt, rank, dims);
    if (t < 0 || !names_put(im->names, vi->name, t))
      return ir_diag_set(im->d, IR_OOM, "out of memory");
  }
  return IR_OK;
}

static void node_where(onnx_imp *im, const Onnx__NodeProto *n) {
  if (n->name && n->name[0]) snprintf(im->where, sizeof im->where, "node '%s'", n->name);
  else
    snprintf(im->where, sizeof im->where, "node #%d (%s, output '%s')", im->node_index,
             n->op_type ? n->op_type : "no op_type", n->n_output ? n->output[0] : "");
}

static ir_status lower_node(onnx_imp *im, const Onnx__NodeProto *n) {
  im->node = n;
  im->n_tmp = 0;
  im->first_tensor = im->g->n_tensors;
  node_where(im, n);
  if (!n->op_type) return imp_fail(im, IR_BAD_FORMAT, "has no op_type");
  for (size_t i = 0; i < n->n_input; i++)
    if (n->input[i][0] && names_get(im->names, n->input[i]) < 0)
      return imp_fail(im, IR_BAD_FORMAT, "input '%s' is not produced by any earlier node",
                      n->input[i]);
  bool dflt = is_default_domain(n->domain);
  int64_t opset = dflt ? im->opset : domain_opset(im, n->domain);
  const onnx_op *op = find_op(n->domain, n->op_type);
  if (!op)
    return imp_fail(im, IR_UNSUPPORTED, "op '%s' (domain %s, opset %lld) is not supported",
                    n->op_type, dflt ? "ai.onnx" : n->domain, (long long)opset);
  if (opset <= 0)
    return imp_fail(im, IR_BAD_FORMAT, "op '%s' is in domain %s, which the model does not import",
                    n->op_type, dflt ? "ai.onnx" : n->domain);
  if (opset < op->since)
    return imp_fail(im, IR_BAD_FORMAT, "op '%s' does not exist in opset %lld (it arrives in %d)",
                    n->op_type, (long long)opset, op->since);
  ir_status st = op->fn(im, op->arg);
  for (size_t k = 0; st == IR_OK && k < n->n_output; k++)
    if (n->output[k][0] && names_get(im->names, n->output[k]) < 0)
      st = imp_fail(im, IR_UNSUPPORTED, "op '%s': output %zu ('%s') is not supported", n->op_type,
                    k, n->output[k]);
  return st;
}

/* Graph outputs get tensors of their own name that no other output shares; a value
 * that is an input, or is named otherwise, is copied into one. */
static ir_status add_outputs(onnx_imp *im, const Onnx__GraphProto *gp) {
  im->node = NULL;
  snprintf(im->where, sizeof im->where, "graph output");
  for (size_t i = 0; i < gp->n_output; i++) {
    const char *name = gp->output[i]->name;
    int32_t t = name ? names_get(im->names, name) : -1;
    if (t < 0)
      return ir_diag_set(im->d, IR_BAD_FORMAT, "graph output '%s' is never produced",
                         name ? name : "");
    const ir_tensor *x = imp_t(im, t);
    bool shared = x->kind == IR_TENSOR_INPUT || strcmp(x->name, name) != 0;
    for (int32_t k = 0; k < im->g->n_outputs && !shared; k++) shared = im->g->outputs[k] == t;
    if (shared) {
      int64_t shape[IR_MAX_RANK];
      int rank = imp_shape(im, t, shape);
      ir_attr a[1] = {IR_AIS(ir_attr_intern("shape"), shape, rank)};
      int32_t ni = ir_graph_add_node(im->g, IR_OP_ND_RESHAPE, name, &t, 1, a, 1, &t, im->d);
      bool folded;
      if (ni < 0 || pass_fold_nd_node(im->g, ni, &folded, im->d) != IR_OK) return im->d->status;
      if (folded) {
        ir_free(im->g->nodes[ni].name);
        im->g->n_nodes--;
      }
    }
    if (!ir_graph_add_output(im->g, t)) return ir_diag_set(im->d, IR_OOM, "out of memory");
  }
  return IR_OK;
}

static void set_config(ir_graph *g, const ir_model_config *limits) {
  if (limits) g->config = *limits;
  snprintf(g->config.arch, sizeof g->config.arch, "generic");
  int64_t *lim[4] = {&g->config.max_tokens, &g->config.max_seqs, &g->config.max_logits,
                     &g->config.kv_block_size};
  for (int i = 0; i < 4; i++)
    if (*lim[i] <= 0) *lim[i] = 1;
  if (g->config.max_seqs > g->config.max_tokens) g->config.max_seqs = g->config.max_tokens;
  if (g->config.max_logits > g->config.max_tokens) g->config.max_logits = g->config.max_tokens;
  g->config.bos_token_id = g->config.eos_token_id = -1;
}

void infc_onnx_hash(const infc_onnx *m, char *out) {
  XXH3_state_t *h = XXH3_createState();
  if (!h) return;
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, m->map, m->map_size);
  for (int i = 0; i < m->n_ext; i++) {
    XXH3_64bits_update(h, m->ext[i].location, strlen(m->ext[i].location) + 1);
    if (m->ext[i].size) XXH3_64bits_update(h, m->ext[i].map, m->ext[i].size);
  }
  snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits_digest(h));
  XXH3_freeState(h);
}

static ir_status import_graph(onnx_imp *im) {
  const Onnx__GraphProto *gp = im->m->model->graph;
  ir_status st = read_opsets(im, im->m->model);
  if (st == IR_OK) st = add_initializers(im, gp);
  if (st == IR_OK) st = add_inputs(im, gp);
  for (size_t i = 0; st == IR_OK && i < gp->n_node; i++) {
    im->node_index = (int)i;
    st = lower_node(im, gp->node[i]);
  }
  if (st == IR_OK) st = add_outputs(im, gp);
  if (st == IR_OK && gp->n_output == 0)
    st = ir_diag_set(im->d, IR_BAD_FORMAT, "the graph has no outputs");
  return st;
}

bool infc_onnx_is_source(const char *path) {
  size_t n = strlen(path);
  return n > 5 && !strcmp(path + n - 5, ".onnx");
}

ir_status infc_onnx_import(const char *path, const ir_model_config *limits, infc_onnx **out_model,
                           ir_graph **out_graph, char *out_hash, ir_diag *d) {
  return infc_onnx_import_bound(path, limits, NULL, 0, out_model, out_graph, out_hash, d);
}

ir_status infc_onnx_import_loaded(infc_onnx *m, const ir_model_config *limits,
                                  const infc_onnx_binding *binds, int n_binds, ir_graph **out_graph,
                                  ir_diag *d) {
  ir_diag local = {0};
  *out_graph = NULL;
  onnx_names names = {0};
  onnx_imp im = {.m = m, .names = &names, .d = d ? d : &local, .binds = binds, .n_binds = n_binds};
  d = im.d;
  ir_status st = IR_OK;
  if (!(im.g = ir_graph_create())) st = ir_diag_set(d, IR_OOM, "out of memory");
  if (st == IR_OK) {
    set_config(im.g, limits);
    st = import_graph(&im);
  }
  ir_free(names.keys);
  ir_free(names.vals);
  if (st != IR_OK) {
    ir_diag_prefix(d, "%s", m->path);
    ir_graph_destroy(im.g);
    return st;
  }
  *out_graph = im.g;
  return IR_OK;
}

ir_status infc_onnx_load(const char *path, infc_onnx **out, ir_diag *d) {
  ir_status st = onnx_model_load(path, out, d);
  if (st != IR_OK) ir_diag_prefix(d, "%s", path);
  return st;
}

ir_status infc_onnx_import_bound(const char *path, const ir_model_config *limits,
                                 const infc_onnx_binding *binds, int n_binds, infc_onnx **out_model,
                                 ir_graph **out_graph, char *out_hash, ir_diag *d) {
  ir_diag local = {0};
  *out_model = NULL;
  *out_graph = NULL;
  if (!d) d = &local;
  infc_onnx *m = NULL;
  ir_status st = infc_onnx_load(path, &m, d);
  if (st == IR_OK) st = infc_onnx_import_loaded(m, limits, binds, n_binds, out_graph, d);
  if (st != IR_OK) {
    infc_onnx_close(m);
    return st;
  }
  if (out_hash) infc_onnx_hash(m, out_hash);
  *out_model = m;
  return IR_OK;
}
