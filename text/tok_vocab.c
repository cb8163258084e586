/* tok_vocab: building a tokenizer from a spec (vocabulary hash, merge-rank hash, byte
 * tables, decoded pieces, added-token matchers), destroying it, and the accessors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "ir_alloc.h"

#define TOK_MAX_TOKENS (1 << 24)
#define TOK_MAX_MERGES (1 << 24)

/* ---- GPT-2 byte-level alphabet ------------------------------------------------------- */

/* Printable bytes map to themselves; the other 68, in order, to U+0100..U+0143. */
static bool byte_is_printable(unsigned b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static void byte_tables(uint32_t b2c[256], int16_t c2b[0x144]) {
  uint32_t k = 0x100;
  for (int c = 0; c < 0x144; c++) c2b[c] = -1;
  for (unsigned b = 0; b < 256; b++) {
    b2c[b] = byte_is_printable(b) ? b : k++;
    c2b[b2c[b]] = (int16_t)b;
  }
}

/* ---- vocabulary hash ----------------------------------------------------------------- */

static uint32_t str_hash(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
  return h ^ (h >> 15);
}

static inline size_t tok_len(const irt_tokenizer *t, int32_t id) {
  return t->off[id + 1] - t->off[id] - 1;
}

int32_t tok_vocab_find(const irt_tokenizer *t, const char *s, size_t n) {
  for (uint32_t i = str_hash(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
    int32_t id = t->vocab[i];
    if (id < 0) return -1;
    if (tok_len(t, id) == n && memcmp(t->text + t->off[id], s, n) == 0) return id;
  }
}

/* Later duplicates win, as llama.cpp's token_to_id map and HF's vocab map do. */
static void vocab_insert(irt_tokenizer *t, int32_t id) {
  const char *s = t->text + t->off[id];
  size_t n = tok_len(t, id);
  for (uint32_t i = str_hash(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
    int32_t o = t->vocab[i];
    if (o < 0 || (tok_len(t, o) == n && memcmp(t->text + t->off[o], s, n) == 0)) {
      t->vocab[i] = id;
      return;
    }
  }
}

static uint32_t pow2_above(uint64_t n) {
  uint32_t c = 16;
  while (c < 2 * n) c <<= 1;
  return c;
}

/* ---- building ------------------------------------------------------------------------ */

static ir_status check_spec(const tok_spec *s, ir_diag *d) {
  if (s->model != TOK_BPE_BYTE_LEVEL && s->model != TOK_BPE_SPM)
    return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: unknown model %d", (int)s->model);
  if ((unsigned)s->pre > TOK_PRE_METASPACE)
    return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: unknown pre-tokenizer %d", (int)s->pre);
  if ((unsigned)s->prefix > TOK_PREFIX_NONE)
    return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: unknown prefix mode %d", (int)s->prefix);
  if (s->n_tokens <= 0 || s->n_tokens > TOK_MAX_TOKENS || !s->tokens)
    return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: bad token count %d", (int)s->n_tokens);
  if (s->n_merges < 0 || s->n_merges > TOK_MAX_MERGES ||
      (s->n_merges > 0 && !s->merges && !s->merge_ids))
    return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: bad merge count %d", (int)s->n_merges);
  if (s->n_eos_ids < 0 || (s->n_eos_ids > 0 && !s->eos_ids))
    return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: bad eos_ids");
  const int32_t special[4] = {s->bos_id, s->eos_id, s->pad_id, s->unk_id};
  static const char *const names[4] = {"bos_id", "eos_id", "pad_id", "unk_id"};
  for (int i = 0; i < 4; i++)
    if (special[i] < -1 || special[i] >= s->n_tokens)
      return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: %s %d out of range", names[i],
                         (int)special[i]);
  for (int32_t i = 0; i < s->n_eos_ids; i++)
    if (s->eos_ids[i] < 0 || s->eos_ids[i] >= s->n_tokens)
      return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: eos_ids[%d] out of range", (int)i);
  for (int32_t i = 0; i < s->n_tokens; i++) {
    if (!s->tokens[i]) return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: token %d is NULL", (int)i);
    if (s->token_types && (s->token_types[i] < 0 || s->token_types[i] > TOK_BYTE))
      return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: token %d has unknown type %d", (int)i,
                         (int)s->token_types[i]);
  }
  return IR_OK;
}

static ir_status copy_tokens(irt_tokenizer *t, const tok_spec *s, ir_diag *d) {
  int32_t n = s->n_tokens;
  uint64_t total = 0;
  for (int32_t i = 0; i < n; i++) total += strlen(s->tokens[i]) + 1;
  if (total > UINT32_MAX) return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: vocabulary too large");
  t->text = ir_malloc(total);
  t->off = ir_malloc(((size_t)n + 1) * sizeof *t->off);
  t->types = ir_malloc((size_t)n);
  t->attrs = ir_calloc((size_t)n, 1);
  t->vocab_mask = pow2_above((uint64_t)n) - 1;
  t->vocab = ir_malloc(((size_t)t->vocab_mask + 1) * sizeof *t->vocab);
  if (!t->text || !t->off || !t->types || !t->attrs || !t->vocab)
    return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  memset(t->vocab, 0xFF, ((size_t)t->vocab_mask + 1) * sizeof *t->vocab);
  uint32_t o = 0;
  for (int32_t i = 0; i < n; i++) {
    size_t len = strlen(s->tokens[i]);
    t->off[i] = o;
    memcpy(t->text + o, s->tokens[i], len + 1);
    o += (uint32_t)len + 1;
    int type = s->token_types ? s->token_types[i] : TOK_NORMAL;
    t->types[i] = (uint8_t)(type == 0 ? TOK_NORMAL : type);
    if (s->token_attrs) t->attrs[i] = s->token_attrs[i];
  }
  t->off[n] = o;
  for (int32_t i = 0; i < n; i++) vocab_insert(t, i);
  if (s->scores) {
    t->scores = ir_malloc((size_t)n * sizeof *t->scores);
    if (!t->scores) return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
    memcpy(t->scores, s->scores, (size_t)n * sizeof *t->scores);
  }
  return IR_OK;
}

/* Splits "left right" at the space where both halves are tokens. */
static bool merge_split(const irt_tokenizer *t, const char *m, int32_t *a, int32_t *b) {
  for (const char *sp = strchr(m, ' '); sp; sp = strchr(sp + 1, ' ')) {
    *a = tok_vocab_find(t, m, (size_t)(sp - m));
    *b = tok_vocab_find(t, sp + 1, strlen(sp + 1));
    if (*a >= 0 && *b >= 0) return true;
  }
  return false;
}

static void mtab_insert(irt_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
  uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
  for (uint64_t i = tok_merge_hash(key) & t->mtab_mask;; i = (i + 1) & t->mtab_mask) {
    tok_merge_slot *e = &t->mtab[i];
    if (e->key == UINT64_MAX || e->key == key) {
      *e = (tok_merge_slot){key, rank, id};
      return;
    }
  }
}

/* The id of the concatenation of tokens a and b, or -1. */
static int32_t merge_result(const irt_tokenizer *t, int32_t a, int32_t b, char *tmp) {
  size_t la = tok_len(t, a), lb = tok_len(t, b);
  memcpy(tmp, t->text + t->off[a], la);
  memcpy(tmp + la, t->text + t->off[b], lb);
  return tok_vocab_find(t, tmp, la + lb);
}

/* Builds the rank table from "left right" strings or from id pairs (merge_ids). */
static ir_status build_merges(irt_tokenizer *t, int32_t n, const char *const *strs,
                              const int32_t *merge_ids, ir_diag *d) {
  size_t maxlen = 0;
  for (int32_t i = 0; i < t->n_tokens; i++)
    if (tok_len(t, i) > maxlen) maxlen = tok_len(t, i);
  t->n_merges = n;
  t->merges = ir_malloc(((size_t)n * 2 + 1) * sizeof *t->merges);
  t->mtab_mask = pow2_above((uint64_t)n) - 1;
  t->mtab = ir_malloc((t->mtab_mask + 1) * sizeof *t->mtab);
  char *tmp = ir_malloc(2 * maxlen + 1);
  if (!t->merges || !t->mtab || !tmp) {
    ir_free(tmp);
    return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  }
  memset(t->mtab, 0xFF, (t->mtab_mask + 1) * sizeof *t->mtab);
  ir_status st = IR_OK;
  for (int32_t r = 0; r < n && st == IR_OK; r++) {
    int32_t a, b;
    if (merge_ids) {
      a = merge_ids[2 * r];
      b = merge_ids[2 * r + 1];
      if (a < 0 || a >= t->n_tokens || b < 0 || b >= t->n_tokens) {
        st = ir_diag_set(d, IR_INVALID_ARG, "tokenizer: merge %d: token id out of range", (int)r);
        break;
      }
    } else if (!strs[r] || !merge_split(t, strs[r], &a, &b)) {
      st = ir_diag_set(d, IR_INVALID_ARG,
                       "tokenizer: merge %d '%.200s': not two tokens of the "
                       "vocabulary",
                       (int)r, strs[r] ? strs[r] : "(null)");
      break;
    }
    int32_t id = merge_result(t, a, b, tmp);
    if (id < 0)
      st = ir_diag_set(d, IR_INVALID_ARG,
                       "tokenizer: merge %d '%.100s' '%.100s': the result is "
                       "not in the vocabulary",
                       (int)r, t->text + t->off[a], t->text + t->off[b]);
    t->merges[2 * r] = a;
    t->merges[2 * r + 1] = b;
    mtab_insert(t, a, b, r, id);
  }
  ir_free(tmp);
  return st;
}

/* ---- merges from SentencePiece scores ------------------------------------------------- */

typedef struct derived_merge {
  float score;
  int32_t piece, a, b;
} derived_merge;

static int cmp_derived(const void *pa, const void *pb) {
  const derived_merge *x = pa, *y = pb;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->piece != y->piece) return x->piece < y->piece ? -1 : 1;
  if (x->a != y->a) return x->a < y->a ? -1 : 1;
  return (x->b > y->b) - (x->b < y->b);
}

