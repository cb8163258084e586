/* tok_decode: ids to text, whole or streamed. Both run the tokens' precomputed bytes
 * through one incremental UTF-8 checker, so a character split over tokens comes out once
 * complete and invalid bytes become U+FFFD exactly as Rust's from_utf8_lossy does it. */
#include <string.h>

#include "tok_internal.h"

static const uint8_t REPLACEMENT[3] = {0xEF, 0xBF, 0xBD}; /* U+FFFD */

/* Output that counts everything but writes only what fits. */
typedef struct sink {
  char *buf;
  size_t cap, len;
} sink;

static void sink_put(sink *k, const uint8_t *p, size_t n) {
  if (k->len < k->cap) {
    size_t room = k->cap - k->len;
    memcpy(k->buf + k->len, p, n < room ? n : room);
  }
  k->len += n;
}

/* Feeds bytes through the stream's pending partial character. A byte that cannot continue
 * the pending sequence ends it with one U+FFFD and is then looked at afresh (the "maximal
 * subpart" rule). */
static void feed(tok_stream *s, const uint8_t *p, size_t n, sink *k) {
  size_t i = 0;
  while (i < n) {
    uint8_t b = p[i];
    if (s->n_pending == 0) {
      size_t j = i;
      while (j < n && p[j] < 0x80) j++;
      if (j > i) {
        sink_put(k, p + i, j - i);
        i = j;
        continue;
      }
      if (tok_utf8_seq_len(b) == 0) sink_put(k, REPLACEMENT, 3);
      else s->pending[s->n_pending++] = b;
      i++;
      continue;
    }
    if (!tok_utf8_cont_ok(s->pending[0], s->n_pending, b)) {
      sink_put(k, REPLACEMENT, 3);
      s->n_pending = 0;
      continue;
    }
    s->pending[s->n_pending++] = b;
    i++;
    if (s->n_pending == tok_utf8_seq_len(s->pending[0])) {
      sink_put(k, s->pending, (size_t)s->n_pending);
      s->n_pending = 0;
    }
  }
}

static void stream_piece(tok_stream *s, int32_t id, sink *k) {
  const irt_tokenizer *t = s->t;
  if (!t || id < 0 || id >= t->n_tokens) return;
  if (s->skip_special && tok_is_special_type(t->types[id])) return;
  const uint8_t *p = (const uint8_t *)t->dec + t->dec_off[id];
  size_t n = t->dec_off[id + 1] - t->dec_off[id];
  if (n == 0) return;
  if (s->first) {
    s->first = false;
    /* HF's Strip decoder (or Metaspace's first-token rule): drop the prefix space */
    if (t->model == TOK_BPE_SPM && t->prefix != TOK_PREFIX_NONE && p[0] == ' ') {
      p++;
      n--;
    }
  }
  feed(s, p, n, k);
}

static void stream_end(tok_stream *s, sink *k) {
  if (s->n_pending) sink_put(k, REPLACEMENT, 3);
  s->n_pending = 0;
  s->first = true;
}

void tok_stream_init(tok_stream *s, const irt_tokenizer *t, bool skip_special) {
  memset(s, 0, sizeof *s);
  s->t = t;
  s->skip_special = skip_special;
  s->first = true;
}

size_t tok_stream_push(tok_stream *s, int32_t id, char *buf, size_t cap) {
  sink k = {buf, buf ? cap : 0, 0};
  stream_piece(s, id, &k);
  return k.len;
}

size_t tok_stream_finish(tok_stream *s, char *buf, size_t cap) {
  sink k = {buf, buf ? cap : 0, 0};
  stream_end(s, &k);
  return k.len;
}

ir_status tok_decode(const irt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                     char *buf, size_t cap, size_t *out_len, ir_diag *d) {
  if (!t || !out_len || (!ids && n) || (!buf && cap))
    return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: decode: NULL argument");
  *out_len = 0;
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= t->n_tokens)
      return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: decode: id %d at %zu out of range [0, %d)",
                         (int)ids[i], i, (int)t->n_tokens);
  tok_stream s;
  sink k = {buf, cap, 0};
  tok_stream_init(&s, t, skip_special);
  for (size_t i = 0; i < n; i++) stream_piece(&s, ids[i], &k);
  stream_end(&s, &k);
  *out_len = k.len;
  return IR_OK;
}

const uint8_t *tok_piece(const irt_tokenizer *t, int32_t id, size_t *len) {
  *len = 0;
  if (!t || id < 0 || id >= t->n_tokens) return NULL;
  *len = t->dec_off[id + 1] - t->dec_off[id];
  return (const uint8_t *)t->dec + t->dec_off[id];
}
