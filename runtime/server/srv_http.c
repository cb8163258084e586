/* srv_http: the HTTP face of the server on libmicrohttpd, event-driven: a small pool of
 * threads polls every connection (epoll), so a connection costs a socket, not a thread, and
 * one client that opens hundreds of slow connections cannot lock the others out (each client
 * address holds at most a share of the sockets, and a connection idle for HTTP_IDLE_S is
 * closed). A generation in flight never blocks a pool thread: while its job has no news the
 * connection is suspended, and the engine's next event resumes it (srv_job_park).
 * Routes: POST /v1/completions, POST /v1/chat/completions (JSON or an SSE stream),
 * GET /v1/models[/{id}], /health, /metrics, / (the embedded chat page). Every refusal is an
 * OpenAI error object with its status: 400 bad request, 401 key, 404 route or model,
 * 405 method, 413 body, 429 overload (with Retry-After), 503 shutting down. Admission counts
 * generations in flight, not sockets: up to max_connections are served, only the excess is
 * refused. A watcher thread polls the sockets of the generations in flight, so a client that
 * goes away (even while its connection is suspended) cancels its request at once. */
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>

#include "srv.h"

#define WATCH_SLICE_MS 100 /* how often the watcher looks at the sockets of generations */
#define HTTP_IDLE_S 30u    /* a connection that moves no byte for this long is closed */
#define HTTP_POOL 4u       /* threads polling the connections */

typedef struct gen gen;

struct srv_http {
  struct MHD_Daemon *d;
  srv_ctx *c;
  srv_http_opts o;
  atomic_bool stopping;
  int port;
  atomic_int inflight;  /* generations admitted and not yet answered */
  atomic_int suspended; /* connections suspended on a job */
  pthread_mutex_t mu;   /* guards gens */
  gen *gens;            /* the generations in flight (the watcher's list) */
  uint64_t next_gen;
  pthread_t watcher;
  bool watching;
  atomic_bool watch_stop;
};

/* One generation in flight on a connection, from admission to the end of its response:
 * in the watcher's list while it holds its job. A plain (non-streamed) response's belongs to
 * the request state; a stream's to its response (freed by stream_free). */
struct gen {
  srv_http *h;
  struct MHD_Connection *conn;
  srv_job *job;
  int fd;
  uint64_t id;
  srv_buf out;   /* a stream's chunks not yet sent */
  bool complete; /* the stream's last chunk is in out */
  gen *prev, *next;
};

/* Per-request state (MHD's con_cls). */
typedef struct conn_req {
  srv_route route;
  srv_buf body;
  bool too_large;
  gen *plain; /* a non-streamed generation the handler waits on (suspended) */
} conn_req;

static srv_route route_of(const char *url) {
  if (!strcmp(url, "/v1/completions")) return SRV_ROUTE_COMPLETIONS;
  if (!strcmp(url, "/v1/chat/completions")) return SRV_ROUTE_CHAT;
  if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) return SRV_ROUTE_MODELS;
  if (!strcmp(url, "/health")) return SRV_ROUTE_HEALTH;
  if (!strcmp(url, "/metrics")) return SRV_ROUTE_METRICS;
  if (!strcmp(url, "/") || !strcmp(url, "/index.html")) return SRV_ROUTE_PAGE;
  if (!strcmp(url, "/tokenize")) return SRV_ROUTE_TOKENIZE;
  if (!strcmp(url, "/detokenize")) return SRV_ROUTE_DETOKENIZE;
  return SRV_ROUTE_OTHER;
}

/* The routes that take a POST body (the others are GET). */
static bool posted(srv_route r) {
  return r == SRV_ROUTE_COMPLETIONS || r == SRV_ROUTE_CHAT || r == SRV_ROUTE_TOKENIZE ||
         r == SRV_ROUTE_DETOKENIZE;
}

static int conn_fd(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? ci->connect_fd : -1;
}

/* --- replies ------------------------------------------------------------------------------- */

