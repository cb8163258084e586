/* test_onnx_llm: exported causal-LM ONNX graphs (tools/gen_onnx_fixtures.py) built as LLM
 * plans: the decoder is recognised and runs on the paged KV cache. Fixtures:
 *   onnx-llama-gqa               torch.onnx.export of llama-gqa-f32, no past KV;
 *   onnx-llama-past              the same exported optimum-style WITH past KV
 *                                (past_key_values.{i}.* -> present.{i}.*);
 *   onnx-qwen2-past              Qwen2ForCausalLM (q/k/v bias, MQA, tied embeddings, RoPE
 *                                from precomputed cos/sin tables), past KV;
 *   onnx-llama-rope-interleaved  RoPE on adjacent pairs, q/k rows permuted as llama.cpp's
 *                                converter does (the same function as llama-gqa-f32);
 *   onnx-dynamo-*                torch's default (dynamo) exporter on HF Llama, Qwen2, Qwen3,
 *                                Phi-3, SmolLM3, Llama 3.1 rope, Mistral, Gemma 2 and 3: eager
 *                                and SDPA, full-sequence and past KV, opset 23's Attention,
 *                                f16, external data (tools/gen_onnx_dynamo_fixtures.py);
 *   onnx-optimum-*               optimum-cli export onnx (tools/gen_onnx_optimum_fixtures.py);
 *   onnx-plain-*                 a Llama written in plain torch, exported by dynamo.
 * The decoder is recognised by the canonicalize pass (passes/pass_canon_llm.c).
 * Against two external oracles:
 *   - onnxruntime on the same file (oracle.json): logits at every prompt position and 32
 *     greedy tokens. With past KV, onnxruntime ran the prompt in two chunks (past_len 0,
 *     then the presents fed back) and decoded feeding presents back; its logits of the
 *     first decode steps are compared with ours decoding the same tokens one at a time
 *     through the paged KV cache;
 *   - transformers on the source checkpoint (<source>/oracle.json): the same.
 * Tolerance as test_oracle: f32 weights and arithmetic on both sides, only summation
 * order differs, so |ours - theirs| <= 1e-4 * (1 + |theirs|).
 * Then the graphs infc must not serve: a small MLP (builds in generic mode, says it is not
 * an LLM), a Llama with a GELU MLP and symbolic dims (refused, naming the MLP), the
 * same with fixed dims (builds in generic mode, saying why it is not a servable LLM), and
 * a Llama with a graph input it does not understand (refused, naming the input). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infc_build.h"
#include "infc_util.h"
#include "inferrt.h"
#include "tcheck.h"
#include "tmodel.h"

#define N_GREEDY 32
#define TOL 1e-4

static cJSON *load_json(const char *path) {
  char *text = NULL;
  ir_diag d = {0};
  if (infc_read_file(path, 64u << 20, &text, NULL, &d) != IR_OK) return NULL;
  cJSON *root = cJSON_Parse(text);
  free(text);
  return root;
}

static cJSON *fixture_json(const char *dir, const char *file) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s/%s", FIXTURES_DIR, dir, file);
  cJSON *j = load_json(path);
  CHECKF(j, "cannot read %s", path);
  return j;
}

/* Builds fixture `dir` with the test's options; the report in *r, the status returned. */
static ir_status build(const char *dir, infc_build_report *r, ir_diag *d) {
  char model[1024], plan[1024];
  snprintf(model, sizeof model, "%s/%s/model.onnx", FIXTURES_DIR, dir);
  snprintf(plan, sizeof plan, "%s/%s.plan", TEST_TMP_DIR, dir);
  infc_options o = infc_options_default();
  o.model.max_tokens = 64;
  return infc_build(model, &o, plan, NULL, r, d);
}

/* Builds an LLM fixture, checks each of `want` (NULL-terminated) is in the recognition
 * summary and opens the plan. */
static irt_model *build_and_open(const char *dir, const char *const *want) {
  infc_build_report r = {0};
  ir_diag d = {0};
  ir_status st = build(dir, &r, &d);
  CHECKF(st == IR_OK, "build %s: %s", dir, d.msg);
  if (st != IR_OK) return NULL;
  printf("%s: recognised: %s\n", dir, r.recognised);
  for (int i = 0; want[i]; i++)
    CHECKF(strstr(r.recognised, want[i]), "%s: '%s' not in the recognition summary: %s", dir,
           want[i], r.recognised);
  char plan[1024];
  snprintf(plan, sizeof plan, "%s/%s.plan", TEST_TMP_DIR, dir);
  return tmodel_open(plan);
}

