/* onnx_profile: dynamic shapes of generic ONNX graphs by evaluation at a few points
 * (infc_onnx_profile.h). */
#include <stdio.h>
#include <string.h>

#include "infc_onnx_profile.h"
#include "ir_alloc.h"
#include "ir_profile.h"
#include "onnx_internal.h"

ir_status infc_onnx_dims_read(const infc_onnx *m, const infc_options *o, infc_onnx_dims *out,
                              ir_diag *d) {
  memset(out, 0, sizeof *out);
  ir_status st = IR_OK;
  const Onnx__GraphProto *gp = m->model->graph;
  for (size_t i = 0; st == IR_OK && i < gp->n_input; i++) {
    const Onnx__ValueInfoProto *vi = gp->input[i];
    bool init = false;
    for (size_t k = 0; k < gp->n_initializer && !init; k++)
      init = gp->initializer[k]->name && vi->name && !strcmp(gp->initializer[k]->name, vi->name);
    const Onnx__TypeProto *tp = vi->type;
    const Onnx__TensorShapeProto *sh =
        tp && tp->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && tp->tensor_type
            ? tp->tensor_type->shape
            : NULL;
    if (init || !sh || !vi->name) continue; /* the importer names what is wrong */
    if (out->n_inputs == (int)(sizeof out->in / sizeof out->in[0]) || sh->n_dim > IR_MAX_RANK ||
        strlen(vi->name) >= sizeof out->in[0].name) {
      st = ir_diag_set(d, IR_UNSUPPORTED, "input '%s': too many inputs, dims or name too long",
                       vi->name);
      break;
    }
    infc_onnx_input_dims *in = &out->in[out->n_inputs++];
    snprintf(in->name, sizeof in->name, "%s", vi->name);
    in->rank = (int)sh->n_dim;
    const infc_shape *opt = NULL;
    for (int k = 0; k < o->n_shapes && !opt; k++)
      if (!strcmp(o->shapes[k].input, vi->name)) opt = &o->shapes[k];
    if (opt && opt->rank != in->rank) {
      st = ir_diag_set(d, IR_INVALID_ARG, "shape for input '%s': %d dims given, the input has %d",
                       vi->name, opt->rank, in->rank);
      break;
    }
    for (int k = 0; st == IR_OK && k < in->rank; k++) {
      const Onnx__TensorShapeProto__Dimension *dm = sh->dim[k];
      in->sym[k] = -1;
      if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
          dm->dim_value >= 0) {
        in->fixed[k] = dm->dim_value;
        if (opt && (opt->min[k] != dm->dim_value || opt->max[k] != dm->dim_value))
          st = ir_diag_set(d, IR_INVALID_ARG, "shape for input '%s': dim %d is fixed at %lld",
                           vi->name, k, (long long)dm->dim_value);
        continue;
      }
      char key[64];
      if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && dm->dim_param &&
          dm->dim_param[0])
        snprintf(key, sizeof key, "%s", dm->dim_param);
      else snprintf(key, sizeof key, "%.50s:%d", vi->name, k);
      int64_t lo = opt ? opt->min[k] : INFC_DEFAULT_DIM_MIN,
              hi = opt ? opt->max[k] : INFC_DEFAULT_DIM_MAX;
      int s = 0;
      while (s < out->n_syms && strcmp(out->syms[s].name, key)) s++;
      if (s == out->n_syms) {
        if (s == IR_MAX_PROFILE_SYMS) {
          st = ir_diag_set(d, IR_UNSUPPORTED, "more than %d symbolic dims", IR_MAX_PROFILE_SYMS);
          break;
        }
        snprintf(out->syms[s].name, sizeof out->syms[s].name, "%s", key);
        out->syms[s].min = lo;
        out->syms[s].max = hi;
        out->n_syms++;
      } else if (opt && (out->syms[s].min != lo || out->syms[s].max != hi)) {
        /* a --shape narrows a shared symbol; two different ones conflict */
        bool was_default =
            out->syms[s].min == INFC_DEFAULT_DIM_MIN && out->syms[s].max == INFC_DEFAULT_DIM_MAX;
        if (!was_default)
          st = ir_diag_set(d, IR_INVALID_ARG,
                           "shape for input '%s': dim %d ('%s') is %lld..%lld, another input gives "
                           "%lld..%lld",
                           vi->name, k, key, (long long)lo, (long long)hi,
                           (long long)out->syms[s].min, (long long)out->syms[s].max);
        out->syms[s].min = lo;
        out->syms[s].max = hi;
      }
      in->sym[k] = s;
    }
  }
  for (int k = 0; st == IR_OK && k < o->n_shapes; k++) {
    bool found = false;
    for (int i = 0; i < out->n_inputs && !found; i++)
      found = !strcmp(out->in[i].name, o->shapes[k].input);
    if (!found)
      st = ir_diag_set(d, IR_INVALID_ARG, "shape for input '%s': the graph has no such input",
                       o->shapes[k].input);
  }
  return st;
}

