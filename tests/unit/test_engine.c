/* test_engine: continuous batching, chunked prefill, prefix caching, parallel sampling,
 * preemption and cancellation, checked against single-sequence runs of the same model.
 * Because CPU kernels are batch-invariant, a request's tokens and log-probabilities must
 * be bit-identical however it was batched, chunked, cached or preempted.
 * `test_engine --kv-dtype int8` runs every check again over the int8 KV cache; `--quant q8_0
 * --act-dtype bf16` the invariance checks over block weights with bf16 activations (W tiles
 * converted to bf16 once a step, kn_matmul_bf16q). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h" /* sampler_top_logprobs */
#include "engine.h"  /* the speculative cost model */
#include "infc_build.h"
#include "inferrt.h"
#include "tcheck.h"

#define MAX_OUT 48
#define MAX_REQ 16

typedef struct result {
  int32_t tokens[4][MAX_OUT];
  float logprobs[4][MAX_OUT];
  int n[4];
  irt_finish finish[4];
  int done_events;
  int64_t cached;
  int order;       /* when the request finished, across requests */
  int n_prompt_ev; /* prompt_logprobs events, and their tokens */
  int32_t prompt_tok[64];
} result;

static int g_finish_counter;
static irt_kv_dtype g_kv_dtype; /* --kv-dtype */
/* --fixture: the model (llama-gqa-f32, vocab 300; a Gemma fixture, vocab 256, checks the
 * sliding-window layers for batch invariance), and its prompts' token range */
static const char *g_fixture = "llama-gqa-f32";
static const char *g_quant = "none", *g_act = "auto"; /* --quant, --act-dtype (infc's) */
static int g_vocab = 300;

static void on_event(void *user, const irt_event *ev) {
  result *r = user;
  int i = ev->index;
  if (ev->prompt) {
    if (r->n_prompt_ev < 64) r->prompt_tok[r->n_prompt_ev] = ev->token;
    r->n_prompt_ev++;
    return;
  }
  if (ev->token >= 0 && r->n[i] < MAX_OUT) {
    r->tokens[i][r->n[i]] = ev->token;
    r->logprobs[i][r->n[i]++] = ev->logprob;
  }
  if (ev->finish) r->finish[i] = ev->finish;
  r->cached = ev->cached_tokens;
  if (ev->request_done) {
    r->done_events++;
    r->order = ++g_finish_counter;
  }
}

static const char *build_plan(void) {
  /* one plan per dtype: both runs may go at once under ctest -j */
  static char path[512];
  snprintf(path, sizeof path, "%s/engine-%s-%s-%s-%s.plan", TEST_TMP_DIR, g_fixture,
           irt_kv_dtype_name(g_kv_dtype), g_quant, g_act);
  infc_options o = infc_options_default();
  o.model.max_tokens = 48;
  o.model.max_seqs = 8;
  o.model.max_logits = 8;
  o.model.kv_block_size = 4;
  ir_diag d = {0};
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", FIXTURES_DIR, g_fixture);
  infc_build_report rep = {0};
  CHECKF(infc_options_set(&o, "quant", g_quant, &d) == IR_OK &&
             infc_options_set(&o, "act_dtype", g_act, &d) == IR_OK &&
             infc_build(dir, &o, path, NULL, &rep, &d) == IR_OK,
         "%s", d.msg);
  if (!strcmp(g_act, "bf16") && strcmp(g_quant, "none")) /* the path under test ran */
    CHECKF(rep.passes.act_bf16_blocks > 0, "no block matmul took bf16 activations (%d)",
           rep.passes.act_bf16_blocks);
  return path;
}

static irt_model *open_model(const char *plan, int64_t kv_tokens) {
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = 2;
  mo.kv_tokens = kv_tokens;
  mo.kv_dtype = g_kv_dtype;
  irt_model *m = NULL;
  irt_error err = {0};
  CHECKF(irt_model_open(plan, &mo, &m, &err) == IRT_OK, "%s", err.msg);
  return m;
}

/* Deterministic prompts: lengths 3..30, some sharing a 16-token prefix. */
static int make_prompt(int i, int32_t *out) {
  int len = 3 + (i * 7) % 28;
  for (int k = 0; k < len; k++)
    out[k] = (i % 3 == 0 && k < 16) ? (k * 11 + 5) % g_vocab : (i * 31 + k * 17 + 1) % g_vocab;
  return len;
}

static irt_request make_request(int i, const int32_t *prompt, int len, result *r) {
  irt_request q = {.prompt_ids = prompt,
                   .n_prompt = (size_t)len,
                   .max_tokens = 8 + i % 9,
                   .ignore_eos = true,
                   .n = 1,
                   .on_event = on_event,
                   .user = r};
  q.sampling =
      (irt_sampling){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 100 + (uint64_t)i};
  if (i % 4 == 1) q.sampling = irt_sampling_default();
  if (i >= 8) { /* a negative frequency penalty makes the output repeat itself: drafts hit */
    q.max_tokens = 40;
    q.frequency_penalty = -2.0f;
    q.presence_penalty = i % 3 ? 0.0f : 0.5f;
  }
  return q;
}

/* Each request alone through its own fresh engine: the reference. */
static void run_solo(irt_model *m, int n_req, result *ref) {
  for (int i = 0; i < n_req; i++) {
    irt_engine_opts eo = irt_engine_opts_default();
    eo.disable_prefix_cache = true;
    irt_engine *e = NULL;
    irt_error err = {0};
    CHECK(irt_engine_create(m, &eo, &e, &err) == IRT_OK);
    int32_t p[64];
    int len = make_prompt(i, p);
    irt_request q = make_request(i, p, len, &ref[i]);
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    CHECK(irt_engine_run(e, &err) == IRT_OK);
    irt_engine_destroy(e);
  }
}

static bool same(const result *a, const result *b, int completions) {
  for (int c = 0; c < completions; c++)
    if (a->n[c] != b->n[c] ||
        memcmp(a->tokens[c], b->tokens[c], sizeof(int32_t) * (size_t)a->n[c]) ||
        memcmp(a->logprobs[c], b->logprobs[c], sizeof(float) * (size_t)a->n[c]) ||
        a->finish[c] != b->finish[c])
      return false;
  return true;
}

/* The requests of run_solo through one engine with options eo, arriving staggered; each
 * must be bit-identical to its solo run. *out gets the engine's final stats. */
static void run_continuous(irt_model *m, const result *ref, int n_req, const irt_engine_opts *eo,
                           irt_engine_stats *out) {
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECKF(irt_engine_create(m, eo, &e, &err) == IRT_OK, "%s", err.msg);
  if (!e) return;
  static result got[MAX_REQ];
  memset(got, 0, sizeof got);
  int32_t prompts[MAX_REQ][64];
  for (int i = 0; i < n_req; i++) {
    int len = make_prompt(i, prompts[i]);
    irt_request q = make_request(i, prompts[i], len, &got[i]);
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    if (i % 3 == 2) /* staggered arrivals: join a running batch */
      for (int s = 0; s < 3; s++) {
        bool busy;
        CHECK(irt_engine_step(e, &busy, &err) == IRT_OK);
      }
  }
  CHECK(irt_engine_run(e, &err) == IRT_OK);
  for (int i = 0; i < n_req; i++) {
    CHECKF(same(&got[i], &ref[i], 1), "request %d differs from its solo run", i);
    CHECK(got[i].done_events == 1);
  }
  irt_engine_get_stats(e, out);
  CHECKF(out->kv_blocks_used == 0, "%lld blocks still held", (long long)out->kv_blocks_used);
  CHECK(out->requests_finished == n_req && out->running == 0);
  irt_engine_destroy(e);
}

