/* cli_serve: `inferrt serve` — the OpenAI-compatible HTTP server (runtime/server) over the
 * engine running on its own thread, until SIGINT or SIGTERM. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "srv.h"

typedef struct serve_args {
  const char *plan, *host, *model_name, *chat_template, *device;
  const char *kv_events, *kv_events_topic; /* --kv-events ENDPOINT, --kv-events-topic */
  int64_t port, max_connections, max_waiting, max_body, threads, kv_tokens, max_batched;
  int64_t max_per_client;
  bool no_prefix_cache, no_cuda_graphs, no_reasoning, allow_special;
  irt_kv_dtype kv_dtype;
  srv_keys keys;
  irt_engine_opts spec; /* the --spec-* fields; the engine's options start from it */
  cli_cuda cuda;
} serve_args;

static int usage(FILE *f) {
  fputs("usage: inferrt serve model.plan [options]\n\n"
        "  --host ADDR             listen address, IPv4 or IPv6 (default 127.0.0.1)\n"
        "  --port N                port (default 8000; 0: any free port, printed at start)\n"
        "  --model-name NAME       the served model id (default: the plan's file name)\n"
        "  --api-key KEY           require this key (repeatable); shared tenant, priority 0\n"
        "  --api-keys FILE         keys file, lines 'key [tenant [priority]]': a tenant has its\n"
        "                          own prefix cache; higher priorities are scheduled first\n"
        "  --max-connections N     generations in flight (streamed or awaited) before requests\n"
        "                          get 429 with Retry-After (default 256)\n"
        "  --max-connections-per-client N\n"
        "                          sockets one client address may hold (default: half of the\n"
        "                          server's, which is 4 per --max-connections, at least 1024)\n"
        "  --max-waiting N         requests in the engine before 429 (default 256)\n"
        "  --max-body BYTES        request body limit, else 413 (default 1048576)\n"
        "  --chat-template NAME    chatml, qwen3, deepseek-r1, llama3, llama3.1, mistral, llama2,\n"
        "                          gemma or phi3 (default: the model's)\n"
        "  --allow-special-in-content\n"
        "                          parse special tokens spelled inside chat messages (by default\n"
        "                          message text is text: no client can forge a system turn)\n"
        "  --reasoning-format F    auto: a thinking template's <think> block comes apart as\n"
        "                          reasoning_content (default); none: it stays in content\n"
        "  --kv-tokens N           KV cache capacity in tokens, over all requests (default: one\n"
        "                          context length; raise it to run many requests at once)\n"
        "  --kv-dtype T            " CLI_KV_DTYPE_USAGE "\n"
        "  --max-batched-tokens N  token budget per step (default: the plan's)\n"
        "  --no-prefix-cache       disable prefix caching\n"
        "  --kv-events ENDPOINT    publish the prefix cache's stored / removed blocks on a\n"
        "                          ZeroMQ PUB socket bound there (tcp://0.0.0.0:5557), in vLLM's\n"
        "                          KV-events format, for KV-aware routers\n"
        "  --kv-events-topic T     their topic (default kv-events)\n"
        "  --threads N             CPU threads (default: all cores)\n"
        "  --device DEV            cpu or cuda (default: the plan's target)\n"
        "  --no-cuda-graphs        CUDA: run decode steps kernel by kernel\n" CLI_CUDA_USAGE
            CLI_SPEC_USAGE "\n"
        "endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, /health,\n"
        "/metrics (Prometheus), / (chat page)\n",
        f);
  return f == stderr ? 2 : 0;
}

