/* test_hfconfig: config.json of each fixture, then hand-written configs for every error
 * the parser promises to name, and the special cases (eos lists, sliding windows). */
#include "infc_hfconfig.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcheck.h"

static bool has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ---- the fixtures ------------------------------------------------------------------------ */

static bool load_fixture(const char *name, model_llama_params *p) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s/config.json", FIXTURES_DIR, name);
  ir_diag d = {0};
  ir_status st = infc_hfconfig_load(path, p, &d);
  CHECKF(st == IR_OK, "%s: %s", name, d.msg);
  return st == IR_OK;
}

static void test_fixtures(void) {
  model_llama_params p;
  if (load_fixture("llama-gqa-f32", &p)) {
    CHECK(strcmp(p.arch, "llama") == 0);
    CHECK(p.vocab_size == 300 && p.hidden_size == 64 && p.intermediate_size == 172);
    CHECK(p.n_layers == 2 && p.n_heads == 4 && p.n_kv_heads == 2); /* GQA: 2 q heads per kv */
    CHECK(p.head_dim == 16);                                       /* 64 / 4 */
    CHECK(p.max_position == 256 && p.rope_theta == 10000.0 && p.rms_norm_eps == 1e-5);
    CHECK(!p.tie_word_embeddings && !p.attention_bias);
    CHECK(p.bos_token_id == 1 && p.eos_token_id == 2);
  }
  if (load_fixture("qwen2-bias-bf16", &p)) {
    CHECK(strcmp(p.arch, "qwen2") == 0);
    CHECK(p.n_heads == 4 && p.n_kv_heads == 1 && p.head_dim == 16 && p.n_layers == 2);
    CHECK(p.attention_bias); /* implied by qwen2, not written in the file */
    CHECK(p.tie_word_embeddings);
    CHECK(p.rope_theta == 1000000.0 && p.rms_norm_eps == 1e-6);
    CHECK(p.bos_token_id == -1 && p.eos_token_id == -1); /* absent */
    CHECK(p.max_position == 256); /* sliding_window null, use_sliding_window false */
  }
  /* written by transformers 5: rope_parameters in place of rope_theta, layer_types */
  if (load_fixture("qwen3-qknorm-bf16", &p)) {
    CHECK(strcmp(p.arch, "qwen3") == 0 && p.qk_norm && !p.attention_bias);
    CHECK(p.n_heads == 4 && p.n_kv_heads == 2 && p.head_dim == 32 && p.hidden_size == 64);
    CHECK(p.rope_theta == 1000000.0 && p.tie_word_embeddings && p.max_position == 256);
  }
  if (load_fixture("llama3-rope-f32", &p)) { /* transformers 5: the scaling in rope_parameters */
    CHECK(p.rope_scaling == MODEL_ROPE_LLAMA3 && p.rope_factor == 8.0 && p.rope_low_freq == 1.0 &&
          p.rope_high_freq == 4.0 && p.rope_orig_context == 64 && p.rope_theta == 500000.0);
  }
  if (load_fixture("qwen3-yarn-f32", &p)) { /* the defaults: beta 32 / 1, truncated ramp */
    CHECK(p.rope_scaling == MODEL_ROPE_YARN && p.rope_factor == 4.0 && p.rope_orig_context == 64 &&
          p.rope_beta_fast == 32.0 && p.rope_beta_slow == 1.0 && p.rope_yarn_truncate &&
          fabs(p.rope_attn_factor - (1.0 + 0.1 * log(4.0))) < 1e-12);
  }
  if (load_fixture("smollm3-nope-f32", &p)) /* no_rope_layers [1, 1, 1, 0] */
    CHECK(strcmp(p.arch, "smollm3") == 0 && p.no_rope_every == 4 && p.n_layers == 4);
  if (load_fixture("gemma2-softcap-f32", &p)) { /* transformers 5's layer_types */
    CHECK(!strcmp(p.arch, "gemma2") && p.norm_plus_one && p.sandwich_norms && !p.qk_norm);
    CHECK(p.act == IR_ACT_GEGLU && p.embed_scale == 8.0 && p.tie_word_embeddings);
    CHECK(fabs(p.attn_scale - 1.0 / sqrt(24.0)) < 1e-15); /* query_pre_attn_scalar */
    CHECK(p.attn_softcap == 5.0 && p.final_softcap == 10.0);
    CHECK(p.sliding_window == 8 && p.swa_period == 2 && p.rope_local_theta == 0);
    CHECK(model_llama_layer_slides(&p, 0) && !model_llama_layer_slides(&p, 1) &&
          model_llama_layer_slides(&p, 2) && !model_llama_layer_slides(&p, 3));
    CHECK(p.max_position == 256); /* the window does not cap the context */
  }
  if (load_fixture("gemma3-local-f32", &p)) { /* rope_parameters keyed by layer type */
    CHECK(!strcmp(p.arch, "gemma3_text") && p.qk_norm && p.norm_plus_one && p.sandwich_norms);
    CHECK(p.attn_softcap == 0 && p.final_softcap == 0 && p.swa_period == 6);
    CHECK(p.rope_theta == 1e6 && p.rope_scaling == MODEL_ROPE_LINEAR && p.rope_factor == 8.0);
    CHECK(p.rope_local_theta == 10000.0);
    for (int64_t l = 0; l < 6; l++) CHECK(model_llama_layer_slides(&p, l) == (l != 5));
  }
  if (load_fixture("llama-mha-f16", &p)) {
    CHECK(p.n_heads == 4 && p.n_kv_heads == 4 && p.head_dim == 16 && p.n_layers == 3);
    CHECK(p.tie_word_embeddings && !p.attention_bias);
    CHECK(p.vocab_size == 256 && p.intermediate_size == 128 && p.rms_norm_eps == 1e-6);
  }
}

