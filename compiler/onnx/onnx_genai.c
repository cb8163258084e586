/* onnx_genai: recognises the ONNX Runtime GenAI builder's decoder layer by layer,
 * following the data flow from input_ids to logits, and rebuilds it with the Llama
 * template over the paged KV cache. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infc_onnx_genai.h"
#include "infc_onnx_llm.h"
#include "onnx_genai.h"
#include "ir_alloc.h"

static bool is_ms(gx_node *n, const char *op) {
  return gx_is_op(n, op) && n->domain && !strcmp(n->domain, "com.microsoft");
}

bool infc_onnx_genai_detect(const infc_onnx *m) {
  const Onnx__GraphProto *gp = m && m->model ? m->model->graph : NULL;
  for (size_t i = 0; gp && i < gp->n_node; i++)
    if (is_ms(gp->node[i], "GroupQueryAttention")) return true;
  return false;
}

static void lname(char *buf, size_t len, int l, const char *part) {
  snprintf(buf, len, "model.layers.%d.%s", l, part);
}

/* --- norms --------------------------------------------------------------------------- */

/* The shortest decimal that reads back as the same float (1e-05, not 9.99999975e-06). */
static double tidy_eps(float f) {
  char buf[32];
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
    if ((float)strtod(buf, NULL) == f) return strtod(buf, NULL);
  }
  return f;
}

static bool norm_eps(gx *G, gx_node *n) {
  double eps = tidy_eps(gx_attr_f(n, "epsilon", 1e-5f));
  if (!(eps > 0))
    return gx_fail_node(G, n, IR_BAD_FORMAT, "attribute 'epsilon' = %g is not positive", eps),
           false;
  if (G->p.rms_norm_eps > 0 && G->p.rms_norm_eps != eps)
    return gx_fail_node(G, n, IR_UNSUPPORTED,
                        "attribute 'epsilon' = %g differs from the "
                        "first norm's %g",
                        eps, G->p.rms_norm_eps),
           false;
  G->p.rms_norm_eps = eps;
  return true;
}

/* RMSNorm of x: SimplifiedLayerNormalization (or ai.onnx RMSNormalization) reading x.
 * Records its scale as hf; returns its output. */
static const char *match_norm(gx *G, const char *x, const char *hf) {
  static const char *const known[] = {"axis", "epsilon", "stash_type", NULL};
  int i = gx_consumer(G, x, "SimplifiedLayerNormalization", 0, 0);
  if (i < 0) i = gx_consumer(G, x, "RMSNormalization", 0, 0);
  if (i < 0) {
    gx_fail(G, IR_UNSUPPORTED, "no SimplifiedLayerNormalization of '%s'", x);
    return NULL;
  }
  gx_node *n = G->gp->node[i];
  int64_t axis = gx_attr_i(n, "axis", -1), H = G->p.hidden_size;
  if (!gx_attrs_known(G, n, known) || !norm_eps(G, n)) return NULL;
  if (axis != -1 && axis != 2) {
    gx_fail_node(G, n, IR_UNSUPPORTED,
                 "attribute 'axis' = %lld is not supported (the "
                 "hidden dimension only)",
                 (long long)axis);
    return NULL;
  }
  gx_add_const(G, hf, gx_in(n, 1), 1, &H);
  return G->st == IR_OK ? gx_out(n, 0) : NULL;
}

static bool reads_pair(const gx *G, gx_node *n, const char *a, const char *b) {
  return (gx_same(G, gx_in(n, 0), a) && gx_same(G, gx_in(n, 1), b)) ||
         (gx_same(G, gx_in(n, 0), b) && gx_same(G, gx_in(n, 1), a));
}

/* x + b normalized: SkipSimplifiedLayerNormalization(x, b, gamma), or
 * SimplifiedLayerNormalization(Add(x, b)). Records gamma as hf; *out_sum gets the new
 * residual stream (NULL when the graph does not use it, as after the last layer). */
