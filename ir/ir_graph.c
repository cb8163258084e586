/* ir_graph: construction, ownership and queries of the IR graph. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "ir_alloc.h"
#include "ir_lazy.h"

static bool grow(void **arr, int32_t *cap, int32_t need, size_t elem) {
  if (need <= *cap) return true;
  int32_t ncap = *cap ? *cap * 2 : 16;
  while (ncap < need) ncap *= 2;
  void *p = ir_realloc(*arr, (size_t)ncap * elem);
  if (!p) return false;
  *arr = p;
  *cap = ncap;
  return true;
}

/* Input and output lists are short: one realloc per append is fine. */
static bool append_i32(int32_t **arr, int32_t *n, int32_t v) {
  int32_t *p = ir_realloc(*arr, (size_t)(*n + 1) * sizeof(int32_t));
  if (!p) return false;
  p[(*n)++] = v;
  *arr = p;
  return true;
}

ir_graph *ir_graph_create(void) { return ir_calloc(1, sizeof(ir_graph)); }

void ir_graph_destroy(ir_graph *g) {
  if (!g) return;
  for (int32_t i = 0; i < g->n_tensors; i++) ir_free(g->tensors[i].name);
  for (int32_t i = 0; i < g->n_nodes; i++) ir_free(g->nodes[i].name);
  for (int32_t i = 0; i < g->n_owned; i++) ir_free(g->owned[i]);
  for (int32_t i = 0; i < g->n_lazies; i++) g->lazies[i]->drop(g->lazies[i]);
  ir_free(g->lazies);
  ir_free(g->tensors);
  ir_free(g->nodes);
  ir_free(g->inputs);
  ir_free(g->outputs);
  ir_free(g->owned);
  if (g->profile) {
    ir_free(g->profile->dims);
    ir_free(g->profile->attrs);
    ir_free(g->profile);
  }
  ir_free(g);
}

bool ir_graph_adopt(ir_graph *g, void *buf) {
  if (!grow((void **)&g->owned, &g->cap_owned, g->n_owned + 1, sizeof(void *))) {
    ir_free(buf);
    return false;
  }
  g->owned[g->n_owned++] = buf;
  return true;
}

int32_t ir_graph_add_tensor(ir_graph *g, const char *name, ir_dtype dt, int rank,
                            const ir_dim *dims, ir_tensor_kind kind) {
  if (rank < 0 || rank > IR_MAX_RANK) return -1;
  if (!grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof(ir_tensor))) return -1;
  char *nm = ir_strdup(name);
  if (!nm) return -1;
  ir_tensor *t = &g->tensors[g->n_tensors];
  memset(t, 0, sizeof *t);
  t->name = nm;
  t->dtype = dt;
  t->rank = rank;
  for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
  t->kind = kind;
  t->arena_offset = -1;
  t->producer = -1;
  return g->n_tensors++;
}

int32_t ir_graph_add_weight(ir_graph *g, const char *name, ir_dtype dt, int rank,
                            const int64_t *shape, const void *data, uint64_t nbytes) {
  ir_dim dims[IR_MAX_RANK];
  if (rank < 0 || rank > IR_MAX_RANK) return -1;
  for (int i = 0; i < rank; i++) dims[i] = (ir_dim){.n = shape[i], .sym = IR_SYM_NONE};
  int32_t id = ir_graph_add_tensor(g, name, dt, rank, dims, IR_TENSOR_WEIGHT);
  if (id < 0) return -1;
  g->tensors[id].data = data;
  g->tensors[id].nbytes = nbytes;
  return id;
}

int32_t ir_graph_add_input(ir_graph *g, const char *name, ir_dtype dt, int rank,
                           const ir_dim *dims) {
  int32_t id = ir_graph_add_tensor(g, name, dt, rank, dims, IR_TENSOR_INPUT);
  if (id < 0) return -1;
  return append_i32(&g->inputs, &g->n_inputs, id) ? id : -1;
}

bool ir_graph_add_output(ir_graph *g, int32_t tensor) {
  return append_i32(&g->outputs, &g->n_outputs, tensor);
}

