/* kn_swiglu: the gated activation of Llama-style MLPs, silu(gate) * up. */
#include <math.h>

#include "kn_cpu.h"

/* expf dominates; a chunk this size outweighs the cost of waking the pool. */
enum { KN_SWIGLU_GRAIN = 8192 };

typedef struct swiglu_args {
  float *out;
  const float *gate;
  const float *up;
} swiglu_args;

/* silu(g) = g / (1 + exp(-g)), the form HF uses; for g -> -inf expf overflows to inf
 * and the quotient is a correctly signed zero rather than NaN. */
static void swiglu_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const swiglu_args *a = arg;
  for (int64_t i = begin; i < end; i++) {
    float g = a->gate[i];
    a->out[i] = g / (1.0f + expf(-g)) * a->up[i];
  }
}

void kn_swiglu(kn_pool *p, float *out, const float *gate, const float *up, int64_t n) {
  swiglu_args a = {.out = out, .gate = gate, .up = up};
  kn_parallel_for(p, n, KN_SWIGLU_GRAIN, swiglu_task, &a);
}