static const char *match_add_norm(gx *G, const char *x, const char *b, const char *hf,
                                  const char **out_sum) {
  static const char *const known[] = {"epsilon", NULL};
  int64_t H = G->p.hidden_size;
  *out_sum = NULL;
  for (size_t i = 0; x && b && i < G->gp->n_node; i++) {
    gx_node *n = G->gp->node[i];
    if (gx_is_op(n, "SkipSimplifiedLayerNormalization") && reads_pair(G, n, x, b)) {
      if (!gx_attrs_known(G, n, known) || !norm_eps(G, n)) return NULL;
      if (gx_in(n, 3)[0]) {
        gx_fail_node(G, n, IR_UNSUPPORTED, "input 3 (bias) is not supported");
        return NULL;
      }
      gx_add_const(G, hf, gx_in(n, 2), 1, &H);
      G->skip_norm = true;
      *out_sum = gx_out(n, 3)[0] ? gx_out(n, 3) : NULL;
      return G->st == IR_OK ? gx_out(n, 0) : NULL;
    }
    if (gx_is_op(n, "Add") && reads_pair(G, n, x, b)) {
      *out_sum = gx_out(n, 0);
      return match_norm(G, gx_out(n, 0), hf);
    }
  }
  gx_fail(G, IR_UNSUPPORTED,
          "no SkipSimplifiedLayerNormalization (or Add + "
          "SimplifiedLayerNormalization) of the residual stream and '%s'",
          b ? b : "?");
  return NULL;
}

/* --- projections --------------------------------------------------------------------- */

/* Projection nodes reading x as their input 0 (at most max). */
static int find_projs(gx *G, const char *x, gx_node **out, int max) {
  int cnt = 0;
  for (size_t i = 0; i < G->gp->n_node && cnt < max; i++) {
    gx_node *n = G->gp->node[i];
    if ((gx_is_op(n, "MatMul") || gx_is_op(n, "MatMulNBits")) && gx_same(G, gx_in(n, 0), x) &&
        gx_is_proj(G, n))
      out[cnt++] = n;
  }
  return cnt;
}

/* The projection producing v, through a bias Add by a constant vector (into *bias). */
static gx_node *proj_of(gx *G, const char *v, const char **bias) {
  gx_node *n = gx_producer(G, gx_skip(G, v));
  onnx_dense t;
  *bias = NULL;
  if (gx_is_op(n, "Add"))
    for (size_t k = 0; k < 2 && !*bias; k++)
      if (gx_const(G, gx_in(n, k), &t)) {
        ir_free(t.owned);
        *bias = gx_in(n, k);
        n = gx_producer(G, gx_skip(G, gx_in(n, 1 - k)));
      }
  return n && (gx_is_op(n, "MatMul") || gx_is_op(n, "MatMulNBits")) && gx_is_proj(G, n) ? n : NULL;
}

/* Records rows [r0, r0 + rows) of a bias vector of `total` values under hf. */
static void add_bias(gx *G, const char *hf, const char *v, int64_t total, int64_t r0,
                     int64_t rows) {
  onnx_dense t;
  if (G->st != IR_OK) return;
  bool ok = gx_const(G, v, &t);
  if (ok && (t.dt != IR_F32 || ir_nd_numel(t.rank, t.shape) != total)) {
    ir_free(t.owned);
    ok = false;
  }
  if (!ok) {
    gx_fail(G, IR_UNSUPPORTED, "bias '%s' is not a constant f32 vector of %lld", v,
            (long long)total);
    return;
  }
  if (t.owned && !gx_keep(G, t.owned)) {
    gx_fail(G, IR_OOM, "out of memory");
    return;
  }
  gx_add(G, hf, IR_F32, 1, &rows, (const float *)t.data + r0);
}

/* --- attention ----------------------------------------------------------------------- */

typedef struct gqa {
  gx_node *n;
  int64_t nh, nkv;
  bool rot, inter;
  bool by_node; /* q and k rotated by RotaryEmbedding nodes */
} gqa;

static bool gqa_kv_quant(gx *G, gx_node *n) {
  static const char *const names[] = {"k_quant_type", "v_quant_type"};
  for (int i = 0; i < 2; i++) {
    const Onnx__AttributeProto *a = gx_attr(n, names[i]);
    if (a && a->has_s && !(a->s.len == 4 && !memcmp(a->s.data, "NONE", 4)))
      return gx_fail_node(G, n, IR_UNSUPPORTED,
                          "attribute '%s' = '%.*s' is not supported "
                          "(a quantized KV cache)",
                          names[i], (int)a->s.len, a->s.data),
             false;
  }
  return true;
}