ir_status infc_onnx_import_at(infc_onnx *m, const ir_model_config *limits,
                              const infc_onnx_dims *dims, const int64_t *vals, ir_graph **out_graph,
                              ir_diag *d) {
  infc_onnx_binding b[64];
  int64_t shapes[64][IR_MAX_RANK];
  int n = 0;
  for (int i = 0; i < dims->n_inputs; i++) {
    bool sym = false;
    for (int k = 0; k < dims->in[i].rank; k++) {
      sym |= dims->in[i].sym[k] >= 0;
      shapes[n][k] = dims->in[i].sym[k] >= 0 ? vals[dims->in[i].sym[k]] : dims->in[i].fixed[k];
    }
    if (!sym) continue;
    b[n] =
        (infc_onnx_binding){.name = dims->in[i].name, .rank = dims->in[i].rank, .shape = shapes[n]};
    n++;
  }
  return infc_onnx_import_loaded(m, limits, b, n, out_graph, d);
}

/* --- the profile ------------------------------------------------------------------------ */

/* Whether a and b have the same structure (ops, edges, attribute kinds, tensor kinds and
 * dtypes, constants); names the first difference in d. */
static ir_status same_structure(const ir_graph *a, const ir_graph *b, const char *sym, ir_diag *d) {
  if (a->n_tensors != b->n_tensors || a->n_nodes != b->n_nodes || a->n_inputs != b->n_inputs ||
      a->n_outputs != b->n_outputs)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "the graph's structure changes with '%s' (%d nodes at its maximum, %d "
                       "below): build it with that dim fixed (--shape)",
                       sym, a->n_nodes, b->n_nodes);
  for (int32_t i = 0; i < a->n_nodes; i++) {
    const ir_node *x = &a->nodes[i], *y = &b->nodes[i];
    bool same = x->op == y->op && x->n_in == y->n_in && x->n_out == y->n_out &&
                x->n_attrs == y->n_attrs && !memcmp(x->in, y->in, sizeof x->in) &&
                !memcmp(x->out, y->out, sizeof x->out);
    for (int k = 0; same && k < x->n_attrs; k++)
      same = x->attrs[k].name == y->attrs[k].name && x->attrs[k].type == y->attrs[k].type &&
             (x->attrs[k].type != IR_ATTR_INTS || x->attrs[k].i == y->attrs[k].i) &&
             (x->attrs[k].type != IR_ATTR_FLOAT || x->attrs[k].f == y->attrs[k].f);
    if (!same)
      return ir_diag_set(d, IR_UNSUPPORTED, "node '%s' changes with '%s': build with it fixed",
                         x->name, sym);
  }
  for (int32_t i = 0; i < a->n_tensors; i++) {
    const ir_tensor *x = &a->tensors[i], *y = &b->tensors[i];
    if (x->kind != y->kind || x->rank != y->rank || x->dtype != y->dtype)
      return ir_diag_set(d, IR_UNSUPPORTED, "tensor '%s' changes with '%s'", x->name, sym);
    if (x->kind == IR_TENSOR_WEIGHT &&
        (x->nbytes != y->nbytes || (x->nbytes && memcmp(x->data, y->data, x->nbytes))))
      return ir_diag_set(d, IR_UNSUPPORTED,
                         "constant '%s' depends on '%s' (a value computed from the shape): "
                         "build with that dim fixed (--shape)",
                         x->name, sym);
  }
  return IR_OK;
}

