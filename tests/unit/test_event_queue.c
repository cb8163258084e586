/* test_event_queue: irt_event_queue_* -- events copied whole (text and alternatives), popped
 * oldest first in batches of at most cap, valid until the next pop; timeouts, wake, bad
 * arguments, and a producer thread racing the consumer (under ASan and TSan-like stress:
 * every event arrives once, in order). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "inferrt.h"
#include "tcheck.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void push_n(irt_event_queue *q, uint64_t id, int i) {
  char text[32];
  int n = snprintf(text, sizeof text, "tok%d", i);
  int32_t tops[3] = {i, i + 1, i + 2};
  float lps[3] = {-0.5f, -1.5f, -2.5f};
  irt_event ev = {.id = id,
                  .index = i % 3,
                  .token = i,
                  .logprob = -0.25f * (float)i,
                  .text = text,
                  .text_len = (size_t)n,
                  .finish = IRT_FINISH_NONE,
                  .n_top = i % 4,
                  .top_tokens = tops,
                  .top_logprobs = lps};
  irt_event_queue_push(q, &ev);
  memset(text, 'X', sizeof text); /* the queue holds its own copy */
  tops[0] = -7;
}

static int check_event(const irt_event *ev, uint64_t id, int i) {
  char want[32];
  snprintf(want, sizeof want, "tok%d", i);
  int ok = ev->id == id && ev->token == i && ev->index == i % 3 && ev->text &&
           ev->text_len == strlen(want) && memcmp(ev->text, want, ev->text_len) == 0 &&
           ev->text[ev->text_len] == '\0' && ev->n_top == i % 4;
  for (int k = 0; ok && k < ev->n_top; k++) ok = ev->top_tokens[k] == i + k;
  return ok;
}

typedef struct producer {
  irt_event_queue *q;
  int n;
} producer;

static void *produce(void *arg) {
  producer *p = arg;
  for (int i = 0; i < p->n; i++) push_n(p->q, 9, i);
  return NULL;
}

int main(void) {
  irt_error err = {0};
  irt_event_queue *q = NULL;
  CHECK(irt_event_queue_create(&q, &err) == IRT_OK && q);
  irt_event evs[8];

  /* empty: a zero timeout returns at once, a short one after about that long */
  CHECK(irt_event_queue_pop(q, evs, 8, 0, &err) == 0);
  double t = now_ms();
  CHECK(irt_event_queue_pop(q, evs, 8, 50, &err) == 0);
  double waited = now_ms() - t;
  CHECKF(waited >= 40 && waited < 2000, "waited %.1f ms", waited);

  /* order, batches of cap, copies that outlive the pushed buffers */
  for (int i = 0; i < 20; i++) push_n(q, 5, i);
  CHECK(irt_event_queue_size(q) == 20);
  int seen = 0;
  static const int want_n[3] = {8, 8, 4};
  for (int round = 0; round < 3; round++) {
    int n = irt_event_queue_pop(q, evs, 8, -1, &err);
    CHECKF(n == want_n[round], "round %d: %d events", round, n);
    for (int k = 0; k < n; k++) CHECKF(check_event(&evs[k], 5, seen + k), "event %d", seen + k);
    seen += n > 0 ? n : 0;
  }
  CHECK(seen == 20 && irt_event_queue_size(q) == 0);

  /* an event without text or alternatives stays so */
  irt_event bare = {.id = 3, .token = -1, .finish = IRT_FINISH_STOP, .request_done = true};
  irt_event_queue_push(q, &bare);
  CHECK(irt_event_queue_pop(q, evs, 8, 0, &err) == 1 && evs[0].text == NULL &&
        evs[0].top_tokens == NULL && evs[0].request_done && evs[0].finish == IRT_FINISH_STOP);

  /* wake: a waiting pop returns 0 at once; an empty text is "" */
  irt_event_queue_wake(q);
  t = now_ms();
  CHECK(irt_event_queue_pop(q, evs, 8, -1, &err) == 0);
  CHECK(now_ms() - t < 1000);
  irt_event empty = {.id = 4, .token = 1, .text = "", .text_len = 0};
  irt_event_queue_push(q, &empty);
  CHECK(irt_event_queue_pop(q, evs, 8, 0, &err) == 1 && evs[0].text && evs[0].text[0] == '\0');

  /* bad arguments */
  CHECK(irt_event_queue_pop(q, NULL, 8, 0, &err) == -1 && err.status == IRT_INVALID_ARG);
  CHECK(irt_event_queue_pop(q, evs, 0, 0, &err) == -1 && strstr(err.msg, "capacity"));
  CHECK(irt_event_queue_pop(NULL, evs, 8, 0, &err) == -1);
  CHECK(irt_event_queue_create(NULL, &err) == IRT_INVALID_ARG);
  irt_event_queue_push(NULL, &empty); /* ignored */
  irt_event_queue_push(q, NULL);
  CHECK(irt_event_queue_size(q) == 0);

  /* a producer thread racing the consumer: all arrive, once, in order */
  enum { N = 200000 };
  producer p = {q, N};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, produce, &p) == 0);
  int next = 0, bad = 0;
  irt_event big[256];
  while (next < N) {
    int n = irt_event_queue_pop(q, big, 256, 1000, &err);
    if (n <= 0) {
      bad += n < 0;
      if (n < 0) break;
      continue;
    }
    for (int k = 0; k < n; k++) bad += !check_event(&big[k], 9, next + k);
    next += n;
  }
  pthread_join(th, NULL);
  CHECKF(next == N && bad == 0, "got %d of %d, %d bad", next, N, bad);

  /* destroy with events still queued and lent frees them (ASan's leak check) */
  for (int i = 0; i < 5; i++) push_n(q, 1, i);
  CHECK(irt_event_queue_pop(q, evs, 2, 0, &err) == 2);
  irt_event_queue_destroy(q);
  irt_event_queue_destroy(NULL);

  /* the binding's layout check: every public struct has a size, others none */
  CHECK(irt_struct_size("irt_event") == sizeof(irt_event));
  CHECK(irt_struct_size("irt_request") == sizeof(irt_request));
  CHECK(irt_struct_size("irt_nothing") == 0 && irt_struct_size(NULL) == 0);
  CHECK(strcmp(irt_version(), IRT_VERSION) == 0);
  return tcheck_done("event_queue");
}