/* A second turn: request B's prompt is request A's prompt and answer. Through the engine
 * that just ran A (its prefix cache holding A's blocks, the answer's among them) B must
 * give the bits of B alone without a cache: with row kinds (--act-dtype bf16 over block
 * weights) the answer's blocks were made by generated rows' kernels and B computes them as
 * prompt rows, so the cache must not offer them (kv_role_tenant). */
static void test_second_turn(irt_model *m) {
  int32_t p[64];
  int len = make_prompt(5, p);
  result a = {0}, b = {0}, b_ref = {0};
  irt_engine_opts eo = irt_engine_opts_default();
  irt_engine *e = NULL, *e2 = NULL;
  irt_error err = {0};
  CHECK(irt_engine_create(m, &eo, &e, &err) == IRT_OK);
  irt_request q = make_request(1, p, len, &a); /* greedy */
  q.max_tokens = 13;
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK && irt_engine_run(e, &err) == IRT_OK);
  CHECK(a.n[0] == 13);
  memcpy(p + len, a.tokens[0], (size_t)a.n[0] * sizeof *p);
  irt_request q2 = make_request(1, p, len + a.n[0], &b);
  CHECK(irt_engine_submit(e, &q2, NULL, &err) == IRT_OK && irt_engine_run(e, &err) == IRT_OK);
  eo.disable_prefix_cache = true;
  CHECK(irt_engine_create(m, &eo, &e2, &err) == IRT_OK);
  q2.user = &b_ref;
  CHECK(irt_engine_submit(e2, &q2, NULL, &err) == IRT_OK && irt_engine_run(e2, &err) == IRT_OK);
  CHECKF(b.n[0] > 0 && same(&b, &b_ref, 1), "a second turn differs with the first one's cache");
  CHECKF(b.cached > 0, "the second turn found nothing of the first in the cache");
  irt_engine_destroy(e);
  irt_engine_destroy(e2);
}

static void test_continuous(irt_model *m, const result *ref, int n_req) {
  irt_engine_opts eo = irt_engine_opts_default();
  eo.max_batched_tokens = 16; /* forces chunked prefill mixed with decodes */
  irt_engine_stats st;
  run_continuous(m, ref, n_req, &eo, &st);
  CHECK(st.cached_prompt_tokens > 0 && st.spec_draft_tokens == 0);
}

/* The cost model drafts are weighed by (spec.c): the fit recovers a + b T from exact
 * timings and refuses too few steps or one size of step; a draft joins a step while
 * alpha^j (a + b tokens) >= b value. */
static void test_step_cost(void) {
  step_cost c = {0};
  double a = -1, b = -1;
  for (int i = 0; i < 3; i++) step_cost_add(&c, 8, 20);
  CHECK(!step_cost_fit(&c, &a, &b)); /* three steps */
  for (int i = 0; i < 50; i++) step_cost_add(&c, 8, 20);
  CHECK(!step_cost_fit(&c, &a, &b)); /* one size */
  for (int i = 0; i < 50; i++) step_cost_add(&c, 8 + i % 5, 4 + 2 * (8 + i % 5));
  CHECKF(step_cost_fit(&c, &a, &b) && fabs(a - 4) < 1e-6 && fabs(b - 2) < 1e-6, "a %g b %g", a, b);
  step_cost d = {0};
  for (int i = 0; i < 20; i++) step_cost_add(&d, 4 + i % 3, 3 * (4 + i % 3) - 2);
  CHECK(step_cost_fit(&d, &a, &b) && a == 0 && fabs(b - 3) < 1e-6); /* a < 0: 0 */
  double t = 1, v = 1, x = 0;
  /* 0.9 (4 + 2) >= 2, 0.81 (4 + 4) >= 2 x 1.9, 0.729 x 10 >= 2 x 2.71, 0.6561 x 12 >= 6.878 */
  CHECK(spec_worth(0.9, 4, 2, 0, &t, &x, &v, 4) == 4 && t == 5 && fabs(v - 4.0951) < 1e-9);
  t = 1, v = 1;
  CHECK(spec_worth(0.9, 4, 2, 0, &t, &x, &v, 2) == 2 && t == 3);
  t = 1, v = 1;
  CHECK(spec_worth(0.3, 4, 2, 0, &t, &x, &v, 4) == 0 && t == 1 && v == 1); /* 1.8 < 2 */
  t = 8, v = 8;
  CHECK(spec_worth(0.6, 4, 2, 0, &t, &x, &v, 4) == 0);  /* 0.6 x 20 < 16: a batch of 8 */
  CHECK(spec_worth(0.85, 4, 2, 0, &t, &x, &v, 4) == 1); /* 17 >= 16, then 0.7225 x 22 < 17.7 */
  t = 1, v = 1;
  CHECK(spec_worth(0.99, 0, 2, 0, &t, &x, &v, 4) == 0); /* cost in proportion: never */
}

/* Speculative decoding by prompt lookup changes no token and no logprob: greedy and
 * sampled requests, chunked and batched, give their solo runs' outputs, while drafts were
 * both kept and rejected (spec_always: the same drafts on any machine). A tight token
 * budget and few logit rows bound the drafts. Variant 3 weighs the drafts by their cost
 * (the default), which depends on this machine's timings: outputs are still the same. */
