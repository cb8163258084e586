/* test_gguf_oracle: the HF oracle fixtures converted to GGUF the way llama.cpp's
 * converter writes them (llama: q/k projection rows permuted for interleaved RoPE;
 * qwen2: as is), built through infc_build and run: logits at every prompt position must
 * match transformers as closely as the safetensors path does (|ours - hf| <= 1e-4 *
 * (1 + |hf|): same f32 math, only the summation order and the pair layout of RoPE
 * differ), and the 32 greedy tokens must be identical. qwen3: its q_norm / k_norm as
 * attn_q_norm / attn_k_norm, head_dim as attention.key_length; Llama 3.1's rope scaling as
 * the converter's rope_freqs.weight divisors, YaRN as rope.scaling.type yarn. A Q8_0 copy of a fixture (the
 * matrices whose rows are whole blocks) run with quantized kernels must give exactly the
 * logits of the same file dequantized at build time (--dtype f32): the kernels
 * dequantize in registers to the values the fold pass writes, then sum in the f32 order. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "infc_build.h"
#include "infc_gguf_llama.h"
#include "infc_hfconfig.h"
#include "fmt_safetensors.h"
#include "infc_util.h"
#include "inferrt.h"
#include "tcheck.h"
#include "tmodel.h"

#define N_GREEDY 32
#define TOL 1e-4

/* ---- conversion ----------------------------------------------------------------------- */

typedef struct conv {
  model_llama_params p;
  const char *arch; /* general.architecture: the HF model_type but gemma3_text's gemma3 */
  fmt_st *st;
  bool q8;        /* store matrices as Q8_0 */
  uint8_t **bufs; /* converted tensor data, one per safetensors tensor */
} conv;

static uint32_t ggml_type_of(ir_dtype dt) {
  return dt == IR_F32 ? 0 : dt == IR_F16 ? 1 : dt == IR_BF16 ? 30 : dt == IR_Q8_0 ? 8 : 99;
}

/* llama.cpp's permute(): within each head, row a * hd/2 + i moves to 2i + a, so that the
 * rotate-half pairs (i, i + hd/2) become adjacent pairs (2i, 2i + 1). */
static void permute_rows(uint8_t *dst, const uint8_t *src, int64_t rows, size_t row_bytes,
                         int64_t n_head) {
  int64_t hd = rows / n_head, half = hd / 2;
  for (int64_t h = 0; h < n_head; h++)
    for (int64_t a = 0; a < 2; a++)
      for (int64_t i = 0; i < half; i++)
        memcpy(dst + (size_t)(h * hd + 2 * i + a) * row_bytes,
               src + (size_t)(h * hd + a * half + i) * row_bytes, row_bytes);
}

static float elem_f32(const void *p, ir_dtype dt, size_t i) {
  if (dt == IR_F32) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return dt == IR_F16 ? ir_f16_to_f32(h) : ir_bf16_to_f32(h);
}

