/* kn_pool: a fixed pthread pool with a blocking parallel-for, used by every CPU kernel.
 * Created once at load time; nothing allocates per call. */
#ifndef KN_POOL_H
#define KN_POOL_H

#include <stdint.h>

typedef struct kn_pool kn_pool;

/* Work item: process indices [begin, end). `tid` is the worker index in [0, n_threads),
 * stable for the duration of one call, so kernels may use per-thread scratch. */
typedef void (*kn_task_fn)(void *arg, int64_t begin, int64_t end, int tid);

/* n_threads <= 0 means all online cores. Returns NULL on failure.
 * Owned by the caller; kn_pool_destroy(NULL) is a no-op. */
kn_pool *kn_pool_create(int n_threads);
void kn_pool_destroy(kn_pool *p);
int kn_pool_threads(const kn_pool *p);

/* Runs fn over [0, n) split into chunks of at least `grain` indices, on all threads
 * (the caller's thread included), and returns when all are done. A NULL pool runs
 * serially on the caller's thread. Not reentrant: one parallel_for at a time per pool. */
void kn_parallel_for(kn_pool *p, int64_t n, int64_t grain, kn_task_fn fn, void *arg);

#endif