static void test_speculative(irt_model *m, const result *ref, int n_req) {
  test_step_cost();
  /* llama-gqa-f32 rejects drafts in every variant; another model's outputs may copy their
   * context in some variants wholly, so there a rejection somewhere is what is asked */
  bool each = !strcmp(g_fixture, "llama-gqa-f32");
  long long rejected = 0;
  for (int v = 0; v < 4; v++) {
    irt_engine_opts eo = irt_engine_opts_default();
    eo.max_running = v == 1 ? 3 : 0;
    eo.max_batched_tokens = v == 1 ? 12 : 0;
    irt_engine_stats plain;
    run_continuous(m, ref, n_req, &eo, &plain);
    eo.spec_tokens = v == 2 ? IRT_MAX_SPEC_TOKENS : 4;
    eo.spec_ngram_min = v == 2 ? 2 : 0;
    eo.spec_always = v < 3;
    irt_engine_stats st;
    run_continuous(m, ref, n_req, &eo, &st);
    if (v == 3) {
      printf("speculative, drafts weighed: %lld drafts, %lld kept, %lld steps (%lld without)\n",
             (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens,
             (long long)st.steps, (long long)plain.steps);
      CHECK(st.spec_accepted_tokens <= st.spec_draft_tokens);
      continue;
    }
    rejected += st.spec_draft_tokens - st.spec_accepted_tokens;
    CHECKF(st.spec_accepted_tokens > 0 && (!each || st.spec_draft_tokens > st.spec_accepted_tokens),
           "variant %d: %lld drafts, %lld kept", v, (long long)st.spec_draft_tokens,
           (long long)st.spec_accepted_tokens);
    printf("speculative variant %d: %lld drafts, %lld kept, %lld steps (%lld without)\n", v,
           (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens, (long long)st.steps,
           (long long)plain.steps);
    CHECK(st.steps < plain.steps);
  }
  CHECKF(rejected > 0, "no draft was rejected in any variant");
  /* prompt lookup itself: the longest n-gram first, its latest occurrence, capped */
  int32_t t[16] = {1, 2, 3, 5, 9, 3, 6, 2, 3, 1, 2, 3};
  CHECK(irt_prompt_lookup(t, 12, 1, 3, 2) == 2 && t[12] == 5 && t[13] == 9); /* "1 2 3" */
  CHECK(irt_prompt_lookup(t, 12, 1, 2, 4) == 3 && t[12] == 1 && t[14] == 3); /* "2 3" at 7 */
  CHECK(irt_prompt_lookup(t, 12, 1, 1, 1) == 1 && t[12] == 1);               /* "3" at 8 */
  int32_t u[8] = {4, 5, 6};
  CHECK(irt_prompt_lookup(u, 3, 0, 0, 4) == 0 && irt_prompt_lookup(u, 3, 1, 1, 0) == 0);
  irt_engine_opts bad = irt_engine_opts_default();
  irt_engine *e = NULL;
  irt_error err = {0};
  bad.spec_tokens = IRT_MAX_SPEC_TOKENS + 1;
  CHECK(irt_engine_create(m, &bad, &e, &err) == IRT_INVALID_ARG && strstr(err.msg, "speculative"));
  bad.spec_tokens = 2, bad.spec_ngram_min = 3, bad.spec_ngram_max = 2;
  CHECK(irt_engine_create(m, &bad, &e, &err) == IRT_INVALID_ARG && strstr(err.msg, "n-gram"));
}

static void run_one(irt_engine *e, const int32_t *p, int len, const char *tenant, uint64_t seed,
                    int n, result *r) {
  irt_error err = {0};
  irt_request q = {.prompt_ids = p,
                   .n_prompt = (size_t)len,
                   .max_tokens = 12,
                   .ignore_eos = true,
                   .n = n,
                   .tenant = tenant,
                   .on_event = on_event,
                   .user = r};
  q.sampling = (irt_sampling){.temperature = 1.0f, .top_p = 1.0f, .seed = seed};
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
  CHECK(irt_engine_run(e, &err) == IRT_OK);
}

static void test_prefix_and_tenants(irt_model *m) {
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECK(irt_engine_create(m, NULL, &e, &err) == IRT_OK);
  int32_t p[20];
  for (int k = 0; k < 20; k++) p[k] = (k * 13 + 7) % 300;
  result a = {0}, b = {0}, c = {0};
  run_one(e, p, 20, "alice", 9, 1, &a);
  run_one(e, p, 20, "alice", 9, 1, &b);
  run_one(e, p, 20, "bob", 9, 1, &c);
  CHECK(a.cached == 0);
  CHECKF(b.cached == 16, "same tenant reused %lld tokens, want 16", (long long)b.cached);
  CHECKF(c.cached == 0, "another tenant reused %lld cached tokens", (long long)c.cached);
  CHECK(same(&a, &b, 1) && same(&a, &c, 1));
  irt_engine_destroy(e);
}

static void test_parallel_sampling(irt_model *m) {
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECK(irt_engine_create(m, NULL, &e, &err) == IRT_OK);
  int32_t p[10];
  for (int k = 0; k < 10; k++) p[k] = (k * 29 + 3) % 300;
  result all, one[3];
  memset(&all, 0, sizeof all);
  memset(one, 0, sizeof one);
  run_one(e, p, 10, NULL, 50, 3, &all);
  CHECK(all.done_events == 1);
  irt_engine_destroy(e);
  for (int i = 0; i < 3; i++) {
    CHECK(irt_engine_create(m, NULL, &e, &err) == IRT_OK);
    run_one(e, p, 10, NULL, 50 + (uint64_t)i, 1, &one[i]);
    irt_engine_destroy(e);
    CHECKF(all.n[i] == one[i].n[0] &&
               !memcmp(all.tokens[i], one[i].tokens[0], sizeof(int32_t) * (size_t)all.n[i]),
           "completion %d differs from a solo run with seed + %d", i, i);
  }
  CHECK(memcmp(all.tokens[0], all.tokens[1], sizeof all.tokens[0]) != 0); /* they do differ */
}

/* spec: with prompt-lookup drafts, which must then live off the blocks left over. */
static void test_preemption(const char *plan, const result *ref, int n_req, int spec) {
  irt_model *m = open_model(plan, 48); /* 12 blocks of 4 tokens for 8 requests */
  if (!m) return;
  irt_engine *e = NULL;
  irt_error err = {0};
  irt_engine_opts eo = irt_engine_opts_default();
  eo.spec_tokens = spec, eo.spec_ngram_min = 1, eo.spec_always = true;
  CHECK(irt_engine_create(m, &eo, &e, &err) == IRT_OK);
  static result got[MAX_REQ];
  memset(got, 0, sizeof got);
  int32_t prompts[MAX_REQ][64];
  for (int i = 0; i < n_req; i++) {
    int len = make_prompt(i, prompts[i]);
    irt_request q = make_request(i, prompts[i], len, &got[i]);
    q.prompt_logprobs = !spec && i % 2 == 0; /* scored once each, preempted or not */
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
  }
  CHECK(irt_engine_run(e, &err) == IRT_OK);
  irt_engine_stats st;
  irt_engine_get_stats(e, &st);
  CHECKF(st.preemptions > 0, "the tiny pool caused no preemption");
  for (int i = 0; i < n_req; i++) {
    int len = make_prompt(i, prompts[i]), want = !spec && i % 2 == 0 ? len - 1 : 0;
    CHECKF(got[i].n_prompt_ev == want &&
               !memcmp(got[i].prompt_tok, prompts[i] + 1, sizeof(int32_t) * (size_t)want),
           "request %d: %d prompt events, want %d", i, got[i].n_prompt_ev, want);
  }
  CHECK(spec ? st.spec_draft_tokens > 0 : st.spec_draft_tokens == 0);
  for (int i = 0; i < n_req; i++)
    CHECKF(got[i].done_events == 1 && same(&got[i], &ref[i], 1),
           "request %d after %lld preemptions differs from its solo run", i,
           (long long)st.preemptions);
  CHECK(st.kv_blocks_used == 0);
  irt_engine_destroy(e);
  irt_model_close(m);
}

/* A request the whole KV pool cannot hold is bounded by it (finish "length") instead of
 * preempting itself forever; a prompt that leaves no room is refused. */
static void test_pool_bound(const char *plan) {
  irt_model *m = open_model(plan, 48); /* 12 blocks of 4 tokens */
  if (!m) return;
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECK(irt_engine_create(m, NULL, &e, &err) == IRT_OK);
  int32_t p[48];
  for (int k = 0; k < 48; k++) p[k] = (k * 7 + 3) % 300;
  result r = {0};
  irt_request q = {.prompt_ids = p,
                   .n_prompt = 30,
                   .max_tokens = 40,
                   .ignore_eos = true,
                   .sampling = irt_sampling_default(),
                   .on_event = on_event,
                   .user = &r};
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
  CHECK(irt_engine_run(e, &err) == IRT_OK);
  CHECKF(r.n[0] == 18 && r.finish[0] == IRT_FINISH_LENGTH, "%d tokens, finish %d", r.n[0],
         r.finish[0]);
  q.n_prompt = 48;
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_INVALID_ARG && strstr(err.msg, "KV cache"));
  irt_engine_destroy(e);
  irt_model_close(m);
}

static void test_cancel(irt_model *m) {
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECK(irt_engine_create(m, NULL, &e, &err) == IRT_OK);
  int32_t p[5] = {1, 2, 3, 4, 5};
  result r = {0};
  irt_request q = {.prompt_ids = p,
                   .n_prompt = 5,
                   .max_tokens = 40,
                   .ignore_eos = true,
                   .n = 2,
                   .on_event = on_event,
                   .user = &r,
                   .sampling = irt_sampling_default()};
  irt_request_id id = 0;
  CHECK(irt_engine_submit(e, &q, &id, &err) == IRT_OK);
  bool busy;
  for (int s = 0; s < 4; s++) CHECK(irt_engine_step(e, &busy, &err) == IRT_OK);
  irt_engine_cancel(e, id);
  CHECK(irt_engine_run(e, &err) == IRT_OK);
  CHECK(r.finish[0] == IRT_FINISH_CANCELLED && r.finish[1] == IRT_FINISH_CANCELLED);
  CHECK(r.done_events == 1 && r.n[0] > 0 && r.n[0] < 40);
  irt_engine_stats st;
  irt_engine_get_stats(e, &st);
  CHECK(st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0);
  /* Cancelling an unknown or finished id is harmless. */
  irt_engine_cancel(e, id);
  irt_engine_cancel(e, 999999);
  CHECK(irt_engine_run(e, &err) == IRT_OK);
  irt_engine_destroy(e);
}

static void test_priority_and_limits(irt_model *m) {
  irt_engine_opts eo = irt_engine_opts_default();
  eo.max_running = 1;
  eo.max_waiting = 3;
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECK(irt_engine_create(m, &eo, &e, &err) == IRT_OK);
  int32_t p[4] = {7, 8, 9, 10};
  result low1 = {0}, low2 = {0}, high = {0}, extra = {0};
  irt_request q = {.prompt_ids = p,
                   .n_prompt = 4,
                   .max_tokens = 6,
                   .ignore_eos = true,
                   .sampling = irt_sampling_default(),
                   .on_event = on_event};
  q.user = &low1;
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
  q.user = &low2;
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
  q.user = &high;
  q.priority = 5;
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
  q.user = &extra;
  CHECKF(irt_engine_submit(e, &q, NULL, &err) == IRT_BUSY, "a full queue must say busy");
  CHECK(irt_engine_run(e, &err) == IRT_OK);
  CHECKF(high.order < low1.order && high.order < low2.order,
         "high priority finished %d, low ones %d and %d", high.order, low1.order, low2.order);
  /* Bad requests are refused with a reason and change nothing. */
  int32_t bad[2] = {1, 300};
  q.prompt_ids = bad;
  q.n_prompt = 2;
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_INVALID_ARG && strstr(err.msg, "vocabulary"));
  q.n_prompt = 0;
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_INVALID_ARG);
  q.prompt_ids = p;
  q.n_prompt = 4;
  q.n = 5;
  CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_INVALID_ARG);
  irt_engine_destroy(e);
}