/* Visits every split of token p into two tokens (at character boundaries); with out,
 * records them. Returns the count. */
static size_t token_splits(const irt_tokenizer *t, int32_t p, float score, derived_merge *out) {
  const char *s = t->text + t->off[p];
  size_t n = tok_len(t, p), count = 0;
  for (size_t k = 1; k < n; k++) {
    if (((uint8_t)s[k] & 0xC0) == 0x80) continue;
    int32_t a = tok_vocab_find(t, s, k), b = a >= 0 ? tok_vocab_find(t, s + k, n - k) : -1;
    if (b < 0) continue;
    if (out) out[count] = (derived_merge){score, p, a, b};
    count++;
  }
  return count;
}

/* SPM vocabularies from GGUF have scores instead of merges: every split of a token into two
 * tokens is a merge, ranked by that token's score, highest first, as transformers'
 * SentencePieceExtractor derives the merges of Llama's tokenizer.json (and as llama.cpp's
 * SPM tokenizer ranks its bigrams). Returns the id pairs, malloc'd. */
static ir_status derive_merges(const irt_tokenizer *t, const float *scores, int32_t **out,
                               int32_t *n_out, ir_diag *d) {
  size_t n = 0;
  for (int32_t p = 0; p < t->n_tokens; p++) n += token_splits(t, p, 0, NULL);
  if (n > (1u << 24)) return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: too many merges");
  derived_merge *m = ir_malloc((n + 1) * sizeof *m);
  *out = ir_malloc((2 * n + 1) * sizeof **out);
  if (!m || !*out) {
    ir_free(m);
    return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  }
  size_t k = 0;
  for (int32_t p = 0; p < t->n_tokens; p++) k += token_splits(t, p, scores[p], m + k);
  qsort(m, n, sizeof *m, cmp_derived);
  for (size_t i = 0; i < n; i++) {
    (*out)[2 * i] = m[i].a;
    (*out)[2 * i + 1] = m[i].b;
  }
  ir_free(m);
  *n_out = (int32_t)n;
  return IR_OK;
}

