/* onnx_llm: recognises the Llama decoder in an exported causal-LM graph (walking the ONNX
 * nodes by data flow) and rebuilds it with the Llama template over the paged KV cache. */
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
  size_t pos; /* nodes are matched in order from here */
  int layer;  /* for messages */
  ir_diag *d;
  ir_status st;
  model_llama_params p;
  lm_weight *w;
  int n_w, cap_w;
  void **owned; /* buffers the graph adopts (transposed weights, decoded copies) */
  int n_owned, cap_owned;
} lm;

/* --- value lookup ------------------------------------------------------------------------ */

static int vmap_cmp(const void *a, const void *b) {
  return strcmp(((const vmap *)a)->name, ((const vmap *)b)->name);
}

static bool build_map(lm *L) {
  size_t n = L->gp->n_initializer;
  for (size_t i = 0; i < L->gp->n_node; i++) n += L->gp->node[i]->n_output;
  L->map = calloc(n ? n : 1, sizeof *L->map);
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

static const vmap *lookup(const lm *L, const char *v) {
  vmap key = {v, 0};
  return v ? bsearch(&key, L->map, L->n_map, sizeof *L->map, vmap_cmp) : NULL;
}

static node_t *producer(const lm *L, const char *v) {
  const vmap *e = lookup(L, v);
  return e && e->idx >= 0 ? L->gp->node[e->idx] : NULL;
}

static bool is_op(node_t *n, const char *op) { return n && !strcmp(n->op_type, op); }

static const char *in(node_t *n, size_t i) { return i < n->n_input ? n->input[i] : ""; }

/* v with Cast and Identity nodes in front of it looked through. */
static const char *skip(const lm *L, const char *v) {
  node_t *n;
  while ((n = producer(L, v)) && (is_op(n, "Cast") || is_op(n, "Identity"))) v = in(n, 0);
  return v;
}

static bool same(const lm *L, const char *a, const char *b) {
  return !strcmp(skip(L, a), skip(L, b));
}

static bool is_movement(node_t *n) {
  static const char *const ops[] = {"Reshape", "Transpose", "Expand", "Unsqueeze", "Squeeze",
                                    "Cast", "Identity", "Flatten"};
  for (size_t i = 0; n && i < sizeof ops / sizeof ops[0]; i++)
    if (is_op(n, ops[i])) return true;
  return false;
}

/* v with data-movement nodes (reshape, transpose, expand, ...) looked through. */
static const char *movement_src(const lm *L, const char *v) {
  node_t *n;
  while ((n = producer(L, v)) && is_movement(n)) v = in(n, 0);
  return v;
}

/* The constant behind v (an initializer or a Constant node), decoded. */
static bool const_tensor(lm *L, const char *v, onnx_dense *out) {
  v = movement_src(L, v);
  const vmap *e = lookup(L, v);
  const Onnx__TensorProto *tp = NULL;
  if (e && e->idx < 0) tp = L->gp->initializer[-e->idx - 1];
  else if (e && is_op(L->gp->node[e->idx], "Constant")) {
    node_t *n = L->gp->node[e->idx];
    for (size_t i = 0; i < n->n_attribute; i++)
      if (!strcmp(n->attribute[i]->name, "value")) tp = n->attribute[i]->t;
  }
  ir_diag ignore = {0};
  return tp && onnx_tensor_decode(tp, L->m, out, &ignore) == IR_OK;
}

static bool const_values(lm *L, const char *v, double *vals, int max, int *n) {
  onnx_dense t;
  if (!const_tensor(L, v, &t)) return false;
  int64_t cnt = ir_nd_numel(t.rank, t.shape);
  bool ok = cnt >= 1 && cnt <= max;
  for (int64_t i = 0; ok && i < cnt; i++) {
    if (t.dt == IR_F32) vals[i] = ((const float *)t.data)[i];
    else if (t.dt == IR_I64) vals[i] = (double)((const int64_t *)t.data)[i];
    else if (t.dt == IR_I32) vals[i] = ((const int32_t *)t.data)[i];
    else ok = false;
  }
  *n = (int)cnt;
  free(t.owned);
  return ok;
}

static bool const_scalar(lm *L, const char *v, double *out) {
  int n;
  return const_values(L, v, out, 1, &n);
}

/* The first node at or after `from` with op type `op` taking (a Cast of) v as input. */
static int consumer(const lm *L, const char *v, const char *op, size_t from) {
  for (size_t i = from; i < L->gp->n_node; i++) {
    node_t *n = L->gp->node[i];
    if (!is_op(n, op)) continue;
    for (size_t k = 0; k < n->n_input; k++)
      if (n->input[k][0] && same(L, n->input[k], v)) return (int)i;
  }
  return -1;
}

static ir_status fail(lm *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ir_status fail(lm *L, const char *fmt, ...) {
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

/* --- weights ----------------------------------------------------------------------------- */

static bool keep(lm *L, void *buf) {
  if (L->n_owned == L->cap_owned) {
    int cap = L->cap_owned ? 2 * L->cap_owned : 32;
    void **o = realloc(L->owned, (size_t)cap * sizeof *o);
    if (!o) return false;
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
    if (!w) return NULL;
    L->w = w;
    L->cap_w = cap;
  }
  lm_weight *w = &L->w[L->n_w++];
  snprintf(w->name, sizeof w->name, "%s", name);
  return w;
}

static bool float_dtype(ir_dtype dt) { return dt == IR_F32 || dt == IR_F16 || dt == IR_BF16; }

/* Records constant v under an HF name; a [in, out] MatMul operand is stored transposed
 * as the [out, in] the template expects. */
static void add_weight(lm *L, const char *hf, const char *v, bool transpose) {
  onnx_dense t;
  if (L->st != IR_OK) return;
  if (!const_tensor(L, v, &t) || !float_dtype(t.dt) || t.rank > 2) {
    fail(L, "'%s' (%s) is not a constant f32/f16/bf16 tensor", v, hf);
    return;
  }
  if (t.owned && !keep(L, t.owned)) free(t.owned), t.data = NULL;
  lm_weight *w = new_weight(L, hf);
  if (!w || !t.data) {
    L->st = ir_diag_set(L->d, IR_OOM, "out of memory");
    return;
  }
  w->t = (model_tensor){.dtype = t.dt, .rank = t.rank, .data = t.data, .nbytes = t.nbytes};
  for (int i = 0; i < t.rank; i++) w->t.shape[i] = t.shape[i];
  if (!transpose || t.rank != 2) return;
  size_t es = (size_t)ir_dtype_bytes(t.dt, 1), r = (size_t)t.shape[0], c = (size_t)t.shape[1];
  uint8_t *dst = malloc(t.nbytes ? t.nbytes : 1);
  if (!dst || !keep(L, dst)) {
    free(dst);
    L->st = ir_diag_set(L->d, IR_OOM, "out of memory");
    return;
  }
  const uint8_t *src = t.data;
  for (size_t i = 0; i < r; i++)
    for (size_t j = 0; j < c; j++) memcpy(dst + (j * r + i) * es, src + (i * c + j) * es, es);
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
  if (!const_tensor(L, v, &t)) return -1;
  memcpy(shape, t.shape, sizeof t.shape);
  free(t.owned);
  return t.rank;
}

/* --- patterns ---------------------------------------------------------------------------- */

/* mean(x^2, last axis) + eps; eps into *eps. */
static bool match_mean_sq(lm *L, const char *a, const char *x, double *eps) {
  node_t *add = producer(L, skip(L, a)), *mean = NULL;
  if (!is_op(add, "Add")) return false;
  for (int k = 0; k < 2 && !mean; k++)
    if (const_scalar(L, in(add, (size_t)k), eps)) mean = producer(L, skip(L, in(add, 1 - (size_t)k)));
  if (!is_op(mean, "ReduceMean")) return false;
  node_t *sq = producer(L, skip(L, in(mean, 0)));
  double two;
  if (is_op(sq, "Pow")) return same(L, in(sq, 0), x) && const_scalar(L, in(sq, 1), &two) && two == 2;
  return is_op(sq, "Mul") && same(L, in(sq, 0), x) && same(L, in(sq, 1), x);
}

/* x * 1/sqrt(mean(x^2) + eps) as Mul(x, Div(1, Sqrt)) / Mul(x, Reciprocal(Sqrt)) or
 * Div(x, Sqrt). */
static bool match_normalize(lm *L, const char *y, const char *x, double *eps) {
  node_t *n = producer(L, skip(L, y));
  if (is_op(n, "Div")) {
    node_t *sq = producer(L, skip(L, in(n, 1)));
    return same(L, in(n, 0), x) && is_op(sq, "Sqrt") && match_mean_sq(L, in(sq, 0), x, eps);
  }
  if (!is_op(n, "Mul")) return false;
  for (size_t k = 0; k < 2; k++) {
    if (!same(L, in(n, k), x)) continue;
    node_t *r = producer(L, skip(L, in(n, 1 - k)));
    double one;
    const char *s = NULL;
    if (is_op(r, "Reciprocal")) s = in(r, 0);
    else if (is_op(r, "Div") && const_scalar(L, in(r, 0), &one) && one == 1.0) s = in(r, 1);
    node_t *sq = s ? producer(L, skip(L, s)) : NULL;
    if (is_op(sq, "Sqrt") && match_mean_sq(L, in(sq, 0), x, eps)) return true;
  }
  return false;
}

/* RMSNorm of x: the next Mul by a [H] constant whose other operand normalizes x. Records
 * the weight as `hf`; returns the normalized output (NULL with L->st set). */
static const char *match_norm(lm *L, const char *x, const char *hf) {
  int64_t H = L->p.hidden_size, shape[IR_MAX_RANK];
  for (size_t i = L->pos; i < L->gp->n_node; i++) {
    node_t *n = L->gp->node[i];
    if (!is_op(n, "Mul")) continue;
    for (size_t k = 0; k < 2; k++) {
      if (const_shape(L, in(n, k), shape) != 1 || shape[0] != H) continue;
      double eps;
      if (!match_normalize(L, in(n, 1 - k), x, &eps)) continue;
      if (L->p.rms_norm_eps > 0 && fabs(eps - L->p.rms_norm_eps) > 1e-12 * (1 + eps)) {
        fail(L, "RMSNorm eps %g differs from the first norm's %g", eps, L->p.rms_norm_eps);
        return NULL;
      }
      L->p.rms_norm_eps = eps;
      add_weight(L, hf, in(n, k), false);
      L->pos = i + 1;
      return n->output[0];
    }
  }
  fail(L, "no RMSNorm (x * 1/sqrt(mean(x^2) + eps) * weight[%lld]) of the residual stream "
          "after node %zu", (long long)H, L->pos);
  return NULL;
}

/* MatMuls at or after L->pos taking x with a constant 2-D right operand (at most max). */
static int proj_nodes(lm *L, const char *x, int *idx, int max) {
  int n = 0;
  int64_t shape[IR_MAX_RANK];
  for (int i = consumer(L, x, "MatMul", L->pos); i >= 0 && n < max;
       i = consumer(L, x, "MatMul", (size_t)i + 1))
    if (same(L, in(L->gp->node[i], 0), x) && const_shape(L, in(L->gp->node[i], 1), shape) == 2)
      idx[n++] = i;
  return n;
}

static int64_t proj_width(lm *L, int i) {
  int64_t shape[IR_MAX_RANK];
  const_shape(L, in(L->gp->node[i], 1), shape);
  return shape[1];
}

static int64_t proj_in(lm *L, int i) {
  int64_t shape[IR_MAX_RANK];
  const_shape(L, in(L->gp->node[i], 1), shape);
  return shape[0];
}

/* A projection's output, through a bias Add by a [width] constant when there is one
 * (recorded as `hf_bias`, or refused when hf_bias is NULL). */
static const char *proj_out(lm *L, int i, const char *hf_bias, bool *has_bias) {
  const char *y = L->gp->node[i]->output[0];
  int64_t shape[IR_MAX_RANK];
  int a = consumer(L, y, "Add", (size_t)i + 1);
  *has_bias = false;
  if (a < 0) return y;
  node_t *n = L->gp->node[a];
  for (size_t k = 0; k < 2; k++)
    if (same(L, in(n, 1 - k), y) && const_shape(L, in(n, k), shape) == 1 &&
        shape[0] == proj_width(L, i)) {
      if (!hf_bias) {
        fail(L, "projection '%s' has a bias the Llama template lacks", L->gp->node[i]->name);
        return NULL;
      }
      add_weight(L, hf_bias, in(n, k), false);
      *has_bias = true;
      return n->output[0];
    }
  return y;
}

/* The table operand of a rope Mul: cos(pos * inv_freq) (times a scaling of 1). Checks the
 * inverse frequencies are theta^(-2i/d) and sets rope_theta. */
static bool match_rope_table(lm *L, const char *t, int64_t half) {
  node_t *n = producer(L, movement_src(L, t));
  double s;
  while (is_op(n, "Mul")) {
    size_t k = const_scalar(L, in(n, 1), &s) ? 0 : const_scalar(L, in(n, 0), &s) ? 1 : 2;
    if (k == 2 || s != 1.0) return false;
    n = producer(L, movement_src(L, in(n, k)));
  }
  if (!is_op(n, "Cos") && !is_op(n, "Sin")) return false;
  node_t *cat = producer(L, movement_src(L, in(n, 0)));
  if (!is_op(cat, "Concat") || cat->n_input != 2) return false;
  node_t *mm = producer(L, movement_src(L, in(cat, 0)));
  if (!is_op(mm, "MatMul") && !is_op(mm, "Mul")) return false;
  double inv[512];
  int cnt = 0;
  for (size_t k = 0; k < 2 && cnt != half; k++)
    if (!const_values(L, in(mm, k), inv, 512, &cnt)) cnt = 0;
  if (cnt != half || half < 2) return false;
  double theta = pow(inv[1], -(double)half);
  for (int64_t i = 0; i < half; i++) {
    double want = (float)(1.0 / pow(theta, (double)(2 * i) / (double)(2 * half)));
    if (fabs(inv[i] - want) > 1e-5 * want) return false;
  }
  L->p.rope_theta = round(theta * 1e3) / 1e3;
  return true;
}

/* rotate_half(x) = Concat(-x[..., d/2:], x[..., :d/2]): the source x and d/2. */
static bool match_rotate_half(lm *L, const char *v, const char **x, int64_t *half) {
  node_t *cat = producer(L, skip(L, v));
  if (!is_op(cat, "Concat") || cat->n_input != 2) return false;
  node_t *neg = producer(L, skip(L, in(cat, 0))), *s1, *s2;
  if (!is_op(neg, "Neg")) return false;
  s2 = producer(L, skip(L, in(neg, 0)));
  s1 = producer(L, skip(L, in(cat, 1)));
  double start;
  if (!is_op(s1, "Slice") || !is_op(s2, "Slice") || !same(L, in(s1, 0), in(s2, 0)) ||
      !const_scalar(L, in(s2, 1), &start))
    return false;
  *x = in(s1, 0);
  *half = (int64_t)start;
  return true;
}

/* RoPE of the projection output `p`: Add(Mul(x, cos), Mul(rotate_half(x), sin)) where x
 * is p reshaped into heads. `v` is the attention operand (through repeat_kv/transposes). */
static bool match_rope(lm *L, const char *v, const char *p, int64_t *half) {
  node_t *add = producer(L, movement_src(L, v));
  if (!is_op(add, "Add")) return false;
  const char *x = NULL, *rx = NULL, *cos = NULL;
  for (size_t k = 0; k < 2; k++) {
    node_t *mul = producer(L, skip(L, in(add, k)));
    if (!is_op(mul, "Mul")) return false;
    for (size_t j = 0; j < 2; j++) {
      const char *h;
      if (match_rotate_half(L, in(mul, j), &h, half)) rx = h;
      else if (!strcmp(movement_src(L, in(mul, j)), p)) x = in(mul, j), cos = in(mul, 1 - j);
    }
  }
  if (!x || !rx || !same(L, x, rx)) return false;
  if (L->p.rope_theta > 0) return true;
  return match_rope_table(L, cos, *half);
}
