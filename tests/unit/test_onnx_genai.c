/* test_onnx_genai: ONNX Runtime GenAI model-builder output built as LLM plans.
 * tools/gen_genai_fixtures.py ran the real builder (onnxruntime_genai.models.builder)
 * on the tiny llama-gqa-f32 checkpoint three ways: fp32 (packed QKV, rotary inside
 * GroupQueryAttention), int4 (MatMulNBits, symmetric: zero point 8) and int4 with zero
 * points and separate com.microsoft RotaryEmbedding nodes; and on llama-text (tied
 * embeddings) as int4, whose embedding is a GatherBlockQuantized of lm_head's weight.
 * Oracles recorded then:
 *   - onnxruntime on the same file: logits at every prompt position, the logits of its
 *     first 8 KV-cache decode steps, and 32 greedy tokens decoded through its KV cache;
 *   - onnxruntime-genai generate(): greedy tokens.
 * Tolerance: MatMulNBits is built with accuracy_level 1, so onnxruntime multiplies by
 * the exactly dequantized f32 weights, as we do; all arithmetic is f32 on both sides and
 * only summation order differs: |ours - theirs| <= 1e-4 * (1 + |theirs|), as test_oracle.
 * The int4 fixtures are built twice: as stored (MatMulNBits -> the IR's weight-only int4
 * matmul over the packed codes) and with --dtype f32 (dequantized at import); both must
 * meet the tolerance.
 * Refusals: copies of a fixture with one attribute changed must fail with a message
 * naming the node, the op and the attribute. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "infc_build.h"
#include "infc_util.h"
#include "inferrt.h"
#include "onnx.pb-c.h"
#include "tcheck.h"
#include "tmodel.h"

#define N_GREEDY 32
#define N_DECODE 8 /* at most, per prompt */
#define TOL 1e-4

typedef struct fixture {
  const char *dir;
  const char *want[4]; /* substrings of the recognition summary */
} fixture;

static const fixture FIXTURES[] = {
    {"onnx-genai-f32",
     {"2 GroupQueryAttention blocks -> paged attention, GQA 4/2, head_dim 16, packed QKV",
      "RoPE (in GQA) theta=10000", "RMSNorm eps=1e-05 (SkipSimplified); SwiGLU 172",
      "11 MatMul weights; vocab 300"}},
    {"onnx-genai-int4",
     {"2 GroupQueryAttention blocks -> paged attention, GQA 4/2, head_dim 16, packed QKV",
      "RoPE (in GQA) theta=10000", "RMSNorm eps=1e-05 (SkipSimplified); SwiGLU 172",
      "11 MatMulNBits int4 bs32 zp 8 -> int4 matmul (2 f32: K%bs)"}},
    {"onnx-genai-int4-rope",
     {"2 GroupQueryAttention blocks -> paged attention, GQA 4/2, head_dim 16;",
      "RoPE (RotaryEmbedding) theta=10000", "SwiGLU 172",
      "15 MatMulNBits int4 bs32 with zero points -> int4 matmul (2 f32: K%bs)"}},
    {"onnx-genai-int4-tied",
     {"2 GroupQueryAttention blocks -> paged attention, GQA 4/2, head_dim 16, packed QKV",
      "SwiGLU 128", "11 MatMulNBits int4 bs32 zp 8 -> int4 matmul;",
      "vocab 2006 (int4 embedding)"}},
};

static cJSON *load_json(const char *path) {
  char *text = NULL;
  ir_diag d = {0};
  if (infc_read_file(path, 64u << 20, &text, NULL, &d) != IR_OK) return NULL;
  cJSON *root = cJSON_Parse(text);
  free(text);
  return root;
}

/* wdt: IR_DTYPE_INVALID (as stored: MatMulNBits stays int4) or IR_F32 (dequantized). */
static ir_status build_as(const char *model, const char *plan, ir_dtype wdt, infc_build_report *r,
                          ir_diag *d) {
  infc_options o = infc_options_default();
  o.model.max_tokens = 64;
  o.model.weight_dtype = wdt;
  return infc_build(model, &o, plan, NULL, r, d);
}

static ir_status build(const char *model, const char *plan, infc_build_report *r, ir_diag *d) {
  infc_options o = infc_options_default();
  o.model.max_tokens = 64;
  return infc_build(model, &o, plan, NULL, r, d);
}

