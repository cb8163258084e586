/* grammar_json: GBNF for JSON values described by a JSON Schema, and for a choice of
 * strings. The output is grammar text that gram_compile reads like any other. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "ir_alloc.h"

/* Whitespace between JSON tokens: none, a space, or a newline and an indent (bounded, so
 * a model cannot fill its budget with blanks). */
static const char *JSON_BASE =
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,24}\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "number ::= integer (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws (member (\",\" ws member)*)? \"}\"\n"
    "member ::= string ws \":\" ws value ws\n"
    "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n";

typedef struct gbuf {
  char *s;
  size_t n, cap;
  bool oom;
} gbuf;

static void put(gbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (b->oom || n < 0) return;
  if (b->n + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + (size_t)n + 1) cap *= 2;
    char *s = ir_realloc(b->s, cap);
    if (!s) {
      b->oom = true;
      return;
    }
    b->s = s, b->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
  va_end(ap);
  b->n += (size_t)n;
}

/* text as a GBNF string literal */
static void put_literal(gbuf *b, const char *text) {
  put(b, "\"");
  for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
    if (*p == '"' || *p == '\\') put(b, "\\%c", *p);
    else if (*p == '\n') put(b, "\\n");
    else if (*p == '\r') put(b, "\\r");
    else if (*p == '\t') put(b, "\\t");
    else if (*p < 0x20 || *p == 0x7F) put(b, "\\x%02X", *p);
    else put(b, "%c", *p);
  }
  put(b, "\"");
}

/* A value as its compact JSON text, as a GBNF literal. */
static bool put_json_literal(gbuf *b, const cJSON *v) {
  char *t = cJSON_PrintUnformatted(v);
  if (!t) return false;
  put_literal(b, t);
  cJSON_free(t);
  return true;
}

/* A value as GBNF for its JSON text: scalars as their compact text, arrays and objects item
 * by item with the whitespace JSON allows between tokens (keys keep their order). */
static bool put_json_value(gbuf *b, const cJSON *v) {
  if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return put_json_literal(b, v);
  bool obj = cJSON_IsObject(v), ok = true;
  put(b, obj ? "(\"{\" ws" : "(\"[\" ws");
  for (const cJSON *x = v->child; x && ok; x = x->next) {
    if (x != v->child) put(b, " \",\" ws");
    if (obj) {
      cJSON *key = cJSON_CreateString(x->string);
      put(b, " ");
      ok = key && put_json_literal(b, key);
      cJSON_Delete(key);
      put(b, " ws \":\" ws");
    }
    put(b, " ");
    ok = ok && put_json_value(b, x);
    put(b, " ws");
  }
  put(b, obj ? " \"}\")" : " \"]\")");
  return ok;
}

typedef struct sconv {
  gbuf out;
  const cJSON *root;
  int next;
  struct {
    const cJSON *schema;
    int rule;
  } refs[256];
  int n_refs;
  ir_diag *err;
  bool failed;
} sconv;

static int sfail(sconv *c, ir_status st, const char *fmt, ...) {
  if (!c->failed && c->err) {
    c->err->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err->msg, sizeof c->err->msg, fmt, ap);
    va_end(ap);
  }
  c->failed = true;
  return -1;
}

static int gen(sconv *c, const cJSON *s, int depth);

static const char *KNOWN[] = {"type",
                              "properties",
                              "required",
                              "additionalProperties",
                              "items",
                              "prefixItems",
                              "minItems",
                              "maxItems",
                              "enum",
                              "const",
                              "anyOf",
                              "oneOf",
                              "allOf",
                              "$ref",
                              "$defs",
                              "definitions",
                              "minLength",
                              "maxLength",
                              "pattern",
                              "title",
                              "description",
                              "format",
                              "default",
                              "examples",
                              "$schema",
                              "$id",
                              "$comment",
                              "deprecated",
                              "readOnly",
                              "writeOnly",
                              "minimum",
                              "maximum",
                              "exclusiveMinimum",
                              "exclusiveMaximum",
                              NULL};

static bool check_keywords(sconv *c, const cJSON *s) {
  for (const cJSON *k = s->child; k; k = k->next) {
    int i = 0;
    while (KNOWN[i] && strcmp(KNOWN[i], k->string)) i++;
    if (!KNOWN[i]) {
      sfail(c, IR_UNSUPPORTED, "JSON Schema keyword '%.60s' is not supported", k->string);
      return false;
    }
  }
  return true;
}

