/* model_llama: builds the Llama-family program over the flat step batch. Weights are
 * referenced in place; dtype changes and f32 norm weights are expressed as cast nodes
 * that the fold pass evaluates at build time. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "ir_alloc.h"
#include "ir_lazy.h"

model_build_opts model_build_opts_default(void) {
  return (model_build_opts){.weight_dtype = IR_DTYPE_INVALID,
                            .max_tokens = 512,
                            .max_seqs = 64,
                            .max_logits = 64,
                            .kv_block_size = 16,
                            .max_context = 0};
}

ir_status model_llama_check(const model_llama_params *p, ir_diag *d) {
  if (p->vocab_size <= 0 || p->hidden_size <= 0 || p->n_layers <= 0 || p->n_heads <= 0 ||
      p->n_kv_heads <= 0 || p->head_dim <= 0 || p->intermediate_size <= 0 || p->max_position <= 0)
    return ir_diag_set(d, IR_BAD_FORMAT, "model sizes must be positive");
  if (p->n_heads % p->n_kv_heads)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "num_attention_heads (%lld) is not a multiple of "
                       "num_key_value_heads (%lld)",
                       (long long)p->n_heads, (long long)p->n_kv_heads);
  if (p->head_dim % 2 || p->head_dim > 256)
    return ir_diag_set(d, IR_UNSUPPORTED, "head_dim %lld must be even and at most 256",
                       (long long)p->head_dim);
  if (p->no_rope_every < 0)
    return ir_diag_set(d, IR_BAD_FORMAT, "no_rope_layer_interval must not be negative");
  if (p->fused_proj && p->attention_bias)
    return ir_diag_set(d, IR_UNSUPPORTED, "a fused qkv_proj with biases is not supported");
  if (p->rot_dim < 0 || p->rot_dim % 2 || p->rot_dim > p->head_dim)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "rotary dims %lld must be even and at most head_dim "
                       "%lld",
                       (long long)p->rot_dim, (long long)p->head_dim);
  if (!(p->rms_norm_eps > 0) || !(p->rope_theta > 0))
    return ir_diag_set(d, IR_BAD_FORMAT, "rms_norm_eps and rope_theta must be positive");
  if (p->rope_scaling != MODEL_ROPE_DEFAULT && p->rope_scaling != MODEL_ROPE_LONGROPE &&
      !(p->rope_factor >= 1.0 && p->rope_factor < 1e6))
    return ir_diag_set(d, IR_BAD_FORMAT, "rope scaling factor %g must be at least 1",
                       p->rope_factor);
  if (p->rope_scaling == MODEL_ROPE_LONGROPE &&
      !(p->rope_orig_context > 0 && p->rope_attn_factor > 0))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "longrope scaling needs original_max_position_"
                       "embeddings and an attention factor > 0");
  if (p->rope_scaling == MODEL_ROPE_YARN && !(p->rope_orig_context > 0 && p->rope_beta_fast > 0 &&
                                              p->rope_beta_slow > 0 && p->rope_attn_factor > 0))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "yarn rope scaling needs original_max_position_"
                       "embeddings, beta_fast, beta_slow and an attention factor > 0");
  if (p->act != 0 && p->act != IR_ACT_SWIGLU && p->act != IR_ACT_GEGLU)
    return ir_diag_set(d, IR_UNSUPPORTED, "unknown MLP activation %d", p->act);
  if (!(p->embed_scale >= 0 && p->attn_scale >= 0 && p->attn_softcap >= 0 &&
        p->final_softcap >= 0 && p->rope_local_theta >= 0) ||
      p->sliding_window < 0 || p->swa_period < 0 || p->swa_first < 0)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "scales, soft caps, the sliding window and the local "
                       "rope base must not be negative");
  if (p->rope_scaling == MODEL_ROPE_LLAMA3 &&
      !(p->rope_orig_context > 0 && p->rope_low_freq > 0 && p->rope_high_freq > p->rope_low_freq))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "llama3 rope scaling needs original_max_position_"
                       "embeddings > 0 and high_freq_factor > low_freq_factor > 0");
  return IR_OK;
}

typedef struct builder {
  ir_graph *g;
  const model_llama_params *p;
  const model_tensor_src *src;
  const model_build_opts *bo;
  ir_diag *d;
  ir_status st;
  int32_t tokens, positions, logit_rows, rope_table;
  int32_t rope_local; /* the sliding layers' table (rope_local_theta), or rope_table */
  int32_t one;        /* the f32 scalar 1 (norm_plus_one), or -1 until asked for */
  /* tensor parallelism (Megatron's split): this rank's heads, kv heads (from kv0 of the
   * model's), ffn columns and vocabulary rows; tp 1 keeps the whole model */
  int tp, rank;
  int64_t nh, nkv, kv0, ffn, vocab;
} builder;