static void test_load_errors(void) {
  model_llama_params p;
  ir_diag d = {0};
  const char *missing = TEST_TMP_DIR "/no_such_dir/config.json";
  CHECK(infc_hfconfig_load(missing, &p, &d) == IR_IO);
  CHECKF(has(d.msg, missing), "message lacks the path: %s", d.msg);
  /* a file that is not JSON: the message carries the path and the cause */
  const char *bad = TEST_TMP_DIR "/hfconfig_bad.json";
  FILE *f = fopen(bad, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs("model_type: llama\n", f);
  fclose(f);
  d = (ir_diag){0};
  CHECK(infc_hfconfig_load(bad, &p, &d) == IR_BAD_FORMAT);
  CHECKF(has(d.msg, bad) && has(d.msg, "JSON"), "%s", d.msg);
  remove(bad);
}

/* ---- hand-written configs ------------------------------------------------------------------ */

static const char *k_base =
    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"vocab_size\": 256, \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 512,"
    " \"hidden_act\": \"silu\", \"rope_theta\": 500000.0}";

/* The base config with `key` removed (value NULL) or set to the JSON text `value`. */
static char *variant(const char *key, const char *value) {
  cJSON *root = cJSON_Parse(k_base);
  if (!root) abort();
  cJSON_DeleteItemFromObjectCaseSensitive(root, key);
  if (value) {
    cJSON *v = cJSON_Parse(value);
    if (!v) abort();
    cJSON_AddItemToObject(root, key, v);
  }
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!s) abort();
  return s;
}

/* Parses base+change; returns the status, with the message in d. */
static ir_status parse_variant(const char *key, const char *value, model_llama_params *p,
                               ir_diag *d) {
  char *json = variant(key, value);
  *d = (ir_diag){0};
  ir_status st = infc_hfconfig_parse(json, p, d);
  cJSON_free(json);
  return st;
}

