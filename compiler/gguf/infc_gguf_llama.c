/* infc_gguf_llama: GGUF metadata -> model_llama_params, HF tensor names -> GGUF names. */
#include "infc_gguf_llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names -------------------------------------------------------------------------- */

typedef struct gl_name {
  const char *hf, *gguf;
} gl_name;

static const gl_name k_global_names[] = {
    {"model.embed_tokens", "token_embd"},
    {"model.norm", "output_norm"},
    {"lm_head", "output"},
};

static const gl_name k_layer_names[] = {
    {"input_layernorm", "attn_norm"},    {"post_attention_layernorm", "ffn_norm"},
    {"self_attn.q_proj", "attn_q"},      {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},      {"self_attn.o_proj", "attn_output"},
    {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},       {"self_attn.q_norm", "attn_q_norm"},
    {"self_attn.k_norm", "attn_k_norm"}, {"self_attn.qkv_proj", "attn_qkv"},
    {"mlp.gate_up_proj", "ffn_up"}, /* phi3: one ffn_up of gate rows then up rows */
};

/* Gemma's names where they differ: its post_attention_layernorm normalizes the attention's
 * output, its pre_feedforward_layernorm is the MLP's input norm (llama's ffn_norm). */
static const gl_name k_gemma_names[] = {
    {"post_attention_layernorm", "post_attention_norm"},
    {"pre_feedforward_layernorm", "ffn_norm"},
    {"post_feedforward_layernorm", "post_ffw_norm"},
};

#define GL_COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *gl_lookup(const gl_name *tab, size_t n, const char *hf, size_t len) {
  for (size_t i = 0; i < n; i++)
    if (strlen(tab[i].hf) == len && memcmp(tab[i].hf, hf, len) == 0) return tab[i].gguf;
  return NULL;
}

static bool gl_is_gemma(const char *arch) {
  return arch && (!strcmp(arch, "gemma2") || !strcmp(arch, "gemma3"));
}

/* A layer tensor's GGUF name (after "blk.N."): the arch's own first, then llama's. */
static const char *gl_layer_name(const char *arch, const char *hf, size_t len) {
  const char *g =
      gl_is_gemma(arch) ? gl_lookup(k_gemma_names, GL_COUNT(k_gemma_names), hf, len) : NULL;
  return g ? g : gl_lookup(k_layer_names, GL_COUNT(k_layer_names), hf, len);
}

bool infc_gguf_llama_name(const char *hf, char *buf, size_t len) {
  return infc_gguf_llama_name_arch("llama", hf, buf, len);
}

bool infc_gguf_llama_name_arch(const char *arch, const char *hf, char *buf, size_t len) {
  const char *dot = strrchr(hf, '.');
  if (!dot || (strcmp(dot, ".weight") != 0 && strcmp(dot, ".bias") != 0)) return false;
  const char *g = gl_lookup(k_global_names, GL_COUNT(k_global_names), hf, (size_t)(dot - hf));
  int n = -1;
  if (g) {
    n = snprintf(buf, len, "%s%s", g, dot);
  } else if (strncmp(hf, "model.layers.", 13) == 0) {
    const char *p = hf + 13, *q = p;
    while (*q >= '0' && *q <= '9') q++;
    if (q == p || q - p > 9 || *q != '.' || (*p == '0' && q - p > 1)) return false;
    g = gl_layer_name(arch, q + 1, (size_t)(dot - q - 1));
    if (g) n = snprintf(buf, len, "blk.%.*s.%s%s", (int)(q - p), p, g, dot);
  }
  return n > 0 && (size_t)n < len;
}

static bool gl_find(void *ctx, const char *name, model_tensor *out) {
  char gname[256], arch[32] = "";
  fmt_gguf_str a;
  ir_diag d = {0};
  if (fmt_gguf_get_str(ctx, "general.architecture", &a, &d) == IR_OK && a.len < sizeof arch)
    memcpy(arch, a.ptr, a.len), arch[a.len] = 0;
  if (!infc_gguf_llama_name_arch(arch, name, gname, sizeof gname)) return false;
  const fmt_gguf_tensor *t = fmt_gguf_tensor_find(ctx, gname);
  if (!t) return false;
  *out = (model_tensor){.dtype = t->dtype, .rank = t->rank, .data = t->data, .nbytes = t->nbytes};
  for (int i = 0; i < t->rank; i++) out->shape[i] = t->shape[i];
  return true;
}

