/* pass_fuse_proj: projections of one input merged into one GEMM, their weights (and
 * biases) concatenated along N at build time: q/k/v into a packed qkv that attention reads
 * in place, and gate/up into a matmul whose swiglu epilogue writes silu(gate) * up. */
#include <stdlib.h>
#include <string.h>

#include "ir_alloc.h"
#include "ir_lazy.h"
#include "pass.h"

/* A matmul the fusions may merge: one constant weight of a dtype whose rows concatenate
 * (float, or GGUF blocks along K), an optional constant f32 bias, nothing else (a weight
 * carrying separate quantization parameters or an epilogue is left alone). */
static bool plain_matmul(const ir_graph *g, int32_t ni) {
  if (ni < 0) return false;
  const ir_node *n = &g->nodes[ni];
  if (n->op != IR_OP_MATMUL || n->n_in > 3 || n->n_attrs || n->n_out != 1) return false;
  const ir_tensor *w = &g->tensors[n->in[1]];
  bool dt_ok = w->dtype == IR_F32 || w->dtype == IR_F16 || w->dtype == IR_BF16 ||
               w->dtype == IR_Q8_0 || w->dtype == IR_Q4_0 || w->dtype == IR_Q4_1;
  if (!dt_ok || w->kind != IR_TENSOR_WEIGHT || (!w->data && !w->lazy) || w->rank != 2 ||
      w->dims[0].sym != IR_SYM_NONE || w->dims[1].sym != IR_SYM_NONE)
    return false;
  if (n->n_in < 3 || n->in[2] < 0) return true;
  const ir_tensor *b = &g->tensors[n->in[2]];
  return b->kind == IR_TENSOR_WEIGHT && (b->data || b->lazy) && b->dtype == IR_F32 && b->rank == 1;
}

static bool has_bias(const ir_node *n) { return n->n_in > 2 && n->in[2] >= 0; }

/* The matmuls m[0..n) can become one: distinct plain matmuls of the same x, weights of
 * one dtype and K, all with a bias or none, each output read once (by the consumer). */
static bool mergeable(const ir_graph *g, const int32_t *m, int n) {
  for (int i = 0; i < n; i++) {
    if (!plain_matmul(g, m[i]) || pass_count_uses(g, g->nodes[m[i]].out[0], NULL) != 1)
      return false;
    for (int j = 0; j < i; j++)
      if (m[j] == m[i]) return false;
    const ir_node *a = &g->nodes[m[0]], *b = &g->nodes[m[i]];
    const ir_tensor *wa = &g->tensors[a->in[1]], *wb = &g->tensors[b->in[1]];
    if (a->in[0] != b->in[0] || wa->dtype != wb->dtype || wa->dims[1].n != wb->dims[1].n ||
        has_bias(a) != has_bias(b))
      return false;
  }
  return true;
}

/* `base` with its first `from` replaced by `to`, else base + "." + to. */
static void fused_name(char *buf, size_t len, const char *base, const char *from, const char *to) {
  const char *at = strstr(base, from);
  if (at) snprintf(buf, len, "%.*s%s%s", (int)(at - base), base, to, at + strlen(from));
  else snprintf(buf, len, "%s.%s", base, to);
}

/* A new weight: the tensors in[k] of nodes m[0..n) stacked along axis 0 (rows are
 * independent in every dtype plain_matmul admits), as a recipe the plan writer makes a
 * chunk at a time. -1 on OOM. */
static int32_t concat_weights(ir_graph *g, const int32_t *m, int n, int k, const char *name) {
  ir_wref in[8];
  int64_t rows = 0;
  for (int i = 0; i < n; i++) {
    in[i] = ir_wref_of(&g->tensors[g->nodes[m[i]].in[k]]);
    rows += in[i].dims[0];
  }
  const ir_tensor *t0 = &g->tensors[g->nodes[m[0]].in[k]];
  int64_t shape[2] = {rows, t0->rank == 2 ? t0->dims[1].n : 0};
  return ir_graph_add_lazy_weight(g, name, t0->dtype, t0->rank, shape, ir_lazy_concat(in, n));
}

/* Turns m[0] into the merged matmul (weights and bias concatenated, renamed with `from`
 * -> `to`) and marks m[1..n) dead. Its output is left to the caller. False on OOM. */
static bool merge(ir_graph *g, const int32_t *m, int n, const char *from, const char *to,
                  bool *dead) {
  char name[256];
  fused_name(name, sizeof name, g->tensors[g->nodes[m[0]].in[1]].name, from, to);
  int32_t w = concat_weights(g, m, n, 1, name), b = -1;
  if (w >= 0 && has_bias(&g->nodes[m[0]])) {
    fused_name(name, sizeof name, g->tensors[g->nodes[m[0]].in[2]].name, from, to);
    b = concat_weights(g, m, n, 2, name);
    if (b < 0) return false;
  }
  fused_name(name, sizeof name, g->nodes[m[0]].name, from, to);
  char *nn = ir_strdup(name);
  if (w < 0 || !nn) {
    ir_free(nn);
    return false;
  }
  ir_node *f = &g->nodes[m[0]];
  ir_free(f->name);
  f->name = nn;
  f->in[1] = w;
  f->in[2] = b;
  f->n_in = b >= 0 ? 3 : 2;
  for (int i = 1; i < n; i++) {
    g->nodes[m[i]].n_out = 0; /* its output loses its producer; compact drops it */
    dead[m[i]] = true;
  }
  return true;
}

