/* kn_pool: a fixed pthread pool with a blocking parallel-for.
 * Workers park on a job epoch: they spin briefly, then sleep on a condvar. */
#include "kn_pool.h"
#include "ir_alloc.h"

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

/* The claim word packs (epoch << 32 | chunks left to claim). A claim is a compare-exchange
 * that keeps the epoch, so it only succeeds while the job the thread saw is still current:
 * a worker that wakes late cannot take chunks of a newer job with an older view of it.
 * Counting down (not up to n_chunks) means the bound is in the word itself, so no job
 * parameter is read before a claim has proven it belongs to this epoch. */
#define KN_EPOCH(w) ((uint32_t)((w) >> 32))
#define KN_LEFT(w) ((uint32_t)(w))

struct kn_pool {
  int n_threads;          /* including the calling thread, which is tid 0 */
  pthread_t *threads;     /* (n_threads - 1) */
  kn_worker *workers;     /* (n_threads - 1) */
  pthread_mutex_t mu;     /* guards sleeping on the two condvars */
  pthread_cond_t wake;    /* epoch advanced */
  pthread_cond_t done;    /* finished reached n_chunks */
  _Atomic uint64_t claim; /* epoch << 32 | chunks left; see KN_EPOCH */
  atomic_int finished;    /* chunks of the current job that have run to completion */
  atomic_int sleepers;    /* workers asleep (or about to be) on `wake` */
  atomic_bool waiting;    /* the caller is asleep (or about to be) on `done` */
  atomic_bool stop;
  /* The current job: stored (relaxed) before the epoch that publishes it. */
  _Atomic(kn_task_fn) fn;
  _Atomic(void *) arg;
  atomic_llong n;
  atomic_llong chunk;
  atomic_int n_chunks;
};

static inline void pool_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Counts one finished chunk; the last one wakes the caller if it went to sleep. seq_cst
 * here and in pool_wait_done: either the caller's recheck sees the count, or we see
 * `waiting` and signal under the mutex it holds until it waits. */
static void pool_chunk_done(kn_pool *p, int n_chunks) {
  if (atomic_fetch_add_explicit(&p->finished, 1, memory_order_seq_cst) != n_chunks - 1) return;
  if (!atomic_load_explicit(&p->waiting, memory_order_seq_cst)) return;
  pthread_mutex_lock(&p->mu);
  pthread_cond_signal(&p->done);
  pthread_mutex_unlock(&p->mu);
}

/* Claims and runs chunks of job `epoch` until none are left or a newer job is posted;
 * dynamic so a descheduled thread does not hold up the others. */
static void pool_run_chunks(kn_pool *p, uint32_t epoch, int tid) {
  uint64_t w = atomic_load_explicit(&p->claim, memory_order_acquire);
  for (;;) {
    if (KN_EPOCH(w) != epoch || KN_LEFT(w) == 0) return;
    /* Acquire: the job's parameters were stored before its epoch was released. */
    if (!atomic_compare_exchange_weak_explicit(&p->claim, &w, w - 1, memory_order_acquire,
                                               memory_order_acquire))
      continue;
    /* The job cannot finish, so its parameters cannot change, until we report this chunk. */
    int n_chunks = atomic_load_explicit(&p->n_chunks, memory_order_relaxed);
    int64_t n = atomic_load_explicit(&p->n, memory_order_relaxed);
    int64_t chunk = atomic_load_explicit(&p->chunk, memory_order_relaxed);
    kn_task_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
    void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
    int64_t b = (int64_t)(n_chunks - (int)KN_LEFT(w)) * chunk;
    fn(arg, b, n - b < chunk ? n : b + chunk, tid);
    pool_chunk_done(p, n_chunks);
    w = atomic_load_explicit(&p->claim, memory_order_acquire);
  }
}

/* Returns the first epoch other than `seen`. The sleeper count is raised before the
 * recheck (both seq_cst), so pool_post either sees a sleeper or we see its epoch. */
static uint32_t pool_wait_epoch(kn_pool *p, uint32_t seen) {
  uint32_t e;
  for (int i = 0; i < KN_SPIN_ITERS; i++) {
    e = KN_EPOCH(atomic_load_explicit(&p->claim, memory_order_acquire));
    if (e != seen) return e;
    pool_cpu_relax();
  }
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->sleepers, 1, memory_order_seq_cst);
  while ((e = KN_EPOCH(atomic_load_explicit(&p->claim, memory_order_seq_cst))) == seen)
    pthread_cond_wait(&p->wake, &p->mu);
  atomic_fetch_sub_explicit(&p->sleepers, 1, memory_order_seq_cst);
  pthread_mutex_unlock(&p->mu);
  return e;
}

