/* infc_hfconfig: config.json -> model_llama_params, with every key checked. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infc_hfconfig.h"
#include "infc_util.h"
#include "ir_alloc.h"

typedef struct cfg_reader {
  const cJSON *root;
  ir_diag *d;
  ir_status st;
} cfg_reader;

/* An integer value; `required` keys that are absent or null are errors. */
static int64_t get_int(cfg_reader *r, const char *key, bool required, int64_t def) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
  if (!v || cJSON_IsNull(v)) {
    if (required && r->st == IR_OK)
      r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "missing key '%s'", key);
    return def;
  }
  /* Token ids may be lists (several EOS tokens): the first is the primary one. */
  bool ids = strstr(key, "token_id") != NULL;
  if (ids && cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) v = cJSON_GetArrayItem(v, 0);
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
      fabs(v->valuedouble) > 9007199254740992.0) {
    if (r->st == IR_OK)
      r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "key '%s' must be an integer", key);
    return def;
  }
  return (int64_t)v->valuedouble;
}

static double get_num(cfg_reader *r, const char *key, bool required, double def) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
  if (!v || cJSON_IsNull(v)) {
    if (required && r->st == IR_OK)
      r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "missing key '%s'", key);
    return def;
  }
  if (!cJSON_IsNumber(v)) {
    if (r->st == IR_OK) r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "key '%s' must be a number", key);
    return def;
  }
  return v->valuedouble;
}

static bool get_bool(cfg_reader *r, const char *key, bool def) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
  if (!v || cJSON_IsNull(v)) return def;
  if (!cJSON_IsBool(v)) {
    if (r->st == IR_OK)
      r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "key '%s' must be true or false", key);
    return def;
  }
  return cJSON_IsTrue(v);
}

static const char *get_str(cfg_reader *r, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key);
  if (!v || cJSON_IsNull(v)) return NULL;
  if (!cJSON_IsString(v)) {
    if (r->st == IR_OK) r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "key '%s' must be a string", key);
    return NULL;
  }
  return v->valuestring;
}

/* A list of exactly n positive numbers (longrope's factors) into out, which holds cap. */
static void get_factors(cfg_reader *r, const char *key, int64_t n, float *out, int64_t cap) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, key), *e;
  if (r->st != IR_OK) return;
  if (n < 1 || n > cap) {
    r->st = ir_diag_set(r->d, IR_UNSUPPORTED,
                        "key '%s': longrope takes 1 to %lld rotated pairs "
                        "(rotary dims up to %lld), this config has %lld",
                        key, (long long)cap, (long long)(2 * cap), (long long)n);
    return;
  }
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != n) {
    r->st = ir_diag_set(r->d, IR_BAD_FORMAT,
                        "key '%s' must be a list of %lld numbers (one per "
                        "rotated pair)",
                        key, (long long)n);
    return;
  }
  int64_t i = 0;
  cJSON_ArrayForEach(e, v) {
    if (!cJSON_IsNumber(e) || !(e->valuedouble > 0)) {
      r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "key '%s' must hold positive numbers", key);
      return;
    }
    out[i++] = (float)e->valuedouble;
  }
}

/* partial_rotary_factor (top level, or in rope_parameters): the rope turns the first
 * int(head_dim * factor) dims of each head (transformers' dim), which must be even. */
static void read_partial_rotary(cfg_reader *r, model_llama_params *p) {
  double f = get_num(r, "partial_rotary_factor", false, 0.0);
  if (r->st != IR_OK || f == 0.0) return;
  /* the factor's range first: a huge one would overflow the conversion (undefined) */
  int64_t rot = f > 0.0 && f <= 1.0 ? (int64_t)((double)p->head_dim * f) : 0;
  if (!(f > 0.0 && f <= 1.0) || rot < 2 || rot % 2)
    r->st = ir_diag_set(r->d, IR_UNSUPPORTED,
                        "partial_rotary_factor %g gives %lld rotary dims "
                        "of %lld: a positive even count is needed",
                        f, (long long)rot, (long long)p->head_dim);
  else p->rot_dim = rot == p->head_dim ? 0 : rot;
}

/* SmolLM3's NoPE layers: no_rope_layers (1: the layer has a rope) or, without it, one every
 * no_rope_layer_interval (4) layers. The template takes the periodic pattern only. */