static int parse_value(serve_args *a, int c, const char *v) {
  irt_error err = {0};
  switch (c) {
  case 1: a->host = v; return 0;
  case 2: return cli_parse_i64(v, 0, 65535, &a->port) ? 0 : cli_fail("--port: expected 0..65535");
  case 3: a->model_name = v; return 0;
  case 4: return srv_keys_add(&a->keys, v, NULL, 0) == IRT_OK ? 0 : cli_fail("out of memory");
  case 5:
    return srv_keys_load(&a->keys, v, &err) == IRT_OK ? 0 : cli_fail("--api-keys: %s", err.msg);
  case 6:
    return cli_parse_i64(v, 1, 100000, &a->max_connections)
               ? 0
               : cli_fail("--max-connections: expected 1..100000");
  case 7:
    return cli_parse_i64(v, 1, 1 << 20, &a->max_waiting)
               ? 0
               : cli_fail("--max-waiting: expected 1..1048576");
  case 8:
    return cli_parse_i64(v, 1024, (int64_t)1 << 30, &a->max_body)
               ? 0
               : cli_fail("--max-body: expected 1024..1073741824");
  case 9: a->chat_template = v; return 0;
  case 10:
    return cli_parse_i64(v, 1, (int64_t)1 << 40, &a->kv_tokens)
               ? 0
               : cli_fail("--kv-tokens: expected a positive integer");
  case 11:
    return cli_parse_i64(v, 1, 1 << 20, &a->max_batched)
               ? 0
               : cli_fail("--max-batched-tokens: expected a positive integer");
  case 14: a->device = v; return 0;
  case 16: return cli_parse_kv_dtype(v, &a->kv_dtype);
  case 17: return cli_parse_spec("spec-tokens", v, &a->spec);
  case 18: return cli_parse_spec("spec-ngram", v, &a->spec);
  case 19: return cli_parse_spec("spec-always", v, &a->spec);
  case 21:
    return cli_parse_i64(v, 1, 65536, &a->max_per_client)
               ? 0
               : cli_fail("--max-connections-per-client: expected 1..65536");
  case 23: a->kv_events = v; return 0;
  case 24: a->kv_events_topic = v; return 0;
  case 20:
    if (strcmp(v, "auto") && strcmp(v, "none"))
      return cli_fail("--reasoning-format: expected auto or none");
    a->no_reasoning = !strcmp(v, "none");
    return 0;
  case 13:
    return cli_parse_i64(v, 0, 4096, &a->threads)
               ? 0
               : cli_fail("--threads: expected a non-negative integer");
  default: return usage(stderr);
  }
}

static int parse(int argc, char **argv, serve_args *a) {
  static const struct option longs[] = {{"host", 1, 0, 1},
                                        {"port", 1, 0, 2},
                                        {"model-name", 1, 0, 3},
                                        {"api-key", 1, 0, 4},
                                        {"api-keys", 1, 0, 5},
                                        {"max-connections", 1, 0, 6},
                                        {"max-waiting", 1, 0, 7},
                                        {"max-body", 1, 0, 8},
                                        {"chat-template", 1, 0, 9},
                                        {"kv-tokens", 1, 0, 10},
                                        {"max-batched-tokens", 1, 0, 11},
                                        {"no-prefix-cache", 0, 0, 12},
                                        {"threads", 1, 0, 13},
                                        {"device", 1, 0, 14},
                                        {"no-cuda-graphs", 0, 0, 15},
                                        {"allow-special-in-content", 0, 0, 22},
                                        {"kv-dtype", 1, 0, 16},
                                        {"spec-tokens", 1, 0, 17},
                                        {"spec-ngram", 1, 0, 18},
                                        {"spec-always", 0, 0, 19},
                                        {"reasoning-format", 1, 0, 20},
                                        {"max-connections-per-client", 1, 0, 21},
                                        {"kv-events", 1, 0, 23},
                                        {"kv-events-topic", 1, 0, 24},
                                        CLI_DRAFT_LONGOPT,
                                        CLI_CUDA_LONGOPTS,
                                        {"help", 0, 0, 'h'},
                                        {0, 0, 0, 0}};
  int c, rc;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    if ((rc = cli_cuda_flag(c, optarg, &a->cuda)) >= 0) {
      if (rc) return rc;
      continue;
    }
    if (c == 'h') return usage(stdout) - 1;
    if (c == 12) a->no_prefix_cache = true;
    else if (c == 15) a->no_cuda_graphs = true;
    else if (c == 22) a->allow_special = true;
    else if ((rc = parse_value(a, c, optarg))) return rc;
  }
  if (optind != argc - 1) return usage(stderr);
  a->plan = argv[optind];
  return 0;
}

/* The plan's file name without directory and ".plan". */
static void default_name(const char *plan, char *out, size_t cap) {
  const char *base = strrchr(plan, '/') ? strrchr(plan, '/') + 1 : plan;
  size_t n = strlen(base);
  if (n > 5 && !strcmp(base + n - 5, ".plan")) n -= 5;
  snprintf(out, cap, "%.*s", (int)n, base);
}

static void http_log(void *cls, const char *msg) {
  (void)cls;
  fprintf(stderr, "inferrt: http: %s\n", msg);
}

