/* srv_metrics: Prometheus text exposition of the server and the engine: requests by endpoint
 * and status, TTFT / time-per-output-token / end-to-end latency histograms, token counters,
 * running and waiting sequences, KV cache usage, prefix-cache hit rate, open connections. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv.h"

#define N_STATUS 600
#define N_BUCKETS 16

typedef struct hist {
  const double *le; /* (n) upper bounds in seconds; +Inf is implied */
  int n;
  int64_t count[N_BUCKETS + 1];
  double sum;
} hist;

static const double k_ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0};
static const double k_tpot[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                0.1,    0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0};
static const double k_e2e[] = {0.01, 0.025, 0.05, 0.1,  0.25, 0.5,  1.0,  2.5,
                               5.0,  10.0,  15.0, 20.0, 30.0, 40.0, 50.0, 60.0};

struct srv_metrics {
  pthread_mutex_t mu;
  int64_t requests[SRV_N_ROUTES][N_STATUS];
  hist ttft, tpot, e2e;
  int64_t cancelled, open_connections, in_flight;
};

static const char *const k_route_names[SRV_N_ROUTES] = {
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/",
    "/tokenize",       "/detokenize",          "other"};

srv_metrics *srv_metrics_create(void) {
  srv_metrics *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  pthread_mutex_init(&m->mu, NULL);
  m->ttft = (hist){.le = k_ttft, .n = N_BUCKETS};
  m->tpot = (hist){.le = k_tpot, .n = N_BUCKETS};
  m->e2e = (hist){.le = k_e2e, .n = N_BUCKETS};
  return m;
}

void srv_metrics_destroy(srv_metrics *m) {
  if (!m) return;
  pthread_mutex_destroy(&m->mu);
  free(m);
}

void srv_metrics_request(srv_metrics *m, srv_route r, int status) {
  if (!m || (unsigned)r >= SRV_N_ROUTES || status < 0 || status >= N_STATUS) return;
  pthread_mutex_lock(&m->mu);
  m->requests[r][status]++;
  pthread_mutex_unlock(&m->mu);
}

static void observe(hist *h, double v) {
  int b = 0;
  while (b < h->n && v > h->le[b]) b++;
  h->count[b]++;
  h->sum += v;
}

void srv_metrics_generation(srv_metrics *m, double ttft_s, double tpot_s, double e2e_s) {
  pthread_mutex_lock(&m->mu);
  if (ttft_s >= 0) observe(&m->ttft, ttft_s);
  if (tpot_s >= 0) observe(&m->tpot, tpot_s);
  observe(&m->e2e, e2e_s);
  pthread_mutex_unlock(&m->mu);
}

void srv_metrics_cancelled(srv_metrics *m) {
  pthread_mutex_lock(&m->mu);
  m->cancelled++;
  pthread_mutex_unlock(&m->mu);
}

void srv_metrics_connections(srv_metrics *m, int delta) {
  pthread_mutex_lock(&m->mu);
  m->open_connections += delta;
  pthread_mutex_unlock(&m->mu);
}

void srv_metrics_in_flight(srv_metrics *m, int delta) {
  pthread_mutex_lock(&m->mu);
  m->in_flight += delta;
  pthread_mutex_unlock(&m->mu);
}

static void head(srv_buf *b, const char *name, const char *type, const char *help) {
  char line[512];
  int n = snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  srv_buf_put(b, line, (size_t)n);
}

static void value(srv_buf *b, const char *name, const char *labels, double v) {
  char line[512];
  int n = snprintf(line, sizeof line, "%s%s %.17g\n", name, labels, v);
  srv_buf_put(b, line, (size_t)n);
}

static void put_hist(srv_buf *b, const char *name, const char *help, const hist *h) {
  char key[256], le[64];
  head(b, name, "histogram", help);
  snprintf(key, sizeof key, "%s_bucket", name);
  int64_t acc = 0;
  for (int i = 0; i <= h->n; i++) {
    acc += h->count[i];
    if (i < h->n) snprintf(le, sizeof le, "{le=\"%g\"}", h->le[i]);
    else snprintf(le, sizeof le, "{le=\"+Inf\"}");
    value(b, key, le, (double)acc);
  }
  snprintf(key, sizeof key, "%s_sum", name);
  value(b, key, "", h->sum);
  snprintf(key, sizeof key, "%s_count", name);
  value(b, key, "", (double)acc);
}