static ir_dim DS(ir_sym s) { return (ir_dim){.n = 0, .sym = s}; }

/* Checkpoint tensor `name` into *t, checked to be [d0] (d1 0) or [d0, d1] and of a dtype the
 * template takes; false with b->st set otherwise. */
static bool checkpoint_tensor(builder *b, const char *name, int64_t d0, int64_t d1,
                              model_tensor *t) {
  if (b->st != IR_OK) return false;
  if (!b->src->find(b->src->ctx, name, t)) {
    b->st = ir_diag_set(b->d, IR_BAD_FORMAT, "checkpoint has no tensor '%s'", name);
    return false;
  }
  int rank = d1 ? 2 : 1;
  if (t->rank != rank || t->shape[0] != d0 || (d1 && t->shape[1] != d1)) {
    b->st = ir_diag_set(b->d, IR_BAD_FORMAT,
                        "tensor '%s' has shape [%lld%s%lld], expected "
                        "[%lld%s%lld]",
                        name, (long long)t->shape[0], t->rank > 1 ? "," : "",
                        t->rank > 1 ? (long long)t->shape[1] : 0LL, (long long)d0, d1 ? "," : "",
                        (long long)d1);
    return false;
  }
  bool known = t->dtype == IR_F32 || t->dtype == IR_F16 || t->dtype == IR_BF16;
  if (!known && !ir_dtype_is_quant(t->dtype)) {
    b->st = ir_diag_set(b->d, IR_UNSUPPORTED,
                        "tensor '%s' has dtype %s; expected f32, f16, "
                        "bf16, q8_0, q4_0 or q4_1",
                        name, ir_dtype_name(t->dtype));
    return false;
  }
  return true;
}

/* Adds checkpoint tensor `name` as a weight of the given shape (checked), or -1. */
static int32_t weight(builder *b, const char *name, int64_t d0, int64_t d1) {
  model_tensor t;
  if (!checkpoint_tensor(b, name, d0, d1, &t)) return -1;
  int64_t shape[2] = {d0, d1};
  int32_t id = ir_graph_add_weight(b->g, name, t.dtype, d1 ? 2 : 1, shape, t.data, t.nbytes);
  if (id < 0) b->st = ir_diag_set(b->d, IR_OOM, "out of memory");
  return id;
}

/* Rows [row0, row0 + rows) of checkpoint matrix `name` ([total, k]) as a weight of its own:
 * a view of the stored bytes (rows are whole in every dtype the template takes). */
static int32_t weight_rows(builder *b, const char *name, int64_t total, int64_t row0, int64_t rows,
                           int64_t k, const char *view_name) {
  model_tensor t;
  if (!checkpoint_tensor(b, name, total, k, &t)) return -1;
  uint64_t row_bytes = t.nbytes / (uint64_t)total;
  int64_t shape[2] = {rows, k};
  int32_t id = ir_graph_add_weight(b->g, view_name, t.dtype, 2, shape,
                                   (const uint8_t *)t.data + row_bytes * (uint64_t)row0,
                                   row_bytes * (uint64_t)rows);
  if (id < 0) b->st = ir_diag_set(b->d, IR_OOM, "out of memory");
  return id;
}

/* Columns [col0, col0 + cols) of every row of checkpoint matrix `name` ([n, k]) as a weight
 * of its own (a recipe the plan writer copies out; a block-quantized row splits at whole
 * blocks). */
static int32_t weight_cols(builder *b, const char *name, int64_t n, int64_t k, int64_t col0,
                           int64_t cols) {
  model_tensor t;
  if (!checkpoint_tensor(b, name, n, k, &t)) return -1;
  int blk = ir_dtype_block(t.dtype);
  if (col0 % blk || cols % blk) {
    b->st = ir_diag_set(b->d, IR_UNSUPPORTED,
                        "tensor '%s' (%s): its %lld-column shard is not whole %d-value blocks",
                        name, ir_dtype_name(t.dtype), (long long)cols, blk);
    return -1;
  }
  uint64_t row = ir_dtype_bytes(t.dtype, (uint64_t)k),
           off = ir_dtype_bytes(t.dtype, (uint64_t)col0),
           len = ir_dtype_bytes(t.dtype, (uint64_t)cols);
  ir_wref src = {
      .dtype = t.dtype, .rank = 2, .dims = {n, k}, .nbytes = row * (uint64_t)n, .data = t.data};
  int64_t shape[2] = {n, cols};
  int32_t id =
      ir_graph_add_lazy_weight(b->g, name, t.dtype, 2, shape, ir_lazy_cols(&src, off, len));
  if (id < 0) b->st = ir_diag_set(b->d, IR_OOM, "out of memory");
  return id;
}