static int32_t producer_of(const ir_graph *g, const ir_node *n, int k) {
  return k < n->n_in && n->in[k] >= 0 ? g->tensors[n->in[k]].producer : -1;
}

/* attention(q, k, v, ...) whose q/k/v come from mergeable matmuls -> attention(qkv, -, -,
 * ...). The merged matmul sits at q's place: x and the weights exist there. */
static int fuse_qkv_at(ir_graph *g, int32_t ai, bool *dead, ir_diag *d) {
  const ir_node *a = &g->nodes[ai];
  if (a->op != IR_OP_ATTENTION || a->n_in < 3 || a->in[1] < 0 || a->in[2] < 0) return 0;
  int32_t m[3] = {producer_of(g, a, 0), producer_of(g, a, 1), producer_of(g, a, 2)};
  if (!mergeable(g, m, 3)) return 0;
  const ir_tensor *q = &g->tensors[a->in[0]], *k = &g->tensors[a->in[1]];
  const ir_tensor *v = &g->tensors[a->in[2]];
  ir_dim dims[2] = {q->dims[0], {.n = q->dims[1].n + k->dims[1].n + v->dims[1].n}};
  char name[256];
  fused_name(name, sizeof name, g->nodes[m[0]].name, "q_proj", "qkv_proj");
  int32_t out = ir_graph_add_tensor(g, name, IR_F32, 2, dims, IR_TENSOR_ACT);
  if (out < 0 || !merge(g, m, 3, "q_proj", "qkv_proj", dead)) {
    ir_diag_set(d, IR_OOM, "fuse_qkv: out of memory");
    return -1;
  }
  g->nodes[m[0]].out[0] = out;
  g->tensors[out].producer = m[0];
  ir_node *an = &g->nodes[ai];
  an->in[0] = out;
  an->in[1] = an->in[2] = -1;
  return 1;
}

/* swiglu(gate, up) of mergeable matmuls -> matmul(x, [wg; wu]; act=swiglu) writing the
 * swiglu's own output, at the gate matmul's place. */
static int fuse_gate_up_at(ir_graph *g, int32_t si, bool *dead, ir_diag *d) {
  const ir_node *s = &g->nodes[si];
  /* the matmul epilogue is silu's alone: a geglu stays a swiglu op after two matmuls */
  if (s->op != IR_OP_SWIGLU || ir_node_attr_i(s, "act", IR_ACT_SWIGLU) != IR_ACT_SWIGLU) return 0;
  int32_t m[2] = {producer_of(g, s, 0), producer_of(g, s, 1)};
  if (!mergeable(g, m, 2)) return 0;
  int32_t y = s->out[0];
  if (!merge(g, m, 2, "gate_proj", "gate_up_proj", dead)) {
    ir_diag_set(d, IR_OOM, "fuse_gate_up: out of memory");
    return -1;
  }
  ir_node *f = &g->nodes[m[0]];
  f->attrs[f->n_attrs++] = IR_AI(ir_attr_intern("act"), IR_ACT_SWIGLU);
  f->out[0] = y;
  g->tensors[y].producer = m[0];
  g->nodes[si].n_out = 0;
  dead[si] = true;
  return 1;
}

typedef int (*fuse_at_fn)(ir_graph *, int32_t, bool *, ir_diag *);

static ir_status run_fusion(ir_graph *g, fuse_at_fn fn, int *out_fused, ir_diag *d) {
  bool *dead = ir_calloc((size_t)g->n_nodes + 1, sizeof *dead);
  if (!dead) return ir_diag_set(d, IR_OOM, "fuse: out of memory");
  int fused = 0, r = 0;
  for (int32_t i = 0; r >= 0 && i < g->n_nodes; i++)
    if (!dead[i] && (r = fn(g, i, dead, d)) > 0) fused++;
  bool ok = r >= 0 && pass_compact(g, dead, NULL, NULL);
  ir_free(dead);
  if (r < 0) return d->status;
  if (!ok) return ir_diag_set(d, IR_OOM, "fuse: out of memory");
  *out_fused = fused;
  return IR_OK;
}

ir_status pass_fuse_qkv(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  int n = 0;
  ir_status st = run_fusion(g, fuse_qkv_at, &n, d);
  if (st == IR_OK)
    pass_log_add(log, "fuse_qkv: merged q/k/v projections into one matmul in %d layers", n);
  return st;
}

ir_status pass_fuse_gate_up(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  int n = 0;
  ir_status st = run_fusion(g, fuse_gate_up_at, &n, d);
  if (st == IR_OK)
    pass_log_add(log,
                 "fuse_gate_up: merged gate/up projections + swiglu into one matmul with "
                 "a swiglu epilogue in %d layers",
                 n);
  return st;
}