static void expect_error(const char *key, const char *value, ir_status want, const char *w1,
                         const char *w2) {
  model_llama_params p;
  ir_diag d;
  ir_status st = parse_variant(key, value, &p, &d);
  CHECKF(st == want, "%s=%s: got %s (%s), want %s", key, value ? value : "(absent)",
         ir_status_name(st), d.msg, ir_status_name(want));
  if (st == IR_OK) return; /* already reported; there is no message to look at */
  CHECKF(d.status == st, "%s: diag status %d vs %d", key, (int)d.status, (int)st);
  CHECKF(has(d.msg, w1), "%s=%s: message lacks '%s': %s", key, value ? value : "-", w1, d.msg);
  CHECKF(!w2 || has(d.msg, w2), "%s: message lacks '%s': %s", key, w2, d.msg);
}

static model_llama_params expect_ok(const char *key, const char *value) {
  model_llama_params p;
  ir_diag d;
  ir_status st = parse_variant(key, value, &p, &d);
  CHECKF(st == IR_OK, "%s=%s: %s", key, value ? value : "(absent)", d.msg);
  return p;
}

static void test_base(void) {
  model_llama_params p = expect_ok("unused_key", NULL);
  CHECK(strcmp(p.arch, "llama") == 0 && p.hidden_size == 64 && p.n_kv_heads == 2);
  CHECK(p.head_dim == 16 && p.rope_theta == 500000.0 && p.max_position == 512);
  CHECK(!p.tie_word_embeddings && !p.attention_bias);
  CHECK(p.bos_token_id == -1 && p.eos_token_id == -1);
  p = expect_ok("num_key_value_heads", NULL); /* absent: MHA */
  CHECK(p.n_kv_heads == 4);
  p = expect_ok("num_key_value_heads", "null");
  CHECK(p.n_kv_heads == 4);
  p = expect_ok("head_dim", "32"); /* explicit head_dim wins over hidden / heads */
  CHECK(p.head_dim == 32);
  p = expect_ok("rope_theta", NULL);
  CHECK(p.rope_theta == 10000.0);
  p = expect_ok("hidden_act", NULL);
  CHECK(p.hidden_size == 64);
  p = expect_ok("rope_scaling", "null");
  CHECK(p.n_layers == 2);
  p = expect_ok("attention_bias", "true");
  CHECK(p.attention_bias);
  p = expect_ok("tie_word_embeddings", "true");
  CHECK(p.tie_word_embeddings);
  p = expect_ok("rms_norm_eps", "1e-06");
  CHECK(p.rms_norm_eps == 1e-6);
  CHECK(!p.qk_norm); /* llama */
  p = expect_ok("rope_parameters", "{\"rope_theta\": 1e6, \"rope_type\": \"default\"}");
  CHECK(p.rope_theta == 1e6);
  p = expect_ok("rope_parameters", "{\"rope_theta\": 2e5}");
  CHECK(p.rope_theta == 2e5);
  p = expect_ok("layer_types", "[\"full_attention\", \"full_attention\"]");
  CHECK(p.n_layers == 2);
  /* Llama 3.1 / 3.2's rope_scaling (transformers 4 form) */
  p = expect_ok("rope_scaling",
                "{\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": "
                "1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}");
  CHECK(p.rope_scaling == MODEL_ROPE_LLAMA3 && p.rope_factor == 32.0 && p.rope_low_freq == 1.0 &&
        p.rope_high_freq == 4.0 && p.rope_orig_context == 8192 && p.rope_theta == 500000.0);
  p = expect_ok("rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}");
  CHECK(p.rope_scaling == MODEL_ROPE_LINEAR && p.rope_factor == 2.0);
  /* Qwen3's model card: YaRN over a 32768-token original context; DeepSeek's mscale pair */
  p = expect_ok("rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0, "
                                "\"original_max_position_embeddings\": 32768}");
  CHECK(p.rope_scaling == MODEL_ROPE_YARN && p.rope_orig_context == 32768 &&
        fabs(p.rope_attn_factor - 1.138629436111989) < 1e-12);
  p = expect_ok("rope_scaling", "{\"type\": \"yarn\", \"factor\": 40.0, \"mscale\": 1.0, "
                                "\"mscale_all_dim\": 1.0, \"beta_fast\": 16, \"truncate\": false}");
  CHECK(p.rope_attn_factor == 1.0 && p.rope_orig_context == 512 && p.rope_beta_fast == 16.0 &&
        !p.rope_yarn_truncate);
  /* Phi-3.5's rope_scaling: the attention factor from max_position / original (512 / 128) */
  p = expect_ok(
      "rope_scaling",
      "{\"type\": \"longrope\", \"long_factor\": [1, 2, 3, 4, 5, 6, 7, 8], "
      "\"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1.5], \"original_max_position_embeddings\": "
      "128}");
  CHECK(p.rope_scaling == MODEL_ROPE_LONGROPE && p.rope_orig_context == 128 &&
        p.rope_long[7] == 8.0f && p.rope_short[7] == 1.5f &&
        fabs(p.rope_attn_factor - sqrt(1.0 + log(4.0) / log(128.0))) < 1e-12);
  p = expect_ok("rope_scaling", "{\"rope_type\": \"default\"}");
  CHECK(p.rope_scaling == MODEL_ROPE_DEFAULT);
  p = expect_ok("partial_rotary_factor", "0.5");
  CHECK(p.rot_dim == 8 && p.head_dim == 16);
  p = expect_ok("rope_parameters", "{\"rope_theta\": 1e4, \"partial_rotary_factor\": 0.25}");
  CHECK(p.rot_dim == 4 && p.rope_theta == 1e4);
  p = expect_ok("partial_rotary_factor", "1.0");
  CHECK(p.rot_dim == 0);
  p = expect_ok("model_type", "\"smollm3\""); /* the default interval, 4 */
  CHECK(p.no_rope_every == 4);
  p = expect_ok("model_type", "\"phi3\"");
  CHECK(p.fused_proj && !p.qk_norm);
  p = expect_ok("model_type", "\"qwen3\"");
  CHECK(p.qk_norm && !p.attention_bias && !p.rope_interleaved);
}

