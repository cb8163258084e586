/* sampler: greedy, temperature, top-k and top-p sampling with a seeded generator.
 * The candidate buffer is allocated at create; sampling never allocates. With the same
 * seed and logits the same tokens come out on every machine. */
#include <math.h>
#include <stdlib.h>

#include "inferrt.h"

typedef struct cand {
  float logit;
  int32_t id;
} cand;

struct irt_sampler {
  irt_sampling p;
  int64_t vocab;
  uint64_t state; /* splitmix64 */
  cand *c;        /* (vocab) */
};

irt_sampling irt_sampling_default(void) {
  return (irt_sampling){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
}

irt_status irt_sampler_create(const irt_sampling *p, int64_t vocab_size, irt_sampler **out,
                              irt_error *err) {
  if (vocab_size <= 0 || !p) {
    if (err) *err = (irt_error){.status = IRT_INVALID_ARG, .msg = "sampler needs a vocabulary"};
    return IRT_INVALID_ARG;
  }
  irt_sampler *s = calloc(1, sizeof *s);
  if (s) s->c = malloc((size_t)vocab_size * sizeof *s->c);
  if (!s || !s->c) {
    if (s) free(s);
    if (err) *err = (irt_error){.status = IRT_OOM, .msg = "out of memory"};
    return IRT_OOM;
  }
  s->p = *p;
  s->vocab = vocab_size;
  s->state = p->seed;
  *out = s;
  return IRT_OK;
}

void irt_sampler_destroy(irt_sampler *s) {
  if (!s) return;
  free(s->c);
  free(s);
}

static uint64_t next_u64(irt_sampler *s) {
  uint64_t z = (s->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(irt_sampler *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

static int32_t argmax(const float *x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return (int32_t)best;
}

/* Larger logit first; lower id first on ties, so the order is total and stable. */
static int cmp_cand(const void *pa, const void *pb) {
  const cand *a = pa, *b = pb;
  if (a->logit != b->logit) return a->logit < b->logit ? 1 : -1;
  return a->id - b->id;
}

/* Keeps the k best candidates at the front of c[0..n) (selection by partial sort). */
static int64_t keep_top_k(cand *c, int64_t n, int64_t k) {
  if (k <= 0 || k >= n) {
    qsort(c, (size_t)n, sizeof *c, cmp_cand);
    return n;
  }
  /* Quickselect around the k-th best, then order the head. */
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    cand pivot = c[(lo + hi) / 2];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (cmp_cand(&c[i], &pivot) < 0) i++;
      while (cmp_cand(&c[j], &pivot) > 0) j--;
      if (i <= j) {
        cand t = c[i];
        c[i++] = c[j];
        c[j--] = t;
      }
    }
    if (k - 1 <= j) hi = j;
    else if (k - 1 >= i) lo = i;
    else break;
  }
  qsort(c, (size_t)k, sizeof *c, cmp_cand);
  return k;
}

int32_t irt_sampler_sample(irt_sampler *s, const float *logits) {
  if (s->p.temperature <= 0.0f) return argmax(logits, s->vocab);
  for (int64_t i = 0; i < s->vocab; i++) s->c[i] = (cand){logits[i], (int32_t)i};
  int64_t n = keep_top_k(s->c, s->vocab, s->p.top_k);
  double inv_t = 1.0 / s->p.temperature, sum = 0.0, max = s->c[0].logit;
  for (int64_t i = 0; i < n; i++) {
    double w = exp(((double)s->c[i].logit - max) * inv_t);
    s->c[i].logit = (float)w;
    sum += w;
  }
  if (s->p.top_p > 0.0f && s->p.top_p < 1.0f) { /* smallest prefix with mass >= top_p */
    double acc = 0.0;
    int64_t keep = 0;
    while (keep < n && acc < s->p.top_p * sum) acc += s->c[keep++].logit;
    n = keep;
    sum = acc;
  }
  double r = next_unit(s) * sum, acc = 0.0;
  for (int64_t i = 0; i < n; i++) {
    acc += s->c[i].logit;
    if (r < acc) return s->c[i].id;
  }
  return s->c[n - 1].id;
}
