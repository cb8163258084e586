/* grammar_regex: regular expressions to GBNF: vLLM's guided_regex (the whole text matches)
 * and JSON Schema's pattern (inside a JSON string, so every character is matched as JSON
 * writes it: a quote as \", a newline as \n). Supported: literals, ., [classes] with
 * ranges and negation, \d \w \s \D \W \S (ASCII), escapes (\n \t \r \f \v \0 \xHH \uHHHH
 * and escaped punctuation), groups ( ), (?: ), (?P<name> ), alternation, the quantifiers
 * * + ? {m} {m,} {m,n} (lazy and possessive forms match the same texts), and ^ / $ at the
 * ends. Backreferences, lookaround and \b are refused. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "ir_alloc.h"

typedef struct rbuf {
  char *s;
  size_t n, cap;
} rbuf;

typedef struct rx {
  const char *p, *end, *start;
  rbuf out;
  bool json;
  ir_diag *err;
  bool failed;
} rx;

static void rput(rx *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (r->failed || n < 0) return;
  if (r->out.n + (size_t)n + 1 > r->out.cap) {
    size_t cap = r->out.cap ? r->out.cap * 2 : 256;
    while (cap < r->out.n + (size_t)n + 1) cap *= 2;
    char *s = ir_realloc(r->out.s, cap);
    if (!s) {
      r->failed = true;
      if (r->err) *r->err = (ir_diag){.status = IR_OOM, .msg = "out of memory"};
      return;
    }
    r->out.s = s, r->out.cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(r->out.s + r->out.n, r->out.cap - r->out.n, fmt, ap);
  va_end(ap);
  r->out.n += (size_t)n;
}

static void rfail(rx *r, const char *fmt, ...) {
  if (r->failed) return;
  r->failed = true;
  if (!r->err) return;
  r->err->status = IR_UNSUPPORTED;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(r->err->msg, sizeof r->err->msg, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof r->err->msg)
    snprintf(r->err->msg + n, sizeof r->err->msg - (size_t)n, " (at offset %d of the regex)",
             (int)(r->p - r->start));
}

/* --- characters and classes --------------------------------------------------------------- */

typedef struct rclass {
  uint32_t r[2 * 64]; /* inclusive ranges */
  int n;
  bool neg;
} rclass;

static void add_range(rx *r, rclass *k, uint32_t lo, uint32_t hi) {
  if (k->n == 2 * 64) return rfail(r, "character class too large");
  k->r[k->n++] = lo, k->r[k->n++] = hi;
}

static bool in_class(const rclass *k, uint32_t c) {
  bool in = false;
  for (int i = 0; i < k->n && !in; i += 2) in = c >= k->r[i] && c <= k->r[i + 1];
  return in != k->neg;
}

static uint32_t utf8(rx *r) {
  const uint8_t *s = (const uint8_t *)r->p;
  uint32_t c = s[0];
  int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  bool ok = n >= 0 && r->p + n < r->end;
  for (int i = 1; ok && i <= n; i++) ok = (s[i] & 0xC0) == 0x80;
  if (!ok) {
    rfail(r, "invalid UTF-8 in the regex");
    r->p = r->end;
    return 0;
  }
  if (n) c &= 0x3Fu >> n;
  for (int i = 1; i <= n; i++) c = c << 6 | (s[i] & 0x3F);
  r->p += n + 1;
  return c;
}

static uint32_t hex(rx *r, int n) {
  uint32_t v = 0;
  for (int i = 0; i < n; i++, r->p++) {
    char c = r->p < r->end ? *r->p : 0;
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) {
      rfail(r, "expected %d hex digits", n);
      return 0;
    }
    v = v << 4 | (uint32_t)d;
  }
  return v;
}

/* A shorthand class (\d \w \s, upper case negated) into k; false if e is none. */
static bool shorthand(rx *r, char e, rclass *k) {
  char l = (char)(e | 0x20);
  if (l != 'd' && l != 'w' && l != 's') return false;
  if (l == 'd') add_range(r, k, '0', '9');
  if (l == 'w') {
    add_range(r, k, '0', '9'), add_range(r, k, 'A', 'Z');
    add_range(r, k, 'a', 'z'), add_range(r, k, '_', '_');
  }
  if (l == 's') add_range(r, k, ' ', ' '), add_range(r, k, '\t', '\r');
  k->neg = e != l;
  return true;
}

/* The character after a backslash (the backslash read). */
static uint32_t escaped(rx *r) {
  char e = r->p < r->end ? *r->p++ : 0;
  switch (e) {
  case 'n': return '\n';
  case 't': return '\t';
  case 'r': return '\r';
  case 'f': return '\f';
  case 'v': return '\v';
  case '0': return 0;
  case 'x': return hex(r, 2);
  case 'u': return hex(r, 4);
  case 'b': rfail(r, "\\b (word boundary) is not supported"); return 0;
  case 0: rfail(r, "the regex ends in a backslash"); return 0;
  default:
    if (e >= '1' && e <= '9') rfail(r, "backreferences are not supported");
    else if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) rfail(r, "unknown escape \\%c", e);
    return (uint8_t)e;
  }
}

