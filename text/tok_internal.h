/* tok_internal: the tokenizer's private structures and helpers, shared by runtime/tok_*.c
 * (unicode, pre-tokenizers, vocabulary, encode, decode, HF loader, serialization). */
#ifndef TOK_INTERNAL_H
#define TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* ---- Unicode tables (text/unicode_data.c, generated) ------------------------------ */

typedef struct tok_uc_range {
  uint32_t lo, hi; /* inclusive */
  uint32_t v;
} tok_uc_range;

typedef struct tok_uc_decomp {
  uint32_t cp;
  uint16_t off; /* into tok_uc_decomp_data */
  uint16_t len;
} tok_uc_decomp;

typedef struct tok_uc_comp {
  uint32_t first, second, comp;
} tok_uc_comp;

extern const char tok_uc_version[];
extern const tok_uc_range tok_uc_cat[], tok_uc_ccc[], tok_uc_nfc_unsafe[];
extern const size_t tok_uc_cat_n, tok_uc_ccc_n, tok_uc_nfc_unsafe_n;
extern const tok_uc_decomp tok_uc_decomps[];
extern const size_t tok_uc_decomps_n;
extern const uint32_t tok_uc_decomp_data[];
extern const size_t tok_uc_decomp_data_n;
extern const tok_uc_comp tok_uc_comps[];
extern const size_t tok_uc_comps_n;

/* ---- Unicode helpers (tok_unicode.c) ------------------------------------------------- */

enum { TOK_UC_L = 1, TOK_UC_N = 2, TOK_UC_WS = 4 };

/* TOK_UC_* flags of a code point. */
uint32_t tok_uc_flags(uint32_t cp);
/* Offset of the first byte that is not part of valid UTF-8 (overlong forms, surrogates,
 * values above U+10FFFF and truncated sequences are invalid), or n if all is valid. */
size_t tok_utf8_check(const uint8_t *s, size_t n);
/* Decodes the character at s (valid UTF-8 with n >= 1 bytes left); *len gets its size. */
uint32_t tok_utf8_get(const uint8_t *s, size_t n, size_t *len);
/* Writes cp as UTF-8 (1-4 bytes) and returns the count. */
size_t tok_utf8_put(uint32_t cp, uint8_t *out);
/* The total length of a sequence starting with lead byte b, or 0 for an invalid lead. */
int tok_utf8_seq_len(uint8_t b);
/* Whether b may follow the bytes lead..(i bytes so far) in a valid sequence (i >= 1). */
bool tok_utf8_cont_ok(uint8_t lead, int i, uint8_t b);

/* NFC: whether s (valid UTF-8) may change under NFC at all (fast scan). */
bool tok_nfc_needed(const uint8_t *s, size_t n);
/* NFC of valid UTF-8 s into out (room for 3 * n bytes); work holds 4 * n + 4 code points.
 * Returns the output length. */
size_t tok_nfc(const uint8_t *s, size_t n, uint8_t *out, uint32_t *work);

/* ---- Pre-tokenizers (tok_pre.c) ------------------------------------------------------ */

/* Iterates the words of s[0, n) (valid UTF-8) under one split rule. */
typedef struct tok_pre_iter {
  tok_pre pre;
  const uint8_t *s;
  size_t pos, n;
  size_t run_end; /* SMOLLM: end of the current digit-free run */
} tok_pre_iter;

void tok_pre_init(tok_pre_iter *it, tok_pre pre, const uint8_t *s, size_t n);
/* Gives the next word [*start, *end); false at the end. Words are never empty and cover
 * the text without gaps. */
bool tok_pre_next(tok_pre_iter *it, size_t *start, size_t *end);

/* ---- The tokenizer ------------------------------------------------------------------- */

/* Added tokens matched in the text, longest first within each leading byte. */
typedef struct tok_match_entry {
  uint32_t off, len; /* the pattern in tok_matcher.pat (len > 0) */
  int32_t id;
  uint32_t lead; /* its first byte */
} tok_match_entry;

typedef struct tok_matcher {
  int32_t n;
  tok_match_entry *e; /* (n) sorted by leading byte, then length descending, then id */
  char *pat;          /* the patterns: the token strings, normalized for pass 2 */
  int32_t first[257]; /* entries with leading byte b: [first[b], first[b + 1]) */
} tok_matcher;

typedef struct tok_merge_slot {
  uint64_t key; /* (left << 32) | right; UINT64_MAX when empty */
  int32_t rank, id;
} tok_merge_slot;

