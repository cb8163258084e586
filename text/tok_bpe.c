/* tok_bpe: byte-pair merging of one word over a linked list of symbols, each caching the
 * rank of its pair with the next. Long words use a binary heap of (rank, position) keys,
 * O(n log n); short ones a scan for the lowest rank, cheaper below a dozen symbols. Both
 * merge the lowest rank first, leftmost on ties, as HF's Word::merge_all. No allocation. */
#include "tok_internal.h"

#define SCAN_MAX 12 /* words up to this many symbols are merged by scanning */

static void heap_push(uint64_t *h, size_t *n, uint64_t key) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (h[parent] <= key) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = key;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
  uint64_t top = h[0], last = h[--*n];
  size_t i = 0, m = *n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= m) break;
    if (c + 1 < m && h[c + 1] < h[c]) c++;
    if (last <= h[c]) break;
    h[i] = h[c];
    i = c;
  }
  if (m) h[i] = last;
  return top;
}

/* Builds the symbol list as HF's merge_word does: one symbol per unit (a byte of the
 * byte-level alphabet, or a character), <0xXX> pieces for unknown characters with byte
 * fallback, otherwise unk_id (fused over a run with fuse_unk) or nothing without one. */
typedef struct sym_builder {
  tok_sym *sym;
  size_t m;
  bool unk_pending;
} sym_builder;

static void sym_add(sym_builder *b, int32_t id) {
  b->sym[b->m] = (tok_sym){id, (int32_t)b->m - 1, (int32_t)b->m + 1, INT32_MAX, -1};
  b->m++;
}

static void sym_unknown(const irt_tokenizer *t, sym_builder *b) {
  if (t->unk_id < 0) return;
  if (b->unk_pending && !t->fuse_unk) sym_add(b, t->unk_id);
  b->unk_pending = true;
}

static void sym_known(sym_builder *b, int32_t unk_id, int32_t id) {
  if (b->unk_pending) sym_add(b, unk_id);
  b->unk_pending = false;
  sym_add(b, id);
}

/* Byte fallback: every byte of the character as <0xXX>, if all exist. Like HF, a pending
 * unknown is not flushed first. */
static bool sym_bytes(const irt_tokenizer *t, sym_builder *b, const uint8_t *c, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (t->byte_id[c[i]] < 0) return false;
  for (size_t i = 0; i < n; i++) sym_add(b, t->byte_id[c[i]]);
  return true;
}

static size_t init_symbols(const irt_tokenizer *t, tok_sym *sym, const uint8_t *w, size_t n) {
  sym_builder b = {sym, 0, false};
  for (size_t i = 0; i < n;) {
    size_t len = 1;
    int32_t id;
    if (t->model == TOK_BPE_BYTE_LEVEL) {
      id = t->byte_id[w[i]];
    } else {
      int sl = tok_utf8_seq_len(w[i]);
      len = sl > 0 && (size_t)sl <= n - i ? (size_t)sl : 1;
      id = tok_vocab_find(t, (const char *)w + i, len);
    }
    if (id >= 0) sym_known(&b, t->unk_id, id);
    else if (!(t->byte_fallback && t->model == TOK_BPE_SPM && sym_bytes(t, &b, w + i, len)))
      sym_unknown(t, &b);
    i += len;
  }
  if (b.unk_pending) sym_add(&b, t->unk_id);
  if (b.m) sym[b.m - 1].next = -1;
  return b.m;
}

/* Looks up the pair (pos, next) and caches its rank and result in sym[pos]. */
static bool pair_rank(const irt_tokenizer *t, tok_sym *s, int32_t pos) {
  int32_t next = s[pos].next;
  if (next >= 0 && tok_merge_find(t, s[pos].id, s[next].id, &s[pos].rank, &s[pos].merged))
    return true;
  s[pos].rank = INT32_MAX;
  return false;
}

/* Merges sym[pos] with its next symbol. */
static void merge_at(tok_sym *s, int32_t pos) {
  int32_t nx = s[pos].next;
  s[pos].id = s[pos].merged;
  s[pos].next = s[nx].next;
  if (s[nx].next >= 0) s[s[nx].next].prev = pos;
  s[nx].id = -1;
}

static void push_pair(const irt_tokenizer *t, tok_bpe_scratch *sc, size_t *hn, int32_t pos) {
  if (pair_rank(t, sc->sym, pos))
    heap_push(sc->heap, hn, (uint64_t)(uint32_t)sc->sym[pos].rank << 32 | (uint32_t)pos);
}

static void merge_heap(const irt_tokenizer *t, tok_bpe_scratch *sc, size_t m) {
  tok_sym *s = sc->sym;
  size_t hn = 0;
  for (size_t i = 0; i + 1 < m; i++) push_pair(t, sc, &hn, (int32_t)i);
  while (hn) {
    uint64_t key = heap_pop(sc->heap, &hn);
    int32_t pos = (int32_t)(uint32_t)key;
    /* an entry is stale once its symbol is gone or its pair changed (ranks are unique) */
    if (s[pos].id < 0 || s[pos].next < 0 || (uint32_t)s[pos].rank != key >> 32) continue;
    merge_at(s, pos);
    if (s[pos].prev >= 0) push_pair(t, sc, &hn, s[pos].prev);
    push_pair(t, sc, &hn, pos);
  }
}

static void merge_scan(const irt_tokenizer *t, tok_sym *s, size_t m) {
  for (size_t i = 0; i + 1 < m; i++) pair_rank(t, s, (int32_t)i);
  for (;;) {
    int32_t best = -1, best_rank = INT32_MAX;
    for (int32_t i = 0; i >= 0; i = s[i].next)
      if (s[i].rank < best_rank) best_rank = s[i].rank, best = i;
    if (best < 0) return;
    merge_at(s, best);
    if (s[best].prev >= 0) pair_rank(t, s, s[best].prev);
    pair_rank(t, s, best);
  }
}

/* ignore_merges: the id of the whole word if it is a token, else -1. */
static int32_t whole_word(const irt_tokenizer *t, tok_bpe_scratch *sc, const uint8_t *w, size_t n) {
  if (t->model == TOK_BPE_SPM) return tok_vocab_find(t, (const char *)w, n);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) o += tok_utf8_put(t->byte_cp[w[i]], sc->wbuf + o);
  return tok_vocab_find(t, (const char *)sc->wbuf, o);
}

void tok_bpe_word(const irt_tokenizer *t, tok_bpe_scratch *sc, const uint8_t *w, size_t n,
                  tok_out *out) {
  if (n == 0) return;
  if (t->ignore_merges) {
    int32_t id = whole_word(t, sc, w, n);
    if (id >= 0) {
      tok_out_put(out, id);
      return;
    }
  }
  size_t m = init_symbols(t, sc->sym, w, n);
  if (m == 0) return;
  if (m > SCAN_MAX) merge_heap(t, sc, m);
  else if (m > 1) merge_scan(t, sc->sym, m);
  for (int32_t i = 0; i >= 0; i = sc->sym[i].next) tok_out_put(out, sc->sym[i].id);
}
