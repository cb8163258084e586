/* test_sampler: greedy, temperature, top-k and top-p sampling (runtime/include/inferrt.h).
 * Every random draw comes from a fixed seed, so the statistical checks are deterministic:
 * their tolerances are several standard deviations wide and they never flake. */
#include "inferrt.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h" /* sampler_sample_u */
#include "tcheck.h"

enum { NV = 1000 };

static irt_sampler *make(float temp, int top_k, float top_p, uint64_t seed, int64_t vocab) {
  irt_sampling p = {.temperature = temp, .top_k = top_k, .top_p = top_p, .seed = seed};
  irt_sampler *s = NULL;
  irt_error err = {0};
  CHECKF(irt_sampler_create(&p, vocab, &s, &err) == IRT_OK && s, "create: %s", err.msg);
  if (!s) abort();
  return s;
}

/* A test-local generator (not the sampler's) for building logits. */
static uint64_t g_rng = 0x1234567u;
static uint32_t rnd(void) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_rng >> 33);
}

/* Distinct values spread over [lo, lo + span): a shuffled ramp. */
static void distinct_logits(float *x, int n, float lo, float span) {
  for (int i = 0; i < n; i++) x[i] = lo + span * (float)i / (float)n;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(rnd() % (uint32_t)(i + 1));
    float t = x[i];
    x[i] = x[j];
    x[j] = t;
  }
}

/* Token ids ordered by logit descending, lower id first on ties. */
static const float *g_sort_base;
static int by_logit_desc(const void *pa, const void *pb) {
  int a = *(const int *)pa, b = *(const int *)pb;
  float la = g_sort_base[a], lb = g_sort_base[b];
  if (la != lb) return la < lb ? 1 : -1;
  return a - b;
}

static void order_of(const float *x, int n, int *ids) {
  for (int i = 0; i < n; i++) ids[i] = i;
  g_sort_base = x;
  qsort(ids, (size_t)n, sizeof *ids, by_logit_desc);
}

static int argmax_ref(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

/* ---- greedy --------------------------------------------------------------------------- */

static void test_greedy(void) {
  float x[NV];
  distinct_logits(x, NV, -3.0f, 6.0f);
  irt_sampler *s = make(0.0f, 0, 1.0f, 1, NV);
  int am = argmax_ref(x, NV);
  for (int i = 0; i < 10; i++) CHECK(irt_sampler_sample(s, x) == am);
  x[17] = x[am]; /* a tie: the lower id wins */
  x[901] = x[am];
  CHECK(irt_sampler_sample(s, x) == (am < 17 ? am : 17));
  irt_sampler_destroy(s);
  float flat[8] = {-2, -2, -2, -2, -2, -2, -2, -2};
  s = make(-1.0f, 5, 0.3f, 9, 8); /* temperature < 0 is greedy too, whatever k and p */
  CHECK(irt_sampler_sample(s, flat) == 0);
  flat[6] = -1.5f, flat[3] = -1.5f;
  CHECK(irt_sampler_sample(s, flat) == 3);
  irt_sampler_destroy(s);
  irt_sampling def = irt_sampling_default();
  CHECK(def.temperature <= 0.0f);
  irt_sampler_destroy(NULL);
}

/* ---- top-k ------------------------------------------------------------------------------ */

static void test_top1_any_temperature(void) {
  float x[NV];
  distinct_logits(x, NV, 0.0f, 0.5f); /* flat: without the limit any token could come */
  int am = argmax_ref(x, NV);
  const float temps[4] = {0.1f, 1.0f, 10.0f, 1000.0f};
  for (int t = 0; t < 4; t++) {
    irt_sampler *s = make(temps[t], 1, 1.0f, 77 + (uint64_t)t, NV);
    int ok = 0;
    for (int i = 0; i < 200; i++) ok += irt_sampler_sample(s, x) == am;
    CHECKF(ok == 200, "top_k=1 at temperature %g: %d of 200 were the argmax", temps[t], ok);
    irt_sampler_destroy(s);
  }
  float tie[6] = {0.5f, 2.0f, 1.0f, 2.0f, 2.0f, -1.0f};
  irt_sampler *s = make(3.0f, 1, 1.0f, 5, 6);
  for (int i = 0; i < 50; i++) CHECK(irt_sampler_sample(s, tie) == 1);
  irt_sampler_destroy(s);
}

/* Every draw lies among the k largest; the draws are not degenerate. */
static void test_top_k_membership(void) {
  static float x[NV];
  static int order[NV];
  static bool in_top[NV];
  static int seen[NV];
  const int ks[5] = {1, 2, 5, 50, 999};
  for (int c = 0; c < 5; c++) {
    int k = ks[c];
    distinct_logits(x, NV, -0.5f, 1.0f); /* flat enough that the tail is often drawn */
    order_of(x, NV, order);
    memset(in_top, 0, sizeof in_top);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < k; i++) in_top[order[i]] = true;
    irt_sampler *s = make(1.0f, k, 1.0f, 1000 + (uint64_t)k, NV);
    int outside = 0, distinct = 0;
    for (int i = 0; i < 2000; i++) {
      int32_t t = irt_sampler_sample(s, x);
      if (t < 0 || t >= NV || !in_top[t]) {
        outside++;
        continue;
      }
      distinct += !seen[t]++;
    }
    CHECKF(outside == 0, "top_k=%d: %d of 2000 draws outside the top %d", k, outside, k);
    int want_distinct = k < 50 ? k : 40; /* 2000 near-uniform draws over k >= 50 */
    CHECKF(distinct >= want_distinct, "top_k=%d: only %d distinct tokens", k, distinct);
    irt_sampler_destroy(s);
  }
}

