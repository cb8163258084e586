/* tok_encode: text to ids. Added tokens are split out first (pass 1: tokens matched in the
 * raw text), each text run is normalized (NFC, SPM spaces), split again on added tokens
 * matched after normalization (pass 2), prefixed, pre-tokenized and merged, which is the
 * order HF tokenizers' AddedVocabulary + normalizer + pre-tokenizer + model apply. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "ir_alloc.h"

static const uint8_t SPM_SPACE[3] = {0xE2, 0x96, 0x81}; /* U+2581 */

/* ---- normalization ------------------------------------------------------------------- */

size_t tok_norm_cap(const irt_tokenizer *t, size_t n, size_t spaces) {
  /* NFC grows UTF-8 at most 3x; it never adds or removes U+0020, each of which SPM turns
   * into 3 bytes; plus the prefix. */
  return (t->nfc ? 3 * n : n) + (t->model == TOK_BPE_SPM ? 2 * spaces : 0) + 3;
}

size_t tok_normalize(const irt_tokenizer *t, const uint8_t *s, size_t n, uint8_t *out, uint8_t *tmp,
                     uint32_t *work) {
  bool spm = t->model == TOK_BPE_SPM;
  size_t o = 0;
  if (t->nfc && tok_nfc_needed(s, n)) {
    n = tok_nfc(s, n, tmp, work);
    s = tmp;
  }
  if (t->prefix == TOK_PREFIX_NORMALIZER && n > 0) {
    if (spm) memcpy(out, SPM_SPACE, 3), o = 3;
    else out[o++] = ' ';
  }
  if (!spm) {
    memcpy(out + o, s, n);
    return o + n;
  }
  for (size_t i = 0; i < n; i++) {
    if (s[i] == ' ') {
      memcpy(out + o, SPM_SPACE, 3);
      o += 3;
    } else {
      out[o++] = s[i];
    }
  }
  return o;
}

static bool norm_is_identity(const irt_tokenizer *t) {
  return !t->nfc && t->model == TOK_BPE_BYTE_LEVEL && t->prefix != TOK_PREFIX_NORMALIZER;
}

/* ---- added-token matchers ------------------------------------------------------------ */

static int cmp_entry(const void *pa, const void *pb) {
  const tok_match_entry *a = pa, *b = pb;
  if (a->lead != b->lead) return a->lead < b->lead ? -1 : 1;
  if (a->len != b->len) return a->len > b->len ? -1 : 1;
  return a->id < b->id ? -1 : a->id > b->id;
}

void tok_matcher_free(tok_matcher *m) {
  ir_free(m->e);
  ir_free(m->pat);
  memset(m, 0, sizeof *m);
}

static bool matcher_wants(const irt_tokenizer *t, int32_t id, bool want_normalized) {
  size_t len = t->off[id + 1] - t->off[id] - 1;
  bool normalized = (t->attrs[id] & TOK_ATTR_NORMALIZED) != 0;
  return len > 0 && tok_is_added_type(t->types[id]) && normalized == want_normalized;
}

/* Fills the entries in id order; patterns are normalized for pass 2. */
static ir_status matcher_fill(irt_tokenizer *t, tok_matcher *m, bool want_normalized, size_t total,
                              size_t maxlen) {
  bool nfc = want_normalized && t->nfc;
  /* tok_norm_cap allows one prefix; each of the m->n patterns may get its own */
  size_t cap = want_normalized ? tok_norm_cap(t, total, total) + 3 * (size_t)m->n : total;
  uint8_t *tmp = nfc ? ir_malloc(3 * maxlen + 1) : NULL;
  uint32_t *work = nfc ? ir_malloc((4 * maxlen + 4) * sizeof *work) : NULL;
  m->pat = ir_malloc(cap + 1);
  ir_status st = !m->pat || (nfc && (!tmp || !work)) ? IR_OOM : IR_OK;
  uint32_t o = 0;
  int32_t k = 0;
  for (int32_t id = 0; id < t->n_tokens && st == IR_OK; id++) {
    if (!matcher_wants(t, id, want_normalized)) continue;
    const uint8_t *s = (const uint8_t *)t->text + t->off[id];
    size_t len = t->off[id + 1] - t->off[id] - 1;
    if (want_normalized) len = tok_normalize(t, s, len, (uint8_t *)m->pat + o, tmp, work);
    else memcpy(m->pat + o, s, len);
    m->e[k++] = (tok_match_entry){o, (uint32_t)len, id, (uint8_t)m->pat[o]};
    o += (uint32_t)len;
  }
  ir_free(tmp);
  ir_free(work);
  return st;
}