model_tensor_src infc_gguf_llama_src(const fmt_gguf *g) {
  return (model_tensor_src){.ctx = (void *)g, .find = gl_find};
}

/* ---- metadata ----------------------------------------------------------------------- */

typedef struct gl_reader {
  const fmt_gguf *g;
  const char *arch;
  ir_diag *d;
  ir_status st;
  char key[160];
} gl_reader;

static const char *gl_key(gl_reader *r, const char *suffix) {
  snprintf(r->key, sizeof r->key, "%s.%s", r->arch, suffix);
  return r->key;
}

static int64_t gl_int(gl_reader *r, const char *key, bool required, int64_t def) {
  if (r->st != IR_OK) return def;
  if (!fmt_gguf_kv_find(r->g, key)) {
    if (required)
      r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "%s: metadata key '%s' is missing",
                          fmt_gguf_path(r->g), key);
    return def;
  }
  uint32_t v = 0;
  r->st = fmt_gguf_get_u32(r->g, key, &v, r->d);
  return v;
}

static double gl_float(gl_reader *r, const char *key, bool required, double def) {
  if (r->st != IR_OK || (!required && !fmt_gguf_kv_find(r->g, key))) return def;
  float v = 0;
  r->st = fmt_gguf_get_f32(r->g, key, &v, r->d);
  return v;
}

static void gl_refuse(gl_reader *r, const char *what) {
  if (r->st == IR_OK)
    r->st = ir_diag_set(r->d, IR_UNSUPPORTED, "%s: %s is not supported", fmt_gguf_path(r->g), what);
}

static void gl_arch(gl_reader *r, model_llama_params *p) {
  fmt_gguf_str a;
  r->st = fmt_gguf_get_str(r->g, "general.architecture", &a, r->d);
  if (r->st != IR_OK) return;
  if (fmt_gguf_str_eq(a, "llama")) r->arch = "llama";
  else if (fmt_gguf_str_eq(a, "qwen2")) r->arch = "qwen2";
  else if (fmt_gguf_str_eq(a, "qwen3")) r->arch = "qwen3";
  else if (fmt_gguf_str_eq(a, "phi3")) r->arch = "phi3";
  else if (fmt_gguf_str_eq(a, "smollm3")) r->arch = "smollm3";
  else if (fmt_gguf_str_eq(a, "gemma2")) r->arch = "gemma2";
  else if (fmt_gguf_str_eq(a, "gemma3")) r->arch = "gemma3";
  else {
    r->st = ir_diag_set(r->d, IR_UNSUPPORTED,
                        "%s: unknown architecture '%.*s' (supported: "
                        "llama, qwen2, qwen3, phi3, smollm3, gemma2, gemma3)",
                        fmt_gguf_path(r->g), a.len > 64 ? 64 : (int)a.len, a.ptr);
    return;
  }
  snprintf(p->arch, sizeof p->arch, "%s", r->arch);
  /* llama.cpp runs llama with its "normal" rope on adjacent pairs (the converter
   * permuted the q/k rows to match) and qwen2/qwen3/phi3 with NeoX rotate-half, as HF does. */
  /* smollm3 is llama's layout (rope on adjacent pairs) with no rope in every 4th layer, the
   * step llama.cpp fixes for the arch */
  bool llama_like = !strcmp(r->arch, "llama") || !strcmp(r->arch, "smollm3");
  p->rope_interleaved = llama_like;
  p->no_rope_every = strcmp(r->arch, "smollm3") == 0 ? 4 : 0;
  p->qk_norm = strcmp(r->arch, "qwen3") == 0 || strcmp(r->arch, "gemma3") == 0;
  p->fused_proj = strcmp(r->arch, "phi3") == 0;
}

/* Gemma 2 / 3 as llama.cpp runs them: the norms stored as 1 + w by the converter, the
 * embeddings times sqrt(embedding_length), gelu_tanh MLP, post norms, sliding layers with a
 * full one every 2 (gemma2) or 6 (gemma3; attention.sliding_window_pattern if written)
 * layers, gemma3's sliding layers on a rope of base 10000 unscaled, soft caps (gemma2).
 * The scores' scale: attention.scale if written, else llama.cpp's rule (1 / sqrt(head_dim),
 * but 1 / sqrt(embedding_length / head_count) for the 27B models: 46 layers (Gemma 2), 62
 * (Gemma 3), whose query_pre_attn_scalar is that). */