static bool gqa_inputs(gx *G, gx_node *n) {
  static const char *const extra[] = {"attention_bias", "head_sink"};
  if (n->n_input < 7 || !gx_in(n, 3)[0] || !gx_in(n, 4)[0] || !gx_in(n, 5)[0] || !gx_in(n, 6)[0])
    return gx_fail_node(G, n, IR_UNSUPPORTED,
                        "needs inputs past_key, past_value, seqlens_k "
                        "and total_sequence_length"),
           false;
  if (!gx_graph_input(G, gx_in(n, 3)) || !gx_graph_input(G, gx_in(n, 4)))
    return gx_fail_node(G, n, IR_UNSUPPORTED,
                        "past_key '%s' / past_value '%s' are not graph "
                        "inputs (the KV cache must be the model's state)",
                        gx_in(n, 3), gx_in(n, 4)),
           false;
  for (size_t i = 10; i < n->n_input; i++)
    if (n->input[i][0])
      return gx_fail_node(G, n, IR_UNSUPPORTED, "input %zu ('%s', %s) is not supported", i,
                          n->input[i], i < 12 ? extra[i - 10] : "unknown"),
             false;
  if (gx_out(n, 3)[0])
    return gx_fail_node(G, n, IR_UNSUPPORTED, "output 3 (output_qk) is not supported"), false;
  return true;
}

static bool gqa_check(gx *G, gx_node *n, gqa *a) {
  static const char *const known[] = {"num_heads",
                                      "kv_num_heads",
                                      "scale",
                                      "local_window_size",
                                      "softcap",
                                      "do_rotary",
                                      "rotary_interleaved",
                                      "smooth_softmax",
                                      "qk_output",
                                      "k_quant_type",
                                      "v_quant_type",
                                      "kv_cache_bit_width",
                                      NULL};
  if (!gx_attrs_known(G, n, known)) return false;
  a->n = n;
  a->nh = gx_attr_i(n, "num_heads", 0);
  a->nkv = gx_attr_i(n, "kv_num_heads", 0);
  if (a->nh <= 0 || a->nkv <= 0 || a->nh % a->nkv || a->nh > 4096)
    return gx_fail_node(G, n, IR_BAD_FORMAT,
                        "needs attributes 'num_heads' and 'kv_num_heads' "
                        "(positive, num_heads a multiple of kv_num_heads)"),
           false;
  if (!gx_attr_i_is(G, n, "local_window_size", -1, -1, "sliding-window attention") ||
      !gx_attr_f_is(G, n, "softcap", 0, 0, "attention logit softcapping") ||
      !gx_attr_i_is(G, n, "smooth_softmax", 0, 0, "smooth softmax") ||
      !gx_attr_i_is(G, n, "qk_output", 0, 0, "the QK output") || !gqa_kv_quant(G, n) ||
      !gqa_inputs(G, n))
    return false;
  a->rot = gx_attr_i(n, "do_rotary", 0) != 0;
  a->inter = gx_attr_i(n, "rotary_interleaved", 0) != 0;
  return true;
}

/* A com.microsoft (or ai.onnx opset 23) RotaryEmbedding over `heads` heads. */
static bool rope_node(gx *G, gx_node *r, int64_t heads, bool *inter) {
  static const char *const known_ms[] = {
      "interleaved", "num_heads", "rotary_embedding_dim", "scale", "is_packed_batching", NULL};
  static const char *const known_std[] = {"interleaved", "num_heads", "rotary_embedding_dim", NULL};
  bool ms = is_ms(r, "RotaryEmbedding");
  if (!gx_attrs_known(G, r, ms ? known_ms : known_std)) return false;
  int64_t rd = gx_attr_i(r, "rotary_embedding_dim", 0), nh = gx_attr_i(r, "num_heads", 0);
  if (rd != 0 && rd != G->p.head_dim)
    return gx_fail_node(G, r, IR_UNSUPPORTED,
                        "attribute 'rotary_embedding_dim' = %lld is not "
                        "supported (partial rotary)",
                        (long long)rd),
           false;
  if (nh != 0 && nh != heads)
    return gx_fail_node(G, r, IR_UNSUPPORTED,
                        "attribute 'num_heads' = %lld differs from the "
                        "attention's %lld",
                        (long long)nh, (long long)heads),
           false;
  if (ms && (!gx_attr_f_is(G, r, "scale", 1, 1, "scaled positions") ||
             !gx_attr_i_is(G, r, "is_packed_batching", 0, 0, "packed batching")))
    return false;
  const char *pos = gx_in(r, ms ? 1 : 3), *cos = gx_in(r, ms ? 2 : 1), *sin = gx_in(r, ms ? 3 : 2);
  onnx_dense t;
  if (!pos[0] || gx_const(G, pos, &t))
    return gx_fail_node(G, r, IR_UNSUPPORTED, "needs position_ids computed at run time"), false;
  *inter = gx_attr_i(r, "interleaved", 0) != 0;
  return gx_rope_caches(G, r, cos, sin);
}