/* Many vectors with heavy ties and random k: the sample is always among the first k of
 * the (logit desc, id asc) order. Exercises the partial selection on hard inputs. */
static void test_top_k_ties(void) {
  static float x[300];
  static int order[300];
  int outside = 0;
  for (int trial = 0; trial < 300; trial++) {
    int n = 2 + (int)(rnd() % 299u), k = 1 + (int)(rnd() % (uint32_t)n), levels = 1 + trial % 7;
    for (int i = 0; i < n; i++) x[i] = (float)(rnd() % (uint32_t)levels) * 0.25f;
    order_of(x, n, order);
    irt_sampler *s = make(1.0f, k, 1.0f, (uint64_t)trial, n);
    for (int d = 0; d < 40; d++) {
      int32_t t = irt_sampler_sample(s, x);
      int pos = 0;
      while (pos < n && order[pos] != t) pos++;
      outside += pos >= k;
    }
    irt_sampler_destroy(s);
  }
  CHECKF(outside == 0, "%d draws outside the top k (with ties)", outside);
}

/* Within the top k, frequencies follow the renormalised softmax. */
static void test_top_k_distribution(void) {
  float x[NV];
  int order[NV];
  distinct_logits(x, NV, -2.0f, 4.0f);
  order_of(x, NV, order);
  double p[5], z = 0;
  for (int i = 0; i < 5; i++) z += p[i] = exp((double)x[order[i]] - x[order[0]]);
  irt_sampler *s = make(1.0f, 5, 1.0f, 4242, NV);
  int cnt[5] = {0};
  for (int i = 0; i < 20000; i++) {
    int32_t t = irt_sampler_sample(s, x);
    for (int r = 0; r < 5; r++) cnt[r] += t == order[r];
  }
  for (int r = 0; r < 5; r++)
    CHECKF(fabs(cnt[r] / 20000.0 - p[r] / z) < 0.02, "top_k rank %d: %.4f vs %.4f", r,
           cnt[r] / 20000.0, p[r] / z);
  irt_sampler_destroy(s);
}

/* ---- top-p ------------------------------------------------------------------------------ */

