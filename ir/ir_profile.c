/* ir_profile: dynamic shapes of generic programs (ir_profile.h). */
#include "ir_profile.h"

#include <string.h>

#include "ir_alloc.h"

#define MAX_SYM_VALUE ((int64_t)1 << 31)

int64_t ir_affine_eval(const ir_affine *a, int n_syms, const int64_t *syms) {
  int64_t v = a->off;
  for (int k = 0; k < n_syms; k++) v += a->coef[k] * syms[k];
  return v;
}

const ir_affine *ir_profile_dim(const ir_profile *p, int32_t t, int k) {
  for (int32_t i = 0; p && i < p->n_dims; i++)
    if (p->dims[i].at == t && p->dims[i].index == k) return &p->dims[i];
  return NULL;
}

int64_t ir_profile_at_min(const ir_profile *p, const ir_affine *a) {
  int64_t lo[IR_MAX_PROFILE_SYMS];
  for (int j = 0; j < p->n_syms; j++) lo[j] = p->syms[j].min;
  return ir_affine_eval(a, p->n_syms, lo);
}

/* The attribute entry a names: its attr, or NULL. */
static ir_attr *attr_of(ir_node *n, const ir_affine *a) {
  for (int k = 0; k < n->n_attrs; k++)
    if (n->attrs[k].name == a->attr || (a->attr && !strcmp(n->attrs[k].name, a->attr))) {
      ir_attr *x = &n->attrs[k];
      if (x->type == IR_ATTR_INT && a->index == 0) return x;
      if (x->type == IR_ATTR_INTS && a->index >= 0 && a->index < x->i) return x;
      return NULL;
    }
  return NULL;
}

static int64_t attr_value(const ir_attr *x, int32_t index) {
  return x->type == IR_ATTR_INT ? x->i : x->ints[index];
}

ir_status ir_profile_verify(const ir_graph *g, ir_diag *d) {
  const ir_profile *p = g->profile;
  if (!p) return IR_OK;
  if (p->n_syms < 1 || p->n_syms > IR_MAX_PROFILE_SYMS || p->n_dims < 0 || p->n_attrs < 0)
    return ir_diag_set(d, IR_BAD_FORMAT, "shape profile: %d symbols", p->n_syms);
  int64_t max[IR_MAX_PROFILE_SYMS];
  for (int k = 0; k < p->n_syms; k++) {
    const ir_shape_sym *s = &p->syms[k];
    if (s->min < 1 || s->min > s->max || s->max > MAX_SYM_VALUE ||
        !memchr(s->name, 0, sizeof s->name))
      return ir_diag_set(d, IR_BAD_FORMAT, "shape profile: symbol %d has range %lld..%lld", k,
                         (long long)s->min, (long long)s->max);
    max[k] = s->max;
  }
  for (int32_t i = 0; i < p->n_dims; i++) {
    const ir_affine *a = &p->dims[i];
    if (a->at < 0 || a->at >= g->n_tensors || a->index < 0 || a->index >= g->tensors[a->at].rank ||
        g->tensors[a->at].kind == IR_TENSOR_WEIGHT)
      return ir_diag_set(d, IR_BAD_FORMAT, "shape profile: dim entry %d names no activation dim",
                         i);
    for (int k = 0; k < p->n_syms; k++)
      if (a->coef[k] < 0 || a->coef[k] > MAX_SYM_VALUE)
        return ir_diag_set(d, IR_BAD_FORMAT, "shape profile: dim entry %d has coefficient %lld", i,
                           (long long)a->coef[k]);
    if (a->off < -MAX_SYM_VALUE || a->off > MAX_SYM_VALUE ||
        ir_affine_eval(a, p->n_syms, max) != g->tensors[a->at].dims[a->index].n)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "shape profile: dim %d of tensor '%s' is not its value at the maxima",
                         a->index, g->tensors[a->at].name);
  }
  for (int32_t i = 0; i < p->n_attrs; i++) {
    const ir_affine *a = &p->attrs[i];
    ir_attr *x = a->at >= 0 && a->at < g->n_nodes ? attr_of(&g->nodes[a->at], a) : NULL;
    bool small = a->off >= -MAX_SYM_VALUE && a->off <= MAX_SYM_VALUE;
    for (int k = 0; k < p->n_syms; k++)
      small &= a->coef[k] >= -MAX_SYM_VALUE && a->coef[k] <= MAX_SYM_VALUE;
    if (!x || !small || ir_affine_eval(a, p->n_syms, max) != attr_value(x, a->index))
      return ir_diag_set(d, IR_BAD_FORMAT, "shape profile: attribute entry %d does not hold", i);
  }
  return IR_OK;
}