static bool set_heads(gx *G, const gqa *a, int64_t hd) {
  if (G->layer > 0 && (hd != G->p.head_dim || a->nh != G->p.n_heads || a->nkv != G->p.n_kv_heads))
    return gx_fail_node(G, a->n, IR_UNSUPPORTED,
                        "head layout %lld/%lld x %lld differs from "
                        "layer 0",
                        (long long)a->nh, (long long)a->nkv, (long long)hd),
           false;
  G->p.head_dim = hd;
  G->p.n_heads = a->nh;
  G->p.n_kv_heads = a->nkv;
  float s = gx_attr_f(a->n, "scale", 0);
  if (s != 0 && fabs((double)s * sqrt((double)hd) - 1) > 1e-6)
    return gx_fail_node(G, a->n, IR_UNSUPPORTED,
                        "attribute 'scale' = %g is not supported "
                        "(1/sqrt(head_dim %lld) only)",
                        (double)s, (long long)hd),
           false;
  return true;
}

static void set_bias_flag(gx *G, bool bias) {
  if (G->layer == 0) G->p.attention_bias = bias;
  else if (G->p.attention_bias != bias)
    gx_fail(G, IR_UNSUPPORTED, "q/k/v bias differs between layers");
}

/* Packed QKV: one projection into GQA's query input, key and value empty. */
static bool attn_packed(gx *G, const gqa *a, const char *h) {
  const char *bias;
  gx_node *p = proj_of(G, gx_in(a->n, 0), &bias);
  gx_mat w;
  if (!p || !gx_same(G, gx_in(p, 0), h))
    return gx_fail_node(G, a->n, IR_UNSUPPORTED,
                        "query is not a projection of the input "
                        "norm"),
           false;
  if (!gx_mat_read(G, p, &w)) return false;
  int64_t per = a->nh + 2 * a->nkv, hd = w.n / per;
  if (w.n % per || w.k != G->p.hidden_size)
    return gx_fail_node(G, p, IR_UNSUPPORTED,
                        "packed QKV width %lld does not split into "
                        "%lld + 2 x %lld heads",
                        (long long)w.n, (long long)a->nh, (long long)a->nkv),
           false;
  if (!set_heads(G, a, hd)) return false;
  static const char *const nm[3] = {"q_proj", "k_proj", "v_proj"};
  int64_t r0[3] = {0, a->nh * hd, (a->nh + a->nkv) * hd},
          rows[3] = {a->nh * hd, a->nkv * hd, a->nkv * hd};
  char hf[96], part[48];
  for (int j = 0; j < 3; j++) {
    snprintf(part, sizeof part, "self_attn.%s.weight", nm[j]);
    lname(hf, sizeof hf, G->layer, part);
    gx_mat_add(G, hf, &w, r0[j], rows[j]);
    snprintf(part, sizeof part, "self_attn.%s.bias", nm[j]);
    lname(hf, sizeof hf, G->layer, part);
    if (bias) add_bias(G, hf, bias, w.n, r0[j], rows[j]);
  }
  set_bias_flag(G, bias != NULL);
  G->packed_qkv = true;
  return G->st == IR_OK;
}

/* Separate q/k/v projections, q and k possibly through RotaryEmbedding nodes. */
static bool attn_separate(gx *G, gqa *a, const char *h) {
  static const char *const nm[3] = {"q_proj", "k_proj", "v_proj"};
  gx_node *rope[3] = {NULL, NULL, NULL}, *p[3];
  const char *bias[3];
  gx_mat w[3];
  for (int j = 0; j < 3; j++) {
    const char *v = gx_in(a->n, (size_t)j);
    gx_node *r = gx_producer(G, gx_skip(G, v));
    if (j < 2 && gx_is_op(r, "RotaryEmbedding")) v = gx_in(rope[j] = r, 0);
    p[j] = proj_of(G, v, &bias[j]);
    if (!p[j] || !gx_same(G, gx_in(p[j], 0), h))
      return gx_fail_node(G, a->n, IR_UNSUPPORTED,
                          "input %d is not a projection of the input "
                          "norm",
                          j),
             false;
    if (!gx_mat_read(G, p[j], &w[j])) return false;
  }
  int64_t hd = w[0].n / a->nh;
  if (w[0].n % a->nh || w[1].n != a->nkv * hd || w[2].n != a->nkv * hd)
    return gx_fail_node(G, a->n, IR_UNSUPPORTED,
                        "q/k/v widths %lld/%lld/%lld do not split "
                        "into %lld/%lld heads",
                        (long long)w[0].n, (long long)w[1].n, (long long)w[2].n, (long long)a->nh,
                        (long long)a->nkv),
           false;
  if (!set_heads(G, a, hd)) return false;
  if ((rope[0] != NULL) != (rope[1] != NULL) || (rope[0] && a->rot))
    return gx_fail_node(G, a->n, IR_UNSUPPORTED,
                        "q and k must both be rotated once, by "
                        "RotaryEmbedding nodes or by do_rotary"),
           false;
  bool iq = false, ik = false;
  if (rope[0] && (!rope_node(G, rope[0], a->nh, &iq) || !rope_node(G, rope[1], a->nkv, &ik)))
    return false;
  if (iq != ik) return gx_fail(G, IR_UNSUPPORTED, "q and k RoPE differ in interleaving"), false;
  a->inter |= iq;
  a->by_node = rope[0] != NULL;
  G->rope_node |= a->by_node;
  if ((bias[0] != NULL) != (bias[1] != NULL) || (bias[0] != NULL) != (bias[2] != NULL))
    return gx_fail(G, IR_UNSUPPORTED, "only some of q/k/v carry a bias"), false;
  char hf[96], part[48];
  for (int j = 0; j < 3; j++) {
    snprintf(part, sizeof part, "self_attn.%s.weight", nm[j]);
    lname(hf, sizeof hf, G->layer, part);
    gx_mat_add(G, hf, &w[j], 0, w[j].n);
    snprintf(part, sizeof part, "self_attn.%s.bias", nm[j]);
    lname(hf, sizeof hf, G->layer, part);
    if (bias[j]) add_bias(G, hf, bias[j], w[j].n, 0, w[j].n);
  }
  set_bias_flag(G, bias[0] != NULL);
  return G->st == IR_OK;
}

