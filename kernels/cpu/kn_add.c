/* kn_add: elementwise residual add. */
#include "kn_cpu.h"

/* Below this many values a chunk costs less than waking the pool. */
enum { KN_ADD_GRAIN = 32768 };

typedef struct add_args {
  float *out;
  const float *a;
  const float *b;
} add_args;

/* No restrict: out may alias a or b, which is safe because each index is read then
 * written once. */
static void add_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const add_args *x = arg;
  for (int64_t i = begin; i < end; i++) x->out[i] = x->a[i] + x->b[i];
}

void kn_add(kn_pool *p, float *out, const float *a, const float *b, int64_t n) {
  add_args x = {.out = out, .a = a, .b = b};
  kn_parallel_for(p, n, KN_ADD_GRAIN, add_task, &x);
}