static void put_requests(srv_buf *b, const srv_metrics *m) {
  head(b, "inferrt_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (int r = 0; r < SRV_N_ROUTES; r++)
    for (int s = 0; s < N_STATUS; s++) {
      if (!m->requests[r][s]) continue;
      char labels[128];
      snprintf(labels, sizeof labels, "{endpoint=\"%s\",status=\"%d\"}", k_route_names[r], s);
      value(b, "inferrt_requests_total", labels, (double)m->requests[r][s]);
    }
}

static void put_engine(srv_buf *b, irt_engine *e) {
  irt_engine_stats st;
  irt_engine_get_stats(e, &st);
  head(b, "inferrt_prompt_tokens_total", "counter", "Prompt tokens admitted.");
  value(b, "inferrt_prompt_tokens_total", "", (double)st.prompt_tokens);
  head(b, "inferrt_prompt_tokens_cached_total", "counter",
       "Prompt tokens served from the prefix cache.");
  value(b, "inferrt_prompt_tokens_cached_total", "", (double)st.cached_prompt_tokens);
  head(b, "inferrt_generation_tokens_total", "counter", "Tokens generated.");
  value(b, "inferrt_generation_tokens_total", "", (double)st.generated_tokens);
  head(b, "inferrt_spec_draft_tokens_total", "counter",
       "Draft tokens proposed by speculative decoding (prompt lookup).");
  value(b, "inferrt_spec_draft_tokens_total", "", (double)st.spec_draft_tokens);
  head(b, "inferrt_spec_accepted_tokens_total", "counter",
       "Draft tokens that plain decoding confirmed, and that were kept.");
  value(b, "inferrt_spec_accepted_tokens_total", "", (double)st.spec_accepted_tokens);
  head(b, "inferrt_spec_step_cost_seconds", "gauge",
       "The fit drafts are weighed by: a decode step of T tokens takes base + per_token x T "
       "(0 until fitted).");
  value(b, "inferrt_spec_step_cost_seconds", "{part=\"base\"}", st.spec_step_ms / 1e3);
  value(b, "inferrt_spec_step_cost_seconds", "{part=\"per_token\"}", st.spec_token_ms / 1e3);
  head(b, "inferrt_prefix_cache_hit_rate", "gauge",
       "Cached prompt tokens / prompt tokens since start.");
  value(b, "inferrt_prefix_cache_hit_rate", "",
        st.prompt_tokens ? (double)st.cached_prompt_tokens / (double)st.prompt_tokens : 0);
  head(b, "inferrt_seqs_running", "gauge", "Sequences in the running batch.");
  value(b, "inferrt_seqs_running", "", (double)st.running);
  head(b, "inferrt_seqs_waiting", "gauge", "Sequences waiting for admission.");
  value(b, "inferrt_seqs_waiting", "", (double)st.waiting);
  head(b, "inferrt_kv_cache_usage_ratio", "gauge",
       "Fraction of KV cache blocks held by sequences.");
  value(b, "inferrt_kv_cache_usage_ratio", "",
        st.kv_blocks_total ? (double)st.kv_blocks_used / (double)st.kv_blocks_total : 0);
  head(b, "inferrt_kv_cache_blocks", "gauge",
       "KV cache blocks: total, used by sequences, cached and evictable.");
  value(b, "inferrt_kv_cache_blocks", "{state=\"total\"}", (double)st.kv_blocks_total);
  value(b, "inferrt_kv_cache_blocks", "{state=\"used\"}", (double)st.kv_blocks_used);
  value(b, "inferrt_kv_cache_blocks", "{state=\"cached\"}", (double)st.kv_blocks_cached);
  head(b, "inferrt_preemptions_total", "counter", "Sequences preempted for lack of KV blocks.");
  value(b, "inferrt_preemptions_total", "", (double)st.preemptions);
  head(b, "inferrt_engine_steps_total", "counter", "Engine steps run.");
  value(b, "inferrt_engine_steps_total", "", (double)st.steps);
  head(b, "inferrt_engine_requests_finished_total", "counter",
       "Requests the engine finished (any reason).");
  value(b, "inferrt_engine_requests_finished_total", "", (double)st.requests_finished);
}

char *srv_metrics_render(srv_metrics *m, irt_engine *e) {
  srv_buf b = {0};
  pthread_mutex_lock(&m->mu);
  put_requests(&b, m);
  put_hist(&b, "inferrt_time_to_first_token_seconds", "Time from submission to the first token.",
           &m->ttft);
  put_hist(&b, "inferrt_time_per_output_token_seconds",
           "Mean time per output token after the first, per request.", &m->tpot);
  put_hist(&b, "inferrt_e2e_request_latency_seconds", "Time from submission to the last token.",
           &m->e2e);
  head(&b, "inferrt_requests_cancelled_total", "counter",
       "Requests cancelled because their client disconnected.");
  value(&b, "inferrt_requests_cancelled_total", "", (double)m->cancelled);
  head(&b, "inferrt_http_connections_open", "gauge", "Open HTTP connections.");
  value(&b, "inferrt_http_connections_open", "", (double)m->open_connections);
  head(&b, "inferrt_http_requests_in_flight", "gauge",
       "Generations admitted and not yet answered (--max-connections bounds them).");
  value(&b, "inferrt_http_requests_in_flight", "", (double)m->in_flight);
  pthread_mutex_unlock(&m->mu);
  put_engine(&b, e);
  if (!b.p) srv_buf_put(&b, "", 0);
  return b.p;
}

void srv_metrics_done(void *cls, double ttft_s, double tpot_s, double e2e_s, bool cancelled) {
  srv_metrics_generation(cls, ttft_s, tpot_s, e2e_s);
  if (cancelled) srv_metrics_cancelled(cls);
}
