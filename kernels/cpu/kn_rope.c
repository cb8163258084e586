/* kn_rope: rotary position embedding, in place, from a precomputed (cos, sin) table. */
#include "kn_cpu.h"

enum { KN_ROPE_MIN_WORK = 16384 };

typedef struct rope_args {
  float *x;
  const int32_t *pos;
  const float *cos_sin;
  int64_t n_heads;
  int64_t head_dim;
  int64_t rot_dim;
  int neox;
} rope_args;

/* Rotate-half (HF Llama): pairs (i, i + half).  x0*c - x1*s is bitwise HF's
 * x0*c + (-x1)*s. */
static void rope_neox(float *restrict x, const float *restrict cs, int64_t half) {
  for (int64_t i = 0; i < half; i++) {
    float c = cs[2 * i], s = cs[2 * i + 1];
    float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x1 * c + x0 * s;
  }
}

/* Interleaved (GPT-J): pairs (2i, 2i + 1). */
static void rope_interleaved(float *restrict x, const float *restrict cs, int64_t half) {
  for (int64_t i = 0; i < half; i++) {
    float c = cs[2 * i], s = cs[2 * i + 1];
    float x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x1 * c + x0 * s;
  }
}

void kn_rope_head(float *x, const float *cs, int64_t rot_dim, int neox) {
  if (neox) rope_neox(x, cs, rot_dim / 2);
  else rope_interleaved(x, cs, rot_dim / 2);
}

/* One index is one (token, head) pair. */
static void rope_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const rope_args *a = arg;
  for (int64_t th = begin; th < end; th++) {
    int64_t t = th / a->n_heads;
    kn_rope_head(a->x + th * a->head_dim, a->cos_sin + (int64_t)a->pos[t] * a->rot_dim, a->rot_dim,
                 a->neox);
  }
}

void kn_rope(kn_pool *p, float *x, const int32_t *pos, const float *cos_sin, int64_t n_tok,
             int64_t n_heads, int64_t head_dim, int64_t rot_dim, int neox) {
  rope_args a = {.x = x,
                 .pos = pos,
                 .cos_sin = cos_sin,
                 .n_heads = n_heads,
                 .head_dim = head_dim,
                 .rot_dim = rot_dim,
                 .neox = neox};
  int64_t grain = rot_dim > 0 ? 1 + KN_ROPE_MIN_WORK / rot_dim : 1;
  kn_parallel_for(p, n_tok * n_heads, grain, rope_task, &a);
}
