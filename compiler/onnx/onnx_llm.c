/* onnx_llm: recognises the Llama decoder in an exported causal-LM graph
 * (walking the ONNX nodes by data flow) and rebuilds it with the Llama template
 * over the paged KV cache. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infc_hfconfig.h"
#include "infc_onnx_genai.h"
#include "infc_onnx_llm.h"
#include "infc_util.h"
#include "onnx_llm_internal.h"
#include "ir_alloc.h"

/* --- weights ------------------------------------------------------------------------- */

static bool keep(lm *L, void *buf) {
  if (L->n_owned == L->cap_owned) {
    int cap = L->cap_owned ? 2 * L->cap_owned : 32;
    void **o = ir_realloc(L->owned, (size_t)cap * sizeof *o);
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
    lm_weight *w = ir_realloc(L->w, (size_t)cap * sizeof *w);
    if (!w) return NULL;
    L->w = w;
    L->cap_w = cap;
  }
  lm_weight *w = &L->w[L->n_w++];
  snprintf(w->name, sizeof w->name, "%s", name);
  return w;
}

static bool float_dtype(ir_dtype dt) { return dt == IR_F32 || dt == IR_F16 || dt == IR_BF16; }

/* Records constant v under an HF name; a [in, out] MatMul operand is stored
 * transposed as the [out, in] the template expects. */