static enum MHD_Result send_body(srv_http *h, struct MHD_Connection *conn, conn_req *r, int status,
                                 const char *type, const void *data, size_t len, bool copy) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(
      len, (void *)data, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (status == 429 || status == 503)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  if (status == 405)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, posted(r->route) ? "POST" : "GET");
  if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  enum MHD_Result ok = MHD_queue_response(conn, (unsigned)status, resp);
  MHD_destroy_response(resp);
  srv_metrics_request(h->o.metrics, r->route, status);
  return ok;
}

static enum MHD_Result send_json(srv_http *h, struct MHD_Connection *conn, conn_req *r, int status,
                                 cJSON *o) {
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!s) return MHD_NO;
  enum MHD_Result ok = send_body(h, conn, r, status, "application/json", s, strlen(s), true);
  free(s);
  return ok;
}

static enum MHD_Result send_error(srv_http *h, struct MHD_Connection *conn, conn_req *r,
                                  const srv_error *e) {
  char *s = srv_render_error(e);
  if (!s) return MHD_NO;
  enum MHD_Result ok = send_body(h, conn, r, e->status, "application/json", s, strlen(s), true);
  free(s);
  return ok;
}

static enum MHD_Result fail(srv_http *h, struct MHD_Connection *conn, conn_req *r, int status,
                            const char *type, const char *code, const char *msg) {
  srv_error e;
  srv_fail(&e, status, type, code, NULL, "%s", msg);
  return send_error(h, conn, r, &e);
}

/* --- small endpoints ------------------------------------------------------------------------ */

static cJSON *model_object(const srv_ctx *c) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", c->model_name);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", (double)c->created);
  cJSON_AddStringToObject(m, "owned_by", "inferrt");
  cJSON_AddNumberToObject(m, "max_model_len", (double)c->info->context_length);
  return m;
}

static enum MHD_Result models(srv_http *h, struct MHD_Connection *conn, conn_req *r,
                              const char *url) {
  if (!strncmp(url, "/v1/models/", 11)) {
    char msg[320];
    snprintf(msg, sizeof msg, "The model '%.200s' does not exist.", url + 11);
    if (strcmp(url + 11, h->c->model_name))
      return fail(h, conn, r, 404, "invalid_request_error", "model_not_found", msg);
    return send_json(h, conn, r, 200, model_object(h->c));
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_object(h->c));
  return send_json(h, conn, r, 200, o);
}

static enum MHD_Result metrics(srv_http *h, struct MHD_Connection *conn, conn_req *r) {
  char *s = srv_metrics_render(h->o.metrics, h->c->e);
  if (!s) return MHD_NO;
  enum MHD_Result ok =
      send_body(h, conn, r, 200, "text/plain; version=0.0.4; charset=utf-8", s, strlen(s), true);
  free(s);
  return ok;
}

/* --- generations in flight ------------------------------------------------------------------ */

/* Admits one generation: false (refuse with 429) past max_connections in flight. */
static bool admit(srv_http *h) {
  if (atomic_fetch_add(&h->inflight, 1) < h->o.max_connections) {
    srv_metrics_in_flight(h->o.metrics, 1);
    return true;
  }
  atomic_fetch_sub(&h->inflight, 1);
  return false;
}

static void unadmit(srv_http *h) {
  srv_metrics_in_flight(h->o.metrics, -1);
  atomic_fetch_sub(&h->inflight, 1);
}

static gen *gen_create(srv_http *h, struct MHD_Connection *conn, srv_job *j) {
  gen *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  *g = (gen){.h = h, .conn = conn, .job = j, .fd = conn_fd(conn)};
  pthread_mutex_lock(&h->mu);
  g->id = ++h->next_gen;
  g->next = h->gens;
  if (h->gens) h->gens->prev = g;
  h->gens = g;
  pthread_mutex_unlock(&h->mu);
  return g;
}