static void gl_gemma(gl_reader *r, model_llama_params *p) {
  if (r->st != IR_OK || !gl_is_gemma(r->arch)) return; /* (no arch when it was refused) */
  bool g3 = !strcmp(r->arch, "gemma3");
  p->sandwich_norms = true;
  p->act = IR_ACT_GEGLU;
  p->embed_scale = sqrt((double)p->hidden_size);
  bool big = p->n_layers == (g3 ? 62 : 46);
  double qs =
      big && p->n_heads > 0 ? (double)p->hidden_size / (double)p->n_heads : (double)p->head_dim;
  p->attn_scale = gl_float(r, gl_key(r, "attention.scale"), false, 1.0 / sqrt(qs));
  p->attn_softcap = gl_float(r, gl_key(r, "attn_logit_softcapping"), false, 0);
  p->final_softcap = gl_float(r, gl_key(r, "final_logit_softcapping"), false, 0);
  p->sliding_window = gl_int(r, gl_key(r, "attention.sliding_window"), false, g3 ? 512 : 4096);
  p->swa_period = gl_int(r, gl_key(r, "attention.sliding_window_pattern"), false, g3 ? 6 : 2);
  if (g3) p->rope_local_theta = 10000.0;
}

static void gl_sizes(gl_reader *r, model_llama_params *p) {
  p->n_layers = gl_int(r, gl_key(r, "block_count"), true, 0);
  p->max_position = gl_int(r, gl_key(r, "context_length"), true, 0);
  p->hidden_size = gl_int(r, gl_key(r, "embedding_length"), true, 0);
  p->intermediate_size = gl_int(r, gl_key(r, "feed_forward_length"), true, 0);
  p->n_heads = gl_int(r, gl_key(r, "attention.head_count"), true, 0);
  p->n_kv_heads = gl_int(r, gl_key(r, "attention.head_count_kv"), false, p->n_heads);
  int64_t def_hd = p->n_heads > 0 ? p->hidden_size / p->n_heads : 0;
  p->head_dim = gl_int(r, gl_key(r, "attention.key_length"), false, def_hd);
  int64_t vd = gl_int(r, gl_key(r, "attention.value_length"), false, p->head_dim);
  p->rms_norm_eps = gl_float(r, gl_key(r, "attention.layer_norm_rms_epsilon"), true, 0);
  p->rope_theta = gl_float(r, gl_key(r, "rope.freq_base"), false, 10000.0);
  int64_t rot = gl_int(r, gl_key(r, "rope.dimension_count"), false, p->head_dim);
  /* each layer holds tensors: a count the file cannot back is refused before any loop */
  if (r->st == IR_OK && (uint64_t)p->n_layers > fmt_gguf_tensor_count(r->g))
    r->st = ir_diag_set(r->d, IR_BAD_FORMAT,
                        "%s: block_count %lld exceeds the %zu tensors "
                        "of the file",
                        fmt_gguf_path(r->g), (long long)p->n_layers, fmt_gguf_tensor_count(r->g));
  if (r->st == IR_OK && vd != p->head_dim) gl_refuse(r, "a value_length unlike key_length");
  if (r->st == IR_OK && rot != p->head_dim) p->rot_dim = rot; /* partial rotary */
}

static void gl_vocab(gl_reader *r, model_llama_params *p) {
  if (r->st != IR_OK) return;
  const char *key = gl_key(r, "vocab_size");
  if (fmt_gguf_kv_find(r->g, key)) {
    p->vocab_size = gl_int(r, key, true, 0);
  } else if (fmt_gguf_kv_find(r->g, "tokenizer.ggml.tokens")) {
    const fmt_gguf_str *toks;
    uint64_t n = 0;
    r->st = fmt_gguf_get_strs(r->g, "tokenizer.ggml.tokens", &toks, &n, r->d);
    p->vocab_size = (int64_t)n;
  } else {
    const fmt_gguf_tensor *t = fmt_gguf_tensor_find(r->g, "token_embd.weight");
    p->vocab_size = t && t->rank == 2 ? t->shape[0] : 0;
  }
  p->bos_token_id = gl_int(r, "tokenizer.ggml.bos_token_id", false, -1);
  p->eos_token_id = gl_int(r, "tokenizer.ggml.eos_token_id", false, -1);
}