static void test_top_p(void) {
  static float x[NV];
  static int order[NV];
  static bool in_set[NV];
  distinct_logits(x, NV, -1.0f, 3.0f);
  int am = argmax_ref(x, NV);
  irt_sampler *s = make(1.0f, 0, 1e-6f, 31, NV);
  int ok = 0;
  for (int i = 0; i < 500; i++) ok += irt_sampler_sample(s, x) == am;
  CHECKF(ok == 500, "top_p=1e-6: %d of 500 were the argmax", ok);
  irt_sampler_destroy(s);

  /* The nucleus: the smallest prefix (by probability) whose mass reaches 0.5. */
  order_of(x, NV, order);
  double z = 0, acc = 0;
  for (int i = 0; i < NV; i++) z += exp((double)x[i] - x[order[0]]);
  int m = 0;
  memset(in_set, 0, sizeof in_set);
  while (m < NV && acc < 0.5) {
    acc += exp((double)x[order[m]] - x[order[0]]) / z;
    in_set[order[m++]] = true;
  }
  double before = acc - exp((double)x[order[m - 1]] - x[order[0]]) / z;
  CHECKF(before < 0.5 - 1e-4 && acc > 0.5 + 1e-4, "boundary too close to call: %g %g", before,
         acc); /* so float rounding inside the sampler cannot move it */
  s = make(1.0f, 0, 0.5f, 32, NV);
  int outside = 0, last_in = 0;
  for (int i = 0; i < 2000; i++) {
    int32_t t = irt_sampler_sample(s, x);
    outside += !(t >= 0 && t < NV && in_set[t]);
    last_in += t == order[m - 1];
  }
  CHECKF(outside == 0, "top_p=0.5: %d of 2000 draws outside the %d-token nucleus", outside, m);
  CHECKF(last_in > 0, "the nucleus' last token (rank %d) was never drawn", m - 1);
  irt_sampler_destroy(s);
}

/* ---- seeds, frequencies, temperature ----------------------------------------------------- */

static void draw(float temp, uint64_t seed, const float *x, int n, int32_t *out, int count) {
  irt_sampler *s = make(temp, 0, 1.0f, seed, n);
  for (int i = 0; i < count; i++) out[i] = irt_sampler_sample(s, x);
  irt_sampler_destroy(s);
}

static void test_seeds(void) {
  float x[NV];
  distinct_logits(x, NV, 0.0f, 2.0f);
  int32_t a[200], b[200], c[200];
  draw(1.0f, 123, x, NV, a, 200);
  draw(1.0f, 123, x, NV, b, 200);
  draw(1.0f, 124, x, NV, c, 200);
  CHECK(memcmp(a, b, sizeof a) == 0);
  int same = 0;
  for (int i = 0; i < 200; i++) same += a[i] == c[i];
  CHECKF(same < 20, "seeds 123 and 124 agree on %d of 200 draws", same);
  draw(1.0f, 0, x, NV, c, 200); /* seed 0 is a seed like any other */
  same = 0;
  for (int i = 0; i < 200; i++) same += a[i] == c[i];
  CHECK(same < 20);
}

static void softmax(const float *x, int n, double temp, double *p) {
  double mx = x[0], z = 0;
  for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
  for (int i = 0; i < n; i++) z += p[i] = exp(((double)x[i] - mx) / temp);
  for (int i = 0; i < n; i++) p[i] /= z;
}

static void frequencies(float temp, uint64_t seed, const float *x, double *f) {
  static int32_t out[20000];
  draw(temp, seed, x, 5, out, 20000);
  for (int i = 0; i < 5; i++) f[i] = 0;
  for (int i = 0; i < 20000; i++) {
    CHECK(out[i] >= 0 && out[i] < 5);
    if (out[i] >= 0 && out[i] < 5) f[out[i]] += 1.0 / 20000.0;
  }
}