/* Ends a generation: cancels its job unless it finished, lets go of it, frees the slot. */
static void gen_free(gen *g, bool finished) {
  srv_http *h = g->h;
  pthread_mutex_lock(&h->mu);
  if (g->prev) g->prev->next = g->next;
  else h->gens = g->next;
  if (g->next) g->next->prev = g->prev;
  pthread_mutex_unlock(&h->mu);
  if (!finished) srv_job_cancel(g->job);
  srv_job_release(g->job);
  srv_buf_free(&g->out);
  free(g);
  unadmit(h);
}

/* srv_job_park's park and wake, both under the job's lock: a wake never precedes its park. */
static void gen_park(void *cls) {
  gen *g = cls;
  atomic_fetch_add(&g->h->suspended, 1);
  MHD_suspend_connection(g->conn);
}

static void gen_wake(void *cls) {
  gen *g = cls;
  MHD_resume_connection(g->conn);
  atomic_fetch_sub(&g->h->suspended, 1);
}

static bool job_cancelled(srv_job *j) {
  pthread_mutex_lock(&j->mu);
  bool c = j->cancelled;
  pthread_mutex_unlock(&j->mu);
  return c;
}

/* Polls the sockets of the generations in flight: a client that closed its end cancels its
 * request (its connection may be suspended, where MHD itself sees nothing). */
static void *watch(void *arg) {
  srv_http *h = arg;
  struct pollfd *fds = NULL;
  uint64_t *ids = NULL;
  size_t cap = 0;
  while (!atomic_load(&h->watch_stop)) {
    size_t n = 0;
    pthread_mutex_lock(&h->mu);
    for (gen *g = h->gens; g; g = g->next) {
      if (n == cap) {
        size_t c2 = cap ? 2 * cap : 64;
        struct pollfd *f2 = realloc(fds, c2 * sizeof *f2);
        if (f2) fds = f2;
        uint64_t *i2 = f2 ? realloc(ids, c2 * sizeof *i2) : NULL;
        if (i2) ids = i2;
        if (!f2 || !i2) break; /* out of memory: watch the ones listed so far */
        cap = c2;
      }
      if (g->fd >= 0) fds[n] = (struct pollfd){.fd = g->fd, .events = POLLRDHUP}, ids[n++] = g->id;
    }
    pthread_mutex_unlock(&h->mu);
    if (n == 0 || poll(fds, n, WATCH_SLICE_MS) <= 0) {
      if (n == 0) poll(NULL, 0, WATCH_SLICE_MS);
      continue;
    }
    pthread_mutex_lock(&h->mu); /* a generation still listed holds its job */
    for (size_t i = 0; i < n; i++) {
      if (!(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) continue;
      for (gen *g = h->gens; g; g = g->next)
        if (g->id == ids[i]) srv_job_cancel(g->job);
    }
    pthread_mutex_unlock(&h->mu);
    poll(NULL, 0, WATCH_SLICE_MS / 4); /* a cancelled one stays listed until its last event */
  }
  free(fds);
  free(ids);
  return NULL;
}

/* --- generation ------------------------------------------------------------------------------ */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  gen *g = cls;
  for (;;) {
    if (g->out.off < g->out.len) {
      size_t n = g->out.len - g->out.off < max ? g->out.len - g->out.off : max;
      memcpy(buf, g->out.p + g->out.off, n);
      g->out.off += n;
      if (g->out.off == g->out.len) g->out.off = g->out.len = 0;
      return (ssize_t)n;
    }
    if (g->complete) return MHD_CONTENT_READER_END_OF_STREAM;
    if (atomic_load(&g->h->stopping) || job_cancelled(g->job))
      return MHD_CONTENT_READER_END_WITH_ERROR; /* stream_free cancels the job */
    bool done;
    if (srv_job_park(g->job, gen_park, gen_wake, g, &done)) return 0; /* resumed at news */
    g->complete = srv_render_stream(g->job, &g->out);
  }
}