static void test_errors(void) {
  expect_error("hidden_size", NULL, IR_BAD_FORMAT, "hidden_size", NULL);
  expect_error("vocab_size", NULL, IR_BAD_FORMAT, "vocab_size", NULL);
  expect_error("rms_norm_eps", NULL, IR_BAD_FORMAT, "rms_norm_eps", NULL);
  expect_error("model_type", NULL, IR_BAD_FORMAT, "model_type", NULL);
  expect_error("hidden_size", "\"64\"", IR_BAD_FORMAT, "hidden_size", NULL);
  expect_error("hidden_size", "64.5", IR_BAD_FORMAT, "hidden_size", NULL);
  expect_error("num_hidden_layers", "true", IR_BAD_FORMAT, "num_hidden_layers", NULL);
  expect_error("rms_norm_eps", "\"1e-5\"", IR_BAD_FORMAT, "rms_norm_eps", NULL);
  expect_error("tie_word_embeddings", "\"yes\"", IR_BAD_FORMAT, "tie_word_embeddings", NULL);
  expect_error("model_type", "7", IR_BAD_FORMAT, "model_type", NULL);
  expect_error("model_type", "\"gpt2\"", IR_UNSUPPORTED, "gpt2", NULL);
  expect_error("rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0}", IR_BAD_FORMAT,
               "rope_scaling", "low_freq_factor");
  expect_error("rope_scaling", "{\"rope_type\": \"longrope\", \"factor\": 4.0}", IR_BAD_FORMAT,
               "rope_scaling", "original_max_position_embeddings");
  expect_error("rope_scaling",
               "{\"type\": \"longrope\", \"original_max_position_embeddings\": 64, "
               "\"long_factor\": [1, 2], \"short_factor\": [1, 1]}",
               IR_BAD_FORMAT, "long_factor", "8 numbers"); /* head_dim 16: 8 rotated pairs */
  expect_error("rope_scaling",
               "{\"type\": \"longrope\", \"original_max_position_embeddings\": 64, "
               "\"long_factor\": [1, 1, 1, 1, 1, 1, 1, 0], \"short_factor\": [1, 1, 1, 1, 1, 1, 1, "
               "1]}",
               IR_BAD_FORMAT, "long_factor", "positive");
  expect_error("rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": -1}",
               IR_BAD_FORMAT, "yarn", NULL);
  expect_error("rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}", IR_UNSUPPORTED,
               "rope_scaling", "dynamic");
  expect_error("rope_scaling", "{\"type\": \"linear\"}", IR_BAD_FORMAT, "rope_scaling", "factor");
  expect_error("partial_rotary_factor", "0.1875", IR_UNSUPPORTED, "partial_rotary_factor",
               "3 rotary dims"); /* 16 * 0.1875 = 3: odd */
  expect_error("partial_rotary_factor", "1.5", IR_UNSUPPORTED, "partial_rotary_factor", NULL);
  { /* SmolLM3 NoPE layers off the periodic pattern */
    model_llama_params q;
    ir_diag d = {0};
    const char *cfg = "{\"model_type\": \"smollm3\", \"hidden_size\": 64, \"intermediate_size\": "
                      "128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"vocab_size\": "
                      "256, \"rms_norm_eps\": 1e-6, \"no_rope_layers\": [0, 1, 1, 1]}";
    CHECK(infc_hfconfig_parse(cfg, &q, &d) == IR_UNSUPPORTED && has(d.msg, "no_rope_layers"));
  }
  expect_error("rope_parameters", "{\"rope_theta\": 1e4, \"partial_rotary_factor\": 0.0625}",
               IR_UNSUPPORTED, "rope_parameters", "partial_rotary_factor");
  expect_error("rope_scaling", "{\"type\": \"linear\", \"factor\": 0.5}", IR_BAD_FORMAT, "factor",
               NULL);
  expect_error("rope_scaling",
               "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": "
               "4.0, \"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192}",
               IR_BAD_FORMAT, "high_freq_factor", NULL);
  expect_error("hidden_act", "\"gelu\"", IR_UNSUPPORTED, "gelu", NULL);
  expect_error("rope_parameters", "{\"rope_type\": \"dynamic\", \"factor\": 4.0}", IR_UNSUPPORTED,
               "rope_parameters", "dynamic");
  expect_error("rope_parameters", "{\"rope_theta\": \"1e6\"}", IR_BAD_FORMAT, "rope_parameters",
               "rope_theta");
  expect_error("rope_parameters", "7", IR_BAD_FORMAT, "rope_parameters", NULL);
  expect_error("layer_types", "[\"full_attention\", \"sliding_attention\"]", IR_UNSUPPORTED,
               "layer_types", "sliding_attention");
  expect_error("num_key_value_heads", "3", IR_BAD_FORMAT, "num_key_value_heads",
               "num_attention_heads");
  expect_error("num_hidden_layers", "0", IR_BAD_FORMAT, "positive", NULL);
  expect_error("rms_norm_eps", "-1e-5", IR_BAD_FORMAT, "rms_norm_eps", NULL);
  expect_error("head_dim", "7", IR_UNSUPPORTED, "head_dim", NULL); /* odd: no rope pairs */
  /* A list is accepted for token ids only; a list where a size belongs is a wrong type. */
  expect_error("hidden_size", "[64]", IR_BAD_FORMAT, "hidden_size", NULL);
}

