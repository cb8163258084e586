/* pass_canon_llm: a causal LM in a generic n-d graph, recognised by what it computes
 * (pass_canon.h), rebuilt as the Llama template's fused program. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir_alloc.h"
#include "ir_op_nd.h"
#include "kn_nd.h"
#include "pass_canon.h"

#define MAX_PROJ 8

typedef struct proj {
  int32_t out;  /* the projection's value (after its bias) */
  int32_t w, b; /* weight [K, N] (or [N, K] when wt), bias [N] or -1 */
  bool wt;
  int64_t k, n;
  int32_t node;
} proj;

/* An attention operand traced back to a projection. */
typedef struct trace {
  int src; /* index into the layer's projections */
  double scale;
  int32_t rope; /* the rope's Add node, or -1 */
  int32_t rope_x, rope_rot, rope_cos, rope_sin;
  int32_t qn_w; /* q/k norm weight, or -1 */
  double qn_eps;
  int32_t past_in; /* the past-KV graph input concatenated, or -1 */
  int32_t past_cat;
} trace;

typedef struct canon {
  const ir_graph *g;
  const pass_llm_io *io;
  pass_llm *r;
  ir_diag *d;
  ir_status st;
  int layer;
  int32_t *use_off, *use_node; /* consumers of each tensor (CSR) */
  int32_t *through;            /* per tensor: the value it passes through in evaluation, or -1 */
  double eps;
  bool have_eps;
  bool have_rope;
  int64_t rope_half;
  double *cur;           /* [rope_half]: this layer's frequencies (read off the query's tables) */
  double *freqs[2];      /* the distinct frequency sets seen (global, and a local one) */
  int8_t *layer_rope;    /* per layer: 0 no rope, 1 or 2 the set */
  int64_t *layer_window; /* per layer: the mask's window, 0 when it attends all */
  int32_t *past_seen;
  int n_past_seen;
  double table_tol;          /* the rope tables' precision: f32 2e-5, f16 2e-3, bf16 1.6e-2 */
  ir_dtype half_dt;          /* the graph computes in f16 or bf16 (IR_DTYPE_INVALID: no) */
  ir_graph shadow;           /* g with f16/bf16 activations typed f32: numbered values stay */
  ir_tensor *shadow_tensors; /* exact in evaluation whatever the graph computes in */
} canon;

/* --- errors and small queries ---------------------------------------------------------- */

static ir_status cfail(canon *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ir_status cfail(canon *c, const char *fmt, ...) {
  if (c->st != IR_OK) return c->st;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->layer >= 0) c->st = ir_diag_set(c->d, IR_UNSUPPORTED, "layer %d: %s", c->layer, msg);
  else c->st = ir_diag_set(c->d, IR_UNSUPPORTED, "%s", msg);
  return c->st;
}

static ir_status coom(canon *c) {
  if (c->st == IR_OK) c->st = ir_diag_set(c->d, IR_OOM, "out of memory");
  return c->st;
}

static const ir_node *prod(const canon *c, int32_t t) {
  if (t < 0 || t >= c->g->n_tensors) return NULL;
  int32_t p = c->g->tensors[t].producer;
  return p >= 0 ? &c->g->nodes[p] : NULL;
}

static bool is_op(const ir_node *n, ir_op op) { return n && n->op == op; }

static const char *nname(const ir_node *n) { return n && n->name ? n->name : "?"; }

static const ir_tensor *tt(const canon *c, int32_t t) { return &c->g->tensors[t]; }

static bool is_w(const canon *c, int32_t t) { return t >= 0 && tt(c, t)->kind == IR_TENSOR_WEIGHT; }

static bool is_float(ir_dtype dt) { return dt == IR_F32 || dt == IR_F16 || dt == IR_BF16; }

static int64_t numel(const canon *c, int32_t t) {
  int64_t s[IR_MAX_RANK];
  const ir_tensor *x = tt(c, t);
  return ir_nd_static_shape(x, s) ? ir_nd_numel(x->rank, s) : -1;
}

static int64_t dim(const canon *c, int32_t t, int k) {
  const ir_tensor *x = tt(c, t);
  if (k < 0) k += x->rank;
  return k >= 0 && k < x->rank ? x->dims[k].n : -1;
}

/* Element i of a constant as double. */
static double wval(const canon *c, int32_t t, int64_t i) {
  const ir_tensor *x = tt(c, t);
  switch (x->dtype) {
  case IR_F32: return ((const float *)x->data)[i];
  case IR_F16: return ir_f16_to_f32(((const uint16_t *)x->data)[i]);
  case IR_BF16: return ir_bf16_to_f32(((const uint16_t *)x->data)[i]);
  case IR_I64: return (double)((const int64_t *)x->data)[i];
  case IR_I32: return ((const int32_t *)x->data)[i];
  case IR_I8: return ((const int8_t *)x->data)[i];
  case IR_U8: return ((const uint8_t *)x->data)[i];
  default: return NAN;
  }
}

/* The value of a one-element constant. */
static bool scalar(const canon *c, int32_t t, double *v) {
  if (!is_w(c, t) || numel(c, t) != 1) return false;
  *v = wval(c, t, 0);
  return !isnan(*v);
}

/* The other input of a two-input node. */
static int32_t other(const ir_node *n, int32_t t) { return n->in[0] == t ? n->in[1] : n->in[0]; }

/* t with float-to-float casts in front of it looked through. */
static int32_t skip_cast(const canon *c, int32_t t) {
  for (const ir_node *n = prod(c, t); is_op(n, IR_OP_ND_CAST) && is_float(tt(c, n->in[0])->dtype);
       n = prod(c, t))
    t = n->in[0];
  return t;
}

static bool same(const canon *c, int32_t a, int32_t b) {
  return skip_cast(c, a) == skip_cast(c, b);
}

/* A node's distinct inputs: input k unless an earlier input is the same tensor. */
static bool first_use(const ir_node *n, int k) {
  for (int j = 0; j < k; j++)
    if (n->in[j] == n->in[k]) return false;
  return n->in[k] >= 0;
}