ir_status tok_matcher_build(irt_tokenizer *t, tok_matcher *m, bool want_normalized, ir_diag *d) {
  memset(m, 0, sizeof *m);
  size_t total = 0, maxlen = 0;
  int32_t n = 0;
  for (int32_t id = 0; id < t->n_tokens; id++) {
    if (!matcher_wants(t, id, want_normalized)) continue;
    size_t len = t->off[id + 1] - t->off[id] - 1;
    /* a pattern is normalized as text is (NFC among others), which takes valid UTF-8 */
    if (want_normalized && tok_utf8_check((const uint8_t *)t->text + t->off[id], len) < len)
      return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer: added token %d is not valid UTF-8", id);
    total += len;
    if (len > maxlen) maxlen = len;
    n++;
  }
  if (n == 0) return IR_OK;
  m->n = n;
  m->e = ir_malloc((size_t)n * sizeof *m->e);
  if (!m->e || matcher_fill(t, m, want_normalized, total, maxlen) != IR_OK)
    return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  qsort(m->e, (size_t)n, sizeof *m->e, cmp_entry);
  for (int32_t b = 0, i = 0; b <= 256; b++) {
    while (i < n && m->e[i].lead < (uint32_t)b) i++;
    m->first[b] = i;
  }
  return IR_OK;
}

typedef struct tok_hit {
  size_t start, end; /* the span the token replaces (with lstrip / rstrip spaces) */
  int32_t id;
} tok_hit;

static bool is_word_char(uint32_t cp) {
  return cp == '_' || (tok_uc_flags(cp) & (TOK_UC_L | TOK_UC_N));
}

/* The character ending right before p (p > 0). */
static uint32_t cp_before(const uint8_t *s, size_t p, size_t *start) {
  size_t q = p - 1, len;
  while (q > 0 && (s[q] & 0xC0) == 0x80 && p - q < 4) q--;
  *start = q;
  return tok_utf8_get(s + q, p - q, &len);
}

static bool single_word_ok(const uint8_t *s, size_t n, size_t start, size_t end) {
  size_t q, len;
  if (start > 0 && is_word_char(cp_before(s, start, &q))) return false;
  if (end < n && is_word_char(tok_utf8_get(s + end, n - end, &len))) return false;
  return true;
}

static size_t ws_before(const uint8_t *s, size_t p, size_t floor) {
  size_t q;
  while (p > floor && (tok_uc_flags(cp_before(s, p, &q)) & TOK_UC_WS)) p = q;
  return p < floor ? floor : p;
}

static size_t ws_after(const uint8_t *s, size_t n, size_t p) {
  size_t len;
  while (p < n && (tok_uc_flags(tok_utf8_get(s + p, n - p, &len)) & TOK_UC_WS)) p += len;
  return p;
}

/* The next accepted added token at or after pos (leftmost, then longest). A match that is
 * refused (a special token without parse_special, a single_word token inside a word) is
 * still consumed, as in HF's find_matches. */
/* True when [a, b) overlaps one of the n sorted spans. */
static bool in_spans(const tok_span *sp, size_t n, size_t a, size_t b) {
  for (size_t i = 0; i < n && sp[i].start < b; i++)
    if (sp[i].end > a) return true;
  return false;
}

static bool match_next(const irt_tokenizer *t, const tok_matcher *m, const uint8_t *s, size_t n,
                       size_t pos, bool parse_special, const tok_span *text, size_t n_text,
                       tok_hit *hit) {
  if (m->n == 0) return false;
  for (size_t i = pos; i < n; i++) {
    int32_t k = m->first[s[i]], kend = m->first[s[i] + 1];
    for (; k < kend; k++)
      if (m->e[k].len <= n - i && memcmp(m->pat + m->e[k].off, s + i, m->e[k].len) == 0) break;
    if (k == kend) continue;
    int32_t id = m->e[k].id;
    size_t end = i + m->e[k].len;
    uint8_t attr = t->attrs[id];
    bool special = tok_is_special_type(t->types[id]);
    if ((special && (!parse_special || in_spans(text, n_text, i, end))) ||
        ((attr & TOK_ATTR_SINGLE_WORD) && !single_word_ok(s, n, i, end))) {
      i = end - 1;
      continue;
    }
    hit->id = id;
    hit->start = attr & TOK_ATTR_LSTRIP ? ws_before(s, i, pos) : i;
    hit->end = attr & TOK_ATTR_RSTRIP ? ws_after(s, n, end) : end;
    return true;
  }
  return false;
}