/* Values [at, at + n) of checkpoint vector `name` ([total]) as a weight (a view). */
static int32_t weight_span(builder *b, const char *name, int64_t total, int64_t at, int64_t n) {
  model_tensor t;
  if (!checkpoint_tensor(b, name, total, 0, &t)) return -1;
  if (ir_dtype_is_quant(t.dtype)) {
    b->st = ir_diag_set(b->d, IR_UNSUPPORTED, "tensor '%s': a quantized vector", name);
    return -1;
  }
  int64_t shape[1] = {n};
  int32_t id = ir_graph_add_weight(b->g, name, t.dtype, 1, shape,
                                   (const uint8_t *)t.data + ir_dtype_bytes(t.dtype, (uint64_t)at),
                                   ir_dtype_bytes(t.dtype, (uint64_t)n));
  if (id < 0) b->st = ir_diag_set(b->d, IR_OOM, "out of memory");
  return id;
}

static int32_t node(builder *b, ir_op op, const char *name, const int32_t *in, int n_in,
                    const ir_attr *attrs, int n_attrs) {
  if (b->st != IR_OK) return -1;
  int32_t out = -1;
  if (ir_graph_add_node(b->g, op, name, in, n_in, attrs, n_attrs, &out, b->d) < 0)
    b->st = b->d->status ? b->d->status : IR_OOM;
  return out;
}

/* A weight converted to `to` by a cast node (folded at build time), or as stored. */
static int32_t as_dtype(builder *b, int32_t w, ir_dtype to) {
  if (w < 0 || to == IR_DTYPE_INVALID || b->g->tensors[w].dtype == to) return w;
  char name[160];
  snprintf(name, sizeof name, "%s.%s", b->g->tensors[w].name, ir_dtype_name(to));
  ir_attr a = IR_AI(ir_attr_intern("to"), to);
  return node(b, IR_OP_CAST, name, &w, 1, &a, 1);
}

static int32_t vec_weight(builder *b, const char *name, int64_t n) {
  return as_dtype(b, weight(b, name, n, 0), IR_F32);
}

/* The f32 scalar 1 the (1 + w) norms add, made once. */
static int32_t one(builder *b) {
  if (b->one >= 0 || b->st != IR_OK) return b->one;
  float *v = ir_malloc(sizeof *v);
  int64_t shape[1] = {1};
  if (v) *v = 1.0f;
  if (!v || !ir_graph_adopt(b->g, v) ||
      (b->one = ir_graph_add_weight(b->g, "one", IR_F32, 1, shape, v, sizeof *v)) < 0)
    b->st = ir_diag_set(b->d, IR_OOM, "out of memory");
  return b->one;
}

/* An RMSNorm weight in f32: w, or 1 + w (Gemma's), an add the fold pass evaluates. */
static int32_t norm_weight(builder *b, const char *name, int64_t n) {
  int32_t w = vec_weight(b, name, n);
  if (!b->p->norm_plus_one || w < 0) return w;
  char nm[200];
  snprintf(nm, sizeof nm, "%s.plus1", name);
  int32_t in[2] = {w, one(b)};
  return node(b, IR_OP_ADD, nm, in, 2, NULL, 0);
}

static int32_t mat_weight(builder *b, const char *name, int64_t n, int64_t k) {
  return as_dtype(b, weight(b, name, n, k), b->bo->weight_dtype);
}

/* Frequency i of the rope: 1 / theta^(2i / head_dim), scaled as the config says
 * (transformers' _compute_linear_scaling / _compute_llama3_parameters), then divided by
 * the GGUF's factor for it if any. */
int64_t model_llama_rot_dims(const model_llama_params *p) {
  return p->rot_dim ? p->rot_dim : p->head_dim;
}

static double rope_freq(const model_llama_params *p, int64_t i, int64_t max_pos) {
  double inv = 1.0 / pow(p->rope_theta, (double)(2 * i) / (double)model_llama_rot_dims(p));
  if (p->rope_scaling == MODEL_ROPE_LONGROPE)
    inv /= (double)(max_pos > p->rope_orig_context ? p->rope_long : p->rope_short)[i];
  if (p->rope_scaling == MODEL_ROPE_LINEAR) inv /= p->rope_factor;
  if (p->rope_scaling == MODEL_ROPE_LLAMA3) {
    double ctx = (double)p->rope_orig_context, wavelen = 2.0 * M_PI / inv;
    double low_wavelen = ctx / p->rope_low_freq, high_wavelen = ctx / p->rope_high_freq;
    if (wavelen > low_wavelen) {
      inv /= p->rope_factor;
    } else if (wavelen >= high_wavelen) { /* between: a blend of the two */
      double s = (ctx / wavelen - p->rope_low_freq) / (p->rope_high_freq - p->rope_low_freq);
      inv = (1.0 - s) * inv / p->rope_factor + s * inv;
    }
  }
  if (p->rope_scaling == MODEL_ROPE_YARN) { /* transformers' _compute_yarn_parameters */
    double dim = (double)model_llama_rot_dims(p), ctx = (double)p->rope_orig_context;
    double lo = dim * log(ctx / (p->rope_beta_fast * 2.0 * M_PI)) / (2.0 * log(p->rope_theta));
    double hi = dim * log(ctx / (p->rope_beta_slow * 2.0 * M_PI)) / (2.0 * log(p->rope_theta));
    if (p->rope_yarn_truncate) lo = floor(lo), hi = ceil(hi);
    lo = lo > 0.0 ? lo : 0.0;
    hi = hi < dim - 1.0 ? hi : dim - 1.0;
    if (lo == hi) hi += 0.001;
    double ramp = ((double)i - lo) / (hi - lo);
    double keep = 1.0 - (ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp); /* extrapolated share */
    inv = inv / p->rope_factor * (1.0 - keep) + inv * keep;
  }
  if (p->rope_freq_factors) inv /= (double)p->rope_freq_factors[i];
  return inv;
}

