/* test_grammar: the grammar engine against external oracles. fixtures/grammar/cases.json
 * (tools/gen_grammar_fixtures.py) labels strings with Python's re.fullmatch, json.loads and
 * jsonschema for GBNF grammars, regular expressions, JSON mode and JSON Schemas (with
 * patterns); each string must be accepted
 * exactly when its label says, fed whole and byte by byte. Token masks over GPT-2's real
 * vocabulary must agree with checking every token alone. GBNF errors must name the
 * problem. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "tcheck.h"

static char *read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

static gram *compile(const char *src) {
  gram *g = NULL;
  ir_diag err = {0};
  ir_status st = gram_compile(src, &g, &err);
  CHECKF(st == IR_OK, "%s\n%s", err.msg, src);
  return g;
}

/* Whole, then byte by byte: every prefix of an accepted string must be taken. */
static bool accepts(const gram *g, const char *s, bool *prefix_ok) {
  gram_state *st;
  *prefix_ok = false;
  if (gram_state_create(g, &st, NULL) != IR_OK) return false;
  bool whole = gram_state_advance(st, (const uint8_t *)s, strlen(s)) && gram_state_accepting(st);
  gram_state_destroy(st);
  gram_state_create(g, &st, NULL);
  size_t n = strlen(s), i = 0;
  while (i < n && gram_state_advance(st, (const uint8_t *)s + i, 1)) i++;
  *prefix_ok = i == n && gram_state_accepting(st) == whole;
  if (!whole) *prefix_ok = true; /* a rejected string may fail anywhere */
  gram_state_destroy(st);
  return whole;
}

static void check_group(const cJSON *grp) {
  const cJSON *v;
  char *src = NULL;
  irt_error err = {0};
  if ((v = cJSON_GetObjectItem(grp, "gbnf"))) {
    src = strdup(v->valuestring);
  } else if ((v = cJSON_GetObjectItem(grp, "regex"))) {
    irt_status st = irt_grammar_regex(v->valuestring, &src, &err);
    CHECKF(st == IRT_OK, "%s: %s", v->valuestring, err.msg);
  } else if ((v = cJSON_GetObjectItem(grp, "schema"))) {
    char *schema = cJSON_PrintUnformatted(v);
    irt_status st = irt_grammar_json(schema, &src, &err);
    CHECKF(st == IRT_OK, "%s: %s", schema, err.msg);
    free(schema);
  } else {
    CHECK(irt_grammar_json(NULL, &src, &err) == IRT_OK);
  }
  gram *g = src ? compile(src) : NULL;
  const char *oracle = cJSON_GetObjectItem(grp, "oracle")->valuestring;
  int n = 0, wrong = 0;
  for (const cJSON *c = cJSON_GetObjectItem(grp, "cases")->child; c && g; c = c->next, n++) {
    const char *s = cJSON_GetArrayItem(c, 0)->valuestring;
    bool want = cJSON_IsTrue(cJSON_GetArrayItem(c, 1)), prefix_ok = false;
    bool got = accepts(g, s, &prefix_ok);
    if (got != want || !prefix_ok) {
      if (wrong++ < 5)
        fprintf(stderr, "%s: '%s': grammar says %d, oracle %d (prefixes ok %d)\n", oracle, s, got,
                want, prefix_ok);
    }
  }
  CHECKF(wrong == 0, "%s: %d of %d strings disagree", oracle, wrong, n);
  CHECK(n > 100);
  gram_destroy(g);
  free(src);
}

static void test_oracle_cases(void) {
  char *text = read_all(FIXTURES_DIR "/grammar/cases.json");
  CHECK(text != NULL);
  cJSON *root = text ? cJSON_Parse(text) : NULL;
  CHECK(root != NULL);
  int groups = 0;
  for (const cJSON *g = root ? cJSON_GetObjectItem(root, "groups")->child : NULL; g; g = g->next)
    check_group(g), groups++;
  CHECK(groups >= 19);
  cJSON_Delete(root);
  free(text);
}

static void expect_error(const char *src, const char *needle) {
  gram *g = NULL;
  ir_diag err = {0};
  ir_status st = gram_compile(src, &g, &err);
  CHECKF(st == IR_INVALID_ARG && strstr(err.msg, needle), "'%s': %s (want '%s')", src, err.msg,
         needle);
  CHECK(g == NULL);
}

