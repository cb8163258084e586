/* spec: what speculative decoding needs beyond a step: drafts by prompt lookup, and
 * cutting a sequence back to the positions whose drafts were kept. */
#include <string.h>

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
  for (int64_t i = keep; i < s->n_blocks; i++) irt_kv_block_unref(&s->m->kv, s->blocks[i]);
  if (s->n_blocks > keep) s->n_blocks = keep;
}
