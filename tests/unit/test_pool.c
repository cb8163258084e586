/* test_pool: kn_parallel_for covers every index exactly once, in chunks of at least
 * `grain`, with valid thread ids, for many sizes and pool shapes, and stays exact when
 * jobs come back to back and workers wake late. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "kn_pool.h"
#include "tcheck.h"

enum { MAX_N = 20000 };

typedef struct cover {
  atomic_int hits[MAX_N];
  atomic_int bad_chunks; /* chunks shorter than grain that do not end the range */
  atomic_int bad_tids;
  int64_t n, grain;
  int n_threads;
} cover;

static void cover_task(void *arg, int64_t begin, int64_t end, int tid) {
  cover *c = arg;
  if (end - begin < c->grain && end != c->n) atomic_fetch_add(&c->bad_chunks, 1);
  if (begin < 0 || end > c->n || begin >= end) atomic_fetch_add(&c->bad_chunks, 1);
  if (tid < 0 || tid >= c->n_threads) atomic_fetch_add(&c->bad_tids, 1);
  for (int64_t i = begin; i < end && i >= 0 && i < MAX_N; i++) atomic_fetch_add(&c->hits[i], 1);
}

/* Runs one parallel_for and reports whether every index was hit exactly once. */
static int cover_run(kn_pool *p, cover *c, int64_t n, int64_t grain) {
  for (int64_t i = 0; i < MAX_N; i++) atomic_store(&c->hits[i], 0);
  atomic_store(&c->bad_chunks, 0);
  atomic_store(&c->bad_tids, 0);
  c->n = n;
  c->grain = grain < 1 ? 1 : grain;
  c->n_threads = kn_pool_threads(p);
  kn_parallel_for(p, n, grain, cover_task, c);
  int ok = atomic_load(&c->bad_chunks) == 0 && atomic_load(&c->bad_tids) == 0;
  for (int64_t i = 0; i < MAX_N; i++) ok &= atomic_load(&c->hits[i]) == (i < n ? 1 : 0);
  return ok;
}

static void test_combos(cover *c) {
  static const int threads[] = {1, 2, 3, 4, 8};
  static const int64_t ns[] = {0, 1, 2, 3, 5, 7, 8, 9, 63, 100, 1000, 12345, MAX_N};
  static const int64_t grains[] = {0, 1, 2, 3, 7, 64, 1000, 100000};
  for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
    kn_pool *p = kn_pool_create(threads[ti]);
    CHECK(p != NULL);
    if (!p) continue;
    CHECK(kn_pool_threads(p) == threads[ti]);
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
      for (size_t gi = 0; gi < sizeof grains / sizeof *grains; gi++)
        CHECKF(cover_run(p, c, ns[ni], grains[gi]), "threads=%d n=%lld grain=%lld", threads[ti],
               (long long)ns[ni], (long long)grains[gi]);
    kn_pool_destroy(p);
  }
}

/* Back-to-back calls exercise the spin-then-sleep hand-off and generation reuse. */
static void test_repeated(cover *c) {
  kn_pool *p = kn_pool_create(4);
  CHECK(p != NULL);
  int ok = 1;
  for (int r = 0; r < 2000 && p; r++) ok &= cover_run(p, c, 1 + r % 97, 1 + r % 5);
  CHECK(ok);
  kn_pool_destroy(p);
}

static void test_null_and_default(cover *c) {
  CHECK(kn_pool_threads(NULL) == 1);
  CHECK(cover_run(NULL, c, 0, 1));
  CHECK(cover_run(NULL, c, 1, 1));
  CHECK(cover_run(NULL, c, 12345, 7));
  kn_pool_destroy(NULL);
  kn_pool *p = kn_pool_create(0); /* all online cores */
  CHECK(p != NULL && kn_pool_threads(p) >= 1);
  if (p) CHECK(cover_run(p, c, 999, 1));
  kn_pool_destroy(p);
  kn_pool_destroy(kn_pool_create(3)); /* created and destroyed without ever running */
}

/* Back-to-back small jobs, alternating between two argument blocks so that a worker
 * running a chunk with a stale view of a finished job lands in the wrong block. */
enum { JOB_N = 300, JOB_TIDS = 16 };

typedef struct job {
  atomic_int hits[JOB_N];
  int out[JOB_N];        /* plain writes: visible to the caller only via the pool */
  atomic_int *in_use;    /* (JOB_TIDS) shared by both blocks: tid -> running a chunk */
  atomic_int *running;   /* shared: chunks started and not yet returned */
  atomic_int *slow_left; /* shared: chunks on tid != 0 that still have to sleep */
  atomic_int bad;
  int64_t n, grain;
  int stamp, n_threads;
} job;