static void stream_free(void *cls) {
  gen *g = cls;
  gen_free(g, g->complete); /* not complete: the client went away mid-stream */
}

static enum MHD_Result start_stream(srv_http *h, struct MHD_Connection *conn, conn_req *r, gen *g) {
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, g, stream_free);
  if (!resp) {
    gen_free(g, false);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  enum MHD_Result ok = MHD_queue_response(conn, 200, resp);
  MHD_destroy_response(resp); /* the generation is freed through stream_free */
  srv_metrics_request(h->o.metrics, r->route, 200);
  return ok;
}

/* A non-streamed job: suspends the connection until the job is done (the handler is called
 * again at each resume), then answers; MHD_NO closes a connection whose client went away. */
static enum MHD_Result finish_plain(srv_http *h, struct MHD_Connection *conn, conn_req *r) {
  gen *g = r->plain;
  bool done = false;
  while (!done)
    if (srv_job_park(g->job, gen_park, gen_wake, g, &done)) return MHD_YES;
  srv_job *j = g->job;
  if (atomic_load(&h->stopping) || job_cancelled(j)) return MHD_NO; /* on_completed frees g */
  enum MHD_Result ok;
  if (j->failed) {
    srv_error e;
    srv_fail(&e, 500, "server_error", NULL, NULL,
             "The engine failed while generating this response.");
    ok = send_error(h, conn, r, &e);
  } else {
    ok = send_json(h, conn, r, 200, srv_render_response(j));
  }
  r->plain = NULL;
  gen_free(g, true);
  return ok;
}

static enum MHD_Result generate(srv_http *h, struct MHD_Connection *conn, conn_req *r,
                                const srv_key *key) {
  if (atomic_load(&h->stopping))
    return fail(h, conn, r, 503, "server_error", "shutting_down", "The server is shutting down.");
  if (!admit(h))
    return fail(h, conn, r, 429, "rate_limit_error", "rate_limit_exceeded",
                "The server is at capacity (requests in flight); retry after a short wait.");
  srv_params p;
  srv_error e;
  srv_endpoint ep = r->route == SRV_ROUTE_CHAT ? SRV_CHAT : SRV_COMPLETIONS;
  srv_job *j = NULL;
  if (srv_params_parse(h->c, ep, r->body.p ? r->body.p : "", r->body.len, &p, &e)) {
    if (key) p.tenant = key->tenant, p.priority = key->priority;
    bool stream_it = p.stream;
    if ((j = srv_job_submit(h->c, &p, &e)) == NULL) srv_params_free(&p);
    gen *g = j ? gen_create(h, conn, j) : NULL;
    if (g) {
      if (stream_it) return start_stream(h, conn, r, g);
      r->plain = g;
      return finish_plain(h, conn, r);
    }
    if (j) { /* no memory for its bookkeeping */
      srv_job_cancel(j);
      srv_job_release(j);
      srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
    }
  }
  unadmit(h);
  return send_error(h, conn, r, &e);
}

/* /tokenize, /detokenize (srv_params.c). */
static enum MHD_Result tokens(srv_http *h, struct MHD_Connection *conn, conn_req *r) {
  srv_error e;
  const char *body = r->body.p ? r->body.p : "";
  cJSON *o = r->route == SRV_ROUTE_TOKENIZE ? srv_tokenize(h->c, body, r->body.len, &e)
                                            : srv_detokenize(h->c, body, r->body.len, &e);
  return o ? send_json(h, conn, r, 200, o) : send_error(h, conn, r, &e);
}

/* --- dispatch -------------------------------------------------------------------------------- */

/* NULL key with *ok true: no keys configured. */
static const srv_key *authenticate(srv_http *h, struct MHD_Connection *conn, bool *ok) {
  *ok = true;
  if (!h->o.keys || h->o.keys->n == 0) return NULL;
  const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  const srv_key *k = a && !strncasecmp(a, "Bearer ", 7) ? srv_keys_find(h->o.keys, a + 7) : NULL;
  *ok = k != NULL;
  return k;
}

