/* grammar_state: parse states of a compiled grammar and token masks. A state is a set of
 * stacks (each the items still to match, innermost first) whose tops are all character
 * items, plus a character split between tokens. Stacks are persistent linked lists in
 * arenas, so a step shares the untouched part of every stack; the arenas are reused
 * step after step (memory grows to the largest state, then stays). */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "ir_alloc.h"

typedef struct gnode {
  const struct gnode *up; /* the caller's continuation; NULL: the bottom */
  uint32_t pos;           /* the next item, in el[] */
  uint32_t hash;          /* of pos and every pos below */
} gnode;

typedef struct gchunk {
  struct gchunk *next;
  size_t used, cap, pad;
} gchunk;
_Static_assert(sizeof(gchunk) % 16 == 0, "chunk data stays 16-byte aligned");

typedef struct garena {
  gchunk *first, *cur;
} garena;

typedef struct gmark {
  gchunk *c;
  size_t used;
} gmark;

typedef struct gset {
  const gnode **v; /* (n) distinct stacks; NULL is the empty stack (the text may end) */
  int n;
  uint32_t cp; /* a character split between tokens: its bits so far, */
  int need;    /* its continuation bytes still to come (0: none) */
  int len;     /* and its length in bytes */
} gset;

struct gram_state {
  const gram *g;
  gset cur;
  garena a[2]; /* cur lives in a[live]; a step builds the next one in the other */
  int live;
  garena tmp;        /* steps in progress, masks */
  const gnode **buf; /* stacks collected by one expansion */
  int n_buf, cap_buf;
  const gnode **chain; /* a stack's nodes while it is copied */
  int cap_chain;
  gset *dep;   /* masks: the state after each byte of the current token */
  gmark *mark; /* and the arena before the next byte */
  int cap_dep;
  int64_t work; /* expansions in the current character step */
  bool oom;
  bool too_hard; /* a step needed more than MAX_WORK expansions */
};

struct gram_trie {
  int32_t n, vocab;      /* tokens in the trie; the vocabulary */
  int32_t *ord;          /* (n) ids, their bytes in ascending order */
  uint16_t *lcp;         /* (n) bytes in common with the one before */
  const uint8_t **bytes; /* (vocab) each id's bytes (NULL for special tokens) */
  uint16_t *len;         /* (vocab) */
  uint8_t *eog;          /* (vocab) 1 for end-of-generation tokens */
  int max_len;
};

/* --- arenas ---------------------------------------------------------------------------- */

static void *ga_alloc(gram_state *s, garena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  for (;;) {
    gchunk *c = a->cur;
    if (c && c->used + n <= c->cap) {
      void *p = (char *)(c + 1) + c->used;
      c->used += n;
      return p;
    }
    if (c && c->next) {
      a->cur = c->next;
      a->cur->used = 0;
      continue;
    }
    size_t cap = n > 65536 ? n : 65536;
    gchunk *nc = ir_malloc(sizeof *nc + cap);
    if (!nc) {
      s->oom = true;
      return NULL;
    }
    *nc = (gchunk){.cap = cap};
    if (c) c->next = nc;
    else a->first = nc;
    a->cur = nc;
  }
}

static gmark ga_mark(const garena *a) { return (gmark){a->cur, a->cur ? a->cur->used : 0}; }

static void ga_reset(garena *a, gmark m) {
  a->cur = m.c ? m.c : a->first;
  if (a->cur) a->cur->used = m.c ? m.used : 0;
}

static void ga_free(garena *a) {
  for (gchunk *c = a->first, *n; c; c = n) {
    n = c->next;
    ir_free(c);
  }
  a->first = a->cur = NULL;
}

/* --- stacks ------------------------------------------------------------------------------ */

