/* tok_pre: the pre-tokenizer splits as hand-written matchers, one per regex listed at
 * tok_pre in tokenizer.h. Each matcher returns the end of the leftmost-first match
 * starting at p, exactly as Oniguruma's backtracking would choose it for that pattern. */
#include "tok_internal.h"

static inline uint32_t cp_at(const uint8_t *s, size_t p, size_t n, size_t *len) {
  if (s[p] < 0x80) {
    *len = 1;
    return s[p];
  }
  return tok_utf8_get(s + p, n - p, len);
}

static inline uint32_t flags_at(const uint8_t *s, size_t p, size_t n, size_t *len) {
  return tok_uc_flags(cp_at(s, p, n, len));
}

#define TOK_UC_ANY (TOK_UC_L | TOK_UC_N | TOK_UC_WS)

/* End of the run of characters from p whose flags satisfy (flags & mask) == want. */
static size_t run(const uint8_t *s, size_t p, size_t n, uint32_t mask, uint32_t want) {
  while (p < n) {
    size_t len;
    if ((flags_at(s, p, n, &len) & mask) != want) break;
    p += len;
  }
  return p;
}

/* Length of a contraction ('s 't 're 've 'm 'll 'd) at p (s[p] == '\''), or 0.
 * Case-insensitive as (?i:...) in Oniguruma, where U+017F (long s) folds to s. */
static size_t contraction(const uint8_t *s, size_t p, size_t n, bool icase) {
  if (p + 1 >= n) return 0;
  uint8_t a = s[p + 1], b = p + 2 < n ? s[p + 2] : 0;
  if (icase) {
    if (a == 0xC5 && b == 0xBF) return 3; /* 'ſ */
    a = (uint8_t)(a | (a >= 'A' && a <= 'Z' ? 0x20 : 0));
    b = (uint8_t)(b | (b >= 'A' && b <= 'Z' ? 0x20 : 0));
  }
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

/* \s+(?!\S)|\s+ at p (a white-space character): a run that reaches the end is taken whole,
 * otherwise its last character is left to start the next word. */
static size_t ws_tail(const uint8_t *s, size_t p, size_t n) {
  size_t q = p, last = p;
  while (q < n) {
    size_t len;
    if (!(flags_at(s, q, n, &len) & TOK_UC_WS)) break;
    last = q;
    q += len;
  }
  if (q == n) return n;
  return last > p ? last : q;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const uint8_t *s, size_t p, size_t n) {
  size_t len, k;
  uint32_t f = flags_at(s, p, n, &len);
  if (s[p] == '\'' && (k = contraction(s, p, n, false)) != 0) return p + k;
  size_t q = p;
  if (s[p] == ' ' && p + 1 < n) {
    q = p + 1;
    f = flags_at(s, q, n, &len);
  }
  if (f & TOK_UC_L) return run(s, q + len, n, TOK_UC_L, TOK_UC_L);
  if (f & TOK_UC_N) return run(s, q + len, n, TOK_UC_N, TOK_UC_N);
  if (!(f & TOK_UC_ANY)) return run(s, q + len, n, TOK_UC_ANY, 0);
  return ws_tail(s, p, n);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama3(const uint8_t *s, size_t p, size_t n, int max_digits) {
  size_t len, len2, k;
  uint32_t f = flags_at(s, p, n, &len);
  if (s[p] == '\'' && (k = contraction(s, p, n, true)) != 0) return p + k;
  if (f & TOK_UC_L) return run(s, p + len, n, TOK_UC_L, TOK_UC_L);
  if (s[p] != '\r' && s[p] != '\n' && !(f & TOK_UC_N) && p + len < n &&
      (flags_at(s, p + len, n, &len2) & TOK_UC_L))
    return run(s, p + len + len2, n, TOK_UC_L, TOK_UC_L);
  if (f & TOK_UC_N) {
    size_t q = p + len;
    for (int i = 1; i < max_digits && q < n && (flags_at(s, q, n, &len2) & TOK_UC_N); i++)
      q += len2;
    return q;
  }
  size_t q = p;
  uint32_t fq = f;
  if (s[p] == ' ' && p + 1 < n) {
    q = p + 1;
    fq = flags_at(s, q, n, &len);
  }
  if (!(fq & TOK_UC_ANY)) {
    q = run(s, q + len, n, TOK_UC_ANY, 0);
    while (q < n && (s[q] == '\r' || s[q] == '\n')) q++;
    return q;
  }
  /* \s*[\r\n]+: up to and including the last CR or LF of the white-space run */
  size_t nl_end = 0;
  for (q = p; q < n;) {
    if (!(flags_at(s, q, n, &len) & TOK_UC_WS)) break;
    q += len;
    if (s[q - 1] == '\r' || s[q - 1] == '\n') nl_end = q;
  }
  if (nl_end) return nl_end;
  return ws_tail(s, p, n);
}

/* Metaspace split: each word starts at a U+2581 (E2 96 81) and runs to the next one. */
static size_t match_metaspace(const uint8_t *s, size_t p, size_t n) {
  size_t q = p;
  if (q + 3 <= n && s[q] == 0xE2 && s[q + 1] == 0x96 && s[q + 2] == 0x81) q += 3;
  while (q < n && !(s[q] == 0xE2 && q + 3 <= n && s[q + 1] == 0x96 && s[q + 2] == 0x81)) q++;
  return q;
}

void tok_pre_init(tok_pre_iter *it, tok_pre pre, const uint8_t *s, size_t n) {
  it->pre = pre;
  it->s = s;
  it->pos = 0;
  it->n = n;
  it->run_end = 0;
}

/* SMOLLM: every \p{N} character alone, the text between them split as GPT2. */
static size_t next_smollm(tok_pre_iter *it) {
  size_t len, p = it->pos;
  if (p >= it->run_end) {
    if (flags_at(it->s, p, it->n, &len) & TOK_UC_N) return p + len;
    size_t q = p;
    while (q < it->n && !(flags_at(it->s, q, it->n, &len) & TOK_UC_N)) q += len;
    it->run_end = q;
  }
  return match_gpt2(it->s, p, it->run_end);
}

bool tok_pre_next(tok_pre_iter *it, size_t *start, size_t *end) {
  if (it->pos >= it->n) return false;
  size_t p = it->pos, e;
  switch (it->pre) {
  case TOK_PRE_GPT2: e = match_gpt2(it->s, p, it->n); break;
  case TOK_PRE_LLAMA3: e = match_llama3(it->s, p, it->n, 3); break;
  case TOK_PRE_QWEN2: e = match_llama3(it->s, p, it->n, 1); break;
  case TOK_PRE_SMOLLM: e = next_smollm(it); break;
  case TOK_PRE_METASPACE: e = match_metaspace(it->s, p, it->n); break;
  default: e = it->n; break;
  }
  if (e <= p) e = it->n; /* cannot happen; never loop forever */
  *start = p;
  *end = e;
  it->pos = e;
  return true;
}