static int new_rule(sconv *c) { return ++c->next; }

/* A rule holding alternatives given as rule numbers. */
static int alternatives(sconv *c, const int *alts, int n) {
  int r = new_rule(c);
  put(&c->out, "r%d ::=", r);
  for (int i = 0; i < n; i++) put(&c->out, "%s r%d", i ? " |" : "", alts[i]);
  put(&c->out, "\n");
  return r;
}

/* A rule that is exactly the given GBNF text. */
static int text_rule(sconv *c, const char *text) {
  int r = new_rule(c);
  put(&c->out, "r%d ::= %s\n", r, text);
  return r;
}

static int gen_enum(sconv *c, const cJSON *list, bool is_const) {
  int r = new_rule(c);
  put(&c->out, "r%d ::=", r);
  int n = 0;
  for (const cJSON *v = is_const ? list : list->child; v; v = is_const ? NULL : v->next) {
    put(&c->out, "%s ", n++ ? " |" : "");
    if (!put_json_value(&c->out, v)) return sfail(c, IR_OOM, "out of memory");
  }
  if (!n) return sfail(c, IR_INVALID_ARG, "JSON Schema: 'enum' is empty");
  put(&c->out, "\n");
  return r;
}

static int int_of(sconv *c, const cJSON *s, const char *key, int dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
  if (!v) return dflt;
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 100000 ||
      v->valuedouble != (double)(int)v->valuedouble)
    return sfail(c, IR_INVALID_ARG, "JSON Schema: '%s' must be a whole number in [0, 100000]", key);
  return (int)v->valuedouble;
}

static int gen_string(sconv *c, const cJSON *s) {
  int lo = int_of(c, s, "minLength", 0), hi = int_of(c, s, "maxLength", -1);
  if (c->failed) return -1;
  const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
  if (pat && (!cJSON_IsString(pat) || lo || hi >= 0))
    return sfail(c, IR_UNSUPPORTED,
                 "JSON Schema: 'pattern' must be a string, without "
                 "minLength / maxLength");
  if (pat) {
    char *g = gram_regex_json(pat->valuestring, c->err);
    if (!g) return c->failed = true, -1;
    int r = text_rule(c, g);
    ir_free(g);
    return r;
  }
  if (lo == 0 && hi < 0) return text_rule(c, "string");
  if (hi >= 0 && hi < lo) return sfail(c, IR_INVALID_ARG, "JSON Schema: maxLength < minLength");
  int r = new_rule(c);
  if (hi < 0) put(&c->out, "r%d ::= \"\\\"\" char{%d,} \"\\\"\"\n", r, lo);
  else put(&c->out, "r%d ::= \"\\\"\" char{%d,%d} \"\\\"\"\n", r, lo, hi);
  return r;
}

/* --- integer bounds ----------------------------------------------------------------------
 * Decimal strings without leading zeros (as JSON writes integers) of the values in a
 * range, as alternatives of digit classes: numbers of the same length split at their
 * first differing digit, each length between two lengths a block of its own. Values stay
 * within the integer rule's 16 digits. */

#define INT_DIGITS 16
#define INT_MAX_ABS 9999999999999999.0 /* the largest 16-digit value */

/* All n-digit strings between lo and hi (same length, lo <= hi), as a GBNF sequence. */
static void put_digits(gbuf *b, const char *lo, const char *hi, int n) {
  int i = 0;
  while (i < n && lo[i] == hi[i]) put(b, " \"%c\"", lo[i++]);
  if (i == n) return;
  int rest = n - i - 1;
  bool lo_zeros = strspn(lo + i + 1, "0") == (size_t)rest,
       hi_nines = strspn(hi + i + 1, "9") == (size_t)rest;
  char l = lo[i], h = hi[i], nines[INT_DIGITS + 1], zeros[INT_DIGITS + 1];
  memset(nines, '9', (size_t)rest), memset(zeros, '0', (size_t)rest);
  nines[rest] = zeros[rest] = '\0';
  put(b, " (");
  const char *sep = "";
  if (!lo_zeros) { /* l followed by lo's rest .. 9s */
    put(b, "\"%c\"", l);
    put_digits(b, lo + i + 1, nines, rest);
    sep = " | ", l++;
  }
  char top = hi_nines ? h : (char)(h - 1);
  if (l <= top) {
    put(b, "%s[%c-%c]", sep, l, top);
    if (rest) put(b, " [0-9]{%d}", rest);
    sep = " | ";
  }
  if (!hi_nines) { /* h followed by 0s .. hi's rest */
    put(b, "%s\"%c\"", sep, h);
    put_digits(b, zeros, hi + i + 1, rest);
  }
  put(b, ")");
}

