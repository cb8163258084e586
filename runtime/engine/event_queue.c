/* event_queue: engine events copied for a consumer thread that is not the engine's (see
 * irt_event_queue_* in inferrt.h). Each event is one allocation holding the irt_event, its
 * text and its alternatives; the queue is a FIFO list of them under one lock. A pop hands
 * out the events' structs and keeps their nodes until the next pop, so the pointers inside
 * stay valid while the consumer reads them. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "ir_alloc.h"

typedef struct evnode {
  struct evnode *next;
  irt_event ev; /* pointers into the bytes after this node */
} evnode;

struct irt_event_queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  evnode *head, *tail; /* waiting */
  evnode *lent;        /* handed out by the last pop */
  int64_t n;
  bool lost, woken;
};

static void free_list(evnode *p) {
  while (p) {
    evnode *next = p->next;
    ir_free(p);
    p = next;
  }
}

irt_status irt_event_queue_create(irt_event_queue **out, irt_error *err) {
  if (!out) {
    if (err) err->status = IRT_INVALID_ARG, snprintf(err->msg, sizeof err->msg, "out is NULL");
    return IRT_INVALID_ARG;
  }
  irt_event_queue *q = ir_calloc(1, sizeof *q);
  if (!q) {
    if (err) err->status = IRT_OOM, snprintf(err->msg, sizeof err->msg, "out of memory");
    return IRT_OOM;
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, &ca);
  pthread_condattr_destroy(&ca);
  *out = q;
  return IRT_OK;
}

void irt_event_queue_destroy(irt_event_queue *q) {
  if (!q) return;
  free_list(q->head);
  free_list(q->lent);
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->cv);
  ir_free(q);
}

void irt_event_queue_push(void *queue, const irt_event *ev) {
  irt_event_queue *q = queue;
  if (!q || !ev) return;
  int n_top = ev->n_top > 0 && ev->top_tokens && ev->top_logprobs ? ev->n_top : 0;
  size_t text_len = ev->text ? ev->text_len : 0;
  size_t bytes = sizeof(evnode) + (size_t)n_top * (sizeof(int32_t) + sizeof(float)) +
                 (ev->text ? text_len + 1 : 0);
  evnode *node = ir_malloc(bytes);
  if (node) {
    node->next = NULL;
    node->ev = *ev;
    char *p = (char *)(node + 1);
    if (n_top) {
      memcpy(p, ev->top_tokens, (size_t)n_top * sizeof(int32_t));
      node->ev.top_tokens = (const int32_t *)p;
      p += (size_t)n_top * sizeof(int32_t);
      memcpy(p, ev->top_logprobs, (size_t)n_top * sizeof(float));
      node->ev.top_logprobs = (const float *)p;
      p += (size_t)n_top * sizeof(float);
    } else {
      node->ev.n_top = 0, node->ev.top_tokens = NULL, node->ev.top_logprobs = NULL;
    }
    if (ev->text) {
      if (text_len) memcpy(p, ev->text, text_len);
      p[text_len] = '\0';
      node->ev.text = p;
    }
  }
  pthread_mutex_lock(&q->mu);
  if (!node) {
    q->lost = true;
  } else {
    if (q->tail) q->tail->next = node;
    else q->head = node;
    q->tail = node;
    q->n++;
  }
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

int irt_event_queue_pop(irt_event_queue *q, irt_event *evs, int cap, int timeout_ms,
                        irt_error *err) {
  if (!q || !evs || cap <= 0) {
    if (err)
      err->status = IRT_INVALID_ARG, snprintf(err->msg, sizeof err->msg, "event queue pop: %s",
                                              !q     ? "no queue"
                                              : !evs ? "no buffer"
                                                     : "capacity must be positive");
    return -1;
  }
  pthread_mutex_lock(&q->mu);
  free_list(q->lent); /* the last pop's events: the consumer is done with them */
  q->lent = NULL;
  if (!q->head && !q->lost && !q->woken && timeout_ms != 0) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    if (timeout_ms > 0) {
      until.tv_sec += timeout_ms / 1000;
      until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
      if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    }
    while (!q->head && !q->lost && !q->woken) {
      if (timeout_ms < 0) pthread_cond_wait(&q->cv, &q->mu);
      else if (pthread_cond_timedwait(&q->cv, &q->mu, &until) == ETIMEDOUT) break;
    }
  }
  q->woken = false;
  if (q->lost) {
    pthread_mutex_unlock(&q->mu);
    if (err)
      err->status = IRT_OOM,
      snprintf(err->msg, sizeof err->msg, "event queue: out of memory, an event was lost");
    return -1;
  }
  int k = 0;
  evnode *last = NULL;
  for (evnode *p = q->head; p && k < cap; p = p->next) evs[k++] = p->ev, last = p;
  if (last) {
    q->lent = q->head;
    q->head = last->next;
    last->next = NULL;
    if (!q->head) q->tail = NULL;
    q->n -= k;
  }
  pthread_mutex_unlock(&q->mu);
  return k;
}

void irt_event_queue_wake(irt_event_queue *q) {
  if (!q) return;
  pthread_mutex_lock(&q->mu);
  q->woken = true;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

int64_t irt_event_queue_size(irt_event_queue *q) {
  if (!q) return 0;
  pthread_mutex_lock(&q->mu);
  int64_t n = q->n;
  pthread_mutex_unlock(&q->mu);
  return n;
}
