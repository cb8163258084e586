/* test_oom: every out-of-memory path of the plan loader, the tokenizer loaders, engine
 * creation and one request. An allocator installed with irt_set_allocator (the hook every
 * library allocation goes through, cJSON's and protobuf-c's included) fails the N-th
 * allocation, for each N the scenario makes; each run must end in IRT_OOM with a message
 * (or succeed, where the failed allocation was optional), never crash, and leave no block
 * allocated once the objects are closed. Under the sanitizer build ASan also sees every
 * read, write and free of those paths. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infc_build.h"
#include "inferrt.h"
#include "tcheck.h"

typedef struct counter {
  atomic_long n;       /* allocations (and resizes) made so far */
  atomic_long fail_at; /* the one to fail (1-based); 0: none */
  atomic_long live;    /* blocks allocated and not yet freed */
  atomic_bool failed;  /* the failure happened */
} counter;

static counter g_c;

static void *hook(void *ud, void *ptr, size_t size) {
  counter *c = ud;
  if (size == 0) {
    if (ptr) atomic_fetch_sub(&c->live, 1);
    free(ptr);
    return NULL;
  }
  long k = atomic_fetch_add(&c->n, 1) + 1;
  if (k == atomic_load(&c->fail_at)) {
    atomic_store(&c->failed, true);
    return NULL;
  }
  void *p = realloc(ptr, size);
  if (p && !ptr) atomic_fetch_add(&c->live, 1);
  return p;
}

static void arm(long fail_at) {
  atomic_store(&g_c.n, 0);
  atomic_store(&g_c.fail_at, fail_at);
  atomic_store(&g_c.failed, false);
}

static char g_plan[512], g_tok_json[512], g_tok_cfg[512];

/* The llama-text fixture (a tokenizer.json beside it) as a small-step plan at out. */
static ir_status build_llama_text(const char *out, ir_diag *d) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/llama-text", FIXTURES_DIR);
  infc_options o = infc_options_default();
  o.model.max_tokens = 16;
  o.model.max_seqs = 4;
  o.model.max_logits = 4;
  o.model.kv_block_size = 4;
  return infc_build(dir, &o, out, NULL, NULL, d);
}

static irt_model_opts model_opts(void) {
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = 1;
  mo.kv_tokens = 64;
  return mo;
}

/* --- the scenarios: each returns its status and frees everything it made ------------- */

static irt_status sc_plan(irt_error *err) {
  irt_model_opts mo = model_opts();
  irt_model *m = NULL;
  irt_status st = irt_model_open(g_plan, &mo, &m, err);
  irt_model_close(m);
  return st;
}

static irt_status tok_roundtrip(irt_tokenizer *t, irt_error *err) {
  int32_t *ids = NULL;
  size_t n = 0;
  char *text = NULL;
  size_t len = 0;
  const char *s = "Hello world, 12345 tokens!";
  irt_status st = irt_tokenize_alloc(t, s, strlen(s), true, true, &ids, &n, err);
  if (st == IRT_OK) st = irt_detokenize_alloc(t, ids, n, false, &text, &len, err);
  if (st == IRT_OK && (len != strlen(s) || memcmp(text, s, len))) {
    snprintf(err->msg, sizeof err->msg, "round trip gave '%.*s'", (int)len, text);
    st = err->status = IRT_INVALID_ARG; /* not an OOM path: the check below fails */
  }
  irt_free(ids);
  irt_free(text);
  return st;
}

static irt_status sc_tok_json(irt_error *err) {
  irt_tokenizer *t = NULL;
  irt_status st = irt_tokenizer_open_json(g_tok_json, g_tok_cfg, &t, err);
  if (st == IRT_OK) st = tok_roundtrip(t, err);
  irt_tokenizer_destroy(t);
  return st;
}

static irt_status sc_tok_plan(irt_error *err) {
  irt_tokenizer *t = NULL;
  irt_status st = irt_tokenizer_open_plan(g_plan, &t, err);
  if (st == IRT_OK) st = tok_roundtrip(t, err);
  irt_tokenizer_destroy(t);
  return st;
}

static irt_status sc_engine(irt_error *err) {
  irt_model_opts mo = model_opts();
  irt_engine_opts eo = {0};
  irt_model *m = NULL;
  irt_engine *e = NULL;
  irt_status st = irt_model_open(g_plan, &mo, &m, err);
  if (st == IRT_OK) st = irt_engine_create(m, &eo, &e, err);
  irt_engine_destroy(e);
  irt_model_close(m);
  return st;
}

typedef struct req_state {
  int done;     /* request_done events */
  int finished; /* completions that finished, cancelled or not */
  int cancelled;
} req_state;

static void on_event(void *user, const irt_event *ev) {
  req_state *r = user;
  if (ev->finish != IRT_FINISH_NONE) r->finished++;
  if (ev->finish == IRT_FINISH_CANCELLED) r->cancelled++;
  if (ev->request_done) r->done++;
}

/* Two sampled completions of a text prompt with a stop string, logprobs and a grammar:
 * the request's own allocations (its sequences, the grammar, the stop matcher, the
 * detokenizer streams) beside the engine's. */