/* max |ours - want| over rows (and the relative form into *rel). */
static double abs_error(const float *lg, const cJSON *rows, int64_t V, double *rel) {
  int64_t n = 0;
  bool short_row = false;
  *rel = tmodel_max_rel_error(lg, rows, V, &n, &short_row);
  CHECKF(!short_row && n > 0, "oracle rows are not %lld logits", (long long)V);
  double worst = 0;
  const cJSON *row, *v;
  int64_t t = 0;
  cJSON_ArrayForEach(row, rows) {
    int64_t i = 0;
    cJSON_ArrayForEach(v, row) {
      if (i < V && fabs(lg[t * V + i] - v->valuedouble) > worst)
        worst = fabs(lg[t * V + i] - v->valuedouble);
      i++;
    }
    t++;
  }
  return worst;
}

typedef struct score {
  double abs, rel, dec_abs, dec_rel;
  int same, same_genai, n;
} score;

static void check_prompt(irt_model *m, const cJSON *o, int k, score *s) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  int32_t ids[64], want[N_GREEDY], got[N_GREEDY], gai[N_GREEDY];
  int64_t n = tmodel_json_ids(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "prompts"), k), ids, 32);
  double rel, a;
  float *lg = tmodel_prompt_logits(m, ids, n);
  a = abs_error(lg, cJSON_GetArrayItem(cJSON_GetObjectItem(o, "logits"), k), V, &rel);
  s->abs = fmax(s->abs, a);
  s->rel = fmax(s->rel, rel);
  free(lg);
  int64_t nw =
      tmodel_json_ids(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "greedy"), k), want, N_GREEDY);
  tmodel_greedy(m, ids, n, got, N_GREEDY);
  bool eq = nw == N_GREEDY && !memcmp(got, want, sizeof got);
  s->same += eq;
  CHECKF(eq, "prompt %d: greedy tokens differ from onnxruntime's", k);
  /* onnxruntime's KV-cache decode steps against our logits of the whole sequence */
  const cJSON *dec = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "decode_logits"), k);
  int nd = cJSON_GetArraySize(dec);
  CHECKF(nd >= 1 && nd <= N_DECODE, "prompt %d: %d decode steps recorded", k, nd);
  nd = nd < 1 ? 1 : nd > N_DECODE ? N_DECODE : nd;
  memcpy(ids + n, want, (size_t)nd * sizeof *ids);
  lg = tmodel_prompt_logits(m, ids, n + nd);
  a = abs_error(lg + n * V, dec, V, &rel);
  s->dec_abs = fmax(s->dec_abs, a);
  s->dec_rel = fmax(s->dec_rel, rel);
  free(lg);
  int64_t ng =
      tmodel_json_ids(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "genai_greedy"), k), gai, N_GREEDY);
  eq = ng > 0 && !memcmp(got, gai, (size_t)ng * sizeof *gai);
  s->same_genai += eq;
  CHECKF(eq, "prompt %d: greedy tokens differ from onnxruntime-genai's", k);
  s->n++;
}

/* context_length, bos and eos from the genai_config.json beside the model. */
static void check_config(irt_model *m, const fixture *f) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s/genai_config.json", FIXTURES_DIR, f->dir);
  cJSON *g = load_json(path), *model = cJSON_GetObjectItem(g, "model");
  const cJSON *ctx = cJSON_GetObjectItem(model, "context_length");
  const cJSON *bos = cJSON_GetObjectItem(model, "bos_token_id");
  const cJSON *eos = cJSON_GetObjectItem(model, "eos_token_id");
  const irt_model_info *info = m ? irt_model_get_info(m) : NULL;
  CHECKF(info && cJSON_IsNumber(ctx) && cJSON_IsNumber(bos) && cJSON_IsNumber(eos) &&
             info->context_length == ctx->valueint && info->bos_token_id == bos->valueint &&
             info->eos_token_id == eos->valueint,
         "%s: plan context/bos/eos differ from genai_config.json", f->dir);
  cJSON_Delete(g);
}