static enum MHD_Result dispatch(srv_http *h, struct MHD_Connection *conn, conn_req *r,
                                const char *url, const char *method) {
  bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
  char msg[320];
  if (r->route == SRV_ROUTE_OTHER) {
    snprintf(msg, sizeof msg, "Unknown request URL: %.16s %.200s.", method, url);
    return fail(h, conn, r, 404, "invalid_request_error", "unknown_url", msg);
  }
  bool is_api = posted(r->route) || r->route == SRV_ROUTE_MODELS;
  bool authed = true;
  const srv_key *key = is_api ? authenticate(h, conn, &authed) : NULL;
  if (!authed)
    return fail(h, conn, r, 401, "invalid_request_error", "invalid_api_key",
                MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION)
                    ? "Incorrect API key provided."
                    : "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.");
  if (posted(r->route) ? !post : !get) {
    snprintf(msg, sizeof msg, "Method %.16s is not allowed for %.200s.", method, url);
    return fail(h, conn, r, 405, "invalid_request_error", "method_not_allowed", msg);
  }
  if (r->too_large) {
    snprintf(msg, sizeof msg, "The request body exceeds the limit of %zu bytes.", h->o.max_body);
    return fail(h, conn, r, 413, "invalid_request_error", "request_too_large", msg);
  }
  switch (r->route) {
  case SRV_ROUTE_PAGE:
    return send_body(h, conn, r, 200, "text/html; charset=utf-8", srv_chat_html, srv_chat_html_len,
                     false);
  case SRV_ROUTE_HEALTH:
    return send_body(h, conn, r, 200, "application/json", "{\"status\":\"ok\"}", 15, false);
  case SRV_ROUTE_METRICS: return metrics(h, conn, r);
  case SRV_ROUTE_MODELS: return models(h, conn, r, url);
  case SRV_ROUTE_TOKENIZE:
  case SRV_ROUTE_DETOKENIZE: return tokens(h, conn, r);
  default: return generate(h, conn, r, key);
  }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  srv_http *h = cls;
  conn_req *r = *con_cls;
  if (r && r->plain) return finish_plain(h, conn, r); /* resumed: the job has news */
  if (!r) {                                           /* headers only so far */
    if (!(r = calloc(1, sizeof *r))) return MHD_NO;
    *con_cls = r;
    r->route = route_of(url);
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    r->too_large = cl && strtoull(cl, NULL, 10) > h->o.max_body;
    if (r->too_large) return dispatch(h, conn, r, url, method); /* refuse before the body */
    return MHD_YES;
  }
  if (*upload_size) { /* body bytes: kept up to the limit, then counted as too large */
    bool keep = !r->too_large && posted(r->route);
    if (keep && r->body.len + *upload_size > h->o.max_body) r->too_large = true, keep = false;
    if (keep && !srv_buf_put(&r->body, upload, *upload_size)) return MHD_NO;
    *upload_size = 0;
    return MHD_YES;
  }
  return dispatch(h, conn, r, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  conn_req *r = *con_cls;
  if (!r) return;
  if (r->plain) gen_free(r->plain, false); /* closed before its answer: the job is cancelled */
  srv_buf_free(&r->body);
  free(r);
  *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
  srv_http *h = cls;
  srv_metrics_connections(h->o.metrics, code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

/* MHD's own messages, less the ones every client disconnect produces (we end such
 * responses on purpose). */
static void on_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (strstr(msg, "application error") || strstr(msg, "Application reported internal error") ||
      strstr(msg, "closed by remote side with incomplete request")) /* one per slow client */
    return;
  size_t n = strlen(msg);
  if (n && msg[n - 1] == '\n') msg[n - 1] = '\0';
  srv_http *h = cls;
  if (h->o.log) h->o.log(h->o.log_cls, msg);
}

/* The first address of host (a number, or a name such as localhost). */
static irt_status resolve(const char *host, int port, struct sockaddr_storage *out,
                          irt_error *err) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE},
                  *ai = NULL;
  int rc = getaddrinfo(host, NULL, &hints, &ai);
  if (rc != 0 || !ai)
    return srv_errorf(err, IRT_IO, "--host '%s': %s", host, rc ? gai_strerror(rc) : "no address");
  memset(out, 0, sizeof *out);
  memcpy(out, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (out->ss_family == AF_INET6) ((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
  else ((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
  return IRT_OK;
}

/* Sockets the daemon may hold: four per generation admitted (clients that retry, /health,
 * /metrics), at least 1024, within the process's file limit (raised to its hard limit). */
static unsigned socket_limit(const srv_http_opts *o) {
  struct rlimit rl;
  rlim_t have = 1024;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > 65536 ? 65536 : rl.rlim_max;
      if (want > rl.rlim_cur) {
        rl.rlim_cur = want;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
        (void)getrlimit(RLIMIT_NOFILE, &rl);
      }
    }
    have = rl.rlim_cur == RLIM_INFINITY ? 65536 : rl.rlim_cur;
  }
  uint64_t want = 4 * (uint64_t)o->max_connections;
  if (want < 1024) want = 1024;
  uint64_t room = have > 128 ? (uint64_t)have - 64 : 64; /* the model, logs, the engine */
  return (unsigned)(want < room ? want : room);
}

irt_status srv_http_start(srv_ctx *c, const srv_http_opts *o, srv_http **out, irt_error *err) {
  struct sockaddr_storage addr;
  irt_status st = resolve(o->host, o->port, &addr, err);
  if (st != IRT_OK) return st;
  bool v6 = addr.ss_family == AF_INET6;
  srv_http *h = calloc(1, sizeof *h);
  if (!h) return srv_errorf(err, IRT_OOM, "out of memory");
  h->c = c;
  h->o = *o;
  pthread_mutex_init(&h->mu, NULL);
  unsigned sockets = socket_limit(o);
  unsigned per_client = o->max_per_client > 0 ? (unsigned)o->max_per_client : sockets / 2;
  if (per_client > sockets) per_client = sockets;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
  h->d = MHD_start_daemon(
      flags, (uint16_t)o->port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, on_log, h,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE, HTTP_POOL,
      MHD_OPTION_CONNECTION_LIMIT, sockets, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_client,
      MHD_OPTION_CONNECTION_TIMEOUT, HTTP_IDLE_S, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
  if (!h->d) {
    pthread_mutex_destroy(&h->mu);
    free(h);
    return srv_errorf(err, IRT_IO,
                      "cannot listen on %s:%d (in use, or not an address of this machine)", o->host,
                      o->port);
  }
  h->watching = pthread_create(&h->watcher, NULL, watch, h) == 0;
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : o->port;
  *out = h;
  return IRT_OK;
}

int srv_http_port(const srv_http *h) { return h->port; }

void srv_http_stop(srv_http *h) {
  if (!h) return;
  atomic_store(&h->stopping, true);
  pthread_mutex_lock(&h->mu); /* every generation in flight ends; its last event resumes it */
  for (gen *g = h->gens; g; g = g->next) srv_job_cancel(g->job);
  pthread_mutex_unlock(&h->mu);
  /* MHD must not be stopped with a connection suspended: wait for the engine's last events */
  for (int i = 0; i < 500 && atomic_load(&h->suspended) > 0; i++) poll(NULL, 0, 10);
  MHD_stop_daemon(h->d);
  if (h->watching) {
    atomic_store(&h->watch_stop, true);
    pthread_join(h->watcher, NULL);
  }
  pthread_mutex_destroy(&h->mu);
  free(h);
}

irt_status srv_errorf(irt_error *err, irt_status st, const char *fmt, ...) {
  if (!err) return st;
  err->status = st;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  return st;
}