/* Gemma's configs as transformers 4 wrote them (sliding_window_pattern, rope_local_base_freq,
 * rope_scaling for the global layers), and what is refused. */
/* The Gemma 3 config of test_gemma with `extra` keys appended (", \"k\": v"), parsed. */
static ir_status parse_gemma3(const char *extra, model_llama_params *p, ir_diag *d) {
  char cfg[1024];
  snprintf(cfg, sizeof cfg,
           "{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"intermediate_size\": 96, "
           "\"num_hidden_layers\": 7, \"num_attention_heads\": 4, \"head_dim\": 16, "
           "\"vocab_size\": 256, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1e6, "
           "\"rope_local_base_freq\": 20000.0, \"sliding_window\": 512, "
           "\"sliding_window_pattern\": 3, \"rope_scaling\": {\"rope_type\": \"linear\", "
           "\"factor\": 8.0}%s}",
           extra);
  *d = (ir_diag){0};
  return infc_hfconfig_parse(cfg, p, d);
}

/* Gemma's configs as transformers 4 wrote them (sliding_window_pattern, rope_local_base_freq,
 * rope_scaling for the global layers), and what is refused. */
static void test_gemma(void) {
  model_llama_params p;
  ir_diag d;
  CHECKF(parse_gemma3(", \"query_pre_attn_scalar\": 256, \"hidden_activation\": "
                      "\"gelu_pytorch_tanh\"",
                      &p, &d) == IR_OK,
         "%s", d.msg);
  CHECK(p.swa_period == 3 && p.rope_local_theta == 20000.0 && p.rope_scaling == MODEL_ROPE_LINEAR);
  CHECK(p.attn_scale == 1.0 / 16.0 && p.tie_word_embeddings && p.act == IR_ACT_GEGLU);
  CHECK(model_llama_layer_slides(&p, 0) && !model_llama_layer_slides(&p, 2) &&
        !model_llama_layer_slides(&p, 5) && model_llama_layer_slides(&p, 6));
  CHECK(parse_gemma3("", &p, &d) == IR_OK && p.attn_scale == 0.25); /* head_dim's */
  d = (ir_diag){0}; /* no sliding_window: transformers' Gemma3TextConfig default, 4096 */
  CHECK(infc_hfconfig_parse("{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, "
                            "\"intermediate_size\": 96, \"num_hidden_layers\": 2, "
                            "\"num_attention_heads\": 4, \"vocab_size\": 256, \"rms_norm_eps\": "
                            "1e-6}",
                            &p, &d) == IR_OK &&
        p.sliding_window == 4096);
  /* layer_types against the pattern; the period from the first full layer */
  CHECKF(parse_gemma3(", \"layer_types\": [\"sliding_attention\", \"full_attention\", "
                      "\"sliding_attention\", \"full_attention\", \"sliding_attention\", "
                      "\"full_attention\", \"sliding_attention\"]",
                      &p, &d) == IR_OK &&
             p.swa_period == 2,
         "%s", d.msg);
  CHECK(parse_gemma3(", \"layer_types\": [\"sliding_attention\", \"full_attention\", "
                     "\"full_attention\", \"full_attention\", \"sliding_attention\", "
                     "\"full_attention\", \"sliding_attention\"]",
                     &p, &d) == IR_UNSUPPORTED &&
        has(d.msg, "entry 2"));
  CHECK(parse_gemma3(", \"layer_types\": [\"sliding_attention\"]", &p, &d) == IR_BAD_FORMAT &&
        has(d.msg, "7 layers"));
  CHECK(parse_gemma3(", \"hidden_activation\": \"relu\"", &p, &d) == IR_UNSUPPORTED &&
        has(d.msg, "relu"));
  CHECK(parse_gemma3(", \"query_pre_attn_scalar\": -4", &p, &d) == IR_BAD_FORMAT);
  CHECK(parse_gemma3(", \"use_bidirectional_attention\": true", &p, &d) == IR_UNSUPPORTED &&
        has(d.msg, "use_bidirectional_attention"));
  CHECK(parse_gemma3(", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\", "
                     "\"rope_theta\": 5e5}, \"sliding_attention\": {\"rope_type\": \"yarn\", "
                     "\"factor\": 2.0}}",
                     &p, &d) == IR_UNSUPPORTED &&
        has(d.msg, "sliding_attention"));
  CHECK(parse_gemma3(", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"dynamic\", "
                     "\"factor\": 2.0}}",
                     &p, &d) == IR_UNSUPPORTED &&
        has(d.msg, "full_attention"));
  /* Gemma 3 4B's config.json (Gemma3ForConditionalGeneration): the text model is text_config
   * over Gemma3TextConfig's defaults */
  const char *mm = "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"boi_token_index\": "
                   "255999, \"eos_token_id\": [1, 106], \"image_token_index\": 262144, "
                   "\"model_type\": \"gemma3\", \"text_config\": {\"hidden_size\": 2560, "
                   "\"intermediate_size\": 10240, \"model_type\": \"gemma3_text\", "
                   "\"num_hidden_layers\": 34, \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": "
                   "\"linear\"}, \"sliding_window\": 1024}, \"vision_config\": {\"hidden_size\": "
                   "1152, \"model_type\": \"siglip_vision_model\"}}";
  d = (ir_diag){0};
  CHECKF(infc_hfconfig_parse(mm, &p, &d) == IR_OK, "%s", d.msg);
  CHECK(!strcmp(p.arch, "gemma3_text") && p.hidden_size == 2560 && p.n_layers == 34);
  CHECK(p.n_heads == 8 && p.n_kv_heads == 4 && p.head_dim == 256 && p.vocab_size == 262208);
  CHECK(p.sliding_window == 1024 && p.swa_period == 6 && p.rope_local_theta == 10000.0);
  CHECK(p.rope_scaling == MODEL_ROPE_LINEAR && p.rope_factor == 8.0 && p.rope_theta == 1e6);
  CHECK(p.attn_scale == 1.0 / 16.0 && p.tie_word_embeddings && p.qk_norm && p.eos_token_id == 1);
  CHECK(p.max_position == 131072 && p.intermediate_size == 10240);
  d = (ir_diag){0}; /* another wrapper is not unwrapped: its model_type is refused */
  CHECK(infc_hfconfig_parse("{\"model_type\": \"llava\", \"text_config\": {\"model_type\": "
                            "\"llama\"}}",
                            &p, &d) == IR_UNSUPPORTED &&
        has(d.msg, "llava"));
}