/* Ours decoding `toks` one at a time after the prompt against the oracle's logits of those
 * decode steps (rows); the worst relative error. */
static double check_decode(irt_model *m, const int32_t *ids, int64_t n, const int32_t *toks,
                           const cJSON *rows) {
  int64_t V = irt_model_get_info(m)->vocab_size, steps = cJSON_GetArraySize(rows), nr = 0;
  float *lg = malloc((size_t)((steps + 1) * V) * sizeof *lg);
  irt_seq *s = NULL;
  irt_error err = {0};
  irt_status st = irt_seq_create(m, &s, &err);
  if (st == IRT_OK) st = irt_seq_decode(m, s, ids, n, lg, false, &err);
  for (int64_t i = 0; st == IRT_OK && i < steps; i++)
    st = irt_seq_decode(m, s, &toks[i], 1, lg + i * V, false, &err);
  CHECKF(st == IRT_OK, "decode steps: %s", err.msg);
  bool short_row = false;
  double w = st == IRT_OK ? tmodel_max_rel_error(lg, rows, V, &nr, &short_row) : 1e9;
  CHECKF(nr == steps && !short_row, "decode_logits rows malformed");
  irt_seq_destroy(s);
  free(lg);
  return w;
}

static void check_against(irt_model *m, const cJSON *oracle, const char *who, double tol) {
  const cJSON *prompts = cJSON_GetObjectItem(oracle, "prompts");
  const cJSON *logits = cJSON_GetObjectItem(oracle, "logits");
  const cJSON *greedys = cJSON_GetObjectItem(oracle, "greedy");
  const cJSON *decode = cJSON_GetObjectItem(oracle, "decode_logits");
  CHECKF(prompts && logits && greedys, "%s oracle lacks prompts/logits/greedy", who);
  if (!prompts || !logits || !greedys) return;
  int64_t V = irt_model_get_info(m)->vocab_size;
  double worst = 0, worst_dec = 0;
  int np = 0, same = 0;
  for (const cJSON *p = prompts->child; p; p = p->next, np++) {
    int32_t ids[64], want[N_GREEDY], got[N_GREEDY];
    int64_t n = tmodel_json_ids(p, ids, 64), rows = 0;
    bool short_row = false;
    float *lg = tmodel_prompt_logits(m, ids, n);
    double w = tmodel_max_rel_error(lg, cJSON_GetArrayItem(logits, np), V, &rows, &short_row);
    CHECKF(rows == n && !short_row, "%s: prompt %d: oracle rows malformed", who, np);
    if (w > worst) worst = w;
    free(lg);
    int64_t nw = tmodel_json_ids(cJSON_GetArrayItem(greedys, np), want, N_GREEDY);
    tmodel_greedy(m, ids, n, got, N_GREEDY);
    bool eq = nw == N_GREEDY && !memcmp(got, want, sizeof got);
    same += eq;
    CHECKF(eq, "%s: prompt %d: greedy tokens differ", who, np);
    if (decode && nw == N_GREEDY) {
      double wd = check_decode(m, ids, n, want, cJSON_GetArrayItem(decode, np));
      if (wd > worst_dec) worst_dec = wd;
    }
  }
  CHECKF(worst <= tol, "%s: logits differ by %.3g (relative), tolerance %g", who, worst, tol);
  CHECKF(worst_dec <= tol, "%s: decode-step logits differ by %.3g (relative), tolerance %g", who,
         worst_dec, tol);
  printf("  vs %s: %d prompts, max relative logit error %.3g", who, np, worst);
  if (decode) printf(" (decode steps %.3g)", worst_dec);
  printf(", greedy identical %d/%d\n", same, np);
}

