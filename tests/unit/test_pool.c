/* test_pool: kn_parallel_for covers every index exactly once, in chunks of at least
 * `grain`, with valid thread ids, for many sizes and pool shapes. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

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
        CHECKF(cover_run(p, c, ns[ni], grains[gi]), "threads=%d n=%lld grain=%lld",
               threads[ti], (long long)ns[ni], (long long)grains[gi]);
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

int main(void) {
  cover *c = calloc(1, sizeof *c);
  if (!c) return 1;
  test_combos(c);
  test_repeated(c);
  test_null_and_default(c);
  free(c);
  return tcheck_done("test_pool");
}
