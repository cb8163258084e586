/* cli_bench: `inferrt bench` — a reproducible synthetic serving workload through the
 * engine: seeded prompt and output lengths, Poisson arrivals or a closed loop, an
 * optional shared prompt prefix; reports throughput, TTFT/TPOT/e2e percentiles, KV
 * utilisation and preemptions. --static-batching runs the baseline scheduler. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

typedef struct bench_args {
  const char *plan;
  int64_t requests, prompt_min, prompt_max, out_min, out_max, concurrency, threads;
  int64_t max_batched, kv_tokens, max_running;
  double rate, shared_prefix;
  uint64_t seed;
  bool json, static_batching, no_prefix_cache, no_cuda_graphs;
  const char *device;
  irt_kv_dtype kv_dtype;
  irt_sampling sampling; /* every request's; its seed + the request's index */
  irt_engine_opts spec;  /* the --spec-* fields; the engine's options start from it */
  cli_cuda cuda;
} bench_args;

typedef struct breq {
  int32_t *prompt;
  int64_t n_prompt, n_out;
  double submit_ms, first_ms, done_ms;
  int64_t tokens, cached;
  atomic_int done;
} breq;

static atomic_int g_done;

static void on_event(void *user, const irt_event *ev) {
  breq *r = user;
  double now = cli_now_ms();
  if (ev->token >= 0) {
    if (r->tokens++ == 0) r->first_ms = now;
  }
  r->cached = ev->cached_tokens;
  if (ev->request_done) {
    r->done_ms = now;
    atomic_store(&r->done, 1);
    atomic_fetch_add(&g_done, 1);
  }
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int64_t uniform(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

static double unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

static int usage(FILE *f) {
  fputs("usage: inferrt bench model.plan [options]\n\n"
        "  --requests N            requests in the run (default 64)\n"
        "  --prompt-len MIN:MAX    prompt lengths, uniform (default 32:256)\n"
        "  --output-len MIN:MAX    output lengths, uniform (default 16:128)\n"
        "  --rate R                Poisson arrivals per second (default 0: all at once)\n"
        "  --concurrency C         closed loop: keep C requests in flight (overrides --rate)\n"
        "  --shared-prefix F       fraction of each prompt that is a common prefix (0..1)\n"
        "  --seed S                workload seed (default 1)\n"
        "  --temperature T         sample at temperature T (default 0: greedy)\n"
        "  --top-k K               with --temperature: the K most likely only (0: all)\n"
        "  --top-p P               with --temperature: the smallest set of mass P (1: all)\n"
        "  --min-p P               with --temperature: drop tokens under P times the likeliest\n"
        "  --static-batching       baseline: admit a batch only when the last is done\n"
        "  --no-prefix-cache       disable prefix caching\n"
        "  --max-batched-tokens N  token budget per step (default: the plan's)\n"
        "  --max-running N         sequences per step (default: the plan's)\n"
        "  --kv-tokens N           KV cache capacity in tokens (default: the context)\n"
        "  --kv-dtype T            " CLI_KV_DTYPE_USAGE "\n"
        "  --threads N             CPU threads (default: all cores)\n"
        "  --device DEV            cpu or cuda (default: the plan's target)\n"
        "  --no-cuda-graphs        CUDA: run decode steps kernel by kernel\n" CLI_CUDA_USAGE
            CLI_SPEC_USAGE "  --json                  print one JSON object\n",
        f);
  return f == stderr ? 2 : 0;
}

static int parse(int argc, char **argv, bench_args *a) {
  static const struct option longs[] = {{"requests", 1, 0, 1},
                                        {"prompt-len", 1, 0, 2},
                                        {"output-len", 1, 0, 3},
                                        {"rate", 1, 0, 4},
                                        {"concurrency", 1, 0, 5},
                                        {"shared-prefix", 1, 0, 6},
                                        {"seed", 1, 0, 7},
                                        {"static-batching", 0, 0, 8},
                                        {"no-prefix-cache", 0, 0, 9},
                                        {"max-batched-tokens", 1, 0, 10},
                                        {"kv-tokens", 1, 0, 11},
                                        {"threads", 1, 0, 12},
                                        {"json", 0, 0, 13},
                                        {"max-running", 1, 0, 14},
                                        {"device", 1, 0, 15},
                                        {"no-cuda-graphs", 0, 0, 16},
                                        {"kv-dtype", 1, 0, 17},
                                        {"temperature", 1, 0, 18},
                                        {"top-k", 1, 0, 19},
                                        {"top-p", 1, 0, 20},
                                        {"spec-tokens", 1, 0, 21},
                                        {"spec-ngram", 1, 0, 22},
                                        {"spec-always", 0, 0, 23},
                                        {"min-p", 1, 0, 24},
                                        CLI_DRAFT_LONGOPT,
                                        CLI_CUDA_LONGOPTS,
                                        {"help", 0, 0, 'h'},
                                        {0, 0, 0, 0}};
  int c;
  char *end;
  bool ok = true;
  while (ok && (c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    int rc = cli_cuda_flag(c, optarg, &a->cuda);
    if (rc > 0) return rc;
    if (rc == 0) continue;
    switch (c) {
    case 1: ok = cli_parse_i64(optarg, 1, 1 << 20, &a->requests); break;
    case 2: ok = cli_parse_range(optarg, 1 << 20, &a->prompt_min, &a->prompt_max); break;
    case 3: ok = cli_parse_range(optarg, 1 << 20, &a->out_min, &a->out_max); break;
    case 4:
      a->rate = strtod(optarg, &end);
      ok = !*end && a->rate >= 0;
      break;
    case 5: ok = cli_parse_i64(optarg, 1, 1 << 16, &a->concurrency); break;
    case 6:
      a->shared_prefix = strtod(optarg, &end);
      ok = !*end && a->shared_prefix >= 0 && a->shared_prefix <= 1;
      break;
    case 7:
      a->seed = strtoull(optarg, &end, 10);
      ok = !*end;
      break;
    case 8: a->static_batching = true; break;
    case 9: a->no_prefix_cache = true; break;
    case 10: ok = cli_parse_i64(optarg, 1, 1 << 20, &a->max_batched); break;
    case 11: ok = cli_parse_i64(optarg, 1, (int64_t)1 << 40, &a->kv_tokens); break;
    case 12: ok = cli_parse_i64(optarg, 0, 4096, &a->threads); break;
    case 13: a->json = true; break;
    case 14: ok = cli_parse_i64(optarg, 1, 1 << 16, &a->max_running); break;
    case 15: a->device = optarg; break;
    case 16: a->no_cuda_graphs = true; break;
    case 17:
      if (cli_parse_kv_dtype(optarg, &a->kv_dtype)) return 1;
      break;
    case 18:
      a->sampling.temperature = strtof(optarg, &end);
      ok = !*end && a->sampling.temperature >= 0;
      break;
    case 19:
      a->sampling.top_k = (int)strtol(optarg, &end, 10);
      ok = !*end && a->sampling.top_k >= 0;
      break;
    case 20:
      a->sampling.top_p = strtof(optarg, &end);
      ok = !*end && a->sampling.top_p > 0 && a->sampling.top_p <= 1;
      break;
    case 21:
    case 22:
    case 23:
      if (cli_parse_spec(longs[c - 1].name, optarg, &a->spec)) return 1;
      break;
    case 24:
      a->sampling.min_p = strtof(optarg, &end);
      ok = !*end && a->sampling.min_p >= 0 && a->sampling.min_p <= 1;
      break;
    case 'h': usage(stdout); return -1;
    default: return usage(stderr);
    }
    if (!ok) return cli_fail("bad value for --%s: '%s'", longs[c - 1].name, optarg);
  }
  if (optind != argc - 1) return usage(stderr);
  a->plan = argv[optind];
  return 0;
}

/* Seeded prompts: a shared prefix (fraction of each prompt) then request-specific ids. */
static breq *make_workload(const bench_args *a, int64_t vocab, int64_t ctx) {
  breq *rs = calloc((size_t)a->requests, sizeof *rs);
  uint64_t s = a->seed;
  int64_t pmax = a->prompt_max < ctx - 1 ? a->prompt_max : ctx - 1;
  int32_t *shared = malloc((size_t)pmax * sizeof *shared);
  if (!rs || !shared) {
    free(rs), free(shared);
    return NULL;
  }
  for (int64_t k = 0; k < pmax; k++) shared[k] = (int32_t)uniform(&s, 0, vocab - 1);
  for (int64_t i = 0; i < a->requests; i++) {
    breq *r = &rs[i];
    r->n_prompt = uniform(&s, a->prompt_min < pmax ? a->prompt_min : pmax, pmax);
    r->n_out = uniform(&s, a->out_min, a->out_max);
    if (r->n_prompt + r->n_out > ctx) r->n_out = ctx - r->n_prompt;
    r->prompt = malloc((size_t)r->n_prompt * sizeof *r->prompt);
    if (!r->prompt) continue;
    int64_t np = (int64_t)(a->shared_prefix * (double)r->n_prompt);
    for (int64_t k = 0; k < r->n_prompt; k++)
      r->prompt[k] = k < np ? shared[k] : (int32_t)uniform(&s, 0, vocab - 1);
  }
  free(shared);
  return rs;
}

static void sleep_ms(double ms) {
  if (ms <= 0) return;
  struct timespec ts = {.tv_sec = (time_t)(ms / 1e3), .tv_nsec = (long)(fmod(ms, 1e3) * 1e6)};
  nanosleep(&ts, NULL);
}

typedef struct run_totals {
  double wall_ms, kv_util_sum;
  int64_t kv_samples;
  irt_engine_stats stats;
} run_totals;

static irt_status submit(irt_engine *e, const bench_args *a, breq *r, int64_t i, irt_error *err) {
  irt_request q = {.prompt_ids = r->prompt,
                   .n_prompt = (size_t)r->n_prompt,
                   .max_tokens = r->n_out,
                   .ignore_eos = true,
                   .n = 1,
                   .sampling = a->sampling,
                   .on_event = on_event,
                   .user = r};
  q.sampling.seed = a->sampling.seed + (uint64_t)i;
  r->submit_ms = cli_now_ms();
  irt_status st;
  while ((st = irt_engine_submit(e, &q, NULL, err)) == IRT_BUSY) sleep_ms(1);
  return st;
}

static void sample_kv(irt_engine *e, run_totals *t) {
  irt_engine_stats st;
  irt_engine_get_stats(e, &st);
  if (st.running + st.waiting == 0) return;
  t->kv_util_sum +=
      (double)st.kv_blocks_used / (double)(st.kv_blocks_total ? st.kv_blocks_total : 1);
  t->kv_samples++;
}

/* Submits on schedule (Poisson, closed loop or all at once) while the engine thread runs. */
static irt_status drive(irt_engine *e, const bench_args *a, breq *rs, run_totals *t,
                        irt_error *err) {
  uint64_t s = a->seed ^ 0x5bd1e995u;
  double t0 = cli_now_ms(), next = t0;
  atomic_store(&g_done, 0);
  for (int64_t i = 0; i < a->requests; i++) {
    if (a->concurrency > 0) {
      while (i - atomic_load(&g_done) >= a->concurrency) sleep_ms(0.2), sample_kv(e, t);
    } else if (a->rate > 0) {
      next += -log(1.0 - unit(&s)) / a->rate * 1e3;
      while (cli_now_ms() < next)
        sleep_ms(next - cli_now_ms() < 1 ? next - cli_now_ms() : 1), sample_kv(e, t);
    }
    irt_status st = submit(e, a, &rs[i], i, err);
    if (st != IRT_OK) return st;
  }
  while (atomic_load(&g_done) < a->requests) sleep_ms(1), sample_kv(e, t);
  t->wall_ms = cli_now_ms() - t0;
  irt_engine_get_stats(e, &t->stats);
  return IRT_OK;
}

static int cmp_d(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double pct(const double *v, int64_t n, double p) {
  if (n == 0) return 0;
  double idx = p / 100.0 * (double)(n - 1);
  int64_t lo = (int64_t)idx;
  return lo + 1 < n ? v[lo] + (v[lo + 1] - v[lo]) * (idx - (double)lo) : v[lo];
}

static cJSON *dist(cJSON *o, const char *key, double *v, int64_t n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  cJSON *d = cJSON_AddObjectToObject(o, key);
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += v[i];
  cJSON_AddNumberToObject(d, "mean", n ? sum / (double)n : 0);
  cJSON_AddNumberToObject(d, "p50", pct(v, n, 50));
  cJSON_AddNumberToObject(d, "p95", pct(v, n, 95));
  cJSON_AddNumberToObject(d, "p99", pct(v, n, 99));
  return d;
}

static cJSON *report(const bench_args *a, const breq *rs, const run_totals *t) {
  int64_t n = a->requests, out = 0, in = 0, cached = 0;
  double *ttft = calloc((size_t)n, sizeof *ttft), *tpot = calloc((size_t)n, sizeof *tpot);
  double *e2e = calloc((size_t)n, sizeof *e2e);
  int64_t n_tpot = 0;
  for (int64_t i = 0; ttft && tpot && e2e && i < n; i++) {
    const breq *r = &rs[i];
    out += r->tokens;
    in += r->n_prompt;
    cached += r->cached;
    ttft[i] = r->first_ms - r->submit_ms;
    e2e[i] = r->done_ms - r->submit_ms;
    if (r->tokens > 1) tpot[n_tpot++] = (r->done_ms - r->first_ms) / (double)(r->tokens - 1);
  }
  double secs = t->wall_ms / 1e3;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "scheduler", a->static_batching ? "static" : "continuous");
  cJSON_AddNumberToObject(o, "requests", (double)n);
  cJSON_AddNumberToObject(o, "temperature", round(a->sampling.temperature * 1e6) / 1e6);
  cJSON_AddNumberToObject(o, "duration_s", secs);
  cJSON_AddNumberToObject(o, "prompt_tokens", (double)in);
  cJSON_AddNumberToObject(o, "cached_prompt_tokens", (double)cached);
  cJSON_AddNumberToObject(o, "output_tokens", (double)out);
  cJSON_AddNumberToObject(o, "output_tokens_per_s", (double)out / secs);
  cJSON_AddNumberToObject(o, "total_tokens_per_s", (double)(out + in) / secs);
  cJSON_AddNumberToObject(o, "requests_per_s", (double)n / secs);
  if (ttft && tpot && e2e) {
    dist(o, "ttft_ms", ttft, n);
    dist(o, "tpot_ms", tpot, n_tpot);
    dist(o, "e2e_ms", e2e, n);
  }
  cJSON_AddNumberToObject(o, "kv_utilization",
                          t->kv_samples ? t->kv_util_sum / (double)t->kv_samples : 0);
  cJSON_AddNumberToObject(o, "preemptions", (double)t->stats.preemptions);
  cJSON_AddNumberToObject(o, "steps", (double)t->stats.steps);
  cJSON_AddNumberToObject(o, "spec_draft_tokens", (double)t->stats.spec_draft_tokens);
  cJSON_AddNumberToObject(o, "spec_accepted_tokens", (double)t->stats.spec_accepted_tokens);
  free(ttft), free(tpot), free(e2e);
  return o;
}

/* The KV pool's dtype and size, and what a MiB holds in each dtype. */
static void add_kv_report(cJSON *o, const irt_model *m) {
  const irt_model_info *in = irt_model_get_info(m);
  cJSON_AddStringToObject(o, "kv_dtype", in->kv_dtype);
  cJSON_AddNumberToObject(o, "kv_tokens", (double)in->kv_tokens);
  cJSON_AddNumberToObject(o, "kv_mib", (double)in->kv_bytes / 1048576.0);
  cJSON_AddNumberToObject(o, "kv_tokens_per_mib_f32",
                          1048576.0 / (double)irt_model_kv_token_bytes(m, IRT_KV_DTYPE_F32));
  cJSON_AddNumberToObject(o, "kv_tokens_per_mib_f16",
                          1048576.0 / (double)irt_model_kv_token_bytes(m, IRT_KV_DTYPE_F16));
  cJSON_AddNumberToObject(o, "kv_tokens_per_mib_int8",
                          1048576.0 / (double)irt_model_kv_token_bytes(m, IRT_KV_DTYPE_INT8));
}

static void print_table(const cJSON *o) {
  const char *keys[] = {"ttft_ms", "tpot_ms", "e2e_ms"};
  printf("scheduler        %s\n", cJSON_GetObjectItem(o, "scheduler")->valuestring);
  printf("requests         %.0f in %.2f s (%.2f req/s)\n",
         cJSON_GetObjectItem(o, "requests")->valuedouble,
         cJSON_GetObjectItem(o, "duration_s")->valuedouble,
         cJSON_GetObjectItem(o, "requests_per_s")->valuedouble);
  printf("tokens           %.0f prompt (%.0f from the prefix cache), %.0f generated\n",
         cJSON_GetObjectItem(o, "prompt_tokens")->valuedouble,
         cJSON_GetObjectItem(o, "cached_prompt_tokens")->valuedouble,
         cJSON_GetObjectItem(o, "output_tokens")->valuedouble);
  printf("throughput       %.1f output tok/s, %.1f total tok/s\n",
         cJSON_GetObjectItem(o, "output_tokens_per_s")->valuedouble,
         cJSON_GetObjectItem(o, "total_tokens_per_s")->valuedouble);
  for (int i = 0; i < 3; i++) {
    const cJSON *d = cJSON_GetObjectItem(o, keys[i]);
    if (!d) continue;
    printf("%-16s p50 %8.1f  p95 %8.1f  p99 %8.1f  mean %8.1f\n", keys[i],
           cJSON_GetObjectItem(d, "p50")->valuedouble, cJSON_GetObjectItem(d, "p95")->valuedouble,
           cJSON_GetObjectItem(d, "p99")->valuedouble, cJSON_GetObjectItem(d, "mean")->valuedouble);
  }
  printf("kv cache         %s, %.0f tokens in %.1f MiB "
         "(tokens per MiB: f32 %.0f, f16 %.0f, int8 %.0f)\n",
         cJSON_GetObjectItem(o, "kv_dtype")->valuestring,
         cJSON_GetObjectItem(o, "kv_tokens")->valuedouble,
         cJSON_GetObjectItem(o, "kv_mib")->valuedouble,
         cJSON_GetObjectItem(o, "kv_tokens_per_mib_f32")->valuedouble,
         cJSON_GetObjectItem(o, "kv_tokens_per_mib_f16")->valuedouble,
         cJSON_GetObjectItem(o, "kv_tokens_per_mib_int8")->valuedouble);
  printf(
      "kv utilisation   %.1f%% (mean while busy)\npreemptions      %.0f\nsteps            %.0f\n",
      100 * cJSON_GetObjectItem(o, "kv_utilization")->valuedouble,
      cJSON_GetObjectItem(o, "preemptions")->valuedouble,
      cJSON_GetObjectItem(o, "steps")->valuedouble);
  double drafts = cJSON_GetObjectItem(o, "spec_draft_tokens")->valuedouble;
  double kept = cJSON_GetObjectItem(o, "spec_accepted_tokens")->valuedouble;
  if (drafts > 0)
    printf("speculation      %.0f draft tokens, %.0f kept (%.1f%%)\n", drafts, kept,
           100 * kept / drafts);
}

int cmd_bench(int argc, char **argv) {
  bench_args a = {.requests = 64,
                  .prompt_min = 32,
                  .prompt_max = 256,
                  .out_min = 16,
                  .out_max = 128,
                  .seed = 1,
                  .sampling = irt_sampling_default()};
  int rc = parse(argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = (int)a.threads;
  mo.kv_tokens = a.kv_tokens;
  mo.device = a.device;
  mo.no_cuda_graphs = a.no_cuda_graphs;
  if (cli_model_opts(&mo, &a.cuda)) return 1;
  mo.kv_dtype = a.kv_dtype;
  irt_model *m = NULL;
  irt_engine *e = NULL;
  irt_error err = {0};
  irt_status st = cli_model_open(a.plan, &mo, &m, &err);
  irt_engine_opts eo = a.spec; /* the --spec-* fields, then the rest */
  eo.max_batched_tokens = a.max_batched, eo.max_running = a.max_running;
  eo.static_batching = a.static_batching, eo.disable_prefix_cache = a.no_prefix_cache;
  irt_model *draft = NULL;
  if (st == IRT_OK) st = cli_open_draft(m, &mo, &eo, &draft, &err);
  if (st == IRT_OK) st = irt_engine_create(m, &eo, &e, &err);
  const irt_model_info *in = m ? irt_model_get_info(m) : NULL;
  breq *rs = st == IRT_OK ? make_workload(&a, in->vocab_size, in->context_length) : NULL;
  if (st == IRT_OK && !rs) st = IRT_OOM;
  if (st == IRT_OK) st = irt_engine_start(e, &err);
  run_totals t = {0};
  if (st == IRT_OK) st = drive(e, &a, rs, &t, &err);
  if (st == IRT_OK) {
    cJSON *o = report(&a, rs, &t);
    add_kv_report(o, m);
    if (a.json) {
      char *s = cJSON_PrintUnformatted(o);
      puts(s);
      free(s);
    } else {
      print_table(o);
    }
    cJSON_Delete(o);
  }
  irt_engine_destroy(e);
  irt_model_close(draft);
  cli_model_close(m);
  for (int64_t i = 0; rs && i < a.requests; i++) free(rs[i].prompt);
  free(rs);
  return st == IRT_OK ? 0 : cli_fail("%s", err.msg[0] ? err.msg : irt_status_name(st));
}