/* ---- the encode pipeline ------------------------------------------------------------- */

typedef struct enc {
  const irt_tokenizer *t;
  bool parse_special;
  const tok_span *text; /* (n_text) where special tokens are text */
  size_t n_text;
  tok_out out;
  uint8_t *norm;  /* normalized text run */
  uint8_t *tmp;   /* NFC output */
  uint32_t *work; /* NFC code points */
  uint8_t *piece; /* a prefixed piece */
  tok_bpe_scratch bpe;
  void *block;
} enc;

/* One block for everything, sized to the input: the normalized text (ncap bytes), pieces
 * of up to p = ncap + 3 bytes with p symbols, 2p heap keys (each merge pops one key and
 * pushes at most two, so at most 2p are live) and 2p bytes for ignore_merges; NFC needs 3n
 * bytes and 4n + 4 code points more. */
static bool enc_alloc(enc *e, const uint8_t *s, size_t len) {
  const irt_tokenizer *t = e->t;
  size_t spaces = 0;
  if (t->model == TOK_BPE_SPM)
    for (const uint8_t *q = s; (q = memchr(q, ' ', len - (size_t)(q - s))) != NULL; q++) spaces++;
  size_t ncap = tok_norm_cap(t, len, spaces), p = ncap + 3;
  size_t nfc_tmp = t->nfc ? 3 * len + 1 : 0, nfc_work = t->nfc ? 4 * len + 4 : 0;
  size_t bytes = 2 * p * sizeof(uint64_t) + nfc_work * sizeof(uint32_t) + p * sizeof(tok_sym) +
                 ncap + nfc_tmp + p + 2 * p + 16;
  uint8_t *b = ir_malloc(bytes);
  if (!b) return false;
  e->block = b;
  e->bpe.heap = (uint64_t *)b;
  b += 2 * p * sizeof(uint64_t);
  e->work = (uint32_t *)b;
  b += nfc_work * sizeof(uint32_t);
  e->bpe.sym = (tok_sym *)b;
  b += p * sizeof(tok_sym);
  e->norm = b;
  b += ncap;
  e->tmp = b;
  b += nfc_tmp;
  e->piece = b;
  b += p;
  e->bpe.wbuf = b;
  return true;
}

static bool starts_with_space(const irt_tokenizer *t, const uint8_t *s, size_t n) {
  if (t->model == TOK_BPE_BYTE_LEVEL) return s[0] == ' ';
  return n >= 3 && memcmp(s, SPM_SPACE, 3) == 0;
}

/* A piece between added tokens: the pre-tokenizer prefix, split, merge. */
static void encode_piece(enc *e, const uint8_t *s, size_t n, bool at_origin) {
  const irt_tokenizer *t = e->t;
  if (n == 0) return;
  if ((t->prefix == TOK_PREFIX_ALWAYS || (t->prefix == TOK_PREFIX_FIRST && at_origin)) &&
      !starts_with_space(t, s, n)) {
    size_t k = t->model == TOK_BPE_SPM ? 3 : 1;
    memcpy(e->piece, k == 3 ? SPM_SPACE : (const uint8_t *)" ", k);
    memcpy(e->piece + k, s, n);
    s = e->piece;
    n += k;
  }
  tok_pre_iter it;
  size_t a, b;
  tok_pre_init(&it, t->pre, s, n);
  while (tok_pre_next(&it, &a, &b)) tok_bpe_word(t, &e->bpe, s + a, b - a, &e->out);
}