static ir_status make_merges(irt_tokenizer *t, const tok_spec *s, ir_diag *d) {
  if (!(t->model == TOK_BPE_SPM && s->n_merges == 0 && s->scores))
    return build_merges(t, s->n_merges, s->merges, s->merge_ids, d);
  int32_t *ids = NULL, n = 0;
  ir_status st = derive_merges(t, s->scores, &ids, &n, d);
  if (st == IR_OK) st = build_merges(t, n, NULL, ids, d);
  ir_free(ids);
  return st;
}

static void build_byte_ids(irt_tokenizer *t) {
  int16_t c2b[0x144];
  byte_tables(t->byte_cp, c2b);
  for (int b = 0; b < 256; b++) {
    char buf[8];
    size_t n;
    if (t->model == TOK_BPE_BYTE_LEVEL) n = tok_utf8_put(t->byte_cp[b], (uint8_t *)buf);
    else n = (size_t)snprintf(buf, sizeof buf, "<0x%02X>", b);
    t->byte_id[b] = tok_vocab_find(t, buf, n);
  }
}

/* The byte value of an SPM "<0xAB>" piece, or -1. */
static int spm_byte_value(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; i++) {
    char c = s[i];
    int x = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                   : -1;
    if (x < 0) return -1;
    v = v * 16 + x;
  }
  return v;
}

