/* kn_gather_rows: picks rows of an activation, e.g. the last token of each sequence
 * before the LM head. */
#include <string.h>

#include "kn_cpu.h"

enum { KN_GATHER_MIN_WORK = 32768 };

typedef struct gather_args {
  float *out;
  const float *x;
  const int32_t *rows;
  int64_t dim;
} gather_args;

static void gather_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const gather_args *a = arg;
  for (int64_t r = begin; r < end; r++)
    memcpy(a->out + r * a->dim, a->x + (int64_t)a->rows[r] * a->dim,
           (size_t)a->dim * sizeof(float));
}

void kn_gather_rows(kn_pool *p, float *out, const float *x, const int32_t *rows, int64_t n_rows,
                    int64_t dim) {
  gather_args a = {.out = out, .x = x, .rows = rows, .dim = dim};
  int64_t grain = dim > 0 ? 1 + KN_GATHER_MIN_WORK / dim : 1;
  kn_parallel_for(p, n_rows, grain, gather_task, &a);
}