static void read_no_rope(cfg_reader *r, model_llama_params *p) {
  if (strcmp(p->arch, "smollm3") || r->st != IR_OK) return;
  int64_t every = get_int(r, "no_rope_layer_interval", false, 4);
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(r->root, "no_rope_layers"), *e;
  if (list && !cJSON_IsNull(list)) {
    int64_t l = 0, n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : -1;
    bool ok = n == p->n_layers;
    const cJSON *items = ok ? list : NULL;
    cJSON_ArrayForEach(e, items) {
      bool want = every <= 0 || (l + 1) % every != 0; /* the layer keeps its rope */
      ok = ok && cJSON_IsNumber(e) && (e->valueint != 0) == want &&
           (e->valuedouble == 0 || e->valuedouble == 1);
      l++;
    }
    if (!ok) {
      r->st = ir_diag_set(r->d, IR_UNSUPPORTED,
                          "no_rope_layers must be %lld entries of 0/1 with "
                          "a 0 every no_rope_layer_interval (%lld) layers; other patterns are "
                          "not supported",
                          (long long)p->n_layers, (long long)every);
      return;
    }
  }
  p->no_rope_every = every > 0 ? every : 0;
}

/* YaRN's attention factor for a scale and an mscale (transformers' get_mscale). */
static double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* The rope's scaling: "rope_scaling" (transformers 4) or "rope_parameters" (transformers
 * 5, which also holds rope_theta), {"rope_type" (or "type"): default | linear | llama3 |
 * yarn | longrope, ...}. Other types (dynamic, ...) are refused by name. */
static void read_rope_at(cfg_reader *r, const char *key, const cJSON *rp, model_llama_params *p) {
  if (!rp || cJSON_IsNull(rp) || r->st != IR_OK) return;
  if (!cJSON_IsObject(rp)) {
    r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "key '%s' must be an object", key);
    return;
  }
  cfg_reader sub = {.root = rp, .d = r->d, .st = IR_OK};
  const char *t = get_str(&sub, "rope_type");
  if (!t && sub.st == IR_OK) t = get_str(&sub, "type");
  bool linear = t && !strcmp(t, "linear"), llama3 = t && !strcmp(t, "llama3");
  bool yarn = t && !strcmp(t, "yarn"), longrope = t && !strcmp(t, "longrope");
  if (sub.st == IR_OK && t && strcmp(t, "default") && !linear && !llama3 && !yarn && !longrope) {
    r->st = ir_diag_set(r->d, IR_UNSUPPORTED,
                        "%s type '%s' is not supported yet (supported: "
                        "default, linear, llama3, yarn, longrope)",
                        key, t);
    return;
  }
  p->rope_theta = get_num(&sub, "rope_theta", false, p->rope_theta);
  read_partial_rotary(&sub, p);
  if (linear || llama3 || yarn) {
    p->rope_scaling = linear ? MODEL_ROPE_LINEAR : llama3 ? MODEL_ROPE_LLAMA3 : MODEL_ROPE_YARN;
    p->rope_factor = get_num(&sub, "factor", true, 0);
  }
  if (yarn) { /* defaults as transformers' _compute_yarn_parameters */
    p->rope_orig_context =
        get_int(&sub, "original_max_position_embeddings", false, p->max_position);
    p->rope_beta_fast = get_num(&sub, "beta_fast", false, 32.0);
    p->rope_beta_slow = get_num(&sub, "beta_slow", false, 1.0);
    p->rope_yarn_truncate = get_bool(&sub, "truncate", true);
    double f = p->rope_factor, ms = get_num(&sub, "mscale", false, 0);
    double ms_all = get_num(&sub, "mscale_all_dim", false, 0);
    p->rope_attn_factor =
        get_num(&sub, "attention_factor", false,
                ms && ms_all ? yarn_mscale(f, ms) / yarn_mscale(f, ms_all) : yarn_mscale(f, 1.0));
  }
  if (llama3) {
    p->rope_low_freq = get_num(&sub, "low_freq_factor", true, 0);
    p->rope_high_freq = get_num(&sub, "high_freq_factor", true, 0);
    p->rope_orig_context = get_int(&sub, "original_max_position_embeddings", true, 0);
  }
  if (longrope) { /* transformers' _compute_longrope_parameters; Phi-3 keeps the original
                     context at the top level (transformers 4) */
    p->rope_scaling = MODEL_ROPE_LONGROPE;
    int64_t orig = get_int(r, "original_max_position_embeddings", false, 0);
    p->rope_orig_context = get_int(&sub, "original_max_position_embeddings", !orig, orig);
    int64_t pairs = model_llama_rot_dims(p) / 2;
    get_factors(&sub, "long_factor", pairs, p->rope_long, MODEL_ROPE_MAX_FACTORS);
    get_factors(&sub, "short_factor", pairs, p->rope_short, MODEL_ROPE_MAX_FACTORS);
    double ctx = (double)p->rope_orig_context;
    double f = get_num(&sub, "factor", false, ctx > 0 ? (double)p->max_position / ctx : 1.0);
    p->rope_attn_factor = get_num(&sub, "attention_factor", false,
                                  f <= 1.0 || ctx <= 1.0 ? 1.0 : sqrt(1.0 + log(f) / log(ctx)));
  }
  if (sub.st != IR_OK) {
    ir_diag_prefix(r->d, "%s", key);
    r->st = sub.st;
  }
}