/* Imports m's graph at vals and runs the pipeline on it. */
static ir_status point(infc_onnx *m, const ir_model_config *limits, const infc_onnx_dims *dims,
                       const int64_t *vals, const pass_opts *po, ir_graph **g, ir_diag *d) {
  ir_status st = infc_onnx_import_at(m, limits, dims, vals, g, d);
  pass_log log = {0};
  pass_opts q = *po;
  q.dump_ir = NULL;
  if (st == IR_OK) st = pass_pipeline_run(*g, &q, &log, d);
  pass_log_free(&log);
  return st;
}

/* One int value of the graph that could vary: dim `index` of tensor `at`, or value `index`
 * of attribute `k` of node `at`; base is its value at the maxima. */
typedef struct slot {
  bool attr;
  int32_t at, index, k;
  const char *name;
  int64_t base;
} slot;

/* The slot's value in gv (a graph of the same structure). */
static int64_t slot_value(const ir_graph *gv, const slot *s) {
  if (!s->attr) return gv->tensors[s->at].dims[s->index].n;
  const ir_attr *a = &gv->nodes[s->at].attrs[s->k];
  return a->type == IR_ATTR_INT ? a->i : a->ints[s->index];
}

/* Every int value of g that could vary (activation and input dims, int attribute values)
 * into slots (when non-NULL); returns their count. */
static int64_t count_values(const ir_graph *g, slot *slots) {
  int64_t k = 0;
  for (int32_t i = 0; i < g->n_tensors; i++)
    if (g->tensors[i].kind != IR_TENSOR_WEIGHT)
      for (int j = 0; j < g->tensors[i].rank; j++, k++)
        if (slots) slots[k] = (slot){false, i, j, 0, NULL, g->tensors[i].dims[j].n};
  for (int32_t i = 0; i < g->n_nodes; i++)
    for (int j = 0; j < g->nodes[i].n_attrs; j++) {
      const ir_attr *a = &g->nodes[i].attrs[j];
      if (a->type == IR_ATTR_INT) {
        if (slots) slots[k] = (slot){true, i, 0, j, a->name, a->i};
        k++;
      } else if (a->type == IR_ATTR_INTS) {
        for (int64_t e = 0; e < a->i; e++, k++)
          if (slots) slots[k] = (slot){true, i, (int32_t)e, j, a->name, a->ints[e]};
      }
    }
  return k;
}

static const char *slot_what(const ir_graph *g, const slot *s, char *buf, size_t len) {
  if (s->attr)
    snprintf(buf, len, "attribute '%s'[%d] of node '%s'", s->name, s->index, g->nodes[s->at].name);
  else snprintf(buf, len, "dim %d of tensor '%s'", s->index, g->tensors[s->at].name);
  return buf;
}

