/* preload: a plan's weights read into memory at open (irt_model_opts.preload), so that the
 * first requests do not pay a page fault per 4 KiB of weights. Each page of the opened
 * rank's block is touched once (after MADV_WILLNEED, so the kernel reads ahead); in the
 * background one thread does it while the model serves, waiting several split it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ir_alloc.h"
#include "model.h"

enum { PRELOAD_MAX_THREADS = 8 };

struct model_preload {
  const uint8_t *p;
  uint64_t n;
  atomic_bool stop;
  pthread_t th; /* the background reader (model_preload_start's result has one) */
  irt_log_fn log;
  void *log_user;
  double t0;
};

typedef struct preload_part {
  model_preload *pl;
  uint64_t lo, hi;
} preload_part;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One byte of every page of [lo, hi): the page fault brings it in. */
static void touch(model_preload *pl, uint64_t lo, uint64_t hi) {
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), span = 64u << 20;
  volatile uint8_t sink = 0;
  for (uint64_t at = lo; at < hi && !atomic_load(&pl->stop); at += span) {
    uint64_t end = at + span < hi ? at + span : hi;
    for (uint64_t i = at; i < end; i += page) sink ^= pl->p[i];
  }
  (void)sink;
}

static void *background(void *arg) {
  model_preload *pl = arg;
  touch(pl, 0, pl->n);
  if (!atomic_load(&pl->stop) && pl->log) {
    char msg[128];
    snprintf(msg, sizeof msg, "preload: %.2f GB of weights resident after %.1f s",
             (double)pl->n / 1e9, now_s() - pl->t0);
    pl->log(pl->log_user, IRT_LOG_INFO, msg);
  }
  return NULL;
}

static void *part(void *arg) {
  preload_part *pp = arg;
  touch(pp->pl, pp->lo, pp->hi);
  return NULL;
}

/* Waiting: the block split among up to PRELOAD_MAX_THREADS threads (reads from a disk go
 * faster several at a time), joined before open returns. */
static void preload_wait(model_preload *pl) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int n = cores > PRELOAD_MAX_THREADS ? PRELOAD_MAX_THREADS : cores < 1 ? 1 : (int)cores;
  preload_part parts[PRELOAD_MAX_THREADS];
  pthread_t th[PRELOAD_MAX_THREADS];
  int started = 0;
  for (int i = 0; i < n; i++) {
    parts[i] = (preload_part){pl, pl->n / (uint64_t)n * (uint64_t)i,
                              i == n - 1 ? pl->n : pl->n / (uint64_t)n * (uint64_t)(i + 1)};
    if (i > 0 && pthread_create(&th[i], NULL, part, &parts[i]) == 0) started |= 1 << i;
  }
  part(&parts[0]);
  for (int i = 1; i < n; i++) {
    if (started & (1 << i)) pthread_join(th[i], NULL);
    else part(&parts[i]); /* no thread: this one reads it */
  }
}

model_preload *model_preload_start(irt_model *m, irt_preload mode) {
  if (mode == IRT_PRELOAD_OFF || m->be.ops->upload) return NULL; /* a device copies them */
  model_preload *pl = ir_calloc(1, sizeof *pl);
  if (!pl) return NULL; /* only an optimisation: the model opens without it */
  pl->p = ir_plan_weights(m->plan, &pl->n);
  pl->log = m->log, pl->log_user = m->log_user;
  pl->t0 = now_s();
  atomic_init(&pl->stop, false);
  uintptr_t skew = (uintptr_t)pl->p & (uintptr_t)(sysconf(_SC_PAGESIZE) - 1); /* to a page */
  (void)madvise((void *)((uintptr_t)pl->p - skew), (size_t)pl->n + skew, MADV_WILLNEED);
  if (mode == IRT_PRELOAD_WAIT) {
    preload_wait(pl);
    if (pl->log) {
      char msg[128];
      snprintf(msg, sizeof msg, "preload: %.2f GB of weights read in %.1f s", (double)pl->n / 1e9,
               now_s() - pl->t0);
      pl->log(pl->log_user, IRT_LOG_INFO, msg);
    }
    ir_free(pl);
    return NULL;
  }
  if (pthread_create(&pl->th, NULL, background, pl) != 0) {
    ir_free(pl);
    return NULL;
  }
  return pl;
}

void model_preload_stop(model_preload *pl) {
  if (!pl) return;
  atomic_store(&pl->stop, true);
  pthread_join(pl->th, NULL);
  ir_free(pl);
}
