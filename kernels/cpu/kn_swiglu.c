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

static void swiglu_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const swiglu_args *a = arg;
  for (int64_t i = begin; i < end; i++) a->out[i] = kn_silu_mul(a->gate[i], a->up[i]);
}

void kn_swiglu(kn_pool *p, float *out, const float *gate, const float *up, int64_t n) {
  swiglu_args a = {.out = out, .gate = gate, .up = up};
  kn_parallel_for(p, n, KN_SWIGLU_GRAIN, swiglu_task, &a);
}