static void test_not_json(void) {
  const char *bad[] = {"",   "{",    "not json at all", "[1, 2, 3]",
                       "42", "null", "\"llama\"",       "{\"model_type\": \"llama\",}"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    model_llama_params p;
    ir_diag d = {0};
    CHECKF(infc_hfconfig_parse(bad[i], &p, &d) == IR_BAD_FORMAT, "'%s' parsed", bad[i]);
    CHECK(d.status == IR_BAD_FORMAT && d.msg[0]);
  }
}

static void test_token_ids(void) {
  model_llama_params p = expect_ok("eos_token_id", "[128001, 128008, 128009]");
  CHECK(p.eos_token_id == 128001); /* a list: the first id */
  p = expect_ok("eos_token_id", "7");
  CHECK(p.eos_token_id == 7);
  p = expect_ok("bos_token_id", "[5]");
  CHECK(p.bos_token_id == 5 && p.eos_token_id == -1);
  p = expect_ok("eos_token_id", "null");
  CHECK(p.eos_token_id == -1);
  expect_error("eos_token_id", "\"</s>\"", IR_BAD_FORMAT, "eos_token_id", NULL);
}

/* Mistral's and Phi-3's window is every layer's sliding window, Qwen2's and Qwen3's (with
 * use_sliding_window) the layers' from max_window_layers (default 28) on; the context
 * stays. */
