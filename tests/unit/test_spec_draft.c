/* test_spec_draft: speculative decoding with a draft model (irt_engine_opts.draft).
 *   - greedy requests (with logit_bias and presence/frequency penalties among them) give
 *     bit for bit the tokens and logprobs of decoding without drafts, with a close draft
 *     (the target's own q8_0 build: drafts mostly kept) and a foreign one (another model
 *     with the same vocabulary: drafts mostly rejected), also when the KV pools are small
 *     enough to preempt; no block of either model stays held;
 *   - sampled requests: over 3000 seeds, the joint distribution of the two tokens that
 *     drafting decides (the 2nd and 3rd: the 1st comes from the prompt's step) equals the
 *     one without drafts by a two-sample chi-square test at p = 1e-4, with a foreign draft
 *     (nearly every draft redrawn) and the target's q4_0 build (most kept);
 *   - the test has the power to tell: on fixed p and q, the rule spec_keep/spec_residual
 *     passes it against sampling p directly, while two wrong rules (keeping x with
 *     probability p(x), ignoring q; keeping every draft) fail it;
 *   - a draft with another vocabulary is refused with a message. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h" /* spec_keep, spec_residual */
#include "infc_build.h"
#include "inferrt.h"
#include "model.h" /* kv_in_use */
#include "tcheck.h"

#define MAX_OUT 24

static const char *build_opt(const char *fixture, const char *key, const char *val,
                             const char *name) {
  static char paths[8][512];
  static int next;
  char *path = paths[next++ % 8];
  snprintf(path, 512, "%s/spec-draft-%s.plan", TEST_TMP_DIR, name);
  infc_options o = infc_options_default();
  o.model.max_tokens = 64;
  o.model.max_seqs = 16;
  o.model.max_logits = 64;
  o.model.kv_block_size = 4;
  ir_diag d = {0};
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", FIXTURES_DIR, fixture);
  bool ok = (!key || infc_options_set(&o, key, val, &d) == IR_OK) &&
            infc_build(dir, &o, path, NULL, NULL, &d) == IR_OK;
  CHECKF(ok, "build %s: %s", name, d.msg);
  return ok ? path : NULL;
}

static const char *build(const char *fixture, const char *quant, const char *name) {
  return build_opt(fixture, quant ? "quant" : NULL, quant, name);
}

static irt_model *open_plan(const char *plan, int64_t kv_tokens) {
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = 2;
  mo.kv_tokens = kv_tokens;
  irt_model *m = NULL;
  irt_error err = {0};
  CHECKF(plan && irt_model_open(plan, &mo, &m, &err) == IRT_OK, "%s", err.msg);
  return m;
}

typedef struct out {
  int32_t tok[MAX_OUT];
  float lp[MAX_OUT];
  int n;
  irt_finish finish;
} out;

static void on_event(void *user, const irt_event *ev) {
  out *o = user;
  if (ev->token >= 0 && o->n < MAX_OUT) o->tok[o->n] = ev->token, o->lp[o->n++] = ev->logprob;
  if (ev->finish) o->finish = ev->finish;
}

/* Greedy request i: its prompt, with logit_bias (i % 3 == 1) or penalties (i % 3 == 2). */
static irt_request greedy_request(int i, int32_t *p, out *o) {
  static const int32_t bias_ids[2] = {7, 8};
  static const float bias[2] = {2.0f, -100.0f};
  int len = 5 + i % 4;
  for (int k = 0; k < len; k++) p[k] = (int32_t)(3 + (17 * i + 5 * k) % 200);
  irt_request q = {.prompt_ids = p,
                   .n_prompt = (size_t)len,
                   .max_tokens = MAX_OUT,
                   .ignore_eos = true,
                   .sampling = irt_sampling_default(),
                   .on_event = on_event,
                   .user = o};
  if (i % 3 == 1) q.logit_bias_ids = bias_ids, q.logit_bias = bias, q.n_logit_bias = 2;
  if (i % 3 == 2) q.frequency_penalty = -1.5f, q.presence_penalty = 0.25f;
  return q;
}