/* Whether GQA node n's query comes from a projection of h. */
static bool gqa_reads(gx *G, gx_node *n, const char *h) {
  const char *v = gx_in(n, 0), *bias;
  gx_node *r = gx_producer(G, gx_skip(G, v));
  if (gx_is_op(r, "RotaryEmbedding")) v = gx_in(r, 0);
  gx_node *p = proj_of(G, v, &bias);
  return p && gx_same(G, gx_in(p, 0), h);
}

/* The attention block on the normed input h: returns the o_proj output. */
static const char *match_attention(gx *G, const char *h) {
  gqa a = {0};
  for (size_t i = 0; i < G->gp->n_node && !a.n; i++)
    if (is_ms(G->gp->node[i], "GroupQueryAttention") && gqa_reads(G, G->gp->node[i], h))
      a.n = G->gp->node[i];
  if (!a.n) {
    gx_fail(G, IR_UNSUPPORTED,
            "no GroupQueryAttention whose query is a projection of the "
            "input norm");
    return NULL;
  }
  if (!gqa_check(G, a.n, &a)) return NULL;
  bool packed = !gx_in(a.n, 1)[0] && !gx_in(a.n, 2)[0];
  if (!(packed ? attn_packed(G, &a, h) : attn_separate(G, &a, h))) return NULL;
  if (a.rot && !gx_rope_caches(G, a.n, gx_in(a.n, 7), gx_in(a.n, 8))) return NULL;
  if (!a.rot && !a.by_node) {
    gx_fail_node(G, a.n, IR_UNSUPPORTED,
                 "q and k are not rotated (no do_rotary, no "
                 "RotaryEmbedding): attention without RoPE is not supported");
    return NULL;
  }
  if (G->layer > 0 && G->p.rope_interleaved != a.inter) {
    gx_fail_node(G, a.n, IR_UNSUPPORTED, "RoPE interleaving differs from layer 0");
    return NULL;
  }
  G->p.rope_interleaved = a.inter;
  gx_node *o[2];
  gx_mat w;
  char hf[96];
  if (find_projs(G, gx_out(a.n, 0), o, 2) != 1) {
    gx_fail_node(G, a.n, IR_UNSUPPORTED, "output is not read by one o_proj projection");
    return NULL;
  }
  if (!gx_mat_read(G, o[0], &w)) return NULL;
  lname(hf, sizeof hf, G->layer, "self_attn.o_proj.weight");
  gx_mat_add(G, hf, &w, 0, w.n);
  return G->st == IR_OK ? gx_out(o[0], 0) : NULL;
}

/* --- MLP ----------------------------------------------------------------------------- */

/* silu(g) = g * Sigmoid(g), or a Silu / Swish (alpha 1) node: its output, or NULL. */
static const char *silu_of(gx *G, const char *g) {
  int s = gx_consumer(G, g, "Sigmoid", 0, 0);
  for (size_t i = 0; s >= 0 && i < G->gp->n_node; i++)
    if (gx_is_op(G->gp->node[i], "Mul") &&
        reads_pair(G, G->gp->node[i], g, gx_out(G->gp->node[s], 0)))
      return gx_out(G->gp->node[i], 0);
  int n = gx_consumer(G, g, "Silu", 0, 0);
  if (n < 0 && (n = gx_consumer(G, g, "Swish", 0, 0)) >= 0 &&
      gx_attr_f(G->gp->node[n], "alpha", 1) != 1)
    n = -1;
  return n >= 0 ? gx_out(G->gp->node[n], 0) : NULL;
}