/* One character as GBNF class text (inside [ ]). */
static void put_class_char(rx *r, uint32_t c) {
  if (c == ']' || c == '\\' || c == '-' || c == '^' || c == '[') rput(r, "\\%c", (char)c);
  else if (c < 0x20 || c == 0x7F) rput(r, "\\x%02X", c);
  else if (c < 0x80) rput(r, "%c", (char)c);
  else rput(r, "\\U%08X", c);
}

/* The text JSON writes for character c inside a string, as a GBNF literal. */
static void put_json_char(rx *r, uint32_t c) {
  static const char short_esc[0x20] = {
      ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
  if (c == '"' || c == '\\') rput(r, "\"\\\\\\%c\"", (char)c);
  else if (c < 0x20 && short_esc[c]) rput(r, "\"\\\\%c\"", short_esc[c]);
  else if (c < 0x20) rput(r, "\"\\\\u00%02X\"", c);
  else if (c == 0x7F) rput(r, "\"\\x7F\"");
  else if (c < 0x80) rput(r, "\"%c\"", (char)c);
  else rput(r, "\"\\U%08X\"", c);
}

static void put_literal(rx *r, uint32_t c) {
  if (r->json) return put_json_char(r, c);
  if (c == '"' || c == '\\') rput(r, "\"\\%c\"", (char)c);
  else if (c < 0x20 || c == 0x7F) rput(r, "\"\\x%02X\"", c);
  else if (c < 0x80) rput(r, "\"%c\"", (char)c);
  else rput(r, "\"\\U%08X\"", c);
}

/* A class as GBNF; in a JSON string the quote, the backslash and the control characters
 * it holds become alternatives of their escapes. */
static void put_class(rx *r, const rclass *k) {
  if (!r->json) {
    rput(r, "[%s", k->neg ? "^" : "");
    for (int i = 0; i < k->n; i += 2) {
      put_class_char(r, k->r[i]);
      if (k->r[i + 1] != k->r[i]) rput(r, "-"), put_class_char(r, k->r[i + 1]);
    }
    return rput(r, "]");
  }
  rput(r, "(");
  int alts = 0;
  if (k->neg) { /* everything but k's and the specials, written plainly */
    rput(r, "[^\"\\\\\\x00-\\x1F\\x7F");
    for (int i = 0; i < k->n; i += 2) {
      put_class_char(r, k->r[i]);
      if (k->r[i + 1] != k->r[i]) rput(r, "-"), put_class_char(r, k->r[i + 1]);
    }
    rput(r, "]"), alts++;
  } else { /* k's ranges less the specials */
    rclass plain = {.n = 0};
    for (int i = 0; i < k->n; i += 2) {
      uint32_t lo = k->r[i], hi = k->r[i + 1];
      uint32_t cut[3][2] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7E}};
      for (int j = 0; j < 3; j++) {
        uint32_t a = lo > cut[j][0] ? lo : cut[j][0], b = hi < cut[j][1] ? hi : cut[j][1];
        if (a <= b) add_range(r, &plain, a, b);
      }
      if (hi >= 0x80) add_range(r, &plain, lo > 0x80 ? lo : 0x80, hi);
    }
    if (plain.n) {
      bool json = r->json;
      r->json = false;
      put_class(r, &plain);
      r->json = json;
      alts++;
    }
  }
  for (uint32_t c = 0; c <= 0x7F; c = c == 0x1F ? '"' : c == '"' ? '\\' : c == '\\' ? 0x7F : c + 1)
    if (in_class(k, c)) {
      rput(r, alts++ ? " | " : "");
      put_json_char(r, c);
    }
  if (!alts) rfail(r, "a character class that matches nothing");
  rput(r, ")");
}

static void parse_class(rx *r) {
  r->p++; /* [ */
  rclass k = {.neg = r->p < r->end && *r->p == '^'};
  r->p += k.neg;
  for (bool first = true; !r->failed; first = false) {
    if (r->p >= r->end) return rfail(r, "unterminated character class");
    if (*r->p == ']' && !first) break;
    uint32_t lo;
    if (*r->p == '\\') {
      r->p++;
      rclass sh = {.n = 0};
      if (r->p < r->end && shorthand(r, *r->p, &sh)) {
        if (sh.neg) return rfail(r, "\\D, \\W and \\S inside a class are not supported");
        r->p++;
        for (int i = 0; i < sh.n; i += 2) add_range(r, &k, sh.r[i], sh.r[i + 1]);
        continue;
      }
      lo = escaped(r);
    } else {
      lo = utf8(r);
    }
    uint32_t hi = lo;
    if (r->p + 1 < r->end && r->p[0] == '-' && r->p[1] != ']') {
      r->p++;
      if (*r->p == '\\') r->p++, hi = escaped(r);
      else hi = utf8(r);
      if (hi < lo) return rfail(r, "character range out of order");
    }
    add_range(r, &k, lo, hi);
  }
  r->p++;
  put_class(r, &k);
}