static void test_errors(void) {
  expect_error("root ::= foo", "rule 'foo' is used but not defined");
  expect_error("rot ::= \"a\"", "no 'root' rule");
  expect_error("root ::= \"a", "line 1: unterminated string literal");
  expect_error("root ::= x\nx ::= x \"a\" | \"b\"", "rule 'x' is left-recursive");
  expect_error("root ::= y* \"a\"\ny ::= \"b\"?", "left-recursive");
  expect_error("root ::= \"a\"\n\nroot ::= \"b\"", "line 3: rule 'root' is defined twice");
  expect_error("root ::= [z-a]", "out of order");
  expect_error("root ::= \"a\"{3,1}", "max < min");
  expect_error("root ::= * \"a\"", "follows nothing");
  expect_error("root ::= \"\\q\"", "unknown escape");
  expect_error("root ::= (\"a\"", "expected ')'");
  expect_error("root = \"a\"", "expected '::='");
  const char *bad[][2] = {
      {"{\"type\": \"string\", \"pattern\": \"(?!a)\"}", "lookaround"},
      {"{\"type\": \"number\", \"minimum\": 3}", "on a 'number' is not supported"},
      {"{\"minimum\": 3}", "need \"type\": \"integer\""},
      {"{\"type\": \"integer\", \"minimum\": 5, \"exclusiveMaximum\": 5}", "no integer lies"},
      {"{\"type\": \"integer\", \"maximum\": 1e20}", "at most 16 digits"},
      {"{\"type\": \"integer\", \"minimum\": \"3\"}", "must be a number"},
      {"{\"$ref\": \"#/$defs/nope\"}", "not found"},
      {"{\"type\": \"object\", \"required\": [\"a\"]}", "required 'a'"},
      {"[1,", "not valid JSON"},
      {"{\"enum\": []}", "empty"},
  };
  const char *bad_rx[][2] = {{"(a)\\1", "backreferences"}, {"a(?=b)", "lookaround"},
                             {"\\bword", "word boundary"}, {"a**", "follows a quantifier"},
                             {"(ab", "missing ')'"},       {"ab)", "unbalanced"},
                             {"[b-a]", "out of order"},    {"a^b", "only at the ends"}};
  for (size_t i = 0; i < sizeof bad_rx / sizeof bad_rx[0]; i++) {
    char *out = NULL;
    irt_error err = {0};
    irt_status st = irt_grammar_regex(bad_rx[i][0], &out, &err);
    CHECKF(st != IRT_OK && strstr(err.msg, bad_rx[i][1]) && !out, "%s: %s", bad_rx[i][0], err.msg);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *out = NULL;
    irt_error err = {0};
    irt_status st = irt_grammar_json(bad[i][0], &out, &err);
    CHECKF(st != IRT_OK && strstr(err.msg, bad[i][1]) && !out, "%s: %s", bad[i][0], err.msg);
  }
}

/* A choice of strings, and a state that stops once no character can follow. */
static void test_choice(void) {
  const char *ch[] = {"yes", "no", "y\"\\es"};
  char *src = NULL;
  CHECK(irt_grammar_choice(ch, 3, &src, NULL) == IRT_OK);
  gram *g = src ? compile(src) : NULL;
  for (int i = 0; i < 3 && g; i++) {
    gram_state *s;
    gram_state_create(g, &s, NULL);
    CHECK(gram_state_advance(s, (const uint8_t *)ch[i], strlen(ch[i])));
    CHECK(gram_state_accepting(s) && !gram_state_can_continue(s));
    CHECK(!gram_state_advance(s, (const uint8_t *)"s", 1));
    gram_state_destroy(s);
  }
  gram_destroy(g);
  free(src);
}

static bool takes(const char *src, const char *bytes) {
  gram *g = compile(src);
  gram_state *s = NULL;
  bool ok = g && gram_state_create(g, &s, NULL) == IR_OK &&
            gram_state_advance(s, (const uint8_t *)bytes, strlen(bytes));
  gram_state_destroy(s);
  gram_destroy(g);
  return ok;
}

/* Bytes that begin no valid UTF-8 spelling of an allowed character are refused as soon as
 * they come: overlong forms, surrogates, past U+10FFFF, stray continuation bytes. */
static void test_utf8(void) {
  CHECK(!takes("root ::= \"t\"", "\xE0")); /* E0 needs A0..BF next: >= U+0800 */
  CHECK(!takes("root ::= \"t\"", "\xF0"));
  CHECK(!takes("root ::= \"t\"", "\xC1\xB4")); /* overlong 't' */
  CHECK(!takes("root ::= .", "\xE0\x81\xB4")); /* overlong */
  CHECK(!takes("root ::= .", "\xED\xA0\x80")); /* a surrogate */
  CHECK(!takes("root ::= .", "\xF4\x90\x80\x80"));
  CHECK(!takes("root ::= .", "\x80"));
  CHECK(takes("root ::= .", "\xF4\x8F\xBF\xBF")); /* U+10FFFF */
  CHECK(takes("root ::= [\\u0800-\\uFFFF]", "\xE0"));
  CHECK(takes("root ::= [\\u0800-\\uFFFF]", "\xE0\xA0"));
  CHECK(!takes("root ::= [\\u0800-\\u0900]", "\xE1"));
  CHECK(takes("root ::= [^a]", "\xF0\x9F"));
  gram *g = compile("root ::= .*"); /* NUL never, as in llama.cpp */
  gram_state *s = NULL;
  CHECK(g && gram_state_create(g, &s, NULL) == IR_OK);
  CHECK(s && gram_state_advance(s, (const uint8_t *)"a", 1));
  CHECK(s && !gram_state_advance(s, (const uint8_t *)"\0", 1));
  gram_state_destroy(s);
  gram_destroy(g);
}