/* down(silu(gate(h)) * up(h)): returns the down projection's output. */
static const char *match_mlp(gx *G, const char *h) {
  gx_node *p[3], *down[2];
  int np = find_projs(G, h, p, 3);
  if (np != 2) {
    gx_fail(G, IR_UNSUPPORTED,
            "expected separate gate and up projections of the "
            "post-attention norm, found %d projection(s)%s",
            np, np == 1 ? " (a fused gate/up projection is not supported)" : "");
    return NULL;
  }
  const char *act = NULL, *up = NULL;
  int gate = -1;
  for (int j = 0; j < 2 && gate < 0; j++)
    if ((act = silu_of(G, gx_out(p[j], 0)))) gate = j, up = gx_out(p[1 - j], 0);
  int prod = -1;
  for (size_t i = 0; act && i < G->gp->n_node && prod < 0; i++)
    if (gx_is_op(G->gp->node[i], "Mul") && reads_pair(G, G->gp->node[i], act, up)) prod = (int)i;
  if (prod < 0 || find_projs(G, gx_out(G->gp->node[prod], 0), down, 2) != 1) {
    gx_fail(G, IR_UNSUPPORTED, "the MLP is not SwiGLU (down(silu(gate) * up))");
    return NULL;
  }
  gx_node *nodes[3] = {p[gate], p[1 - gate], down[0]};
  static const char *const nm[3] = {"mlp.gate_proj.weight", "mlp.up_proj.weight",
                                    "mlp.down_proj.weight"};
  gx_mat w[3];
  for (int j = 0; j < 3; j++)
    if (!gx_mat_read(G, nodes[j], &w[j])) return NULL;
  int64_t H = G->p.hidden_size, F = w[0].n;
  if (w[0].k != H || w[1].n != F || w[1].k != H || w[2].n != H || w[2].k != F ||
      (G->layer > 0 && F != G->p.intermediate_size)) {
    gx_fail(G, IR_UNSUPPORTED,
            "MLP shapes gate [%lld, %lld], up [%lld, %lld], down [%lld, "
            "%lld] are not [F, H], [F, H], [H, F] with one F for all layers",
            (long long)w[0].n, (long long)w[0].k, (long long)w[1].n, (long long)w[1].k,
            (long long)w[2].n, (long long)w[2].k);
    return NULL;
  }
  G->p.intermediate_size = F;
  char hf[96];
  for (int j = 0; j < 3; j++) {
    lname(hf, sizeof hf, G->layer, nm[j]);
    gx_mat_add(G, hf, &w[j], 0, w[j].n);
  }
  return G->st == IR_OK ? gx_out(down[0], 0) : NULL;
}

/* --- model --------------------------------------------------------------------------- */

/* Gather(Transpose(W), input_ids) with W the [hidden, vocab] lm_head matrix: the builder's
 * tied embeddings. Records the table; lm_head then shares it. */
static bool tied_embed(gx *G, gx_node *g) {
  gx_node *tp = gx_producer(G, gx_skip(G, gx_in(g, 0)));
  const Onnx__AttributeProto *perm = tp ? gx_attr(tp, "perm") : NULL;
  gx_mat w;
  if (!gx_is_op(tp, "Transpose") || !perm || perm->n_ints != 2 || perm->ints[0] != 1 ||
      perm->ints[1] != 0 || gx_attr_i(g, "axis", 0) != 0 ||
      !gx_const_transposed(G, gx_in(tp, 0), &w))
    return false;
  G->p.vocab_size = w.n;
  G->p.hidden_size = w.k;
  G->embed_t = gx_skip(G, gx_in(tp, 0));
  gx_mat_add(G, "model.embed_tokens.weight", &w, 0, w.n);
  return true;
}

/* GatherBlockQuantized(table, input_ids): the int4 builder's (shared) embedding. */
static const char *quant_embed(gx *G, gx_node *g) {
  gx_mat w;
  if (!is_ms(g, "GatherBlockQuantized") || !gx_embed_read(G, g, &w)) {
    if (G->st == IR_OK) gx_fail_node(G, g, IR_UNSUPPORTED, "is not a com.microsoft op");
    return NULL;
  }
  G->p.vocab_size = w.n;
  G->p.hidden_size = w.k;
  G->quant_embed = true;
  gx_mat_add(G, "model.embed_tokens.weight", &w, 0, w.n);
  return G->st == IR_OK ? gx_out(g, 0) : NULL;
}

