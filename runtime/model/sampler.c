/* sampler: greedy, temperature, top-k and top-p sampling with a seeded generator.
 * The candidate buffers are allocated at create; sampling never allocates. With the same
 * seed and logits the same tokens come out on every machine.
 *
 * The function: candidates ordered by larger logit, then lower id; the top_k best kept
 * (all when 0); weights w = exp((logit - max) / temperature) (in double), those with w <
 * min_p dropped (w is the probability relative to the likeliest's), summed in double in
 * that order (and walked as floats); with 0 < top_p < 1 the smallest prefix of mass >=
 * top_p * sum kept; the token where u * sum falls in the running sum, u uniform in [0, 1) from the
 * seed. Computed without a comparison sort of the vocabulary: a candidate more than 40 temperatures
 * below the max has w < 2^-53, and added to a running sum that is already >= 1 (the max's
 * w is 1) such a w changes no bit of it, so it can never be chosen and is dropped before
 * the sort; the rest are ordered by a stable radix sort on the logit's bits. The CUDA
 * backend's kn_pick (kernels/cuda/sampling.cu) computes this function on the device with
 * the draw from sampler_draw. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <stdint.h>

#include "inferrt.h"
#include "model.h"
#include "ir_alloc.h"

typedef struct cand {
  float logit;
  int32_t id;
} cand;

struct irt_sampler {
  irt_sampling p;
  int64_t vocab;
  uint64_t state; /* splitmix64 */
  cand *c, *tmp;  /* (vocab) each: the candidates, the radix sort's other buffer */
  uint32_t *hist; /* (65536): top_k's histogram of the keys' top 16 bits */
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
  irt_sampler *s = ir_calloc(1, sizeof *s);
  if (s) {
    s->c = ir_malloc((size_t)vocab_size * sizeof *s->c);
    s->tmp = ir_malloc((size_t)vocab_size * sizeof *s->tmp);
    s->hist = ir_malloc(65536 * sizeof *s->hist);
  }
  if (!s || !s->c || !s->tmp || !s->hist) {
    if (s) ir_free(s->c), ir_free(s->tmp), ir_free(s->hist), ir_free(s);
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
  ir_free(s->c);
  ir_free(s->tmp);
  ir_free(s->hist);
  ir_free(s);
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

/* The radix key of a logit: larger logits give smaller keys (-0 is +0). */
static uint32_t desc_key(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (u == 0x80000000u) u = 0;
  u = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending order as unsigned */
  return ~u;
}

/* Orders c[0..n) by larger logit, then lower id (c must come in ascending id order: the
 * LSD radix sort is stable), in three passes of 11 bits through tmp. Returns the sorted
 * buffer (c or tmp). */
static cand *sort_cands(cand *c, cand *tmp, int64_t n) {
  static const int shift[3] = {0, 11, 22};
  for (int p = 0; p < 3; p++) {
    int64_t count[2048] = {0};
    for (int64_t i = 0; i < n; i++) count[(desc_key(c[i].logit) >> shift[p]) & 2047]++;
    int64_t at = 0;
    for (int b = 0; b < 2048; b++) {
      int64_t k = count[b];
      count[b] = at;
      at += k;
    }
    for (int64_t i = 0; i < n; i++) tmp[count[(desc_key(c[i].logit) >> shift[p]) & 2047]++] = c[i];
    cand *t = c;
    c = tmp;
    tmp = t;
  }
  return c;
}

/* Drops from c[0..n) (id order kept) all but the candidates whose key's top 16 bits are
 * at most those of the k-th best: a superset of the k best, usually a few more than k. */
static int64_t prefilter_top_k(irt_sampler *s, cand *c, int64_t n, int64_t k) {
  memset(s->hist, 0, 65536 * sizeof *s->hist);
  for (int64_t i = 0; i < n; i++) s->hist[desc_key(c[i].logit) >> 16]++;
  uint32_t cut = 0;
  for (int64_t seen = 0; (seen += s->hist[cut]) < k;) cut++;
  int64_t m = 0;
  for (int64_t i = 0; i < n; i++)
    if (desc_key(c[i].logit) >> 16 <= cut) c[m++] = c[i];
  return m;
}

const irt_sampling *sampler_params(const irt_sampler *s) { return &s->p; }

double sampler_draw(irt_sampler *s) { return next_unit(s); }

/* splitmix64 steps its state by a constant: draw `ahead` is that many steps further. */
double sampler_peek(const irt_sampler *s, int64_t ahead) {
  irt_sampler t = {.state = s->state + (uint64_t)ahead * 0x9e3779b97f4a7c15ull};
  return next_unit(&t);
}

void irt_sampler_skip(irt_sampler *s, int64_t n) {
  if (s->p.temperature > 0.0f && n > 0) s->state += (uint64_t)n * 0x9e3779b97f4a7c15ull;
}

double pick_draw(irt_pick *p) {
  if (p->sampler->p.temperature <= 0.0f) return 0.0;
  return p->draw > 0 ? sampler_peek(p->sampler, p->draw - 1) : sampler_draw(p->sampler);
}

int32_t irt_sampler_sample(irt_sampler *s, const float *logits) {
  if (s->p.temperature <= 0.0f) return argmax(logits, s->vocab);
  return sampler_sample_u(s, logits, next_unit(s));
}

/* The candidates sampler_sample_u chooses among for a row (temperature > 0): *n of them,
 * in the order it walks them, each logit replaced by its weight; *sum their total. */
static cand *kept(irt_sampler *s, const float *logits, int64_t *out_n, double *out_sum) {
  double inv_t = 1.0 / s->p.temperature, max = logits[argmax(logits, s->vocab)];
  int64_t n = 0;
  for (int64_t i = 0; i < s->vocab; i++) /* NaN logits are kept (and poison the sum) */
    if (!(((double)logits[i] - max) * inv_t < -40.0)) s->c[n++] = (cand){logits[i], (int32_t)i};
  if (s->p.top_k > 0 && s->p.top_k < n) n = prefilter_top_k(s, s->c, n, s->p.top_k);
  cand *c = sort_cands(s->c, s->tmp, n);
  if (s->p.top_k > 0 && s->p.top_k < n) n = s->p.top_k;
  double sum = 0.0;
  max = c[0].logit;
  for (int64_t i = 0; i < n; i++) {
    double w = exp(((double)c[i].logit - max) * inv_t);
    if (w < (double)s->p.min_p) { /* and so are all after it: w only falls */
      n = i;
      break;
    }
    c[i].logit = (float)w;
    sum += w;
  }
  if (s->p.top_p > 0.0f && s->p.top_p < 1.0f) { /* smallest prefix with mass >= top_p */
    double acc = 0.0;
    int64_t keep = 0;
    while (keep < n && acc < s->p.top_p * sum) acc += c[keep++].logit;
    n = keep;
    sum = acc;
  }
  *out_n = n, *out_sum = sum;
  return c;
}

int32_t sampler_sample_u(irt_sampler *s, const float *logits, double u) {
  if (s->p.temperature <= 0.0f) return argmax(logits, s->vocab);
  int64_t n;
  double sum;
  const cand *c = kept(s, logits, &n, &sum);
  double r = u * sum, acc = 0.0;
  for (int64_t i = 0; i < n; i++) {
    acc += c[i].logit;
    if (r < acc) return c[i].id;
  }
  return c[n - 1].id;
}

void sampler_probs(irt_sampler *s, const float *logits, float *probs) {
  memset(probs, 0, (size_t)s->vocab * sizeof *probs);
  if (s->p.temperature <= 0.0f) {
    probs[argmax(logits, s->vocab)] = 1.0f;
    return;
  }
  int64_t n;
  double sum;
  const cand *c = kept(s, logits, &n, &sum);
  for (int64_t i = 0; i < n; i++) probs[c[i].id] = (float)((double)c[i].logit / sum);
}

void sampler_top_logprobs(const float *lg, int64_t vocab, double lse, int k, int32_t *ids,
                          float *lps) {
  int n = 0;
  if (k > vocab) k = (int)vocab;
  for (int64_t v = 0; v < vocab && k > 0; v++) {
    if (n == k && !(lg[v] > lps[k - 1])) continue;
    int at = n < k ? n++ : k - 1; /* insertion sort into the kept k */
    while (at > 0 && lg[v] > lps[at - 1]) {
      lps[at] = lps[at - 1];
      ids[at] = ids[at - 1];
      at--;
    }
    lps[at] = lg[v];
    ids[at] = (int32_t)v;
  }
  for (int i = 0; i < n; i++) lps[i] = (float)((double)lps[i] - lse);
}