typedef struct top_result {
  int32_t tokens[MAX_OUT];
  float logprobs[MAX_OUT];
  int32_t top[MAX_OUT][5];
  float top_lp[MAX_OUT][5];
  int n_top[MAX_OUT];
  int n;
  irt_finish finish;
} top_result;

static void on_top_event(void *user, const irt_event *ev) {
  top_result *r = user;
  if (ev->finish) r->finish = ev->finish;
  if (ev->token < 0 || r->n >= MAX_OUT) return;
  r->tokens[r->n] = ev->token;
  r->logprobs[r->n] = ev->logprob;
  r->n_top[r->n] = ev->n_top;
  for (int k = 0; k < ev->n_top && k < 5; k++) {
    r->top[r->n][k] = ev->top_tokens[k];
    r->top_lp[r->n][k] = ev->top_logprobs[k];
  }
  r->n++;
}

/* Penalties and top alternatives against a hand-rolled greedy loop over irt_seq_decode:
 * the penalised argmax must match token for token, and the top-5 must be the five largest
 * raw logits as log-probabilities. */
static void test_penalties_and_top(irt_model *m) {
  enum { N_OUT = 24, P = 6 };
  const float presence = 0.7f, frequency = 1.3f;
  int32_t p[P] = {11, 12, 13, 11, 12, 13};
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = malloc((size_t)V * sizeof *lg), *pen = malloc((size_t)V * sizeof *pen);
  int32_t *counts = calloc((size_t)V, sizeof *counts), want[N_OUT];
  float want_top_lp[N_OUT][5];
  int32_t want_top[N_OUT][5];
  irt_seq *s = NULL;
  irt_error err = {0};
  CHECK(lg && pen && counts && irt_seq_create(m, &s, &err) == IRT_OK);
  CHECK(irt_seq_decode(m, s, p, P, lg, false, &err) == IRT_OK);
  for (int t = 0; t < N_OUT; t++) {
    double mx = lg[0], sum = 0;
    for (int64_t v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
    for (int64_t v = 0; v < V; v++) sum += exp((double)lg[v] - mx);
    for (int k = 0; k < 5; k++) { /* k-th largest, lower id first on ties */
      int64_t best = -1;
      for (int64_t v = 0; v < V; v++) {
        bool taken = false;
        for (int j = 0; j < k; j++) taken |= want_top[t][j] == v;
        if (!taken && (best < 0 || lg[v] > lg[best])) best = v;
      }
      want_top[t][k] = (int32_t)best;
      want_top_lp[t][k] = (float)((double)lg[best] - (mx + log(sum)));
    }
    int64_t arg = 0;
    for (int64_t v = 0; v < V; v++) {
      pen[v] = lg[v] - (counts[v] ? presence + frequency * (float)counts[v] : 0.0f);
      if (pen[v] > pen[arg]) arg = v;
    }
    want[t] = (int32_t)arg;
    counts[arg]++;
    CHECK(irt_seq_decode(m, s, &want[t], 1, lg, false, &err) == IRT_OK);
  }
  irt_seq_destroy(s);
  for (int spec = 0; spec < 2; spec++) { /* the same with prompt-lookup drafts */
    irt_engine_opts eo = irt_engine_opts_default();
    eo.spec_tokens = spec ? 3 : 0, eo.spec_always = true;
    eo.spec_ngram_min = 1; /* penalties keep the output from repeating longer n-grams */
    irt_engine *e = NULL;
    CHECK(irt_engine_create(m, &eo, &e, &err) == IRT_OK);
    static top_result got;
    memset(&got, 0, sizeof got);
    irt_request q = {.prompt_ids = p,
                     .n_prompt = P,
                     .max_tokens = N_OUT,
                     .ignore_eos = true,
                     .sampling = irt_sampling_default(),
                     .presence_penalty = presence,
                     .frequency_penalty = frequency,
                     .top_logprobs = 5,
                     .on_event = on_top_event,
                     .user = &got};
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    CHECK(irt_engine_run(e, &err) == IRT_OK);
    CHECK(got.n == N_OUT);
    int repeats = 0;
    for (int t = 0; t < got.n; t++) {
      CHECKF(got.tokens[t] == want[t], "penalised token %d: got %d, want %d", t, got.tokens[t],
             want[t]);
      CHECK(got.n_top[t] == 5);
      for (int k = 0; k < 5; k++)
        CHECKF(got.top[t][k] == want_top[t][k] &&
                   fabsf(got.top_lp[t][k] - want_top_lp[t][k]) < 1e-5f,
               "top %d at %d: got %d (%g), want %d (%g)", k, t, got.top[t][k], got.top_lp[t][k],
               want_top[t][k], want_top_lp[t][k]);
      for (int u = 0; u < t; u++) repeats += got.tokens[u] == got.tokens[t];
    }
    CHECKF(repeats < N_OUT / 2, "penalties left %d repeats", repeats);
    irt_engine_stats st;
    irt_engine_get_stats(e, &st);
    /* (over the int8 cache this output happens to repeat no token: nothing to draft) */
    CHECK(spec ? st.spec_draft_tokens > 0 || g_kv_dtype != IRT_KV_DTYPE_F32
               : st.spec_draft_tokens == 0);
    if (spec) {
      irt_engine_destroy(e);
      continue;
    }
    /* Out-of-range values are refused. */
    q.presence_penalty = 2.5f;
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_INVALID_ARG);
    q.presence_penalty = 0;
    q.top_logprobs = IRT_MAX_TOP_LOGPROBS + 1;
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_INVALID_ARG);
    irt_engine_destroy(e);
  }
  free(lg), free(pen), free(counts);
}