/* The alternatives for values in [lo, hi] (0 <= lo <= hi), each after " | " but the first. */
static void put_range(gbuf *b, long long lo, long long hi) {
  char a[INT_DIGITS + 2], z[INT_DIGITS + 2];
  int na = snprintf(a, sizeof a, "%lld", lo), nz = snprintf(z, sizeof z, "%lld", hi);
  for (int n = na; n <= nz; n++) {
    char from[INT_DIGITS + 2], to[INT_DIGITS + 2];
    if (n == na) memcpy(from, a, (size_t)n + 1);
    else memset(from, '0', (size_t)n), from[0] = '1', from[n] = '\0';
    if (n == nz) memcpy(to, z, (size_t)n + 1);
    else memset(to, '9', (size_t)n), to[n] = '\0';
    put(b, "%s", n == na ? "" : " |");
    put_digits(b, from, to, n);
  }
}

/* The bound key of s rounded into the integers (exclusive ones moved by one); false when
 * absent. */
static bool int_bound(sconv *c, const cJSON *s, bool upper, long long *out) {
  const char *key = upper ? "maximum" : "minimum",
             *ex = upper ? "exclusiveMaximum" : "exclusiveMinimum";
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key),
              *x = cJSON_GetObjectItemCaseSensitive(s, ex);
  bool have = false;
  for (int k = 0; k < 2; k++) {
    const cJSON *b = k ? x : v;
    if (!b) continue;
    if (!cJSON_IsNumber(b) || !(fabs(b->valuedouble) <= INT_MAX_ABS))
      return sfail(c, IR_UNSUPPORTED,
                   "JSON Schema: '%s' must be a number of at most %d "
                   "digits",
                   k ? ex : key, INT_DIGITS),
             false;
    double d = upper ? floor(b->valuedouble) : ceil(b->valuedouble);
    if (k && d == b->valuedouble) d += upper ? -1 : 1;
    long long q = (long long)d;
    if (!have || (upper ? q < *out : q > *out)) *out = q;
    have = true;
  }
  return have;
}

static bool has_bounds(const cJSON *s) {
  return cJSON_GetObjectItemCaseSensitive(s, "minimum") ||
         cJSON_GetObjectItemCaseSensitive(s, "maximum") ||
         cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") ||
         cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
}

/* An integer within the schema's minimum / maximum (exclusive or not). */
static int gen_integer(sconv *c, const cJSON *s) {
  if (!has_bounds(s)) return text_rule(c, "integer");
  long long lo = 0, hi = 0, big = (long long)INT_MAX_ABS;
  bool has_lo = int_bound(c, s, false, &lo), has_hi = !c->failed && int_bound(c, s, true, &hi);
  if (c->failed) return -1;
  if (!has_lo) lo = -big;
  if (!has_hi) hi = big;
  if (lo > hi) return sfail(c, IR_INVALID_ARG, "JSON Schema: no integer lies within the bounds");
  int r = new_rule(c);
  put(&c->out, "r%d ::=", r);
  if (lo < 0) { /* "-" and the magnitudes [max(1, -hi), -lo] */
    put(&c->out, " \"-\" (");
    put_range(&c->out, hi < 0 ? -hi : 1, -lo);
    put(&c->out, ")%s", hi >= 0 ? " |" : "");
  }
  if (hi >= 0) {
    put(&c->out, " (");
    put_range(&c->out, lo > 0 ? lo : 0, hi);
    put(&c->out, ")");
  }
  if (lo <= 0 && hi >= 0) put(&c->out, " | \"-0\""); /* JSON's other spelling of 0 */
  put(&c->out, "\n");
  return r;
}