static void read_rope(cfg_reader *r, const char *key, model_llama_params *p) {
  read_rope_at(r, key, cJSON_GetObjectItemCaseSensitive(r->root, key), p);
}

/* The MLP's activation: hidden_act (or Gemma's hidden_activation), silu or GELU's tanh
 * approximation. */
static void read_act(cfg_reader *r, model_llama_params *p) {
  const char *act = get_str(r, "hidden_activation");
  if (!act) act = get_str(r, "hidden_act");
  if (!act || !strcmp(act, "silu")) p->act = IR_ACT_SWIGLU;
  else if (!strcmp(act, "gelu_pytorch_tanh") || !strcmp(act, "gelu_tanh")) p->act = IR_ACT_GEGLU;
  else if (r->st == IR_OK)
    r->st = ir_diag_set(r->d, IR_UNSUPPORTED,
                        "hidden_act '%s' is not supported (silu, "
                        "gelu_pytorch_tanh)",
                        act);
}

/* Per-layer attention kinds (transformers 5's layer_types): each entry must be what the
 * template's pattern says (model_llama_layer_slides): all full attention, all sliding
 * (Mistral), sliding from a layer on (Qwen2), or Gemma's sliding layers with a full one
 * every swa_period. */
static void check_layer_types(cfg_reader *r, const model_llama_params *p) {
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(r->root, "layer_types"), *e;
  if (!lt || cJSON_IsNull(lt) || r->st != IR_OK) return;
  if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != p->n_layers) {
    r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "layer_types must list %lld layers",
                        (long long)p->n_layers);
    return;
  }
  int64_t l = 0;
  cJSON_ArrayForEach(e, lt) {
    const char *want = model_llama_layer_slides(p, l) ? "sliding_attention" : "full_attention";
    if (!cJSON_IsString(e) || strcmp(e->valuestring, want)) {
      r->st =
          ir_diag_set(r->d, IR_UNSUPPORTED,
                      "layer_types entry %lld is '%s' where the "
                      "model's pattern has '%s' (%s); other patterns are not supported",
                      (long long)l, cJSON_IsString(e) ? e->valuestring : "?", want,
                      p->sliding_window > 0 ? "its sliding-window layers" : "all full_attention");
      return;
    }
    l++;
  }
}

/* Gemma 2 (gemma2) and Gemma 3's text model (gemma3_text): (1 + w) norms, the embeddings
 * scaled by sqrt(hidden_size), norms after attention and MLP too, scores scaled by
 * query_pre_attn_scalar^-0.5, soft caps (Gemma 2), sliding layers with a full one every 2
 * (Gemma 2) or sliding_window_pattern (Gemma 3: 6) layers, whose rope has base
 * rope_local_base_freq and no scaling (Gemma 3), and per-head q/k norms (Gemma 3). */
static void read_gemma(cfg_reader *r, model_llama_params *p) {
  bool g3 = !strcmp(p->arch, "gemma3_text");
  if (strcmp(p->arch, "gemma2") && !g3) return;
  p->norm_plus_one = p->sandwich_norms = true;
  p->embed_scale = sqrt((double)p->hidden_size);
  p->attn_scale = 1.0 / sqrt(get_num(r, "query_pre_attn_scalar", false, (double)p->head_dim));
  p->attn_softcap = get_num(r, "attn_logit_softcapping", false, 0);
  p->final_softcap = get_num(r, "final_logit_softcapping", false, 0);
  p->sliding_window = get_int(r, "sliding_window", false, 4096); /* transformers' default */
  p->swa_period = g3 ? get_int(r, "sliding_window_pattern", false, 6) : 2;
  /* transformers 5 lists the layers' kinds instead: the period is the first full layer's
   * number (check_layer_types then checks the rest) */
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(r->root, "layer_types"), *e;
  const cJSON *items = cJSON_IsArray(lt) ? lt : NULL;
  int64_t l = 0;
  cJSON_ArrayForEach(e, items) {
    l++;
    if (cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")) {
      p->swa_period = l;
      break;
    }
  }
  p->qk_norm = g3;
  if (g3) p->rope_local_theta = get_num(r, "rope_local_base_freq", false, 10000.0);
  if (get_bool(r, "use_bidirectional_attention", false) && r->st == IR_OK) /* EmbeddingGemma */
    r->st = ir_diag_set(r->d, IR_UNSUPPORTED,
                        "use_bidirectional_attention (an encoder) is not "
                        "supported");
  if (r->st == IR_OK && !(p->attn_scale > 0 && p->swa_period > 0))
    r->st = ir_diag_set(r->d, IR_BAD_FORMAT,
                        "query_pre_attn_scalar and sliding_window_pattern "
                        "must be positive");
}