static const gnode *node(gram_state *s, garena *a, const gnode *up, uint32_t pos) {
  gnode *n = ga_alloc(s, a, sizeof *n);
  if (!n) return NULL;
  uint32_t h = (up ? up->hash : 0x9E3779B9u) ^ pos;
  h *= 0x85EBCA6Bu;
  *n = (gnode){up, pos, h ^ (h >> 15)};
  return n;
}

static bool same(const gnode *a, const gnode *b) {
  for (; a != b; a = a->up, b = b->up)
    if (!a || !b || a->hash != b->hash || a->pos != b->pos) return false;
  return true;
}

/* A state holds at most this many stacks: a grammar ambiguous enough to need more
 * refuses the character (its completion then ends) rather than slowing every step. */
#define MAX_STACKS 512

/* Adds a stack to the collection unless it is there already. */
static void collect(gram_state *s, const gnode *n) {
  for (int i = 0; i < s->n_buf; i++)
    if (same(s->buf[i], n)) return;
  if (s->n_buf == MAX_STACKS) {
    s->oom = true;
    return;
  }
  if (s->n_buf == s->cap_buf) {
    int cap = s->cap_buf ? 2 * s->cap_buf : 64;
    const gnode **b = ir_realloc(s->buf, (size_t)cap * sizeof *b);
    if (!b) {
      s->oom = true;
      return;
    }
    s->buf = b, s->cap_buf = cap;
  }
  s->buf[s->n_buf++] = n;
}

/* Follows a stack through rule references and ends of alternatives until its top is a
 * character item (or it is empty) and collects what it becomes. A reference that ends
 * its alternative pushes no return (so right recursion runs in constant depth). */
#define MAX_EXPAND 4096 /* references followed before a character: the recursion's depth */
#define MAX_WORK                                                                                   \
  65536 /* expansions for one character: ambiguity (nullable alternatives
                           nested or repeated) can make the paths exponential */

static void expand(gram_state *s, garena *a, const gnode *n, int depth) {
  const gram *G = s->g;
  if (depth > MAX_EXPAND) s->oom = true;
  if (++s->work > MAX_WORK) s->oom = s->too_hard = true;
  for (;;) {
    if (s->oom) return;
    if (!n) return collect(s, NULL);
    gel e = G->el[n->pos];
    if (e.type == G_END) {
      n = n->up;
      continue;
    }
    if (e.type == G_CHAR) return collect(s, n);
    const gnode *ret = G->el[n->pos + 1].type == G_END ? n->up : node(s, a, n->up, n->pos + 1);
    for (int k = G->rule_alt[e.arg]; k < G->rule_alt[e.arg + 1]; k++)
      expand(s, a, node(s, a, ret, G->alt[k]), depth + 1);
    return;
  }
}

/* The collected stacks as a set in arena a. */
static bool take_buf(gram_state *s, garena *a, gset *out) {
  *out = (gset){0};
  if (s->oom) return false;
  out->v = ga_alloc(s, a, (size_t)(s->n_buf ? s->n_buf : 1) * sizeof *out->v);
  if (!out->v) return false;
  if (s->n_buf) memcpy(out->v, s->buf, (size_t)s->n_buf * sizeof *out->v);
  out->n = s->n_buf;
  return out->n > 0;
}

static bool class_has(const gclass *k, uint32_t c) {
  bool in = false;
  for (int i = 0; i < k->n && !in; i += 2) in = c >= k->r[i] && c <= k->r[i + 1];
  return in != k->neg;
}

/* Whether some character in [lo, hi] is in the class. */
static bool class_meets(const gclass *k, uint32_t lo, uint32_t hi) {
  if (!k->neg) {
    for (int i = 0; i < k->n; i += 2)
      if (k->r[i] <= hi && k->r[i + 1] >= lo) return true;
    return false;
  }
  for (uint32_t x = lo;;) { /* the class is the complement: look for an uncovered x */
    int i = 0;
    while (i < k->n && !(x >= k->r[i] && x <= k->r[i + 1])) i += 2;
    if (i == k->n) return true;
    if (k->r[i + 1] >= hi) return false;
    x = k->r[i + 1] + 1;
  }
}