static irt_status sc_request(irt_error *err) {
  irt_model_opts mo = model_opts();
  irt_engine_opts eo = {.spec_tokens = 2};
  irt_model *m = NULL;
  irt_engine *e = NULL;
  req_state rs = {0};
  irt_status st = irt_model_open(g_plan, &mo, &m, err);
  if (st == IRT_OK) st = irt_engine_create(m, &eo, &e, err);
  const char *stop[] = {"zzz"};
  irt_request r = {.prompt_text = "Hello world",
                   .add_special = true,
                   .sampling = irt_sampling_default(),
                   .max_tokens = 6,
                   .stop = stop,
                   .n_stop = 1,
                   .n = 2,
                   .top_logprobs = 2,
                   .grammar = "root ::= [a-z ]+",
                   .on_event = on_event,
                   .user = &rs};
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 7;
  irt_request_id id;
  if (st == IRT_OK) st = irt_engine_submit(e, &r, &id, err);
  if (st == IRT_OK) st = irt_engine_run(e, err);
  if (st == IRT_OK && rs.done != 1) {
    snprintf(err->msg, sizeof err->msg, "the request ended %d times", rs.done);
    st = err->status = IRT_INVALID_ARG;
  }
  if (st == IRT_OK && rs.cancelled) { /* the engine failed the request: it must say why */
    snprintf(err->msg, sizeof err->msg, "OOM in a step cancelled the request");
    err->status = IRT_OOM;
    st = IRT_OOM;
  }
  irt_engine_destroy(e);
  irt_model_close(m);
  return st;
}

/* The compiler on the same checkpoint: safetensors, config.json, tokenizer.json, the
 * template, every pass, the plan writer. */
static irt_status sc_build(irt_error *err) {
  char out[600];
  snprintf(out, sizeof out, "%s/oom-build.plan", TEST_TMP_DIR);
  ir_diag d = {0};
  ir_status st = build_llama_text(out, &d);
  err->status = st == IR_OK ? IRT_OK : st == IR_OOM ? IRT_OOM : IRT_INVALID_ARG;
  snprintf(err->msg, sizeof err->msg, "%s", d.msg);
  return err->status;
}

typedef struct scenario {
  const char *name;
  irt_status (*run)(irt_error *err);
} scenario;

/* Runs s once without failures (it must succeed) to count its allocations, then once per
 * allocation with that one failing. */
static void check_scenario(const scenario *s, long stride) {
  irt_error err = {0};
  arm(0);
  irt_status st = s->run(&err);
  long total = atomic_load(&g_c.n);
  CHECKF(st == IRT_OK, "%s: %s", s->name, err.msg);
  CHECKF(atomic_load(&g_c.live) == 0, "%s: %ld blocks leaked", s->name, atomic_load(&g_c.live));
  CHECKF(total > 0, "%s: no allocation went through the hook", s->name);
  long n_oom = 0, n_ok = 0, n_bad = 0;
  for (long k = 1; k <= total; k += k < 4096 ? 1 : stride) {
    memset(&err, 0, sizeof err);
    arm(k);
    st = s->run(&err);
    bool failed = atomic_load(&g_c.failed);
    long live = atomic_load(&g_c.live);
    if (live != 0) {
      CHECKF(live == 0, "%s: allocation %ld of %ld failed: %ld blocks leaked (status %s '%s')",
             s->name, k, total, live, irt_status_name(st), err.msg);
      atomic_store(&g_c.live, 0);
      n_bad++;
    } else if (st == IRT_OK) {
      n_ok++; /* the failed allocation had a fallback (or was not reached) */
    } else if (st == IRT_OOM && err.msg[0] && failed) {
      n_oom++;
    } else {
      CHECKF(st == IRT_OOM && err.msg[0],
             "%s: allocation %ld of %ld failed: status %s, message '%s'", s->name, k, total,
             irt_status_name(st), err.msg);
      n_bad++;
    }
    if (n_bad > 20) break; /* enough to read */
  }
  CHECK(n_oom > 0);
  printf("test_oom: %-10s %6ld allocations: %ld OOM errors, %ld recovered, %ld wrong\n", s->name,
         total, n_oom, n_ok, n_bad);
}

static void build_plan(void) {
  snprintf(g_plan, sizeof g_plan, "%s/oom.plan", TEST_TMP_DIR);
  snprintf(g_tok_json, sizeof g_tok_json, "%s/llama-text/tokenizer.json", FIXTURES_DIR);
  snprintf(g_tok_cfg, sizeof g_tok_cfg, "%s/llama-text/tokenizer_config.json", FIXTURES_DIR);
  ir_diag d = {0};
  CHECKF(build_llama_text(g_plan, &d) == IR_OK, "%s", d.msg);
}

int main(int argc, char **argv) {
  build_plan(); /* before the hook: the compiler is not under test here */
  long stride = argc > 1 ? atol(argv[1]) : 1;
  if (stride < 1) stride = 1;
  irt_set_allocator(hook, &g_c);
  static const scenario k_scenarios[] = {
      {"plan", sc_plan},     {"tok_json", sc_tok_json}, {"tok_plan", sc_tok_plan},
      {"engine", sc_engine}, {"request", sc_request},   {"build", sc_build},
  };
  /* TEST_OOM_ONLY=NAME:K runs one scenario with its K-th allocation failing (to debug one
   * case, e.g. under the sanitizer build's leak checker). */
  const char *only = getenv("TEST_OOM_ONLY");
  for (size_t i = 0; i < sizeof k_scenarios / sizeof *k_scenarios; i++) {
    const scenario *s = &k_scenarios[i];
    size_t len = strlen(s->name);
    if (!only) {
      check_scenario(s, stride);
    } else if (!strncmp(only, s->name, len) && only[len] == ':') {
      irt_error err = {0};
      arm(atol(only + len + 1));
      irt_status st = s->run(&err);
      printf("test_oom: %s: status %s '%s', %ld blocks live\n", s->name, irt_status_name(st),
             err.msg, atomic_load(&g_c.live));
      CHECK(atomic_load(&g_c.live) == 0);
    }
  }
  irt_set_allocator(NULL, NULL);
  return tcheck_done("test_oom");
}
