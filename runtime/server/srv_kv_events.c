/* srv_kv_events: the prefix cache's events on a ZeroMQ PUB socket, in vLLM's KV-events
 * format, so that KV-aware routers (llm-d, NVIDIA Dynamo) route requests to the replica
 * holding their prefix.
 *
 * Each message is three frames: the topic, a sequence number (8 bytes, big-endian, +1 a
 * message), and a msgpack payload [ts, [event, ...]] (ts: seconds since the epoch, a
 * float). An event is an array whose first element names its type:
 *   ["BlockStored", [block_hash], parent_hash or nil, [token ids], block_size, nil, nil]
 *   ["BlockRemoved", [block_hash], nil]
 * (the nils are vLLM's lora_id and medium). The model's callback runs on the engine's
 * thread and only appends to a queue; a publisher thread sends what has queued every few
 * milliseconds, one message a batch. A subscriber that falls behind loses messages at the
 * socket (ZeroMQ's high-water mark), never stalls the engine; the queue itself is bounded
 * and counts what it drops. */
#include <msgpack.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "srv.h"

enum { KV_QUEUE_MAX = 1 << 20 }; /* events held between two sends, at most */

typedef struct kv_rec {
  uint64_t hash, parent;
  int32_t kind;
  int32_t n_tok;
  int32_t *tokens; /* stored: a copy of the block's tokens */
} kv_rec;

struct srv_kv_events {
  irt_model *m;
  void *zctx, *sock;
  char topic[128];
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  kv_rec *q; /* (n, cap) */
  size_t n, cap;
  uint64_t seq, dropped;
  bool stop, started;
};

static void on_kv_event(void *user, const irt_kv_event *ev) {
  srv_kv_events *k = user;
  int32_t n = ev->kind == IRT_KV_BLOCK_STORED ? (int32_t)ev->block_size : 0;
  int32_t *tok = n ? malloc((size_t)n * sizeof *tok) : NULL;
  if (n && tok) memcpy(tok, ev->tokens, (size_t)n * sizeof *tok);
  pthread_mutex_lock(&k->mu);
  if (k->n == k->cap && k->cap < KV_QUEUE_MAX) {
    size_t cap = k->cap ? k->cap * 2 : 256;
    kv_rec *q = realloc(k->q, cap * sizeof *q);
    if (q) k->q = q, k->cap = cap;
  }
  if (k->n < k->cap && (tok || !n)) {
    k->q[k->n++] = (kv_rec){.hash = ev->block_hash,
                            .parent = ev->parent_hash,
                            .kind = (int32_t)ev->kind,
                            .n_tok = n,
                            .tokens = tok};
    tok = NULL;
  } else {
    k->dropped++;
  }
  pthread_cond_signal(&k->cv);
  pthread_mutex_unlock(&k->mu);
  free(tok);
}

static void pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

/* One batch: [ts, [events]]. */
static void pack_batch(msgpack_sbuffer *sb, const kv_rec *q, size_t n) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  msgpack_pack_array(&pk, 2);
  msgpack_pack_double(&pk, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) {
    const kv_rec *r = &q[i];
    bool stored = r->kind == IRT_KV_BLOCK_STORED;
    msgpack_pack_array(&pk, stored ? 7 : 3);
    pack_str(&pk, stored ? "BlockStored" : "BlockRemoved");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint64(&pk, r->hash);
    if (!stored) {
      msgpack_pack_nil(&pk); /* medium */
      continue;
    }
    if (r->parent) msgpack_pack_uint64(&pk, r->parent);
    else msgpack_pack_nil(&pk);
    msgpack_pack_array(&pk, (size_t)r->n_tok);
    for (int32_t t = 0; t < r->n_tok; t++) msgpack_pack_int32(&pk, r->tokens[t]);
    msgpack_pack_int64(&pk, r->n_tok);
    msgpack_pack_nil(&pk); /* lora_id */
    msgpack_pack_nil(&pk); /* medium */
  }
}

