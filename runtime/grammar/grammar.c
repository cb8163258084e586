/* grammar: GBNF parsing and compilation (to flat rule alternatives of character classes
 * and rule references). Parse states are in grammar_state.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "ir_alloc.h"

/* --- the grammar under construction ------------------------------------------------------ */

typedef struct gseq {
  gel *v;
  int n, cap;
} gseq;

typedef struct grule {
  char *name; /* NULL for the rules made for groups and repetitions */
  gseq *alts;
  int n_alts, cap_alts;
  int line; /* where it was first referenced or defined (for errors) */
  bool defined;
} grule;

typedef struct gparser {
  const char *p, *src;
  int line;
  grule *rules;
  int n_rules, cap_rules;
  gclass *cls;
  int n_cls, cap_cls;
  int64_t n_elems; /* elements so far: a bound on repetition blowing up */
  int depth;       /* parentheses open now */
  ir_diag *err;
  bool failed, oom; /* oom: the failure was an allocation */
} gparser;

#define MAX_ELEMS (1 << 20)
#define MAX_DEPTH                                                                                  \
  1000 /* nested parentheses, and rules nested at the left edge: the parser
                          and the checks recurse that deep (a server thread's stack) */

static void gfail(gparser *g, const char *fmt, ...) {
  if (g->failed) return;
  g->failed = true;
  if (!g->err) return;
  g->err->status = IR_INVALID_ARG;
  int n = snprintf(g->err->msg, sizeof g->err->msg, "grammar: line %d: ", g->line);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->err->msg + n, sizeof g->err->msg - (size_t)n, fmt, ap);
  va_end(ap);
}

/* The parse stops for want of memory: IR_OOM, not a fault of the grammar. */
static void goom(gparser *g) {
  if (g->failed) return;
  g->failed = g->oom = true;
  if (g->err) *g->err = (ir_diag){.status = IR_OOM, .msg = "out of memory"};
}

static bool grow(void **v, int *cap, int need, size_t elem) {
  if (need <= *cap) return true;
  int c = *cap ? *cap * 2 : 8;
  while (c < need) c *= 2;
  void *n = ir_realloc(*v, (size_t)c * elem);
  if (!n) return false;
  *v = n;
  *cap = c;
  return true;
}

static int new_rule(gparser *g, const char *name, size_t len) {
  if (!grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) {
    goom(g);
    return 0;
  }
  grule *r = &g->rules[g->n_rules];
  *r = (grule){.line = g->line};
  if (name) {
    r->name = ir_malloc(len + 1);
    if (!r->name) {
      goom(g);
      return 0;
    }
    memcpy(r->name, name, len);
    r->name[len] = 0;
  }
  return g->n_rules++;
}

static int find_rule(gparser *g, const char *name, size_t len) {
  for (int i = 0; i < g->n_rules; i++)
    if (g->rules[i].name && strlen(g->rules[i].name) == len && !memcmp(g->rules[i].name, name, len))
      return i;
  return new_rule(g, name, len);
}

static gseq *new_alt(gparser *g, int rule) {
  grule *r = &g->rules[rule];
  if (!grow((void **)&r->alts, &r->cap_alts, r->n_alts + 1, sizeof *r->alts)) {
    goom(g);
    return NULL;
  }
  r->alts[r->n_alts] = (gseq){0};
  return &r->alts[r->n_alts++];
}

static void push(gparser *g, gseq *s, gel e) {
  if (g->failed) return;
  if (++g->n_elems > MAX_ELEMS) return gfail(g, "the grammar expands to over %d items", MAX_ELEMS);
  if (!grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) return goom(g);
  s->v[s->n++] = e;
}

static int new_class(gparser *g, bool neg) {
  if (!grow((void **)&g->cls, &g->cap_cls, g->n_cls + 1, sizeof *g->cls)) {
    goom(g);
    return 0;
  }
  g->cls[g->n_cls] = (gclass){.neg = neg};
  return g->n_cls++;
}

static void class_add(gparser *g, int c, uint32_t lo, uint32_t hi) {
  gclass *k = &g->cls[c];
  if (!grow((void **)&k->r, &k->cap, k->n + 2, sizeof *k->r)) return goom(g);
  k->r[k->n++] = lo;
  k->r[k->n++] = hi;
}

/* --- lexing -------------------------------------------------------------------------------- */

static bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

/* Skips spaces and comments; newlines too when `lines`. */
static void skip_space(gparser *g, bool lines) {
  for (;;) {
    char c = *g->p;
    if (c == ' ' || c == '\t' || (lines && (c == '\n' || c == '\r'))) {
      g->line += c == '\n';
      g->p++;
    } else if (c == '#') {
      while (*g->p && *g->p != '\n') g->p++;
    } else {
      return;
    }
  }
}