/* The stacks of in that take character c, moved past it, as a set in arena a. */
static bool step_char(gram_state *s, const gset *in, uint32_t c, garena *a, gset *out) {
  const gram *G = s->g;
  s->n_buf = 0;
  s->work = 0;
  for (int i = 0; i < in->n; i++) {
    const gnode *n = in->v[i];
    if (n && class_has(&G->cls[G->el[n->pos].arg], c))
      expand(s, a, node(s, a, n->up, n->pos + 1), 0);
  }
  return take_buf(s, a, out);
}

/* The least code point UTF-8 spells with n bytes (shorter forms are invalid). */
static const uint32_t UTF8_MIN[5] = {0, 0, 0x80, 0x800, 0x10000};

static bool valid_char(uint32_t c, int len) {
  return c >= UTF8_MIN[len] && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF);
}

/* Whether some stack can take a character that starts with the split one's bytes. */
static bool partial_ok(const gram_state *s, const gset *g) {
  uint32_t lo = g->cp << (6 * g->need), hi = lo | ((1u << (6 * g->need)) - 1);
  if (lo < UTF8_MIN[g->len]) lo = UTF8_MIN[g->len];
  if (hi > 0x10FFFF) hi = 0x10FFFF;
  if (lo > hi) return false;
  for (int i = 0; i < g->n; i++)
    if (g->v[i] && class_meets(&s->g->cls[s->g->el[g->v[i]->pos].arg], lo, hi)) return true;
  return false;
}

/* One byte of UTF-8 text: in to *out (new stacks in arena a); false if none survive. */
static bool step_byte(gram_state *s, const gset *in, uint8_t b, garena *a, gset *out) {
  uint32_t cp;
  int need, len = in->len;
  if (in->need == 0) {
    if (b == 0) return false; /* text never holds NUL (as in llama.cpp's grammars) */
    if (b < 0x80) return step_char(s, in, b, a, out);
    need = b >= 0xC2 && b <= 0xDF ? 1 : b >= 0xE0 && b <= 0xEF ? 2 : b >= 0xF0 && b <= 0xF4 ? 3 : 0;
    if (!need) return false;
    cp = b & (0x3Fu >> need);
    len = need + 1;
  } else {
    if ((b & 0xC0) != 0x80) return false;
    cp = in->cp << 6 | (b & 0x3F);
    need = in->need - 1;
    if (need == 0) return valid_char(cp, len) && step_char(s, in, cp, a, out);
  }
  *out = *in;
  out->cp = cp, out->need = need, out->len = len;
  return partial_ok(s, out);
}

/* Copies a set's stacks into arena a (whole, so that other arenas can be reset). */
static bool copy_set(gram_state *s, const gset *in, garena *a, gset *out) {
  *out = *in;
  out->v = ga_alloc(s, a, (size_t)(in->n ? in->n : 1) * sizeof *out->v);
  if (!out->v) return false;
  for (int i = 0; i < in->n; i++) {
    int d = 0;
    for (const gnode *n = in->v[i]; n; n = n->up) {
      if (d == s->cap_chain) {
        int cap = s->cap_chain ? 2 * s->cap_chain : 64;
        const gnode **c = ir_realloc(s->chain, (size_t)cap * sizeof *c);
        if (!c) return s->oom = true, false;
        s->chain = c, s->cap_chain = cap;
      }
      s->chain[d++] = n;
    }
    const gnode *top = NULL;
    while (d-- > 0) top = node(s, a, top, s->chain[d]->pos);
    if (s->oom) return false;
    out->v[i] = top;
  }
  return true;
}

/* --- states ----------------------------------------------------------------------------- */

