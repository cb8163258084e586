/* tok_unicode: UTF-8 checking and decoding, letter/number/space classes and NFC for the
 * tokenizer, over the tables generated into unicode_data.c. */
#include <string.h>

#include "tok_internal.h"

static const uint8_t ascii_flags[128] = {
    ['\t'] = TOK_UC_WS, ['\n'] = TOK_UC_WS, [0x0B] = TOK_UC_WS, [0x0C] = TOK_UC_WS,
    ['\r'] = TOK_UC_WS, [' '] = TOK_UC_WS,  ['0'] = TOK_UC_N,   ['1'] = TOK_UC_N,
    ['2'] = TOK_UC_N,   ['3'] = TOK_UC_N,   ['4'] = TOK_UC_N,   ['5'] = TOK_UC_N,
    ['6'] = TOK_UC_N,   ['7'] = TOK_UC_N,   ['8'] = TOK_UC_N,   ['9'] = TOK_UC_N,
    ['A'] = TOK_UC_L,   ['B'] = TOK_UC_L,   ['C'] = TOK_UC_L,   ['D'] = TOK_UC_L,
    ['E'] = TOK_UC_L,   ['F'] = TOK_UC_L,   ['G'] = TOK_UC_L,   ['H'] = TOK_UC_L,
    ['I'] = TOK_UC_L,   ['J'] = TOK_UC_L,   ['K'] = TOK_UC_L,   ['L'] = TOK_UC_L,
    ['M'] = TOK_UC_L,   ['N'] = TOK_UC_L,   ['O'] = TOK_UC_L,   ['P'] = TOK_UC_L,
    ['Q'] = TOK_UC_L,   ['R'] = TOK_UC_L,   ['S'] = TOK_UC_L,   ['T'] = TOK_UC_L,
    ['U'] = TOK_UC_L,   ['V'] = TOK_UC_L,   ['W'] = TOK_UC_L,   ['X'] = TOK_UC_L,
    ['Y'] = TOK_UC_L,   ['Z'] = TOK_UC_L,   ['a'] = TOK_UC_L,   ['b'] = TOK_UC_L,
    ['c'] = TOK_UC_L,   ['d'] = TOK_UC_L,   ['e'] = TOK_UC_L,   ['f'] = TOK_UC_L,
    ['g'] = TOK_UC_L,   ['h'] = TOK_UC_L,   ['i'] = TOK_UC_L,   ['j'] = TOK_UC_L,
    ['k'] = TOK_UC_L,   ['l'] = TOK_UC_L,   ['m'] = TOK_UC_L,   ['n'] = TOK_UC_L,
    ['o'] = TOK_UC_L,   ['p'] = TOK_UC_L,   ['q'] = TOK_UC_L,   ['r'] = TOK_UC_L,
    ['s'] = TOK_UC_L,   ['t'] = TOK_UC_L,   ['u'] = TOK_UC_L,   ['v'] = TOK_UC_L,
    ['w'] = TOK_UC_L,   ['x'] = TOK_UC_L,   ['y'] = TOK_UC_L,   ['z'] = TOK_UC_L,
};

/* The range holding cp, or NULL. */
static const tok_uc_range *range_find(const tok_uc_range *r, size_t n, uint32_t cp) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (cp < r[mid].lo) hi = mid;
    else if (cp > r[mid].hi) lo = mid + 1;
    else return &r[mid];
  }
  return NULL;
}

uint32_t tok_uc_flags(uint32_t cp) {
  if (cp < 128) return ascii_flags[cp];
  const tok_uc_range *r = range_find(tok_uc_cat, tok_uc_cat_n, cp);
  return r ? r->v : 0;
}

/* ---- UTF-8 --------------------------------------------------------------------------- */

int tok_utf8_seq_len(uint8_t b) {
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0; /* continuation byte or overlong 2-byte lead */
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF5) return 4;
  return 0;
}

bool tok_utf8_cont_ok(uint8_t lead, int i, uint8_t b) {
  if (i == 1) { /* the second byte carries the overlong / surrogate / range limits */
    if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
    if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
    if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
    if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  }
  return (b & 0xC0) == 0x80;
}

size_t tok_utf8_check(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      i++;
      continue;
    }
    int len = tok_utf8_seq_len(s[i]);
    if (len == 0 || (size_t)len > n - i) return i;
    for (int k = 1; k < len; k++)
      if (!tok_utf8_cont_ok(s[i], k, s[i + k])) return i;
    i += (size_t)len;
  }
  return n;
}