static char *output_name(const char *node_name, int i, int n_out) {
  size_t len = strlen(node_name) + 16;
  char *s = ir_malloc(len);
  if (!s) return NULL;
  if (n_out == 1) snprintf(s, len, "%s", node_name);
  else snprintf(s, len, "%s.out%d", node_name, i);
  return s;
}

static int32_t add_outputs(ir_graph *g, ir_node *n, const ir_dtype *dt, const int *rank,
                           ir_dim (*dims)[IR_MAX_RANK], int n_out) {
  for (int i = 0; i < n_out; i++) {
    char *nm = output_name(n->name, i, n_out);
    if (!nm) return -1;
    int32_t t = ir_graph_add_tensor(g, nm, dt[i], rank[i], dims[i], IR_TENSOR_ACT);
    ir_free(nm);
    if (t < 0) return -1;
    g->tensors[t].producer = g->n_nodes;
    n->out[i] = t;
  }
  n->n_out = n_out;
  return 0;
}

/* Int-list attributes arrive pointing at the caller's memory: give them the graph's. */
static bool copy_int_lists(ir_graph *g, ir_node *n) {
  for (int k = 0; k < n->n_attrs; k++) {
    ir_attr *a = &n->attrs[k];
    if (a->type != IR_ATTR_INTS) continue;
    int64_t *v = ir_malloc(((size_t)a->i + 1) * sizeof *v);
    if (!v) return false;
    if (a->i > 0) memcpy(v, a->ints, (size_t)a->i * sizeof *v);
    if (!ir_graph_adopt(g, v)) return false;
    a->ints = v;
  }
  return true;
}

int32_t ir_graph_add_node(ir_graph *g, ir_op op, const char *name, const int32_t *in, int n_in,
                          const ir_attr *attrs, int n_attrs, int32_t *out_tensor, ir_diag *d) {
  if (n_in > IR_MAX_IO || n_attrs > IR_MAX_ATTRS) {
    ir_diag_set(d, IR_INVALID_ARG, "node '%s': too many inputs or attributes", name);
    return -1;
  }
  ir_node n = {.op = op, .n_in = n_in, .n_attrs = n_attrs};
  if (n_in > 0) memcpy(n.in, in, sizeof(int32_t) * (size_t)n_in);
  if (n_attrs > 0) memcpy(n.attrs, attrs, sizeof(ir_attr) * (size_t)n_attrs);
  ir_dtype dt[IR_MAX_IO];
  int rank[IR_MAX_IO], n_out = 0;
  ir_dim dims[IR_MAX_IO][IR_MAX_RANK];
  n.name = (char *)name; /* for messages only until copied below */
  if (ir_op_infer(g, &n, dt, rank, dims, &n_out, d) != IR_OK) return -1;
  if (!copy_int_lists(g, &n)) {
    ir_diag_set(d, IR_OOM, "out of memory adding node '%s'", name);
    return -1;
  }
  if (!grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(ir_node)) ||
      !(n.name = ir_strdup(name))) {
    ir_diag_set(d, IR_OOM, "out of memory adding node '%s'", name);
    return -1;
  }
  if (add_outputs(g, &n, dt, rank, dims, n_out) < 0) {
    ir_free(n.name);
    ir_diag_set(d, IR_OOM, "out of memory adding node '%s'", name);
    return -1;
  }
  g->nodes[g->n_nodes] = n;
  if (out_tensor) *out_tensor = n.out[0];
  return g->n_nodes++;
}

static const ir_attr *find_attr(const ir_node *n, const char *name) {
  for (int i = 0; i < n->n_attrs; i++)
    if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
  return NULL;
}

int64_t ir_node_attr_i(const ir_node *n, const char *name, int64_t def) {
  const ir_attr *a = find_attr(n, name);
  if (!a) return def;
  if (a->type == IR_ATTR_INT) return a->i;
  /* a float where an integer belongs: in range, or a value no check accepts (not UB) */
  return a->f >= -9.0e18 && a->f <= 9.0e18 ? (int64_t)a->f : INT64_MIN;
}

double ir_node_attr_f(const ir_node *n, const char *name, double def) {
  const ir_attr *a = find_attr(n, name);
  return a ? (a->type == IR_ATTR_FLOAT ? a->f : (double)a->i) : def;
}