/* Greedy tokens of prompt p as a hand-rolled loop over irt_seq_decode sees them: the
 * argmax of the raw logits less the penalties plus the logit_bias; lp[t] gets the raw
 * log-softmax of token t, second[t] the runner-up and gap[t] how far behind it is. */
static void rep_greedy(irt_model *m, const int32_t *p, int P, float presence, float frequency,
                       float rep, const int32_t *ids, const float *bias, int nb, int n_out,
                       int32_t *want, float *lp, int32_t *second, float *gap);
static void biased_greedy(irt_model *m, const int32_t *p, int P, float presence, float frequency,
                          const int32_t *ids, const float *bias, int nb, int n_out, int32_t *want,
                          float *lp, int32_t *second, float *gap) {
  rep_greedy(m, p, P, presence, frequency, 1.0f, ids, bias, nb, n_out, want, lp, second, gap);
}

/* ... and with HF's repetition penalty: a token of the prompt or of the output so far goes
 * from x (its logit plus its bias) to x / rep where x > 0, x * rep otherwise, before the
 * presence and frequency penalties (vLLM's order). */
static void rep_greedy(irt_model *m, const int32_t *p, int P, float presence, float frequency,
                       float rep, const int32_t *ids, const float *bias, int nb, int n_out,
                       int32_t *want, float *lp, int32_t *second, float *gap) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = malloc((size_t)V * sizeof *lg);
  int32_t *counts = calloc((size_t)V, sizeof *counts);
  uint8_t *ctx = calloc((size_t)V, 1);
  for (int i = 0; ctx && i < P; i++) ctx[p[i]] = 1;
  irt_seq *s = NULL;
  irt_error err = {0};
  CHECK(lg && counts && irt_seq_create(m, &s, &err) == IRT_OK);
  CHECK(irt_seq_decode(m, s, p, P, lg, false, &err) == IRT_OK);
  for (int t = 0; t < n_out; t++) {
    int64_t arg = -1, run = -1;
    double best = -INFINITY, next = -INFINITY, mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; v++) {
      double x = lg[v];
      for (int j = 0; j < nb; j++) x += ids[j] == v ? bias[j] : 0.0f;
      if (ctx[v] && rep != 1.0f) x = x > 0 ? x / rep : x * rep;
      x -= counts[v] ? presence + frequency * (float)counts[v] : 0.0f;
      if (x > best) next = best, run = arg, best = x, arg = v;
      else if (x > next) next = x, run = v;
      mx = lg[v] > mx ? lg[v] : mx;
    }
    for (int64_t v = 0; v < V; v++) sum += exp((double)lg[v] - mx);
    want[t] = (int32_t)arg;
    second[t] = (int32_t)run, gap[t] = (float)(best - next);
    lp[t] = (float)((double)lg[arg] - mx - log(sum));
    counts[arg]++;
    ctx[arg] = 1;
    CHECK(irt_seq_decode(m, s, &want[t], 1, lg, false, &err) == IRT_OK);
  }
  irt_seq_destroy(s);
  free(lg), free(counts), free(ctx);
}

/* An engine drafting up to spec tokens by 1-gram lookup (spec_always), or none. */
static irt_engine *drafting_engine(irt_model *m, int spec) {
  irt_engine_opts eo = irt_engine_opts_default();
  eo.spec_tokens = spec, eo.spec_ngram_min = 1, eo.spec_always = true;
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECKF(irt_engine_create(m, &eo, &e, &err) == IRT_OK, "%s", err.msg);
  return e;
}

/* vLLM's repetition_penalty, min_tokens and stop_token_ids. repetition_penalty against
 * rep_greedy (alone, and with penalties and a bias; with and without drafts); min_tokens
 * holds off an end-of-generation token that logit_bias forces; a stop token id ends the
 * completion where plain greedy output first has it. Bad values are refused. */
static void test_vllm_sampling(irt_model *m) {
  enum { N_OUT = 40, P = 6 };
  int32_t p[P] = {21, 22, 23, 21, 22, 23}, plain[N_OUT], want[N_OUT], second[N_OUT];
  float lp[N_OUT], gap[N_OUT];
  const irt_model_info *in = irt_model_get_info(m);
  rep_greedy(m, p, P, 0, 0, 1.0f, NULL, NULL, 0, N_OUT, plain, lp, second, gap);
  irt_error err = {0};
  for (int v = 0; v < 6; v++) {
    bool more = v & 1;
    int spec = v < 2 ? 0 : v < 4 ? 3 : 1;
    float rep = v < 4 ? 1.3f : 0.8f, presence = more ? 0.4f : 0, frequency = more ? 0.3f : 0;
    int32_t bid[2] = {plain[1], plain[3]};
    float bias[2] = {1.5f, -0.5f};
    rep_greedy(m, p, P, presence, frequency, rep, bid, bias, more ? 2 : 0, N_OUT, want, lp, second,
               gap);
    irt_engine *e = drafting_engine(m, spec);
    static top_result got;
    memset(&got, 0, sizeof got);
    irt_request q = {.prompt_ids = p,
                     .n_prompt = P,
                     .max_tokens = N_OUT,
                     .ignore_eos = true,
                     .sampling = irt_sampling_default(),
                     .presence_penalty = presence,
                     .frequency_penalty = frequency,
                     .repetition_penalty = rep,
                     .on_event = on_top_event,
                     .user = &got,
                     .logit_bias_ids = bid,
                     .logit_bias = bias,
                     .n_logit_bias = more ? 2 : 0};
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    CHECK(irt_engine_run(e, &err) == IRT_OK);
    int diff = 0, wrong = 0;
    for (int t = 0; t < N_OUT; t++) {
      wrong += got.tokens[t] != want[t] || fabsf(got.logprobs[t] - lp[t]) > 1e-5f;
      diff += want[t] != plain[t];
    }
    CHECKF(got.n == N_OUT && wrong == 0 && diff > 0,
           "repetition_penalty %g variant %d: %d of %d tokens wrong, %d differ from plain", rep, v,
           wrong, got.n, diff);
    irt_engine_destroy(e);
  }
  /* min_tokens against an end-of-generation token forced by logit_bias */
  int32_t eos = (int32_t)in->eos_token_id;
  float plus = 100.0f;
  CHECK(eos >= 0);
  for (int spec = 0; spec < 2 && eos >= 0; spec++)
    for (int64_t min = 0; min <= 7; min += 7) {
      irt_engine *e = drafting_engine(m, spec ? 4 : 0);
      static top_result got;
      memset(&got, 0, sizeof got);
      irt_request q = {.prompt_ids = p,
                       .n_prompt = P,
                       .max_tokens = N_OUT,
                       .min_tokens = min,
                       .sampling = irt_sampling_default(),
                       .on_event = on_top_event,
                       .user = &got,
                       .logit_bias_ids = &eos,
                       .logit_bias = &plus,
                       .n_logit_bias = 1};
      CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
      CHECK(irt_engine_run(e, &err) == IRT_OK);
      int early = 0;
      for (int t = 0; t + 1 < got.n; t++) early += got.tokens[t] == eos;
      CHECKF(got.n == min + 1 && got.tokens[got.n - 1] == eos && !early &&
                 got.finish == IRT_FINISH_STOP,
             "min_tokens %lld: %d tokens, finish %d", (long long)min, got.n, got.finish);
      irt_engine_destroy(e);
    }
  /* a stop token id: plain greedy output up to its first occurrence */
  int32_t stop = plain[9];
  int first = 0;
  while (plain[first] != stop) first++;
  for (int spec = 0; spec < 2; spec++) {
    irt_engine *e = drafting_engine(m, spec ? 4 : 0);
    static top_result got;
    memset(&got, 0, sizeof got);
    irt_request q = {.prompt_ids = p,
                     .n_prompt = P,
                     .max_tokens = N_OUT,
                     .ignore_eos = true,
                     .sampling = irt_sampling_default(),
                     .on_event = on_top_event,
                     .user = &got,
                     .stop_token_ids = &stop,
                     .n_stop_token_ids = 1};
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    CHECK(irt_engine_run(e, &err) == IRT_OK);
    CHECKF(got.n == first + 1 && !memcmp(got.tokens, plain, (size_t)got.n * sizeof *plain) &&
               got.finish == IRT_FINISH_STOP,
           "stop_token_ids: %d tokens, want %d", got.n, first + 1);
    /* with min_tokens past it, the stop id is banned until then */
    memset(&got, 0, sizeof got);
    q.min_tokens = first + 2;
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    CHECK(irt_engine_run(e, &err) == IRT_OK);
    int early = 0;
    for (int t = 0; t < first + 2 && t < got.n; t++) early += got.tokens[t] == stop;
    CHECKF(got.n > first + 2 && !early, "stop id under min_tokens: %d tokens, %d early", got.n,
           early);
    if (spec == 0) { /* refusals */
      irt_request b = q;
      b.min_tokens = 0;
      int32_t bad = (int32_t)in->vocab_size;
      b.stop_token_ids = &bad;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG && strstr(err.msg, "vocab"));
      b = q, b.min_tokens = N_OUT + 1;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG &&
            strstr(err.msg, "min_tokens"));
      b = q, b.min_tokens = 0, b.repetition_penalty = 2.5f;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG);
      b.repetition_penalty = -1.0f;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG);
      b.repetition_penalty = NAN;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG);
    }
    irt_engine_destroy(e);
  }
}