static void send_batch(srv_kv_events *k, const kv_rec *q, size_t n) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  pack_batch(&sb, q, n);
  uint8_t seq[8];
  for (int i = 0; i < 8; i++) seq[i] = (uint8_t)(k->seq >> (56 - 8 * i));
  k->seq++;
  zmq_send(k->sock, k->topic, strlen(k->topic), ZMQ_SNDMORE);
  zmq_send(k->sock, seq, sizeof seq, ZMQ_SNDMORE);
  zmq_send(k->sock, sb.data, sb.size, 0);
  msgpack_sbuffer_destroy(&sb);
}

static void *publisher(void *arg) {
  srv_kv_events *k = arg;
  pthread_mutex_lock(&k->mu);
  for (;;) {
    while (!k->stop && !k->n) pthread_cond_wait(&k->cv, &k->mu);
    if (!k->n && k->stop) break;
    pthread_mutex_unlock(&k->mu);
    struct timespec pause = {0, 5 * 1000 * 1000}; /* let a step's events gather */
    nanosleep(&pause, NULL);
    pthread_mutex_lock(&k->mu);
    kv_rec *q = k->q;
    size_t n = k->n;
    k->q = NULL, k->n = k->cap = 0;
    pthread_mutex_unlock(&k->mu);
    if (n) send_batch(k, q, n);
    for (size_t i = 0; i < n; i++) free(q[i].tokens);
    free(q);
    pthread_mutex_lock(&k->mu);
  }
  pthread_mutex_unlock(&k->mu);
  return NULL;
}

irt_status srv_kv_events_start(irt_model *m, const char *endpoint, const char *topic,
                               srv_kv_events **out, irt_error *err) {
  *out = NULL;
  srv_kv_events *k = calloc(1, sizeof *k);
  if (!k) return *err = (irt_error){.status = IRT_OOM, .msg = "out of memory"}, IRT_OOM;
  k->m = m;
  snprintf(k->topic, sizeof k->topic, "%s", topic ? topic : "kv-events");
  pthread_mutex_init(&k->mu, NULL);
  pthread_cond_init(&k->cv, NULL);
  int linger = 0;
  k->zctx = zmq_ctx_new();
  k->sock = k->zctx ? zmq_socket(k->zctx, ZMQ_PUB) : NULL;
  if (!k->sock || zmq_setsockopt(k->sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
      zmq_bind(k->sock, endpoint) != 0) {
    err->status = IRT_IO;
    snprintf(err->msg, sizeof err->msg, "--kv-events %s: %s", endpoint, zmq_strerror(zmq_errno()));
    srv_kv_events_stop(k);
    return IRT_IO;
  }
  if (pthread_create(&k->th, NULL, publisher, k) != 0) {
    *err = (irt_error){.status = IRT_IO, .msg = "--kv-events: cannot start its thread"};
    srv_kv_events_stop(k);
    return IRT_IO;
  }
  k->started = true;
  irt_model_set_kv_events(m, on_kv_event, k);
  *out = k;
  return IRT_OK;
}

void srv_kv_events_stop(srv_kv_events *k) {
  if (!k) return;
  if (k->started) {
    irt_model_set_kv_events(k->m, NULL, NULL);
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->th, NULL);
  }
  for (size_t i = 0; i < k->n; i++) free(k->q[i].tokens);
  free(k->q);
  if (k->sock) zmq_close(k->sock);
  if (k->zctx) zmq_ctx_term(k->zctx);
  pthread_mutex_destroy(&k->mu);
  pthread_cond_destroy(&k->cv);
  free(k);
}

uint64_t srv_kv_events_dropped(srv_kv_events *k) {
  if (!k) return 0;
  pthread_mutex_lock(&k->mu);
  uint64_t n = k->dropped;
  pthread_mutex_unlock(&k->mu);
  return n;
}