/* Builds f (weights as stored, or dequantized to f32) and checks it against its oracles. */
static void check_fixture(const fixture *f, ir_dtype wdt) {
  char model[1024], plan[1024], path[1024];
  const char *how = wdt == IR_F32 ? " --dtype f32" : "";
  snprintf(model, sizeof model, "%s/%s/model.onnx", FIXTURES_DIR, f->dir);
  snprintf(plan, sizeof plan, "%s/%s%s.plan", TEST_TMP_DIR, f->dir, wdt == IR_F32 ? "-f32" : "");
  snprintf(path, sizeof path, "%s/%s/oracle.json", FIXTURES_DIR, f->dir);
  infc_build_report r = {0};
  ir_diag d = {0};
  ir_status st = build_as(model, plan, wdt, &r, &d);
  CHECKF(st == IR_OK, "build %s: %s", model, d.msg);
  if (st != IR_OK) return;
  printf("%s%s: recognised: %s\n", f->dir, how, r.recognised);
  for (int i = 0; i < 4 && wdt != IR_F32; i++)
    CHECKF(strstr(r.recognised, f->want[i]), "%s: summary lacks '%s'", f->dir, f->want[i]);
  if (wdt == IR_F32)
    CHECKF(!strstr(f->want[3], "MatMulNBits") || strstr(r.recognised, "-> f32;"),
           "%s --dtype f32: MatMulNBits not dequantized: %s", f->dir, r.recognised);
  irt_model *m = tmodel_open(plan);
  cJSON *o = load_json(path);
  CHECKF(o, "cannot read %s", path);
  check_config(m, f);
  score s = {0};
  int np = cJSON_GetArraySize(cJSON_GetObjectItem(o, "prompts"));
  for (int k = 0; m && o && k < np; k++) check_prompt(m, o, k, &s);
  CHECKF(np >= 2 && s.n == np, "%s: %d of %d prompts checked", f->dir, s.n, np);
  CHECKF(s.rel <= TOL && s.dec_rel <= TOL,
         "%s: logits differ by %.3g / decode %.3g (relative), "
         "tolerance %g",
         f->dir, s.rel, s.dec_rel, TOL);
  printf("%s%s vs onnxruntime: max |logit error| %.3g (relative %.3g), KV decode steps %.3g "
         "(relative %.3g); greedy identical %d/%d, onnxruntime-genai %d/%d; weights %.2f MiB\n",
         f->dir, how, s.abs, s.rel, s.dec_abs, s.dec_rel, s.same, s.n, s.same_genai, s.n,
         (double)r.weight_bytes / (1 << 20));
  cJSON_Delete(o);
  irt_model_close(m);
}

/* --- refusals -------------------------------------------------------------------------- */

typedef void (*mutate_fn)(Onnx__ModelProto *mp);

static Onnx__NodeProto *first_node(Onnx__ModelProto *mp, const char *op) {
  for (size_t i = 0; i < mp->graph->n_node; i++)
    if (!strcmp(mp->graph->node[i]->op_type, op)) return mp->graph->node[i];
  return NULL;
}

static Onnx__AttributeProto *attr(Onnx__NodeProto *n, const char *name) {
  for (size_t i = 0; n && i < n->n_attribute; i++)
    if (!strcmp(n->attribute[i]->name, name)) return n->attribute[i];
  return NULL;
}

static void set_i(Onnx__ModelProto *mp, const char *op, const char *name, int64_t v) {
  Onnx__AttributeProto *a = attr(first_node(mp, op), name);
  CHECKF(a, "fixture has no %s.%s", op, name);
  if (a) a->i = v;
}

static void set_f(Onnx__ModelProto *mp, const char *op, const char *name, float v) {
  Onnx__AttributeProto *a = attr(first_node(mp, op), name);
  CHECKF(a, "fixture has no %s.%s", op, name);
  if (a) a->f = v;
}

static void window(Onnx__ModelProto *mp) {
  set_i(mp, "GroupQueryAttention", "local_window_size", 16);
}
static void softcap(Onnx__ModelProto *mp) { set_f(mp, "GroupQueryAttention", "softcap", 30.0f); }
static void scale(Onnx__ModelProto *mp) { set_f(mp, "GroupQueryAttention", "scale", 0.5f); }
static void bits8(Onnx__ModelProto *mp) { set_i(mp, "MatMulNBits", "bits", 8); }
static void bad_k(Onnx__ModelProto *mp) { set_i(mp, "MatMulNBits", "K", 128); }
static void rot_dim(Onnx__ModelProto *mp) {
  set_i(mp, "RotaryEmbedding", "rotary_embedding_dim", 8);
}
static void eps(Onnx__ModelProto *mp) {
  set_f(mp, "SkipSimplifiedLayerNormalization", "epsilon", 1e-6f);
}