/* An LLM fixture against onnxruntime on the same file and transformers on its source. */
/* tol: against onnxruntime (transformers on the f32 source: TOL, or tol when larger) */
static void check_llm_tol(const char *dir, const char *const *want, double tol) {
  irt_model *m = build_and_open(dir, want);
  if (!m) return;
  cJSON *ort = fixture_json(dir, "oracle.json");
  const cJSON *src = ort ? cJSON_GetObjectItem(ort, "source") : NULL;
  cJSON *hf = cJSON_IsString(src) ? fixture_json(src->valuestring, "oracle.json") : NULL;
  CHECKF(hf, "%s: no transformers oracle for its source", dir);
  if (ort) check_against(m, ort, "onnxruntime", tol);
  if (hf) check_against(m, hf, "transformers", tol);
  if (ort && cJSON_IsTrue(cJSON_GetObjectItem(ort, "past_kv")))
    CHECKF(cJSON_GetObjectItem(ort, "decode_logits"), "%s: no decode_logits", dir);
  cJSON_Delete(ort);
  cJSON_Delete(hf);
  irt_model_close(m);
}

static void check_llm(const char *dir, const char *const *want) { check_llm_tol(dir, want, TOL); }

/* Graphs that are not servable LLMs: generic mode with a message, or a clear refusal. */
static void check_not_servable(void) {
  infc_build_report r = {0};
  ir_diag d = {0};
  ir_status st = build("onnx-mlp", &r, &d);
  CHECKF(st == IR_OK, "onnx-mlp: %s", d.msg);
  CHECKF(strstr(r.recognised, "generic graph") && strstr(r.recognised, "not an LLM"),
         "onnx-mlp: %s", r.recognised);

  r = (infc_build_report){0};
  d = (ir_diag){0};
  st = build("onnx-llama-gelu", &r, &d);
  printf("onnx-llama-gelu: %s\n", d.msg);
  CHECKF(st == IR_UNSUPPORTED && strstr(d.msg, "onnx-llama-gelu/model.onnx") &&
             strstr(d.msg, "layer 0: the MLP is not SwiGLU") && strstr(d.msg, "symbolic"),
         "onnx-llama-gelu: status %d: %s", (int)st, d.msg);

  r = (infc_build_report){0};
  d = (ir_diag){0};
  st = build("onnx-llama-extra-input", &r, &d);
  printf("onnx-llama-extra-input: %s\n", d.msg);
  CHECKF(st == IR_UNSUPPORTED && strstr(d.msg, "graph input 'cache_position' is none of"),
         "onnx-llama-extra-input: status %d: %s", (int)st, d.msg);

  r = (infc_build_report){0};
  d = (ir_diag){0};
  st = build("onnx-llama-gelu-static", &r, &d);
  printf("onnx-llama-gelu-static: recognised: %s\n", r.recognised);
  CHECKF(st == IR_OK, "onnx-llama-gelu-static: %s", d.msg);
  CHECKF(strstr(r.recognised, "generic graph") && strstr(r.recognised, "not a servable LLM") &&
             strstr(r.recognised, "the MLP is not SwiGLU"),
         "onnx-llama-gelu-static: %s", r.recognised);
}