/* [ items ] with minItems / maxItems, or a tuple from prefixItems. */
static int gen_array(sconv *c, const cJSON *s, int depth) {
  const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
  const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
  int lo = int_of(c, s, "minItems", 0), hi = int_of(c, s, "maxItems", -1);
  if (c->failed) return -1;
  if (hi >= 0 && hi < lo) return sfail(c, IR_INVALID_ARG, "JSON Schema: maxItems < minItems");
  bool no_more = items && cJSON_IsFalse(items);
  int it = items && !no_more ? gen(c, items, depth + 1) : text_rule(c, "value");
  if (it < 0) return -1;
  if (prefix) {
    if (!cJSON_IsArray(prefix) || cJSON_GetArraySize(prefix) == 0 || lo || hi >= 0)
      return sfail(c, IR_UNSUPPORTED,
                   "JSON Schema: 'prefixItems' must be a non-empty list, without min/maxItems");
    int n = cJSON_GetArraySize(prefix), *p = ir_malloc((size_t)n * sizeof *p);
    if (!p) return sfail(c, IR_OOM, "out of memory");
    for (int i = 0; i < n && !c->failed; i++)
      p[i] = gen(c, cJSON_GetArrayItem(prefix, i), depth + 1);
    int r = new_rule(c);
    put(&c->out, "r%d ::= \"[\" ws", r);
    for (int i = 0; i < n; i++) put(&c->out, "%s r%d ws", i ? " \",\" ws" : "", p[i]);
    put(&c->out, no_more ? " \"]\"\n" : " (\",\" ws r%d ws)* \"]\"\n", it);
    ir_free(p);
    return c->failed ? -1 : r;
  }
  int r = new_rule(c);
  put(&c->out, "r%d ::= \"[\" ws ", r);
  if (hi == 0) {
    put(&c->out, "\"]\"\n");
    return r;
  }
  put(&c->out, "%sr%d ws (\",\" ws r%d ws)", lo ? "" : "(", it, it);
  if (hi < 0) put(&c->out, "{%d,}", lo ? lo - 1 : 0);
  else put(&c->out, "{%d,%d}", lo ? lo - 1 : 0, hi - 1);
  put(&c->out, "%s \"]\"\n", lo ? "" : ")?");
  return r;
}

static bool is_required(const cJSON *req, const char *name) {
  for (const cJSON *v = req ? req->child : NULL; v; v = v->next)
    if (cJSON_IsString(v) && !strcmp(v->valuestring, name)) return true;
  return false;
}

/* Properties in the schema's order, the required ones always there: F(k) is what may
 * follow "{" from property k on, T(k) what may follow a member from property k on. */
static int gen_object(sconv *c, const cJSON *s, int depth) {
  const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
  const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
  const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
  int n = props ? cJSON_GetArraySize(props) : 0;
  if (props && !cJSON_IsObject(props))
    return sfail(c, IR_INVALID_ARG, "JSON Schema: 'properties' must be an object");
  for (const cJSON *v = req ? req->child : NULL; v; v = v->next)
    if (!cJSON_IsString(v) || !cJSON_GetObjectItemCaseSensitive(props, v->valuestring))
      return sfail(c, IR_UNSUPPORTED, "JSON Schema: required '%.60s' is not among the 'properties'",
                   cJSON_IsString(v) ? v->valuestring : "?");
  bool extra = n == 0 ? !add || !cJSON_IsFalse(add) : add && !cJSON_IsFalse(add);
  int ev = !extra                       ? -1
           : add && cJSON_IsObject(add) ? gen(c, add, depth + 1)
                                        : text_rule(c, "value");
  if (c->failed) return -1;
  int *member = ir_malloc((size_t)(n ? n : 1) * sizeof *member);
  if (!member) return sfail(c, IR_OOM, "out of memory");
  int k = 0;
  for (const cJSON *p = props ? props->child : NULL; p && !c->failed; p = p->next, k++) {
    int v = gen(c, p, depth + 1), r = new_rule(c);
    cJSON *key = cJSON_CreateString(p->string);
    put(&c->out, "r%d ::= ", r);
    if (!key || !put_json_literal(&c->out, key)) sfail(c, IR_OOM, "out of memory");
    cJSON_Delete(key);
    put(&c->out, " ws \":\" ws r%d ws\n", v);
    member[k] = r;
  }
  int em = -1; /* one extra member: any key, the additionalProperties value */
  if (extra) em = new_rule(c), put(&c->out, "r%d ::= string ws \":\" ws r%d ws\n", em, ev);
  /* the trailing rules, built from the end */
  int T = new_rule(c), F = new_rule(c);
  if (extra) {
    put(&c->out, "r%d ::= (\",\" ws r%d)*\n", T, em);
    put(&c->out, "r%d ::= (r%d (\",\" ws r%d)*)?\n", F, em, em);
  } else {
    put(&c->out, "r%d ::= \"\"\nr%d ::= \"\"\n", T, F);
  }
  k = n - 1;
  for (const cJSON *p = props ? cJSON_GetArrayItem(props, n - 1) : NULL; p && k >= 0;
       p = p->prev, k--) {
    bool need = is_required(req, p->string);
    int t = new_rule(c), f = new_rule(c);
    put(&c->out, "r%d ::= \",\" ws r%d r%d%s", t, member[k], T, need ? "\n" : "");
    if (!need) put(&c->out, " | r%d\n", T);
    put(&c->out, "r%d ::= r%d r%d%s", f, member[k], T, need ? "\n" : "");
    if (!need) put(&c->out, " | r%d\n", F);
    T = t, F = f;
    if (k == 0) break;
  }
  ir_free(member);
  int r = new_rule(c);
  put(&c->out, "r%d ::= \"{\" ws r%d \"}\"\n", r, F);
  return c->failed ? -1 : r;
}

