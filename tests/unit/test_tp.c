/* test_tp: tensor parallelism without MPI, the ranks as threads of one process over an
 * in-memory irt_comm (barriers and shared buffers), so that the sanitizer build watches
 * the sharded plan, rank 0's step messages and the followers (memory errors and leaks).
 * The engine on rank 0 (batching, n = 2 forks whose KV blocks are copied on write, a
 * prefix from the cache) must give one rank's tokens, with logprobs within 2e-5 (the ranks'
 * partial sums are added in another order than one rank's dot products), on 2 ranks (kv
 * heads split) and 4 (kv heads replicated); greedy tokens equal transformers'
 * (oracle.json). Wrong rank counts are refused by name. */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infc_build.h"
#include "inferrt.h"
#include "ir_alloc.h"
#include "ir_file.h"
#include "tcheck.h"
#include "tmodel.h"

#define MAX_RANKS 4
#define N_REQ 5
#define MAX_OUT 24

/* The ranks' meeting place: each publishes a pointer, then all read. */
typedef struct group {
  int size;
  pthread_barrier_t bar;
  void *slot[MAX_RANKS];
} group;

typedef struct rank_ctx {
  group *g;
  int rank;
} rank_ctx;

static int t_all_reduce(void *ctx, float *buf, size_t n) {
  rank_ctx *c = ctx;
  group *g = c->g;
  float *sum = malloc(n * sizeof *sum);
  if (!sum) return 1;
  g->slot[c->rank] = buf;
  pthread_barrier_wait(&g->bar);
  for (size_t i = 0; i < n; i++) { /* rank order on every rank: the same sums */
    float s = 0.0f;
    for (int r = 0; r < g->size; r++) s += ((float *)g->slot[r])[i];
    sum[i] = s;
  }
  pthread_barrier_wait(&g->bar);
  memcpy(buf, sum, n * sizeof *sum);
  free(sum);
  return 0;
}

static int t_all_gather(void *ctx, const void *send, size_t bytes, void *recv) {
  rank_ctx *c = ctx;
  group *g = c->g;
  g->slot[c->rank] = (void *)send;
  pthread_barrier_wait(&g->bar);
  for (int r = 0; r < g->size; r++) memcpy((char *)recv + (size_t)r * bytes, g->slot[r], bytes);
  pthread_barrier_wait(&g->bar);
  return 0;
}

static int t_broadcast(void *ctx, void *buf, size_t bytes, int root) {
  rank_ctx *c = ctx;
  group *g = c->g;
  g->slot[c->rank] = buf;
  pthread_barrier_wait(&g->bar);
  if (c->rank != root) memcpy(buf, g->slot[root], bytes);
  pthread_barrier_wait(&g->bar);
  return 0;
}

typedef struct result {
  int32_t tok[2][MAX_OUT];
  float lp[2][MAX_OUT];
  int n[2];
} result;

static void on_event(void *user, const irt_event *ev) {
  result *r = user;
  if (ev->token < 0 || ev->index < 0 || ev->index > 1 || r->n[ev->index] >= MAX_OUT) return;
  r->tok[ev->index][r->n[ev->index]] = ev->token;
  r->lp[ev->index][r->n[ev->index]++] = ev->logprob;
}

static int32_t g_prompts[N_REQ][40];
static int g_len[N_REQ];

/* The requests: the oracle's three prompts (greedy), one of them twice more behind a long
 * shared prefix, one with n = 2. */
static void make_prompts(const cJSON *prompts) {
  for (int i = 0; i < 3; i++)
    g_len[i] = (int)tmodel_json_ids(cJSON_GetArrayItem(prompts, i), g_prompts[i], 40);
  for (int i = 3; i < N_REQ; i++) {
    g_len[i] = 30;
    for (int k = 0; k < 30; k++) g_prompts[i][k] = (int32_t)((k * 37 + (k > 26 ? i : 0)) % 290 + 5);
  }
}

/* Rank 0's work (or a one-rank model's): every request through the engine. */
static void run_requests(irt_model *m, result *res) {
  irt_engine_opts eo = irt_engine_opts_default();
  irt_engine *e = NULL;
  irt_error err = {0};
  CHECKF(irt_engine_create(m, &eo, &e, &err) == IRT_OK, "%s", err.msg);
  if (!e) return;
  for (int i = 0; i < N_REQ; i++) {
    irt_request q = {.prompt_ids = g_prompts[i],
                     .n_prompt = (size_t)g_len[i],
                     .sampling = irt_sampling_default(),
                     .max_tokens = MAX_OUT,
                     .ignore_eos = true,
                     .n = i == 1 || i == 4 ? 2 : 1,
                     .on_event = on_event,
                     .user = &res[i]};
    q.sampling.temperature = 0.0f;
    CHECKF(irt_engine_submit(e, &q, NULL, &err) == IRT_OK, "%s", err.msg);
  }
  CHECKF(irt_engine_run(e, &err) == IRT_OK, "%s", err.msg);
  irt_engine_destroy(e);
}

typedef struct job {
  const char *plan;
  irt_comm comm;
  rank_ctx ctx;
  result *res; /* rank 0 */
  irt_status st;
  irt_error err;
} job;