/* An attribute the recogniser does not know. */
static void unknown(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = first_node(mp, "GroupQueryAttention");
  Onnx__AttributeProto **arr = realloc(n->attribute, (n->n_attribute + 1) * sizeof *arr);
  Onnx__AttributeProto *a = malloc(sizeof *a);
  if (!arr || !a) abort();
  onnx__attribute_proto__init(a);
  a->name = strdup("sink_tokens");
  a->has_type = a->has_i = 1;
  a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
  a->i = 4;
  arr[n->n_attribute++] = a;
  n->attribute = arr;
}

/* cos and sin caches swapped: no theta explains them. */
static void swap_caches(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = first_node(mp, "RotaryEmbedding");
  char *t = n->input[2];
  n->input[2] = n->input[3];
  n->input[3] = t;
}

static bool copy_file(const char *from, const char *to) {
  char *data = NULL;
  size_t len = 0;
  ir_diag d = {0};
  if (infc_read_file(from, 64u << 20, &data, &len, &d) != IR_OK) return false;
  FILE *f = fopen(to, "wb");
  bool ok = f && fwrite(data, 1, len, f) == len;
  if (f) ok = fclose(f) == 0 && ok;
  free(data);
  return ok;
}

/* Writes fixture `fix`, mutated, as tmp/genai-mut/model.onnx (weights copied beside it)
 * into path (1100 bytes). */
static bool write_mutated(const char *fix, mutate_fn fn, char *path) {
  char src[1024], dir[1024], data[1100];
  snprintf(src, sizeof src, "%s/%s", FIXTURES_DIR, fix);
  snprintf(dir, sizeof dir, "%s/genai-mut", TEST_TMP_DIR);
  CHECK(mkdir(dir, 0755) == 0 || errno == EEXIST);
  snprintf(path, 1100, "%s/model.onnx.data", src);
  snprintf(data, sizeof data, "%s/model.onnx.data", dir);
  CHECK(copy_file(path, data));
  snprintf(path, 1100, "%s/model.onnx", src);
  char *bytes = NULL;
  size_t len = 0;
  ir_diag d = {0};
  CHECK(infc_read_file(path, 64u << 20, &bytes, &len, &d) == IR_OK);
  Onnx__ModelProto *mp =
      bytes ? onnx__model_proto__unpack(NULL, len, (const uint8_t *)bytes) : NULL;
  free(bytes);
  CHECK(mp != NULL);
  if (!mp) return false;
  fn(mp);
  size_t n = onnx__model_proto__get_packed_size(mp);
  uint8_t *out = malloc(n);
  onnx__model_proto__pack(mp, out);
  onnx__model_proto__free_unpacked(mp, NULL);
  snprintf(path, 1100, "%s/model.onnx", dir);
  FILE *f = fopen(path, "wb");
  bool ok = f && fwrite(out, 1, n, f) == n;
  if (f) ok = fclose(f) == 0 && ok;
  free(out);
  CHECK(ok);
  return ok;
}

static void expect_refusal_in(const char *fix, mutate_fn fn, ir_status want_st, const char *a,
                              const char *b, const char *c) {
  char path[1100], plan[1100];
  if (!write_mutated(fix, fn, path)) return;
  snprintf(plan, sizeof plan, "%s/genai-mut/bad.plan", TEST_TMP_DIR);
  infc_build_report r = {0};
  ir_diag d = {0};
  ir_status st = build(path, plan, &r, &d);
  CHECKF(st == want_st && strstr(d.msg, a) && strstr(d.msg, b) && strstr(d.msg, c),
         "status %s, message: %s", ir_status_name(st), d.msg);
  printf("refused (%s): %s\n", ir_status_name(st), d.msg);
}

/* Every g * Sigmoid(g) of the MLPs as one Swish(g) node (alpha 1: the same function; the
 * Sigmoid is left dead): the graph computes what onnxruntime computed for the oracle. */