static void window_case(const char *type, const char *window, const char *use, int64_t want,
                        int64_t want_window) {
  cJSON *root = cJSON_Parse(k_base);
  if (!root) abort();
  cJSON_ReplaceItemInObjectCaseSensitive(root, "model_type", cJSON_CreateString(type));
  if (window) cJSON_AddItemToObject(root, "sliding_window", cJSON_Parse(window));
  if (use) cJSON_AddItemToObject(root, "use_sliding_window", cJSON_Parse(use));
  char *json = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  model_llama_params p;
  ir_diag d = {0};
  CHECKF(json && infc_hfconfig_parse(json, &p, &d) == IR_OK, "%s: %s", type, d.msg);
  CHECKF(p.max_position == want && p.sliding_window == want_window,
         "%s window=%s use=%s: max_position %lld, window %lld, want %lld, %lld", type,
         window ? window : "-", use ? use : "-", (long long)p.max_position,
         (long long)p.sliding_window, (long long)want, (long long)want_window);
  CHECK(strcmp(p.arch, type) == 0 && p.swa_period == 0);
  CHECK(p.swa_first == (want_window && strncmp(type, "qwen", 4) == 0 ? 28 : 0));
  cJSON_free(json);
}

static void test_sliding_window(void) {
  window_case("mistral", "128", NULL, 512, 128); /* every layer slides; the context stays */
  window_case("mistral", "4096", NULL, 512, 4096);
  window_case("mistral", "null", NULL, 512, 0); /* Mistral v0.2+: no window */
  window_case("mistral", NULL, NULL, 512, 0);
  window_case("llama", "128", NULL, 512, 0);    /* llama has no sliding window */
  window_case("qwen2", "128", "false", 512, 0); /* qwen2 only when use_sliding_window */
  window_case("qwen2", "128", "true", 512, 128);
  window_case("qwen3", "128", "true", 512, 128);
  window_case("qwen3", "128", NULL, 512, 0);
  window_case("phi3", "2047", NULL, 512, 2047); /* Phi-3 mini 4k */
  window_case("phi3", "null", NULL, 512, 0);
  model_llama_params p;
  ir_diag d = {0};
  char *json = variant("model_type", "\"qwen2\"");
  CHECK(infc_hfconfig_parse(json, &p, &d) == IR_OK && p.attention_bias);
  cJSON_free(json);
  if (load_fixture("mistral-swa-f32", &p)) /* transformers 5's Mistral */
    CHECK(p.sliding_window == 8 && p.max_position == 256 && model_llama_layer_slides(&p, 1));
  if (load_fixture("qwen2-swa-f32", &p)) /* layer_types: full, sliding, sliding */
    CHECK(p.sliding_window == 8 && p.swa_first == 1 && p.max_position == 256 &&
          !model_llama_layer_slides(&p, 0) && model_llama_layer_slides(&p, 1) &&
          model_llama_layer_slides(&p, 2));
  /* a layer_types list against max_window_layers: refused, not run with other layers */
  json = variant("model_type", "\"qwen2\"");
  cJSON *root = cJSON_Parse(json);
  cJSON_free(json);
  if (!root) abort();
  cJSON_AddItemToObject(root, "use_sliding_window", cJSON_CreateTrue());
  cJSON_AddItemToObject(root, "sliding_window", cJSON_CreateNumber(64));
  cJSON_AddItemToObject(root, "max_window_layers", cJSON_CreateNumber(1));
  const char *types[] = {"sliding_attention", "sliding_attention"};
  cJSON_AddItemToObject(root, "layer_types", cJSON_CreateStringArray(types, 2));
  json = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  CHECK(infc_hfconfig_parse(json, &p, &d) == IR_UNSUPPORTED && strstr(d.msg, "layer_types"));
  cJSON_free(json);
}

int main(void) {
  test_fixtures();
  test_load_errors();
  test_base();
  test_errors();
  test_not_json();
  test_gemma();
  test_token_ids();
  test_sliding_window();
  return tcheck_done("test_hfconfig");
}