/* A text run between pass-1 added tokens, at byte off of the input. */
static void encode_run(enc *e, const uint8_t *s, size_t n, size_t off, bool at_origin) {
  const irt_tokenizer *t = e->t;
  if (n == 0) return;
  /* normalized positions are not the input's: a run touching text spans parses none */
  bool special = e->parse_special && !in_spans(e->text, e->n_text, off, off + n);
  if (!norm_is_identity(t)) {
    n = tok_normalize(t, s, n, e->norm, e->tmp, e->work);
    s = e->norm;
  }
  size_t pos = 0;
  tok_hit h;
  while (match_next(t, &t->match_norm, s, n, pos, special, NULL, 0, &h)) {
    encode_piece(e, s + pos, h.start - pos, at_origin && pos == 0);
    tok_out_put(&e->out, h.id);
    pos = h.end;
  }
  encode_piece(e, s + pos, n - pos, at_origin && pos == 0);
}

ir_status tok_encode(const irt_tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *ids, size_t cap, size_t *out_n, ir_diag *d) {
  return tok_encode_spans(t, text, len, add_special, parse_special, NULL, 0, ids, cap, out_n, d);
}

ir_status tok_encode_spans(const irt_tokenizer *t, const char *text, size_t len, bool add_special,
                           bool parse_special, const tok_span *spans, size_t n_spans, int32_t *ids,
                           size_t cap, size_t *out_n, ir_diag *d) {
  if (!t || !out_n || (!text && len) || (!ids && cap) || (!spans && n_spans))
    return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: encode: NULL argument");
  *out_n = 0;
  const uint8_t *s = (const uint8_t *)(text ? text : "");
  size_t bad = tok_utf8_check(s, len);
  if (bad < len)
    return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: invalid UTF-8 at byte offset %zu (0x%02X)",
                       bad, s[bad]);
  for (size_t i = 0; i < n_spans; i++)
    if (spans[i].start > spans[i].end || spans[i].end > len ||
        (i && spans[i].start < spans[i - 1].end))
      return ir_diag_set(d, IR_INVALID_ARG,
                         "tokenizer: encode: text spans must be sorted, "
                         "disjoint and inside the text");
  enc e = {.t = t,
           .parse_special = parse_special,
           .text = spans,
           .n_text = n_spans,
           .out = {ids, cap, 0}};
  if (!enc_alloc(&e, s, len)) return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  if (add_special && t->add_bos && t->bos_id >= 0) tok_out_put(&e.out, t->bos_id);
  size_t pos = 0;
  tok_hit h;
  while (match_next(t, &t->match_raw, s, len, pos, parse_special, spans, n_spans, &h)) {
    encode_run(&e, s + pos, h.start - pos, pos, pos == 0);
    tok_out_put(&e.out, h.id);
    pos = h.end;
  }
  encode_run(&e, s + pos, len - pos, pos, pos == 0);
  if (add_special && t->add_eos && t->eos_id >= 0) tok_out_put(&e.out, t->eos_id);
  ir_free(e.block);
  *out_n = e.out.n;
  return IR_OK;
}

ir_status tok_encode_alloc(const irt_tokenizer *t, const char *text, size_t len, bool add_special,
                           bool parse_special, int32_t **out, size_t *out_n, ir_diag *d) {
  return tok_encode_spans_alloc(t, text, len, add_special, parse_special, NULL, 0, out, out_n, d);
}

ir_status tok_encode_spans_alloc(const irt_tokenizer *t, const char *text, size_t len,
                                 bool add_special, bool parse_special, const tok_span *spans,
                                 size_t n_spans, int32_t **out, size_t *out_n, ir_diag *d) {
  size_t cap = len + 16, n = 0;
  int32_t *ids = ir_malloc(cap * sizeof *ids);
  ir_status st = ids ? tok_encode_spans(t, text, len, add_special, parse_special, spans, n_spans,
                                        ids, cap, &n, d)
                     : ir_diag_set(d, IR_OOM, "out of memory");
  if (st == IR_OK && n > cap) { /* the first guess was short: size it exactly */
    int32_t *more = ir_realloc(ids, n * sizeof *ids);
    st = more ? tok_encode_spans(t, text, len, add_special, parse_special, spans, n_spans, more, n,
                                 &n, d)
              : ir_diag_set(d, IR_OOM, "out of memory");
    if (more) ids = more;
  }
  if (st != IR_OK) ir_free(ids), ids = NULL, n = 0;
  *out = ids;
  *out_n = n;
  return st;
}