struct irt_tokenizer {
  tok_model model;
  tok_pre pre;
  tok_prefix prefix; /* resolved: never DEFAULT */
  bool byte_fallback, fuse_unk, ignore_merges, nfc, add_bos, add_eos;
  int32_t bos_id, eos_id, pad_id, unk_id;
  int32_t n_tokens;
  char *text;        /* every token string, each NUL-terminated */
  uint32_t *off;     /* (n_tokens + 1) offsets in text; length = off[i+1] - off[i] - 1 */
  uint8_t *types;    /* (n_tokens) tok_type */
  uint8_t *attrs;    /* (n_tokens) TOK_ATTR_* */
  float *scores;     /* (n_tokens) or NULL */
  char *dec;         /* decoded bytes of every token (byte-level unmapped, SPM with ' ') */
  uint32_t *dec_off; /* (n_tokens + 1) offsets in dec */
  size_t dec_max;    /* the longest decoded piece */
  int32_t *vocab;    /* open-addressed hash of token ids by string, -1 empty */
  uint32_t vocab_mask;
  int32_t n_merges;
  int32_t *merges;      /* (2 * n_merges) left, right ids by rank */
  tok_merge_slot *mtab; /* (mtab_mask + 1) */
  uint64_t mtab_mask;
  int32_t byte_id[256];   /* byte-level: id of the char of byte b; SPM: id of <0xXX>; or -1 */
  uint32_t byte_cp[256];  /* GPT-2 byte-to-unicode alphabet */
  tok_matcher match_raw;  /* added tokens without NORMALIZED (pass 1) */
  tok_matcher match_norm; /* added tokens with NORMALIZED (pass 2) */
  int32_t *eos_ids;
  int32_t n_eos_ids;
  char *chat_template;
};

/* Id of the token spelled s[0, n), or -1. */
int32_t tok_vocab_find(const irt_tokenizer *t, const char *s, size_t n);
/* Mixes all 64 bits of a merge key (MurmurHash3's finalizer). */
static inline uint64_t tok_merge_hash(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 33);
}

/* Rank and result of merging (a, b); false if they do not merge. */
static inline bool tok_merge_find(const irt_tokenizer *t, int32_t a, int32_t b, int32_t *rank,
                                  int32_t *id) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  uint64_t i = tok_merge_hash(key) & t->mtab_mask;
  for (;; i = (i + 1) & t->mtab_mask) {
    const tok_merge_slot *e = &t->mtab[i];
    if (e->key == key) {
      *rank = e->rank;
      *id = e->id;
      return true;
    }
    if (e->key == UINT64_MAX) return false;
  }
}

static inline bool tok_is_special_type(int type) {
  return type == TOK_CONTROL || type == TOK_UNKNOWN;
}
static inline bool tok_is_added_type(int type) {
  return type == TOK_CONTROL || type == TOK_UNKNOWN || type == TOK_USER_DEFINED;
}

/* ---- BPE (tok_bpe.c) ------------------------------------------------------------------ */

/* Ids out of encode: at most cap stored, n counts them all. */
typedef struct tok_out {
  int32_t *ids;
  size_t cap, n;
} tok_out;

static inline void tok_out_put(tok_out *o, int32_t id) {
  if (o->n < o->cap) o->ids[o->n] = id;
  o->n++;
}

typedef struct tok_sym {
  int32_t id; /* -1 once merged into its left neighbour */
  int32_t prev, next;
  int32_t rank;   /* rank of the merge of this symbol with the next, INT32_MAX if none */
  int32_t merged; /* the id that merge gives */
} tok_sym;

/* Per-call scratch for words of up to n bytes: n symbols, 2 n heap keys, 2 n bytes. */
typedef struct tok_bpe_scratch {
  tok_sym *sym;
  uint64_t *heap;
  uint8_t *wbuf;
} tok_bpe_scratch;

/* Appends the ids of one pre-tokenized word (byte-level: raw bytes; SPM: text with
 * U+2581 for spaces) to out: initial symbols, then merges lowest rank first (leftmost on
 * ties), exactly as HF's BPE::merge_word + Word::merge_all. */
void tok_bpe_word(const irt_tokenizer *t, tok_bpe_scratch *sc, const uint8_t *w, size_t n,
                  tok_out *out);

/* ---- encode helpers (tok_encode.c) --------------------------------------------------- */

/* Normalizes s[0, n) as encode does before pass-2 matching (NFC, SPM spaces to U+2581 and
 * the NORMALIZER prefix) into out, which has room for tok_norm_cap(t, n, spaces) bytes
 * (spaces: how many U+0020 s holds, or n); tmp (3n bytes) and work (4n + 4) are used only
 * with t->nfc. Returns the length. */
size_t tok_normalize(const irt_tokenizer *t, const uint8_t *s, size_t n, uint8_t *out, uint8_t *tmp,
                     uint32_t *work);
size_t tok_norm_cap(const irt_tokenizer *t, size_t n, size_t spaces);

/* Builds an added-token matcher over the tokens selected by want_normalized (tok_vocab.c). */
ir_status tok_matcher_build(irt_tokenizer *t, tok_matcher *m, bool want_normalized, ir_diag *d);
void tok_matcher_free(tok_matcher *m);

#endif
