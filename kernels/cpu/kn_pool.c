/* kn_pool: a fixed pthread pool with a blocking parallel-for.
 * Workers park on a generation counter: they spin briefly, then sleep on a condvar. */
#include "kn_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

/* Back-to-back kernels of one decode step are microseconds apart; spinning that long
 * saves a futex wake per kernel, sleeping after it keeps idle pools off the CPUs. */
enum { KN_SPIN_ITERS = 2000, KN_MAX_THREADS = 512, KN_CHUNKS_PER_THREAD = 4 };

typedef struct kn_worker {
  struct kn_pool *pool;
  int tid;
} kn_worker;

struct kn_pool {
  int n_threads;       /* including the calling thread, which is tid 0 */
  pthread_t *threads;  /* (n_threads - 1) */
  kn_worker *workers;  /* (n_threads - 1) */
  pthread_mutex_t mu;  /* guards sleeping on the two condvars */
  pthread_cond_t wake; /* gen advanced */
  pthread_cond_t done; /* pending reached 0 */
  atomic_uint gen;     /* bumped (release) once per job; workers acquire it */
  atomic_bool stop;
  atomic_int pending;  /* workers that have not finished the current job */
  atomic_llong next;   /* first unclaimed index of the current job */
  /* The current job: written only while every worker is parked. */
  kn_task_fn fn;
  void *arg;
  int64_t n;
  int64_t chunk;
};

static inline void pool_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Claims chunks until the range is exhausted; dynamic so a descheduled thread does not
 * hold up the others. */
static void pool_run_chunks(kn_pool *p, int tid) {
  for (;;) {
    int64_t b = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
    if (b >= p->n) return;
    int64_t e = p->n - b < p->chunk ? p->n : b + p->chunk;
    p->fn(p->arg, b, e, tid);
  }
}

static unsigned pool_wait_gen(kn_pool *p, unsigned seen) {
  unsigned g;
  for (int i = 0; i < KN_SPIN_ITERS; i++) {
    g = atomic_load_explicit(&p->gen, memory_order_acquire);
    if (g != seen) return g;
    pool_cpu_relax();
  }
  pthread_mutex_lock(&p->mu);
  while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
    pthread_cond_wait(&p->wake, &p->mu);
  pthread_mutex_unlock(&p->mu);
  return g;
}

static void pool_wait_done(kn_pool *p) {
  for (int i = 0; i < KN_SPIN_ITERS; i++) {
    if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
    pool_cpu_relax();
  }
  pthread_mutex_lock(&p->mu);
  while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
    pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

static void *pool_worker_main(void *arg) {
  kn_worker *w = arg;
  kn_pool *p = w->pool;
  unsigned seen = 0; /* gen at creation; a job posted before we start is still seen */
  for (;;) {
    seen = pool_wait_gen(p, seen);
    if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
    pool_run_chunks(p, w->tid);
    /* acq_rel: our output writes happen-before the caller's acquire of pending == 0. */
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_broadcast(&p->done);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

/* Bumps gen under the mutex so a worker between its check and its wait cannot miss it. */
static void pool_post(kn_pool *p) {
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
}

static int pool_default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > KN_MAX_THREADS ? KN_MAX_THREADS : (int)n;
}

static void pool_free(kn_pool *p) {
  pthread_cond_destroy(&p->done);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->mu);
  free(p->workers);
  free(p->threads);
  free(p);
}

/* Stops and joins the first n_started workers. */
static void pool_stop(kn_pool *p, int n_started) {
  atomic_store_explicit(&p->stop, true, memory_order_release);
  pool_post(p);
  for (int i = 0; i < n_started; i++) pthread_join(p->threads[i], NULL);
}

static kn_pool *pool_alloc(int n_threads) {
  kn_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n_threads = n_threads;
  p->threads = calloc((size_t)n_threads, sizeof *p->threads);
  p->workers = calloc((size_t)n_threads, sizeof *p->workers);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  atomic_init(&p->gen, 0);
  atomic_init(&p->stop, false);
  atomic_init(&p->pending, 0);
  atomic_init(&p->next, 0);
  if (!p->threads || !p->workers) {
    pool_free(p);
    return NULL;
  }
  return p;
}

kn_pool *kn_pool_create(int n_threads) {
  if (n_threads <= 0) n_threads = pool_default_threads();
  if (n_threads > KN_MAX_THREADS) n_threads = KN_MAX_THREADS;
  kn_pool *p = pool_alloc(n_threads);
  if (!p) return NULL;
  for (int i = 0; i < n_threads - 1; i++) {
    p->workers[i] = (kn_worker){.pool = p, .tid = i + 1};
    if (pthread_create(&p->threads[i], NULL, pool_worker_main, &p->workers[i]) != 0) {
      pool_stop(p, i);
      pool_free(p);
      return NULL;
    }
  }
  return p;
}

void kn_pool_destroy(kn_pool *p) {
  if (!p) return;
  pool_stop(p, p->n_threads - 1);
  pool_free(p);
}

int kn_pool_threads(const kn_pool *p) { return p ? p->n_threads : 1; }

void kn_parallel_for(kn_pool *p, int64_t n, int64_t grain, kn_task_fn fn, void *arg) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (!p || p->n_threads == 1 || n <= grain) {
    fn(arg, 0, n, 0);
    return;
  }
  /* A few chunks per thread balance load without making chunks needlessly small. */
  int64_t per = (n + (int64_t)p->n_threads * KN_CHUNKS_PER_THREAD - 1) /
                ((int64_t)p->n_threads * KN_CHUNKS_PER_THREAD);
  p->fn = fn;
  p->arg = arg;
  p->n = n;
  p->chunk = per > grain ? per : grain;
  atomic_store_explicit(&p->next, 0, memory_order_relaxed);
  atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
  pool_post(p);
  pool_run_chunks(p, 0);
  pool_wait_done(p);
}