static bool build_uses(canon *c) {
  const ir_graph *g = c->g;
  c->use_off = ir_calloc((size_t)g->n_tensors + 2, sizeof *c->use_off);
  c->through = ir_malloc(((size_t)g->n_tensors + 1) * sizeof *c->through);
  int32_t *fill = ir_calloc((size_t)g->n_tensors + 1, sizeof *fill);
  int64_t total = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) total += g->nodes[i].n_in;
  c->use_node = ir_malloc(((size_t)total + 1) * sizeof *c->use_node);
  if (!c->use_off || !c->through || !c->use_node || !fill) {
    ir_free(fill);
    return false;
  }
  for (int32_t t = 0; t < g->n_tensors; t++) c->through[t] = -1;
  for (int32_t i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (first_use(&g->nodes[i], k)) c->use_off[g->nodes[i].in[k] + 1]++;
  for (int32_t t = 0; t < g->n_tensors; t++) c->use_off[t + 1] += c->use_off[t];
  for (int32_t i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (first_use(&g->nodes[i], k)) {
        int32_t t = g->nodes[i].in[k];
        c->use_node[c->use_off[t] + fill[t]++] = i;
      }
  ir_free(fill);
  return true;
}

/* Consumers of t: node indices. */
static int n_uses(const canon *c, int32_t t) { return c->use_off[t + 1] - c->use_off[t]; }
static const ir_node *use(const canon *c, int32_t t, int i) {
  return &c->g->nodes[c->use_node[c->use_off[t] + i]];
}

/* --- evaluation of data movement on numbered values ------------------------------------ */

/* Values of tensors computed from `from` (filled with its flat index + 1, as f32), with
 * weights as they are, past-KV inputs as zeros and c->through passing a value on. */
typedef struct ev {
  canon *c;
  int32_t from;
  void **val;
  bool *mine;
  const char *why; /* set when the value depends on something else */
  int depth;       /* of ev_val's recursion: a value far up the graph is not movement */
} ev;

static void *ev_val(ev *e, int32_t t);

static void *ev_alloc(ev *e, int32_t t) {
  uint64_t bytes = ir_tensor_bytes(&e->c->shadow, &e->c->shadow.tensors[t], NULL);
  if (bytes > (256u << 20)) {
    e->why = "a value too large to evaluate";
    return NULL;
  }
  void *p = ir_calloc(bytes ? bytes : 1, 1);
  if (!p) {
    coom(e->c);
    return NULL;
  }
  e->val[t] = p;
  e->mine[t] = true;
  return p;
}

static void *ev_val(ev *e, int32_t t) {
  canon *c = e->c;
  if (t < 0 || e->why || c->st != IR_OK) return NULL;
  if (e->val[t]) return e->val[t];
  const ir_tensor *x = tt(c, t);
  if (t == e->from) {
    float *p = ev_alloc(e, t);
    int64_t n = numel(c, t);
    for (int64_t i = 0; p && i < n; i++) p[i] = (float)(i + 1);
    return p;
  }
  if (x->kind == IR_TENSOR_WEIGHT) return (void *)x->data;
  if (x->kind == IR_TENSOR_INPUT) {
    if (t == c->io->input_ids) {
      e->why = "a value computed from the token ids";
      return NULL;
    }
    return ev_alloc(e, t); /* a past-KV input: zeros */
  }
  if (c->through[t] >= 0) {
    void *v = ev_val(e, c->through[t]);
    if (v) e->val[t] = v;
    return v;
  }
  const ir_node *n = prod(c, t);
  if (!n || !ir_op_is_nd(n->op)) {
    e->why = "a value no generic op computes";
    return NULL;
  }
  if (e->depth >= 512) {
    e->why = "a value more than 512 nodes away";
    return NULL;
  }
  const void *in[IR_MAX_IO] = {0};
  void *out[IR_MAX_IO] = {0};
  e->depth++;
  for (int k = 0; k < n->n_in; k++)
    if (n->in[k] >= 0 && !(in[k] = ev_val(e, n->in[k]))) {
      e->depth--;
      return NULL;
    }
  e->depth--;
  for (int k = 0; k < n->n_out; k++)
    if (!(out[k] = ev_alloc(e, n->out[k]))) return NULL;
  ir_diag d = {0};
  if (kn_nd_exec(NULL, &c->shadow, n, in, out, &d) != IR_OK) {
    e->why = "a node that fails on numbered values";
    return NULL;
  }
  return e->val[t];
}

static bool ev_init(ev *e, canon *c, int32_t from) {
  *e = (ev){.c = c, .from = from};
  e->val = ir_calloc((size_t)c->g->n_tensors + 1, sizeof *e->val);
  e->mine = ir_calloc((size_t)c->g->n_tensors + 1, sizeof *e->mine);
  if (!e->val || !e->mine) {
    ir_free(e->val);
    ir_free(e->mine);
    coom(c);
    return false;
  }
  return true;
}

static void ev_free(ev *e) {
  for (int32_t t = 0; e->val && t < e->c->g->n_tensors; t++)
    if (e->mine[t]) ir_free(e->val[t]);
  ir_free(e->val);
  ir_free(e->mine);
}

/* The f32 values of `to` computed from numbered `from`; NULL with a reason set. The result
 * lives until ev_free. */
static const float *ev_f32(ev *e, int32_t to, const char *what) {
  const float *v = ev_val(e, to);
  if (!v && e->c->st == IR_OK)
    cfail(e->c, "%s depends on %s", what, e->why ? e->why : "something unexpected");
  if (v && e->c->shadow.tensors[to].dtype != IR_F32) {
    cfail(e->c, "%s is %s, not f32 (only f32 graphs are recognised)", what,
          ir_dtype_name(tt(e->c, to)->dtype));
    return NULL;
  }
  return v;
}

/* --- norms ------------------------------------------------------------------------------ */

/* m == mean(x^2) over the last axis (ReduceMean, or ReduceSum over N, of Pow(x, 2) or x*x). */
static bool match_ms(const canon *c, int32_t m, int32_t x) {
  const ir_node *n = prod(c, skip_cast(c, m));
  double k;
  int64_t N = dim(c, x, -1);
  if (is_op(n, IR_OP_ND_DIV) && scalar(c, n->in[1], &k) && k == (double)N)
    n = prod(c, n->in[0]), N = -1;
  else if (is_op(n, IR_OP_ND_MUL) && (scalar(c, n->in[1], &k) || scalar(c, n->in[0], &k)) &&
           fabs(k * (double)N - 1) < 1e-6)
    n = prod(c, scalar(c, n->in[1], &k) ? n->in[0] : n->in[1]), N = -1;
  bool mean = is_op(n, IR_OP_ND_REDUCE_MEAN), sum = is_op(n, IR_OP_ND_REDUCE_SUM);
  if (!(mean || (sum && N < 0))) return false;
  const ir_tensor *o = tt(c, n->out[0]), *xi = tt(c, x);
  if (o->rank != xi->rank || o->dims[o->rank - 1].n != 1) return false;
  const ir_node *sq = prod(c, skip_cast(c, n->in[0]));
  double two;
  if (is_op(sq, IR_OP_ND_POW))
    return same(c, sq->in[0], x) && scalar(c, sq->in[1], &two) && two == 2;
  return is_op(sq, IR_OP_ND_MUL) && same(c, sq->in[0], x) && same(c, sq->in[1], x);
}

/* a == mean(x^2) + eps. */
static bool match_ms_eps(const canon *c, int32_t a, int32_t x, double *eps) {
  const ir_node *n = prod(c, skip_cast(c, a));
  if (!is_op(n, IR_OP_ND_ADD)) return false;
  for (int k = 0; k < 2; k++)
    if (scalar(c, n->in[k], eps) && match_ms(c, n->in[1 - k], x)) return true;
  return false;
}

/* s == sqrt(mean(x^2) + eps). */
static bool match_sqrt_ms(const canon *c, int32_t s, int32_t x, double *eps) {
  const ir_node *n = prod(c, skip_cast(c, s));
  return is_op(n, IR_OP_ND_SQRT) && match_ms_eps(c, n->in[0], x, eps);
}

/* r == 1 / sqrt(mean(x^2) + eps). */
static bool match_rsqrt_ms(const canon *c, int32_t r, int32_t x, double *eps) {
  const ir_node *n = prod(c, skip_cast(c, r));
  double k;
  if (is_op(n, IR_OP_ND_RECIPROCAL)) return match_sqrt_ms(c, n->in[0], x, eps);
  if (is_op(n, IR_OP_ND_DIV) && scalar(c, n->in[0], &k) && k == 1)
    return match_sqrt_ms(c, n->in[1], x, eps);
  if (is_op(n, IR_OP_ND_POW) && scalar(c, n->in[1], &k) && k == -0.5)
    return match_ms_eps(c, n->in[0], x, eps);
  return false;
}

/* v == x / sqrt(mean(x^2) + eps) for some x: *x set. */
static bool match_normalized(const canon *c, int32_t v, int32_t *x, double *eps) {
  const ir_node *n = prod(c, skip_cast(c, v));
  if (is_op(n, IR_OP_ND_DIV) && match_sqrt_ms(c, n->in[1], skip_cast(c, n->in[0]), eps)) {
    *x = skip_cast(c, n->in[0]);
    return true;
  }
  if (!is_op(n, IR_OP_ND_MUL)) return false;
  for (int k = 0; k < 2; k++)
    if (match_rsqrt_ms(c, n->in[1 - k], skip_cast(c, n->in[k]), eps)) {
      *x = skip_cast(c, n->in[k]);
      return true;
    }
  return false;
}

/* y == w * normalized(x) (or RMSNormalization(x, w)): *x, *w, *eps set. */
static bool match_rms(const canon *c, int32_t y, int32_t *x, int32_t *w, double *eps) {
  const ir_node *n = prod(c, skip_cast(c, y));
  if (is_op(n, IR_OP_ND_RMS_NORM) && is_w(c, n->in[1])) {
    *x = skip_cast(c, n->in[0]);
    *w = n->in[1];
    *eps = ir_node_attr_f(n, "eps", 1e-5);
    return true;
  }
  if (!is_op(n, IR_OP_ND_MUL)) return false;
  for (int k = 0; k < 2; k++)
    if (is_w(c, n->in[k]) && match_normalized(c, n->in[1 - k], x, eps)) {
      *w = n->in[k];
      return true;
    }
  return false;
}

/* The RMSNorm of x: its output (after the weight), or -1. */
static int32_t find_norm(canon *c, int32_t x, int32_t *w, double *eps) {
  int32_t from = tt(c, x)->producer;
  for (int32_t i = from < 0 ? 0 : from + 1; i < c->g->n_nodes; i++) {
    const ir_node *n = &c->g->nodes[i];
    int32_t xx;
    if ((n->op == IR_OP_ND_MUL || n->op == IR_OP_ND_RMS_NORM) &&
        match_rms(c, n->out[0], &xx, w, eps) && xx == skip_cast(c, x) &&
        numel(c, *w) == dim(c, x, -1))
      return n->out[0];
  }
  return -1;
}

static void check_eps(canon *c, double eps) {
  if (!c->have_eps) c->eps = eps, c->have_eps = true;
  else if (fabs(eps - c->eps) > 1e-12)
    cfail(c, "norms with different epsilons (%g and %g)", c->eps, eps);
}

/* --- weights --------------------------------------------------------------------------- */

static bool keep(canon *c, void *buf) {
  pass_llm *r = c->r;
  if (r->n_owned == r->cap_owned) {
    int cap = r->cap_owned ? 2 * r->cap_owned : 32;
    void **o = ir_realloc(r->owned, (size_t)cap * sizeof *o);
    if (!o) return false;
    r->owned = o;
    r->cap_owned = cap;
  }
  r->owned[r->n_owned++] = buf;
  return true;
}

static pass_llm_weight *new_weight(canon *c, const char *name) {
  pass_llm *r = c->r;
  if (r->n_w == r->cap_w) {
    int cap = r->cap_w ? 2 * r->cap_w : 32;
    pass_llm_weight *w = ir_realloc(r->w, (size_t)cap * sizeof *w);
    if (!w) {
      coom(c);
      return NULL;
    }
    r->w = w;
    r->cap_w = cap;
  }
  pass_llm_weight *w = &r->w[r->n_w++];
  memset(w, 0, sizeof *w);
  snprintf(w->name, sizeof w->name, "%s", name);
  return w;
}

static void layer_name(char *buf, size_t len, int l, const char *part) {
  snprintf(buf, len, "model.layers.%d.%s", l, part);
}

/* A vector weight (norm weight, bias) of n values, from element off of t. */
static void add_vector(canon *c, const char *name, int32_t t, int64_t off, int64_t n) {
  if (c->st != IR_OK) return;
  const ir_tensor *x = tt(c, t);
  if (!is_float(x->dtype) || off + n > numel(c, t)) {
    cfail(c, "'%s' (%s) is not a float vector of %lld values", x->name, name, (long long)n);
    return;
  }
  pass_llm_weight *w = new_weight(c, name);
  if (!w) return;
  size_t es = ir_dtype_bytes(x->dtype, 1);
  w->t = (model_tensor){.dtype = x->dtype,
                        .rank = 1,
                        .shape = {n},
                        .data = (const uint8_t *)x->data + (size_t)off * es,
                        .nbytes = (uint64_t)n * es};
}

/* A half graph's matmul weights reach the IR widened to f32 (the importer computes half
 * matmuls in f32): stored back in the graph's half type when that is exact, as exported. */
static void narrow(canon *c, pass_llm_weight *w) {
  if (c->half_dt == IR_DTYPE_INVALID || w->t.dtype != IR_F32) return;
  const float *v = w->t.data;
  uint64_t n = w->t.nbytes / sizeof(float);
  bool f16 = c->half_dt == IR_F16;
  for (uint64_t i = 0; i < n; i++)
    if ((f16 ? ir_f16_to_f32(ir_f32_to_f16(v[i])) : ir_bf16_to_f32(ir_f32_to_bf16(v[i]))) != v[i])
      return;
  uint16_t *h = ir_malloc(n * sizeof *h + 1);
  if (!h || !keep(c, h)) {
    ir_free(h);
    coom(c);
    return;
  }
  for (uint64_t i = 0; i < n; i++) h[i] = f16 ? ir_f32_to_f16(v[i]) : ir_f32_to_bf16(v[i]);
  w->t.dtype = c->half_dt;
  w->t.data = h;
  w->t.nbytes = n * sizeof *h;
}

/* Columns [col, col + n) of projection pj as an [n, K] weight (and its bias). */
static void add_proj(canon *c, const char *name, const proj *pj, int64_t col, int64_t n,
                     bool bias) {
  if (c->st != IR_OK) return;
  const ir_tensor *x = tt(c, pj->w);
  if (!is_float(x->dtype)) {
    cfail(c, "projection weight '%s' is %s", x->name, ir_dtype_name(x->dtype));
    return;
  }
  size_t es = ir_dtype_bytes(x->dtype, 1);
  int64_t K = pj->k, N = pj->n;
  pass_llm_weight *w = new_weight(c, name);
  if (!w) return;
  w->t = (model_tensor){
      .dtype = x->dtype, .rank = 2, .shape = {n, K}, .nbytes = (uint64_t)(n * K) * es};
  if (pj->wt) { /* already [N, K]: rows col.. */
    w->t.data = (const uint8_t *)x->data + (size_t)(col * K) * es;
  } else {
    uint8_t *dst = ir_malloc((size_t)(n * K) * es + 1);
    if (!dst || !keep(c, dst)) {
      ir_free(dst);
      coom(c);
      return;
    }
    const uint8_t *src = x->data;
    for (int64_t i = 0; i < K; i++)
      for (int64_t j = 0; j < n; j++)
        memcpy(dst + (size_t)(j * K + i) * es, src + (size_t)(i * N + col + j) * es, es);
    w->t.data = dst;
  }
  narrow(c, w);
  if (bias && pj->b >= 0) {
    char bn[96];
    size_t l = strlen(name);
    snprintf(bn, sizeof bn, "%.*sbias", (int)(l > 6 ? l - 6 : 0), name); /* ".weight" -> ".bias" */
    add_vector(c, bn, pj->b, col, n);
  }
}

static const pass_llm_weight *find_weight(const pass_llm *r, const char *name) {
  for (int i = 0; i < r->n_w; i++)
    if (!strcmp(r->w[i].name, name)) return &r->w[i];
  return NULL;
}

/* --- projections ----------------------------------------------------------------------- */

/* MatMul(x, W [K, N]) or Gemm(x, W) of constant W, plus a constant bias [N]. */
static int find_projs_of(canon *c, int32_t x, proj *out, int max);

/* ... of x, or of float casts of it (half graphs compute in f32 between casts). */
static int find_projs_cast(canon *c, int32_t x, proj *out, int max, int depth) {
  int n = find_projs_of(c, x, out, max);
  for (int i = 0; depth < 4 && i < n_uses(c, x) && n < max; i++) {
    const ir_node *u = use(c, x, i);
    if (u->op == IR_OP_ND_CAST && is_float(tt(c, u->out[0])->dtype))
      n += find_projs_cast(c, u->out[0], out + n, max - n, depth + 1);
  }
  return n;
}

static int find_projs(canon *c, int32_t x, proj *out, int max) {
  return find_projs_cast(c, x, out, max, 0);
}

static int find_projs_of(canon *c, int32_t x, proj *out, int max) {
  int n = 0;
  for (int i = 0; i < n_uses(c, x) && n < max; i++) {
    const ir_node *u = use(c, x, i);
    proj p = {.b = -1, .node = (int32_t)(u - c->g->nodes)};
    if (u->op == IR_OP_ND_MATMUL && u->in[0] == x && is_w(c, u->in[1]) &&
        tt(c, u->in[1])->rank == 2) {
      p.w = u->in[1];
    } else if (u->op == IR_OP_ND_GEMM && u->in[0] == x && is_w(c, u->in[1]) &&
               !ir_node_attr_i(u, "trans_a", 0) && ir_node_attr_f(u, "alpha", 1) == 1) {
      p.w = u->in[1];
      p.wt = ir_node_attr_i(u, "trans_b", 0) != 0;
      if (u->n_in > 2 && u->in[2] >= 0) {
        if (!is_w(c, u->in[2]) || ir_node_attr_f(u, "beta", 1) != 1) continue;
        p.b = u->in[2];
      }
    } else {
      continue;
    }
    p.k = dim(c, p.w, p.wt ? 1 : 0);
    p.n = dim(c, p.w, p.wt ? 0 : 1);
    p.out = u->out[0];
    if (p.b < 0 && n_uses(c, p.out) == 1) {
      const ir_node *a = use(c, p.out, 0);
      int32_t bb = a->op == IR_OP_ND_ADD ? other(a, p.out) : -1;
      if (bb >= 0 && is_w(c, bb) && numel(c, bb) == p.n && dim(c, bb, -1) == p.n) {
        p.b = bb;
        p.out = a->out[0];
      }
    }
    out[n++] = p;
  }
  return n;
}

/* --- attention operands ---------------------------------------------------------------- */

static bool is_movement(ir_op op) {
  return op == IR_OP_ND_RESHAPE || op == IR_OP_ND_TRANSPOSE || op == IR_OP_ND_EXPAND ||
         op == IR_OP_ND_TILE || op == IR_OP_ND_SLICE || op == IR_OP_ND_SPLIT ||
         op == IR_OP_ND_GATHER || op == IR_OP_ND_CAST;
}

/* Whether a Neg is within a few movement steps above t. */
static bool negated(const canon *c, int32_t t, int depth) {
  for (const ir_node *n = prod(c, t); n && depth-- > 0; n = prod(c, n->in[0])) {
    if (n->op == IR_OP_ND_NEG) return true;
    if (n->op == IR_OP_ND_CONCAT)
      for (int k = 0; k < n->n_in; k++)
        if (negated(c, n->in[k], depth)) return true;
    if (!is_movement(n->op) && n->op != IR_OP_ND_CONCAT) return false;
  }
  return false;
}

/* The graph input (not the ids) behind t through data movement, or -1. */
static int32_t past_input(const canon *c, int32_t t) {
  for (int steps = 0; steps < 16; steps++) {
    if (tt(c, t)->kind == IR_TENSOR_INPUT) return t != c->io->input_ids ? t : -1;
    const ir_node *n = prod(c, t);
    if (!n || !is_movement(n->op) || is_w(c, n->in[0])) return -1;
    t = n->in[0];
  }
  return -1;
}

/* Follows an attention operand back to one of the projections pj, through data movement,
 * constant scales, the rope, a per-head norm and a past-KV Concat (recorded in *tr; the
 * non-movement steps pass their value through in evaluation). */
static bool trace_back(canon *c, int32_t t, const proj *pj, int npj, const char *what, trace *tr) {
  *tr = (trace){.src = -1, .scale = 1, .rope = -1, .qn_w = -1, .past_in = -1, .past_cat = -1};
  for (int steps = 0; steps < 256; steps++) {
    for (int i = 0; i < npj; i++)
      if (pj[i].out == t) {
        tr->src = i;
        return true;
      }
    const ir_node *n = prod(c, t);
    double k;
    int32_t x, w;
    if (!n) break;
    if (is_movement(n->op) && !is_w(c, n->in[0])) {
      if (n->op == IR_OP_ND_CAST && !is_float(tt(c, n->in[0])->dtype)) break;
      t = n->in[0];
    } else if (n->op == IR_OP_ND_CONCAT && n->n_in == 2 && tr->past_in < 0 &&
               past_input(c, n->in[0]) >= 0) {
      tr->past_in = past_input(c, n->in[0]); /* (a sliding cache may crop it first) */
      tr->past_cat = n->out[0];
      t = n->in[1];
    } else if (n->op == IR_OP_ND_CONCAT && n->n_in == 2 && tr->rope < 0 && !is_w(c, n->in[0]) &&
               !is_w(c, n->in[1]) && is_op(prod(c, n->in[0]), IR_OP_ND_ADD)) {
      t = n->in[0]; /* partial rotary: Concat(rope(x[.., :r]), x[.., r:]), evaluated as is */
    } else if ((n->op == IR_OP_ND_MUL || n->op == IR_OP_ND_DIV) && scalar(c, n->in[1], &k) &&
               k != 0) {
      tr->scale *= n->op == IR_OP_ND_MUL ? k : 1 / k;
      c->through[t] = n->in[0];
      t = n->in[0];
    } else if (n->op == IR_OP_ND_MUL && scalar(c, n->in[0], &k)) {
      tr->scale *= k;
      c->through[t] = n->in[1];
      t = n->in[1];
    } else if ((n->op == IR_OP_ND_MUL || n->op == IR_OP_ND_RMS_NORM) && tr->qn_w < 0 &&
               tr->rope >= 0 && match_rms(c, t, &x, &w, &tr->qn_eps)) {
      tr->qn_w = w;
      c->through[t] = x;
      t = x;
    } else if (n->op == IR_OP_ND_ROTARY_EMBEDDING && tr->rope < 0 && is_w(c, n->in[1]) &&
               is_w(c, n->in[2]) && (n->n_in < 4 || n->in[3] < 0 || is_w(c, n->in[3]))) {
      tr->rope = tt(c, t)->producer; /* the op: its caches and positions are constants */
      tr->rope_x = n->in[0];
      tr->rope_rot = -1;
      tr->rope_cos = n->in[1];
      tr->rope_sin = n->in[2];
      c->through[t] = n->in[0];
      t = n->in[0];
    } else if (n->op == IR_OP_ND_ADD && tr->rope < 0) {
      const ir_node *m0 = prod(c, skip_cast(c, n->in[0])), *m1 = prod(c, skip_cast(c, n->in[1]));
      if (!is_op(m0, IR_OP_ND_MUL) || !is_op(m1, IR_OP_ND_MUL)) break;
      const ir_node *mx = negated(c, m0->in[0], 8) || negated(c, m0->in[1], 8) ? m1 : m0;
      const ir_node *mr = mx == m0 ? m1 : m0;
      int kx = is_w(c, mx->in[0]) ? 1 : 0, kr = is_w(c, mr->in[0]) ? 1 : 0;
      if (!is_w(c, mx->in[1 - kx]) || !is_w(c, mr->in[1 - kr])) break;
      tr->rope = tt(c, t)->producer;
      tr->rope_x = mx->in[kx];
      tr->rope_cos = mx->in[1 - kx];
      tr->rope_rot = mr->in[kr];
      tr->rope_sin = mr->in[1 - kr];
      if (numel(c, t) != numel(c, tr->rope_x)) break;
      c->through[t] = tr->rope_x;
      t = tr->rope_x;
    } else {
      break;
    }
  }
  const ir_node *n = prod(c, t);
  cfail(c,
        "the attention's %s does not come from a projection of the normalized hidden state "
        "(stopped at node '%s' (%s))",
        what, nname(n), n ? ir_op_name(n->op) : "an input or a constant");
  return false;
}

/* --- rope ------------------------------------------------------------------------------ */

/* The rotation of the rope at tr: rotate-half or adjacent pairs, judged on numbered
 * values; its cos/sin tables read at every (position, dim) into the frequencies. */
/* One (position, dim) of a rope's cos/sin tables against frequency i of this layer.
 * read (position 1): the query's table sets c->cur[i], the key's must match it. Otherwise
 * the values must be cos/sin(pos * f) to the tables' precision; at the last position of a
 * half-precision table the query's first refines f (the angle there pins it pos times
 * finer than at position 1). */
static bool rope_value(canon *c, int64_t i, double cs, double sn, int64_t pos, bool read,
                       bool first, bool last, const char *what, int64_t dd) {
  if (read) {
    double f = atan2(sn, cs);
    double ftol = c->table_tol > 1e-5 ? 5 * c->table_tol : 1e-5 * (1 + fabs(f));
    if (first) c->cur[i] = f;
    else if (fabs(f - c->cur[i]) > ftol) {
      cfail(c, "the %s rope's frequencies differ from the query's", what);
      return false;
    }
    return true;
  }
  double f = c->cur[i], amp = hypot(cs, sn);
  double tol = c->table_tol > 1e-5 ? c->table_tol * (double)(1 + pos) : c->table_tol;
  if (first && c->table_tol > 1e-5 && last && pos > 1) {
    double a = atan2(sn, cs), k = round(((double)pos * f - a) / (2 * M_PI));
    c->cur[i] = f = (a + 2 * M_PI * k) / (double)pos;
  }
  if (fabs(amp - 1) > 5 * c->table_tol || fabs(cs - cos((double)pos * f)) > tol ||
      fabs(sn - sin((double)pos * f)) > tol) {
    cfail(c,
          "the %s rope's tables are not cos/sin(position * frequency) at position %lld, dim "
          "%lld (cos %g, sin %g)",
          what, (long long)pos, (long long)dd, cs, sn);
    return false;
  }
  return true;
}

/* The first rope sets how many dims rotate (and c->cur's size); later ones must agree. */
static bool rope_dims(canon *c, int64_t half, const char *what) {
  if (!c->cur) {
    c->rope_half = half;
    if (!(c->cur = ir_calloc((size_t)half + 1, sizeof *c->cur))) {
      coom(c);
      return false;
    }
  } else if (half != c->rope_half) {
    cfail(c, "the %s rope rotates %lld dims, the first %lld", what, (long long)(2 * half),
          (long long)(2 * c->rope_half));
    return false;
  }
  return true;
}

/* ONNX RotaryEmbedding: caches [B, S, r/2] (or [max_pos, r/2] with position ids). */
static void check_rope_op(canon *c, const trace *tr, const char *what, bool first) {
  const ir_node *n = &c->g->nodes[tr->rope];
  int64_t S = c->io->seq, P = c->io->past, hd = dim(c, tr->rope_x, -1);
  int xr = tt(c, tr->rope_x)->rank;
  if (xr == 3) hd = dim(c, tr->rope_x, -1) / ir_node_attr_i(n, "num_heads", 1);
  int64_t rot = ir_node_attr_i(n, "rot_dim", 0), half;
  if (rot <= 0) rot = hd;
  half = rot / 2;
  bool interleaved = ir_node_attr_i(n, "interleaved", 0) != 0;
  if ((c->have_rope || !first) && interleaved != c->r->p.rope_interleaved) {
    cfail(c, "the %s rope rotates differently from the first", what);
    return;
  }
  c->r->p.rope_interleaved = interleaved;
  if (!rope_dims(c, half, what)) return;
  int32_t pos = n->n_in > 3 ? n->in[3] : -1;
  for (int pass = 0; pass < 2; pass++) /* 0: read the frequencies at position 1, 1: check all */
    for (int64_t s = 0; s < S; s++) {
      if (pass == 0 && P + s != 1) continue;
      int64_t row = pos >= 0 ? (int64_t)wval(c, pos, s) : s;
      if (pos >= 0 && row != P + s) {
        cfail(c, "the %s rope's position ids are not the token positions", what);
        return;
      }
      if (row < 0 || (row + 1) * half > numel(c, tr->rope_cos)) {
        cfail(c, "the %s rope's caches are shorter than the positions", what);
        return;
      }
      for (int64_t i = 0; i < half; i++)
        if (!rope_value(c, i, wval(c, tr->rope_cos, row * half + i),
                        wval(c, tr->rope_sin, row * half + i), P + s, pass == 0, first, s == S - 1,
                        what, i))
          return;
    }
  c->have_rope = true;
}

/* The tolerance the rope tables' dtype allows. */
static void note_table(canon *c, int32_t t) {
  ir_dtype dt = tt(c, t)->dtype;
  if (dt == IR_F32) { /* a half table widened (folded casts): its values say so */
    const float *v = tt(c, t)->data;
    int64_t n = numel(c, t);
    bool f16 = n > 0, bf16 = n > 0;
    for (int64_t i = 0; i < n && (f16 || bf16); i++) {
      f16 &= ir_f16_to_f32(ir_f32_to_f16(v[i])) == v[i];
      bf16 &= ir_bf16_to_f32(ir_f32_to_bf16(v[i])) == v[i];
    }
    dt = bf16 ? IR_BF16 : f16 ? IR_F16 : IR_F32;
  }
  double tol = dt == IR_F32 ? 2e-5 : dt == IR_F16 ? 2e-3 : 1.6e-2;
  if (tol > c->table_tol) c->table_tol = tol;
}

static void check_rope(canon *c, const trace *tr, const char *what, bool first) {
  if (c->st != IR_OK) return;
  note_table(c, tr->rope_cos);
  note_table(c, tr->rope_sin);
  if (tr->rope_rot < 0) {
    check_rope_op(c, tr, what, first);
    return;
  }
  int32_t x = tr->rope_x;
  int rank = tt(c, x)->rank;
  int64_t hd = dim(c, x, -1), half = hd / 2, n = numel(c, x);
  ev e;
  if (!ev_init(&e, c, skip_cast(c, x))) return; /* the rotation may read x before a cast */
  const float *rot = ev_f32(&e, tr->rope_rot, "the rope's rotated operand");
  bool half_ok = rot && hd % 2 == 0, pairs_ok = half_ok;
  for (int64_t i = 0; rot && i < n; i++) {
    int64_t dd = i % hd, base = i - dd;
    float h = dd < half ? -(float)(base + dd + half + 1) : (float)(base + dd - half + 1);
    float p = dd % 2 == 0 ? -(float)(base + dd + 2) : (float)(base + dd);
    half_ok &= rot[i] == h;
    pairs_ok &= rot[i] == p;
  }
  if (rot && !half_ok && !pairs_ok)
    cfail(c, "the %s rope's rotation is neither rotate-half nor adjacent pairs", what);
  ev_free(&e);
  if (c->st != IR_OK) return;
  bool interleaved = !half_ok;
  if ((c->have_rope || !first) && interleaved != c->r->p.rope_interleaved) {
    cfail(c, "the %s rope rotates differently from the first", what);
    return;
  }
  c->r->p.rope_interleaved = interleaved;
  /* the sequence axis of x: where the numbered source (the projection, [1, S, N]) changes row */
  int seq_axis = -1;
  {
    ev e2;
    int32_t src = x; /* back to the first value that is not moved or passed through */
    while (prod(c, src) && (is_movement(prod(c, src)->op) || c->through[src] >= 0))
      src = c->through[src] >= 0 ? c->through[src] : prod(c, src)->in[0];
    if (!ev_init(&e2, c, src)) return;
    const float *v = ev_f32(&e2, x, "the rope's input");
    int64_t row = dim(c, src, -1), strides[IR_MAX_RANK], s = 1;
    for (int k = rank - 1; k >= 0; k--) strides[k] = s, s *= dim(c, x, k);
    for (int k = 0; v && k < rank - 1 && seq_axis < 0; k++)
      if (dim(c, x, k) > 1 && (int64_t)(v[strides[k]] - 1) / row != (int64_t)(v[0] - 1) / row)
        seq_axis = k;
    ev_free(&e2);
    if (c->st != IR_OK) return;
    if (seq_axis < 0) {
      cfail(c, "the %s rope's input has no sequence axis", what);
      return;
    }
  }
  /* table value at (s, d): broadcast of a [x's rank] index into the table */
  int64_t S = c->io->seq, P = c->io->past;
  if (!rope_dims(c, half, what)) return;
  int32_t tab[2] = {tr->rope_cos, tr->rope_sin};
  for (int w = 0; w < 2; w++) {
    const ir_tensor *T = tt(c, tab[w]);
    if (!is_float(T->dtype) || T->rank > rank || dim(c, tab[w], -1) != hd) {
      cfail(c, "the %s rope's table '%s' is not a float table over the head dim", what, T->name);
      return;
    }
  }
  for (int pass = 0; pass < 2; pass++) /* 0: read freqs at position 1, 1: check all */
    for (int64_t s = 0; s < S; s++) {
      int64_t pos = P + s;
      if (pass == 0 && pos != 1) continue;
      for (int64_t dd = 0; dd < hd; dd++) {
        double v[2];
        for (int w = 0; w < 2; w++) {
          const ir_tensor *T = tt(c, tab[w]);
          int64_t off = 0, st = 1;
          for (int k = T->rank - 1; k >= 0; k--) {
            int xk = rank - T->rank + k;
            int64_t idx = xk == rank - 1 ? dd : xk == seq_axis ? s : 0;
            if (T->dims[k].n == 1) idx = 0;
            off += idx * st;
            st *= T->dims[k].n;
          }
          v[w] = wval(c, tab[w], off);
        }
        int64_t i = interleaved ? dd / 2 : dd % half;
        if (!rope_value(c, i, v[0], v[1], pos, pass == 0, first, s == S - 1, what, dd)) return;
      }
    }
  c->r->p.rope_interleaved = interleaved;
  c->have_rope = true;
}

/* This layer's frequencies (c->cur) as one of the two sets: 1 or 2, 0 when a third. */
static int rope_set(canon *c) {
  for (int k = 0; k < 2; k++) {
    if (!c->freqs[k]) {
      c->freqs[k] = ir_malloc((size_t)c->rope_half * sizeof *c->freqs[k]);
      if (!c->freqs[k]) {
        coom(c);
        return 0;
      }
      memcpy(c->freqs[k], c->cur, (size_t)c->rope_half * sizeof *c->cur);
      return k + 1;
    }
    bool eq = true;
    for (int64_t i = 0; i < c->rope_half && eq; i++)
      eq = fabs(c->freqs[k][i] - c->cur[i]) <= 1e-5 * (1 + fabs(c->cur[i]));
    if (eq) return k + 1;
  }
  return 0;
}

/* theta from a frequency set when it is theta^(-2i/d); 0 when not. */
static double fit_theta(const double *f, int64_t half, double tol, double abs_tol) {
  if (half < 2 || !(f[half - 1] > 0) || fabs(f[0] - 1) > (abs_tol > 0 ? abs_tol : tol)) return 0;
  /* least squares of log f_i = -(i / half) log theta */
  bool half_prec = abs_tol > 0; /* from f16/bf16 tables: frequencies known to abs_tol */
  double num = 0, den = 0;
  for (int64_t i = 1; i < half; i++) {
    if (!(f[i] > 0)) return 0;
    if (half_prec && f[i] < 20 * abs_tol) continue;
    double x = (double)i / (double)half;
    num += -x * log(f[i]);
    den += x * x;
  }
  if (den == 0) return 0;
  double theta = exp(num / den), rt = round(theta);
  if (fabs(rt - theta) < 1e-4 * theta) theta = rt;
  if (half_prec) { /* the round base they were made from */
    double mag = pow(10.0, floor(log10(theta)) - 1), snap = round(theta / mag) * mag;
    if (fabs(snap - theta) < 1e-2 * theta) theta = snap;
  }
  for (int64_t i = 0; i < half; i++) {
    double want = pow(theta, -(double)(2 * i) / (double)(2 * half));
    if (half_prec ? fabs(f[i] - want) > abs_tol : fabs(f[i] - want) > tol * want + 1e-9) return 0;
  }
  return theta;
}

/* theta from the frequencies, or the frequencies carried as they are. */
static void rope_params(canon *c) {
  model_llama_params *p = &c->r->p;
  int64_t half = c->rope_half, last = c->io->past + c->io->seq - 1;
  /* half tables: each frequency known to about the table's precision over the last position */
  double abs_tol = c->table_tol > 1e-5 ? 3 * c->table_tol / (double)(last > 1 ? last : 1) : 0;
  if (!c->have_rope || half < 1) return;
  p->rot_dim = 2 * half == p->head_dim ? 0 : 2 * half;
  if (c->freqs[1]) { /* a second rope: the sliding layers' (a local theta, no scaling) */
    int local_set = 0;
    for (int64_t l = 0; l < p->n_layers && !local_set; l++)
      if (c->layer_rope[l] && model_llama_layer_slides(p, l)) local_set = c->layer_rope[l];
    for (int64_t l = 0; l < p->n_layers; l++)
      if (c->layer_rope[l] && (c->layer_rope[l] == local_set) != model_llama_layer_slides(p, l)) {
        cfail(c, "layer %lld's rope is not the one of its kind (sliding or full attention)",
              (long long)l);
        return;
      }
    if (local_set == 1) { /* the global set first */
      double *t = c->freqs[0];
      c->freqs[0] = c->freqs[1];
      c->freqs[1] = t;
    }
    double local = fit_theta(c->freqs[1], half, c->table_tol / 10, abs_tol);
    if (!local) {
      cfail(c, "the sliding layers' rope is not theta^(-2i/d)");
      return;
    }
    p->rope_local_theta = local;
  }
  double theta = fit_theta(c->freqs[0], half, c->table_tol / 10, abs_tol);
  p->rope_theta = theta;
  if (theta > 0) return;
  c->r->rope_tabled = true;
  p->rope_theta = 10000;
  c->r->rope_freqs = ir_malloc((size_t)half * sizeof *c->r->rope_freqs);
  if (!c->r->rope_freqs) {
    coom(c);
    return;
  }
  for (int64_t i = 0; i < half; i++) {
    double base = pow(10000.0, -(double)(2 * i) / (double)(2 * half));
    if (!(c->freqs[0][i] > 0)) {
      cfail(c, "rope frequency %lld is %g", (long long)i, c->freqs[0][i]);
      return;
    }
    c->r->rope_freqs[i] = (float)(base / c->freqs[0][i]);
  }
  p->rope_freq_factors = c->r->rope_freqs;
}

/* NoPE layers ((l + 1) % n == 0 have no rope) and the sliding-window pattern (layer l
 * slides from swa_first on unless (l + 1) % swa_period == 0) from what each layer did. */
static void layer_patterns(canon *c) {
  model_llama_params *p = &c->r->p;
  int64_t L = p->n_layers, nope = 0;
  for (int64_t l = 0; l < L && !nope; l++)
    if (!c->layer_rope[l]) nope = l + 1;
  if (nope == 1) {
    cfail(c, "the first layer has no rope");
    return;
  }
  for (int64_t l = 0; l < L && nope; l++)
    if ((c->layer_rope[l] == 0) != ((l + 1) % nope == 0)) {
      cfail(c, "layers without rope are not every %lld-th", (long long)nope);
      return;
    }
  p->no_rope_every = nope;
  int64_t w = 0;
  for (int64_t l = 0; l < L; l++)
    if (c->layer_window[l]) {
      if (w && c->layer_window[l] != w) {
        cfail(c, "the sliding layers have different windows (%lld, %lld)", (long long)w,
              (long long)c->layer_window[l]);
        return;
      }
      w = c->layer_window[l];
    }
  if (!w) return;
  p->sliding_window = w;
  for (int64_t first = 0; first < L; first++)
    for (int64_t period = 0; period <= L; period = period ? period + 1 : 2) {
      p->swa_first = first;
      p->swa_period = period;
      bool ok = true;
      for (int64_t l = 0; l < L && ok; l++)
        ok = model_llama_layer_slides(p, l) == (c->layer_window[l] != 0);
      if (ok) return;
    }
  cfail(c, "the sliding-window layers follow no pattern the template knows");
}

/* --- attention ------------------------------------------------------------------------- */

/* The mask: allowed exactly where t <= P + s. mask: a constant added to the scores (0 where
 * allowed, a large negative elsewhere) or, with where_cond >= 0, a Where's condition. */
static void check_mask(canon *c, int32_t mask, bool where_true_keeps, int32_t where_else,
                       int32_t scores, int64_t *window) {
  int64_t S = c->io->seq, P = c->io->past, T = P + S;
  const ir_tensor *m = tt(c, mask);
  int r = scores >= 0 ? tt(c, scores)->rank : 4;
  if (scores >= 0 && (dim(c, scores, -1) != T || dim(c, scores, -2) != S || m->rank > r)) {
    cfail(c, "the attention scores are not [.., %lld, %lld]", (long long)S, (long long)T);
    return;
  }
  double other_v = 0;
  if (where_else == -2) where_else = -3; /* a boolean mask: true takes part */
  else if (where_else >= 0 && (!scalar(c, where_else, &other_v) || other_v > -1e3)) {
    cfail(c, "the masked scores are not set to a large negative value");
    return;
  }
  int mr = m->rank;
  int64_t dS = mr >= 2 ? m->dims[mr - 2].n : 1, dT = mr >= 1 ? m->dims[mr - 1].n : 1;
  int64_t lead = dS * dT > 0 ? numel(c, mask) / (dS * dT) : 0;
  if ((dS != 1 && dS != S) || (dT != 1 && dT != T)) {
    cfail(c, "the attention mask '%s' is not [.., %lld, %lld]", m->name, (long long)S,
          (long long)T);
    return;
  }
  int64_t w = 0; /* the window: the keys a query sees, where that is fewer than all before it */
  for (int64_t s = 0; s < S; s++) {
    int64_t cnt = 0;
    for (int64_t t = 0; t <= P + s && t < T; t++) {
      double v = wval(c, mask, (dS > 1 ? s : 0) * dT + (dT > 1 ? t : 0));
      cnt += where_else != -1 ? (v != 0) == where_true_keeps : v > -1;
    }
    if (cnt > 0 && cnt < P + s + 1 && cnt > w) w = cnt;
  }
  for (int64_t l = 0; l < lead; l++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t t = 0; t < T; t++) {
        int64_t off = (l * dS + (dS > 1 ? s : 0)) * dT + (dT > 1 ? t : 0);
        double v = wval(c, mask, off);
        bool allowed = where_else != -1 ? (v != 0) == where_true_keeps : v > -1;
        bool masked = where_else != -1 ? !allowed : v <= -1e3;
        if ((!allowed && !masked) || allowed != (t <= P + s && (!w || t > P + s - w))) {
          cfail(c, "the attention mask is not causal: at query %lld, key %lld it %s (value %g)",
                (long long)(P + s), (long long)t,
                allowed  ? "allows"
                : masked ? "masks"
                         : "adds",
                v);
          return;
        }
      }
  *window = w;
}

/* Checks the operand `v` ([.., H, S|T, hd] or, for K^T, [.., H, hd, T]) against the
 * projection source: head h reads columns off + (h / group) * hd.., token rows after the
 * past. Sets *heads, *kv_heads (source heads), *off. */
static void check_heads(canon *c, const proj *src, int32_t operand, bool transposed, bool is_q,
                        const char *what, int64_t *heads, int64_t *src_heads, int64_t *off,
                        int64_t hd_want) {
  if (c->st != IR_OK) return;
  int rank = tt(c, operand)->rank;
  int64_t S = c->io->seq, P = c->io->past, T = is_q ? S : P + S, pre = is_q ? 0 : P;
  if (rank < 3) {
    cfail(c, "the attention's %s has rank %d", what, rank);
    return;
  }
  int64_t H = dim(c, operand, -3), a = dim(c, operand, -2), b = dim(c, operand, -1);
  int64_t hd = transposed ? a : b, nt = transposed ? b : a;
  for (int k = 0; k < rank - 3; k++)
    if (dim(c, operand, k) != 1) {
      cfail(c, "the attention's %s has batch dims (only batch 1 is recognised)", what);
      return;
    }
  if (nt != T || (hd_want > 0 && hd != hd_want)) {
    cfail(c, "the attention's %s is [.., %lld, %lld, %lld], not %lld tokens of head_dim %lld", what,
          (long long)H, (long long)a, (long long)b, (long long)T, (long long)hd_want);
    return;
  }
  ev e;
  if (!ev_init(&e, c, src->out)) return;
  const float *v = ev_f32(&e, operand, what);
  int64_t N = src->n;
  if (v) {
    *off = ((int64_t)v[transposed ? pre : pre * hd] - 1) % N;
    int64_t maxh = 0;
    for (int64_t h = 0; h < H && c->st == IR_OK; h++)
      for (int64_t t = 0; t < T && c->st == IR_OK; t++)
        for (int64_t d = 0; d < hd; d++) {
          int64_t i = transposed ? (h * hd + d) * T + t : (h * T + t) * hd + d;
          double got = v[i];
          if (t < pre) {
            if (got != 0)
              cfail(c, "the attention's %s does not put the past before the new tokens", what);
            continue;
          }
          int64_t col = ((int64_t)got - 1) % N - *off, row = ((int64_t)got - 1) / N;
          int64_t sh = col / hd;
          if (got < 1 || row != t - pre || col < 0 || col % hd != d) {
            cfail(c,
                  "the attention's %s is not the projection's columns split into heads "
                  "(head %lld, token %lld, dim %lld reads value %g)",
                  what, (long long)h, (long long)t, (long long)d, got);
            break;
          }
          if (sh > maxh) maxh = sh;
          if (is_q && sh != h) {
            cfail(c, "the attention's %s head %lld reads projection head %lld", what, (long long)h,
                  (long long)sh);
            break;
          }
        }
    if (c->st == IR_OK) {
      int64_t kvh = maxh + 1;
      *heads = H;
      *src_heads = kvh;
      if (H % kvh) {
        cfail(c, "the attention's %s has %lld heads over %lld", what, (long long)H, (long long)kvh);
      } else { /* head h reads h / (H / kvh): repeat_kv's order */
        for (int64_t h = 0; h < H; h++) {
          int64_t i = transposed ? (h * hd) * T + pre : (h * T + pre) * hd;
          int64_t sh = (((int64_t)v[i] - 1) % N - *off) / hd;
          if (sh != h / (H / kvh)) {
            cfail(c,
                  "the attention's %s head %lld reads kv head %lld, not %lld (heads are "
                  "expanded in an order the paged attention does not compute)",
                  what, (long long)h, (long long)sh, (long long)(h / (H / kvh)));
            break;
          }
        }
      }
    }
  }
  ev_free(&e);
}

/* The softmax's input back to Q.K^T: constant scales, a constant mask, softcap. */
static const ir_node *scores_back(canon *c, int32_t t, double *scale, double *softcap, bool *masked,
                                  int64_t *window) {
  for (int steps = 0; steps < 64; steps++) {
    const ir_node *n = prod(c, t);
    double k;
    if (!n) return NULL;
    if (n->op == IR_OP_ND_MATMUL) return n;
    if (n->op == IR_OP_ND_CAST && is_float(tt(c, n->in[0])->dtype)) {
      t = n->in[0];
    } else if (n->op == IR_OP_ND_ADD && (is_w(c, n->in[0]) || is_w(c, n->in[1]))) {
      int32_t m = is_w(c, n->in[1]) ? n->in[1] : n->in[0];
      t = other(n, m);
      check_mask(c, m, false, -1, t, window);
      *masked = true;
    } else if (n->op == IR_OP_ND_WHERE && is_w(c, n->in[0]) &&
               (is_w(c, n->in[1]) != is_w(c, n->in[2]))) {
      bool keeps = !is_w(c, n->in[1]);
      t = keeps ? n->in[1] : n->in[2];
      check_mask(c, n->in[0], keeps, keeps ? n->in[2] : n->in[1], t, window);
      *masked = true;
    } else if ((n->op == IR_OP_ND_MUL || n->op == IR_OP_ND_DIV) && scalar(c, n->in[1], &k) &&
               k != 0) {
      /* softcap: cap * tanh(x / cap) */
      const ir_node *th = prod(c, n->in[0]);
      const ir_node *dv = is_op(th, IR_OP_ND_TANH) ? prod(c, th->in[0]) : NULL;
      double k2;
      if (n->op == IR_OP_ND_MUL && dv && (dv->op == IR_OP_ND_DIV || dv->op == IR_OP_ND_MUL) &&
          scalar(c, dv->in[1], &k2) &&
          fabs((dv->op == IR_OP_ND_DIV ? k2 : 1 / k2) - k) < 1e-6 * k) {
        *softcap = k;
        t = dv->in[0];
        continue;
      }
      *scale *= n->op == IR_OP_ND_MUL ? k : 1 / k;
      t = n->in[0];
    } else if (n->op == IR_OP_ND_MUL && scalar(c, n->in[0], &k)) {
      *scale *= k;
      t = n->in[1];
    } else {
      cfail(c,
            "the attention scores pass through node '%s' (%s), which is not a constant "
            "scale, mask or softcap",
            nname(n), ir_op_name(n->op));
      return NULL;
    }
    if (c->st != IR_OK) return NULL;
  }
  return NULL;
}

/* The softmax output forward to the P.V MatMul, through float casts and the
 * Where(IsNaN(p), 0, p) the SDPA decomposition puts there (searching every branch). */
static const ir_node *pv_search(canon *c, int32_t t, int32_t sm, int depth) {
  if (depth > 8) return NULL;
  for (int i = 0; i < n_uses(c, t); i++) {
    const ir_node *u = use(c, t, i);
    if (u->op == IR_OP_ND_MATMUL && u->in[0] == t) return u;
  }
  for (int i = 0; i < n_uses(c, t); i++) {
    const ir_node *u = use(c, t, i), *r = NULL;
    double z;
    if (u->op == IR_OP_ND_CAST && is_float(tt(c, u->out[0])->dtype)) {
      r = pv_search(c, u->out[0], sm, depth + 1);
    } else if (u->op == IR_OP_ND_WHERE && u->in[2] == t && scalar(c, u->in[1], &z) && z == 0) {
      const ir_node *isn = prod(c, skip_cast(c, u->in[0]));
      if (is_op(isn, IR_OP_ND_ISNAN) && same(c, isn->in[0], sm)) {
        c->through[u->out[0]] = t;
        r = pv_search(c, u->out[0], sm, depth + 1);
      }
    }
    if (r) return r;
  }
  return NULL;
}

static const ir_node *pv_forward(canon *c, int32_t t) { return pv_search(c, t, t, 0); }

/* First node at or after `from` consuming (a movement of) t that is a MatMul/Gemm by a
 * constant: the projection reading the attention's output (or the MLP's). */
static const ir_node *forward_proj(canon *c, int32_t t, int32_t *reads, int depth) {
  if (depth > 16) return NULL;
  for (int i = 0; i < n_uses(c, t); i++) {
    const ir_node *u = use(c, t, i);
    if ((u->op == IR_OP_ND_MATMUL || u->op == IR_OP_ND_GEMM) && u->in[0] == t &&
        is_w(c, u->in[1])) {
      *reads = t;
      return u;
    }
    if (is_movement(u->op) && u->in[0] == t) {
      const ir_node *f = forward_proj(c, u->out[0], reads, depth + 1);
      if (f) return f;
    }
  }
  return NULL;
}

/* The residual add of x and y (y possibly through a bias Add): its output, or -1. */
static int32_t residual_d(canon *c, int32_t x, int32_t y, int depth) {
  for (int i = 0; i < n_uses(c, y); i++) {
    const ir_node *u = use(c, y, i);
    if (u->op == IR_OP_ND_ADD && same(c, other(u, y), x)) return u->out[0];
  }
  for (int i = 0; depth < 4 && i < n_uses(c, y); i++) { /* through float casts */
    const ir_node *u = use(c, y, i);
    int32_t r = u->op == IR_OP_ND_CAST && is_float(tt(c, u->out[0])->dtype)
                    ? residual_d(c, x, u->out[0], depth + 1)
                    : -1;
    if (r >= 0) return r;
  }
  return -1;
}

static int32_t residual(canon *c, int32_t x, int32_t y) { return residual_d(c, x, y, 0); }

/* One attention block from h = norm(x): returns the residual stream after it, or -1. */
static int32_t match_attention(canon *c, int32_t x, int32_t h) {
  proj pj[MAX_PROJ];
  int npj = find_projs(c, h, pj, MAX_PROJ);
  model_llama_params *p = &c->r->p;
  if (npj < 1) {
    cfail(c, "no projection (MatMul by a constant weight) reads the normalized hidden state");
    return -1;
  }
  /* the first Softmax (or Attention op) after the projections */
  int32_t first = pj[0].node;
  for (int i = 1; i < npj; i++)
    if (pj[i].node < first) first = pj[i].node;
  const ir_node *sm = NULL;
  for (int32_t i = first + 1; i < c->g->n_nodes && !sm; i++)
    if (c->g->nodes[i].op == IR_OP_ND_SOFTMAX || c->g->nodes[i].op == IR_OP_ND_ATTENTION)
      sm = &c->g->nodes[i];
  if (!sm) {
    cfail(c, "no attention: no Softmax after the projections of the normalized hidden state");
    return -1;
  }
  double scale = 1, softcap = 0;
  bool masked = false, op_form = sm->op == IR_OP_ND_ATTENTION;
  int64_t window = 0;
  int32_t q_op, k_op, v_op, att_out; /* Q, K (K^T unless op_form), V, the heads' output */
  if (op_form) { /* ONNX Attention (opset 23): Q, K, V [B, H, S, hd], mask, scale */
    if (tt(c, sm->in[0])->rank != 4 || (sm->n_in > 4 && sm->in[4] >= 0) ||
        ir_node_attr_i(sm, "qk_mode", 0) != 0 || ir_node_attr_i(sm, "n_out", 1) != 1) {
      cfail(c,
            "Attention '%s' is not 4-d, or takes past_key/past_value inputs, or returns "
            "more than its output",
            nname(sm));
      return -1;
    }
    q_op = sm->in[0], k_op = sm->in[1], v_op = sm->in[2], att_out = sm->out[0];
    scale = ir_node_attr_f(sm, "scale", 1 / sqrt((double)dim(c, q_op, -1)));
    softcap = ir_node_attr_f(sm, "softcap", 0);
    if (sm->n_in > 3 && sm->in[3] >= 0) {
      if (!is_w(c, sm->in[3])) {
        cfail(c, "Attention '%s''s mask is not a constant", nname(sm));
        return -1;
      }
      bool b = tt(c, sm->in[3])->dtype == IR_U8;
      check_mask(c, sm->in[3], true, b ? -2 : -1, -1, &window);
      masked = true;
    }
    if (ir_node_attr_i(sm, "is_causal", 0)) {
      if (masked) {
        cfail(c, "Attention '%s' has both a mask and is_causal", nname(sm));
        return -1;
      }
      masked = true;
    }
  } else {
    if (ir_node_attr_i(sm, "axis", -1) != -1 &&
        ir_node_attr_i(sm, "axis", -1) != tt(c, sm->in[0])->rank - 1) {
      cfail(c, "Softmax '%s' is not over the last axis", nname(sm));
      return -1;
    }
    const ir_node *qk = scores_back(c, sm->in[0], &scale, &softcap, &masked, &window);
    const ir_node *pv = c->st == IR_OK ? pv_forward(c, sm->out[0]) : NULL;
    if (c->st != IR_OK) return -1;
    if (!qk) {
      cfail(c, "Softmax '%s' does not read Q.K^T", nname(sm));
      return -1;
    }
    if (!pv) {
      cfail(c, "Softmax '%s''s output does not multiply V", nname(sm));
      return -1;
    }
    q_op = qk->in[0], k_op = qk->in[1], v_op = pv->in[1], att_out = pv->out[0];
  }
  if (!masked && c->io->seq > 1) {
    cfail(c, "the attention ('%s') has no causal mask", nname(sm));
    return -1;
  }
  trace tq, tk, tv;
  if (!trace_back(c, q_op, pj, npj, "query", &tq) || !trace_back(c, k_op, pj, npj, "key", &tk) ||
      !trace_back(c, v_op, pj, npj, "value", &tv))
    return -1;
  if (tq.past_in >= 0 || (tk.past_in < 0) != (tv.past_in < 0) ||
      (c->io->past > 0 && tk.past_in < 0)) {
    cfail(c, "the attention's past-KV Concats are not one on the key and one on the value");
    return -1;
  }
  if ((tq.rope < 0) != (tk.rope < 0) || tv.rope >= 0 || tv.qn_w >= 0 ||
      (tq.qn_w < 0) != (tk.qn_w < 0)) {
    cfail(c, "the rope (or per-head norm) is not on both the query and the key alone");
    return -1;
  }
  int64_t H, Hs, kvh_k, kvh_v, H2, H3, offq, offk, offv;
  check_heads(c, &pj[tq.src], q_op, false, true, "query", &H, &Hs, &offq, -1);
  int64_t hd = dim(c, q_op, -1);
  check_heads(c, &pj[tk.src], k_op, !op_form, false, "key", &H2, &kvh_k, &offk, hd);
  check_heads(c, &pj[tv.src], v_op, false, false, "value", &H3, &kvh_v, &offv, hd);
  if (c->st != IR_OK) return -1;
  if (op_form && H2 == kvh_k && H3 == kvh_v && H % kvh_k == 0) /* the op expands the heads */
    H2 = H3 = H;
  if (H2 != H || H3 != H || kvh_k != kvh_v) {
    cfail(c, "the query, key and value head counts disagree (%lld, %lld/%lld, %lld/%lld)",
          (long long)H, (long long)H2, (long long)kvh_k, (long long)H3, (long long)kvh_v);
    return -1;
  }
  if (tq.rope >= 0) {
    check_rope(c, &tq, "query", true);
    check_rope(c, &tk, "key", false);
    c->layer_rope[c->layer] = (int8_t)(c->st == IR_OK ? rope_set(c) : 1);
    if (c->st == IR_OK && !c->layer_rope[c->layer]) {
      cfail(c, "a third distinct rope");
      return -1;
    }
  }
  c->layer_window[c->layer] = window;
  if (tq.qn_w >= 0) {
    check_eps(c, tq.qn_eps);
    check_eps(c, tk.qn_eps);
  }
  if (c->st != IR_OK) return -1;
  double total = scale * tq.scale * tk.scale;
  if (c->layer == 0) {
    p->n_heads = H;
    p->n_kv_heads = kvh_k;
    p->head_dim = hd;
    p->attention_bias = pj[tq.src].b >= 0;
    p->qk_norm = tq.qn_w >= 0;
    p->attn_scale = fabs(total * sqrt((double)hd) - 1) < 1e-6 ? 0 : total;
    p->attn_softcap = softcap;
    if (tq.rope < 0) {
      cfail(c, "the first attention has no rope");
      return -1;
    }
  } else if (p->n_heads != H || p->n_kv_heads != kvh_k || p->head_dim != hd ||
             p->attention_bias != (pj[tq.src].b >= 0) || p->qk_norm != (tq.qn_w >= 0) ||
             fabs((p->attn_scale > 0 ? p->attn_scale : 1 / sqrt((double)hd)) - total) >
                 1e-6 * total ||
             p->attn_softcap != softcap) {
    cfail(c, "the attention differs from the first layer's (heads, bias, norm, scale or rope)");
    return -1;
  }
  if (tk.past_in >= 0) {
    c->past_seen[c->n_past_seen++] = tk.past_in;
    c->past_seen[c->n_past_seen++] = tv.past_in;
    c->r->n_past += 2;
  }
  char nm[96];
  int l = c->layer;
  layer_name(nm, sizeof nm, l, "self_attn.q_proj.weight");
  add_proj(c, nm, &pj[tq.src], offq, H * hd, true);
  layer_name(nm, sizeof nm, l, "self_attn.k_proj.weight");
  add_proj(c, nm, &pj[tk.src], offk, kvh_k * hd, true);
  layer_name(nm, sizeof nm, l, "self_attn.v_proj.weight");
  add_proj(c, nm, &pj[tv.src], offv, kvh_k * hd, true);
  if ((pj[tk.src].b >= 0) != p->attention_bias || (pj[tv.src].b >= 0) != p->attention_bias) {
    cfail(c, "q, k and v do not all carry a bias, or all none");
    return -1;
  }
  if (tq.qn_w >= 0) {
    layer_name(nm, sizeof nm, l, "self_attn.q_norm.weight");
    add_vector(c, nm, tq.qn_w, 0, hd);
    layer_name(nm, sizeof nm, l, "self_attn.k_norm.weight");
    add_vector(c, nm, tk.qn_w, 0, hd);
  }
  /* o_proj reads P.V's heads back as [S, H * hd] */
  int32_t reads = -1;
  const ir_node *o = forward_proj(c, att_out, &reads, 0);
  if (!o) {
    cfail(c, "no projection reads the attention's output ('%s')", nname(sm));
    return -1;
  }
  proj po[MAX_PROJ];
  int npo = find_projs(c, reads, po, MAX_PROJ), oi = -1;
  for (int i = 0; i < npo; i++)
    if (&c->g->nodes[po[i].node] == o) oi = i;
  if (oi < 0 || po[oi].k != H * hd || po[oi].b >= 0) {
    cfail(c, "the output projection ('%s') is not [%lld, hidden] without bias", nname(o),
          (long long)(H * hd));
    return -1;
  }
  {
    ev e;
    if (!ev_init(&e, c, att_out)) return -1;
    const float *v = ev_f32(&e, reads, "the output projection's input");
    int64_t S = c->io->seq;
    for (int64_t s = 0; v && s < S && c->st == IR_OK; s++)
      for (int64_t hh = 0; hh < H * hd; hh++) {
        int64_t want = ((hh / hd) * S + s) * hd + hh % hd + 1;
        if (v[s * H * hd + hh] != (float)want) {
          cfail(c,
                "the output projection ('%s') does not read the attention's heads "
                "side by side",
                nname(o));
          break;
        }
      }
    ev_free(&e);
  }
  layer_name(nm, sizeof nm, l, "self_attn.o_proj.weight");
  add_proj(c, nm, &po[oi], 0, po[oi].n, false);
  int32_t x1 = c->st == IR_OK ? residual(c, x, po[oi].out) : -1, w;
  double eps;
  bool sandwich = false;
  if (c->st == IR_OK && x1 < 0) { /* Gemma: normalized before the residual add */
    int32_t y = find_norm(c, po[oi].out, &w, &eps);
    if (y >= 0 && (x1 = residual(c, x, y)) >= 0) {
      sandwich = true;
      check_eps(c, eps);
      layer_name(nm, sizeof nm, l, "post_attention_layernorm.weight");
      add_vector(c, nm, w, 0, p->hidden_size);
    }
  }
  if (c->st == IR_OK && l == 0) p->sandwich_norms = sandwich;
  else if (c->st == IR_OK && x1 >= 0 && sandwich != p->sandwich_norms)
    cfail(c, "the attention's output norm differs from the first layer's");
  if (c->st == IR_OK && x1 < 0)
    cfail(c, "the attention's output ('%s') is not added to the residual stream", nname(o));
  return x1;
}

/* The gate's activation: silu (x * sigmoid(x)) or tanh-GELU; the gate's value into *g. */
static int act_of(canon *c, int32_t a, int32_t *g) {
  const ir_node *n = prod(c, skip_cast(c, a));
  if (is_op(n, IR_OP_ND_MUL))
    for (int k = 0; k < 2; k++) {
      const ir_node *sg = prod(c, skip_cast(c, n->in[1 - k]));
      if (is_op(sg, IR_OP_ND_SIGMOID) && same(c, sg->in[0], n->in[k])) {
        *g = skip_cast(c, n->in[k]);
        return IR_ACT_SWIGLU;
      }
    }
  if (is_op(n, IR_OP_ND_GELU) && ir_node_attr_i(n, "approximate", 0)) {
    *g = skip_cast(c, n->in[0]);
    return IR_ACT_GEGLU;
  }
  return -1;
}

/* t back through data movement to one of the projections pj: its index, or -1. */
static int moved_from(const canon *c, int32_t t, const proj *pj, int npj) {
  for (int steps = 0; steps < 64; steps++) {
    for (int i = 0; i < npj; i++)
      if (pj[i].out == t) return i;
    const ir_node *n = prod(c, t);
    if (!n || !is_movement(n->op) || is_w(c, n->in[0])) return -1;
    t = n->in[0];
  }
  return -1;
}

/* Whether t is columns [*off, *off + width) of projection pj's rows (width: t's last dim),
 * judged on numbered values. */
static bool proj_cols(canon *c, const proj *pj, int32_t t, int64_t *off) {
  int64_t S = c->io->seq, W = dim(c, t, -1), N = pj->n;
  if (numel(c, t) != S * W) return false;
  ev e;
  if (!ev_init(&e, c, pj->out)) return false;
  const float *v = ev_f32(&e, t, "the MLP's gate or up");
  bool ok = v != NULL;
  if (ok) *off = ((int64_t)v[0] - 1) % N;
  for (int64_t s = 0; ok && s < S; s++)
    for (int64_t j = 0; ok && j < W; j++) ok = v[s * W + j] == (float)(s * N + *off + j + 1);
  ev_free(&e);
  return ok;
}

/* The MLP from h = norm(x): down(act(gate) * up), gate and up two projections or two
 * column ranges of one; returns the residual stream after it, or -1. */
static int32_t match_mlp(canon *c, int32_t x, int32_t h) {
  proj pj[MAX_PROJ];
  int npj = find_projs(c, h, pj, MAX_PROJ);
  model_llama_params *p = &c->r->p;
  if (npj < 1 || npj > 2 || pj[0].b >= 0 || (npj == 2 && pj[1].b >= 0)) {
    cfail(c,
          "the MLP is not SwiGLU: %d projection(s) read its normalized input, not a gate "
          "and an up projection",
          npj);
    return -1;
  }
  /* the product act(gate) * up: the first Mul after the projections that is one */
  const ir_node *prodn = NULL;
  int gi = -1, ui = -1, act = -1;
  int32_t gate = -1, up = -1, first = pj[0].node;
  if (npj == 2 && pj[1].node < first) first = pj[1].node;
  for (int32_t i = first + 1; i < c->g->n_nodes && !prodn; i++) {
    const ir_node *m = &c->g->nodes[i];
    if (m->op != IR_OP_ND_MUL) continue;
    for (int k = 0; k < 2 && !prodn; k++) {
      int32_t g = -1;
      int a = act_of(c, m->in[k], &g);
      int gsrc = a >= 0 ? moved_from(c, g, pj, npj) : -1;
      int usrc = gsrc >= 0 ? moved_from(c, skip_cast(c, m->in[1 - k]), pj, npj) : -1;
      if (usrc >= 0)
        prodn = m, gi = gsrc, ui = usrc, act = a, gate = g, up = skip_cast(c, m->in[1 - k]);
    }
  }
  if (!prodn) {
    const ir_node *u = n_uses(c, pj[0].out) ? use(c, pj[0].out, 0) : NULL;
    cfail(c,
          "the MLP is not SwiGLU (or tanh-GELU gated): no act(gate) * up with act silu or "
          "tanh-GELU after its projections (the first reads into node '%s' (%s))",
          nname(u), u ? ir_op_name(u->op) : "-");
    return -1;
  }
  int64_t I = dim(c, gate, -1), goff = 0, uoff = 0;
  if (dim(c, up, -1) != I || !proj_cols(c, &pj[gi], gate, &goff) ||
      !proj_cols(c, &pj[ui], up, &uoff)) {
    if (c->st == IR_OK)
      cfail(c, "the MLP's gate and up ('%s') are not column ranges of its projections",
            nname(prodn));
    return -1;
  }
  int32_t reads = -1;
  const ir_node *dn = forward_proj(c, prodn->out[0], &reads, 0);
  proj pd[MAX_PROJ];
  int npd = dn ? find_projs(c, reads, pd, MAX_PROJ) : 0, di = -1;
  for (int i = 0; i < npd; i++)
    if (&c->g->nodes[pd[i].node] == dn) di = i;
  if (di < 0 || skip_cast(c, reads) != prodn->out[0] || pd[di].k != I || pd[di].b >= 0) {
    cfail(c, "the MLP's down projection does not read act(gate) * up ('%s') directly",
          nname(prodn));
    return -1;
  }
  if (c->layer == 0) p->intermediate_size = I, p->act = act;
  else if (p->intermediate_size != I || p->act != act) {
    cfail(c, "the MLP differs from the first layer's");
    return -1;
  }
  char nm[96];
  layer_name(nm, sizeof nm, c->layer, "mlp.gate_proj.weight");
  add_proj(c, nm, &pj[gi], goff, I, false);
  layer_name(nm, sizeof nm, c->layer, "mlp.up_proj.weight");
  add_proj(c, nm, &pj[ui], uoff, I, false);
  layer_name(nm, sizeof nm, c->layer, "mlp.down_proj.weight");
  add_proj(c, nm, &pd[di], 0, pd[di].n, false);
  int32_t x2 = c->st == IR_OK ? residual(c, x, pd[di].out) : -1, w;
  double eps;
  if (c->st == IR_OK && x2 < 0 && p->sandwich_norms) { /* normalized before the add */
    int32_t y = find_norm(c, pd[di].out, &w, &eps);
    if (y >= 0 && (x2 = residual(c, x, y)) >= 0) {
      check_eps(c, eps);
      layer_name(nm, sizeof nm, c->layer, "post_feedforward_layernorm.weight");
      add_vector(c, nm, w, 0, p->hidden_size);
    }
  }
  if (c->st == IR_OK && x2 < 0)
    cfail(c, "the MLP's output ('%s') is not added to the residual stream", nname(dn));
  return x2;
}

/* --- the model ------------------------------------------------------------------------- */

/* logits back to lm_head(norm(x_final)): *x_final, the head projection. */
static bool match_head(canon *c, int32_t *x_final, int32_t *norm_w, double *eps, proj *head) {
  int32_t t = c->io->logits;
  model_llama_params *p = &c->r->p;
  for (int steps = 0; steps < 32; steps++) {
    const ir_node *n = prod(c, t);
    double k, k2;
    if (!n) break;
    if ((n->op == IR_OP_ND_MATMUL || n->op == IR_OP_ND_GEMM) && is_w(c, n->in[1])) {
      int32_t h = n->in[0];
      while (prod(c, h) && is_movement(prod(c, h)->op)) h = prod(c, h)->in[0];
      int32_t x;
      if (!match_rms(c, h, &x, norm_w, eps)) {
        cfail(c, "the lm_head ('%s') does not read a normalized hidden state", nname(n));
        return false;
      }
      proj pj[MAX_PROJ];
      int np = find_projs(c, n->in[0], pj, MAX_PROJ);
      for (int i = 0; i < np; i++)
        if (&c->g->nodes[pj[i].node] == n) *head = pj[i];
      *x_final = x;
      return head->w >= 0 && head->b < 0;
    }
    if (is_movement(n->op)) {
      t = n->in[0];
    } else if (n->op == IR_OP_ND_MUL && scalar(c, n->in[1], &k)) { /* final softcap */
      const ir_node *th = prod(c, n->in[0]);
      const ir_node *dv = is_op(th, IR_OP_ND_TANH) ? prod(c, th->in[0]) : NULL;
      if (!dv ||
          !((dv->op == IR_OP_ND_DIV && scalar(c, dv->in[1], &k2) && fabs(k2 - k) < 1e-6 * k) ||
            (dv->op == IR_OP_ND_MUL && scalar(c, dv->in[1], &k2) && fabs(k2 * k - 1) < 1e-6)))
        break;
      p->final_softcap = k;
      t = dv->in[0];
    } else {
      break;
    }
  }
  const ir_node *n = prod(c, t);
  cfail(c, "the logits output does not come from an lm_head projection (stopped at node '%s')",
        nname(n));
  return false;
}

static void match_model(canon *c) {
  model_llama_params *p = &c->r->p;
  c->layer = -1;
  /* embedding */
  const ir_node *emb = NULL;
  for (int i = 0; i < n_uses(c, c->io->input_ids) && !emb; i++) {
    const ir_node *u = use(c, c->io->input_ids, i);
    if (u->op == IR_OP_ND_CAST && n_uses(c, u->out[0]) == 1) u = use(c, u->out[0], 0);
    if (u->op == IR_OP_ND_GATHER && ir_node_attr_i(u, "axis", 0) == 0 && is_w(c, u->in[0]) &&
        tt(c, u->in[0])->rank == 2)
      emb = u;
  }
  if (!emb) {
    cfail(c, "no embedding Gather of a constant [vocab, hidden] table by input_ids");
    return;
  }
  p->vocab_size = dim(c, emb->in[0], 0);
  p->hidden_size = dim(c, emb->in[0], 1);
  const ir_tensor *et = tt(c, emb->in[0]);
  pass_llm_weight *ew = new_weight(c, "model.embed_tokens.weight");
  if (!ew) return;
  ew->t = (model_tensor){.dtype = et->dtype,
                         .rank = 2,
                         .shape = {p->vocab_size, p->hidden_size},
                         .data = et->data,
                         .nbytes = et->nbytes};
  int32_t x = emb->out[0];
  double k;
  if (n_uses(c, x) == 1 && use(c, x, 0)->op == IR_OP_ND_MUL &&
      scalar(c, other(use(c, x, 0), x), &k)) {
    p->embed_scale = k;
    x = use(c, x, 0)->out[0];
  }
  int32_t x_final = -1, fw = -1;
  double feps = 0;
  proj head = {.w = -1, .b = -1};
  if (!match_head(c, &x_final, &fw, &feps, &head)) {
    if (c->st == IR_OK) cfail(c, "the lm_head is not a MatMul by a constant without bias");
    return;
  }
  for (c->layer = 0; c->st == IR_OK && !same(c, x, x_final); c->layer++) {
    if (c->layer >= IR_MAX_LAYERS) {
      cfail(c, "more than %d layers", IR_MAX_LAYERS);
      return;
    }
    int32_t w;
    double eps;
    char nm[96];
    int32_t h = find_norm(c, x, &w, &eps);
    if (h < 0) {
      cfail(c, "no RMSNorm of the residual stream ('%s')", tt(c, x)->name);
      return;
    }
    check_eps(c, eps);
    layer_name(nm, sizeof nm, c->layer, "input_layernorm.weight");
    add_vector(c, nm, w, 0, p->hidden_size);
    int32_t x1 = match_attention(c, x, h);
    if (x1 < 0) return;
    h = find_norm(c, x1, &w, &eps);
    if (h < 0) {
      cfail(c, "no RMSNorm of the residual stream after the attention");
      return;
    }
    check_eps(c, eps);
    layer_name(nm, sizeof nm, c->layer,
               p->sandwich_norms ? "pre_feedforward_layernorm.weight"
                                 : "post_attention_layernorm.weight");
    add_vector(c, nm, w, 0, p->hidden_size);
    x = match_mlp(c, x1, h);
    if (x < 0) return;
    p->n_layers = c->layer + 1;
  }
  c->layer = -1;
  if (c->st != IR_OK) return;
  if (p->n_layers < 1) {
    cfail(c, "no decoder layer between the embedding and the lm_head");
    return;
  }
  check_eps(c, feps);
  add_vector(c, "model.norm.weight", fw, 0, p->hidden_size);
  if (head.k != p->hidden_size || head.n != p->vocab_size) {
    cfail(c, "the lm_head is [%lld, %lld], not [hidden %lld, vocab %lld]", (long long)head.k,
          (long long)head.n, (long long)p->hidden_size, (long long)p->vocab_size);
    return;
  }
  add_proj(c, "lm_head.weight", &head, 0, head.n, false);
  if (c->st != IR_OK) return;
  /* an lm_head equal to the embedding is tied: share it */
  const pass_llm_weight *e = find_weight(c->r, "model.embed_tokens.weight"),
                        *hw = &c->r->w[c->r->n_w - 1];
  if (e->t.dtype == hw->t.dtype && e->t.nbytes == hw->t.nbytes &&
      !memcmp(e->t.data, hw->t.data, e->t.nbytes)) {
    p->tie_word_embeddings = true;
    c->r->n_w--;
  }
  p->rms_norm_eps = c->eps;
  layer_patterns(c);
  if (c->st == IR_OK) rope_params(c);
}

/* Every graph input is the ids or a past KV the attention concatenates; every output the
 * logits or (a movement of) such a Concat: a present KV. */
static void check_io(canon *c) {
  const ir_graph *g = c->g;
  model_llama_params *p = &c->r->p;
  if (c->r->n_past && c->r->n_past != 2 * p->n_layers) {
    cfail(c, "%d past-KV Concats for %lld layers (expected a key and a value per layer)",
          c->r->n_past, (long long)p->n_layers);
    return;
  }
  for (int32_t i = 0; i < g->n_inputs; i++) {
    int32_t t = g->inputs[i];
    bool ok = t == c->io->input_ids;
    for (int k = 0; k < c->n_past_seen; k++) ok |= c->past_seen[k] == t;
    if (!ok) {
      cfail(c,
            "graph input '%s' is none of input_ids, attention_mask, position_ids or a past-KV "
            "input the attention concatenates",
            tt(c, t)->name);
      return;
    }
  }
  for (int32_t i = 0; i < g->n_outputs; i++) {
    int32_t t = g->outputs[i];
    if (t == c->io->logits) continue;
    while (prod(c, t) && is_movement(prod(c, t)->op)) t = prod(c, t)->in[0];
    const ir_node *n = prod(c, t);
    bool present = false;
    if (is_op(n, IR_OP_ND_CONCAT))
      for (int k = 0; k < c->n_past_seen; k++)
        present |= past_input(c, n->in[0]) == c->past_seen[k];
    if (!present) {
      cfail(c, "graph output '%s' is neither the logits nor a present KV",
            tt(c, g->outputs[i])->name);
      return;
    }
  }
}

ir_status pass_canon_llm(const ir_graph *g, const pass_llm_io *io, pass_llm *out, ir_diag *d) {
  memset(out, 0, sizeof *out);
  canon c = {.g = g, .io = io, .r = out, .d = d, .st = IR_OK, .layer = -1};
  if (io->past < 0 || io->past > 1 || io->seq < 2 || io->input_ids < 0 || io->logits < 0)
    return ir_diag_set(d, IR_INVALID_ARG, "pass_canon_llm: bad specialization");
  c.past_seen = ir_calloc((size_t)g->n_inputs * 2 + 2, sizeof *c.past_seen);
  c.layer_rope = ir_calloc(IR_MAX_LAYERS + 1, sizeof *c.layer_rope);
  c.layer_window = ir_calloc(IR_MAX_LAYERS + 1, sizeof *c.layer_window);
  c.shadow = *g;
  c.shadow_tensors = ir_malloc(((size_t)g->n_tensors + 1) * sizeof *c.shadow_tensors);
  if (c.shadow_tensors) {
    memcpy(c.shadow_tensors, g->tensors, (size_t)g->n_tensors * sizeof *c.shadow_tensors);
    for (int32_t t = 0; t < g->n_tensors; t++)
      if (c.shadow_tensors[t].kind != IR_TENSOR_WEIGHT &&
          (c.shadow_tensors[t].dtype == IR_F16 || c.shadow_tensors[t].dtype == IR_BF16)) {
        c.half_dt = c.shadow_tensors[t].dtype;
        c.shadow_tensors[t].dtype = IR_F32;
      }
    c.shadow.tensors = c.shadow_tensors;
  }
  if (!c.past_seen || !c.layer_rope || !c.layer_window || !c.shadow_tensors || !build_uses(&c))
    coom(&c);
  if (c.st == IR_OK) match_model(&c);
  if (c.st == IR_OK) check_io(&c);
  if (c.st == IR_OK) snprintf(out->p.arch, sizeof out->p.arch, "llama");
  ir_free(c.use_off);
  ir_free(c.use_node);
  ir_free(c.through);
  ir_free(c.cur);
  ir_free(c.freqs[0]);
  ir_free(c.freqs[1]);
  ir_free(c.layer_rope);
  ir_free(c.layer_window);
  ir_free(c.shadow_tensors);
  ir_free(c.past_seen);
  if (c.st != IR_OK) pass_llm_free(out);
  return c.st;
}

/* --- build ----------------------------------------------------------------------------- */

static bool r_find(void *ctx, const char *name, model_tensor *out) {
  const pass_llm_weight *w = find_weight(ctx, name);
  if (w) *out = w->t;
  return w != NULL;
}

ir_status pass_canon_llm_build(pass_llm *r, const model_build_opts *bo, ir_graph **out,
                               ir_diag *d) {
  model_tensor_src src = {.ctx = r, .find = r_find};
  *out = NULL;
  ir_status st = model_llama_build(&r->p, &src, bo, out, d);
  for (int i = 0; st == IR_OK && i < r->n_owned; i++) {
    void *buf = r->owned[i];
    r->owned[i] = NULL;
    if (!ir_graph_adopt(*out, buf)) st = ir_diag_set(d, IR_OOM, "out of memory");
  }
  if (st != IR_OK) {
    ir_graph_destroy(*out);
    *out = NULL;
  }
  return st;
}

void pass_llm_describe(const pass_llm *r, char *out, size_t len) {
  const model_llama_params *p = &r->p;
  const char *kind = p->n_kv_heads == p->n_heads ? "MHA" : p->n_kv_heads == 1 ? "MQA" : "GQA";
  char rope[160], extra[200] = "";
  size_t n = 0;
  if (r->rope_tabled)
    n = (size_t)snprintf(rope, sizeof rope, "RoPE %s, frequencies from the exporter's table",
                         p->rope_interleaved ? "interleaved" : "rotate-half");
  else
    n = (size_t)snprintf(rope, sizeof rope, "RoPE %s theta=%g",
                         p->rope_interleaved ? "interleaved" : "rotate-half", p->rope_theta);
  if (p->rot_dim && n < sizeof rope)
    n += (size_t)snprintf(rope + n, sizeof rope - n, " on %lld dims", (long long)p->rot_dim);
  if (p->rope_local_theta > 0 && n < sizeof rope)
    n += (size_t)snprintf(rope + n, sizeof rope - n, " (sliding layers %g)", p->rope_local_theta);
  if (p->no_rope_every && n < sizeof rope)
    snprintf(rope + n, sizeof rope - n, ", none every %lld-th layer", (long long)p->no_rope_every);
  n = 0;
  if (p->sliding_window)
    n += (size_t)snprintf(extra + n, sizeof extra - n, ", sliding window %lld",
                          (long long)p->sliding_window);
  if (p->sliding_window && p->swa_period && n < sizeof extra)
    n += (size_t)snprintf(extra + n, sizeof extra - n, " (every %lld-th layer full)",
                          (long long)p->swa_period);
  if (p->attn_softcap > 0 && n < sizeof extra)
    n += (size_t)snprintf(extra + n, sizeof extra - n, ", scores softcap %g", p->attn_softcap);
  if (p->attn_scale > 0 && n < sizeof extra)
    n += (size_t)snprintf(extra + n, sizeof extra - n, ", scale %g", p->attn_scale);
  if (p->sandwich_norms && n < sizeof extra)
    n += (size_t)snprintf(extra + n, sizeof extra - n, ", sandwich norms");
  if (p->embed_scale > 0 && n < sizeof extra)
    n += (size_t)snprintf(extra + n, sizeof extra - n, ", embeddings x %g", p->embed_scale);
  if (p->final_softcap > 0 && n < sizeof extra)
    snprintf(extra + n, sizeof extra - n, ", logits softcap %g", p->final_softcap);
  snprintf(out, len,
           "%lld attention blocks -> paged attention, %s %lld/%lld, head_dim %lld%s%s; %s"
           "%s; RMSNorm eps=%g; %s %lld; causal mask%s; vocab %lld%s",
           (long long)p->n_layers, kind, (long long)p->n_heads, (long long)p->n_kv_heads,
           (long long)p->head_dim, p->attention_bias ? ", q/k/v bias" : "",
           p->qk_norm ? ", q/k norm" : "",
           r->n_past ? "past-KV concat -> paged KV (present.* dropped); " : "", rope,
           p->rms_norm_eps, p->act == IR_ACT_GEGLU ? "GeGLU" : "SwiGLU",
           (long long)p->intermediate_size, extra, (long long)p->vocab_size,
           p->tie_word_embeddings ? ", lm_head tied" : "");
}

void pass_llm_free(pass_llm *r) {
  for (int i = 0; i < r->n_owned; i++) ir_free(r->owned[i]);
  ir_free(r->owned);
  ir_free(r->w);
  ir_free(r->rope_freqs);
  r->owned = NULL;
  r->w = NULL;
  r->rope_freqs = NULL;
  r->n_owned = r->n_w = 0;
}