/* n greedy requests through one engine (draft: NULL for none); *st its final stats. */
static void run_greedy(irt_model *m, irt_model *draft, int n, out *res, irt_engine_stats *st) {
  irt_engine_opts eo = irt_engine_opts_default();
  eo.draft = draft;
  eo.spec_tokens = draft ? 4 : 0;
  eo.spec_always = true;
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECKF(irt_engine_create(m, &eo, &e, &err) == IRT_OK, "%s", err.msg);
  if (!e) return;
  static int32_t prompts[16][16];
  for (int i = 0; i < n; i++) {
    memset(&res[i], 0, sizeof res[i]);
    irt_request q = greedy_request(i, prompts[i], &res[i]);
    CHECKF(irt_engine_submit(e, &q, NULL, &err) == IRT_OK, "%s", err.msg);
  }
  CHECKF(irt_engine_run(e, &err) == IRT_OK, "%s", err.msg);
  irt_engine_get_stats(e, st);
  irt_engine_destroy(e);
}

static void test_greedy(const char *target, const char *close_draft, const char *foreign,
                        const char *foreign_target) {
  enum { N = 9 };
  out ref[N], got[N];
  irt_engine_stats s0, s1;
  /* a layer-skip draft: the target's first layer, then its norm and head (infc --layers) */
  const char *skip = build_opt("llama-gqa-f32", "layers", "1", "gqa-1layer");
  struct {
    const char *target, *draft, *what;
    int64_t kv;
  } cases[] = {{target, close_draft, "its own q8_0 build", 0},
               {foreign_target, foreign, "another model", 0},
               {target, close_draft, "its own q8_0 build, small KV pools (preemption)", 48},
               {target, skip, "its first layer (--layers 1)", 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    irt_model *m = open_plan(cases[c].target, cases[c].kv);
    irt_model *d = open_plan(cases[c].draft, cases[c].kv);
    if (!m || !d) {
      irt_model_close(m), irt_model_close(d);
      continue;
    }
    if (c == 3)
      CHECKF(irt_model_get_info(d)->n_layers == 1 && irt_model_get_info(m)->n_layers == 2,
             "--layers 1: %lld layers", (long long)irt_model_get_info(d)->n_layers);
    run_greedy(m, NULL, N, ref, &s0);
    run_greedy(m, d, N, got, &s1);
    int same = 0;
    for (int i = 0; i < N; i++)
      same += ref[i].n == got[i].n && ref[i].finish == got[i].finish &&
              !memcmp(ref[i].tok, got[i].tok, sizeof(int32_t) * (size_t)ref[i].n) &&
              !memcmp(ref[i].lp, got[i].lp, sizeof(float) * (size_t)ref[i].n);
    printf("greedy with a draft (%s): %d/%d requests bit-identical, %lld drafts, %lld kept, "
           "%lld steps (%lld without), %lld preemptions\n",
           cases[c].what, same, N, (long long)s1.spec_draft_tokens,
           (long long)s1.spec_accepted_tokens, (long long)s1.steps, (long long)s0.steps,
           (long long)s1.preemptions);
    CHECKF(same == N, "%s: %d of %d requests as without drafts", cases[c].what, same, N);
    CHECK(ref[0].n == MAX_OUT && s1.spec_draft_tokens > 0);
    if (c == 0) CHECK(s1.spec_accepted_tokens > s1.spec_draft_tokens / 2 && s1.steps < s0.steps);
    if (c == 1) CHECK(s1.spec_accepted_tokens < s1.spec_draft_tokens);
    if (c == 2) CHECK(s1.preemptions > 0);
    CHECKF(kv_in_use(&m->kv) == 0 && kv_in_use(&d->kv) == 0, "%lld target, %lld draft blocks held",
           (long long)kv_in_use(&m->kv), (long long)kv_in_use(&d->kv));
    /* the draft's full blocks of kept tokens went to its prefix cache, as the target's */
    CHECKF(d->kv.n_evictable > 0, "no draft block cached (%lld)", (long long)d->kv.n_evictable);
    irt_model_close(m);
    irt_model_close(d);
  }
}

/* --- the distribution ---------------------------------------------------------------------- */

/* Two-sample chi-square of count vectors a and b (equal totals) over n cells, pooling the
 * cells where a + b < 10 into one; *df gets the degrees of freedom. */
static double chi2(const int *a, const int *b, int n, int *df) {
  double x = 0, pa = 0, pb = 0;
  int cells = 0;
  for (int i = 0; i < n; i++) {
    if (a[i] + b[i] == 0) continue;
    if (a[i] + b[i] < 10) {
      pa += a[i], pb += b[i];
      continue;
    }
    x += (double)(a[i] - b[i]) * (a[i] - b[i]) / (a[i] + b[i]);
    cells++;
  }
  if (pa + pb > 0) x += (pa - pb) * (pa - pb) / (pa + pb), cells++;
  *df = cells - 1;
  return x;
}

/* The chi-square value exceeded with probability 1e-4 (Wilson-Hilferty; z = 3.719). */
static double chi2_bound(int df) {
  double k = df > 0 ? df : 1, h = 2.0 / (9.0 * k);
  return k * pow(1.0 - h + 3.719 * sqrt(h), 3.0);
}

/* N sampled requests (seeds 1..N, temperature 1, top-k 6), 4 tokens each: counts of the
 * pair (2nd, 3rd) token in cnt (V x V). */
static void sample_pairs(irt_model *m, irt_model *draft, int N, int *cnt, int64_t V,
                         irt_engine_stats *st) {
  irt_engine_opts eo = irt_engine_opts_default();
  eo.draft = draft;
  eo.spec_tokens = draft ? 2 : 0;
  eo.spec_always = true;
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECKF(irt_engine_create(m, &eo, &e, &err) == IRT_OK, "%s", err.msg);
  if (!e) return;
  static const int32_t prompt[6] = {5, 40, 77, 12, 9, 130};
  out *res = calloc((size_t)N, sizeof *res);
  for (int done = 0; done < N;) { /* in waves, so that the queue stays bounded */
    int wave = N - done < 512 ? N - done : 512;
    for (int i = done; i < done + wave; i++) {
      irt_request q = {
          .prompt_ids = prompt,
          .n_prompt = 6,
          .max_tokens = 4,
          .ignore_eos = true,
          .sampling = {.temperature = 1.0f, .top_k = 6, .top_p = 1.0f, .seed = (uint64_t)i + 1},
          .on_event = on_event,
          .user = &res[i]};
      CHECKF(irt_engine_submit(e, &q, NULL, &err) == IRT_OK, "%s", err.msg);
    }
    CHECKF(irt_engine_run(e, &err) == IRT_OK, "%s", err.msg);
    done += wave;
  }
  for (int i = 0; i < N; i++)
    if (res[i].n == 4) cnt[res[i].tok[1] * V + res[i].tok[2]]++;
  irt_engine_get_stats(e, st);
  irt_engine_destroy(e);
  free(res);
}

static void test_distribution(const char *target, const char *draft, const char *what, bool close) {
  enum { N = 3000 };
  irt_model *m = open_plan(target, 0), *d = open_plan(draft, 0);
  if (m && d) {
    int64_t V = irt_model_get_info(m)->vocab_size;
    int *a = calloc((size_t)(V * V), sizeof *a), *b = calloc((size_t)(V * V), sizeof *b);
    irt_engine_stats sa, sb;
    sample_pairs(m, NULL, N, a, V, &sa);
    sample_pairs(m, d, N, b, V, &sb);
    int na = 0, nb = 0, df = 0;
    for (int64_t i = 0; i < V * V; i++) na += a[i], nb += b[i];
    double x = chi2(a, b, (int)(V * V), &df), bound = chi2_bound(df);
    printf("sampled with %s: %d pairs each; chi-square %.1f on %d df (bound %.1f at p = 1e-4); "
           "%lld drafts, %lld kept\n",
           what, na, x, df, bound, (long long)sb.spec_draft_tokens,
           (long long)sb.spec_accepted_tokens);
    CHECK(na == N && nb == N && df >= 10);
    CHECKF(x < bound, "with drafts the (2nd, 3rd) tokens are distributed otherwise: %.1f >= %.1f",
           x, bound);
    /* the draft's q is not the target's p: both branches (kept, redrawn) were taken, the
     * first mostly with a close draft */
    CHECK(sb.spec_accepted_tokens > 0 && sb.spec_accepted_tokens < sb.spec_draft_tokens);
    if (close) CHECK(sb.spec_accepted_tokens * 2 > sb.spec_draft_tokens);
    free(a), free(b);
  }
  irt_model_close(m);
  irt_model_close(d);
}

/* --- the rule, on fixed distributions -------------------------------------------------------- */

static uint64_t g_rng = 12345;
static double unit(void) {
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

static int32_t draw(const float *w, int n) {
  double u = unit(), acc = 0;
  for (int i = 0; i < n; i++)
    if (u < (acc += w[i])) return i;
  return n - 1;
}

/* rule 0: spec_keep / spec_residual; 1: keep x with probability p(x); 2: keep every draft. */
static int32_t speculate(const float *p, const float *q, int n, int rule) {
  int32_t x = draw(q, n);
  double u = unit();
  bool keep = rule == 0 ? spec_keep(p[x], q[x], u) : rule == 1 ? u < p[x] : true;
  return keep ? x : spec_residual(p, q, n, unit());
}

static void test_rule(void) {
  enum { V = 8, N = 20000 };
  const float p[V] = {0.30f, 0.20f, 0.15f, 0.12f, 0.10f, 0.08f, 0.04f, 0.01f};
  const float q[V] = {0.05f, 0.35f, 0.05f, 0.25f, 0.05f, 0.05f, 0.15f, 0.05f};
  int ref[V] = {0};
  for (int i = 0; i < N; i++) ref[draw(p, V)]++;
  static const char *const names[] = {"min(1, p/q), residual", "keep with p(x)", "keep all"};
  for (int rule = 0; rule < 3; rule++) {
    int got[V] = {0}, df;
    for (int i = 0; i < N; i++) got[speculate(p, q, V, rule)]++;
    double x = chi2(ref, got, V, &df), bound = chi2_bound(df);
    printf("rule '%s' against sampling p: chi-square %.1f on %d df (bound %.1f)\n", names[rule], x,
           df, bound);
    CHECKF(rule == 0 ? x < bound : x > bound, "rule %d: %.1f vs %.1f", rule, x, bound);
  }
  /* greedy: u = 0 keeps x exactly when p has it, and the residual is p's argmax */
  const float one[V] = {0, 0, 0, 1, 0, 0, 0, 0}, other[V] = {0, 1, 0, 0, 0, 0, 0, 0};
  CHECK(spec_keep(one[3], 1.0, 0.0) && !spec_keep(one[1], other[1], 0.0));
  CHECK(spec_residual(one, other, V, 0.0) == 3 && spec_residual(one, one, V, 0.5) == 3);
}

typedef struct multi {
  int n[4];
} multi;

static void on_multi(void *user, const irt_event *ev) {
  multi *x = user;
  if (ev->token >= 0 && ev->index >= 0 && ev->index < 4) x->n[ev->index]++;
}

/* A sampled request with n = 4 and drafts: the completions share the prompt's blocks in
 * both models (the siblings' draft KV comes from the draft's prefix cache after the first
 * catches up), each gets its tokens, and nothing stays held. */
static void test_parallel(const char *target, const char *draft) {
  irt_model *m = open_plan(target, 0), *d = open_plan(draft, 0);
  if (m && d) {
    irt_engine_opts eo = irt_engine_opts_default();
    eo.draft = d, eo.spec_tokens = 3, eo.spec_always = true;
    irt_engine *e = NULL;
    irt_error err = {0};
    CHECKF(irt_engine_create(m, &eo, &e, &err) == IRT_OK, "%s", err.msg);
    int32_t p[20];
    for (int k = 0; k < 20; k++) p[k] = (int32_t)(5 + 11 * k % 250);
    multi x = {{0}};
    irt_request q = {.prompt_ids = p,
                     .n_prompt = 20,
                     .max_tokens = 16,
                     .n = 4,
                     .ignore_eos = true,
                     .sampling = {.temperature = 0.8f, .top_p = 1.0f, .seed = 9},
                     .on_event = on_multi,
                     .user = &x};
    CHECK(e && irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    CHECK(e && irt_engine_run(e, &err) == IRT_OK);
    irt_engine_stats st = {0};
    if (e) irt_engine_get_stats(e, &st);
    irt_engine_destroy(e);
    printf("n = 4 with drafts: %d %d %d %d tokens, %lld drafts, %lld kept\n", x.n[0], x.n[1],
           x.n[2], x.n[3], (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens);
    CHECK(x.n[0] == 16 && x.n[1] == 16 && x.n[2] == 16 && x.n[3] == 16);
    CHECK(st.spec_draft_tokens > 0);
    CHECK(kv_in_use(&m->kv) == 0 && kv_in_use(&d->kv) == 0);
  }
  irt_model_close(m);
  irt_model_close(d);
}

static void test_mismatch(const char *target, const char *other_vocab) {
  infc_options o = infc_options_default();
  ir_diag dg = {0};
  char dir[512], path[512];
  snprintf(dir, sizeof dir, "%s/llama-gqa-f32", FIXTURES_DIR);
  snprintf(path, sizeof path, "%s/spec-draft-3layers.plan", TEST_TMP_DIR);
  CHECK(infc_options_set(&o, "layers", "3", &dg) == IR_OK);
  CHECK(infc_build(dir, &o, path, NULL, NULL, &dg) == IR_INVALID_ARG);
  printf("--layers past the model: %s\n", dg.msg);
  CHECK(strstr(dg.msg, "2 decoder layers") != NULL);
  irt_model *m = open_plan(target, 0), *d = open_plan(other_vocab, 0);
  if (m && d) {
    irt_engine_opts eo = irt_engine_opts_default();
    eo.draft = d, eo.spec_tokens = 4;
    irt_engine *e = NULL;
    irt_error err = {0};
    CHECK(irt_engine_create(m, &eo, &e, &err) == IRT_INVALID_ARG && !e);
    printf("a draft with another vocabulary: %s\n", err.msg);
    CHECK(strstr(err.msg, "vocabulary") != NULL);
  }
  irt_model_close(m);
  irt_model_close(d);
}

int main(void) {
  const char *gqa = build("llama-gqa-f32", NULL, "gqa");
  const char *gqa_q8 = build("llama-gqa-f32", "q8_0", "gqa-q8");
  const char *mha = build("llama-mha-f16", NULL, "mha");
  const char *rope = build("llama3-rope-f32", NULL, "rope");
  const char *gqa_q4 = build("llama-gqa-f32", "q4_0", "gqa-q4");
  test_rule();
  if (!gqa || !gqa_q8 || !gqa_q4 || !mha || !rope) return tcheck_done("spec_draft");
  test_greedy(gqa, gqa_q8, rope, mha);
  test_distribution(mha, rope, "a foreign draft", false);
  test_distribution(gqa, gqa_q4, "the target's q4_0 build as draft", true);
  test_parallel(gqa, gqa_q4);
  test_mismatch(gqa, mha);
  return tcheck_done("spec_draft");
}