/* ggml's quantize_row_q8_0_ref. */
static void quantize_q8_0(const void *src, ir_dtype dt, size_t n, uint8_t *out) {
  for (size_t b = 0; b < n / 32; b++, out += 34) {
    float amax = 0, x[32];
    for (int i = 0; i < 32; i++) {
      x[i] = elem_f32(src, dt, b * 32 + (size_t)i);
      if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    }
    float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    uint16_t h = ir_f32_to_f16(d);
    out[0] = (uint8_t)h, out[1] = (uint8_t)(h >> 8);
    for (int i = 0; i < 32; i++) out[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
  }
}

/* One tensor as the converter would store it: type, dims, bytes. */
static gw_tensor convert_tensor(conv *c, size_t i, char *gname, size_t glen) {
  const fmt_st_tensor *t = fmt_st_get(c->st, i);
  gw_tensor g = {.name = gname, .rank = t->rank};
  CHECKF(infc_gguf_llama_name_arch(c->arch, t->name, gname, glen), "no GGUF name for %s", t->name);
  for (int k = 0; k < t->rank; k++) g.ne[k] = (uint64_t)t->shape[t->rank - 1 - k];
  /* as llama.cpp's converter: rows that are not whole blocks stay unquantized; Gemma's
   * norms are stored as 1 + w in f32 */
  ir_dtype dt = c->q8 && t->rank == 2 && t->shape[1] % 32 == 0 ? IR_Q8_0 : t->dtype;
  size_t elems = (size_t)(t->nbytes / ir_dtype_bytes(t->dtype, 1));
  bool plus_one = c->p.norm_plus_one && strstr(t->name, "norm.weight") != NULL;
  if (plus_one) dt = IR_F32;
  uint8_t *buf = malloc(ir_dtype_bytes(dt, elems) + 1);
  if (dt == IR_Q8_0) quantize_q8_0(t->data, t->dtype, elems, buf);
  else if (plus_one)
    for (size_t e = 0; e < elems; e++) ((float *)buf)[e] = 1.0f + elem_f32(t->data, t->dtype, e);
  else memcpy(buf, t->data, t->nbytes);
  bool q = strstr(t->name, "q_proj") != NULL, k = strstr(t->name, "k_proj") != NULL;
  if ((!strcmp(c->p.arch, "llama") || !strcmp(c->p.arch, "smollm3")) && (q || k)) {
    int64_t rows = t->shape[0];
    size_t rb = (size_t)ir_dtype_bytes(dt, elems) / (size_t)rows;
    uint8_t *perm = malloc(ir_dtype_bytes(dt, elems) + 1);
    permute_rows(perm, buf, rows, rb, q ? c->p.n_heads : c->p.n_kv_heads);
    free(buf);
    buf = perm;
  }
  c->bufs[i] = buf;
  g.type = ggml_type_of(dt);
  g.data = buf;
  g.nbytes = ir_dtype_bytes(dt, elems);
  return g;
}

/* Gemma's keys as the converter writes them (the soft caps, the window), the linear rope
 * scaling of Gemma 3's global layers, and attention.scale where query_pre_attn_scalar is
 * not head_dim (the converter drops it: llama.cpp takes 1 / sqrt(head_dim) but for the 27B
 * models; the fixtures' 24 needs the key). Returns how many entries. */
static uint64_t write_gemma_kvs(gw *w, const char *a, const model_llama_params *p) {
  char k[128];
  uint64_t n = 0;
  if (!p->sandwich_norms) return 0;
  snprintf(k, sizeof k, "%s.attention.sliding_window", a);
  kv_u32(w, k, (uint32_t)p->sliding_window), n++;
  const char *caps[2] = {"attn_logit_softcapping", "final_logit_softcapping"};
  double cv[2] = {p->attn_softcap, p->final_softcap};
  for (int i = 0; i < 2; i++)
    if (cv[i] > 0) snprintf(k, sizeof k, "%s.%s", a, caps[i]), kv_f32(w, k, (float)cv[i]), n++;
  if (p->rope_scaling == MODEL_ROPE_LINEAR) {
    snprintf(k, sizeof k, "%s.rope.scaling.type", a);
    kv_str(w, k, "linear");
    snprintf(k, sizeof k, "%s.rope.scaling.factor", a);
    kv_f32(w, k, (float)p->rope_factor);
    n += 2;
  }
  if (fabs(p->attn_scale * sqrt((double)p->head_dim) - 1.0) > 1e-9) {
    snprintf(k, sizeof k, "%s.attention.scale", a);
    kv_f32(w, k, (float)p->attn_scale), n++;
  }
  return n;
}

/* Writes the metadata; returns how many entries. */
static uint64_t write_kvs(gw *w, const char *a, const model_llama_params *p) {
  char k[128];
  kv_str(w, "general.architecture", a);
#define KV(suffix, v) (snprintf(k, sizeof k, "%s." suffix, a), kv_u32(w, k, (uint32_t)(v)))
  KV("block_count", p->n_layers);
  KV("context_length", p->max_position);
  KV("embedding_length", p->hidden_size);
  KV("feed_forward_length", p->intermediate_size);
  KV("attention.head_count", p->n_heads);
  KV("attention.head_count_kv", p->n_kv_heads);
  KV("rope.dimension_count", model_llama_rot_dims(p));
#undef KV
  snprintf(k, sizeof k, "%s.rope.freq_base", a);
  kv_f32(w, k, (float)p->rope_theta);
  snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", a);
  kv_f32(w, k, (float)p->rms_norm_eps);
  uint64_t n = 11 + write_gemma_kvs(w, a, p);
  if (p->head_dim != p->hidden_size / p->n_heads) { /* as the converter, from head_dim */
    snprintf(k, sizeof k, "%s.attention.key_length", a);
    kv_u32(w, k, (uint32_t)p->head_dim);
    snprintf(k, sizeof k, "%s.attention.value_length", a);
    kv_u32(w, k, (uint32_t)p->head_dim);
    n += 2;
  }
  if (p->rope_scaling == MODEL_ROPE_LONGROPE) { /* the factors are tensors */
    snprintf(k, sizeof k, "%s.rope.scaling.original_context_length", a);
    kv_u32(w, k, (uint32_t)p->rope_orig_context);
    snprintf(k, sizeof k, "%s.rope.scaling.attn_factor", a);
    kv_f32(w, k, (float)p->rope_attn_factor);
    n += 2;
  }
  if (p->rope_scaling == MODEL_ROPE_YARN) { /* as the converter: type, factor, context */
    snprintf(k, sizeof k, "%s.rope.scaling.type", a);
    kv_str(w, k, "yarn");
    snprintf(k, sizeof k, "%s.rope.scaling.factor", a);
    kv_f32(w, k, (float)p->rope_factor);
    snprintf(k, sizeof k, "%s.rope.scaling.original_context_length", a);
    kv_u32(w, k, (uint32_t)p->rope_orig_context);
    n += 3;
  }
  if (p->bos_token_id >= 0) {
    kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)p->bos_token_id);
    n++;
  }
  /* the vocabulary size from the token list, as files without <arch>.vocab_size have */
  gw_key(w, "tokenizer.ggml.tokens", FMT_GGUF_ARRAY);
  gw_u32(w, FMT_GGUF_STRING), gw_u64(w, (uint64_t)p->vocab_size);
  for (int64_t i = 0; i < p->vocab_size; i++) {
    char tok[24];
    snprintf(tok, sizeof tok, "<t%lld>", (long long)i);
    gw_str(w, tok);
  }
  return n;
}