static const char *match_embed(gx *G) {
  int e = gx_consumer(G, "input_ids", "Gather", 1, 0);
  onnx_dense t;
  if (e < 0 && (e = gx_consumer(G, "input_ids", "GatherBlockQuantized", 1, 0)) >= 0)
    return quant_embed(G, G->gp->node[e]);
  if (e < 0) {
    gx_fail(G, IR_UNSUPPORTED, "no embedding Gather of input_ids");
    return NULL;
  }
  gx_node *g = G->gp->node[e];
  if (tied_embed(G, g)) return G->st == IR_OK ? gx_out(g, 0) : NULL;
  if (gx_attr_i(g, "axis", 0) != 0 || !gx_const(G, gx_in(g, 0), &t)) {
    gx_fail_node(G, g, IR_UNSUPPORTED, "is not a row lookup in a constant embedding table");
    return NULL;
  }
  ir_free(t.owned);
  if (t.rank != 2) {
    gx_fail_node(G, g, IR_UNSUPPORTED, "embedding table is not [vocab, hidden]");
    return NULL;
  }
  G->p.vocab_size = t.shape[0];
  G->p.hidden_size = t.shape[1];
  gx_add_const(G, "model.embed_tokens.weight", gx_in(g, 0), 2, t.shape);
  return G->st == IR_OK ? gx_out(g, 0) : NULL;
}

static void match_head(gx *G, const char *h) {
  gx_node *p[4];
  int np = find_projs(G, h, p, 4), head = -1;
  for (int j = 0; j < np; j++)
    if (gx_same(G, "logits", gx_out(p[j], 0))) head = j;
  if (head < 0) {
    gx_fail(G, IR_UNSUPPORTED,
            "the logits output is not an lm_head projection of the final "
            "norm");
    return;
  }
  gx_mat w;
  if (G->embed_t && gx_is_op(p[head], "MatMul") && gx_same(G, gx_in(p[head], 1), G->embed_t)) {
    G->p.tie_word_embeddings = true;
    G->n_matmul++;
    return;
  }
  if (!gx_mat_read(G, p[head], &w)) return;
  if (w.n != G->p.vocab_size || w.k != G->p.hidden_size) {
    gx_fail_node(G, p[head], IR_UNSUPPORTED,
                 "lm_head is [%lld, %lld], expected [vocab %lld, "
                 "hidden %lld]",
                 (long long)w.n, (long long)w.k, (long long)G->p.vocab_size,
                 (long long)G->p.hidden_size);
    return;
  }
  gx_mat_add(G, "lm_head.weight", &w, 0, w.n);
}

static void match_model(gx *G) {
  for (size_t i = 0; i < G->gp->n_node; i++)
    G->n_gqa += is_ms(G->gp->node[i], "GroupQueryAttention");
  const char *x = match_embed(G), *h = NULL;
  if (x) h = match_norm(G, x, "model.layers.0.input_layernorm.weight");
  for (int l = 0; l < G->n_gqa && G->st == IR_OK; l++) {
    G->layer = l;
    const char *x2 = NULL, *o = match_attention(G, h), *down = NULL;
    char hf[96];
    lname(hf, sizeof hf, l, "post_attention_layernorm.weight");
    const char *h2 = o ? match_add_norm(G, x, o, hf, &x2) : NULL;
    if (h2 && !x2)
      gx_fail(G, IR_UNSUPPORTED,
              "the residual sum of the post-attention norm is "
              "not used");
    if (h2 && x2) down = match_mlp(G, h2);
    if (l + 1 < G->n_gqa) lname(hf, sizeof hf, l + 1, "input_layernorm.weight");
    else snprintf(hf, sizeof hf, "model.norm.weight");
    h = down ? match_add_norm(G, x2, down, hf, &x) : NULL;
    if (h && !x && l + 1 < G->n_gqa)
      gx_fail(G, IR_UNSUPPORTED, "the residual sum after the MLP is not used");
  }
  G->p.n_layers = G->n_gqa;
  G->layer = -1;
  if (h && G->st == IR_OK) match_head(G, h);
}

/* --- entry --------------------------------------------------------------------------- */