uint32_t tok_utf8_get(const uint8_t *s, size_t n, size_t *len) {
  uint8_t b = s[0];
  if (b < 0x80 || n < 2) {
    *len = 1;
    return b;
  }
  if (b < 0xE0) {
    *len = 2;
    return (uint32_t)(b & 0x1F) << 6 | (s[1] & 0x3F);
  }
  if (b < 0xF0 || n < 4) {
    *len = n < 3 ? n : 3;
    if (n < 3) return 0xFFFD;
    return (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
  }
  *len = 4;
  return (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
         (s[3] & 0x3F);
}

size_t tok_utf8_put(uint32_t cp, uint8_t *o) {
  if (cp < 0x80) {
    o[0] = (uint8_t)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (uint8_t)(0xC0 | cp >> 6);
    o[1] = (uint8_t)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (uint8_t)(0xE0 | cp >> 12);
    o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (uint8_t)(0xF0 | cp >> 18);
  o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}

/* ---- NFC ----------------------------------------------------------------------------- */

enum {
  HANGUL_S0 = 0xAC00,
  HANGUL_L0 = 0x1100,
  HANGUL_V0 = 0x1161,
  HANGUL_T0 = 0x11A7,
  HANGUL_LN = 19,
  HANGUL_VN = 21,
  HANGUL_TN = 28,
  HANGUL_NN = HANGUL_VN * HANGUL_TN,
  HANGUL_SN = HANGUL_LN * HANGUL_NN,
};

bool tok_nfc_needed(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0xCC) { /* everything below U+0300 is stable */
      size_t k = s[i] < 0x80 ? 1 : (size_t)tok_utf8_seq_len(s[i]);
      i += k ? k : 1; /* an invalid lead byte (callers check UTF-8 first) still advances */
      continue;
    }
    size_t len;
    uint32_t cp = tok_utf8_get(s + i, n - i, &len);
    if (range_find(tok_uc_nfc_unsafe, tok_uc_nfc_unsafe_n, cp)) return true;
    i += len;
  }
  return false;
}

static uint32_t ccc_of(uint32_t cp) {
  if (cp < 0x300) return 0;
  const tok_uc_range *r = range_find(tok_uc_ccc, tok_uc_ccc_n, cp);
  return r ? r->v : 0;
}

/* Appends the full canonical decomposition of cp to w; returns the count. */
static size_t decompose(uint32_t cp, uint32_t *w) {
  if (cp >= HANGUL_S0 && cp < HANGUL_S0 + HANGUL_SN) {
    uint32_t si = cp - HANGUL_S0, t = si % HANGUL_TN;
    w[0] = HANGUL_L0 + si / HANGUL_NN;
    w[1] = HANGUL_V0 + (si % HANGUL_NN) / HANGUL_TN;
    if (t == 0) return 2;
    w[2] = HANGUL_T0 + t;
    return 3;
  }
  if (cp >= 0xC0) {
    size_t lo = 0, hi = tok_uc_decomps_n;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (tok_uc_decomps[mid].cp < cp) lo = mid + 1;
      else hi = mid;
    }
    if (lo < tok_uc_decomps_n && tok_uc_decomps[lo].cp == cp) {
      const tok_uc_decomp *e = &tok_uc_decomps[lo];
      memcpy(w, tok_uc_decomp_data + e->off, e->len * sizeof *w);
      return e->len;
    }
  }
  w[0] = cp;
  return 1;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= HANGUL_L0 && a < HANGUL_L0 + HANGUL_LN && b >= HANGUL_V0 && b < HANGUL_V0 + HANGUL_VN)
    return HANGUL_S0 + ((a - HANGUL_L0) * HANGUL_VN + (b - HANGUL_V0)) * HANGUL_TN;
  if (a >= HANGUL_S0 && a < HANGUL_S0 + HANGUL_SN && (a - HANGUL_S0) % HANGUL_TN == 0 &&
      b > HANGUL_T0 && b < HANGUL_T0 + HANGUL_TN)
    return a + (b - HANGUL_T0);
  size_t lo = 0, hi = tok_uc_comps_n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const tok_uc_comp *c = &tok_uc_comps[mid];
    if (c->first < a || (c->first == a && c->second < b)) lo = mid + 1;
    else hi = mid;
  }
  if (lo < tok_uc_comps_n && tok_uc_comps[lo].first == a && tok_uc_comps[lo].second == b)
    return tok_uc_comps[lo].comp;
  return 0;
}

/* Stable sort of each run of non-starters by combining class (runs are short). */
static void canonical_order(uint32_t *w, size_t m) {
  for (size_t i = 1; i < m; i++) {
    uint32_t c = w[i], cc = ccc_of(c);
    if (cc == 0) continue;
    size_t j = i;
    while (j > 0 && ccc_of(w[j - 1]) > cc) {
      w[j] = w[j - 1];
      j--;
    }
    w[j] = c;
  }
}

/* Canonical composition in place (the algorithm of UAX #15); returns the new count. */
static size_t compose_all(uint32_t *w, size_t m) {
  if (m == 0) return 0;
  size_t starter = 0, out = 1;
  uint32_t last_cc = ccc_of(w[0]) ? 256 : 0;
  for (size_t i = 1; i < m; i++) {
    uint32_t c = w[i], cc = ccc_of(c);
    uint32_t comp = (last_cc < cc || last_cc == 0) ? compose(w[starter], c) : 0;
    if (comp) {
      w[starter] = comp;
      continue;
    }
    if (cc == 0) starter = out;
    last_cc = cc;
    w[out++] = c;
  }
  return out;
}

size_t tok_nfc(const uint8_t *s, size_t n, uint8_t *out, uint32_t *work) {
  size_t m = 0, i = 0, o = 0;
  while (i < n) {
    size_t len;
    uint32_t cp = tok_utf8_get(s + i, n - i, &len);
    m += decompose(cp, work + m);
    i += len;
  }
  canonical_order(work, m);
  m = compose_all(work, m);
  for (size_t k = 0; k < m; k++) o += tok_utf8_put(work[k], out + o);
  return o;
}