/* logit_bias (OpenAI's) against biased_greedy: alone and with penalties, with and without
 * drafts (whose rows take the bias as picks in the step): token for token, the banned
 * token never, logprobs those of the raw logits. Bad biases are refused. */
static void test_logit_bias(irt_model *m) {
  enum { N_OUT = 40, P = 6 };
  int32_t p[P] = {21, 22, 23, 21, 22, 23}, plain[N_OUT], want[N_OUT], ban_only[N_OUT];
  int32_t second[N_OUT];
  float lp[N_OUT], gap[N_OUT];
  int64_t V = irt_model_get_info(m)->vocab_size;
  biased_greedy(m, p, P, 0, 0, NULL, NULL, 0, N_OUT, plain, lp, second, gap);
  /* ban the first plain token; then push the runner-up of position 5 past the winner, and
   * give a third token a bias too small to matter */
  int32_t ids[3] = {plain[0], 0, 0};
  float bias[3] = {-100.0f, 0, 0.01f};
  biased_greedy(m, p, P, 0, 0, ids, bias, 1, N_OUT, ban_only, lp, second, gap);
  CHECK(ban_only[0] != plain[0]);
  ids[1] = second[5], bias[1] = gap[5] + 0.25f;
  ids[2] = ids[1] == (int32_t)(V / 2) ? (int32_t)(V / 3) : (int32_t)(V / 2);
  irt_error err = {0};
  for (int v = 0; v < 4; v++) {
    bool pen = v & 1, spec = v & 2;
    float presence = pen ? 0.5f : 0.0f, frequency = pen ? 0.9f : 0.0f;
    biased_greedy(m, p, P, presence, frequency, ids, bias, 3, N_OUT, want, lp, second, gap);
    irt_engine *e = drafting_engine(m, spec ? 3 : 0);
    static top_result got;
    memset(&got, 0, sizeof got);
    irt_request q = {.prompt_ids = p,
                     .n_prompt = P,
                     .max_tokens = N_OUT,
                     .ignore_eos = true,
                     .sampling = irt_sampling_default(),
                     .presence_penalty = presence,
                     .frequency_penalty = frequency,
                     .on_event = on_top_event,
                     .user = &got,
                     .logit_bias_ids = ids,
                     .logit_bias = bias,
                     .n_logit_bias = 3};
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    CHECK(irt_engine_run(e, &err) == IRT_OK);
    CHECK(got.n == N_OUT);
    int diff = 0;
    for (int t = 0; t < got.n; t++) {
      CHECKF(got.tokens[t] == want[t] && fabsf(got.logprobs[t] - lp[t]) < 1e-5f,
             "logit_bias variant %d token %d: got %d (%g), want %d (%g)", v, t, got.tokens[t],
             got.logprobs[t], want[t], lp[t]);
      CHECK(got.tokens[t] != plain[0]);
      diff += got.tokens[t] != plain[t];
    }
    int pushed = 0; /* tokens the positive biases chose (the ban alone would not) */
    for (int t = 0; t < got.n; t++) pushed += got.tokens[t] == ids[1] || got.tokens[t] == ids[2];
    CHECKF(diff > 0 && (pen || (memcmp(want, ban_only, sizeof want) && pushed < N_OUT)),
           "variant %d: the biases change too little or too much (%d pushed)", v, pushed);
    irt_engine_stats st;
    irt_engine_get_stats(e, &st);
    CHECK(!spec || st.spec_draft_tokens > 0);
    printf("logit_bias variant %d: %d of %d tokens differ from plain, %d pushed, %lld drafts\n", v,
           diff, N_OUT, pushed, (long long)st.spec_draft_tokens);
    if (v == 0) { /* refusals */
      int32_t bad_ids[2] = {5, 5};
      float bad[2] = {1.0f, 1.0f};
      irt_request b = q;
      b.logit_bias_ids = bad_ids, b.logit_bias = bad, b.n_logit_bias = 2; /* twice */
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG && strstr(err.msg, "twice"));
      bad_ids[1] = (int32_t)V;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG && strstr(err.msg, "vocab"));
      bad_ids[1] = -1;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG);
      bad_ids[1] = 6, bad[1] = 100.5f;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG && strstr(err.msg, "100"));
      bad[1] = NAN;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG);
      b.n_logit_bias = IRT_MAX_LOGIT_BIAS + 1;
      CHECK(irt_engine_submit(e, &b, NULL, &err) == IRT_INVALID_ARG);
    }
    irt_engine_destroy(e);
  }
  /* +100 forces a token at every position, drafted rows (picks in the step) included */
  for (int spec = 0; spec < 2; spec++) {
    irt_engine *e = drafting_engine(m, spec ? 4 : 0);
    static top_result got;
    memset(&got, 0, sizeof got);
    int32_t forced = ids[2];
    float plus = 100.0f;
    irt_request q = {.prompt_ids = p,
                     .n_prompt = P,
                     .max_tokens = N_OUT,
                     .ignore_eos = true,
                     .sampling = irt_sampling_default(),
                     .on_event = on_top_event,
                     .user = &got,
                     .logit_bias_ids = &forced,
                     .logit_bias = &plus,
                     .n_logit_bias = 1};
    CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    CHECK(irt_engine_run(e, &err) == IRT_OK);
    int n_forced = 0;
    for (int t = 0; t < got.n; t++) n_forced += got.tokens[t] == forced;
    irt_engine_stats st;
    irt_engine_get_stats(e, &st);
    CHECKF(got.n == N_OUT && n_forced == N_OUT && (!spec || st.spec_accepted_tokens > 0),
           "forced token: %d of %d, %lld drafts kept", n_forced, got.n,
           (long long)st.spec_accepted_tokens);
    irt_engine_destroy(e);
  }
}