/* Waits until all n_chunks chunks have run. Acquire (seq_cst) on `finished` makes every
 * chunk's writes visible to the caller. */
static void pool_wait_done(kn_pool *p, int n_chunks) {
  for (int i = 0; i < KN_SPIN_ITERS; i++) {
    if (atomic_load_explicit(&p->finished, memory_order_acquire) == n_chunks) return;
    pool_cpu_relax();
  }
  pthread_mutex_lock(&p->mu);
  atomic_store_explicit(&p->waiting, true, memory_order_seq_cst);
  while (atomic_load_explicit(&p->finished, memory_order_seq_cst) != n_chunks)
    pthread_cond_wait(&p->done, &p->mu);
  atomic_store_explicit(&p->waiting, false, memory_order_seq_cst);
  pthread_mutex_unlock(&p->mu);
}

static void *pool_worker_main(void *arg) {
  kn_worker *w = arg;
  kn_pool *p = w->pool;
  uint32_t seen = 0; /* epoch at creation; a job posted before we start is still seen */
  for (;;) {
    seen = pool_wait_epoch(p, seen);
    if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
    pool_run_chunks(p, seen, w->tid);
  }
}

/* Publishes a new epoch with n_chunks to claim (the job stored before it). Only the
 * posting thread moves the epoch, and only once the last job's chunks are all claimed,
 * so the word holds (epoch << 32 | 0) here. Wrapping after 2^32 jobs is harmless unless
 * a worker stalls between its load and its claim for exactly that many jobs. */
static uint32_t pool_post(kn_pool *p, int n_chunks) {
  uint64_t w = atomic_load_explicit(&p->claim, memory_order_relaxed);
  uint32_t epoch = KN_EPOCH(w) + 1;
  atomic_store_explicit(&p->claim, (uint64_t)epoch << 32 | (uint32_t)n_chunks,
                        memory_order_seq_cst);
  if (atomic_load_explicit(&p->sleepers, memory_order_seq_cst) > 0) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
  }
  return epoch;
}

static int pool_default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > KN_MAX_THREADS ? KN_MAX_THREADS : (int)n;
}

static void pool_free(kn_pool *p) {
  pthread_cond_destroy(&p->done);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->mu);
  ir_free(p->workers);
  ir_free(p->threads);
  ir_free(p);
}

/* Stops and joins the first n_started workers: an empty job wakes spinners and sleepers,
 * and the epoch's release carries `stop` to them. */
static void pool_stop(kn_pool *p, int n_started) {
  atomic_store_explicit(&p->stop, true, memory_order_relaxed);
  pool_post(p, 0);
  for (int i = 0; i < n_started; i++) pthread_join(p->threads[i], NULL);
}

static kn_pool *pool_alloc(int n_threads) {
  kn_pool *p = ir_calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n_threads = n_threads;
  p->threads = ir_calloc((size_t)n_threads, sizeof *p->threads);
  p->workers = ir_calloc((size_t)n_threads, sizeof *p->workers);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  atomic_init(&p->claim, 0);
  atomic_init(&p->finished, 0);
  atomic_init(&p->sleepers, 0);
  atomic_init(&p->waiting, false);
  atomic_init(&p->stop, false);
  atomic_init(&p->fn, NULL);
  atomic_init(&p->arg, NULL);
  atomic_init(&p->n, 0);
  atomic_init(&p->chunk, 0);
  atomic_init(&p->n_chunks, 0);
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

/* Returns once every chunk has run, not once every worker has looked: a worker that
 * wakes late finds the epoch moved on or nothing left to claim. */
void kn_parallel_for(kn_pool *p, int64_t n, int64_t grain, kn_task_fn fn, void *arg) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (!p || p->n_threads == 1 || n <= grain) {
    fn(arg, 0, n, 0);
    return;
  }
  /* A few chunks per thread balance load without making chunks needlessly small;
   * so n_chunks <= n_threads * KN_CHUNKS_PER_THREAD. */
  int64_t per = (n + (int64_t)p->n_threads * KN_CHUNKS_PER_THREAD - 1) /
                ((int64_t)p->n_threads * KN_CHUNKS_PER_THREAD);
  int64_t chunk = per > grain ? per : grain;
  int n_chunks = (int)((n + chunk - 1) / chunk);
  atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
  atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
  atomic_store_explicit(&p->n, n, memory_order_relaxed);
  atomic_store_explicit(&p->chunk, chunk, memory_order_relaxed);
  atomic_store_explicit(&p->n_chunks, n_chunks, memory_order_relaxed);
  atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
  uint32_t epoch = pool_post(p, n_chunks);
  pool_run_chunks(p, epoch, 0);
  pool_wait_done(p, n_chunks);
}