bool model_llama_layer_slides(const model_llama_params *p, int64_t l) {
  return p->sliding_window > 0 && l >= p->swa_first &&
         (p->swa_period <= 0 || (l + 1) % p->swa_period != 0);
}

/* cos/sin of pos * inv_freq for every position, computed as HF does in f32 (rope_freq),
 * with the parameters p (the model's, or the sliding layers' local rope). */
static int32_t rope_table(builder *b, const model_llama_params *p, int64_t max_pos,
                          const char *name) {
  int64_t half = model_llama_rot_dims(p) / 2;
  float *cs = ir_malloc((size_t)(max_pos * half * 2) * sizeof *cs);
  if (!cs || !ir_graph_adopt(b->g, cs)) {
    b->st = ir_diag_set(b->d, IR_OOM, "out of memory");
    return -1;
  }
  /* YaRN and longrope scale cos and sin (HF's attention_scaling, in f32); 1 keeps them */
  model_rope_scaling sc = p->rope_scaling;
  float scale =
      sc == MODEL_ROPE_YARN || sc == MODEL_ROPE_LONGROPE ? (float)p->rope_attn_factor : 1.0f;
  for (int64_t i = 0; i < half; i++) {
    float inv = (float)rope_freq(p, i, max_pos);
    for (int64_t pos = 0; pos < max_pos; pos++) {
      float f = (float)pos * inv;
      cs[(pos * half + i) * 2] = cosf(f) * scale;
      cs[(pos * half + i) * 2 + 1] = sinf(f) * scale;
    }
  }
  int64_t shape[3] = {max_pos, half, 2};
  int32_t id = ir_graph_add_weight(b->g, name, IR_F32, 3, shape, cs,
                                   (uint64_t)(max_pos * half * 2) * sizeof *cs);
  if (id < 0) b->st = ir_diag_set(b->d, IR_OOM, "out of memory");
  return id;
}

/* A projection by rows [row0, row0 + n) of weight pre+w ([total, k]; all of it when n is
 * total), and the same rows of its bias. */
static int32_t proj_part(builder *b, int32_t x, const char *pre, const char *w, int64_t total,
                         int64_t row0, int64_t n, int64_t k, bool bias, const char *node_name) {
  char name[160];
  snprintf(name, sizeof name, "%s%s.weight", pre, w);
  int32_t wt = n == total ? weight(b, name, n, k) : weight_rows(b, name, total, row0, n, k, name);
  int32_t in[3] = {x, as_dtype(b, wt, b->bo->weight_dtype), -1};
  if (bias) {
    snprintf(name, sizeof name, "%s%s.bias", pre, w);
    int32_t bw = n == total ? weight(b, name, n, 0) : weight_span(b, name, total, row0, n);
    in[2] = as_dtype(b, bw, IR_F32);
  }
  return node(b, IR_OP_MATMUL, node_name, in, bias ? 3 : 2, NULL, 0);
}

static int32_t proj(builder *b, int32_t x, const char *pre, const char *w, int64_t n, int64_t k,
                    bool bias, const char *node_name) {
  return proj_part(b, x, pre, w, n, 0, n, k, bias, node_name);
}

/* A projection whose input x is this rank's share kk of the k columns: the weight's same
 * columns, then the ranks' partial sums all-reduced (one rank: the plain projection). */
static int32_t proj_reduce(builder *b, int32_t x, const char *pre, const char *w, int64_t n,
                           int64_t k, int64_t kk, const char *node_name) {
  if (b->tp <= 1) return proj(b, x, pre, w, n, k, false, node_name);
  char name[160], nm[80];
  snprintf(name, sizeof name, "%s%s.weight", pre, w);
  int32_t in[2] = {x,
                   as_dtype(b, weight_cols(b, name, n, k, b->rank * kk, kk), b->bo->weight_dtype)};
  int32_t part = node(b, IR_OP_MATMUL, node_name, in, 2, NULL, 0);
  snprintf(nm, sizeof nm, "%s.all_reduce", node_name);
  ir_attr a = IR_AI(ir_attr_intern("ranks"), b->tp);
  return node(b, IR_OP_ALL_REDUCE, nm, &part, 1, &a, 1);
}