/* irt_batch_item.pick on the CPU backend: the sampler's token on the row less the
 * penalties, the logprob and alternatives of the row itself; bad picks are refused. */
static void test_picks(irt_model *m) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  int32_t p[6] = {5, 9, 2, 7, 1, 3}, ids[3], pen_ids[2];
  float *lg = malloc((size_t)V * sizeof *lg), *w = malloc((size_t)V * sizeof *w), lps[3];
  const float pen_sub[2] = {3.0f, 1.5f};
  irt_seq *a = NULL, *b = NULL;
  irt_sampler *host = NULL, *dev = NULL;
  irt_error err = {0};
  irt_sampling sp = {.temperature = 0.0f, .top_p = 1.0f};
  CHECK(irt_seq_create(m, &a, &err) == IRT_OK && irt_seq_create(m, &b, &err) == IRT_OK);
  CHECK(irt_sampler_create(&sp, V, &host, &err) == IRT_OK);
  CHECK(irt_sampler_create(&sp, V, &dev, &err) == IRT_OK);
  CHECK(irt_seq_decode(m, a, p, 6, lg, false, &err) == IRT_OK);
  CHECK(irt_seq_decode(m, b, p, 5, NULL, false, &err) == IRT_OK);
  /* penalties on the two best ids: greedy then takes the third */
  int32_t top2[2];
  float l2[2];
  sampler_top_logprobs(lg, V, 0.0, 2, top2, l2);
  pen_ids[0] = top2[0], pen_ids[1] = top2[1];
  irt_pick pk = {.sampler = dev,
                 .n_top = 3,
                 .top_ids = ids,
                 .top_logprobs = lps,
                 .pen_ids = pen_ids,
                 .pen_sub = pen_sub,
                 .n_pen = 2};
  irt_batch_item it = {.seq = b, .tokens = &p[5], .n = 1, .pick = &pk};
  CHECKF(irt_decode_batch(m, &it, 1, &err) == IRT_OK, "%s", err.msg);
  memcpy(w, lg, (size_t)V * sizeof *w);
  w[pen_ids[0]] -= pen_sub[0], w[pen_ids[1]] -= pen_sub[1];
  double lse = 0, mx = lg[0];
  for (int64_t v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
  for (int64_t v = 0; v < V; v++) lse += exp((double)lg[v] - mx);
  lse = mx + log(lse);
  int32_t want = irt_sampler_sample(host, w);
  CHECKF(pk.token == want && want != top2[0], "pick %d, want %d", pk.token, want);
  CHECK(fabs(pk.logprob - ((double)lg[want] - lse)) < 1e-5);
  CHECK(ids[0] == top2[0] && ids[1] == top2[1]);
  CHECK(fabs(lps[0] - ((double)lg[top2[0]] - lse)) < 1e-5);
  /* refused: a penalty outside the vocabulary, logits and a pick at once */
  pen_ids[1] = (int32_t)V;
  CHECK(irt_decode_batch(m, &it, 1, &err) == IRT_INVALID_ARG &&
        strstr(err.msg, "outside the vocabulary"));
  it.pick = &pk, pk.n_pen = 0, it.logits = lg;
  CHECK(irt_decode_batch(m, &it, 1, &err) == IRT_INVALID_ARG && strstr(err.msg, "a pick needs"));
  it.logits = NULL, pk.draw = -1;
  CHECK(irt_decode_batch(m, &it, 1, &err) == IRT_INVALID_ARG && strstr(err.msg, "a pick needs"));
  int64_t L = irt_model_get_info(m)->max_step_logits;
  irt_pick *many = calloc((size_t)L + 1, sizeof *many);
  for (int64_t j = 0; j <= L; j++) many[j] = (irt_pick){.sampler = dev};
  it.pick = many, it.n_picks = (int)L + 1;
  CHECK(irt_decode_batch(m, &it, 1, &err) == IRT_INVALID_ARG && strstr(err.msg, "picks; the plan"));
  free(many);
  irt_sampler_destroy(host), irt_sampler_destroy(dev);
  irt_seq_destroy(a), irt_seq_destroy(b);
  free(lg), free(w);
}

/* One pick per row of a 4-token item, pick j taking draw j ahead (irt_pick.draw = j + 1):
 * each is the token a sampler that sampled j times before would take from that row, and the
 * generator does not move; n_picks picks of one row each take their own sampler's draw. */
static void test_row_picks(irt_model *m) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  int32_t p[7] = {5, 9, 2, 7, 1, 3, 8};
  float *lg = malloc((size_t)(4 * V) * sizeof *lg);
  irt_seq *a = NULL, *b = NULL;
  irt_sampler *s = NULL, *ref = NULL, *t[3] = {NULL};
  irt_error err = {0};
  irt_sampling sp = {.temperature = 1.5f, .top_p = 1.0f, .seed = 42};
  CHECK(irt_seq_create(m, &a, &err) == IRT_OK && irt_seq_create(m, &b, &err) == IRT_OK);
  CHECK(irt_sampler_create(&sp, V, &s, &err) == IRT_OK);
  CHECK(irt_sampler_create(&sp, V, &ref, &err) == IRT_OK);
  CHECK(irt_seq_decode(m, a, p, 3, NULL, false, &err) == IRT_OK);
  CHECK(irt_seq_decode(m, a, p + 3, 4, lg, true, &err) == IRT_OK); /* the rows, to the host */
  CHECK(irt_seq_decode(m, b, p, 3, NULL, false, &err) == IRT_OK);
  irt_pick pk[4];
  for (int j = 0; j < 4; j++) pk[j] = (irt_pick){.sampler = s, .draw = j + 1};
  irt_batch_item it = {.seq = b, .tokens = p + 3, .n = 4, .all_logits = true, .pick = pk};
  CHECKF(irt_decode_batch(m, &it, 1, &err) == IRT_OK, "%s", err.msg);
  int ok = 1;
  for (int j = 0; j < 4; j++) ok &= pk[j].token == irt_sampler_sample(ref, lg + j * V);
  CHECK(ok);
  irt_sampler_skip(ref, -4); /* nothing: n < 0 */
  irt_sampler_destroy(ref);
  CHECK(irt_sampler_create(&sp, V, &ref, &err) == IRT_OK);
  CHECK(irt_sampler_sample(s, lg) == irt_sampler_sample(ref, lg)); /* s did not move */
  /* three completions of one row, seeds 42, 43, 44 */
  irt_pick fk[3];
  for (int i = 0; i < 3; i++) {
    irt_sampling si = sp;
    si.seed = sp.seed + (uint64_t)i;
    CHECK(irt_sampler_create(&si, V, &t[i], &err) == IRT_OK);
    fk[i] = (irt_pick){.sampler = t[i]};
  }
  irt_seq_truncate(b, 6);
  irt_batch_item f = {.seq = b, .tokens = p + 6, .n = 1, .pick = fk, .n_picks = 3};
  CHECKF(irt_decode_batch(m, &f, 1, &err) == IRT_OK, "%s", err.msg);
  ok = 1;
  for (int i = 0; i < 3; i++) {
    irt_sampling si = sp;
    si.seed = sp.seed + (uint64_t)i;
    irt_sampler *r = NULL;
    CHECK(irt_sampler_create(&si, V, &r, &err) == IRT_OK);
    ok &= fk[i].token == irt_sampler_sample(r, lg + 3 * V);
    irt_sampler_destroy(r), irt_sampler_destroy(t[i]);
  }
  CHECK(ok);
  irt_sampler_destroy(s), irt_sampler_destroy(ref);
  irt_seq_destroy(a), irt_seq_destroy(b);
  free(lg);
}

