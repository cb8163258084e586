/* srv: the HTTP face of `inferrt serve` over the OpenAI layer (runtime/openai). Linked into
 * the inferrt executable only: the irt library stays free of HTTP. Modules:
 *   srv_metrics.c  Prometheus counters, gauges and histograms
 *   srv_keys.c     API keys -> tenant and priority
 *   srv_http.c     the HTTP server (libmicrohttpd, a pool of threads over epoll)
 * Threading: the metrics lock themselves. */
#ifndef IRT_SRV_H
#define IRT_SRV_H

#include "openai.h"

typedef struct srv_metrics srv_metrics;

/* The server's own calls fail with the public type: fills err (if non-NULL) with st and the
 * message, and returns st (so a caller can `return srv_errorf(...)`). */
irt_status srv_errorf(irt_error *err, irt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* --- srv_metrics.c ------------------------------------------------------------------------ */

typedef enum srv_route {
  SRV_ROUTE_COMPLETIONS,
  SRV_ROUTE_CHAT,
  SRV_ROUTE_MODELS,
  SRV_ROUTE_HEALTH,
  SRV_ROUTE_METRICS,
  SRV_ROUTE_PAGE,
  SRV_ROUTE_TOKENIZE,
  SRV_ROUTE_DETOKENIZE,
  SRV_ROUTE_OTHER,
  SRV_N_ROUTES
} srv_route;

srv_metrics *srv_metrics_create(void);
void srv_metrics_destroy(srv_metrics *m);
void srv_metrics_request(srv_metrics *m, srv_route r, int status);
/* A finished generation: ttft_s and tpot_s < 0 when not measured. */
void srv_metrics_generation(srv_metrics *m, double ttft_s, double tpot_s, double e2e_s);
/* A request ended early because its client went away. */
void srv_metrics_cancelled(srv_metrics *m);
/* Both, in the shape of srv_ctx.on_done (cls is the srv_metrics). */
void srv_metrics_done(void *cls, double ttft_s, double tpot_s, double e2e_s, bool cancelled);
void srv_metrics_connections(srv_metrics *m, int delta);
void srv_metrics_in_flight(srv_metrics *m, int delta);
/* Prometheus text exposition (version 0.0.4), engine gauges included. Caller frees. */
char *srv_metrics_render(srv_metrics *m, irt_engine *e);

/* --- srv_keys.c --------------------------------------------------------------------------- */

typedef struct srv_key {
  char *key, *tenant; /* tenant NULL: the shared prefix-cache domain */
  int priority;
} srv_key;

typedef struct srv_keys {
  srv_key *k;
  int n, cap;
} srv_keys;

irt_status srv_keys_add(srv_keys *ks, const char *key, const char *tenant, int priority);
/* Reads lines "key [tenant [priority]]" ('#' comments, blank lines); err names the line. */
irt_status srv_keys_load(srv_keys *ks, const char *path, irt_error *err);
/* The entry for key (compared in constant time per entry), or NULL. */
const srv_key *srv_keys_find(const srv_keys *ks, const char *key);
void srv_keys_free(srv_keys *ks);

/* --- srv_http.c --------------------------------------------------------------------------- */

typedef struct srv_http_opts {
  const char *host;     /* IPv4 or IPv6 address, or a name (first address used) */
  int port;             /* 0: any free port (srv_http_port tells which) */
  int max_connections;  /* generations in flight (streamed or awaited) before requests get 429 */
  int max_per_client;   /* sockets one client address may hold; 0: half of the socket limit */
  size_t max_body;      /* request bytes before 413 */
  const srv_keys *keys; /* NULL or empty: no authentication */
  srv_metrics *metrics; /* what /metrics renders (and every request records) */
  void (*log)(void *cls, const char *msg); /* libmicrohttpd's messages, one line each; may be
                                              NULL */
  void *log_cls;
} srv_http_opts;

typedef struct srv_http srv_http;

/* Starts listening; err says why not (IRT_IO: the address; IRT_OOM). */
irt_status srv_http_start(srv_ctx *c, const srv_http_opts *o, srv_http **out, irt_error *err);
int srv_http_port(const srv_http *h);
/* Ends open streams (their requests are cancelled), closes the socket, joins the threads. */
void srv_http_stop(srv_http *h);

/* The prefix cache's stored / removed blocks published on a ZeroMQ PUB socket bound to
 * endpoint ("tcp://0.0.0.0:5557"), in vLLM's KV-events format under topic (srv_kv_events.c).
 * Start it before the engine steps; stop it after the engine is destroyed. */
typedef struct srv_kv_events srv_kv_events;
irt_status srv_kv_events_start(irt_model *m, const char *endpoint, const char *topic,
                               srv_kv_events **out, irt_error *err);
void srv_kv_events_stop(srv_kv_events *k);
uint64_t srv_kv_events_dropped(srv_kv_events *k);

/* The chat page, embedded at build time from runtime/server/chat.html. */
extern const unsigned char srv_chat_html[];
extern const size_t srv_chat_html_len;

#endif