static void test_frequencies_and_temperature(void) {
  const float x[5] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  double p1[5], p05[5], p2[5], f1[5], f05[5], f2[5];
  softmax(x, 5, 1.0, p1);
  softmax(x, 5, 0.5, p05);
  softmax(x, 5, 2.0, p2);
  frequencies(1.0f, 2024, x, f1);
  frequencies(0.5f, 2025, x, f05);
  frequencies(2.0f, 2026, x, f2);
  for (int i = 0; i < 5; i++) {
    CHECKF(fabs(f1[i] - p1[i]) < 0.02, "T=1 token %d: %.4f vs softmax %.4f", i, f1[i], p1[i]);
    CHECKF(fabs(f05[i] - p05[i]) < 0.02, "T=0.5 token %d: %.4f vs %.4f", i, f05[i], p05[i]);
    CHECKF(fabs(f2[i] - p2[i]) < 0.02, "T=2 token %d: %.4f vs %.4f", i, f2[i], p2[i]);
  }
  /* 0.5 sharpens: the favourite gains a lot, the least likely nearly vanishes. */
  CHECKF(f05[1] > f1[1] + 0.1 && f1[1] > f2[1] + 0.05, "argmax share %.3f / %.3f / %.3f", f05[1],
         f1[1], f2[1]);
  CHECK(f05[3] < f1[3] && f1[3] < f2[3]);
}

/* vocab_size must be positive: a sampler over no tokens has nothing to return (and
 * reading c[0] / c[n - 1] of an empty candidate buffer is out of bounds). */
static void test_create_rejects_empty_vocab(void) {
  irt_sampling p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
  irt_sampler *s = NULL;
  irt_error err = {0};
  irt_status st = irt_sampler_create(&p, 0, &s, &err);
  CHECKF(st != IRT_OK, "irt_sampler_create accepted vocab_size 0");
  if (st == IRT_OK) irt_sampler_destroy(s);
  /* (A negative size is not tried here: it reaches malloc as ~2^64 bytes, which ASan
   * aborts on instead of returning NULL.) */
}

/* The sampler's function written plainly (the whole vocabulary sorted by qsort, as the
 * sampler computed it before its filter and radix sort): the same token for every seed. */
typedef struct rcand {
  float logit;
  int32_t id;
} rcand;
static int rcand_cmp(const void *pa, const void *pb) {
  const rcand *a = pa, *b = pb;
  if (a->logit != b->logit) return a->logit < b->logit ? 1 : -1;
  return a->id - b->id;
}
static int32_t ref_sample(const float *x, int64_t v, float temp, int top_k, float top_p,
                          uint64_t *state) {
  rcand *c = malloc((size_t)v * sizeof *c);
  for (int64_t i = 0; i < v; i++) c[i] = (rcand){x[i], (int32_t)i};
  qsort(c, (size_t)v, sizeof *c, rcand_cmp);
  int64_t n = top_k > 0 && top_k < v ? top_k : v;
  double inv_t = 1.0 / temp, sum = 0.0, max = c[0].logit;
  for (int64_t i = 0; i < n; i++) {
    double w = exp(((double)c[i].logit - max) * inv_t);
    c[i].logit = (float)w;
    sum += w;
  }
  if (top_p > 0.0f && top_p < 1.0f) {
    double acc = 0.0;
    int64_t keep = 0;
    while (keep < n && acc < top_p * sum) acc += c[keep++].logit;
    n = keep;
    sum = acc;
  }
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull); /* the sampler's splitmix64 */
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  double r = (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53 * sum, acc = 0.0;
  int32_t id = c[n - 1].id;
  for (int64_t i = 0; i < n; i++)
    if (r < (acc += c[i].logit)) {
      id = c[i].id;
      break;
    }
  free(c);
  return id;
}

static void test_matches_plain_sort(void) {
  const int64_t vocab = 49152;
  float *x = malloc((size_t)vocab * sizeof *x);
  const float temps[] = {0.3f, 0.7f, 1.0f, 1.6f};
  const int top_ks[] = {0, 1, 40, 5000};
  const float top_ps[] = {1.0f, 0.9f, 0.5f};
  int same = 0, total = 0;
  for (int dist = 0; dist < 2; dist++) {
    for (int64_t i = 0; i < vocab; i++) {      /* a peaked LLM-like spread, or coarse ties */
      double u = (rnd() + 0.5) / 2147483648.0; /* rnd: 31 bits */
      x[i] = dist ? (float)(rnd() % 64) * 0.25f : (float)(-4.0 * log(-log(u)) + 2.0);
    }
    for (size_t a = 0; a < 4; a++)
      for (size_t b = 0; b < 4; b++)
        for (size_t c = 0; c < 3; c++) {
          irt_sampler *s = make(temps[a], top_ks[b], top_ps[c], 77 + a, vocab);
          uint64_t state = 77 + a;
          for (int k = 0; k < 8; k++, total++)
            same += irt_sampler_sample(s, x) ==
                    ref_sample(x, vocab, temps[a], top_ks[b], top_ps[c], &state);
          irt_sampler_destroy(s);
        }
  }
  printf("matches the plain-sort sampler: %d/%d draws\n", same, total);
  CHECK(same == total);
  free(x);
}