/* A projection whose weight is rows [row0, row0 + n) of the checkpoint's fused matrix
 * pre+fused ([total, k]), named pre+w as its unfused form would be. */
static int32_t proj_rows(builder *b, int32_t x, const char *pre, const char *fused, int64_t total,
                         const char *w, int64_t row0, int64_t n, int64_t k, const char *node_name) {
  char name[160], view[160];
  snprintf(name, sizeof name, "%s%s.weight", pre, fused);
  snprintf(view, sizeof view, "%s%s.weight", pre, w);
  int32_t in[2] = {x,
                   as_dtype(b, weight_rows(b, name, total, row0, n, k, view), b->bo->weight_dtype)};
  return node(b, IR_OP_MATMUL, node_name, in, 2, NULL, 0);
}

/* The rope tables: the model's, and Gemma 3's local one for the sliding layers (its own
 * base, no scaling). */
static void rope_tables(builder *b, int64_t max_pos) {
  b->rope_table = b->rope_local = rope_table(b, b->p, max_pos, "rope.cos_sin");
  if (b->st != IR_OK || !(b->p->rope_local_theta > 0)) return;
  model_llama_params local = *b->p;
  local.rope_theta = b->p->rope_local_theta;
  local.rope_scaling = MODEL_ROPE_DEFAULT;
  local.rope_freq_factors = NULL;
  b->rope_local = rope_table(b, &local, max_pos, "rope.cos_sin.local");
}

static int32_t rms_norm(builder *b, int32_t x, int32_t w, const char *node_name) {
  int32_t in[2] = {x, w};
  ir_attr a = IR_AF(ir_attr_intern("eps"), b->p->rms_norm_eps);
  return node(b, IR_OP_RMS_NORM, node_name, in, 2, &a, 1);
}

static int32_t rope(builder *b, int32_t x, int64_t heads, int32_t table, const char *node_name) {
  int32_t in[3] = {x, b->positions, table};
  ir_attr a[4] = {IR_AI(ir_attr_intern("n_heads"), heads),
                  IR_AI(ir_attr_intern("head_dim"), b->p->head_dim),
                  IR_AI(ir_attr_intern("rot_dim"), model_llama_rot_dims(b->p)),
                  IR_AI(ir_attr_intern("neox"), b->p->rope_interleaved ? 0 : 1)};
  return node(b, IR_OP_ROPE, node_name, in, 3, a, 4);
}

/* Qwen3's q_norm / k_norm: every head of x normalized with one weight of head_dim. */
static int32_t head_norm(builder *b, int32_t x, const char *pre, const char *w, int64_t l) {
  char wn[200], nn[64]; /* pre is up to 160 bytes */
  snprintf(wn, sizeof wn, "%s%s.weight", pre, w);
  snprintf(nn, sizeof nn, "l%lld.%s", (long long)l, w);
  return rms_norm(b, x, norm_weight(b, wn, b->p->head_dim), nn);
}