ir_status infc_onnx_profile_build(infc_onnx *m, const ir_model_config *limits,
                                  const infc_onnx_dims *dims, const pass_opts *po, ir_graph *g,
                                  ir_diag *d) {
  int ns = dims->n_syms;
  bool any = false;
  for (int k = 0; k < ns; k++) any |= dims->syms[k].min < dims->syms[k].max;
  if (!any) return IR_OK;
  int64_t n = count_values(g, NULL);
  slot *slots = ir_calloc((size_t)n + 1, sizeof *slots);
  int64_t(*coef)[IR_MAX_PROFILE_SYMS] = ir_calloc((size_t)n + 1, sizeof *coef);
  ir_profile *prof = ir_calloc(1, sizeof *prof);
  if (!slots || !coef || !prof) {
    ir_free(slots);
    ir_free(coef);
    ir_free(prof);
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  count_values(g, slots);
  int64_t vals[IR_MAX_PROFILE_SYMS], mins[IR_MAX_PROFILE_SYMS];
  ir_status st = IR_OK;
  /* one point per symbol: it at max - 1, the others at max */
  for (int j = 0; st == IR_OK && j <= ns; j++) {
    bool last = j == ns; /* the check: every symbol at its minimum */
    if (!last && dims->syms[j].min == dims->syms[j].max) continue;
    for (int k = 0; k < ns; k++) {
      vals[k] = last ? dims->syms[k].min : dims->syms[k].max - (k == j);
      mins[k] = dims->syms[k].min;
    }
    if (last && ns == 1 && mins[0] >= dims->syms[0].max - 1) break; /* already seen */
    ir_graph *gv = NULL;
    st = point(m, limits, dims, vals, po, &gv, d);
    if (st == IR_OK) st = same_structure(g, gv, last ? "the minima" : dims->syms[j].name, d);
    for (int64_t i = 0; st == IR_OK && i < n; i++) {
      int64_t v = slot_value(gv, &slots[i]);
      if (!last) {
        coef[i][j] = slots[i].base - v;
        if (!slots[i].attr && coef[i][j] < 0) {
          char w[400];
          st = ir_diag_set(d, IR_UNSUPPORTED, "%s shrinks as '%s' grows",
                           slot_what(g, &slots[i], w, sizeof w), dims->syms[j].name);
        }
        continue;
      }
      int64_t want = slots[i].base;
      for (int k = 0; k < ns; k++) want -= coef[i][k] * (dims->syms[k].max - mins[k]);
      if (want != v) {
        char w[400];
        st = ir_diag_set(d, IR_UNSUPPORTED,
                         "%s is not an affine function of the symbolic dims (at their minima "
                         "it is %lld, not %lld): build with fixed dims (--shape)",
                         slot_what(g, &slots[i], w, sizeof w), (long long)v, (long long)want);
      }
    }
    ir_graph_destroy(gv);
  }
  /* the entries */
  int64_t nd = 0, na = 0;
  for (int64_t i = 0; i < n; i++) {
    bool dep = false;
    for (int k = 0; k < ns; k++) dep |= coef[i][k] != 0;
    if (dep) slots[i].attr ? na++ : nd++;
  }
  prof->dims = ir_calloc((size_t)nd + 1, sizeof *prof->dims);
  prof->attrs = ir_calloc((size_t)na + 1, sizeof *prof->attrs);
  if (st == IR_OK && (!prof->dims || !prof->attrs)) st = ir_diag_set(d, IR_OOM, "out of memory");
  prof->n_syms = ns;
  memcpy(prof->syms, dims->syms, sizeof prof->syms);
  for (int64_t i = 0; st == IR_OK && i < n; i++) {
    bool dep = false;
    for (int k = 0; k < ns; k++) dep |= coef[i][k] != 0;
    if (!dep) continue;
    ir_affine *a = slots[i].attr ? &prof->attrs[prof->n_attrs++] : &prof->dims[prof->n_dims++];
    a->at = slots[i].at;
    a->index = slots[i].index;
    a->attr = slots[i].name;
    a->off = slots[i].base;
    for (int k = 0; k < ns; k++) {
      a->coef[k] = coef[i][k];
      a->off -= coef[i][k] * dims->syms[k].max;
    }
  }
  ir_free(slots);
  ir_free(coef);
  if (st == IR_OK) {
    g->profile = prof;
    st = ir_profile_verify(g, d);
  } else {
    ir_free(prof->dims);
    ir_free(prof->attrs);
    ir_free(prof);
  }
  return st;
}

void infc_onnx_profile_describe(const ir_profile *p, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = 0;
  for (int k = 0; p && k < p->n_syms && o < len; k++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s=%lld..%lld", k ? ", " : "", p->syms[k].name,
                          (long long)p->syms[k].min, (long long)p->syms[k].max);
}