bool ir_node_has_attr(const ir_node *n, const char *name) { return find_attr(n, name) != NULL; }

const int64_t *ir_node_attr_ints(const ir_node *n, const char *name, int *out_n) {
  const ir_attr *a = find_attr(n, name);
  bool ok = a && a->type == IR_ATTR_INTS && a->i >= 0 && a->i <= IR_MAX_ATTR_INTS &&
            (a->ints || a->i == 0);
  *out_n = ok ? (int)a->i : 0;
  return ok ? a->ints : NULL;
}

/* Plans store attribute names as text: append only, never rename. */
static const char *const k_attr_names[] = {
    "eps",
    "scale",
    "layer",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "rot_dim",
    "neox",
    "to",
    "ranks",      /* all_reduce, all_gather */
    "vocab_part", /* embed: the table is the tensor-parallel rank's share of the rows */
    /* n-d generic ops (ir_op_nd.c) */
    "axis",
    "axes",
    "perm",
    "shape",
    "keepdims",
    "starts",
    "steps",
    "trans_a",
    "trans_b",
    "alpha",
    "beta",
    "gamma",
    "upper",
    "k",
    "exclusive",
    "reverse",
    "is_causal",
    "q_num_heads",
    "kv_num_heads",
    "softcap",
    "qk_mode",
    "interleaved",
    "num_heads",
    "approximate",
    "pads",
    "value",
    "mode",
    "select_last",
    "bool",
    "fmod",
    "split",
    "repeats",
    "flat",
    "n_out",
    "min",
    "max",
    "detect_neg",
    "detect_pos",
    /* matmul with an i8 weight: W8A8 (ir_op.c) */
    "act_int8",
    /* fusion: matmul epilogue (ir_act) */
    "act",
    /* attention with the per-head q/k norm folded in */
    "qk_eps",
    /* sliding-window attention; the softcap op (Gemma) */
    "window",
    /* conv and pool (ir_op_nd_nn.c) */
    "strides",
    "dilations",
    "group",
    "kernel",
    "ceil_mode",
    "count_include_pad",
    "cap",
    /* matmul with a bf16 weight: bf16 activations (ir_op.c) */
    "act_bf16",
};

const char *ir_attr_intern(const char *name) {
  for (size_t i = 0; i < sizeof k_attr_names / sizeof *k_attr_names; i++)
    if (strcmp(k_attr_names[i], name) == 0) return k_attr_names[i];
  return NULL;
}

const char *ir_sym_name(ir_sym s) {
  switch (s) {
  case IR_SYM_TOKENS: return "T";
  case IR_SYM_SEQS: return "S";
  case IR_SYM_LOGITS: return "L";
  default: return "?";
  }
}

int64_t ir_dim_value(const ir_graph *g, ir_dim d, const int64_t *syms) {
  if (d.sym == IR_SYM_NONE) return d.n;
  if (syms) return syms[d.sym];
  switch (d.sym) {
  case IR_SYM_TOKENS: return g->config.max_tokens;
  case IR_SYM_SEQS: return g->config.max_seqs;
  case IR_SYM_LOGITS: return g->config.max_logits;
  default: return 0;
  }
}

uint64_t ir_tensor_elems(const ir_graph *g, const ir_tensor *t, const int64_t *syms) {
  uint64_t n = 1;
  for (int i = 0; i < t->rank; i++) {
    int64_t v = ir_dim_value(g, t->dims[i], syms);
    if (v < 0 || __builtin_mul_overflow(n, (uint64_t)v, &n)) return UINT64_MAX; /* saturates */
  }
  return n;
}

uint64_t ir_tensor_bytes(const ir_graph *g, const ir_tensor *t, const int64_t *syms) {
  return ir_dtype_bytes(t->dtype, ir_tensor_elems(g, t, syms));
}

int32_t ir_graph_find_tensor(const ir_graph *g, const char *name) {
  for (int32_t i = 0; i < g->n_tensors; i++)
    if (strcmp(g->tensors[i].name, name) == 0) return i;
  return -1;
}