int main(void) {
  static const char *const gqa[] = {"2 attention blocks -> paged attention, GQA 4/2, head_dim 16",
                                    "RoPE rotate-half theta=10000", "eps=1e-05", "SwiGLU 172",
                                    NULL};
  static const char *const past[] = {"2 attention blocks -> paged attention, GQA 4/2, head_dim 16",
                                     "past-KV concat -> paged KV (present.* dropped)",
                                     "RoPE rotate-half theta=10000", NULL};
  static const char *const qwen2[] = {"MQA 4/1, head_dim 16, q/k/v bias",
                                      "lm_head tied",
                                      "past-KV concat -> paged KV (present.* dropped)",
                                      "theta=1e+06",
                                      "eps=1e-06",
                                      "SwiGLU 128",
                                      NULL};
  static const char *const inter[] = {"GQA 4/2, head_dim 16", "RoPE interleaved theta=10000", NULL};
  check_llm("onnx-llama-gqa", gqa);
  check_llm("onnx-llama-past", past);
  check_llm("onnx-qwen2-past", qwen2);
  check_llm("onnx-llama-rope-interleaved", inter);
  /* torch's default (dynamo) exporter, transformers 5 (tools/gen_onnx_dynamo_fixtures.py) */
  static const char *const dyn[] = {"2 attention blocks -> paged attention, GQA 4/2, head_dim 16",
                                    "RoPE rotate-half theta=10000", "eps=1e-05", "SwiGLU 172",
                                    NULL};
  static const char *const dyn_qwen2[] = {"MQA 4/1, head_dim 16, q/k/v bias",
                                          "lm_head tied",
                                          "theta=1e+06",
                                          "eps=1e-06",
                                          "SwiGLU 128",
                                          NULL};
  check_llm("onnx-dynamo-llama-eager", dyn);
  check_llm("onnx-dynamo-llama-sdpa", dyn);
  check_llm("onnx-dynamo-llama-eager-past", past);
  check_llm("onnx-dynamo-llama-sdpa-past", past);
  check_llm("onnx-dynamo-llama-sdpa-past-extdata", past); /* weights in model.onnx.data */
  check_llm("onnx-dynamo-qwen2-eager", dyn_qwen2);
  check_llm("onnx-dynamo-qwen2-sdpa-past", dyn_qwen2);
  check_llm("onnx-dynamo-qwen2-sdpa", dyn_qwen2);
  check_llm("onnx-dynamo-qwen2-eager-past", dyn_qwen2);
  static const char *const dyn_qwen3[] = {"GQA 4/2, head_dim 32, q/k norm", "theta=1e+06", NULL};
  check_llm("onnx-dynamo-qwen3-eager", dyn_qwen3);
  check_llm("onnx-dynamo-qwen3-sdpa-past", dyn_qwen3);
  check_llm("onnx-dynamo-qwen3-sdpa", dyn_qwen3);
  check_llm("onnx-dynamo-qwen3-eager-past", dyn_qwen3);
  static const char *const dyn_phi3[] = {"GQA 4/2, head_dim 16", "theta=10000 on 12 dims",
                                         "SwiGLU 96", NULL};
  check_llm("onnx-dynamo-phi3-sdpa", dyn_phi3);
  check_llm("onnx-dynamo-phi3-eager-past", dyn_phi3);
  static const char *const dyn_smollm3[] = {"4 attention blocks", "none every 4-th layer",
                                            "past-KV concat", NULL};
  check_llm("onnx-dynamo-smollm3-sdpa-past", dyn_smollm3);
  static const char *const dyn_smollm3_full[] = {"4 attention blocks", "none every 4-th layer",
                                                 NULL};
  check_llm("onnx-dynamo-smollm3-eager", dyn_smollm3_full);
  static const char *const dyn_llama3[] = {"frequencies from the exporter's table", NULL};
  check_llm("onnx-dynamo-llama3-rope-sdpa", dyn_llama3);
  static const char *const dyn_mistral[] = {"sliding window 8;", NULL};
  check_llm("onnx-dynamo-mistral-swa-eager", dyn_mistral);
  static const char *const dyn_gemma2[] = {"GeGLU 96",
                                           "sliding window 8 (every 2-th layer full)",
                                           "scores softcap 5",
                                           "sandwich norms",
                                           "embeddings x 8",
                                           "logits softcap",
                                           NULL};
  check_llm("onnx-dynamo-gemma2-eager", dyn_gemma2);
  static const char *const dyn_gemma3[] = {"q/k norm", "(sliding layers 10000)", "sandwich norms",
                                           NULL};
  check_llm("onnx-dynamo-gemma3-sdpa", dyn_gemma3);
  /* float16 (model.half()): onnxruntime computes in f16, the plan in f32 over the same f16
   * values, so they agree to f16's precision; the source's f32 weights were rounded */
  check_llm_tol("onnx-dynamo-llama-sdpa-f16", dyn, 3e-2);
  /* opset 23: the exporter's Attention, RotaryEmbedding and RMSNormalization ops */
  check_llm("onnx-dynamo-llama-sdpa-opset23", dyn);
  check_llm("onnx-dynamo-qwen3-sdpa-past-opset23", dyn_qwen3);
  /* optimum-cli export onnx (tools/gen_onnx_optimum_fixtures.py) */
  check_llm("onnx-optimum-llama", dyn);
  check_llm("onnx-optimum-llama-past", past);
  check_llm("onnx-optimum-qwen2-past", qwen2);
  /* a Llama in plain torch: fused qkv, repeat_interleave, arange positions, triu mask */
  check_llm("onnx-plain-llama", dyn);
  check_llm("onnx-plain-llama-past", past);
  check_not_servable();
  return tcheck_done("onnx_llm");
}