/* Masks from the byte-order walk agree with asking about each token alone, at states
 * inside strings, numbers, between tokens and with a character split over tokens. */
static void test_masks(void) {
  irt_tokenizer *t = NULL;
  irt_error err;
  if (irt_tokenizer_open_json(FIXTURES_DIR "/tokenizers/gpt2-real/tokenizer.json", NULL, &t,
                              &err) != IRT_OK) {
    CHECKF(0, "%s", err.msg);
    return;
  }
  gram_trie *trie = gram_trie_create(t);
  char *src = NULL;
  CHECK(irt_grammar_json("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                         "\"n\":{\"type\":\"number\"},\"k\":{\"enum\":[\"\\u4e2d\\u6587\",true]}},"
                         "\"required\":[\"name\",\"n\",\"k\"]}",
                         &src, &err) == IRT_OK);
  gram *g = compile(src);
  const char *prefixes[] = {"",
                            "{",
                            "{\"na",
                            "{\"name\": \"x y",
                            "{\"name\":\"\",\"n\": 1",
                            "{\"name\":\"\",\"n\":-0.5e",
                            "{\"name\":\"\",\"n\":2,\"k\":\"\xe4",
                            "{\"name\":\"\",\"n\":2,\"k\":true"};
  int32_t V = irt_tokenizer_vocab_size(t);
  uint8_t *mask = malloc((size_t)V);
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes && g && trie; i++) {
    gram_state *s;
    gram_state_create(g, &s, NULL);
    CHECKF(gram_state_advance(s, (const uint8_t *)prefixes[i], strlen(prefixes[i])), "%s",
           prefixes[i]);
    int64_t n = gram_mask(s, trie, mask), agree = 0, count = 0;
    for (int32_t id = 0; id < V; id++) {
      agree += mask[id] == gram_allows(s, trie, id);
      count += mask[id];
    }
    CHECKF(agree == V && count == n && n > 0, "prefix '%s': %lld of %d agree, %lld allowed",
           prefixes[i], (long long)agree, V, (long long)n);
    gram_state_destroy(s);
  }
  free(mask);
  gram_destroy(g);
  free(src);
  gram_trie_destroy(trie);
  irt_tokenizer_destroy(t);
}

/* Inputs the fuzzer (tests/fuzz/fuzz_grammar.c) found: an escape at the very end of the
 * text (read past its end), a control character in a JSON Schema pattern (read past a
 * table), an empty group repeated (exponential expansion): each refused or compiled,
 * quickly, without touching memory it should not. */
static void test_fuzz_finds(void) {
  expect_error("root ::= \"a\" (2b\" | [c-:y\x02(\"\"\"?\"ll\\", "unfinished escape");
  expect_error("root ::= [ab\\", "unfinished escape");
  char *out = NULL;
  irt_error err = {0};
  CHECK(irt_grammar_json("{\"type\": \"string\", \"pattern\": \"^[\\u0015a-z]{2}$\"}", &out,
                         &err) == IRT_OK);
  free(out), out = NULL;
  CHECK(irt_grammar_regex("(|){87}", &out, &err) == IRT_OK);
  CHECKF(irt_grammar_check(out, &err) == IRT_INVALID_ARG && strstr(err.msg, "too ambiguous"), "%s",
         err.msg);
  free(out);
}

/* Grammars deep or ambiguous enough to exhaust a server thread's stack or time are refused
 * (at compile time) or stop taking characters, never crash. */
static void test_limits(void) {
  enum { DEEP = 5000 };
  char *src = malloc(32 * DEEP + 64), *p = src;
  p += sprintf(p, "root ::= ");
  for (int i = 0; i < DEEP; i++) *p++ = '(';
  p += sprintf(p, "\"a\"");
  for (int i = 0; i < DEEP; i++) *p++ = ')';
  *p = 0;
  expect_error(src, "parentheses nested over 1000 deep");
  p = src + sprintf(src, "root ::= r0\n");
  for (int i = 0; i < DEEP; i++) p += sprintf(p, "r%d ::= r%d \"x\"\n", i, i + 1);
  sprintf(p, "r%d ::= \"y\"\n", DEEP);
  expect_error(src, "rules nested over 1000 deep at the start of an alternative");
  free(src);
  /* Every 'a' may or may not wait for a 'b': one parse stack more per character, until the
   * state's bound ends the text (rather than each step costing more and more). */
  gram *g = compile("root ::= s\ns ::= \"a\" s \"b\" | \"a\" s | \"\"");
  gram_state *st = NULL;
  ir_diag err = {0};
  CHECK(gram_state_create(g, &st, &err) == IR_OK);
  int taken = 0;
  while (st && taken < 10000 && gram_state_advance(st, (const uint8_t *)"a", 1)) taken++;
  CHECKF(taken >= 100 && taken < 10000, "%d characters taken", taken);
  gram_state_destroy(st);
  gram_destroy(g);
}

int main(void) {
  test_errors();
  test_limits();
  test_fuzz_finds();
  test_choice();
  test_utf8();
  test_oracle_cases();
  test_masks();
  return tcheck_done("grammar");
}