static int serve(serve_args *a, srv_ctx *c, srv_metrics *metrics, sigset_t *sigs) {
  srv_http_opts ho = {.host = a->host,
                      .port = (int)a->port,
                      .max_connections = (int)a->max_connections,
                      .max_per_client = (int)a->max_per_client,
                      .max_body = (size_t)a->max_body,
                      .keys = &a->keys,
                      .metrics = metrics,
                      .log = http_log};
  srv_http *h = NULL;
  irt_error err = {0};
  if (srv_http_start(c, &ho, &h, &err) != IRT_OK) return cli_fail("%s", err.msg);
  const char *fmt = strchr(a->host, ':') ? "[%s]" : "%s";
  char host[300];
  snprintf(host, sizeof host, fmt, a->host);
  fprintf(stderr,
          "inferrt: serving '%s' on http://%s:%d (context %lld, KV cache %lld tokens %s in %.1f "
          "MiB, %s, %d API keys); Ctrl-C stops\n",
          c->model_name, host, srv_http_port(h), (long long)c->info->context_length,
          (long long)c->info->kv_tokens, c->info->kv_dtype, (double)c->info->kv_bytes / (1 << 20),
          c->tok ? "with tokenizer" : "token ids only", a->keys.n);
  fflush(stderr);
  int sig = 0;
  sigwait(sigs, &sig);
  fprintf(stderr, "inferrt: %s: shutting down\n", strsignal(sig));
  srv_http_stop(h);
  return 0;
}

int cmd_serve(int argc, char **argv) {
  serve_args a = {.host = "127.0.0.1",
                  .port = 8000,
                  .max_connections = 256,
                  .max_waiting = 256,
                  .max_body = 1 << 20};
  int rc = parse(argc, argv, &a);
  if (rc) {
    srv_keys_free(&a.keys);
    return rc < 0 ? 0 : rc;
  }
  /* Threads started from here on inherit the mask: only sigwait sees SIGINT / SIGTERM. */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = (int)a.threads;
  mo.kv_tokens = a.kv_tokens;
  mo.device = a.device;
  mo.no_cuda_graphs = a.no_cuda_graphs;
  if (cli_model_opts(&mo, &a.cuda)) return 1;
  mo.kv_dtype = a.kv_dtype;
  irt_engine_opts eo = a.spec; /* the --spec-* fields, then the rest */
  eo.max_batched_tokens = a.max_batched, eo.max_waiting = a.max_waiting;
  eo.disable_prefix_cache = a.no_prefix_cache;
  srv_ctx c = {.chat_template = a.chat_template,
               .no_reasoning = a.no_reasoning,
               .allow_special = a.allow_special,
               .created = (int64_t)time(NULL),
               .id_salt = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid()};
  irt_error err = {0};
  irt_status st = cli_model_open(a.plan, &mo, &c.m, &err);
  srv_kv_events *kve = NULL;
  if (st == IRT_OK && a.kv_events)
    st = srv_kv_events_start(c.m, a.kv_events, a.kv_events_topic, &kve, &err);
  irt_model *draft = NULL;
  if (st == IRT_OK) st = cli_open_draft(c.m, &mo, &eo, &draft, &err);
  if (st == IRT_OK) st = irt_engine_create(c.m, &eo, &c.e, &err);
  if (st == IRT_OK) st = irt_engine_start(c.e, &err);
  srv_metrics *metrics = NULL;
  if (st == IRT_OK && !(metrics = srv_metrics_create())) st = IRT_OOM;
  c.on_done = srv_metrics_done;
  c.on_done_cls = metrics;
  if (st == IRT_OK) {
    c.info = irt_model_get_info(c.m);
    c.tok = irt_model_get_tokenizer(c.m);
    c.max_n = c.info->max_step_seqs < c.info->max_step_logits ? c.info->max_step_seqs
                                                              : c.info->max_step_logits;
    if (a.model_name) snprintf(c.model_name, sizeof c.model_name, "%s", a.model_name);
    else default_name(a.plan, c.model_name, sizeof c.model_name);
    rc = serve(&a, &c, metrics, &sigs);
  } else {
    rc = cli_fail("%s", err.msg[0] ? err.msg : irt_status_name(st));
  }
  irt_engine_destroy(c.e);
  irt_model_close(draft);
  srv_kv_events_stop(kve);
  srv_metrics_destroy(metrics);
  cli_model_close(c.m);
  srv_keys_free(&a.keys);
  return rc;
}