/* Llama 3.1's rope scaling as llama.cpp's converter writes it: rope_freqs.weight, one
 * divisor per frequency (1 for the high ones, factor for the low, a blend between). */
static float *llama3_rope_factors(const model_llama_params *p) {
  int64_t half = p->head_dim / 2;
  float *f = malloc((size_t)half * sizeof *f);
  double low = (double)p->rope_orig_context / p->rope_low_freq;
  double high = (double)p->rope_orig_context / p->rope_high_freq;
  for (int64_t i = 0; f && i < half; i++) {
    double freq = 1.0 / pow(p->rope_theta, (double)(2 * i) / (double)p->head_dim);
    double wavelen = 2.0 * M_PI / freq;
    double s = ((double)p->rope_orig_context / wavelen - p->rope_low_freq) /
               (p->rope_high_freq - p->rope_low_freq);
    f[i] = wavelen < high  ? 1.0f
           : wavelen > low ? (float)p->rope_factor
                           : (float)(1.0 / ((1.0 - s) / p->rope_factor + s));
  }
  return f;
}

/* Writes fixture `name` as GGUF to `out`. */
static bool convert_fixture(const char *name, const char *out, bool q8) {
  char dir[1024], cfg[1100];
  snprintf(dir, sizeof dir, "%s/%s", FIXTURES_DIR, name);
  snprintf(cfg, sizeof cfg, "%s/config.json", dir);
  conv c = {.q8 = q8};
  ir_diag d = {0};
  bool ok = infc_hfconfig_load(cfg, &c.p, &d) == IR_OK && fmt_st_open(dir, &c.st, &d) == IR_OK;
  CHECKF(ok, "%s: %s", name, d.msg);
  if (!ok) return false;
  c.arch = strcmp(c.p.arch, "gemma3_text") ? c.p.arch : "gemma3";
  size_t n = fmt_st_count(c.st), nt = n;
  c.bufs = calloc(n, sizeof *c.bufs);
  gw_tensor *ts = calloc(n + 2, sizeof *ts);
  char(*names)[128] = calloc(n, sizeof *names);
  for (size_t i = 0; i < n; i++) ts[i] = convert_tensor(&c, i, names[i], sizeof names[i]);
  float *factors = c.p.rope_scaling == MODEL_ROPE_LLAMA3 ? llama3_rope_factors(&c.p) : NULL;
  if (factors)
    ts[nt++] = (gw_tensor){.name = "rope_freqs.weight",
                           .type = 0,
                           .rank = 1,
                           .ne = {(uint64_t)c.p.head_dim / 2},
                           .data = factors,
                           .nbytes = (size_t)c.p.head_dim / 2 * sizeof *factors};
  uint64_t pairs = (uint64_t)model_llama_rot_dims(&c.p) / 2;
  if (c.p.rope_scaling == MODEL_ROPE_LONGROPE) {
    ts[nt++] = (gw_tensor){.name = "rope_factors_long.weight",
                           .type = 0,
                           .rank = 1,
                           .ne = {pairs},
                           .data = c.p.rope_long,
                           .nbytes = pairs * 4};
    ts[nt++] = (gw_tensor){.name = "rope_factors_short.weight",
                           .type = 0,
                           .rank = 1,
                           .ne = {pairs},
                           .data = c.p.rope_short,
                           .nbytes = pairs * 4};
  }
  gw w = {0}, kv = {0};
  uint64_t n_kv = write_kvs(&kv, c.arch, &c.p);
  gw_header(&w, 3, nt, n_kv);
  gw_put(&w, kv.b, kv.n);
  gw_tensors(&w, ts, (int)nt, 32);
  free(factors);
  free(kv.b);
  FILE *f = fopen(out, "wb");
  ok = f && fwrite(w.b, 1, w.n, f) == w.n;
  if (f) fclose(f);
  CHECKF(ok, "cannot write %s", out);
  for (size_t i = 0; i < n; i++) free(c.bufs[i]);
  free(c.bufs), free(ts), free(names), free(w.b);
  fmt_st_close(c.st);
  return ok;
}

