/* test_onnx_llm: an exported causal-LM ONNX graph (torch.onnx.export of the
 * tiny llama-gqa-f32 checkpoint, tools/gen_onnx_fixtures.py) built as an LLM
 * plan: its decoder is recognised and runs on the paged KV cache. Against two
 * external oracles:
 *   - onnxruntime on the same file (tests/fixtures/onnx-llama-gqa/oracle.json):
 * logits at every prompt position and 32 greedy tokens (ORT recomputes the full
 * sequence per step; we decode incrementally through the KV cache);
 *   - transformers on the source checkpoint (llama-gqa-f32/oracle.json): the
 * same. Tolerance as test_oracle: f32 weights and arithmetic on both sides,
 * only summation order differs, so |ours - theirs| <= 1e-4 * (1 + |theirs|).
 * The build report names what was recognised. */
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
  if (infc_read_file(path, 64u << 20, &text, NULL, &d) != IR_OK)
    return NULL;
  cJSON *root = cJSON_Parse(text);
  free(text);
  return root;
}

static irt_model *build_and_open(const char *model, const char *plan) {
  infc_options o = infc_options_default();
  o.model.max_tokens = 64;
  infc_build_report r = {0};
  ir_diag d = {0};
  ir_status st = infc_build(model, &o, plan, NULL, &r, &d);
  CHECKF(st == IR_OK, "build %s: %s", model, d.msg);
  if (st != IR_OK)
    return NULL;
  printf("recognised: %s\n", r.recognised);
  CHECKF(
      strstr(r.recognised,
             "2 attention blocks -> paged attention, GQA 4/2, head_dim 16") &&
          strstr(r.recognised, "theta=10000") &&
          strstr(r.recognised, "eps=1e-05") &&
          strstr(r.recognised, "SwiGLU 172"),
      "unexpected recognition summary: %s", r.recognised);
  return tmodel_open(plan);
}

/* Worst |ours - want| / (1 + |want|) over every row of `want` (and the absolute
 * max). */
static double compare(const float *lg, const cJSON *want, int64_t V,
                      double *abs_max) {
  double worst = 0;
  int64_t t = 0;
  const cJSON *row;
  cJSON_ArrayForEach(row, want) {
    int64_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, row) {
      double e = fabs((double)lg[t * V + i] - v->valuedouble);
      if (e > *abs_max)
        *abs_max = e;
      if (e / (1.0 + fabs(v->valuedouble)) > worst)
        worst = e / (1.0 + fabs(v->valuedouble));
      i++;
    }
    CHECKF(i == V, "oracle row has %lld logits, vocab is %lld", (long long)i,
           (long long)V);
    t++;
  }
  return worst;
}

static void check_against(irt_model *m, const cJSON *oracle, const char *who) {
  const cJSON *prompts = cJSON_GetObjectItem(oracle, "prompts");
  const cJSON *logits = cJSON_GetObjectItem(oracle, "logits");
  const cJSON *greedys = cJSON_GetObjectItem(oracle, "greedy");
  CHECKF(prompts && logits && greedys, "%s oracle lacks prompts/logits/greedy",
         who);
  if (!prompts || !logits || !greedys)
    return;
  int64_t V = irt_model_get_info(m)->vocab_size;
  double worst = 0, abs_max = 0;
  int np = 0, same = 0;
  for (const cJSON *p = prompts->child; p; p = p->next, np++) {
    int32_t ids[64], want[N_GREEDY], got[N_GREEDY];
    int64_t n = tmodel_json_ids(p, ids, 64);
    float *lg = tmodel_prompt_logits(m, ids, n);
    double w = compare(lg, cJSON_GetArrayItem(logits, np), V, &abs_max);
    if (w > worst)
      worst = w;
    free(lg);
    int64_t nw = tmodel_json_ids(cJSON_GetArrayItem(greedys, np), want, N_GREEDY);
    tmodel_greedy(m, ids, n, got, N_GREEDY);
    bool eq = nw == N_GREEDY && !memcmp(got, want, sizeof got);
    same += eq;
    CHECKF(eq, "%s: prompt %d: greedy tokens differ", who, np);
  }
  CHECKF(worst <= TOL, "%s: logits differ by %.3g (relative), tolerance %g",
         who, worst, TOL);
  printf("vs %s: %d prompts, max |logit error| %.3g (relative %.3g), greedy "
         "identical %d/%d\n",
         who, np, abs_max, worst, same, np);
}

int main(void) {
  char model[1024], plan[1024], path[1024];
  snprintf(model, sizeof model, "%s/onnx-llama-gqa/model.onnx", FIXTURES_DIR);
  snprintf(plan, sizeof plan, "%s/onnx-llm-gqa.plan", TEST_TMP_DIR);
  irt_model *m = build_and_open(model, plan);
  if (m) {
    snprintf(path, sizeof path, "%s/onnx-llama-gqa/oracle.json", FIXTURES_DIR);
    cJSON *ort = load_json(path);
    snprintf(path, sizeof path, "%s/llama-gqa-f32/oracle.json", FIXTURES_DIR);
    cJSON *hf = load_json(path);
    CHECKF(ort && hf, "cannot read the oracles");
    if (ort)
      check_against(m, ort, "onnxruntime");
    if (hf)
      check_against(m, hf, "transformers");
    cJSON_Delete(ort);
    cJSON_Delete(hf);
    irt_model_close(m);
  }
  return tcheck_done("onnx_llm");
}