/* One UTF-8 character of the source; 0xFFFFFFFF on bad UTF-8. */
static uint32_t utf8_char(gparser *g) {
  const uint8_t *s = (const uint8_t *)g->p;
  uint32_t c = s[0];
  int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (n < 0) return 0xFFFFFFFFu;
  if (n) c &= 0x3Fu >> n;
  for (int i = 1; i <= n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0xFFFFFFFFu;
    c = c << 6 | (s[i] & 0x3F);
  }
  g->p += n + 1;
  return c;
}

static uint32_t hex_digits(gparser *g, int n) {
  uint32_t v = 0;
  for (int i = 0; i < n; i++) {
    char c = *g->p;
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) {
      gfail(g, "expected %d hex digits in an escape", n);
      return 0;
    }
    v = v << 4 | (uint32_t)d;
    g->p++;
  }
  return v;
}

/* A character of a literal or class, escapes decoded. */
static uint32_t read_char(gparser *g) {
  if (*g->p != '\\') {
    uint32_t c = utf8_char(g);
    if (c == 0xFFFFFFFFu) gfail(g, "invalid UTF-8");
    return c;
  }
  g->p++;
  char e = *g->p++;
  switch (e) {
  case 'n': return '\n';
  case 'r': return '\r';
  case 't': return '\t';
  case 'x': return hex_digits(g, 2);
  case 'u': return hex_digits(g, 4);
  case 'U': return hex_digits(g, 8);
  case 0: g->p--, gfail(g, "unfinished escape"); return 0; /* stay on the NUL */
  default:
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
      gfail(g, "unknown escape '\\%c'", e);
    return (uint8_t)e;
  }
}

/* --- parsing ------------------------------------------------------------------------------- */

static void parse_alternates(gparser *g, int rule, bool nested);

static void parse_literal(gparser *g, gseq *s) {
  g->p++; /* the quote */
  while (!g->failed && *g->p != '"') {
    if (!*g->p || *g->p == '\n') return gfail(g, "unterminated string literal");
    uint32_t c = read_char(g);
    int k = new_class(g, false);
    class_add(g, k, c, c);
    push(g, s, (gel){G_CHAR, (uint32_t)k});
  }
  if (!g->failed) g->p++; /* the closing quote (never past the end) */
}

static void parse_class(gparser *g, gseq *s) {
  g->p++; /* [ */
  bool neg = *g->p == '^';
  g->p += neg;
  int k = new_class(g, neg);
  while (!g->failed && *g->p != ']') {
    if (!*g->p || *g->p == '\n') return gfail(g, "unterminated character class");
    uint32_t lo = read_char(g), hi = lo;
    if (g->p[0] == '-' && g->p[1] && g->p[1] != ']') {
      g->p++;
      hi = read_char(g);
      if (hi < lo) return gfail(g, "character range out of order");
    }
    class_add(g, k, lo, hi);
  }
  if (g->failed) return;
  g->p++;
  push(g, s, (gel){G_CHAR, (uint32_t)k});
}

/* Replaces the item at s->v[start..] by a reference to a rule that repeats it min..max
 * times (max < 0: unbounded), as right-recursive rules. */
static void repeat(gparser *g, gseq *s, int start, int min, int max) {
  int n = s->n - start;
  gel *item = ir_malloc((size_t)n * sizeof *item);
  if (!item) return goom(g);
  if (n) memcpy(item, s->v + start, (size_t)n * sizeof *item);
  s->n = start;
  for (int i = 0; i < min; i++)
    for (int j = 0; j < n; j++) push(g, s, item[j]);
  int rest = max < 0 ? 1 : max - min, prev = -1;
  for (int k = 0; k < rest && !g->failed; k++) { /* r ::= item prev | "" */
    int r = new_rule(g, NULL, 0);
    gseq *a = new_alt(g, r);
    if (!a) break;
    for (int j = 0; j < n; j++) push(g, a, item[j]);
    if (max < 0) push(g, a, (gel){G_REF, (uint32_t)r}); /* star: itself */
    else if (prev >= 0) push(g, a, (gel){G_REF, (uint32_t)prev});
    new_alt(g, r);
    g->rules[r].defined = true;
    prev = r;
  }
  if (prev >= 0) push(g, s, (gel){G_REF, (uint32_t)prev});
  ir_free(item);
}

static int read_int(gparser *g) {
  if (*g->p < '0' || *g->p > '9') {
    gfail(g, "expected a number in {m,n}");
    return 0;
  }
  long v = 0;
  while (*g->p >= '0' && *g->p <= '9' && v < 100000) v = v * 10 + (*g->p++ - '0');
  if (v >= 100000) gfail(g, "repetition count too large");
  return (int)v;
}