static void job_task(void *arg, int64_t begin, int64_t end, int tid) {
  job *j = arg;
  atomic_fetch_add(j->running, 1);
  if (tid < 0 || tid >= j->n_threads || tid >= JOB_TIDS) {
    atomic_fetch_add(&j->bad, 1);
    atomic_fetch_sub(j->running, 1);
    return;
  }
  if (atomic_exchange(&j->in_use[tid], 1) != 0) atomic_fetch_add(&j->bad, 1);
  if (begin < 0 || end > j->n || begin >= end) atomic_fetch_add(&j->bad, 1);
  if (end - begin < j->grain && end != j->n) atomic_fetch_add(&j->bad, 1);
  if (tid != 0 && atomic_load(j->slow_left) > 0 && atomic_fetch_sub(j->slow_left, 1) > 0) {
    struct timespec ts = {0, 3 * 1000 * 1000}; /* a worker that falls behind */
    nanosleep(&ts, NULL);
  }
  for (int64_t i = begin; i < end && i >= 0 && i < JOB_N; i++)
    atomic_fetch_add_explicit(&j->hits[i], 1, memory_order_relaxed);
  atomic_store(&j->in_use[tid], 0);
  atomic_fetch_sub(j->running, 1);
  /* Last, after our own seq_cst stores: only the pool's ordering publishes these. */
  for (int64_t i = begin; i < end && i >= 0 && i < JOB_N; i++) j->out[i] = j->stamp + (int)i;
}

/* Runs one job on `cur` and checks it, then checks that `other` (clean since its own
 * check) was not touched. Leaves `cur` clean for its next turn. */
static int job_run(kn_pool *p, job *cur, const job *other, int64_t n, int64_t grain, int stamp) {
  cur->n = n;
  cur->grain = grain < 1 ? 1 : grain;
  cur->stamp = stamp;
  cur->n_threads = kn_pool_threads(p);
  kn_parallel_for(p, n, grain, job_task, cur);
  int ok = atomic_load(&cur->bad) == 0 && atomic_load(cur->running) == 0;
  for (int64_t i = 0; i < JOB_N; i++) {
    ok &= atomic_load_explicit(&cur->hits[i], memory_order_relaxed) == (i < n ? 1 : 0);
    ok &= i >= n || cur->out[i] == stamp + (int)i;
    ok &= atomic_load_explicit(&other->hits[i], memory_order_relaxed) == 0;
    atomic_store_explicit(&cur->hits[i], 0, memory_order_relaxed);
  }
  atomic_store(&cur->bad, 0);
  return ok;
}

/* n_jobs jobs with varying n and grain; the first `slow` chunks run by workers sleep. */
static int job_series(int n_threads, int n_jobs, int slow) {
  static job jobs[2];
  atomic_int in_use[JOB_TIDS] = {0}, running = 0, slow_left = slow;
  for (int k = 0; k < 2; k++) {
    jobs[k].in_use = in_use;
    jobs[k].running = &running;
    jobs[k].slow_left = &slow_left;
  }
  kn_pool *p = kn_pool_create(n_threads);
  if (!p) return 0;
  int ok = 1;
  for (int r = 0; r < n_jobs; r++) {
    int64_t n = 1 + (r * 37) % JOB_N, grain = r % 7 == 0 ? 0 : 1 + r % 11;
    if (!job_run(p, &jobs[r & 1], &jobs[~r & 1], n, grain, r * 1000)) {
      fprintf(stderr, "job_series: threads=%d job=%d n=%lld grain=%lld wrong\n", n_threads, r,
              (long long)n, (long long)grain);
      ok = 0;
      break;
    }
  }
  kn_pool_destroy(p);
  return ok;
}

/* More threads than cores: workers are often descheduled and wake into a later job. */
static void test_back_to_back(void) {
  CHECK(job_series(2, 20000, 0));
  CHECK(job_series(3, 5000, 0));
  CHECK(job_series(8, 5000, 0));
}

/* Workers asleep inside chunks for a while; the jobs after them must stay exact. */
static void test_slow_worker(void) {
  CHECK(job_series(2, 2000, 1));
  CHECK(job_series(4, 2000, 20));
}

int main(void) {
  cover *c = calloc(1, sizeof *c);
  if (!c) return 1;
  test_combos(c);
  test_repeated(c);
  test_null_and_default(c);
  test_back_to_back();
  test_slow_worker();
  free(c);
  return tcheck_done("test_pool");
}