/* --- structure ------------------------------------------------------------------------------ */

static void parse_alt(rx *r, int depth);

static void parse_quantifier(rx *r) {
  if (r->p >= r->end) return;
  char c = *r->p;
  if (c == '*' || c == '+' || c == '?') {
    rput(r, "%c", c);
    r->p++;
  } else if (c == '{' && r->p + 1 < r->end && r->p[1] >= '0' && r->p[1] <= '9') {
    const char *q = r->p;
    while (q < r->end && *q != '}') q++;
    if (q == r->end) return rfail(r, "unterminated {m,n}");
    rput(r, "%.*s", (int)(q - r->p + 1), r->p);
    r->p = q + 1;
  } else {
    return;
  }
  if (r->p < r->end && (*r->p == '?' || *r->p == '+')) r->p++; /* lazy, possessive */
  if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?'))
    rfail(r, "a quantifier follows a quantifier");
}

static void parse_atom(rx *r, int depth) {
  char c = *r->p;
  if (c == '(') {
    r->p++;
    if (r->p < r->end && *r->p == '?') {
      if (r->p + 1 < r->end && r->p[1] == ':') {
        r->p += 2;
      } else if (r->p + 2 < r->end && r->p[1] == 'P' && r->p[2] == '<') {
        while (r->p < r->end && *r->p != '>') r->p++;
        r->p++;
      } else {
        return rfail(r, "lookaround and other (?...) groups are not supported");
      }
    }
    rput(r, "(");
    parse_alt(r, depth + 1);
    if (r->p >= r->end || *r->p != ')') return rfail(r, "missing ')'");
    r->p++;
    rput(r, ")");
  } else if (c == '[') {
    parse_class(r);
  } else if (c == '.') {
    r->p++;
    rclass k = {.n = 0, .neg = true};
    add_range(r, &k, '\n', '\n');
    put_class(r, &k);
  } else if (c == '\\') {
    r->p++;
    rclass k = {.n = 0};
    if (r->p < r->end && shorthand(r, *r->p, &k)) r->p++, put_class(r, &k);
    else put_literal(r, escaped(r));
  } else if (c == '*' || c == '+' || c == '?') {
    rfail(r, "'%c' has nothing to repeat", c);
  } else if (c == '^' || c == '$') {
    rfail(r, "'%c' is supported only at the ends of the regex", c);
  } else {
    put_literal(r, utf8(r));
  }
}

static void parse_seq(rx *r, int depth) {
  int items = 0;
  while (r->p < r->end && *r->p != '|' && *r->p != ')' && !r->failed) {
    if (items++) rput(r, " ");
    parse_atom(r, depth);
    parse_quantifier(r);
  }
  if (!items) rput(r, "\"\"");
}

static void parse_alt(rx *r, int depth) {
  if (depth > 100) return rfail(r, "groups nested too deeply");
  parse_seq(r, depth);
  while (r->p < r->end && *r->p == '|' && !r->failed) {
    r->p++;
    rput(r, " | ");
    parse_seq(r, depth);
  }
}

/* Translates regex[0, len) (its ^ and $ already taken off) as one GBNF group. */
static bool translate(rx *r, const char *regex, size_t len) {
  r->p = r->start = regex, r->end = regex + len;
  rput(r, "(");
  parse_alt(r, 0);
  if (!r->failed && r->p < r->end) rfail(r, "unbalanced ')'");
  rput(r, ")");
  return !r->failed;
}

ir_status gram_regex(const char *regex, char **out, ir_diag *err) {
  *out = NULL;
  rx r = {.err = err};
  size_t len = strlen(regex);
  if (len && regex[0] == '^') regex++, len--;
  if (len && regex[len - 1] == '$' && (len < 2 || regex[len - 2] != '\\')) len--;
  rput(&r, "root ::= ");
  translate(&r, regex, len);
  rput(&r, "\n");
  if (r.failed) {
    ir_free(r.out.s);
    return err ? err->status : IR_UNSUPPORTED;
  }
  *out = r.out.s;
  return IR_OK;
}

char *gram_regex_json(const char *pattern, ir_diag *err) {
  rx r = {.err = err, .json = true};
  size_t len = strlen(pattern);
  bool head = len && pattern[0] == '^';
  if (head) pattern++, len--;
  bool tail = len && pattern[len - 1] == '$' && (len < 2 || pattern[len - 2] != '\\');
  if (tail) len--;
  rput(&r, "\"\\\"\" %s", head ? "" : "char* "); /* JSON Schema's pattern is a search */
  translate(&r, pattern, len);
  rput(&r, "%s \"\\\"\"", tail ? "" : " char*");
  if (!r.failed) return r.out.s;
  ir_free(r.out.s);
  return NULL;
}
