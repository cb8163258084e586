/* srv_http: the HTTP face of the server on libmicrohttpd, a thread per connection (bounded).
 * Routes: POST /v1/completions, POST /v1/chat/completions (JSON or an SSE stream),
 * GET /v1/models[/{id}], /health, /metrics, / (the embedded chat page). Every refusal is an
 * OpenAI error object with its status: 400 bad request, 401 key, 404 route or model,
 * 405 method, 413 body, 429 overload (with Retry-After). A connection thread that waits on a
 * generation polls its socket, so a client that goes away cancels its request at once. */
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "srv.h"

#define WAIT_SLICE_MS 50 /* how often a waiting thread looks at its socket */

struct srv_http {
  struct MHD_Daemon *d;
  srv_ctx *c;
  srv_http_opts o;
  atomic_bool stopping;
  int port;
};

/* Per-request state (MHD's con_cls). */
typedef struct conn_req {
  srv_route route;
  srv_buf body;
  bool too_large;
} conn_req;

/* The content reader of one SSE response. */
typedef struct stream {
  srv_http *h;
  srv_job *job;
  srv_buf out;
  int fd;
  bool complete; /* the last chunk is in out */
} stream;

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

/* True when the peer has closed or reset the connection. */
static bool client_gone(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
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
    MHD_add_response_header(
        resp, MHD_HTTP_HEADER_ALLOW,
        posted(r->route) ? "POST" : "GET");
  if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  enum MHD_Result ok = MHD_queue_response(conn, (unsigned)status, resp);
  MHD_destroy_response(resp);
  srv_metrics_request(h->c->metrics, r->route, status);
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
  char *s = srv_metrics_render(h->c->metrics, h->c->e);
  if (!s) return MHD_NO;
  enum MHD_Result ok =
      send_body(h, conn, r, 200, "text/plain; version=0.0.4; charset=utf-8", s, strlen(s), true);
  free(s);
  return ok;
}

/* --- generation ------------------------------------------------------------------------------ */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  stream *s = cls;
  for (;;) {
    if (s->out.off < s->out.len) {
      size_t n = s->out.len - s->out.off < max ? s->out.len - s->out.off : max;
      memcpy(buf, s->out.p + s->out.off, n);
      s->out.off += n;
      if (s->out.off == s->out.len) s->out.off = s->out.len = 0;
      return (ssize_t)n;
    }
    if (s->complete) return MHD_CONTENT_READER_END_OF_STREAM;
    if (atomic_load(&s->h->stopping) || client_gone(s->fd)) {
      srv_job_cancel(s->job);
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    srv_job_wait(s->job, WAIT_SLICE_MS);
    s->complete = srv_render_stream(s->job, &s->out);
  }
}

static void stream_free(void *cls) {
  stream *s = cls;
  if (!s->complete) srv_job_cancel(s->job); /* the client went away mid-stream */
  srv_job_release(s->job);
  srv_buf_free(&s->out);
  free(s);
}

static enum MHD_Result start_stream(srv_http *h, struct MHD_Connection *conn, conn_req *r,
                                    srv_job *j) {
  stream *s = calloc(1, sizeof *s);
  struct MHD_Response *resp = s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                                    stream_read, s, stream_free)
                                : NULL;
  if (!resp) {
    srv_job_cancel(j);
    srv_job_release(j);
    free(s);
    return MHD_NO;
  }
  *s = (stream){.h = h, .job = j, .fd = conn_fd(conn)};
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  enum MHD_Result ok = MHD_queue_response(conn, 200, resp);
  MHD_destroy_response(resp); /* the stream is freed through stream_free */
  srv_metrics_request(h->c->metrics, r->route, 200);
  return ok;
}