/* transformers 5 keys Gemma 3's rope_parameters by layer type: full_attention's is the
 * model's rope, sliding_attention's the local one (a plain rope: its rope_theta). */
static bool read_rope_by_layer_type(cfg_reader *r, model_llama_params *p) {
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(r->root, "rope_parameters");
  const cJSON *full = rp ? cJSON_GetObjectItemCaseSensitive(rp, "full_attention") : NULL;
  const cJSON *slide = rp ? cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention") : NULL;
  if (!cJSON_IsObject(full) && !cJSON_IsObject(slide)) return false;
  read_rope_at(r, "rope_parameters.full_attention", full, p);
  if (r->st == IR_OK && cJSON_IsObject(slide)) {
    cfg_reader s = {.root = slide, .d = r->d, .st = IR_OK};
    const char *t = get_str(&s, "rope_type");
    if (s.st == IR_OK && t && strcmp(t, "default"))
      s.st = ir_diag_set(r->d, IR_UNSUPPORTED,
                         "rope_parameters.sliding_attention type '%s' is "
                         "not supported (default)",
                         t);
    p->rope_local_theta = get_num(&s, "rope_theta", false, p->rope_local_theta);
    r->st = s.st;
  }
  return true;
}

static void read_arch(cfg_reader *r, model_llama_params *p) {
  const char *mt = get_str(r, "model_type");
  if (!mt) {
    if (r->st == IR_OK) r->st = ir_diag_set(r->d, IR_BAD_FORMAT, "missing key 'model_type'");
    return;
  }
  if (strcmp(mt, "llama") && strcmp(mt, "mistral") && strcmp(mt, "qwen2") && strcmp(mt, "qwen3") &&
      strcmp(mt, "phi3") && strcmp(mt, "smollm3") && strcmp(mt, "gemma2") &&
      strcmp(mt, "gemma3_text")) {
    if (r->st == IR_OK)
      r->st = ir_diag_set(r->d, IR_UNSUPPORTED,
                          "model_type '%s' is not supported "
                          "(supported: llama, mistral, qwen2, qwen3, phi3, smollm3, gemma2, "
                          "gemma3_text)",
                          mt);
    return;
  }
  snprintf(p->arch, sizeof p->arch, "%s", mt);
}

static void read_sizes(cfg_reader *r, model_llama_params *p) {
  p->hidden_size = get_int(r, "hidden_size", true, 0);
  p->intermediate_size = get_int(r, "intermediate_size", true, 0);
  p->n_layers = get_int(r, "num_hidden_layers", true, 0);
  p->n_heads = get_int(r, "num_attention_heads", true, 0);
  p->vocab_size = get_int(r, "vocab_size", true, 0);
  p->rms_norm_eps = get_num(r, "rms_norm_eps", true, 0);
  p->n_kv_heads = get_int(r, "num_key_value_heads", false, p->n_heads);
  int64_t def_hd = p->n_heads > 0 ? p->hidden_size / p->n_heads : 0;
  p->head_dim = get_int(r, "head_dim", false, def_hd);
  p->max_position = get_int(r, "max_position_embeddings", false, 2048);
  p->rope_theta = get_num(r, "rope_theta", false, 10000.0);
  p->bos_token_id = get_int(r, "bos_token_id", false, -1);
  p->eos_token_id = get_int(r, "eos_token_id", false, -1);
}

/* Gemma3TextConfig's defaults (transformers), which a multimodal checkpoint's text_config
 * leaves out (Gemma 3 4B's lists its sizes, rope_scaling and sliding_window only). */