ir_status ir_profile_solve(const ir_graph *g, int32_t t, int rank, const int64_t *shape,
                           int64_t *syms, bool *known, ir_diag *d) {
  const ir_profile *p = g->profile;
  const ir_tensor *x = &g->tensors[t];
  if (rank != x->rank)
    return ir_diag_set(d, IR_INVALID_ARG, "input '%s' has rank %d, not %d", x->name, rank, x->rank);
  for (int k = 0; k < rank; k++) {
    const ir_affine *a = ir_profile_dim(p, t, k);
    if (!a) {
      if (shape[k] != x->dims[k].n)
        return ir_diag_set(d, IR_INVALID_ARG, "input '%s': dim %d is %lld, not %lld", x->name, k,
                           (long long)shape[k], (long long)x->dims[k].n);
      continue;
    }
    int sym = -1, n_used = 0;
    for (int j = 0; j < p->n_syms; j++)
      if (a->coef[j]) sym = j, n_used++;
    if (n_used != 1) continue; /* checked when the instance is set */
    const ir_shape_sym *s = &p->syms[sym];
    int64_t v = shape[k] - a->off, c = a->coef[sym];
    int64_t lo = a->off + c * s->min, hi = a->off + c * s->max;
    if (v % c || v / c < s->min || v / c > s->max)
      return ir_diag_set(d, IR_INVALID_ARG,
                         "input '%s': dim %d ('%s') is %lld, outside the plan's range %lld..%lld%s",
                         x->name, k, s->name, (long long)shape[k], (long long)lo, (long long)hi,
                         c > 1 ? " (in steps of the coefficient)" : "");
    if (known[sym] && syms[sym] != v / c)
      return ir_diag_set(d, IR_INVALID_ARG,
                         "input '%s': dim %d ('%s') is %lld, but another input set it to %lld",
                         x->name, k, s->name, (long long)(v / c), (long long)syms[sym]);
    syms[sym] = v / c;
    known[sym] = true;
  }
  return IR_OK;
}

ir_graph *ir_profile_instance(const ir_graph *g) {
  ir_graph *w = ir_calloc(1, sizeof *w);
  if (!w) return NULL;
  *w = *g;
  w->owned = NULL;
  w->n_owned = w->cap_owned = 0;
  w->lazies = NULL; /* its tensors' recipes stay g's */
  w->n_lazies = w->cap_lazies = 0;
  w->tensors = ir_malloc(((size_t)g->n_tensors + 1) * sizeof *w->tensors);
  w->nodes = ir_malloc(((size_t)g->n_nodes + 1) * sizeof *w->nodes);
  size_t pool = 0;
  for (int32_t i = 0; g->profile && i < g->profile->n_attrs; i++) pool += IR_MAX_ATTR_INTS;
  int64_t *ints = ir_malloc((pool + 1) * sizeof *ints);
  w->owned = ir_malloc(sizeof *w->owned);
  if (!w->tensors || !w->nodes || !ints || !w->owned) {
    ir_free(ints);
    ir_profile_instance_free(w);
    return NULL;
  }
  w->owned[0] = ints;
  w->n_owned = w->cap_owned = 1;
  memcpy(w->tensors, g->tensors, (size_t)g->n_tensors * sizeof *w->tensors);
  memcpy(w->nodes, g->nodes, (size_t)g->n_nodes * sizeof *w->nodes);
  /* every INTS attribute the profile touches gets its own copy of the values */
  int64_t *next = ints;
  for (int32_t i = 0; g->profile && i < g->profile->n_attrs; i++) {
    ir_attr *x = attr_of(&w->nodes[g->profile->attrs[i].at], &g->profile->attrs[i]);
    if (x && x->type == IR_ATTR_INTS && !(x->ints >= ints && x->ints < ints + pool)) {
      memcpy(next, x->ints, (size_t)x->i * sizeof *next);
      x->ints = next;
      next += IR_MAX_ATTR_INTS;
    }
  }
  return w;
}

void ir_profile_instance_free(ir_graph *w) {
  if (!w) return;
  ir_free(w->tensors);
  ir_free(w->nodes);
  if (w->owned) ir_free(w->owned[0]);
  ir_free(w->owned);
  ir_free(w);
}

ir_status ir_profile_instance_set(const ir_graph *g, ir_graph *w, const int64_t *syms, ir_diag *d) {
  const ir_profile *p = g->profile;
  if (!p) return IR_OK;
  for (int k = 0; k < p->n_syms; k++)
    if (syms[k] < p->syms[k].min || syms[k] > p->syms[k].max)
      return ir_diag_set(d, IR_INVALID_ARG, "'%s' is %lld, outside the plan's range %lld..%lld",
                         p->syms[k].name, (long long)syms[k], (long long)p->syms[k].min,
                         (long long)p->syms[k].max);
  for (int32_t i = 0; i < p->n_dims; i++)
    w->tensors[p->dims[i].at].dims[p->dims[i].index].n =
        ir_affine_eval(&p->dims[i], p->n_syms, syms);
  for (int32_t i = 0; i < p->n_attrs; i++) {
    ir_attr *x = attr_of(&w->nodes[p->attrs[i].at], &p->attrs[i]);
    int64_t v = ir_affine_eval(&p->attrs[i], p->n_syms, syms);
    if (x->type == IR_ATTR_INT) x->i = v;
    else ((int64_t *)x->ints)[p->attrs[i].index] = v;
  }
  for (int32_t i = 0; i < w->n_nodes; i++) {
    const ir_node *n = &w->nodes[i];
    ir_dtype dt[IR_MAX_IO];
    int rank[IR_MAX_IO], n_out = 0;
    ir_dim dims[IR_MAX_IO][IR_MAX_RANK];
    ir_diag local = {0};
    bool ok = ir_op_infer(w, n, dt, rank, dims, &n_out, &local) == IR_OK && n_out == n->n_out;
    for (int k = 0; ok && k < n_out; k++) {
      const ir_tensor *t = &w->tensors[n->out[k]];
      ok = rank[k] == t->rank && dt[k] == t->dtype;
      for (int j = 0; ok && j < rank[k]; j++) ok = dims[k][j].n == t->dims[j].n;
    }
    if (!ok)
      return ir_diag_set(d, IR_INVALID_ARG, "node '%s' does not hold at this shape%s%s", n->name,
                         local.msg[0] ? ": " : "", local.msg);
  }
  return IR_OK;
}
