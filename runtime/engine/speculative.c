/* speculative: what speculative decoding needs beyond a step: drafts by prompt lookup, cutting a
 * sequence back to the positions whose drafts were kept, and whether a draft is worth its
 * row (the step cost model; engine.h). */
#include <string.h>

#include "engine.h"
#include "model.h"

int irt_prompt_lookup(int32_t *tokens, int64_t n, int ngram_min, int ngram_max, int cap) {
  if (ngram_min <= 0) ngram_min = IRT_SPEC_NGRAM_MIN;
  if (ngram_max <= 0) ngram_max = ngram_min > IRT_SPEC_NGRAM_MAX ? ngram_min : IRT_SPEC_NGRAM_MAX;
  for (int64_t g = ngram_max; g >= ngram_min && cap > 0; g--) {
    if (g >= n) continue;
    const int32_t *tail = tokens + n - g;
    for (int64_t j = n - g - 1; j >= 0; j--) {
      if (tokens[j] != tail[0] || memcmp(tokens + j, tail, (size_t)g * sizeof *tokens)) continue;
      int64_t d = n - (j + g) < cap ? n - (j + g) : cap;
      memcpy(tokens + n, tokens + j + g, (size_t)d * sizeof *tokens); /* ends by n */
      return (int)d;
    }
  }
  return 0;
}

void irt_seq_truncate(irt_seq *s, int64_t len) {
  if (len < 0) len = 0;
  if (len > s->len) return;
  s->len = len;
  int64_t bs = s->m->kv.block_size, keep = (len + bs - 1) / bs;
  for (int64_t i = keep; i < s->n_blocks; i++) kv_block_unref(&s->m->kv, s->blocks[i]);
  if (s->n_blocks > keep) s->n_blocks = keep;
}

void step_cost_add(step_cost *c, double tokens, double ms) {
  const double k = STEP_COST_DECAY;
  c->w = c->w * k + 1;
  c->t = c->t * k + tokens;
  c->tt = c->tt * k + tokens * tokens;
  c->y = c->y * k + ms;
  c->ty = c->ty * k + tokens * ms;
}

bool step_cost_fit(const step_cost *c, double *a, double *b) {
  if (c->w < 4) return false;
  double mt = c->t / c->w, var = c->tt / c->w - mt * mt; /* of T */
  if (var < 0.1) return false;                           /* nearly one size of step */
  *b = (c->ty / c->w - mt * c->y / c->w) / var;
  *a = c->y / c->w - *b * mt;
  if (*a < 0) *a = 0; /* cost in proportion to the tokens: a draft is worth its row only if sure */
  return *b > 0;
}

int spec_worth(double alpha, double a, double b, double c, double *tokens, double *extra,
               double *value, int cap) {
  int d = 0;
  for (double p = alpha; d < cap && p * (a + b * *tokens + *extra) >= (b + c) * *value;
       p *= alpha, d++) {
    *tokens += 1;
    *extra += c;
    *value += p;
  }
  return d;
}

bool spec_keep(double p_x, double q_x, double u) { return u * q_x < p_x; }

int32_t spec_residual(const float *p, const float *q, int64_t vocab, double u) {
  double sum = 0.0, best = -1.0;
  int32_t arg = 0;
  for (int64_t i = 0; i < vocab; i++) {
    double r = (double)p[i] - (double)q[i];
    if (r > 0) sum += r;
    if (p[i] > best) best = p[i], arg = (int32_t)i;
  }
  if (!(sum > 0)) { /* p <= q everywhere (p == q, which a rejection cannot meet): from p */
    double tot = 0.0, acc = 0.0;
    for (int64_t i = 0; i < vocab; i++) tot += p[i] > 0 ? (double)p[i] : 0.0;
    for (int64_t i = 0; tot > 0 && i < vocab; i++)
      if (p[i] > 0 && u * tot < (acc += (double)p[i])) return (int32_t)i;
    return arg;
  }
  double at = u * sum, acc = 0.0;
  int32_t last = arg;
  for (int64_t i = 0; i < vocab; i++) {
    double r = (double)p[i] - (double)q[i];
    if (!(r > 0)) continue;
    acc += r;
    last = (int32_t)i;
    if (at < acc) return last;
  }
  return last;
}