static void swish(Onnx__ModelProto *mp) {
  int cnt = 0;
  for (size_t i = 0; i < mp->graph->n_node; i++) {
    Onnx__NodeProto *n = mp->graph->node[i];
    if (!strstr(n->name, "act_fn/Mul") || n->n_input != 2) continue;
    free(n->op_type);
    n->op_type = strdup("Swish");
    free(n->input[1]);
    n->n_input = 1;
    cnt++;
  }
  CHECKF(cnt == 2, "%d act_fn/Mul nodes", cnt);
}

/* A mutated fixture that means the same must match the fixture's oracle. */
static void expect_same(const char *fix, mutate_fn fn, const char *want) {
  char path[1100], plan[1100], oracle[1100];
  if (!write_mutated(fix, fn, path)) return;
  snprintf(plan, sizeof plan, "%s/genai-mut/same.plan", TEST_TMP_DIR);
  snprintf(oracle, sizeof oracle, "%s/%s/oracle.json", FIXTURES_DIR, fix);
  infc_build_report r = {0};
  ir_diag d = {0};
  ir_status st = build(path, plan, &r, &d);
  CHECKF(st == IR_OK && strstr(r.recognised, want), "build: %s %s", d.msg, r.recognised);
  if (st != IR_OK) return;
  irt_model *m = tmodel_open(plan);
  cJSON *o = load_json(oracle);
  score s = {0};
  for (int k = 0; m && o && k < cJSON_GetArraySize(cJSON_GetObjectItem(o, "prompts")); k++)
    check_prompt(m, o, k, &s);
  CHECKF(s.n >= 2 && s.rel <= TOL && s.dec_rel <= TOL, "%s mutated: relative error %.3g", fix,
         s.rel);
  printf("%s with Swish: max |logit error| %.3g vs onnxruntime on the original\n", fix, s.abs);
  cJSON_Delete(o);
  irt_model_close(m);
}

static void expect_refusal(mutate_fn fn, ir_status want_st, const char *a, const char *b,
                           const char *c) {
  expect_refusal_in("onnx-genai-int4-rope", fn, want_st, a, b, c);
}

static void no_rotary(Onnx__ModelProto *mp) { set_i(mp, "GroupQueryAttention", "do_rotary", 0); }

static void check_refusals(void) {
  const char *gqa = "node '/model/layers.0/attn/GroupQueryAttention': op 'GroupQueryAttention'";
  const char *mm = "node '/model/layers.0/attn/q_proj/MatMul_Q4': op 'MatMulNBits'";
  expect_refusal(window, IR_UNSUPPORTED, gqa, "attribute 'local_window_size' = 16",
                 "sliding-window");
  expect_refusal(softcap, IR_UNSUPPORTED, gqa, "attribute 'softcap' = 30", "softcapping");
  expect_refusal(scale, IR_UNSUPPORTED, gqa, "attribute 'scale' = 0.5", "1/sqrt(head_dim 16)");
  expect_refusal(unknown, IR_UNSUPPORTED, gqa, "attribute 'sink_tokens' is not supported",
                 "layer 0");
  expect_refusal(bits8, IR_UNSUPPORTED, mm, "attribute 'bits' = 8", "4-bit");
  expect_refusal(bad_k, IR_BAD_FORMAT, mm, "input B", "[N=64, 4 blocks, 16 bytes]");
  expect_refusal(rot_dim, IR_UNSUPPORTED, "op 'RotaryEmbedding'",
                 "attribute 'rotary_embedding_dim' = 8", "partial rotary");
  expect_refusal(swap_caches, IR_UNSUPPORTED, "op 'RotaryEmbedding'", "cos/sin caches",
                 "scaled RoPE");
  expect_refusal(eps, IR_UNSUPPORTED, "op 'SkipSimplifiedLayerNormalization'",
                 "attribute 'epsilon' = 1e-06", "differs");
  expect_refusal_in("onnx-genai-int4", no_rotary, IR_UNSUPPORTED, gqa, "not rotated",
                    "attention without RoPE");
  expect_same("onnx-genai-int4", swish, "SwiGLU 172");
}

int main(void) {
  for (size_t i = 0; i < sizeof FIXTURES / sizeof FIXTURES[0]; i++) {
    check_fixture(&FIXTURES[i], IR_DTYPE_INVALID);
    if (strstr(FIXTURES[i].dir, "int4")) check_fixture(&FIXTURES[i], IR_F32);
  }
  check_refusals();
  return tcheck_done("onnx_genai");
}