static const char k_gemma3_text_defaults[] =
    "{\"model_type\": \"gemma3_text\", \"vocab_size\": 262208, \"hidden_size\": 2304, "
    "\"intermediate_size\": 9216, \"num_hidden_layers\": 26, \"num_attention_heads\": 8, "
    "\"num_key_value_heads\": 4, \"head_dim\": 256, \"hidden_activation\": "
    "\"gelu_pytorch_tanh\", \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-6, "
    "\"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, \"query_pre_attn_scalar\": "
    "256, \"sliding_window\": 4096, \"sliding_window_pattern\": 6, \"bos_token_id\": 2, "
    "\"eos_token_id\": 1, \"tie_word_embeddings\": true}";

/* Gemma 3's multimodal checkpoints (model_type gemma3, Gemma3ForConditionalGeneration):
 * the text model is text_config over Gemma3TextConfig's defaults; root is replaced by that
 * (the vision tower's tensors are never asked for). Other roots stay. */
static cJSON *unwrap_text_config(cJSON *root, bool *oom) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config"), *e;
  if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "gemma3") || !cJSON_IsObject(tc)) return root;
  cJSON *text = cJSON_Parse(k_gemma3_text_defaults);
  cJSON_ArrayForEach(e, tc) { /* each text_config key replaces its default */
    cJSON *v = text && e->string ? cJSON_Duplicate(e, true) : NULL;
    if (v) cJSON_DeleteItemFromObjectCaseSensitive(text, e->string);
    if (!v || !cJSON_AddItemToObject(text, e->string, v)) {
      cJSON_Delete(v);
      cJSON_Delete(text);
      *oom = true;
      return root;
    }
  }
  cJSON_Delete(root);
  return text;
}

ir_status infc_hfconfig_parse(const char *json, model_llama_params *out, ir_diag *d) {
  memset(out, 0, sizeof *out);
  unsigned long fails = ir_alloc_failures();
  cJSON *root = cJSON_Parse(json);
  if (!root && ir_alloc_failed_since(fails)) return ir_diag_set(d, IR_OOM, "out of memory");
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return ir_diag_set(d, IR_BAD_FORMAT, "not a JSON object");
  }
  bool oom = false;
  root = unwrap_text_config(root, &oom);
  if (oom) {
    cJSON_Delete(root);
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  cfg_reader r = {.root = root, .d = d, .st = IR_OK};
  read_arch(&r, out);
  read_sizes(&r, out);
  read_partial_rotary(&r, out);
  read_no_rope(&r, out);
  read_gemma(&r, out);
  read_rope(&r, "rope_scaling", out);
  if (!read_rope_by_layer_type(&r, out)) read_rope(&r, "rope_parameters", out);
  bool qwen2 = strcmp(out->arch, "qwen2") == 0, gemma = out->norm_plus_one;
  out->tie_word_embeddings = get_bool(&r, "tie_word_embeddings", gemma); /* Gemma's default */
  out->attention_bias = qwen2 || get_bool(&r, "attention_bias", false);
  out->qk_norm = out->qk_norm || strcmp(out->arch, "qwen3") == 0;
  out->fused_proj = strcmp(out->arch, "phi3") == 0;
  read_act(&r, out);
  /* Mistral 7B v0.1's and Phi-3's sliding window is every layer's; Qwen2's and Qwen3's
   * use_sliding_window, the layers' from max_window_layers on (transformers' layer_types);
   * Gemma's sliding layers have theirs from read_gemma. */
  int64_t window = gemma ? 0 : get_int(&r, "sliding_window", false, 0);
  if ((!strcmp(out->arch, "mistral") || out->fused_proj) && window > 0)
    out->sliding_window = window;
  else if ((qwen2 || !strcmp(out->arch, "qwen3")) && get_bool(&r, "use_sliding_window", false) &&
           window > 0) {
    out->sliding_window = window;
    out->swa_first = get_int(&r, "max_window_layers", false, 28); /* transformers' default */
  }
  check_layer_types(&r, out);
  cJSON_Delete(root);
  if (r.st == IR_OK) r.st = model_llama_check(out, d);
  return r.st;
}

ir_status infc_hfconfig_load(const char *path, model_llama_params *out, ir_diag *d) {
  char *text = NULL;
  ir_status st = infc_read_file(path, 16u << 20, &text, NULL, d);
  if (st == IR_OK) st = infc_hfconfig_parse(text, out, d);
  ir_free(text);
  if (st != IR_OK) ir_diag_prefix(d, "%s", path);
  return st;
}