/* Decoded bytes of token id into out (room for its length); returns the count. */
static size_t decode_piece(const irt_tokenizer *t, int32_t id, const int16_t *c2b, char *out) {
  const uint8_t *s = (const uint8_t *)t->text + t->off[id];
  size_t n = tok_len(t, id), o = 0;
  int type = t->types[id];
  if (t->model == TOK_BPE_SPM) {
    int v = type == TOK_BYTE ? spm_byte_value((const char *)s, n) : -1;
    if (v >= 0) {
      out[0] = (char)v;
      return 1;
    }
    for (size_t i = 0; i < n; i++) {
      if (i + 3 <= n && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) {
        out[o++] = ' ';
        i += 2;
      } else {
        out[o++] = (char)s[i];
      }
    }
    return o;
  }
  if (tok_is_added_type(type)) {
    memcpy(out, s, n);
    return n;
  }
  for (size_t i = 0; i < n;) { /* characters outside the alphabet are copied as they are */
    size_t len = 1;
    int b = -1, sl = tok_utf8_seq_len(s[i]);
    if (sl > 0 && (size_t)sl <= n - i && tok_utf8_check(s + i, (size_t)sl) == (size_t)sl) {
      uint32_t cp = tok_utf8_get(s + i, (size_t)sl, &len);
      b = cp < 0x144 ? c2b[cp] : -1;
    }
    if (b >= 0) {
      out[o++] = (char)b;
    } else {
      memcpy(out + o, s + i, len);
      o += len;
    }
    i += len;
  }
  return o;
}

static ir_status build_decoded(irt_tokenizer *t, ir_diag *d) {
  size_t total = 0;
  for (int32_t i = 0; i < t->n_tokens; i++) total += tok_len(t, i);
  t->dec = ir_malloc(total + 1);
  t->dec_off = ir_malloc(((size_t)t->n_tokens + 1) * sizeof *t->dec_off);
  if (!t->dec || !t->dec_off) return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  uint32_t b2c[256];
  int16_t c2b[0x144];
  byte_tables(b2c, c2b);
  uint32_t o = 0;
  for (int32_t i = 0; i < t->n_tokens; i++) {
    t->dec_off[i] = o;
    size_t n = decode_piece(t, i, c2b, t->dec + o);
    o += (uint32_t)n;
    if (n > t->dec_max) t->dec_max = n;
  }
  t->dec_off[t->n_tokens] = o;
  return IR_OK;
}

static tok_prefix resolve_prefix(const tok_spec *s) {
  if (s->prefix != TOK_PREFIX_DEFAULT) return s->prefix;
  if (!s->add_prefix_space) return TOK_PREFIX_NONE;
  return s->model == TOK_BPE_SPM ? TOK_PREFIX_NORMALIZER : TOK_PREFIX_ALWAYS;
}