ir_status gram_state_create(const gram *g, gram_state **out, ir_diag *err) {
  gram_state *s = ir_calloc(1, sizeof *s);
  *out = NULL;
  if (s) {
    s->g = g;
    s->n_buf = 0;
    for (int k = g->rule_alt[g->root]; k < g->rule_alt[g->root + 1]; k++)
      expand(s, &s->a[0], node(s, &s->a[0], NULL, g->alt[k]), 0);
    take_buf(s, &s->a[0], &s->cur);
  }
  if (!s || s->oom) {
    bool hard = s && s->too_hard;
    gram_state_destroy(s);
    if (err && hard)
      *err = (ir_diag){.status = IR_INVALID_ARG,
                       .msg = "the grammar is too ambiguous: its start takes over 65536 "
                              "expansions (nested or repeated empty alternatives)"};
    else if (err) *err = (ir_diag){.status = IR_OOM, .msg = "out of memory"};
    return hard ? IR_INVALID_ARG : IR_OOM;
  }
  *out = s;
  return IR_OK;
}

void gram_state_destroy(gram_state *s) {
  if (!s) return;
  ga_free(&s->a[0]);
  ga_free(&s->a[1]);
  ga_free(&s->tmp);
  ir_free(s->buf);
  ir_free(s->chain);
  ir_free(s->dep);
  ir_free(s->mark);
  ir_free(s);
}

bool gram_state_advance(gram_state *s, const uint8_t *p, size_t n) {
  ga_reset(&s->tmp, (gmark){0});
  gset g = s->cur, next;
  for (size_t i = 0; i < n; i++, g = next)
    if (!step_byte(s, &g, p[i], &s->tmp, &next)) {
      s->oom = false;
      return false;
    }
  garena *to = &s->a[!s->live];
  ga_reset(to, (gmark){0});
  if (!copy_set(s, &g, to, &next)) {
    s->oom = false;
    return false;
  }
  s->cur = next;
  s->live = !s->live;
  return true;
}

bool gram_state_accepting(const gram_state *s) {
  if (s->cur.need) return false;
  for (int i = 0; i < s->cur.n; i++)
    if (!s->cur.v[i]) return true;
  return false;
}

bool gram_state_can_continue(const gram_state *s) {
  for (int i = 0; i < s->cur.n; i++)
    if (s->cur.v[i]) return true;
  return false;
}

/* --- the vocabulary --------------------------------------------------------------------- */

typedef struct tok_key {
  const uint8_t *p;
  uint16_t len;
  int32_t id;
} tok_key;

static int key_cmp(const void *x, const void *y) {
  const tok_key *a = x, *b = y;
  int n = a->len < b->len ? a->len : b->len, c = memcmp(a->p, b->p, (size_t)n);
  return c ? c : a->len != b->len ? (a->len < b->len ? -1 : 1) : (a->id > b->id) - (a->id < b->id);
}

gram_trie *gram_trie_create(const irt_tokenizer *t) {
  int32_t V = tok_vocab_size(t);
  gram_trie *g = ir_calloc(1, sizeof *g);
  tok_key *k = ir_malloc((size_t)V * sizeof *k);
  if (g) {
    g->vocab = V;
    g->ord = ir_malloc((size_t)V * sizeof *g->ord);
    g->lcp = ir_malloc((size_t)V * sizeof *g->lcp);
    g->bytes = ir_calloc((size_t)V, sizeof *g->bytes);
    g->len = ir_calloc((size_t)V, sizeof *g->len);
    g->eog = ir_calloc((size_t)V, 1);
  }
  if (!g || !k || !g->ord || !g->lcp || !g->bytes || !g->len || !g->eog) {
    ir_free(k);
    gram_trie_destroy(g);
    return NULL;
  }
  for (int32_t id = 0; id < V; id++) {
    size_t n;
    const uint8_t *p = tok_piece(t, id, &n);
    g->eog[id] = tok_is_eog(t, id);
    if (tok_is_special(t, id) || g->eog[id] || n == 0 || n > 1024) continue;
    g->bytes[id] = p, g->len[id] = (uint16_t)n;
    k[g->n++] = (tok_key){p, (uint16_t)n, id};
    if ((int)n > g->max_len) g->max_len = (int)n;
  }
  qsort(k, (size_t)g->n, sizeof *k, key_cmp);
  for (int32_t i = 0; i < g->n; i++) {
    int c = 0;
    if (i > 0)
      while (c < k[i].len && c < k[i - 1].len && k[i].p[c] == k[i - 1].p[c]) c++;
    g->ord[i] = k[i].id, g->lcp[i] = (uint16_t)c;
  }
  ir_free(k);
  return g;
}