static int32_t attention_block(builder *b, int32_t h, int64_t l, const char *pre) {
  const model_llama_params *p = b->p;
  int64_t H = p->hidden_size, hd = p->head_dim, qd = p->n_heads * hd, kvd = p->n_kv_heads * hd;
  int64_t qd_l = b->nh * hd, kvd_l = b->nkv * hd, q0 = b->rank * qd_l, k0 = b->kv0 * hd;
  char nm[5][64];
  const char *parts[5] = {"q_proj", "k_proj", "v_proj", "attn", "o_proj"};
  for (int i = 0; i < 5; i++) snprintf(nm[i], sizeof nm[i], "l%lld.%s", (long long)l, parts[i]);
  char sa[160];
  snprintf(sa, sizeof sa, "%sself_attn.", pre);
  int32_t q, k, v;
  if (p->fused_proj) { /* Phi-3's qkv_proj: q rows, k rows, v rows */
    int64_t all = qd + 2 * kvd;
    q = proj_rows(b, h, sa, "qkv_proj", all, "q_proj", q0, qd_l, H, nm[0]);
    k = proj_rows(b, h, sa, "qkv_proj", all, "k_proj", qd + k0, kvd_l, H, nm[1]);
    v = proj_rows(b, h, sa, "qkv_proj", all, "v_proj", qd + kvd + k0, kvd_l, H, nm[2]);
  } else {
    q = proj_part(b, h, sa, "q_proj", qd, q0, qd_l, H, p->attention_bias, nm[0]);
    k = proj_part(b, h, sa, "k_proj", kvd, k0, kvd_l, H, p->attention_bias, nm[1]);
    v = proj_part(b, h, sa, "v_proj", kvd, k0, kvd_l, H, p->attention_bias, nm[2]);
  }
  if (p->qk_norm) { /* one weight [head_dim] shared by the heads: rms_norm in slices */
    q = head_norm(b, q, sa, "q_norm", l);
    k = head_norm(b, k, sa, "k_norm", l);
  }
  char rq[64], rk[64];
  snprintf(rq, sizeof rq, "l%lld.rope_q", (long long)l);
  snprintf(rk, sizeof rk, "l%lld.rope_k", (long long)l);
  bool nope = p->no_rope_every > 0 && (l + 1) % p->no_rope_every == 0; /* SmolLM3's NoPE */
  bool slides = model_llama_layer_slides(p, l);
  int32_t table = slides ? b->rope_local : b->rope_table;
  int32_t in[3] = {nope ? q : rope(b, q, b->nh, table, rq),
                   nope ? k : rope(b, k, b->nkv, table, rk), v};
  double scale = p->attn_scale > 0 ? p->attn_scale : 1.0 / sqrt((double)p->head_dim);
  ir_attr a[7] = {IR_AI(ir_attr_intern("layer"), l), IR_AI(ir_attr_intern("n_heads"), b->nh),
                  IR_AI(ir_attr_intern("n_kv_heads"), b->nkv),
                  IR_AI(ir_attr_intern("head_dim"), p->head_dim),
                  IR_AF(ir_attr_intern("scale"), scale)};
  int na = 5;
  if (slides) a[na++] = IR_AI(ir_attr_intern("window"), p->sliding_window);
  if (p->attn_softcap > 0) a[na++] = IR_AF(ir_attr_intern("softcap"), p->attn_softcap);
  int32_t att = node(b, IR_OP_ATTENTION, nm[3], in, 3, a, na);
  return proj_reduce(b, att, sa, "o_proj", H, qd, qd_l, nm[4]);
}

static int32_t mlp_block(builder *b, int32_t h, int64_t l, const char *pre) {
  int64_t H = b->p->hidden_size, F = b->p->intermediate_size, Fl = b->ffn, f0 = b->rank * Fl;
  char mp[160], ng[64], nu[64], ns[64], nd[64];
  snprintf(mp, sizeof mp, "%smlp.", pre);
  snprintf(ng, sizeof ng, "l%lld.gate_proj", (long long)l);
  snprintf(nu, sizeof nu, "l%lld.up_proj", (long long)l);
  snprintf(ns, sizeof ns, "l%lld.swiglu", (long long)l);
  snprintf(nd, sizeof nd, "l%lld.down_proj", (long long)l);
  int32_t gu[2];
  if (b->p->fused_proj) { /* Phi-3's gate_up_proj: gate rows, then up rows */
    gu[0] = proj_rows(b, h, mp, "gate_up_proj", 2 * F, "gate_proj", f0, Fl, H, ng);
    gu[1] = proj_rows(b, h, mp, "gate_up_proj", 2 * F, "up_proj", F + f0, Fl, H, nu);
  } else {
    gu[0] = proj_part(b, h, mp, "gate_proj", F, f0, Fl, H, false, ng);
    gu[1] = proj_part(b, h, mp, "up_proj", F, f0, Fl, H, false, nu);
  }
  ir_attr geglu = IR_AI(ir_attr_intern("act"), IR_ACT_GEGLU); /* silu: the op's default */
  int32_t m = node(b, IR_OP_SWIGLU, ns, gu, 2, &geglu, b->p->act == IR_ACT_GEGLU ? 1 : 0);
  return proj_reduce(b, m, mp, "down_proj", H, F, Fl, nd);
}

/* Layer l's norm weight pre+name, or -1 when name is NULL. */
static int32_t layer_norm_weight(builder *b, const char *pre, const char *name) {
  if (!name) return -1;
  char w[160];
  snprintf(w, sizeof w, "%s%s.weight", pre, name);
  return norm_weight(b, w, b->p->hidden_size);
}

/* A block's output y normalized by w (Gemma's post norms) when w is set, then added to the
 * residual x. */
static int32_t residual(builder *b, int32_t x, int32_t y, int32_t w, int64_t l, const char *what) {
  char nm[64];
  if (w >= 0) {
    snprintf(nm, sizeof nm, "l%lld.%s_post_norm", (long long)l, what);
    y = rms_norm(b, y, w, nm);
  }
  snprintf(nm, sizeof nm, "l%lld.%s_residual", (long long)l, what);
  int32_t in[2] = {x, y};
  return node(b, IR_OP_ADD, nm, in, 2, NULL, 0);
}