static ir_status copy_scalars(irt_tokenizer *t, const tok_spec *s, ir_diag *d) {
  t->model = s->model;
  t->pre = s->pre;
  t->prefix = resolve_prefix(s);
  t->byte_fallback = s->byte_fallback;
  t->fuse_unk = s->fuse_unk;
  t->ignore_merges = s->ignore_merges;
  t->nfc = s->nfc;
  t->add_bos = s->add_bos;
  t->add_eos = s->add_eos;
  t->bos_id = s->bos_id;
  t->eos_id = s->eos_id;
  t->pad_id = s->pad_id;
  t->unk_id = s->unk_id;
  t->n_tokens = s->n_tokens;
  if (s->n_eos_ids > 0) {
    t->eos_ids = ir_malloc((size_t)s->n_eos_ids * sizeof *t->eos_ids);
    if (!t->eos_ids) return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
    memcpy(t->eos_ids, s->eos_ids, (size_t)s->n_eos_ids * sizeof *t->eos_ids);
    t->n_eos_ids = s->n_eos_ids;
  }
  if (s->chat_template && !(t->chat_template = ir_strdup(s->chat_template)))
    return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  return IR_OK;
}

ir_status tok_create(const tok_spec *spec, irt_tokenizer **out, ir_diag *d) {
  if (!out) return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: NULL output");
  *out = NULL;
  if (!spec) return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: NULL spec");
  ir_status st = check_spec(spec, d);
  if (st != IR_OK) return st;
  irt_tokenizer *t = ir_calloc(1, sizeof *t);
  if (!t) return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  st = copy_scalars(t, spec, d);
  if (st == IR_OK) st = copy_tokens(t, spec, d);
  if (st == IR_OK) st = make_merges(t, spec, d);
  if (st == IR_OK) {
    build_byte_ids(t);
    st = build_decoded(t, d);
  }
  if (st == IR_OK) st = tok_matcher_build(t, &t->match_raw, false, d);
  if (st == IR_OK) st = tok_matcher_build(t, &t->match_norm, true, d);
  if (st != IR_OK) {
    tok_destroy(t);
    return st;
  }
  *out = t;
  return IR_OK;
}

void tok_destroy(irt_tokenizer *t) {
  if (!t) return;
  ir_free(t->text);
  ir_free(t->off);
  ir_free(t->types);
  ir_free(t->attrs);
  ir_free(t->scores);
  ir_free(t->dec);
  ir_free(t->dec_off);
  ir_free(t->vocab);
  ir_free(t->merges);
  ir_free(t->mtab);
  tok_matcher_free(&t->match_raw);
  tok_matcher_free(&t->match_norm);
  ir_free(t->eos_ids);
  ir_free(t->chat_template);
  ir_free(t);
}

/* ---- accessors ----------------------------------------------------------------------- */

int32_t tok_vocab_size(const irt_tokenizer *t) { return t->n_tokens; }
int32_t tok_bos(const irt_tokenizer *t) { return t->bos_id; }
int32_t tok_eos(const irt_tokenizer *t) { return t->eos_id; }
const char *tok_chat_template(const irt_tokenizer *t) { return t->chat_template; }
tok_model tok_get_model(const irt_tokenizer *t) { return t->model; }
tok_pre tok_get_pre(const irt_tokenizer *t) { return t->pre; }
size_t tok_piece_max(const irt_tokenizer *t) { return 3 * t->dec_max + 6; }

bool tok_is_eog(const irt_tokenizer *t, int32_t id) {
  if (id < 0) return false;
  if (id == t->eos_id) return true;
  for (int32_t i = 0; i < t->n_eos_ids; i++)
    if (t->eos_ids[i] == id) return true;
  return false;
}

bool tok_is_special(const irt_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_tokens && tok_is_special_type(t->types[id]);
}

int32_t tok_find(const irt_tokenizer *t, const char *token) {
  return token ? tok_vocab_find(t, token, strlen(token)) : -1;
}

const char *tok_token(const irt_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_tokens ? t->text + t->off[id] : NULL;
}