static void add_weight(lm *L, const char *hf, const char *v, bool transpose) {
  onnx_dense t;
  if (L->st != IR_OK) return;
  if (!lm_const_tensor(L, v, &t) || !float_dtype(t.dt) || t.rank > 2) {
    lm_fail(L, "'%s' (%s) is not a constant f32/f16/bf16 tensor", v, hf);
    return;
  }
  if (t.owned && !keep(L, t.owned)) ir_free(t.owned), t.data = NULL;
  lm_weight *w = new_weight(L, hf);
  if (!w || !t.data) {
    L->st = ir_diag_set(L->d, IR_OOM, "out of memory");
    return;
  }
  w->t = (model_tensor){.dtype = t.dt, .rank = t.rank, .data = t.data, .nbytes = t.nbytes};
  for (int i = 0; i < t.rank; i++) w->t.shape[i] = t.shape[i];
  if (!transpose || t.rank != 2) return;
  size_t es = (size_t)ir_dtype_bytes(t.dt, 1), r = (size_t)t.shape[0], c = (size_t)t.shape[1];
  uint8_t *dst = ir_malloc(t.nbytes ? t.nbytes : 1);
  if (!dst || !keep(L, dst)) {
    ir_free(dst);
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

/* --- patterns ------------------------------------------------------------------------ */

/* mean(x^2, last axis) + eps; eps into *eps. */
static bool match_mean_sq(lm *L, const char *a, const char *x, double *eps) {
  node_t *add = lm_producer(L, lm_skip(L, a)), *mean = NULL;
  if (!lm_is_op(add, "Add")) return false;
  for (int k = 0; k < 2 && !mean; k++)
    if (lm_const_scalar(L, lm_in(add, (size_t)k), eps))
      mean = lm_producer(L, lm_skip(L, lm_in(add, 1 - (size_t)k)));
  if (!lm_is_op(mean, "ReduceMean")) return false;
  node_t *sq = lm_producer(L, lm_skip(L, lm_in(mean, 0)));
  double two;
  if (lm_is_op(sq, "Pow"))
    return lm_same(L, lm_in(sq, 0), x) && lm_const_scalar(L, lm_in(sq, 1), &two) && two == 2;
  return lm_is_op(sq, "Mul") && lm_same(L, lm_in(sq, 0), x) && lm_same(L, lm_in(sq, 1), x);
}

/* x * 1/sqrt(mean(x^2) + eps) as Mul(x, Div(1, Sqrt)) / Mul(x,
 * Reciprocal(Sqrt)) or Div(x, Sqrt). */
static bool match_normalize(lm *L, const char *y, const char *x, double *eps) {
  node_t *n = lm_producer(L, lm_skip(L, y));
  if (lm_is_op(n, "Div")) {
    node_t *sq = lm_producer(L, lm_skip(L, lm_in(n, 1)));
    return lm_same(L, lm_in(n, 0), x) && lm_is_op(sq, "Sqrt") &&
           match_mean_sq(L, lm_in(sq, 0), x, eps);
  }
  if (!lm_is_op(n, "Mul")) return false;
  for (size_t k = 0; k < 2; k++) {
    if (!lm_same(L, lm_in(n, k), x)) continue;
    node_t *r = lm_producer(L, lm_skip(L, lm_in(n, 1 - k)));
    double one;
    const char *s = NULL;
    if (lm_is_op(r, "Reciprocal")) s = lm_in(r, 0);
    else if (lm_is_op(r, "Div") && lm_const_scalar(L, lm_in(r, 0), &one) && one == 1.0)
      s = lm_in(r, 1);
    node_t *sq = s ? lm_producer(L, lm_skip(L, s)) : NULL;
    if (lm_is_op(sq, "Sqrt") && match_mean_sq(L, lm_in(sq, 0), x, eps)) return true;
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
    if (!lm_is_op(n, "Mul")) continue;
    for (size_t k = 0; k < 2; k++) {
      if (lm_const_shape(L, lm_in(n, k), shape) != 1 || shape[0] != H) continue;
      double eps;
      if (!match_normalize(L, lm_in(n, 1 - k), x, &eps)) continue;
      if (L->p.rms_norm_eps > 0 && fabs(eps - L->p.rms_norm_eps) > 1e-12 * (1 + eps)) {
        lm_fail(L, "RMSNorm eps %g differs from the first norm's %g", eps, L->p.rms_norm_eps);
        return NULL;
      }
      L->p.rms_norm_eps = eps;
      add_weight(L, hf, lm_in(n, k), false);
      L->pos = i + 1;
      return n->output[0];
    }
  }
  lm_fail(L,
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
  for (int i = lm_consumer(L, x, "MatMul", L->pos); i >= 0 && n < max;
       i = lm_consumer(L, x, "MatMul", (size_t)i + 1))
    if (lm_same(L, lm_in(L->gp->node[i], 0), x) &&
        lm_const_shape(L, lm_in(L->gp->node[i], 1), shape) == 2)
      idx[n++] = i;
  return n;
}

static int64_t proj_width(lm *L, int i) {
  int64_t shape[IR_MAX_RANK] = {0};
  lm_const_shape(L, lm_in(L->gp->node[i], 1), shape);
  return shape[1];
}

static int64_t proj_in(lm *L, int i) {
  int64_t shape[IR_MAX_RANK] = {0};
  lm_const_shape(L, lm_in(L->gp->node[i], 1), shape);
  return shape[0];
}

/* The bias Add after projection node i: an Add of its output and a [width] constant.
 * Returns the Add's node index (and in *out_k the operand holding the bias), or -1. */
static int bias_add(lm *L, int i, size_t *out_k) {
  const char *y = L->gp->node[i]->output[0];
  int64_t shape[IR_MAX_RANK] = {0};
  int a = lm_consumer(L, y, "Add", (size_t)i + 1);
  if (a < 0) return -1;
  node_t *n = L->gp->node[a];
  for (size_t k = 0; k < 2; k++)
    if (lm_same(L, lm_in(n, 1 - k), y) && lm_const_shape(L, lm_in(n, k), shape) == 1 &&
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
  if (a < 0) return L->gp->node[i]->output[0];
  if (!hf_bias) {
    lm_fail(L, "projection '%s' has a bias the Llama template lacks",
            L->gp->node[i]->name ? L->gp->node[i]->name : "?");
    return NULL;
  }
  add_weight(L, hf_bias, lm_in(L->gp->node[a], k), false);
  *has_bias = true;
  return L->gp->node[a]->output[0];
}

/* The projection's output, through its bias Add if any (not recorded). */
static const char *proj_value(lm *L, int i) {
  size_t k = 0;
  int a = bias_add(L, i, &k);
  return a < 0 ? L->gp->node[i]->output[0] : L->gp->node[a]->output[0];
}

/* Softmax(Q·Kᵀ · scale + mask)·V: the nodes of Q·Kᵀ and of P·V; checks scale
 * and mask. */
static bool match_sdpa(lm *L, int *qk_out, int *pv_out) {
  int sm = lm_find_op(L, "Softmax", L->pos);
  if (sm < 0) return lm_fail(L, "no attention Softmax"), false;
  int pv = lm_consumer(L, L->gp->node[sm]->output[0], "MatMul", (size_t)sm + 1);
  node_t *add = lm_producer(L, lm_skip(L, lm_in(L->gp->node[sm], 0))), *sc = NULL;
  if (!lm_is_op(add, "Add"))
    return lm_fail(L, "attention softmax without a causal mask add"), false;
  size_t mk = 0;
  for (size_t k = 0; k < 2 && !sc; k++) {
    node_t *n = lm_producer(L, lm_skip(L, lm_in(add, k)));
    if (lm_is_op(n, "Div") || lm_is_op(n, "Mul")) sc = n, mk = 1 - k;
  }
  double c;
  if (!sc || !lm_const_scalar(L, lm_in(sc, 1), &c))
    return lm_fail(L, "attention scores are not scaled by a constant"), false;
  if (!lm_has_ancestor(L, lm_in(add, mk), "Trilu", 16) &&
      !lm_has_ancestor(L, lm_in(add, mk), "Less", 16) &&
      !lm_has_ancestor(L, lm_in(add, mk), "Greater", 16))
    return lm_fail(L, "the attention mask is not a causal (triangular) mask"), false;
  node_t *qk = lm_producer(L, lm_skip(L, lm_in(sc, 0)));
  int qi = qk ? lm_lookup(L, qk->output[0])->idx : -1;
  if (!lm_is_op(qk, "MatMul") || pv < 0) return lm_fail(L, "no Q·Kᵀ / P·V MatMuls"), false;
  double scale = lm_is_op(sc, "Div") ? 1.0 / c : c;
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
    add_weight(L, w, lm_in(L->gp->node[qkv[j]], 1), true);
    proj_out(L, qkv[j], b, &bias[j]);
  }
  if (bias[0] != bias[1] || bias[0] != bias[2]) lm_fail(L, "only some of q/k/v carry a bias");
  if (L->layer == 0) L->p.attention_bias = bias[0];
  else if (L->p.attention_bias != bias[0]) lm_fail(L, "q/k/v bias differs between layers");
}

/* Assigns q, k, v among the three projections of h; sets head sizes. */
static bool classify_qkv(lm *L, const int *idx, int qk, int pv, int *qkv) {
  int v = -1;
  const char *vs = lm_kv_new(L, lm_in(L->gp->node[pv], 1));
  for (int j = 0; vs && j < 3; j++)
    if (!strcmp(vs, proj_value(L, idx[j]))) v = idx[j];
  if (v < 0)
    return lm_fail(L, "the P·V MatMul does not read the v projection (or a past-KV "
                      "Concat of it)"),
           false;
  int64_t half = 0, h2 = 0;
  qkv[2] = v;
  qkv[0] = qkv[1] = -1;
  for (int j = 0; j < 3; j++) {
    if (idx[j] == v) continue;
    if (lm_match_rope(L, lm_in(L->gp->node[qk], 0), proj_value(L, idx[j]), &half)) qkv[0] = idx[j];
    else if (lm_match_rope(L, lm_in(L->gp->node[qk], 1), proj_value(L, idx[j]), &h2))
      qkv[1] = idx[j];
  }
  if (qkv[0] < 0 || qkv[1] < 0 || half != h2)
    return lm_fail(L, "q and k are not rotated by RoPE (rotate-half or adjacent pairs, by "
                      "cos/sin of position * theta^(-2i/d) laid out to match; scaled RoPE "
                      "is not recognised)"),
           false;
  int64_t hd = 2 * half, qw = proj_width(L, qkv[0]), kw = proj_width(L, qkv[1]);
  if (hd <= 0 || qw % hd || kw % hd || proj_width(L, v) != kw)
    return lm_fail(L, "q/k/v widths %lld/%lld/%lld do not split into heads of %lld", (long long)qw,
                   (long long)kw, (long long)proj_width(L, v), (long long)hd),
           false;
  double scale = L->scale;
  if (fabs(scale * sqrt((double)hd) - 1) > 1e-5)
    return lm_fail(L, "attention scale %g is not 1/sqrt(head_dim %lld)", scale, (long long)hd),
           false;
  if (L->layer > 0 &&
      (hd != L->p.head_dim || qw / hd != L->p.n_heads || kw / hd != L->p.n_kv_heads))
    return lm_fail(L, "head layout differs from layer 0"), false;
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
    if (!lm_is_op(n, "MatMul") || strcmp(lm_movement_src(L, lm_in(n, 0)), att) ||
        lm_const_shape(L, lm_in(n, 1), shape) != 2)
      continue;
    char w[96];
    bool bias;
    layer_name(w, sizeof w, L->layer, "self_attn.o_proj.weight");
    add_weight(L, w, lm_in(n, 1), true);
    const char *o = proj_out(L, (int)i, NULL, &bias);
    int a = o ? lm_consumer(L, o, "Add", i + 1) : -1;
    if (a < 0 ||
        !(lm_same(L, lm_in(L->gp->node[a], 0), x) || lm_same(L, lm_in(L->gp->node[a], 1), x))) {
      lm_fail(L, "no residual add after o_proj");
      return NULL;
    }
    L->pos = (size_t)a + 1;
    return L->gp->node[a]->output[0];
  }
  lm_fail(L, "no o_proj MatMul on the attention output");
  return NULL;
}

static const char *match_attention(lm *L, const char *x, const char *h) {
  int idx[4], qk, pv, qkv[3];
  if (proj_nodes(L, h, idx, 4) != 3) {
    lm_fail(L, "expected q/k/v projections of the attention norm");
    return NULL;
  }
  if (!match_sdpa(L, &qk, &pv) || !classify_qkv(L, idx, qk, pv, qkv)) return NULL;
  record_qkv(L, qkv);
  return L->st == IR_OK ? match_o_residual(L, pv, x) : NULL;
}

/* down(silu(gate(h)) * up(h)) + x, silu as x * Sigmoid(x). */
static const char *match_mlp(lm *L, const char *x, const char *h) {
  int idx[3], gate = -1, up = -1;
  if (proj_nodes(L, h, idx, 3) != 2) {
    lm_fail(L, "expected gate/up projections of the MLP norm");
    return NULL;
  }
  for (int j = 0; j < 2; j++) {
    if (lm_consumer(L, L->gp->node[idx[j]]->output[0], "Sigmoid", L->pos) >= 0) gate = idx[j];
    else up = idx[j];
  }
  const char *g = gate >= 0 ? L->gp->node[gate]->output[0] : NULL;
  int sg = g ? lm_consumer(L, g, "Sigmoid", L->pos) : -1;
  int silu = sg >= 0 ? lm_consumer(L, L->gp->node[sg]->output[0], "Mul", (size_t)sg + 1) : -1;
  int prod = silu >= 0 && up >= 0
                 ? lm_consumer(L, L->gp->node[silu]->output[0], "Mul", (size_t)silu + 1)
                 : -1;
  int down =
      prod >= 0 ? lm_consumer(L, L->gp->node[prod]->output[0], "MatMul", (size_t)prod + 1) : -1;
  if (down < 0 || (!lm_same(L, lm_in(L->gp->node[prod], 0), L->gp->node[up]->output[0]) &&
                   !lm_same(L, lm_in(L->gp->node[prod], 1), L->gp->node[up]->output[0]))) {
    lm_fail(L, "the MLP is not SwiGLU (down(silu(gate) * up))");
    return NULL;
  }
  const char *names[3] = {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
  int nodes[3] = {gate, up, down};
  for (int j = 0; j < 3; j++) {
    char w[96];
    bool bias;
    layer_name(w, sizeof w, L->layer, names[j]);
    add_weight(L, w, lm_in(L->gp->node[nodes[j]], 1), true);
    if (!proj_out(L, nodes[j], NULL, &bias)) return NULL;
  }
  L->p.intermediate_size = proj_width(L, gate);
  int a = lm_consumer(L, L->gp->node[down]->output[0], "Add", (size_t)down + 1);
  if (a < 0 ||
      !(lm_same(L, lm_in(L->gp->node[a], 0), x) || lm_same(L, lm_in(L->gp->node[a], 1), x))) {
    lm_fail(L, "no residual add after down_proj");
    return NULL;
  }
  L->pos = (size_t)a + 1;
  return L->gp->node[a]->output[0];
}

static void rename_last(lm *L, int layer, const char *part) {
  if (L->st != IR_OK || !L->n_w) return;
  if (layer >= 0) layer_name(L->w[L->n_w - 1].name, sizeof L->w[0].name, layer, part);
  else snprintf(L->w[L->n_w - 1].name, sizeof L->w[0].name, "%s", part);
}

/* Final norm (already matched, output h) and lm_head feeding the "logits"
 * output. */
static void match_head(lm *L, int lm_head, const char *logits) {
  rename_last(L, -1, "model.norm.weight");
  if (proj_width(L, lm_head) != L->p.vocab_size)
    lm_fail(L, "lm_head width %lld differs from the vocabulary %lld",
            (long long)proj_width(L, lm_head), (long long)L->p.vocab_size);
  else if (strcmp(lm_movement_src(L, logits), L->gp->node[lm_head]->output[0]))
    lm_fail(L, "the logits output is not the lm_head MatMul");
  add_weight(L, "lm_head.weight", lm_in(L->gp->node[lm_head], 1), true);
  model_tensor emb, head;
  if (L->st != IR_OK || !lm_find(L, "model.embed_tokens.weight", &emb) ||
      !lm_find(L, "lm_head.weight", &head))
    return;
  /* The exporter stores a tied lm_head as its own transposed copy: share the embedding. */
  if (emb.dtype == head.dtype && emb.nbytes == head.nbytes &&
      !memcmp(emb.shape, head.shape, sizeof emb.shape) &&
      !memcmp(emb.data, head.data, emb.nbytes)) {
    L->p.tie_word_embeddings = true;
    L->n_w--;
  }
}

static void match_model(lm *L, const char *logits) {
  int64_t shape[IR_MAX_RANK] = {0};
  int e = lm_consumer(L, "input_ids", "Gather", 0);
  node_t *g = e >= 0 ? L->gp->node[e] : NULL;
  if (!g || !lm_same(L, lm_in(g, 1), "input_ids") || lm_const_shape(L, lm_in(g, 0), shape) != 2) {
    lm_fail(L, "no embedding Gather of a constant [vocab, hidden] table by input_ids");
    return;
  }
  L->p.vocab_size = shape[0];
  L->p.hidden_size = shape[1];
  add_weight(L, "model.embed_tokens.weight", lm_in(g, 0), false);
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
    if (h) x = match_attention(L, x, h);
    if (x) h = match_norm(L, x, "norm");
    rename_last(L, L->layer, "post_attention_layernorm.weight");
    if (x && h) x = match_mlp(L, x, h);
    L->p.n_layers = L->layer + 1;
  }
}

/* --- entry --------------------------------------------------------------------------- */

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
  if (!infc_path_join(cfg, sizeof cfg, dir, "config.json") || !infc_file_exists(cfg) ||
      infc_hfconfig_load(cfg, &c, &ignore) != IR_OK)
    return;
  L->p.max_position = c.max_position;
  L->p.bos_token_id = c.bos_token_id;
  L->p.eos_token_id = c.eos_token_id;
}

static void describe(const lm *L, char *out) {
  const model_llama_params *p = &L->p;
  const char *kind = p->n_kv_heads == p->n_heads ? "MHA" : p->n_kv_heads == 1 ? "MQA" : "GQA";
  snprintf(out, INFC_ONNX_LLM_RECOGNISED,
           "%lld attention blocks -> paged attention, %s %lld/%lld, head_dim %lld%s; %s"
           "RoPE %s theta=%g%s; RMSNorm eps=%g; SwiGLU %lld; causal mask; vocab %lld%s",
           (long long)p->n_layers, kind, (long long)p->n_heads, (long long)p->n_kv_heads,
           (long long)p->head_dim, p->attention_bias ? ", q/k/v bias" : "",
           L->n_past ? "past-KV concat -> paged KV (present.* dropped); " : "",
           p->rope_interleaved ? "interleaved" : "rotate-half", p->rope_theta,
           L->rope_cached ? " (cached table)" : "", p->rms_norm_eps,
           (long long)p->intermediate_size, (long long)p->vocab_size,
           p->tie_word_embeddings ? ", lm_head tied" : "");
}

/* Dim k of graph input vi when it is a fixed number, else -1. */
static int64_t input_dim(const Onnx__ValueInfoProto *vi, size_t k) {
  const Onnx__TypeProto *t = vi->type;
  const Onnx__TensorShapeProto *sh =
      t && t->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && t->tensor_type
          ? t->tensor_type->shape
          : NULL;
  if (!sh || k >= sh->n_dim || !sh->dim[k] ||
      sh->dim[k]->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
    return -1;
  return sh->dim[k]->dim_value;
}

/* A past-KV input: [batch, kv_heads, past, head_dim] where its dims are fixed. */
static void check_past_input(lm *L, const Onnx__ValueInfoProto *vi) {
  int64_t h = input_dim(vi, 1), hd = input_dim(vi, 3);
  if ((h >= 0 && h != L->p.n_kv_heads) || (hd >= 0 && hd != L->p.head_dim))
    lm_fail(L, "past-KV input '%s' is not [batch, %lld kv heads, past, %lld]", vi->name,
            (long long)L->p.n_kv_heads, (long long)L->p.head_dim);
}

/* Every graph input is token ids, the mask, positions or a matched past KV; every output
 * the logits or a matched present KV (dropped: the KV lives in the paged cache). */
static void check_io(lm *L, const char *logits) {
  L->layer = -1;
  if (L->n_past && L->n_past != 2 * L->p.n_layers)
    lm_fail(L, "%d past-KV Concats for %lld layers (expected a key and a value per layer)",
            L->n_past, (long long)L->p.n_layers);
  for (size_t i = 0; L->st == IR_OK && i < L->gp->n_input; i++) {
    const Onnx__ValueInfoProto *vi = L->gp->input[i];
    const char *name = vi->name ? vi->name : "";
    bool past = false;
    for (int k = 0; k < L->n_past; k++) past |= !strcmp(L->past[2 * k], name);
    if (past) check_past_input(L, vi);
    else if (strcmp(name, "input_ids") && strcmp(name, "attention_mask") &&
             strcmp(name, "position_ids"))
      lm_fail(L,
              "graph input '%s' is none of input_ids, attention_mask, position_ids or "
              "a past-KV input the attention concatenates",
              name);
  }
  for (size_t i = 0; L->st == IR_OK && i < L->gp->n_output; i++) {
    const char *o = L->gp->output[i]->name ? L->gp->output[i]->name : "";
    bool present = !strcmp(o, logits);
    for (int k = 0; k < L->n_past; k++) present |= lm_same(L, o, L->past[2 * k + 1]);
    if (!present) lm_fail(L, "graph output '%s' is neither the logits nor a present KV", o);
  }
}

static ir_status build(lm *L, const char *path, const model_build_opts *bo, ir_graph **out) {
  read_config_beside(L, path);
  snprintf(L->p.arch, sizeof L->p.arch, "llama");
  model_tensor_src src = {.ctx = L, .find = lm_find};
  ir_status st = model_llama_build(&L->p, &src, bo, out, L->d);
  for (int i = 0; st == IR_OK && i < L->n_owned; i++) {
    void *buf = L->owned[i];
    L->owned[i] = NULL;
    if (!ir_graph_adopt(*out, buf)) st = ir_diag_set(L->d, IR_OOM, "out of memory");
  }
  if (st != IR_OK) {
    ir_graph_destroy(*out);
    *out = NULL;
  }
  return st;
}

/* Whether every graph input has fixed dims, as the generic importer needs. */
static bool static_inputs(const Onnx__GraphProto *gp) {
  for (size_t i = 0; i < gp->n_input; i++) {
    const Onnx__TypeProto *t = gp->input[i]->type;
    const Onnx__TensorShapeProto *sh =
        t && t->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && t->tensor_type
            ? t->tensor_type->shape
            : NULL;
    if (!sh) return false;
    for (size_t k = 0; k < sh->n_dim; k++)
      if (input_dim(gp->input[i], k) < 0) return false;
  }
  return true;
}

/* A causal LM graph whose decoder was not matched (d says where): with fixed input dims
 * it still runs in generic mode (recognised says why it is not a servable LLM); with
 * symbolic ones it cannot, and that is the error. */
static ir_status not_servable(const Onnx__GraphProto *gp, const char *path, char *recognised,
                              ir_diag *d) {
  if (static_inputs(gp)) {
    snprintf(recognised, INFC_ONNX_LLM_RECOGNISED,
             "generic graph for `inferrt run`, not a servable LLM: %.200s", d->msg);
    *d = (ir_diag){0};
    return IR_OK;
  }
  ir_diag_prefix(d,
                 "%s: a causal LM graph (input_ids -> logits) that infc cannot serve as an "
                 "LLM plan, nor run in generic mode (its input dims are symbolic)",
                 path);
  return IR_UNSUPPORTED;
}

static void lm_free(lm *L) {
  for (int i = 0; i < L->n_owned; i++) ir_free(L->owned[i]);
  ir_free(L->owned);
  ir_free(L->w);
  ir_free(L->map);
  ir_free((void *)L->past);
}

ir_status infc_onnx_llm_import(const char *path, const model_build_opts *bo, bool *out_is_lm,
                               infc_onnx **out_model, ir_graph **out_graph, char *out_hash,
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
  const Onnx__GraphProto *gp = m->model->graph;
  if (!is_causal_lm(gp, &logits)) {
    snprintf(recognised, INFC_ONNX_LLM_RECOGNISED,
             "generic graph for `inferrt run`, not an LLM (no input_ids input and logits "
             "output)");
    infc_onnx_close(m);
    return IR_OK;
  }
  if (infc_onnx_genai_detect(m)) { /* ONNX Runtime GenAI builder output: onnx_genai.c */
    *out_is_lm = true;
    return infc_onnx_genai_import(m, path, bo, out_model, out_graph, out_hash, recognised, d);
  }
  lm L = {.m = m, .gp = gp, .d = d, .layer = -1, .st = IR_OK};
  L.past = ir_calloc(2 * gp->n_input + 2, sizeof *L.past);
  if (!L.past || !lm_build_map(&L)) L.st = ir_diag_set(d, IR_OOM, "out of memory");
  if (L.st == IR_OK) match_model(&L, logits);
  if (L.st == IR_OK) check_io(&L, logits);
  if (L.st == IR_UNSUPPORTED) {
    st = not_servable(gp, path, recognised, d);
  } else {
    *out_is_lm = true;
    st = L.st == IR_OK ? build(&L, path, bo, out_graph) : L.st;
  }
  if (st == IR_OK && *out_is_lm) {
    describe(&L, recognised);
    onnx_model_hash(m, out_hash);
    *out_model = m;
  }
  lm_free(&L);
  if (!*out_model) infc_onnx_close(m);
  return st;
}