/* $ref to a definition of the root schema; each becomes one rule, so refs may recurse. */
static int gen_ref(sconv *c, const char *ref, int depth) {
  const cJSON *target = NULL;
  if (!strcmp(ref, "#")) target = c->root;
  else if (!strncmp(ref, "#/$defs/", 8))
    target = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "$defs"),
                                              ref + 8);
  else if (!strncmp(ref, "#/definitions/", 14))
    target = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(c->root, "definitions"), ref + 14);
  else
    return sfail(c, IR_UNSUPPORTED,
                 "JSON Schema: $ref '%.80s' (only #/$defs/.. and "
                 "#/definitions/.. are supported)",
                 ref);
  if (!target) return sfail(c, IR_INVALID_ARG, "JSON Schema: $ref '%.80s' not found", ref);
  for (int i = 0; i < c->n_refs; i++)
    if (c->refs[i].schema == target) return c->refs[i].rule;
  if (c->n_refs == (int)(sizeof c->refs / sizeof c->refs[0]))
    return sfail(c, IR_UNSUPPORTED, "JSON Schema: too many $ref targets");
  int r = new_rule(c);
  c->refs[c->n_refs].schema = target, c->refs[c->n_refs++].rule = r;
  int body = gen(c, target, depth + 1);
  if (body >= 0) put(&c->out, "r%d ::= r%d\n", r, body);
  return body < 0 ? -1 : r;
}

static int gen_type(sconv *c, const cJSON *s, const char *t, int depth) {
  if (!strcmp(t, "string")) return gen_string(c, s);
  if (!strcmp(t, "object")) return gen_object(c, s, depth);
  if (!strcmp(t, "array")) return gen_array(c, s, depth);
  if (!strcmp(t, "integer")) return gen_integer(c, s);
  if (!strcmp(t, "number") && has_bounds(s))
    return sfail(c, IR_UNSUPPORTED,
                 "JSON Schema: 'minimum' / 'maximum' on a 'number' is not "
                 "supported (on an 'integer' it is)");
  const char *simple[] = {"number", "boolean", "null"};
  for (int i = 0; i < 3; i++)
    if (!strcmp(t, simple[i])) return text_rule(c, simple[i]);
  return sfail(c, IR_INVALID_ARG, "JSON Schema: unknown type '%.40s'", t);
}

static int gen_list(sconv *c, const cJSON *list, const char *key, int depth) {
  int n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
  if (n == 0) return sfail(c, IR_INVALID_ARG, "JSON Schema: '%s' must be a non-empty list", key);
  int *alts = ir_malloc((size_t)n * sizeof *alts), k = 0;
  if (!alts) return sfail(c, IR_OOM, "out of memory");
  for (const cJSON *v = list->child; v && !c->failed; v = v->next) alts[k++] = gen(c, v, depth + 1);
  int r = c->failed ? -1 : alternatives(c, alts, k);
  ir_free(alts);
  return r;
}

