/* onnx_llm: recognises the Llama decoder in an exported causal-LM graph
 * (walking the ONNX nodes by data flow) and rebuilds it with the Llama template
 * over the paged KV cache. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "infc_hfconfig.h"
#include "infc_onnx_llm.h"
#include "infc_util.h"
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

typedef struct lm {
  infc_onnx *m;
  const Onnx__GraphProto *gp;
  vmap *map;
  size_t n_map;
  size_t pos;   /* nodes are matched in order from here */
  int layer;    /* for messages */
  double scale; /* of the attention scores, checked against head_dim */
  int64_t half; /* head_dim / 2, from the rope table */
  ir_diag *d;
  ir_status st;
  model_llama_params p;
  lm_weight *w;
  int n_w, cap_w;
  void **
      owned; /* buffers the graph adopts (transposed weights, decoded copies) */
  int n_owned, cap_owned;
} lm;

/* --- value lookup
 * ------------------------------------------------------------------------ */

static int vmap_cmp(const void *a, const void *b) {
  return strcmp(((const vmap *)a)->name, ((const vmap *)b)->name);
}

static bool build_map(lm *L) {
  size_t n = L->gp->n_initializer;
  for (size_t i = 0; i < L->gp->n_node; i++)
    n += L->gp->node[i]->n_output;
  L->map = calloc(n ? n : 1, sizeof *L->map);
  if (!L->map)
    return false;
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

static const vmap *lookup(const lm *L, const char *v) {
  vmap key = {v, 0};
  return v ? bsearch(&key, L->map, L->n_map, sizeof *L->map, vmap_cmp) : NULL;
}

static node_t *producer(const lm *L, const char *v) {
  const vmap *e = lookup(L, v);
  return e && e->idx >= 0 ? L->gp->node[e->idx] : NULL;
}

static bool is_op(node_t *n, const char *op) {
  return n && !strcmp(n->op_type, op);
}

static const char *in(node_t *n, size_t i) {
  return i < n->n_input ? n->input[i] : "";
}

/* v with Cast and Identity nodes in front of it looked through. */
static const char *skip(const lm *L, const char *v) {
  node_t *n;
  while ((n = producer(L, v)) && (is_op(n, "Cast") || is_op(n, "Identity")))
    v = in(n, 0);
  return v;
}

static bool same(const lm *L, const char *a, const char *b) {
  return !strcmp(skip(L, a), skip(L, b));
}

static bool is_movement(node_t *n) {
  static const char *const ops[] = {"Reshape",   "Transpose", "Expand",
                                    "Unsqueeze", "Squeeze",   "Cast",
                                    "Identity",  "Flatten"};
  for (size_t i = 0; n && i < sizeof ops / sizeof ops[0]; i++)
    if (is_op(n, ops[i]))
      return true;
  return false;
}

/* v with data-movement nodes (reshape, transpose, expand, ...) looked through.
 */
static const char *movement_src(const lm *L, const char *v) {
  node_t *n;
  while ((n = producer(L, v)) && is_movement(n))
    v = in(n, 0);
  return v;
}

/* The constant behind v (an initializer or a Constant node), decoded. */
static bool const_tensor(lm *L, const char *v, onnx_dense *out) {
  v = movement_src(L, v);
  const vmap *e = lookup(L, v);
  const Onnx__TensorProto *tp = NULL;
  if (e && e->idx < 0)
    tp = L->gp->initializer[-e->idx - 1];
  else if (e && is_op(L->gp->node[e->idx], "Constant")) {
    node_t *n = L->gp->node[e->idx];
    for (size_t i = 0; i < n->n_attribute; i++)
      if (!strcmp(n->attribute[i]->name, "value"))
        tp = n->attribute[i]->t;
  }
  ir_diag ignore = {0};
  return tp && onnx_tensor_decode(tp, L->m, out, &ignore) == IR_OK;
}

static bool const_values(lm *L, const char *v, double *vals, int max, int *n) {
  onnx_dense t;
  if (!const_tensor(L, v, &t))
    return false;
  int64_t cnt = ir_nd_numel(t.rank, t.shape);
  bool ok = cnt >= 1 && cnt <= max;
  for (int64_t i = 0; ok && i < cnt; i++) {
    if (t.dt == IR_F32)
      vals[i] = ((const float *)t.data)[i];
    else if (t.dt == IR_I64)
      vals[i] = (double)((const int64_t *)t.data)[i];
    else if (t.dt == IR_I32)
      vals[i] = ((const int32_t *)t.data)[i];
    else
      ok = false;
  }
  *n = (int)cnt;
  free(t.owned);
  return ok;
}

static bool const_scalar(lm *L, const char *v, double *out) {
  int n;
  return const_values(L, v, out, 1, &n);
}

/* The first node at or after `from` with op type `op` taking (a Cast of) v as
 * input. */
static int consumer(const lm *L, const char *v, const char *op, size_t from) {
  for (size_t i = from; i < L->gp->n_node; i++) {
    node_t *n = L->gp->node[i];
    if (!is_op(n, op))
      continue;
    for (size_t k = 0; k < n->n_input; k++)
      if (n->input[k][0] && same(L, n->input[k], v))
        return (int)i;
  }
  return -1;
}

static ir_status fail(lm *L, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ir_status fail(lm *L, const char *fmt, ...) {
  if (L->st != IR_OK)
    return L->st;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (L->layer >= 0)
    L->st = ir_diag_set(L->d, IR_UNSUPPORTED, "layer %d: %s", L->layer, msg);
  else
    L->st = ir_diag_set(L->d, IR_UNSUPPORTED, "%s", msg);
  return L->st;
}

/* --- weights
 * -----------------------------------------------------------------------------
 */

static bool keep(lm *L, void *buf) {
  if (L->n_owned == L->cap_owned) {
    int cap = L->cap_owned ? 2 * L->cap_owned : 32;
    void **o = realloc(L->owned, (size_t)cap * sizeof *o);
    if (!o)
      return false;
    L->owned = o;
    L->cap_owned = cap;
  }
  L->owned[L->n_owned++] = buf;
  return true;
}

static lm_weight *new_weight(lm *L, const char *name) {
  if (L->n_w == L->cap_w) {
    int cap = L->cap_w ? 2 * L->cap_w : 32;
    lm_weight *w = realloc(L->w, (size_t)cap * sizeof *w);
    if (!w)
      return NULL;
    L->w = w;
    L->cap_w = cap;
  }
  lm_weight *w = &L->w[L->n_w++];
  snprintf(w->name, sizeof w->name, "%s", name);
  return w;
}

static bool float_dtype(ir_dtype dt) {
  return dt == IR_F32 || dt == IR_F16 || dt == IR_BF16;
}

/* Records constant v under an HF name; a [in, out] MatMul operand is stored
 * transposed as the [out, in] the template expects. */
static void add_weight(lm *L, const char *hf, const char *v, bool transpose) {
  onnx_dense t;
  if (L->st != IR_OK)
    return;
  if (!const_tensor(L, v, &t) || !float_dtype(t.dt) || t.rank > 2) {
    fail(L, "'%s' (%s) is not a constant f32/f16/bf16 tensor", v, hf);
    return;
  }
  if (t.owned && !keep(L, t.owned))
    free(t.owned), t.data = NULL;
  lm_weight *w = new_weight(L, hf);
  if (!w || !t.data) {
    L->st = ir_diag_set(L->d, IR_OOM, "out of memory");
    return;
  }
  w->t = (model_tensor){
      .dtype = t.dt, .rank = t.rank, .data = t.data, .nbytes = t.nbytes};
  for (int i = 0; i < t.rank; i++)
    w->t.shape[i] = t.shape[i];
  if (!transpose || t.rank != 2)
    return;
  size_t es = (size_t)ir_dtype_bytes(t.dt, 1), r = (size_t)t.shape[0],
         c = (size_t)t.shape[1];
  uint8_t *dst = malloc(t.nbytes ? t.nbytes : 1);
  if (!dst || !keep(L, dst)) {
    free(dst);
    L->st = ir_diag_set(L->d, IR_OOM, "out of memory");
    return;
  }
  const uint8_t *src = t.data;
  for (size_t i = 0; i < r; i++)
    for (size_t j = 0; j < c; j++)
      memcpy(dst + (j * r + i) * es, src + (i * c + j) * es, es);
  w->t.shape[0] = t.shape[1];
  w->t.shape[1] = t.shape[0];
  w->t.data = dst;
}

static bool lm_find(void *ctx, const char *name, model_tensor *out) {
  lm *L = ctx;
  for (int i = 0; i < L->n_w; i++)
    if (!strcmp(L->w[i].name, name)) {
      *out = L->w[i].t;
      return true;
    }
  return false;
}

/* Shape of the constant behind v: rank, or -1 when v is not constant. */
static int const_shape(lm *L, const char *v, int64_t *shape) {
  onnx_dense t;
  if (!const_tensor(L, v, &t))
    return -1;
  memcpy(shape, t.shape, sizeof t.shape);
  free(t.owned);
  return t.rank;
}

/* --- patterns
 * ----------------------------------------------------------------------------
 */

/* mean(x^2, last axis) + eps; eps into *eps. */
static bool match_mean_sq(lm *L, const char *a, const char *x, double *eps) {
  node_t *add = producer(L, skip(L, a)), *mean = NULL;
  if (!is_op(add, "Add"))
    return false;
  for (int k = 0; k < 2 && !mean; k++)
    if (const_scalar(L, in(add, (size_t)k), eps))
      mean = producer(L, skip(L, in(add, 1 - (size_t)k)));
  if (!is_op(mean, "ReduceMean"))
    return false;
  node_t *sq = producer(L, skip(L, in(mean, 0)));
  double two;
  if (is_op(sq, "Pow"))
    return same(L, in(sq, 0), x) && const_scalar(L, in(sq, 1), &two) &&
           two == 2;
  return is_op(sq, "Mul") && same(L, in(sq, 0), x) && same(L, in(sq, 1), x);
}

/* x * 1/sqrt(mean(x^2) + eps) as Mul(x, Div(1, Sqrt)) / Mul(x,
 * Reciprocal(Sqrt)) or Div(x, Sqrt). */
static bool match_normalize(lm *L, const char *y, const char *x, double *eps) {
  node_t *n = producer(L, skip(L, y));
  if (is_op(n, "Div")) {
    node_t *sq = producer(L, skip(L, in(n, 1)));
    return same(L, in(n, 0), x) && is_op(sq, "Sqrt") &&
           match_mean_sq(L, in(sq, 0), x, eps);
  }
  if (!is_op(n, "Mul"))
    return false;
  for (size_t k = 0; k < 2; k++) {
    if (!same(L, in(n, k), x))
      continue;
    node_t *r = producer(L, skip(L, in(n, 1 - k)));
    double one;
    const char *s = NULL;
    if (is_op(r, "Reciprocal"))
      s = in(r, 0);
    else if (is_op(r, "Div") && const_scalar(L, in(r, 0), &one) && one == 1.0)
      s = in(r, 1);
    node_t *sq = s ? producer(L, skip(L, s)) : NULL;
    if (is_op(sq, "Sqrt") && match_mean_sq(L, in(sq, 0), x, eps))
      return true;
  }
  return false;
}

/* RMSNorm of x: the next Mul by a [H] constant whose other operand normalizes
 * x. Records the weight as `hf`; returns the normalized output (NULL with L->st
 * set). */
static const char *match_norm(lm *L, const char *x, const char *hf) {
  int64_t H = L->p.hidden_size, shape[IR_MAX_RANK] = {0};
  for (size_t i = L->pos; i < L->gp->n_node; i++) {
    node_t *n = L->gp->node[i];
    if (!is_op(n, "Mul"))
      continue;
    for (size_t k = 0; k < 2; k++) {
      if (const_shape(L, in(n, k), shape) != 1 || shape[0] != H)
        continue;
      double eps;
      if (!match_normalize(L, in(n, 1 - k), x, &eps))
        continue;
      if (L->p.rms_norm_eps > 0 &&
          fabs(eps - L->p.rms_norm_eps) > 1e-12 * (1 + eps)) {
        fail(L, "RMSNorm eps %g differs from the first norm's %g", eps,
             L->p.rms_norm_eps);
        return NULL;
      }
      L->p.rms_norm_eps = eps;
      add_weight(L, hf, in(n, k), false);
      L->pos = i + 1;
      return n->output[0];
    }
  }
  fail(L,
       "no RMSNorm (x * 1/sqrt(mean(x^2) + eps) * weight[%lld]) of the "
       "residual stream "
       "after node %zu",
       (long long)H, L->pos);
  return NULL;
}

/* MatMuls at or after L->pos taking x with a constant 2-D right operand (at
 * most max). */
static int proj_nodes(lm *L, const char *x, int *idx, int max) {
  int n = 0;
  int64_t shape[IR_MAX_RANK] = {0};
  for (int i = consumer(L, x, "MatMul", L->pos); i >= 0 && n < max;
       i = consumer(L, x, "MatMul", (size_t)i + 1))
    if (same(L, in(L->gp->node[i], 0), x) &&
        const_shape(L, in(L->gp->node[i], 1), shape) == 2)
      idx[n++] = i;
  return n;
}

static int64_t proj_width(lm *L, int i) {
  int64_t shape[IR_MAX_RANK] = {0};
  const_shape(L, in(L->gp->node[i], 1), shape);
  return shape[1];
}

static int64_t proj_in(lm *L, int i) {
  int64_t shape[IR_MAX_RANK] = {0};
  const_shape(L, in(L->gp->node[i], 1), shape);
  return shape[0];
}

/* The bias Add after projection node i: an Add of its output and a [width] constant.
 * Returns the Add's node index (and in *out_k the operand holding the bias), or -1. */
static int bias_add(lm *L, int i, size_t *out_k) {
  const char *y = L->gp->node[i]->output[0];
  int64_t shape[IR_MAX_RANK] = {0};
  int a = consumer(L, y, "Add", (size_t)i + 1);
  if (a < 0)
    return -1;
  node_t *n = L->gp->node[a];
  for (size_t k = 0; k < 2; k++)
    if (same(L, in(n, 1 - k), y) && const_shape(L, in(n, k), shape) == 1 &&
        shape[0] == proj_width(L, i)) {
      *out_k = k;
      return a;
    }
  return -1;
}

/* A projection's output, through its bias Add when there is one (recorded as `hf_bias`,
 * or refused when hf_bias is NULL). */
static const char *proj_out(lm *L, int i, const char *hf_bias, bool *has_bias) {
  size_t k = 0;
  int a = bias_add(L, i, &k);
  *has_bias = false;
  if (a < 0)
    return L->gp->node[i]->output[0];
  if (!hf_bias) {
    fail(L, "projection '%s' has a bias the Llama template lacks", L->gp->node[i]->name);
    return NULL;
  }
  add_weight(L, hf_bias, in(L->gp->node[a], k), false);
  *has_bias = true;
  return L->gp->node[a]->output[0];
}

/* The table operand of a rope Mul: cos(pos * inv_freq) (times a scaling of 1).
 * Checks the inverse frequencies are theta^(-2i/d) and sets rope_theta. */
static bool match_rope_table(lm *L, const char *t, int64_t *out_half) {
  node_t *n = producer(L, movement_src(L, t));
  double s;
  while (is_op(n, "Mul")) {
    size_t k = const_scalar(L, in(n, 1), &s)   ? 0
               : const_scalar(L, in(n, 0), &s) ? 1
                                               : 2;
    if (k == 2 || s != 1.0)
      return false;
    n = producer(L, movement_src(L, in(n, k)));
  }
  if (!is_op(n, "Cos") && !is_op(n, "Sin"))
    return false;
  node_t *cat = producer(L, movement_src(L, in(n, 0)));
  if (!is_op(cat, "Concat") || cat->n_input != 2)
    return false;
  node_t *mm = producer(L, movement_src(L, in(cat, 0)));
  if (!is_op(mm, "MatMul") && !is_op(mm, "Mul"))
    return false;
  double inv[512];
  int cnt = 0;
  for (size_t k = 0; k < 2 && !cnt; k++)
    if (!const_values(L, in(mm, k), inv, 512, &cnt))
      cnt = 0;
  int64_t half = cnt;
  if (half < 2)
    return false;
  double theta = pow(inv[1], -(double)half);
  for (int64_t i = 0; i < half; i++) {
    double want =
        (float)(1.0 / pow(theta, (double)(2 * i) / (double)(2 * half)));
    if (fabs(inv[i] - want) > 1e-5 * want)
      return false;
  }
  L->p.rope_theta = round(theta * 1e3) / 1e3;
  L->half = *out_half = half;
  return true;
}

/* rotate_half(x) = Concat(-x[..., d/2:], x[..., :d/2]): the source x. (The
 * split point is usually computed from the shape at run time; d comes from the
 * rope table.) */
static bool match_rotate_half(lm *L, const char *v, const char **x) {
  node_t *cat = producer(L, skip(L, v));
  if (!is_op(cat, "Concat") || cat->n_input != 2)
    return false;
  node_t *neg = producer(L, skip(L, in(cat, 0))), *s1, *s2;
  if (!is_op(neg, "Neg"))
    return false;
  s2 = producer(L, skip(L, in(neg, 0)));
  s1 = producer(L, skip(L, in(cat, 1)));
  if (!is_op(s1, "Slice") || !is_op(s2, "Slice") ||
      !same(L, in(s1, 0), in(s2, 0)))
    return false;
  *x = in(s1, 0);
  return true;
}

/* RoPE of the projection output `p`: Add(Mul(x, cos), Mul(rotate_half(x), sin))
 * where x is p reshaped into heads. `v` is the attention operand (through
 * repeat_kv/transposes). */
static bool match_rope(lm *L, const char *v, const char *p, int64_t *half) {
  node_t *add = producer(L, movement_src(L, v));
  if (!is_op(add, "Add"))
    return false;
  const char *x = NULL, *rx = NULL, *cos = NULL;
  for (size_t k = 0; k < 2; k++) {
    node_t *mul = producer(L, skip(L, in(add, k)));
    if (!is_op(mul, "Mul"))
      return false;
    for (size_t j = 0; j < 2; j++) {
      const char *h;
      if (match_rotate_half(L, in(mul, j), &h))
        rx = h;
      else if (!strcmp(movement_src(L, in(mul, j)), p))
        x = in(mul, j), cos = in(mul, 1 - j);
    }
  }
  if (!x || !rx || !same(L, x, rx))
    return false;
  *half = L->half;
  if (L->p.rope_theta > 0)
    return true;
  return match_rope_table(L, cos, half);
}

/* Whether some producer within `depth` steps above v is an `op` node. */
static bool has_ancestor(const lm *L, const char *v, const char *op,
                         int depth) {
  node_t *n = producer(L, v);
  if (!n || depth < 0)
    return false;
  if (is_op(n, op))
    return true;
  for (size_t k = 0; k < n->n_input; k++)
    if (n->input[k][0] && has_ancestor(L, n->input[k], op, depth - 1))
      return true;
  return false;
}

/* The projection's output, through its bias Add if any (not recorded). */
static const char *proj_value(lm *L, int i) {
  size_t k = 0;
  int a = bias_add(L, i, &k);
  return a < 0 ? L->gp->node[i]->output[0] : L->gp->node[a]->output[0];
}

static int find_op(const lm *L, const char *op, size_t from) {
  for (size_t i = from; i < L->gp->n_node; i++)
    if (is_op(L->gp->node[i], op))
      return (int)i;
  return -1;
}

/* Softmax(Q·Kᵀ · scale + mask)·V: the nodes of Q·Kᵀ and of P·V; checks scale
 * and mask. */
static bool match_sdpa(lm *L, int *qk_out, int *pv_out) {
  int sm = find_op(L, "Softmax", L->pos);
  if (sm < 0)
    return fail(L, "no attention Softmax"), false;
  int pv = consumer(L, L->gp->node[sm]->output[0], "MatMul", (size_t)sm + 1);
  node_t *add = producer(L, skip(L, in(L->gp->node[sm], 0))), *sc = NULL;
  if (!is_op(add, "Add"))
    return fail(L, "attention softmax without a causal mask add"), false;
  size_t mk = 0;
  for (size_t k = 0; k < 2 && !sc; k++) {
    node_t *n = producer(L, skip(L, in(add, k)));
    if (is_op(n, "Div") || is_op(n, "Mul"))
      sc = n, mk = 1 - k;
  }
  double c;
  if (!sc || !const_scalar(L, in(sc, 1), &c))
    return fail(L, "attention scores are not scaled by a constant"), false;
  if (!has_ancestor(L, in(add, mk), "Trilu", 16) &&
      !has_ancestor(L, in(add, mk), "Less", 16) &&
      !has_ancestor(L, in(add, mk), "Greater", 16))
    return fail(L, "the attention mask is not a causal (triangular) mask"),
           false;
  node_t *qk = producer(L, skip(L, in(sc, 0)));
  int qi = qk ? lookup(L, qk->output[0])->idx : -1;
  if (!is_op(qk, "MatMul") || pv < 0)
    return fail(L, "no Q·Kᵀ / P·V MatMuls"), false;
  double scale = is_op(sc, "Div") ? 1.0 / c : c;
  *qk_out = qi;
  *pv_out = pv;
  L->pos = (size_t)sm;
  L->scale = scale;
  return true;
}

static void layer_name(char *buf, size_t len, int l, const char *part) {
  snprintf(buf, len, "model.layers.%d.%s", l, part);
}

/* Records q/k/v biases (when present) and weights. */
static void record_qkv(lm *L, const int *qkv) {
  static const char *const nm[3] = {"q_proj", "k_proj", "v_proj"};
  char w[96], b[96], part[48];
  bool bias[3];
  for (int j = 0; j < 3; j++) {
    snprintf(part, sizeof part, "self_attn.%s.weight", nm[j]);
    layer_name(w, sizeof w, L->layer, part);
    snprintf(part, sizeof part, "self_attn.%s.bias", nm[j]);
    layer_name(b, sizeof b, L->layer, part);
    add_weight(L, w, in(L->gp->node[qkv[j]], 1), true);
    proj_out(L, qkv[j], b, &bias[j]);
  }
  if (bias[0] != bias[1] || bias[0] != bias[2])
    fail(L, "only some of q/k/v carry a bias");
  if (L->layer == 0)
    L->p.attention_bias = bias[0];
  else if (L->p.attention_bias != bias[0])
    fail(L, "q/k/v bias differs between layers");
}

/* Assigns q, k, v among the three projections of h; sets head sizes. */
static bool classify_qkv(lm *L, const int *idx, int qk, int pv, int *qkv) {
  int v = -1;
  for (int j = 0; j < 3; j++)
    if (!strcmp(movement_src(L, in(L->gp->node[pv], 1)), proj_value(L, idx[j])))
      v = idx[j];
  if (v < 0)
    return fail(L, "the P·V MatMul does not read the v projection"), false;
  int64_t half = 0, h2 = 0;
  qkv[2] = v;
  qkv[0] = qkv[1] = -1;
  for (int j = 0; j < 3; j++) {
    if (idx[j] == v)
      continue;
    if (match_rope(L, in(L->gp->node[qk], 0), proj_value(L, idx[j]), &half))
      qkv[0] = idx[j];
    else if (match_rope(L, in(L->gp->node[qk], 1), proj_value(L, idx[j]), &h2))
      qkv[1] = idx[j];
  }
  if (qkv[0] < 0 || qkv[1] < 0 || half != h2)
    return fail(L, "q and k are not rotated by rotate-half RoPE (cos/sin of "
                   "position * theta^(-2i/d); interleaved or scaled RoPE is "
                   "not recognised)"),
           false;
  int64_t hd = 2 * half, qw = proj_width(L, qkv[0]), kw = proj_width(L, qkv[1]);
  if (hd <= 0 || qw % hd || kw % hd || proj_width(L, v) != kw)
    return fail(L,
                "q/k/v widths %lld/%lld/%lld do not split into heads of %lld",
                (long long)qw, (long long)kw, (long long)proj_width(L, v),
                (long long)hd),
           false;
  double scale = L->scale;
  if (fabs(scale * sqrt((double)hd) - 1) > 1e-5)
    return fail(L, "attention scale %g is not 1/sqrt(head_dim %lld)", scale,
                (long long)hd),
           false;
  if (L->layer > 0 && (hd != L->p.head_dim || qw / hd != L->p.n_heads ||
                       kw / hd != L->p.n_kv_heads))
    return fail(L, "head layout differs from layer 0"), false;
  L->p.head_dim = hd;
  L->p.n_heads = qw / hd;
  L->p.n_kv_heads = kw / hd;
  return true;
}

/* The o projection (a MatMul of the attention output by a constant) and the
 * residual add around the block; returns the new residual stream. */
static const char *match_o_residual(lm *L, int pv, const char *x) {
  const char *att = L->gp->node[pv]->output[0];
  int64_t shape[IR_MAX_RANK] = {0};
  for (size_t i = (size_t)pv + 1; i < L->gp->n_node; i++) {
    node_t *n = L->gp->node[i];
    if (!is_op(n, "MatMul") || strcmp(movement_src(L, in(n, 0)), att) ||
        const_shape(L, in(n, 1), shape) != 2)
      continue;
    char w[96];
    bool bias;
    layer_name(w, sizeof w, L->layer, "self_attn.o_proj.weight");
    add_weight(L, w, in(n, 1), true);
    const char *o = proj_out(L, (int)i, NULL, &bias);
    int a = o ? consumer(L, o, "Add", i + 1) : -1;
    if (a < 0 || !(same(L, in(L->gp->node[a], 0), x) ||
                   same(L, in(L->gp->node[a], 1), x))) {
      fail(L, "no residual add after o_proj");
      return NULL;
    }
    L->pos = (size_t)a + 1;
    return L->gp->node[a]->output[0];
  }
  fail(L, "no o_proj MatMul on the attention output");
  return NULL;
}

static const char *match_attention(lm *L, const char *x, const char *h) {
  int idx[4], qk, pv, qkv[3];
  if (proj_nodes(L, h, idx, 4) != 3) {
    fail(L, "expected q/k/v projections of the attention norm");
    return NULL;
  }
  if (!match_sdpa(L, &qk, &pv) || !classify_qkv(L, idx, qk, pv, qkv))
    return NULL;
  record_qkv(L, qkv);
  return L->st == IR_OK ? match_o_residual(L, pv, x) : NULL;
}

/* down(silu(gate(h)) * up(h)) + x, silu as x * Sigmoid(x). */
static const char *match_mlp(lm *L, const char *x, const char *h) {
  int idx[3], gate = -1, up = -1;
  if (proj_nodes(L, h, idx, 3) != 2) {
    fail(L, "expected gate/up projections of the MLP norm");
    return NULL;
  }
  for (int j = 0; j < 2; j++) {
    if (consumer(L, L->gp->node[idx[j]]->output[0], "Sigmoid", L->pos) >= 0)
      gate = idx[j];
    else
      up = idx[j];
  }
  const char *g = gate >= 0 ? L->gp->node[gate]->output[0] : NULL;
  int sg = g ? consumer(L, g, "Sigmoid", L->pos) : -1;
  int silu =
      sg >= 0 ? consumer(L, L->gp->node[sg]->output[0], "Mul", (size_t)sg + 1)
              : -1;
  int prod = silu >= 0 && up >= 0 ? consumer(L, L->gp->node[silu]->output[0],
                                             "Mul", (size_t)silu + 1)
                                  : -1;
  int down = prod >= 0 ? consumer(L, L->gp->node[prod]->output[0], "MatMul",
                                  (size_t)prod + 1)
                       : -1;
  if (down < 0 ||
      (!same(L, in(L->gp->node[prod], 0), L->gp->node[up]->output[0]) &&
       !same(L, in(L->gp->node[prod], 1), L->gp->node[up]->output[0]))) {
    fail(L, "the MLP is not SwiGLU (down(silu(gate) * up))");
    return NULL;
  }
  const char *names[3] = {"mlp.gate_proj.weight", "mlp.up_proj.weight",
                          "mlp.down_proj.weight"};
  int nodes[3] = {gate, up, down};
  for (int j = 0; j < 3; j++) {
    char w[96];
    bool bias;
    layer_name(w, sizeof w, L->layer, names[j]);
    add_weight(L, w, in(L->gp->node[nodes[j]], 1), true);
    if (!proj_out(L, nodes[j], NULL, &bias))
      return NULL;
  }
  L->p.intermediate_size = proj_width(L, gate);
  int a = consumer(L, L->gp->node[down]->output[0], "Add", (size_t)down + 1);
  if (a < 0 || !(same(L, in(L->gp->node[a], 0), x) ||
                 same(L, in(L->gp->node[a], 1), x))) {
    fail(L, "no residual add after down_proj");
    return NULL;
  }
  L->pos = (size_t)a + 1;
  return L->gp->node[a]->output[0];
}

static void rename_last(lm *L, int layer, const char *part) {
  if (L->st != IR_OK || !L->n_w)
    return;
  if (layer >= 0)
    layer_name(L->w[L->n_w - 1].name, sizeof L->w[0].name, layer, part);
  else
    snprintf(L->w[L->n_w - 1].name, sizeof L->w[0].name, "%s", part);
}

/* Final norm (already matched, output h) and lm_head feeding the "logits"
 * output. */
static void match_head(lm *L, int lm_head, const char *logits) {
  rename_last(L, -1, "model.norm.weight");
  if (proj_width(L, lm_head) != L->p.vocab_size)
    fail(L, "lm_head width %lld differs from the vocabulary %lld",
         (long long)proj_width(L, lm_head), (long long)L->p.vocab_size);
  else if (strcmp(movement_src(L, logits), L->gp->node[lm_head]->output[0]))
    fail(L, "the logits output is not the lm_head MatMul");
  add_weight(L, "lm_head.weight", in(L->gp->node[lm_head], 1), true);
}

static void match_model(lm *L, const char *logits) {
  int64_t shape[IR_MAX_RANK] = {0};
  int e = consumer(L, "input_ids", "Gather", 0);
  node_t *g = e >= 0 ? L->gp->node[e] : NULL;
  if (!g || !same(L, in(g, 1), "input_ids") ||
      const_shape(L, in(g, 0), shape) != 2) {
    fail(
        L,
        "no embedding Gather of a constant [vocab, hidden] table by input_ids");
    return;
  }
  L->p.vocab_size = shape[0];
  L->p.hidden_size = shape[1];
  add_weight(L, "model.embed_tokens.weight", in(g, 0), false);
  const char *x = g->output[0];
  L->pos = (size_t)e + 1;
  for (L->layer = 0; L->st == IR_OK; L->layer++) {
    const char *h = match_norm(L, x, "norm");
    int idx[4], n = h ? proj_nodes(L, h, idx, 4) : 0;
    if (n == 1 && proj_in(L, idx[0]) == L->p.hidden_size && L->layer > 0) {
      L->layer = -1;
      match_head(L, idx[0], logits);
      return;
    }
    rename_last(L, L->layer, "input_layernorm.weight");
    if (h)
      x = match_attention(L, x, h);
    if (x)
      h = match_norm(L, x, "norm");
    rename_last(L, L->layer, "post_attention_layernorm.weight");
    if (x && h)
      x = match_mlp(L, x, h);
    L->p.n_layers = L->layer + 1;
  }
}

/* --- entry
 * -------------------------------------------------------------------------------
 */

static bool is_causal_lm(const Onnx__GraphProto *gp, const char **logits) {
  bool ids = false;
  *logits = NULL;
  for (size_t i = 0; i < gp->n_input; i++)
    ids |= gp->input[i]->name && !strcmp(gp->input[i]->name, "input_ids");
  for (size_t i = 0; i < gp->n_output; i++)
    if (gp->output[i]->name && !strcmp(gp->output[i]->name, "logits"))
      *logits = gp->output[i]->name;
  return ids && *logits;
}

/* max_position_embeddings, bos and eos from a config.json beside the model. */
static void read_config_beside(lm *L, const char *path) {
  char dir[4096], cfg[4200];
  model_llama_params c;
  ir_diag ignore = {0};
  L->p.max_position = 2048;
  L->p.bos_token_id = L->p.eos_token_id = -1;
  infc_path_dir(dir, sizeof dir, path);
  if (!infc_path_join(cfg, sizeof cfg, dir, "config.json") ||
      !infc_file_exists(cfg) || infc_hfconfig_load(cfg, &c, &ignore) != IR_OK)
    return;
  L->p.max_position = c.max_position;
  L->p.bos_token_id = c.bos_token_id;
  L->p.eos_token_id = c.eos_token_id;
}

static void describe(const lm *L, char *out) {
  const model_llama_params *p = &L->p;
  const char *kind = p->n_kv_heads == p->n_heads ? "MHA"
                     : p->n_kv_heads == 1        ? "MQA"
                                                 : "GQA";
  snprintf(out, INFC_ONNX_LLM_RECOGNISED,
           "%lld attention blocks -> paged attention, %s %lld/%lld, head_dim "
           "%lld%s; RoPE "
           "rotate-half theta=%g; RMSNorm eps=%g; SwiGLU %lld; causal mask; "
           "vocab %lld",
           (long long)p->n_layers, kind, (long long)p->n_heads,
           (long long)p->n_kv_heads, (long long)p->head_dim,
           p->attention_bias ? ", q/k/v bias" : "", p->rope_theta,
           p->rms_norm_eps, (long long)p->intermediate_size,
           (long long)p->vocab_size);
}

static ir_status build(lm *L, const char *path, const model_build_opts *bo,
                       ir_graph **out) {
  read_config_beside(L, path);
  snprintf(L->p.arch, sizeof L->p.arch, "llama");
  model_tensor_src src = {.ctx = L, .find = lm_find};
  ir_status st = model_llama_build(&L->p, &src, bo, out, L->d);
  for (int i = 0; st == IR_OK && i < L->n_owned; i++) {
    void *buf = L->owned[i];
    L->owned[i] = NULL;
    if (!ir_graph_adopt(*out, buf))
      st = ir_diag_set(L->d, IR_OOM, "out of memory");
  }
  if (st != IR_OK) {
    ir_graph_destroy(*out);
    *out = NULL;
  }
  return st;
}

ir_status infc_onnx_llm_import(const char *path, const model_build_opts *bo,
                               bool *out_is_lm, infc_onnx **out_model,
                               ir_graph **out_graph, char *out_hash,
                               char *recognised, ir_diag *d) {
  *out_is_lm = false;
  *out_model = NULL;
  *out_graph = NULL;
  infc_onnx *m = NULL;
  const char *logits;
  ir_status st = onnx_model_load(path, &m, d);
  if (st != IR_OK) {
    ir_diag_prefix(d, "%s", path);
    return st;
  }
  if (!is_causal_lm(m->model->graph, &logits)) {
    infc_onnx_close(m);
    return IR_OK;
  }
  *out_is_lm = true;
  lm L = {.m = m, .gp = m->model->graph, .d = d, .layer = -1, .st = IR_OK};
  if (!build_map(&L))
    L.st = ir_diag_set(d, IR_OOM, "out of memory");
  if (L.st == IR_OK)
    match_model(&L, logits);
  if (L.st != IR_OK && L.st != IR_OOM)
    ir_diag_prefix(
        d,
        "%s: a causal LM graph (input_ids -> logits) that infc cannot serve as "
        "an LLM plan",
        path);
  st = L.st == IR_OK ? build(&L, path, bo, out_graph) : L.st;
  if (st == IR_OK) {
    describe(&L, recognised);
    onnx_model_hash(m, out_hash);
    *out_model = m;
  }
  for (int i = 0; i < L.n_owned; i++)
    free(L.owned[i]);
  free(L.owned);
  free(L.w);
  free(L.map);
  if (st != IR_OK)
    infc_onnx_close(m);
  return st;
}