static void describe(const gx *G, char *out) {
  const model_llama_params *p = &G->p;
  const char *kind = p->n_kv_heads == p->n_heads ? "MHA" : p->n_kv_heads == 1 ? "MQA" : "GQA";
  char wq[160], to[64];
  int packed = G->n_nbits_packable; /* 0 unless keep_int4 */
  if (packed == G->n_nbits) snprintf(to, sizeof to, "int4 matmul");
  else if (packed == 0) /* dequantized: f32, or the --dtype asked for */
    snprintf(to, sizeof to, "%s", ir_dtype_name(G->keep_int4 ? IR_F32 : G->wdt));
  else snprintf(to, sizeof to, "int4 matmul (%d f32: K%%bs)", G->n_nbits - packed);
  if (G->n_nbits)
    snprintf(wq, sizeof wq, "%d MatMulNBits int4 bs%lld%s%s -> %s", G->n_nbits,
             (long long)G->nbits_block, G->nbits_mixed ? " (mixed)" : "",
             G->nbits_zp ? " with zero points" : " zp 8", to);
  else snprintf(wq, sizeof wq, "%d MatMul weights", G->n_matmul);
  char line[640];
  snprintf(line, sizeof line,
           "%d GroupQueryAttention blocks -> paged attention, %s %lld/%lld, head_dim %lld%s%s; "
           "RoPE (%s%s) theta=%g; RMSNorm eps=%g%s; SwiGLU %lld; %s; vocab %lld%s",
           G->n_gqa, kind, (long long)p->n_heads, (long long)p->n_kv_heads, (long long)p->head_dim,
           G->packed_qkv ? ", packed QKV" : "", p->attention_bias ? ", q/k/v bias" : "",
           G->rope_node ? "RotaryEmbedding" : "in GQA", p->rope_interleaved ? ", interleaved" : "",
           p->rope_theta, p->rms_norm_eps, G->skip_norm ? " (SkipSimplified)" : "",
           (long long)p->intermediate_size, wq, (long long)p->vocab_size,
           p->tie_word_embeddings ? " (tied lm_head)"
           : G->quant_embed       ? " (int4 embedding)"
                                  : "");
  snprintf(out, INFC_ONNX_LLM_RECOGNISED, "%.*s", INFC_ONNX_LLM_RECOGNISED - 1, line);
}

static ir_status build(gx *G, const char *path, const model_build_opts *bo, ir_graph **out) {
  gx_read_config(G, path);
  snprintf(G->p.arch, sizeof G->p.arch, "llama");
  model_tensor_src src = {.ctx = G, .find = gx_find};
  ir_status st = model_llama_build(&G->p, &src, bo, out, G->d);
  if (st == IR_OK && G->keep_int4 && G->n_qw && gx_qw_rewire(G, *out) < 0) st = G->d->status;
  if (st == IR_OK && G->keep_int4 && G->n_qw) st = ir_graph_verify(*out, G->d);
  for (int i = 0; st == IR_OK && i < G->n_owned; i++) {
    void *buf = G->owned[i];
    G->owned[i] = NULL;
    if (!ir_graph_adopt(*out, buf)) {
      ir_free(buf);
      st = ir_diag_set(G->d, IR_OOM, "out of memory");
    }
  }
  if (st != IR_OK) {
    ir_graph_destroy(*out);
    *out = NULL;
  }
  return st;
}

ir_status infc_onnx_genai_import(infc_onnx *m, const char *path, const model_build_opts *bo,
                                 infc_onnx **out_model, ir_graph **out_graph, char *out_hash,
                                 char *recognised, ir_diag *d) {
  *out_model = NULL;
  *out_graph = NULL;
  gx G = {.m = m,
          .gp = m->model->graph,
          .d = d,
          .layer = -1,
          .st = IR_OK,
          .keep_int4 = bo->weight_dtype == IR_DTYPE_INVALID, /* --dtype: dequantize */
          .wdt = bo->weight_dtype};
  if (!gx_map_build(&G)) G.st = ir_diag_set(d, IR_OOM, "out of memory");
  if (G.st == IR_OK) match_model(&G);
  ir_status st = G.st == IR_OK ? build(&G, path, bo, out_graph) : G.st;
  if (st != IR_OK && st != IR_OOM)
    ir_diag_prefix(d,
                   "%s: an ONNX Runtime GenAI decoder graph that infc cannot serve as an "
                   "LLM plan",
                   path);
  if (st == IR_OK) {
    describe(&G, recognised);
    infc_onnx_hash(m, out_hash);
    *out_model = m;
  }
  for (int i = 0; i < G.n_owned; i++) ir_free(G.owned[i]);
  ir_free(G.owned);
  ir_free(G.w);
  ir_free(G.qw);
  ir_free(G.map);
  if (st != IR_OK) infc_onnx_close(m);
  return st;
}