static int32_t layer(builder *b, int32_t x, int64_t l) {
  char pre[64], nm[64];
  bool sw = b->p->sandwich_norms;
  snprintf(pre, sizeof pre, "model.layers.%lld.", (long long)l);
  /* Norm weights first, so that even unfolded casts precede the residual adds and the
   * add + norm fusion always finds its weight available. Gemma's post_attention_layernorm
   * normalizes the attention's output; Llama's is the MLP's input norm. */
  int32_t w_attn = layer_norm_weight(b, pre, "input_layernorm");
  int32_t w_mlp =
      layer_norm_weight(b, pre, sw ? "pre_feedforward_layernorm" : "post_attention_layernorm");
  int32_t w_attn_post = layer_norm_weight(b, pre, sw ? "post_attention_layernorm" : NULL);
  int32_t w_mlp_post = layer_norm_weight(b, pre, sw ? "post_feedforward_layernorm" : NULL);
  snprintf(nm, sizeof nm, "l%lld.attn_norm", (long long)l);
  int32_t h = rms_norm(b, x, w_attn, nm);
  x = residual(b, x, attention_block(b, h, l, pre), w_attn_post, l, "attn");
  snprintf(nm, sizeof nm, "l%lld.mlp_norm", (long long)l);
  h = rms_norm(b, x, w_mlp, nm);
  return residual(b, x, mlp_block(b, h, l, pre), w_mlp_post, l, "mlp");
}

static void add_inputs(builder *b) {
  ir_dim t = DS(IR_SYM_TOKENS), lg = DS(IR_SYM_LOGITS);
  b->tokens = ir_graph_add_input(b->g, "tokens", IR_I32, 1, &t);
  b->positions = ir_graph_add_input(b->g, "positions", IR_I32, 1, &t);
  b->logit_rows = ir_graph_add_input(b->g, "logit_rows", IR_I32, 1, &lg);
  if (b->tokens < 0 || b->positions < 0 || b->logit_rows < 0)
    b->st = ir_diag_set(b->d, IR_OOM, "out of memory");
}

static void set_config(builder *b, int64_t max_pos) {
  const model_llama_params *p = b->p;
  ir_model_config *c = &b->g->config;
  snprintf(c->arch, sizeof c->arch, "%.*s", (int)sizeof c->arch - 1, p->arch);
  c->vocab_size = p->vocab_size;
  c->hidden_size = p->hidden_size;
  c->n_layers = p->n_layers;
  c->n_heads = b->nh; /* the rank's, under tensor parallelism */
  c->n_kv_heads = b->nkv;
  c->head_dim = p->head_dim;
  c->intermediate_size = b->ffn;
  c->tp_size = b->tp > 1 ? b->tp : 0;
  c->max_position = max_pos;
  c->rms_norm_eps = p->rms_norm_eps;
  c->rope_theta = p->rope_theta;
  c->tie_word_embeddings = p->tie_word_embeddings;
  c->attention_bias = p->attention_bias;
  c->bos_token_id = p->bos_token_id;
  c->eos_token_id = p->eos_token_id;
  c->max_tokens = b->bo->max_tokens;
  c->max_seqs = b->bo->max_seqs;
  c->max_logits = b->bo->max_logits;
  c->kv_block_size = b->bo->kv_block_size;
}

static void build_body(builder *b) {
  const model_llama_params *p = b->p;
  int64_t row0 = b->rank * b->vocab; /* tensor parallelism: this rank's vocabulary rows */
  int32_t emb = b->tp > 1
                    ? as_dtype(b,
                               weight_rows(b, "model.embed_tokens.weight", p->vocab_size, row0,
                                           b->vocab, p->hidden_size, "model.embed_tokens.weight"),
                               b->bo->weight_dtype)
                    : mat_weight(b, "model.embed_tokens.weight", p->vocab_size, p->hidden_size);
  int32_t in[2] = {b->tokens, emb};
  ir_attr ea[2];
  int na = 0;
  if (p->embed_scale > 0) ea[na++] = IR_AF(ir_attr_intern("scale"), (double)(float)p->embed_scale);
  if (b->tp > 1) ea[na++] = IR_AI(ir_attr_intern("vocab_part"), 1); /* rows from the rank */
  int32_t x = node(b, IR_OP_EMBED, "embed", in, 2, ea, na);
  if (b->tp > 1) { /* each rank has its rows' tokens, zeros elsewhere: the sum is every token */
    ir_attr a = IR_AI(ir_attr_intern("ranks"), b->tp);
    x = node(b, IR_OP_ALL_REDUCE, "embed.all_reduce", &x, 1, &a, 1);
  }
  for (int64_t l = 0; l < p->n_layers && b->st == IR_OK; l++) x = layer(b, x, l);
  in[0] = x;
  in[1] = b->logit_rows;
  x = node(b, IR_OP_GATHER_ROWS, "logit_rows", in, 2, NULL, 0);
  x = rms_norm(b, x, norm_weight(b, "model.norm.weight", p->hidden_size), "final_norm");
  in[0] = x;
  const char *head = p->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  if (b->tp > 1 && !p->tie_word_embeddings) /* this rank's rows of the vocabulary */
    in[1] = as_dtype(
        b, weight_rows(b, head, p->vocab_size, row0, b->vocab, p->hidden_size, "lm_head.weight"),
        b->bo->weight_dtype);
  else in[1] = p->tie_word_embeddings ? emb : mat_weight(b, head, p->vocab_size, p->hidden_size);
  int32_t logits = node(b, IR_OP_MATMUL, "logits", in, 2, NULL, 0);
  if (b->tp > 1) {
    ir_attr a = IR_AI(ir_attr_intern("ranks"), b->tp);
    logits = node(b, IR_OP_ALL_GATHER, "logits_all_gather", &logits, 1, &a, 1);
  }
  if (p->final_softcap > 0) { /* Gemma 2 */
    ir_attr cap = IR_AF(ir_attr_intern("cap"), p->final_softcap);
    logits = node(b, IR_OP_SOFTCAP, "logits_softcap", &logits, 1, &cap, 1);
  }
  if (b->st == IR_OK && !ir_graph_add_output(b->g, logits))
    b->st = ir_diag_set(b->d, IR_OOM, "out of memory");
}