static void parse_braces(gparser *g, gseq *s, int start) {
  g->p++;
  skip_space(g, true);
  int min = read_int(g), max = min;
  skip_space(g, true);
  if (*g->p == ',') {
    g->p++;
    skip_space(g, true);
    max = *g->p == '}' ? -1 : read_int(g);
    skip_space(g, true);
  }
  if (*g->p != '}') return gfail(g, "expected '}'");
  g->p++;
  if (max >= 0 && max < min) return gfail(g, "repetition {%d,%d} has max < min", min, max);
  repeat(g, s, start, min, max);
}

static void parse_sequence(gparser *g, int rule, bool nested) {
  gseq *s = new_alt(g, rule);
  int last = -1; /* where the last item starts: a postfix applies to it */
  while (s && !g->failed) {
    char c = *g->p;
    int here = s->n;
    if (c == '"') {
      parse_literal(g, s);
    } else if (c == '[') {
      parse_class(g, s);
    } else if (c == '.') {
      g->p++;
      push(g, s, (gel){G_CHAR, (uint32_t)new_class(g, true)});
    } else if (is_word(c)) {
      const char *w = g->p;
      while (is_word(*g->p)) g->p++;
      push(g, s, (gel){G_REF, (uint32_t)find_rule(g, w, (size_t)(g->p - w))});
    } else if (c == '(') {
      if (++g->depth > MAX_DEPTH) return gfail(g, "parentheses nested over %d deep", MAX_DEPTH);
      g->p++;
      skip_space(g, true);
      int sub = new_rule(g, NULL, 0);
      g->rules[sub].defined = true;
      parse_alternates(g, sub, true);
      if (g->failed) return;
      if (*g->p != ')') return gfail(g, "expected ')'");
      g->p++;
      g->depth--;
      s = &g->rules[rule].alts[g->rules[rule].n_alts - 1]; /* rules may have moved */
      push(g, s, (gel){G_REF, (uint32_t)sub});
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
      if (last < 0) return gfail(g, "'%c' follows nothing", c);
      if (c == '{') parse_braces(g, s, last);
      else g->p++, repeat(g, s, last, c == '+', c == '?' ? 1 : -1);
      s = &g->rules[rule].alts[g->rules[rule].n_alts - 1];
      last = -1;
      skip_space(g, nested);
      continue;
    } else {
      break;
    }
    s = &g->rules[rule].alts[g->rules[rule].n_alts - 1];
    last = here;
    skip_space(g, nested);
  }
}

static void parse_alternates(gparser *g, int rule, bool nested) {
  parse_sequence(g, rule, nested);
  while (!g->failed && *g->p == '|') {
    g->p++;
    skip_space(g, true);
    parse_sequence(g, rule, nested);
  }
}

static void parse_rule(gparser *g) {
  const char *w = g->p;
  while (is_word(*g->p)) g->p++;
  if (g->p == w) return gfail(g, "expected a rule name");
  int r = find_rule(g, w, (size_t)(g->p - w));
  if (g->failed) return;
  if (g->rules[r].defined) return gfail(g, "rule '%s' is defined twice", g->rules[r].name);
  g->rules[r].defined = true;
  g->rules[r].line = g->line;
  skip_space(g, false);
  if (strncmp(g->p, "::=", 3)) return gfail(g, "expected '::=' after '%s'", g->rules[r].name);
  g->p += 3;
  skip_space(g, true);
  parse_alternates(g, r, false);
  if (g->failed) return;
  if (*g->p && *g->p != '\n' && *g->p != '\r')
    return gfail(g, "unexpected '%c' (expected a newline or the end)", *g->p);
  skip_space(g, true);
}

/* --- checks and flattening ---------------------------------------------------------------- */

/* Which rules derive the empty string (a fixpoint). */
static bool *nullable_rules(gparser *g) {
  bool *nul = ir_calloc((size_t)g->n_rules, sizeof *nul), changed = true;
  while (nul && changed) {
    changed = false;
    for (int r = 0; r < g->n_rules; r++)
      for (int a = 0; a < g->rules[r].n_alts && !nul[r]; a++) {
        gseq *s = &g->rules[r].alts[a];
        int i = 0;
        while (i < s->n && s->v[i].type == G_REF && nul[s->v[i].arg]) i++;
        if (i == s->n) nul[r] = changed = true;
      }
  }
  return nul;
}

/* Depth-first search for a rule reached again at the left edge (0 new, 1 on the path,
 * 2 done): the rule, -1 for none, -2 when the search goes deeper than MAX_DEPTH. */
static int left_cycle(gparser *g, const bool *nul, int r, uint8_t *mark, int depth) {
  if (mark[r] == 1) return r;
  if (mark[r] == 2) return -1;
  if (depth > MAX_DEPTH) return -2;
  mark[r] = 1;
  for (int a = 0; a < g->rules[r].n_alts; a++) {
    gseq *s = &g->rules[r].alts[a];
    for (int i = 0; i < s->n && s->v[i].type == G_REF; i++) {
      int c = left_cycle(g, nul, (int)s->v[i].arg, mark, depth + 1);
      if (c >= 0 || c == -2) return c;
      if (!nul[s->v[i].arg]) break;
    }
  }
  mark[r] = 2;
  return -1;
}