static int gen(sconv *c, const cJSON *s, int depth) {
  if (c->failed) return -1;
  if (depth > 64) return sfail(c, IR_UNSUPPORTED, "JSON Schema: nested over 64 levels");
  if (cJSON_IsTrue(s)) return text_rule(c, "value");
  if (!cJSON_IsObject(s))
    return sfail(c, IR_INVALID_ARG, "JSON Schema: a schema must be an object or true");
  if (!check_keywords(c, s)) return -1;
  const cJSON *v;
  if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
    if (!cJSON_IsString(v)) return sfail(c, IR_INVALID_ARG, "JSON Schema: '$ref' must be a string");
    return gen_ref(c, v->valuestring, depth);
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) return gen_enum(c, v, true);
  if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
    if (!cJSON_IsArray(v)) return sfail(c, IR_INVALID_ARG, "JSON Schema: 'enum' must be a list");
    return gen_enum(c, v, false);
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) return gen_list(c, v, "anyOf", depth);
  if ((v = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) return gen_list(c, v, "oneOf", depth);
  if ((v = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 1)
      return sfail(c, IR_UNSUPPORTED, "JSON Schema: 'allOf' of more than one schema");
    return gen(c, v->child, depth + 1);
  }
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
  if (cJSON_IsString(t)) return gen_type(c, s, t->valuestring, depth);
  if (cJSON_IsArray(t)) {
    int n = cJSON_GetArraySize(t), alts[8], k = 0;
    if (n < 1 || n > 8) return sfail(c, IR_INVALID_ARG, "JSON Schema: 'type' lists 1 to 8 types");
    for (const cJSON *x = t->child; x && !c->failed; x = x->next)
      alts[k++] = cJSON_IsString(x) ? gen_type(c, s, x->valuestring, depth)
                                    : sfail(c, IR_INVALID_ARG, "JSON Schema: bad 'type'");
    return c->failed ? -1 : alternatives(c, alts, k);
  }
  if (t) return sfail(c, IR_INVALID_ARG, "JSON Schema: 'type' must be a string or a list");
  if (cJSON_GetObjectItemCaseSensitive(s, "properties") ||
      cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
    return gen_object(c, s, depth);
  if (cJSON_GetObjectItemCaseSensitive(s, "items") ||
      cJSON_GetObjectItemCaseSensitive(s, "prefixItems"))
    return gen_array(c, s, depth);
  if (cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
      cJSON_GetObjectItemCaseSensitive(s, "maxLength") ||
      cJSON_GetObjectItemCaseSensitive(s, "pattern"))
    return gen_string(c, s);
  if (has_bounds(s))
    return sfail(c, IR_UNSUPPORTED,
                 "JSON Schema: 'minimum' / 'maximum' need \"type\": "
                 "\"integer\"");
  return text_rule(c, "value");
}

static ir_status finish(sconv *c, int r, char **out) {
  if (!c->failed) put(&c->out, "root ::= r%d\n", r);
  if (!c->failed && c->out.oom) sfail(c, IR_OOM, "out of memory");
  if (c->failed) {
    ir_free(c->out.s);
    return c->err ? c->err->status : IR_INVALID_ARG;
  }
  *out = c->out.s;
  return IR_OK;
}

ir_status gram_json(const char *schema, char **out, ir_diag *err) {
  *out = NULL;
  sconv c = {.err = err};
  put(&c.out, "%s", JSON_BASE);
  if (!schema) return finish(&c, text_rule(&c, "object"), out);
  unsigned long fails = ir_alloc_failures();
  cJSON *root = cJSON_Parse(schema);
  if (!root && ir_alloc_failed_since(fails)) {
    sfail(&c, IR_OOM, "out of memory");
    return finish(&c, -1, out);
  }
  if (!root) {
    sfail(&c, IR_INVALID_ARG, "JSON Schema: not valid JSON");
    return finish(&c, -1, out);
  }
  c.root = root;
  int r = gen(&c, root, 0);
  cJSON_Delete(root);
  return finish(&c, r, out);
}

ir_status gram_choice(const char *const *choices, int n, char **out, ir_diag *err) {
  *out = NULL;
  sconv c = {.err = err};
  if (n <= 0) sfail(&c, IR_INVALID_ARG, "a choice needs at least one string");
  int r = new_rule(&c);
  put(&c.out, "r%d ::=", r);
  for (int i = 0; i < n && !c.failed; i++) {
    if (!choices[i] || !choices[i][0]) sfail(&c, IR_INVALID_ARG, "choice %d is empty", i);
    put(&c.out, "%s ", i ? " |" : "");
    put_literal(&c.out, choices[i] ? choices[i] : "");
  }
  put(&c.out, "\n");
  return finish(&c, r, out);
}