void gram_trie_destroy(gram_trie *t) {
  if (!t) return;
  ir_free(t->ord);
  ir_free(t->lcp);
  ir_free(t->bytes);
  ir_free(t->len);
  ir_free(t->eog);
  ir_free(t);
}

static bool grow_dep(gram_state *s, int need) {
  if (need <= s->cap_dep) return true;
  gset *d = ir_realloc(s->dep, (size_t)need * sizeof *d);
  if (d) s->dep = d;
  gmark *m = ir_realloc(s->mark, (size_t)need * sizeof *m);
  if (m) s->mark = m;
  if (!d || !m) return false;
  s->cap_dep = need;
  return true;
}

/* Walks the tokens in byte order, keeping the state after each byte of the current one:
 * a token redoes only the bytes after those it shares with the one before, and once a
 * prefix fails, every token that starts with it is skipped. */
int64_t gram_mask(gram_state *s, const gram_trie *t, uint8_t *allowed) {
  memset(allowed, 0, (size_t)t->vocab);
  if (!grow_dep(s, t->max_len + 1)) return 0;
  ga_reset(&s->tmp, (gmark){0});
  s->dep[0] = s->cur;
  s->mark[0] = ga_mark(&s->tmp);
  int have = 0; /* dep[0 .. have] hold the last token's states, all alive */
  int64_t count = 0;
  for (int32_t i = 0; i < t->n; i++) {
    int32_t id = t->ord[i];
    const uint8_t *p = t->bytes[id];
    int len = t->len[id], d = t->lcp[i] < have ? t->lcp[i] : have;
    ga_reset(&s->tmp, s->mark[d]);
    for (; d < len; d++) {
      s->mark[d] = ga_mark(&s->tmp);
      if (!step_byte(s, &s->dep[d], p[d], &s->tmp, &s->dep[d + 1])) break;
    }
    s->oom = false;
    if (d == len) {
      s->mark[d] = ga_mark(&s->tmp); /* a longer token may go on from here */
      allowed[id] = 1;
      count++;
      have = len;
      continue;
    }
    have = d;
    while (i + 1 < t->n && t->lcp[i + 1] > d) i++; /* they share the prefix that failed */
  }
  if (gram_state_accepting(s))
    for (int32_t id = 0; id < t->vocab; id++)
      if (t->eog[id]) allowed[id] = 1, count++;
  return count;
}

bool gram_allows(gram_state *s, const gram_trie *t, int32_t id) {
  if (id < 0 || id >= t->vocab) return false;
  if (t->eog[id]) return gram_state_accepting(s);
  if (!t->bytes[id]) return false;
  ga_reset(&s->tmp, (gmark){0});
  gset g = s->cur, next;
  for (int i = 0; i < t->len[id]; i++, g = next)
    if (!step_byte(s, &g, t->bytes[id][i], &s->tmp, &next)) {
      s->oom = false;
      return false;
    }
  return true;
}

bool gram_state_take(gram_state *s, const gram_trie *t, int32_t id) {
  if (id < 0 || id >= t->vocab) return false;
  if (t->eog[id]) return gram_state_accepting(s);
  return t->bytes[id] && gram_state_advance(s, t->bytes[id], t->len[id]);
}