static void *rank_main(void *arg) {
  job *j = arg;
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = 1;
  mo.kv_tokens = 1024;
  mo.comm = &j->comm;
  irt_model *m = NULL;
  j->st = irt_model_open(j->plan, &mo, &m, &j->err);
  if (j->st != IRT_OK) return NULL;
  if (j->comm.rank == 0) run_requests(m, j->res);
  else j->st = irt_model_follow(m, &j->err);
  irt_model_close(m);
  return NULL;
}

static void run_ranks(const char *plan, int n, result *res) {
  group g = {.size = n};
  pthread_barrier_init(&g.bar, NULL, (unsigned)n);
  job jobs[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  for (int r = 0; r < n; r++) {
    jobs[r] = (job){.plan = plan, .ctx = {.g = &g, .rank = r}, .res = res};
    jobs[r].comm = (irt_comm){.rank = r,
                              .size = n,
                              .ctx = &jobs[r].ctx,
                              .all_reduce_sum_f32 = t_all_reduce,
                              .all_gather = t_all_gather,
                              .broadcast = t_broadcast};
  }
  for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, rank_main, &jobs[r]);
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < n; r++)
    CHECKF(jobs[r].st == IRT_OK, "rank %d of %d: %s", r, n, jobs[r].err.msg);
  pthread_barrier_destroy(&g.bar);
}

static const char *build(int tp) {
  static char paths[8][512];
  char *path = paths[tp];
  snprintf(path, sizeof paths[0], "%s/tp-gqa-%d.plan", TEST_TMP_DIR, tp);
  infc_options o = infc_options_default();
  o.model.max_tokens = 64;
  o.model.max_seqs = 8;
  o.model.max_logits = 8;
  o.model.kv_block_size = 4;
  o.model.tp_size = tp;
  ir_diag d = {0};
  CHECKF(infc_build(FIXTURES_DIR "/llama-gqa-f32", &o, path, NULL, NULL, &d) == IR_OK, "%s", d.msg);
  return path;
}

static void check_refusals(const char *tp2) {
  irt_model_opts mo = irt_model_opts_default();
  irt_model *m = NULL;
  irt_error err = {0};
  CHECK(irt_model_open(tp2, &mo, &m, &err) == IRT_INVALID_ARG && !m);
  CHECKF(strstr(err.msg, "built for 2 tensor-parallel ranks: run it as 2 processes") != NULL, "%s",
         err.msg);
  irt_comm three = {.rank = 0,
                    .size = 3,
                    .all_reduce_sum_f32 = t_all_reduce,
                    .all_gather = t_all_gather,
                    .broadcast = t_broadcast};
  mo.comm = &three;
  CHECK(irt_model_open(tp2, &mo, &m, &err) == IRT_INVALID_ARG && !m);
  CHECKF(strstr(err.msg, "built for 2 tensor-parallel ranks and this job has 3") != NULL, "%s",
         err.msg);
  three.rank = 2; /* a rank the plan does not hold */
  CHECK(irt_model_open(tp2, &mo, &m, &err) != IRT_OK && !m);
  CHECKF(strstr(err.msg, "rank 2") != NULL, "%s", err.msg);
  CHECK(irt_model_follow(NULL, &err) == IRT_INVALID_ARG);
}

int main(void) {
  char *text = NULL;
  ir_diag d = {0};
  CHECKF(ir_file_read(FIXTURES_DIR "/llama-gqa-f32/oracle.json", 1 << 24, &text, NULL, &d) == IR_OK,
         "%s", d.msg);
  cJSON *oracle = text ? cJSON_Parse(text) : NULL;
  CHECK(oracle != NULL);
  if (!oracle) return tcheck_done("tp");
  make_prompts(cJSON_GetObjectItem(oracle, "prompts"));
  const cJSON *greedy = cJSON_GetObjectItem(oracle, "greedy");

  static result one[N_REQ];
  irt_model *m = tmodel_open(build(1));
  if (m) run_requests(m, one);
  irt_model_close(m);
  for (int i = 0; i < 3; i++) { /* the one-rank run is transformers' */
    int32_t want[64];
    int64_t n = tmodel_json_ids(cJSON_GetArrayItem(greedy, i), want, 64);
    n = n < MAX_OUT ? n : MAX_OUT;
    CHECK(one[i].n[0] == MAX_OUT && !memcmp(one[i].tok[0], want, (size_t)n * sizeof *want));
  }
  for (int tp = 2; tp <= 4; tp += 2) {
    const char *plan = build(tp);
    if (tp == 2) check_refusals(plan);
    static result got[N_REQ];
    memset(got, 0, sizeof got);
    run_ranks(plan, tp, got);
    double worst = 0.0;
    for (int i = 0; i < N_REQ; i++)
      for (int c = 0; c < 2; c++) {
        CHECKF(got[i].n[c] == one[i].n[c] &&
                   !memcmp(got[i].tok[c], one[i].tok[c], (size_t)one[i].n[c] * sizeof(int32_t)),
               "tp %d request %d completion %d: tokens differ from one rank's", tp, i, c);
        for (int k = 0; k < one[i].n[c]; k++)
          worst = fmax(worst, fabs((double)got[i].lp[c][k] - one[i].lp[c][k]));
      }
    CHECKF(worst <= 2e-5, "tp %d: logprobs %.3g from one rank's", tp, worst);
    printf("tp %d: worst |logprob - one rank's| %.3g\n", tp, worst);
  }
  cJSON_Delete(oracle);
  ir_free(text);
  return tcheck_done("tp");
}