/* Tensor parallelism over bo->tp_size ranks: the heads, the kv heads (or ranks a multiple
 * of them: each kv head replicated on tp / n_kv_heads ranks), the ffn and the vocabulary
 * must divide. */
static ir_status tp_check(const model_llama_params *p, const model_build_opts *bo, ir_diag *d) {
  int tp = bo->tp_size > 1 ? bo->tp_size : 1;
  if (tp == 1) return IR_OK;
  if (tp > IR_MAX_TP || bo->tp_rank < 0 || bo->tp_rank >= tp)
    return ir_diag_set(d, IR_INVALID_ARG, "tensor parallelism: rank %d of %d (at most %d ranks)",
                       bo->tp_rank, tp, IR_MAX_TP);
  const char *what = NULL;
  long long v = 0;
  if (p->n_heads % tp) what = "num_attention_heads", v = p->n_heads;
  else if (p->n_kv_heads % tp && tp % p->n_kv_heads)
    what = "num_key_value_heads (nor a divisor of the ranks)", v = p->n_kv_heads;
  else if (p->intermediate_size % tp) what = "intermediate_size", v = p->intermediate_size;
  else if (p->vocab_size % tp) what = "vocab_size", v = p->vocab_size;
  if (what)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "--tp %d: %s %lld does not divide into %d tensor-parallel ranks", tp, what,
                       v, tp);
  return IR_OK;
}

/* This rank's share of the heads, kv heads, ffn and vocabulary. */
static void tp_shard(builder *b) {
  const model_llama_params *p = b->p;
  b->tp = b->bo->tp_size > 1 ? b->bo->tp_size : 1;
  b->rank = b->tp > 1 ? b->bo->tp_rank : 0;
  b->nh = p->n_heads / b->tp;
  b->nkv = p->n_kv_heads >= b->tp ? p->n_kv_heads / b->tp : 1;
  b->kv0 = p->n_kv_heads >= b->tp ? b->rank * b->nkv : b->rank / (b->tp / p->n_kv_heads);
  b->ffn = p->intermediate_size / b->tp;
  b->vocab = p->vocab_size / b->tp;
}

ir_status model_llama_build(const model_llama_params *params, const model_tensor_src *src,
                            const model_build_opts *bo, ir_graph **out, ir_diag *d) {
  *out = NULL;
  model_llama_params kept = *params; /* bo->layers: the first layers only */
  const model_llama_params *p = &kept;
  if (bo->layers > params->n_layers)
    return ir_diag_set(d, IR_INVALID_ARG, "--layers %lld: the model has %lld decoder layers",
                       (long long)bo->layers, (long long)params->n_layers);
  if (bo->layers > 0) kept.n_layers = bo->layers;
  ir_status st = model_llama_check(p, d);
  if (st != IR_OK) return st;
  if ((st = tp_check(p, bo, d)) != IR_OK) return st;
  builder b = {
      .g = ir_graph_create(), .p = p, .src = src, .bo = bo, .d = d, .st = IR_OK, .one = -1};
  if (!b.g) return ir_diag_set(d, IR_OOM, "out of memory");
  tp_shard(&b);
  int64_t max_pos = p->max_position;
  if (bo->max_context > 0 && bo->max_context < max_pos) max_pos = bo->max_context;
  set_config(&b, max_pos);
  add_inputs(&b);
  if (b.st == IR_OK) rope_tables(&b, max_pos);
  if (b.st == IR_OK) build_body(&b);
  if (b.st == IR_OK) b.st = ir_graph_verify(b.g, d);
  if (b.st != IR_OK) {
    ir_graph_destroy(b.g);
    return b.st;
  }
  *out = b.g;
  return IR_OK;
}