/* Waits for a non-streamed job, watching the client; MHD_NO closes a vanished connection. */
static enum MHD_Result finish_plain(srv_http *h, struct MHD_Connection *conn, conn_req *r,
                                    srv_job *j) {
  int fd = conn_fd(conn);
  while (!srv_job_wait(j, WAIT_SLICE_MS)) {
    if (atomic_load(&h->stopping) || client_gone(fd)) {
      srv_job_cancel(j);
      srv_job_release(j);
      return MHD_NO;
    }
  }
  enum MHD_Result ok;
  if (j->failed) {
    srv_error e;
    srv_fail(&e, 500, "server_error", NULL, NULL,
             "The engine failed while generating this response.");
    ok = send_error(h, conn, r, &e);
  } else {
    ok = send_json(h, conn, r, 200, srv_render_response(j));
  }
  srv_job_release(j);
  return ok;
}

static enum MHD_Result generate(srv_http *h, struct MHD_Connection *conn, conn_req *r,
                                const srv_key *key) {
  if (srv_metrics_open_connections(h->c->metrics) > h->o.max_connections)
    return fail(h, conn, r, 429, "rate_limit_error", "rate_limit_exceeded",
                "The server has too many open connections; retry after a short wait.");
  srv_params p;
  srv_error e;
  srv_endpoint ep = r->route == SRV_ROUTE_CHAT ? SRV_CHAT : SRV_COMPLETIONS;
  if (!srv_params_parse(h->c, ep, r->body.p ? r->body.p : "", r->body.len, &p, &e))
    return send_error(h, conn, r, &e);
  if (key) p.tenant = key->tenant, p.priority = key->priority;
  bool stream_it = p.stream;
  srv_job *j = srv_job_submit(h->c, &p, &e);
  if (!j) {
    srv_params_free(&p);
    return send_error(h, conn, r, &e);
  }
  return stream_it ? start_stream(h, conn, r, j) : finish_plain(h, conn, r, j);
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
  if (!r) { /* headers only so far */
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
  srv_buf_free(&r->body);
  free(r);
  *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
  srv_http *h = cls;
  srv_metrics_connections(h->c->metrics, code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

/* MHD's own messages, less the ones every client disconnect produces (we end such
 * responses on purpose). */
static void on_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (strstr(msg, "application error") || strstr(msg, "Application reported internal error"))
    return;
  fprintf(stderr, "inferrt: http: %s%s", msg, msg[0] && msg[strlen(msg) - 1] == '\n' ? "" : "\n");
}

/* The first address of host (a number, or a name such as localhost). */
static bool resolve(const char *host, int port, struct sockaddr_storage *out, char *msg,
                    size_t cap) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE},
                  *ai = NULL;
  int rc = getaddrinfo(host, NULL, &hints, &ai);
  if (rc != 0 || !ai) {
    snprintf(msg, cap, "--host '%s': %s", host, rc ? gai_strerror(rc) : "no address");
    return false;
  }
  memset(out, 0, sizeof *out);
  memcpy(out, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (out->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
  else
    ((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
  return true;
}

bool srv_http_start(srv_ctx *c, const srv_http_opts *o, srv_http **out, char *msg, size_t cap) {
  struct sockaddr_storage addr;
  if (!resolve(o->host, o->port, &addr, msg, cap)) return false;
  bool v6 = addr.ss_family == AF_INET6;
  srv_http *h = calloc(1, sizeof *h);
  if (!h) return snprintf(msg, cap, "out of memory"), false;
  h->c = c;
  h->o = *o;
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO |
                   MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
  h->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, h,
                          MHD_OPTION_EXTERNAL_LOGGER, on_log, h, MHD_OPTION_SOCK_ADDR,
                          (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT,
                          (unsigned)(o->max_connections + 16), MHD_OPTION_CONNECTION_TIMEOUT, 120u,
                          MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                          MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
  if (!h->d) {
    snprintf(msg, cap, "cannot listen on %s:%d (in use, or not an address of this machine)",
             o->host, o->port);
    free(h);
    return false;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : o->port;
  *out = h;
  return true;
}

int srv_http_port(const srv_http *h) { return h->port; }

void srv_http_stop(srv_http *h) {
  if (!h) return;
  atomic_store(&h->stopping, true);
  MHD_stop_daemon(h->d);
  free(h);
}