/* ---- running ------------------------------------------------------------------------- */

/* act: the act_dtype option (int8 activations of block-quantized matmuls, or f32). */
static irt_model *build_and_open(const char *gguf, const char *dtype, const char *act,
                                 int64_t max_context) {
  char plan[1100];
  snprintf(plan, sizeof plan, "%s.%s.%s.%lld.plan", gguf, dtype, act, (long long)max_context);
  infc_options o = infc_options_default();
  o.model.max_tokens = 64;
  o.model.max_context = max_context;
  ir_diag d = {0};
  infc_build_report rep = {0};
  ir_status st = infc_options_set(&o, "dtype", dtype, &d);
  if (st == IR_OK) st = infc_options_set(&o, "act_dtype", act, &d);
  if (st == IR_OK) st = infc_build(gguf, &o, plan, NULL, &rep, &d);
  CHECKF(st == IR_OK, "build %s: %s", gguf, d.msg);
  if (st != IR_OK) return NULL;
  CHECK(!strcmp(rep.source_kind, "gguf"));
  return tmodel_open(plan);
}

static double worst_vs_oracle(const float *lg, const cJSON *rows, int64_t V) {
  int64_t n;
  bool short_row;
  double worst = tmodel_max_rel_error(lg, rows, V, &n, &short_row);
  return short_row ? INFINITY : worst;
}

static bool greedy_matches(irt_model *m, const int32_t *ids, int64_t n, const cJSON *want) {
  int32_t expect[N_GREEDY], got[N_GREEDY];
  int64_t ne = tmodel_json_ids(want, expect, N_GREEDY);
  return tmodel_greedy(m, ids, n, got, N_GREEDY) == IRT_OK && ne == N_GREEDY &&
         !memcmp(got, expect, sizeof got);
}

static cJSON *load_oracle(const char *name) {
  char path[1200], *text = NULL;
  ir_diag d = {0};
  snprintf(path, sizeof path, "%s/%s/oracle.json", FIXTURES_DIR, name);
  if (infc_read_file(path, 64u << 20, &text, NULL, &d) != IR_OK) return NULL;
  cJSON *root = cJSON_Parse(text);
  free(text);
  return root;
}