/* Longrope's factors: tensor t, n positive f32 values, into out. */
static bool gl_factors(gl_reader *r, const fmt_gguf_tensor *t, const char *name, int64_t n,
                       float *out, int64_t cap) {
  if (n < 1 || n > cap) {
    r->st =
        ir_diag_set(r->d, IR_UNSUPPORTED,
                    "%s: longrope takes 1 to %lld rotated pairs "
                    "(rotary dims up to %lld), '%s' needs %lld",
                    fmt_gguf_path(r->g), (long long)cap, (long long)(2 * cap), name, (long long)n);
    return false;
  }
  if (!t || t->dtype != IR_F32 || t->rank != 1 || t->shape[0] != n) {
    r->st = ir_diag_set(r->d, IR_BAD_FORMAT,
                        "%s: tensor '%s' must be %lld f32 values (one per "
                        "rotated pair), with its long/short twin",
                        fmt_gguf_path(r->g), name, (long long)n);
    return false;
  }
  memcpy(out, t->data, (size_t)n * sizeof *out);
  for (int64_t i = 0; i < n; i++)
    if (!(out[i] > 0)) {
      r->st = ir_diag_set(r->d, IR_BAD_FORMAT,
                          "%s: tensor '%s' holds a factor that is not "
                          "positive",
                          fmt_gguf_path(r->g), name);
      return false;
    }
  return true;
}

/* The rope's scaling as llama.cpp's converter writes it: rope.scaling.type linear with
 * rope.scaling.factor; yarn with the factor, rope.scaling.original_context_length and
 * optionally rope.scaling.attn_factor (llama.cpp's ramp over beta 32..1, cos/sin scaled by
 * attn_factor * (1 + 0.1 ln factor)); longrope (Phi-3.5 / 4) as rope_factors_long and
 * rope_factors_short tensors with rope.scaling.original_context_length and attn_factor; or
 * (Llama 3.1's scaling) a rope_freqs.weight tensor of f32 divisors of the frequencies. */
static void gl_rope_scaling(gl_reader *r, model_llama_params *p) {
  const fmt_gguf_kv *kv = fmt_gguf_kv_find(r->g, gl_key(r, "rope.scaling.type"));
  if (kv && kv->value.type != FMT_GGUF_STRING) {
    r->st =
        ir_diag_set(r->d, IR_BAD_FORMAT, "%s: '%s' must be a string", fmt_gguf_path(r->g), r->key);
    return;
  }
  if (kv && fmt_gguf_str_eq(kv->value.str, "linear")) {
    p->rope_scaling = MODEL_ROPE_LINEAR;
    p->rope_factor = gl_float(r, gl_key(r, "rope.scaling.factor"), true, 0);
  } else if (kv && fmt_gguf_str_eq(kv->value.str, "yarn")) {
    p->rope_scaling = MODEL_ROPE_YARN;
    p->rope_factor = gl_float(r, gl_key(r, "rope.scaling.factor"), true, 0);
    p->rope_orig_context = gl_int(r, gl_key(r, "rope.scaling.original_context_length"), true, 0);
    double attn = gl_float(r, gl_key(r, "rope.scaling.attn_factor"), false, 1.0);
    p->rope_beta_fast = 32.0, p->rope_beta_slow = 1.0, p->rope_yarn_truncate = true;
    p->rope_attn_factor = attn * (p->rope_factor > 1.0 ? 1.0 + 0.1 * log(p->rope_factor) : 1.0);
  } else if (kv && !fmt_gguf_str_eq(kv->value.str, "none")) {
    char what[96];
    snprintf(what, sizeof what, "rope scaling '%.*s' (rope.scaling.type)",
             (int)(kv->value.str.len > 32 ? 32 : kv->value.str.len), kv->value.str.ptr);
    gl_refuse(r, what);
  }
  int64_t rot = model_llama_rot_dims(p);
  const fmt_gguf_tensor *fl = fmt_gguf_tensor_find(r->g, "rope_factors_long.weight");
  const fmt_gguf_tensor *fs = fmt_gguf_tensor_find(r->g, "rope_factors_short.weight");
  if (r->st == IR_OK && (fl || fs)) { /* longrope, as llama.cpp's phi3 converter writes it */
    if (!gl_factors(r, fl, "rope_factors_long.weight", rot / 2, p->rope_long,
                    MODEL_ROPE_MAX_FACTORS) ||
        !gl_factors(r, fs, "rope_factors_short.weight", rot / 2, p->rope_short,
                    MODEL_ROPE_MAX_FACTORS))
      return;
    p->rope_scaling = MODEL_ROPE_LONGROPE;
    p->rope_orig_context = gl_int(r, gl_key(r, "rope.scaling.original_context_length"), true, 0);
    double f =
        p->rope_orig_context > 1 ? (double)p->max_position / (double)p->rope_orig_context : 1.0;
    p->rope_attn_factor =
        gl_float(r, gl_key(r, "rope.scaling.attn_factor"), false,
                 f > 1.0 ? sqrt(1.0 + log(f) / log((double)p->rope_orig_context)) : 1.0);
  }
  const fmt_gguf_tensor *t = fmt_gguf_tensor_find(r->g, "rope_freqs.weight");
  if (r->st != IR_OK || !t) return;
  if (t->dtype != IR_F32 || t->rank != 1 || t->shape[0] * 2 != rot)
    r->st = ir_diag_set(r->d, IR_BAD_FORMAT,
                        "%s: tensor 'rope_freqs.weight' must be %lld f32 "
                        "values (one per rotated pair)",
                        fmt_gguf_path(r->g), (long long)(rot / 2));
  else p->rope_freq_factors = t->data;
}