static void check(gparser *g, int *root) {
  *root = -1;
  for (int r = 0; r < g->n_rules && !g->failed; r++) {
    if (!g->rules[r].defined) {
      g->line = g->rules[r].line;
      gfail(g, "rule '%s' is used but not defined", g->rules[r].name);
    }
    if (g->rules[r].name && !strcmp(g->rules[r].name, "root")) *root = r;
  }
  if (g->failed) return;
  if (*root < 0) return gfail(g, "no 'root' rule");
  bool *nul = nullable_rules(g);
  uint8_t *mark = ir_calloc((size_t)g->n_rules, 1);
  if (!nul || !mark) goom(g);
  for (int r = 0; r < g->n_rules && !g->failed; r++) {
    int c = left_cycle(g, nul, r, mark, 0);
    if (c == -2) {
      gfail(g, "rules nested over %d deep at the start of an alternative", MAX_DEPTH);
      break;
    }
    if (c < 0) continue;
    int named = c;
    while (!g->rules[named].name && named > 0) named--; /* helper rules follow their rule */
    g->line = g->rules[named].line;
    gfail(g, "rule '%s' is left-recursive", g->rules[named].name ? g->rules[named].name : "?");
  }
  ir_free(nul);
  ir_free(mark);
}

static ir_status flatten(gparser *g, int root, gram **out) {
  gram *G = ir_calloc(1, sizeof *G);
  if (!G) return IR_OOM;
  int n_el = 0, n_alt = 0;
  for (int r = 0; r < g->n_rules; r++) {
    n_alt += g->rules[r].n_alts;
    for (int a = 0; a < g->rules[r].n_alts; a++) n_el += g->rules[r].alts[a].n + 1;
  }
  G->el = ir_malloc((size_t)n_el * sizeof *G->el);
  G->alt = ir_malloc((size_t)n_alt * sizeof *G->alt);
  G->rule_alt = ir_malloc((size_t)(g->n_rules + 1) * sizeof *G->rule_alt);
  if (!G->el || !G->alt || !G->rule_alt) {
    gram_destroy(G);
    return IR_OOM;
  }
  int e = 0, k = 0;
  for (int r = 0; r < g->n_rules; r++) {
    G->rule_alt[r] = k;
    for (int a = 0; a < g->rules[r].n_alts; a++) {
      gseq *s = &g->rules[r].alts[a];
      G->alt[k++] = (uint32_t)e;
      if (s->n) memcpy(G->el + e, s->v, (size_t)s->n * sizeof *s->v);
      e += s->n;
      G->el[e++] = (gel){G_END, 0};
    }
  }
  G->rule_alt[g->n_rules] = k;
  G->n_rules = g->n_rules;
  G->root = root;
  G->cls = g->cls, G->n_cls = g->n_cls;
  g->cls = NULL, g->n_cls = 0;
  *out = G;
  return IR_OK;
}

ir_status gram_compile(const char *src, gram **out, ir_diag *err) {
  *out = NULL;
  gparser g = {.p = src ? src : "", .src = src, .line = 1, .err = err};
  skip_space(&g, true);
  while (*g.p && !g.failed) parse_rule(&g);
  int root = -1;
  if (!g.failed) check(&g, &root);
  ir_status st = g.oom ? IR_OOM : g.failed ? IR_INVALID_ARG : flatten(&g, root, out);
  if (st == IR_OOM && err) *err = (ir_diag){.status = IR_OOM, .msg = "out of memory"};
  for (int r = 0; r < g.n_rules; r++) {
    for (int a = 0; a < g.rules[r].n_alts; a++) ir_free(g.rules[r].alts[a].v);
    ir_free(g.rules[r].alts);
    ir_free(g.rules[r].name);
  }
  ir_free(g.rules);
  for (int c = 0; c < g.n_cls; c++) ir_free(g.cls[c].r);
  ir_free(g.cls);
  return st;
}

void gram_destroy(gram *G) {
  if (!G) return;
  for (int c = 0; c < G->n_cls; c++) ir_free(G->cls[c].r);
  ir_free(G->cls);
  ir_free(G->el);
  ir_free(G->alt);
  ir_free(G->rule_alt);
  ir_free(G);
}

ir_status gram_check(const char *gbnf, ir_diag *err) {
  gram *g = NULL;
  gram_state *s = NULL;
  ir_status st = gram_compile(gbnf, &g, err);
  if (st == IR_OK) st = gram_state_create(g, &s, err); /* its start, as a request's would */
  gram_state_destroy(s);
  gram_destroy(g);
  return st;
}