static void run_fixture(const char *name) {
  char gguf[1024];
  snprintf(gguf, sizeof gguf, "%s/gguf-oracle-%s.gguf", TEST_TMP_DIR, name);
  cJSON *o = load_oracle(name);
  CHECKF(o != NULL, "%s: cannot read oracle.json", name);
  irt_model *m =
      o && convert_fixture(name, gguf, false) ? build_and_open(gguf, "auto", "auto", 0) : NULL;
  if (!m) {
    cJSON_Delete(o);
    return;
  }
  const cJSON *prompts = cJSON_GetObjectItem(o, "prompts"), *p;
  int np = 0;
  double worst = 0;
  cJSON_ArrayForEach(p, prompts) {
    int32_t ids[64];
    int64_t n = tmodel_json_ids(p, ids, 64);
    float *lg = tmodel_prompt_logits(m, ids, n);
    double w = worst_vs_oracle(lg, cJSON_GetArrayItem(cJSON_GetObjectItem(o, "logits"), np),
                               irt_model_get_info(m)->vocab_size);
    if (w > worst) worst = w;
    CHECKF(greedy_matches(m, ids, n, cJSON_GetArrayItem(cJSON_GetObjectItem(o, "greedy"), np)),
           "%s (gguf): prompt %d: greedy tokens differ from transformers", name, np);
    free(lg);
    np++;
  }
  printf("%s (gguf): %d prompts, max relative logit error vs transformers %.3g\n", name, np, worst);
  CHECKF(worst <= TOL, "%s (gguf): logits differ from transformers by %.3g, tolerance %g", name,
         worst, TOL);
  irt_model_close(m);
  cJSON_Delete(o);
}

/* Quantized kernels with f32 activations against build-time dequantization of the same
 * Q8_0 file: the same bits. (int8 activations, the CPU default, are checked against the
 * integer arithmetic in test_quant and on SmolLM2's perplexity in test_quantize.sh.) */
static void run_q8(const char *name) {
  char gguf[1024];
  snprintf(gguf, sizeof gguf, "%s/gguf-q8-%s.gguf", TEST_TMP_DIR, name);
  if (!convert_fixture(name, gguf, true)) return;
  irt_model *mq = build_and_open(gguf, "auto", "f32", 0),
            *mf = build_and_open(gguf, "f32", "f32", 0);
  if (mq && mf) {
    static const int32_t ids[12] = {1, 17, 99, 4, 250, 3, 3, 64, 128, 7, 200, 11};
    int64_t V = irt_model_get_info(mq)->vocab_size;
    float *a = tmodel_prompt_logits(mq, ids, 12), *b = tmodel_prompt_logits(mf, ids, 12);
    double worst = 0;
    for (int64_t i = 0; i < 12 * V; i++) {
      double e = fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i]));
      if (e > worst) worst = e;
    }
    printf("%s (q8_0 gguf): quantized kernels vs dequantized plan: max relative %.3g\n", name,
           worst);
    CHECKF(worst == 0, "%s q8_0: quantized kernels differ from the dequantized plan by %.3g", name,
           worst);
    free(a), free(b);
  }
  irt_model_close(mq);
  irt_model_close(mf);
}

/* Longrope from the GGUF form (tmodel_longrope_check): the converter's factor tensors. */
static void run_longrope(const char *name, int64_t orig) {
  char gguf[1024];
  snprintf(gguf, sizeof gguf, "%s/gguf-oracle-%s.gguf", TEST_TMP_DIR, name);
  cJSON *o = load_oracle(name);
  CHECKF(o != NULL, "%s: cannot read oracle.json", name);
  bool ok = o && convert_fixture(name, gguf, false);
  irt_model *ms = ok ? build_and_open(gguf, "auto", "auto", orig) : NULL;
  irt_model *ml = ok ? build_and_open(gguf, "auto", "auto", 0) : NULL;
  if (ms && ml) {
    int n_short = 0, n_long = 0;
    double worst =
        tmodel_longrope_check(ms, ml, cJSON_GetObjectItem(o, "prompts"),
                              cJSON_GetObjectItem(o, "logits"), orig, TOL, name, &n_short, &n_long);
    printf("%s (gguf): %d prompts (%d on the short factors), max relative logit error vs "
           "transformers %.3g\n",
           name, n_short + n_long, n_short, worst);
  }
  irt_model_close(ms);
  irt_model_close(ml);
  cJSON_Delete(o);
}

int main(void) {
  const char *fixtures[] = {"llama-gqa-f32",     "qwen2-bias-bf16",  "llama-mha-f16",
                            "qwen3-qknorm-bf16", "llama3-rope-f32",  "qwen3-yarn-f32",
                            "phi3-fused-f32",    "smollm3-nope-f32", "gemma2-softcap-f32",
                            "gemma3-local-f32"};
  for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) run_fixture(fixtures[i]);
  run_q8("llama-gqa-f32");
  run_q8("gemma3-local-f32");
  run_q8("qwen2-bias-bf16");
  run_q8("qwen3-qknorm-bf16");
  run_longrope("phi3-longrope-f32", 16);
  return tcheck_done("gguf_oracle");
}