/* Features llama.cpp can run on these archs but the template cannot express. */
static void gl_features(gl_reader *r, model_llama_params *p) {
  if (r->st != IR_OK) return;
  if (gl_int(r, gl_key(r, "expert_count"), false, 0) > 0)
    gl_refuse(r, "a mixture of experts (expert_count > 0)");
  if (r->st == IR_OK) gl_rope_scaling(r, p);
  p->tie_word_embeddings = !fmt_gguf_tensor_find(r->g, "output.weight");
  p->attention_bias = fmt_gguf_tensor_find(r->g, "blk.0.attn_q.bias") != NULL;
}

/* Layer l's tensors named in tab (weights and biases), where present, have known types. */
static ir_status gl_check_layer(const fmt_gguf *g, int64_t l, const gl_name *tab, size_t n,
                                ir_diag *d) {
  char name[96];
  for (size_t i = 0; i < 2 * n; i++) {
    snprintf(name, sizeof name, "blk.%lld.%s.%s", (long long)l, tab[i / 2].gguf,
             i % 2 ? "bias" : "weight");
    const fmt_gguf_tensor *t = fmt_gguf_tensor_find(g, name);
    if (t && fmt_gguf_type_check(t, d) != IR_OK) return d->status;
  }
  return IR_OK;
}

/* Every tensor the template will ask for must have a type the kernels know. */
static ir_status gl_check_types(const fmt_gguf *g, const model_llama_params *p, ir_diag *d) {
  static const char *const k_global[] = {"token_embd.weight", "output_norm.weight",
                                         "output.weight"};
  for (size_t i = 0; i < GL_COUNT(k_global); i++) {
    const fmt_gguf_tensor *t = fmt_gguf_tensor_find(g, k_global[i]);
    if (t && fmt_gguf_type_check(t, d) != IR_OK) return d->status;
  }
  for (int64_t l = 0; l < p->n_layers; l++)
    if (gl_check_layer(g, l, k_layer_names, GL_COUNT(k_layer_names), d) != IR_OK ||
        gl_check_layer(g, l, k_gemma_names, GL_COUNT(k_gemma_names), d) != IR_OK)
      return d->status;
  return IR_OK;
}

ir_status infc_gguf_llama_params(const fmt_gguf *g, model_llama_params *out, ir_diag *d) {
  memset(out, 0, sizeof *out);
  gl_reader r = {.g = g, .d = d, .st = IR_OK};
  gl_arch(&r, out);
  if (r.st == IR_OK) gl_sizes(&r, out);
  gl_gemma(&r, out);
  gl_vocab(&r, out);
  gl_features(&r, out);
  if (r.st == IR_OK && (r.st = gl_check_types(g, out, d)) != IR_OK)
    ir_diag_prefix(d, "%s", fmt_gguf_path(g));
  if (r.st == IR_OK && (r.st = model_llama_check(out, d)) != IR_OK)
    ir_diag_prefix(d, "%s", fmt_gguf_path(g));
  return r.st;
}