/* irt_sampler_skip(n) leaves the generator where n samples would: the tokens after it are
 * those that follow n samples of the same seed; a greedy sampler has no draws to skip. */
static void test_skip(void) {
  float x[NV];
  distinct_logits(x, NV, 0.0f, 2.0f);
  int32_t all[60];
  draw(0.9f, 77, x, NV, all, 60);
  for (int n = 0; n < 40; n += 13) {
    irt_sampler *s = make(0.9f, 0, 1.0f, 77, NV);
    irt_sampler_skip(s, n);
    int ok = 1;
    for (int i = n; i < 60; i++) ok &= irt_sampler_sample(s, x) == all[i];
    CHECKF(ok, "skip %d: the tokens after it are not the draws from %d on", n, n);
    irt_sampler_destroy(s);
  }
  irt_sampler *g = make(0.0f, 0, 1.0f, 77, NV);
  irt_sampler_skip(g, 5);
  CHECK(irt_sampler_sample(g, x) == irt_sampler_sample(g, x));
  irt_sampler_destroy(g);
}

/* min_p (vLLM's): the candidates with probability under min_p times the likeliest's are
 * dropped before top_p. Logits 0, -1, -2, -10 at temperature 1 weigh 1, 0.368, 0.135 and
 * 4.5e-5 (sum 1.503); with min_p 0.3 only the first two remain (sum 1.368): a draw of
 * u = 0.95 falls at 1.2996, on token 1, where without min_p it falls at 1.428, on token 2.
 * And min_p 1 is greedy at any temperature. */
static void test_min_p(void) {
  const float x[4] = {0.0f, -1.0f, -2.0f, -10.0f};
  irt_sampling p = {.temperature = 1.0f, .top_p = 1.0f, .seed = 3, .min_p = 0.3f};
  irt_sampler *s = NULL;
  CHECK(irt_sampler_create(&p, 4, &s, NULL) == IRT_OK);
  CHECK(sampler_sample_u(s, x, 0.95) == 1 && sampler_sample_u(s, x, 0.7) == 0);
  int seen[4] = {0};
  for (int k = 0; k < 2000; k++) seen[irt_sampler_sample(s, x)]++;
  CHECKF(seen[2] == 0 && seen[3] == 0 && seen[1] > 400 && seen[1] < 700, "min_p 0.3: %d %d %d %d",
         seen[0], seen[1], seen[2], seen[3]);
  irt_sampler_destroy(s);
  p.min_p = 0.0f;
  CHECK(irt_sampler_create(&p, 4, &s, NULL) == IRT_OK);
  CHECK(sampler_sample_u(s, x, 0.95) == 2);
  irt_sampler_destroy(s);
  p.min_p = 1.0f, p.temperature = 5.0f;
  CHECK(irt_sampler_create(&p, 4, &s, NULL) == IRT_OK);
  for (int k = 0; k < 100; k++) CHECK(irt_sampler_sample(s, x) == 0);
  irt_sampler_destroy(s);
}

int main(void) {
  test_greedy();
  test_min_p();
  test_skip();
  test_top1_any_temperature();
  test_top_k_membership();
  test_top_k_ties();
  test_top_k_distribution();
  test_top_p();
  test_seeds();
  test_frequencies_and_temperature();
  test_create_rejects_empty_vocab();
  test_matches_plain_sort();
  return tcheck_done("test_sampler");
}