/* --- prompt logprobs ----------------------------------------------------------------------- */

typedef struct scored { /* (its own record of prompt events, with their logprobs) */
  int32_t tok[64];
  float lp[64];
  int32_t top[64];
  int n_prompt_ev, n_gen_before; /* prompt events; generated tokens seen before one */
  result gen;
} scored;

static void on_scored(void *user, const irt_event *ev) {
  scored *r = user;
  if (!ev->prompt) return on_event(&r->gen, ev);
  r->n_gen_before += r->gen.n[0] + r->gen.n[1];
  if (r->n_prompt_ev < 64) {
    r->tok[r->n_prompt_ev] = ev->token;
    r->lp[r->n_prompt_ev] = ev->logprob;
    r->top[r->n_prompt_ev] = ev->n_top > 0 ? ev->top_tokens[0] : -1;
  }
  r->n_prompt_ev++;
}

/* Every prompt token after the first is scored once, in order, with the log-softmax of
 * the row before it (recomputed here in double from one whole-prompt pass), before any
 * generated token; chunks are cut to the plan's 8 logit rows, prefix-cache hits are not
 * taken, and the generated tokens stay those of the same request unscored. */
static void test_prompt_logprobs(irt_model *m) {
  enum { NQ = 6 };
  const irt_model_info *in = irt_model_get_info(m);
  int64_t V = in->vocab_size;
  float *lg = malloc((size_t)(64 * V) * sizeof *lg);
  static scored got[NQ], plain[NQ];
  memset(got, 0, sizeof got);
  memset(plain, 0, sizeof plain);
  int32_t prompts[NQ][64];
  int lens[NQ];
  for (int pass = 0; pass < 2; pass++) {
    irt_engine *e = NULL;
    irt_error err = {0};
    CHECK(irt_engine_create(m, NULL, &e, &err) == IRT_OK);
    for (int i = 0; i < NQ && e; i++) {
      lens[i] = make_prompt(i * 3, prompts[i]); /* i * 3: prompts sharing a prefix */
      irt_request q = {.prompt_ids = prompts[i],
                       .n_prompt = (size_t)lens[i],
                       .max_tokens = 5,
                       .ignore_eos = true,
                       .n = 1 + i % 2,
                       .top_logprobs = 2,
                       .on_event = on_scored,
                       .user = pass ? &got[i] : &plain[i],
                       .prompt_logprobs = pass == 1};
      q.sampling = (irt_sampling){.temperature = 0.7f, .top_p = 1, .seed = 9};
      CHECK(irt_engine_submit(e, &q, NULL, &err) == IRT_OK);
    }
    CHECKF(e && irt_engine_run(e, &err) == IRT_OK, "pass %d: %s", pass, err.msg);
    irt_engine_destroy(e);
  }
  for (int i = 0; i < NQ && lg; i++) {
    irt_seq *sq = NULL;
    irt_error err = {0};
    CHECK(irt_seq_create(m, &sq, &err) == IRT_OK);
    CHECK(irt_seq_decode(m, sq, prompts[i], lens[i], lg, true, &err) == IRT_OK);
    irt_seq_destroy(sq);
    int bad = 0;
    for (int p = 1; p < lens[i]; p++) {
      const float *row = lg + (size_t)(p - 1) * V;
      double mx = row[0], sum = 0;
      int32_t arg = 0;
      for (int64_t v = 0; v < V; v++)
        if (row[v] > mx) mx = row[v], arg = (int32_t)v;
      for (int64_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
      double want = row[prompts[i][p]] - mx - log(sum);
      bad += got[i].tok[p - 1] != prompts[i][p] || fabs(got[i].lp[p - 1] - want) > 1e-4 ||
             got[i].top[p - 1] != arg;
    }
    CHECKF(got[i].n_prompt_ev == lens[i] - 1 && bad == 0,
           "request %d: %d prompt events for %d tokens, %d wrong", i, got[i].n_prompt_ev, lens[i],
           bad);
    CHECK(got[i].n_gen_before == 0 && got[i].gen.cached == 0);
    CHECKF(same(&got[i].gen, &plain[i].gen, 1 + i % 2), "request %d: scoring changed its tokens",
           i);
    CHECK(plain[i].n_prompt_ev == 0);
  }
  free(lg);
}

int main(int argc, char **argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--kv-dtype") && irt_kv_dtype_parse(argv[i + 1], &g_kv_dtype)) continue;
    if (!strcmp(argv[i], "--fixture")) {
      g_fixture = argv[i + 1];
      continue;
    }
    if (!strcmp(argv[i], "--quant") || !strcmp(argv[i], "--act-dtype")) {
      *(argv[i][2] == 'q' ? &g_quant : &g_act) = argv[i + 1];
      continue;
    }
    return fprintf(stderr, "test_engine: bad option '%s %s'\n", argv[i], argv[i + 1]), 2;
  }
  const char *plan = build_plan();
  irt_model *m = open_model(plan, 0);
  if (!m) return tcheck_done("engine");
  CHECK(!strcmp(irt_model_get_info(m)->kv_dtype, irt_kv_dtype_name(g_kv_dtype)));
  if (irt_model_get_info(m)->vocab_size < g_vocab) g_vocab = (int)irt_model_get_info(m)->vocab_size;
  enum { N = 8, N_SPEC = 12 }; /* the last four repeat themselves (make_request) */
  static result ref[MAX_REQ];
  run_solo(m, N_SPEC, ref);
  test_continuous(m, ref, N);
  test_speculative(m, ref, N_SPEC);
  test_second_turn(m);
  if (strcmp(g_fixture, "llama-gqa-f32") || strcmp(g_quant, "none")) {
    /* another model or weights: the invariance checks alone */
    irt_model_close(m);
    test_preemption(plan, ref, N, 0);
    test_preemption(plan, ref, N, 4);
    return tcheck_done("engine");
  }
  test_prefix_and_tenants(m);
  test_parallel_sampling(m);
  test_cancel(m);
  test_priority_and_limits(m);
  test_penalties_and_top(m);
  test_logit_bias(m);
  test_vllm_sampling(m);
  test_picks(m);
  test_row_picks(m);
  test_prompt_logprobs(m);
  irt_model_close(m);
  test_preemption(plan, ref, N, 0);
  test_preemption(plan, ref, N, 4);
  test_pool_bound(plan);
  return tcheck_done("engine");
}
