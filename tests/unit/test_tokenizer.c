/* test_tokenizer: the runtime tokenizer against HF tokenizers' ids for a multilingual
 * corpus (fixtures from tools/gen_tokenizer_fixtures.py), decode and streaming decode,
 * serialization round trips and damage, invalid UTF-8, unsupported tokenizer.json. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir_file.h"
#include "tcheck.h"
#include "tokenizer.h"

#define TOKDIR FIXTURES_DIR "/tokenizers"

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf) buf[n] = '\0';
  if (len) *len = (size_t)n;
  return buf;
}

static bool file_exists(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f) fclose(f);
  return f != NULL;
}

/* Encodes into a malloc'd array (retrying with the reported size). */
static int32_t *encode(const irt_tokenizer *t, const char *s, size_t n, bool add, bool parse,
                       size_t *out_n) {
  size_t cap = 4, got = 0;
  int32_t *ids = malloc(cap * sizeof *ids);
  ir_diag d = {0};
  if (tok_encode(t, s, n, add, parse, ids, cap, &got, &d) != IR_OK) {
    fprintf(stderr, "encode failed: %s\n", d.msg);
    free(ids);
    *out_n = 0;
    return NULL;
  }
  if (got > cap) {
    free(ids);
    ids = malloc(got * sizeof *ids);
    CHECK(tok_encode(t, s, n, add, parse, ids, got, &got, &d) == IR_OK);
  }
  *out_n = got;
  return ids;
}

static char *decode(const irt_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len) {
  ir_diag d = {0};
  CHECK(tok_decode(t, ids, n, skip, NULL, 0, len, &d) == IR_OK);
  char *buf = malloc(*len + 1);
  size_t len2 = 0;
  CHECK(tok_decode(t, ids, n, skip, buf, *len, &len2, &d) == IR_OK && len2 == *len);
  buf[*len] = '\0';
  return buf;
}

/* Whether ids equal the JSON array; prints the first difference. */
static bool same_ids(const char *what, int idx, const int32_t *ids, size_t n, const cJSON *exp) {
  size_t m = (size_t)cJSON_GetArraySize(exp), i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, exp) {
    if (i >= n || ids[i] != e->valueint) break;
    i++;
  }
  if (i == m && n == m) return true;
  fprintf(stderr, "%s %d: %zu ids, expected %zu; first difference at %zu: got %d, want %d\n", what,
          idx, n, m, i, i < n ? ids[i] : -1,
          i < m ? cJSON_GetArrayItem(exp, (int)i)->valueint : -1);
  return false;
}

/* Whether s is valid UTF-8 made of whole characters. */
static bool whole_utf8(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    int len = s[i] < 0x80   ? 1
              : s[i] < 0xC2 ? 0
              : s[i] < 0xE0 ? 2
              : s[i] < 0xF0 ? 3
              : s[i] < 0xF5 ? 4
                            : 0;
    if (!len || i + (size_t)len > n) return false;
    for (int k = 1; k < len; k++)
      if ((s[i + k] & 0xC0) != 0x80) return false;
    i += (size_t)len;
  }
  return true;
}

/* Streams ids one by one; checks every chunk is whole characters and the total equals want. */
static bool stream_matches(const irt_tokenizer *t, const int32_t *ids, size_t n, const char *want,
                           size_t want_len) {
  tok_stream s;
  size_t cap = tok_piece_max(t), len = 0;
  char *chunk = malloc(cap), *all = malloc(want_len + 64 + n * cap);
  bool ok = true;
  tok_stream_init(&s, t, true);
  for (size_t i = 0; i < n; i++) {
    size_t k = tok_stream_push(&s, ids[i], chunk, cap);
    ok &= k <= cap && whole_utf8((unsigned char *)chunk, k);
    memcpy(all + len, chunk, k);
    len += k;
  }
  len += tok_stream_finish(&s, all + len, 3);
  ok &= len == want_len && memcmp(all, want, len) == 0;
  free(chunk);
  free(all);
  return ok;
}

/* ---- corpus ------------------------------------------------------------------------ */

typedef struct corpus {
  char *text;
  size_t len;
  int n;
  size_t start[1024], end[1024];
} corpus;

static bool load_corpus(corpus *c) {
  c->text = read_file(TOKDIR "/corpus.txt", &c->len);
  if (!c->text) return false;
  c->n = 0;
  for (size_t i = 0, s = 0; i < c->len && c->n < 1024; i++) {
    if (c->text[i] == '\n' || i + 1 == c->len) {
      c->start[c->n] = s;
      c->end[c->n++] = i + 1;
      s = i + 1;
    }
  }
  return true;
}

/* ---- one fixture ------------------------------------------------------------------- */

static void check_lines(const char *name, const irt_tokenizer *t, const corpus *c,
                        const cJSON *exp) {
  const cJSON *lines = cJSON_GetObjectItem(exp, "lines");
  const cJSON *decs = cJSON_GetObjectItem(exp, "decode");
  int bad_ids = 0, bad_dec = 0, bad_stream = 0;
  CHECKF(cJSON_GetArraySize(lines) == c->n, "%s: %d lines, expected %d", name, c->n,
         cJSON_GetArraySize(lines));
  for (int i = 0; i < c->n && i < cJSON_GetArraySize(lines); i++) {
    const char *s = c->text + c->start[i];
    size_t n = c->end[i] - c->start[i], nid, dlen;
    int32_t *ids = encode(t, s, n, true, true, &nid);
    if (!same_ids(name, i, ids, nid, cJSON_GetArrayItem(lines, i))) bad_ids++;
    char key[16];
    snprintf(key, sizeof key, "%d", i);
    const cJSON *hf = cJSON_GetObjectItem(decs, key);
    const char *want = cJSON_IsString(hf) ? hf->valuestring : NULL;
    size_t want_len = want ? strlen(want) : n;
    char *text = decode(t, ids, nid, true, &dlen);
    if (dlen != want_len || memcmp(text, want ? want : s, dlen) != 0) {
      if (bad_dec++ < 3) fprintf(stderr, "%s line %d decodes to '%s'\n", name, i, text);
    }
    if (!stream_matches(t, ids, nid, text, dlen)) bad_stream++;
    free(text);
    free(ids);
  }
  CHECKF(bad_ids == 0, "%s: %d lines differ from HF", name, bad_ids);
  CHECKF(bad_dec == 0, "%s: %d lines decode differently from HF", name, bad_dec);
  CHECKF(bad_stream == 0, "%s: %d lines stream differently", name, bad_stream);
}

/* HF's decode of an extra text's expected ids, where the fixture has it ("decode" with
 * skip_special_tokens, "decode_all" without): decode and streaming decode must equal it.
 * Returns the number of differences. */
static int check_extra_decode(const char *name, const irt_tokenizer *t, const cJSON *e, int idx) {
  const cJSON *exp_ids = cJSON_GetObjectItem(e, "ids"), *v;
  int32_t ids[512];
  size_t n = 0;
  int bad = 0;
  cJSON_ArrayForEach(v, exp_ids) if (n < 512) ids[n++] = v->valueint;
  static const char *const keys[2] = {"decode", "decode_all"};
  for (int k = 0; k < 2; k++) {
    const cJSON *want = cJSON_GetObjectItem(e, keys[k]);
    if (!cJSON_IsString(want)) continue;
    size_t len, wlen = strlen(want->valuestring);
    char *text = decode(t, ids, n, k == 0, &len);
    tok_stream s;
    size_t cap = tok_piece_max(t), got = 0;
    char *chunk = malloc(cap), *all = malloc(wlen + 64 + n * cap);
    tok_stream_init(&s, t, k == 0);
    for (size_t i = 0; i < n; i++) {
      size_t m = tok_stream_push(&s, ids[i], chunk, cap);
      memcpy(all + got, chunk, m);
      got += m;
    }
    got += tok_stream_finish(&s, all + got, 3);
    if (len != wlen || memcmp(text, want->valuestring, len) != 0 || got != wlen ||
        memcmp(all, want->valuestring, got) != 0) {
      fprintf(stderr, "%s: extra text %d %s: '%s'\n", name, idx, keys[k], text);
      bad++;
    }
    free(chunk);
    free(all);
    free(text);
  }
  return bad;
}

static void check_extra(const char *name, const irt_tokenizer *t, const cJSON *exp) {
  const cJSON *e;
  int i = 0, bad = 0, bad_dec = 0;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(exp, "extra")) {
    const char *s = cJSON_GetObjectItem(e, "text")->valuestring;
    static const char *const keys[3] = {"ids", "ids_plain", "ids_noparse"};
    const bool add[3] = {true, false, true}, parse[3] = {true, true, false};
    for (int k = 0; k < 3; k++) {
      size_t n;
      int32_t *ids = encode(t, s, strlen(s), add[k], parse[k], &n);
      if (!same_ids(keys[k], i, ids, n, cJSON_GetObjectItem(e, keys[k]))) {
        fprintf(stderr, "%s: extra text %d ('%.60s') %s\n", name, i, s, keys[k]);
        bad++;
      }
      free(ids);
    }
    bad_dec += check_extra_decode(name, t, e, i);
    i++;
  }
  CHECKF(bad == 0, "%s: %d extra encodings differ from HF", name, bad);
  CHECKF(bad_dec == 0, "%s: %d extra decodes differ from HF", name, bad_dec);
}

static void check_roundtrip(const char *name, const irt_tokenizer *t, const corpus *c,
                            const cJSON *exp) {
  uint8_t *buf = NULL;
  size_t len = 0, n1, n2;
  ir_diag d = {0};
  irt_tokenizer *t2 = NULL;
  CHECKF(tok_serialize(t, &buf, &len, &d) == IR_OK, "%s: %s", name, d.msg);
  CHECKF(tok_deserialize(buf, len, &t2, &d) == IR_OK, "%s: %s", name, d.msg);
  int32_t *a = encode(t, c->text, c->len, true, true, &n1);
  CHECKF(same_ids(name, -1, a, n1, cJSON_GetObjectItem(exp, "whole")), "%s: whole corpus", name);
  if (t2) {
    int32_t *b = encode(t2, c->text, c->len, true, true, &n2);
    CHECKF(n1 == n2 && memcmp(a, b, n1 * sizeof *a) == 0, "%s: round trip encodes differ", name);
    CHECK(tok_vocab_size(t2) == tok_vocab_size(t) && tok_bos(t2) == tok_bos(t) &&
          tok_eos(t2) == tok_eos(t) && tok_get_pre(t2) == tok_get_pre(t));
    const char *ct = tok_chat_template(t), *ct2 = tok_chat_template(t2);
    CHECK((!ct && !ct2) || (ct && ct2 && strcmp(ct, ct2) == 0));
    uint8_t *buf2 = NULL;
    size_t len2 = 0;
    CHECK(tok_serialize(t2, &buf2, &len2, &d) == IR_OK && len2 == len &&
          memcmp(buf, buf2, len) == 0);
    free(buf2);
    free(b);
  }
  free(a);
  free(buf);
  tok_destroy(t2);
}

static irt_tokenizer *load_fixture(const char *name) {
  char json[512], cfg[512];
  snprintf(json, sizeof json, TOKDIR "/%s/tokenizer.json", name);
  snprintf(cfg, sizeof cfg, TOKDIR "/%s/tokenizer_config.json", name);
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  ir_status st = tok_load_hf(json, file_exists(cfg) ? cfg : NULL, &t, &d);
  CHECKF(st == IR_OK, "%s: %s", name, d.msg);
  return t;
}

static void check_fixture(const char *name, const corpus *c) {
  char path[512];
  snprintf(path, sizeof path, TOKDIR "/%s/expected.json", name);
  char *js = read_file(path, NULL);
  if (!js) {
    CHECKF(strcmp(name, "gpt2-real") == 0, "%s: no expected.json", name);
    return;
  }
  cJSON *exp = cJSON_Parse(js);
  irt_tokenizer *t = load_fixture(name);
  if (t && exp) {
    check_lines(name, t, c, exp);
    check_extra(name, t, exp);
    check_roundtrip(name, t, c, exp);
  }
  tok_destroy(t);
  cJSON_Delete(exp);
  free(js);
}

/* ---- properties of particular fixtures --------------------------------------------- */

static void check_config(void) {
  irt_tokenizer *t = load_fixture("llama3");
  if (t) {
    int32_t eot = tok_find(t, "<|eot_id|>"), end = tok_find(t, "<|end_of_text|>");
    CHECK(tok_eos(t) == eot && eot >= 0);
    CHECK(tok_is_eog(t, end) && tok_is_eog(t, eot) && !tok_is_eog(t, 100));
    CHECK(tok_bos(t) == tok_find(t, "<|begin_of_text|>"));
    CHECK(tok_is_special(t, eot) && !tok_is_special(t, 300));
    CHECK(tok_get_model(t) == TOK_BPE_BYTE_LEVEL && tok_get_pre(t) == TOK_PRE_LLAMA3);
    CHECK(strcmp(tok_token(t, eot), "<|eot_id|>") == 0 && tok_token(t, -1) == NULL);
  }
  tok_destroy(t);
  t = load_fixture("qwen2");
  if (t) {
    const char *ct = tok_chat_template(t);
    CHECK(ct && strncmp(ct, "{% for m in messages %}", 23) == 0); /* "default" of the list */
    CHECK(tok_get_pre(t) == TOK_PRE_QWEN2 && tok_bos(t) == -1);
  }
  tok_destroy(t);
  t = load_fixture("smollm");
  CHECK(t && tok_get_pre(t) == TOK_PRE_SMOLLM);
  tok_destroy(t);
}

/* Writes text to TEST_TMP_DIR/name and returns the path (static buffer), or NULL. */
static const char *write_tmp(const char *name, const char *text) {
  static char path[512];
  snprintf(path, sizeof path, TEST_TMP_DIR "/%s", name);
  FILE *f = fopen(path, "w");
  if (!f) return NULL;
  fputs(text, f);
  fclose(f);
  return path;
}

/* The merges "a b" of a tokenizer.json rewritten as [a, b] pairs (tokenizers >= 0.20). */
static void merges_as_pairs(cJSON *j) {
  cJSON *merges = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "merges");
  for (cJSON *e = merges ? merges->child : NULL, *next; e; e = next) {
    next = e->next; /* e is freed when replaced */
    char *sp = cJSON_IsString(e) ? strchr(e->valuestring, ' ') : NULL;
    if (!sp) continue;
    *sp = '\0';
    const char *pair[2] = {e->valuestring, sp + 1};
    cJSON_ReplaceItemViaPointer(merges, e, cJSON_CreateStringArray(pair, 2));
  }
}

/* Gemma (spm-gemma): its special-token layout, and its tokenizer.json in both forms: with
 * Split(" ", MergedWithPrevious) (the fixture, as transformers' GemmaConverter writes it)
 * and with pre_tokenizer null (newer transformers; here also with the merges as pairs, as
 * newer tokenizers save them), the same ids, as the generator checked with HF. */
static void check_gemma(const corpus *c) {
  irt_tokenizer *t = load_fixture("spm-gemma");
  if (t) {
    int32_t sot = tok_find(t, "<start_of_turn>"), eot = tok_find(t, "<end_of_turn>");
    CHECK(tok_bos(t) == 2 && tok_eos(t) == 1 && tok_find(t, "<pad>") == 0 &&
          tok_find(t, "<unk>") == 3);
    CHECK(tok_is_special(t, sot) && tok_is_special(t, eot) && tok_is_eog(t, eot));
    CHECK(!tok_is_special(t, tok_find(t, "<unused0>")) &&
          !tok_is_special(t, tok_find(t, "<mask>")));
    CHECK(tok_get_model(t) == TOK_BPE_SPM && tok_get_pre(t) == TOK_PRE_NONE);
    size_t n;
    int32_t *ids = encode(t, "<start_of_turn>user\n", 20, true, true, &n);
    CHECK(ids && n >= 3 && ids[0] == 2 && ids[1] == sot);
    free(ids);
  }
  tok_destroy(t);
  char *js = read_file(TOKDIR "/spm-gemma/tokenizer.json", NULL);
  char *exp_js = read_file(TOKDIR "/spm-gemma/expected.json", NULL);
  cJSON *j = js ? cJSON_Parse(js) : NULL, *exp = exp_js ? cJSON_Parse(exp_js) : NULL;
  CHECK(j && exp);
  if (j && exp) {
    cJSON_ReplaceItemInObject(j, "pre_tokenizer", cJSON_CreateNull());
    merges_as_pairs(j);
    char *out = cJSON_PrintUnformatted(j);
    const char *path = write_tmp("tok_gemma_nopre.json", out);
    irt_tokenizer *t2 = NULL;
    ir_diag d = {0};
    CHECKF(path && tok_load_hf(path, NULL, &t2, &d) == IR_OK, "%s", d.msg);
    if (t2) {
      check_lines("spm-gemma (pre_tokenizer null)", t2, c, exp);
      check_extra("spm-gemma (pre_tokenizer null)", t2, exp);
    }
    tok_destroy(t2);
    free(out);
  }
  cJSON_Delete(j);
  cJSON_Delete(exp);
  free(js);
  free(exp_js);
}

/* add_eos_token in tokenizer_config.json overrides the post-processor. */
static void check_add_eos(void) {
  const char *cfg = TEST_TMP_DIR "/tok_cfg_eos.json";
  FILE *f = fopen(cfg, "w");
  if (!f) return;
  fputs("{\"add_bos_token\": false, \"add_eos_token\": true, \"eos_token\": {\"content\": "
        "\"</s>\"}, \"chat_template\": 7}",
        f);
  fclose(f);
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  CHECKF(tok_load_hf(TOKDIR "/spm/tokenizer.json", cfg, &t, &d) == IR_OK, "%s", d.msg);
  if (!t) return;
  size_t n;
  int32_t *ids = encode(t, "hi", 2, true, true, &n);
  CHECK(n >= 2 && ids[n - 1] == tok_find(t, "</s>") && ids[0] != tok_bos(t));
  CHECK(tok_chat_template(t) == NULL);
  free(ids);
  tok_destroy(t);
}

/* SPM byte pieces of one character come out as that character, once complete. */
static void check_spm_bytes(void) {
  irt_tokenizer *t = load_fixture("spm");
  if (!t) return;
  int32_t ids[4] = {tok_find(t, "<0xE2>"), tok_find(t, "<0x82>"), tok_find(t, "<0xAC>"),
                    tok_find(t, "<0x41>")};
  char buf[64];
  tok_stream s;
  tok_stream_init(&s, t, false);
  CHECK(ids[0] >= 0 && ids[1] >= 0 && ids[2] >= 0);
  CHECK(tok_stream_push(&s, ids[0], buf, sizeof buf) == 0);
  CHECK(tok_stream_push(&s, ids[1], buf, sizeof buf) == 0);
  CHECK(tok_stream_push(&s, ids[2], buf, sizeof buf) == 3 && memcmp(buf, "\xE2\x82\xAC", 3) == 0);
  /* an unfinished character is flushed as U+FFFD; a broken one too, then the next byte */
  CHECK(tok_stream_push(&s, ids[0], buf, sizeof buf) == 0);
  CHECK(tok_stream_finish(&s, buf, sizeof buf) == 3 && memcmp(buf, "\xEF\xBF\xBD", 3) == 0);
  size_t len;
  int32_t bad[3] = {ids[0], ids[3], ids[1]};
  ir_diag d = {0};
  CHECK(tok_decode(t, bad, 3, false, buf, sizeof buf, &len, &d) == IR_OK && len == 7 &&
        memcmp(buf,
               "\xEF\xBF\xBD"
               "A\xEF\xBF\xBD",
               7) == 0);
  int32_t oob = tok_vocab_size(t);
  CHECK(tok_decode(t, &oob, 1, false, buf, sizeof buf, &len, &d) == IR_INVALID_ARG);
  tok_destroy(t);
}

static void check_invalid_utf8(void) {
  irt_tokenizer *t = load_fixture("gpt2");
  if (!t) return;
  static const struct {
    const char *s;
    size_t len, off;
  } cases[] = {
      {"\x80", 1, 0},
      {"ab\xBF", 3, 2},
      {"a\xC0\xAF", 3, 1},
      {"\xC1\xBF", 2, 0},
      {"\xE0\x80\xAF", 3, 0},
      {"x\xED\xA0\x80", 4, 1},
      {"\xED\xBF\xBF", 3, 0},
      {"\xF4\x90\x80\x80", 4, 0},
      {"\xF5\x80\x80\x80", 4, 0},
      {"ok\xFF", 3, 2},
      {"\xC3", 1, 0},
      {"abc\xE2\x82", 5, 3},
      {"\xF0\x9F\x98", 3, 0},
      {"\xE2\x28\xA1", 3, 0},
      {"\xF0\x80\x80\x80", 4, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int32_t ids[16];
    size_t n = 99;
    ir_diag d = {0};
    ir_status st = tok_encode(t, cases[i].s, cases[i].len, true, true, ids, 16, &n, &d);
    char want[48];
    snprintf(want, sizeof want, "offset %zu ", cases[i].off);
    CHECKF(st == IR_INVALID_ARG && strstr(d.msg, want), "case %zu: %s", i, d.msg);
  }
  tok_destroy(t);
}

/* ---- a tokenizer from a spec, and damaged serializations -------------------------- */

/* A small byte-level tokenizer: the 256 byte characters, a few merges, two added tokens. */
static irt_tokenizer *small_tokenizer(void) {
  static const char *const merges[] = {"Ġ t", "h e", "Ġt he", "i n", "in g",    "Ġ a", "e r",
                                       "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ s"};
  enum { NM = sizeof merges / sizeof merges[0], NT = 256 + NM + 2 };
  char *store = malloc(NT * 16);
  const char *toks[NT];
  int32_t types[NT];
  int n = 0;
  for (int b = 0; b < 256; b++) { /* the GPT-2 alphabet, in byte order */
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    int k = 0;
    for (int i = 0; i < b; i++)
      k += !((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE);
    unsigned cp = printable ? (unsigned)b : 0x100u + (unsigned)k;
    char *o = store + 16 * n;
    if (cp < 0x80) o[0] = (char)cp, o[1] = 0;
    else o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), o[2] = 0;
    toks[n] = o, types[n++] = TOK_NORMAL;
  }
  for (int m = 0; m < NM; m++) {
    char *o = store + 16 * n;
    const char *sp = strchr(merges[m], ' ');
    snprintf(o, 16, "%.*s%s", (int)(sp - merges[m]), merges[m], sp + 1);
    toks[n] = o, types[n++] = TOK_NORMAL;
  }
  toks[n] = "<|end|>", types[n++] = TOK_CONTROL;
  toks[n] = "<sep>", types[n++] = TOK_USER_DEFINED;
  tok_spec spec = {.model = TOK_BPE_BYTE_LEVEL,
                   .pre = TOK_PRE_GPT2,
                   .n_tokens = n,
                   .tokens = toks,
                   .token_types = types,
                   .n_merges = NM,
                   .merges = merges,
                   .bos_id = -1,
                   .eos_id = n - 2,
                   .pad_id = -1,
                   .unk_id = -1,
                   .chat_template = "{{ x }}"};
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  CHECKF(tok_create(&spec, &t, &d) == IR_OK, "%s", d.msg);
  free(store);
  return t;
}

static void check_spec(void) {
  irt_tokenizer *t = small_tokenizer();
  if (!t) return;
  size_t n;
  const char *text = " the world<sep>thing<|end|>";
  int32_t *ids = encode(t, text, strlen(text), true, true, &n);
  int32_t want[] = {tok_find(t, "Ġthe"),   tok_find(t, "Ġworld"), tok_find(t, "<sep>"),
                    tok_find(t, "t"),      tok_find(t, "h"),      tok_find(t, "ing"),
                    tok_find(t, "<|end|>")};
  CHECK(n == 7 && memcmp(ids, want, sizeof want) == 0);
  free(ids);
  ids = encode(t, text, strlen(text), true, false, &n); /* <|end|> as text, <sep> still matched */
  CHECK(n > 7 && ids[2] == want[2] && ids[n - 1] == tok_find(t, ">"));
  size_t len;
  char *back = decode(t, ids, n, false, &len);
  CHECK(len == strlen(text) && memcmp(back, text, len) == 0);
  free(back);
  free(ids);
  tok_destroy(t);
  /* a merge whose result is missing is refused, naming it */
  const char *toks[] = {"a", "b"}, *merges[] = {"a b"};
  tok_spec bad = {.model = TOK_BPE_BYTE_LEVEL,
                  .n_tokens = 2,
                  .tokens = toks,
                  .n_merges = 1,
                  .merges = merges,
                  .bos_id = -1,
                  .eos_id = -1,
                  .pad_id = -1,
                  .unk_id = 5};
  ir_diag d = {0};
  CHECK(tok_create(&bad, &t, &d) == IR_INVALID_ARG && strstr(d.msg, "unk_id") && !t);
  bad.unk_id = -1;
  d = (ir_diag){0};
  CHECK(tok_create(&bad, &t, &d) == IR_INVALID_ARG && strstr(d.msg, "'a' 'b'") && !t);
}

/* Uses whatever a damaged message gives; it must never crash. Returns 1 if it was
 * accepted, 0 if refused with a message, -1 if refused without one (or with a leak). */
static int exercise(const uint8_t *buf, size_t len) {
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  if (tok_deserialize(buf, len, &t, &d) != IR_OK) return d.msg[0] != '\0' && !t ? 0 : -1;
  int32_t ids[64];
  char out[256];
  size_t n = 0, m;
  tok_encode(t, " the world<sep>x<|end|> 12 \xC3\xA9", 30, true, true, ids, 64, &n, &d);
  tok_decode(t, ids, n < 64 ? n : 64, false, out, sizeof out, &m, &d);
  tok_destroy(t);
  return 1;
}

static void check_damage(void) {
  irt_tokenizer *t = small_tokenizer();
  uint8_t *buf = NULL;
  size_t len = 0;
  ir_diag d = {0};
  if (!t || tok_serialize(t, &buf, &len, &d) != IR_OK) return;
  tok_destroy(t);
  int silent = 0, accepted = 0, tries = 0;
  for (size_t cut = 0; cut < len; cut++) {
    int r = exercise(buf, cut);
    silent += r<0, accepted += r> 0, tries++;
  }
  CHECKF(silent == 0, "%d truncations refused without a message", silent);
  CHECKF(accepted == 0, "%d truncations accepted", accepted);
  uint8_t *copy = malloc(len);
  static const uint8_t flips[] = {0x01, 0x80, 0xFF, 0x7F};
  for (size_t i = 0; i < len; i++) {
    for (size_t f = 0; f < sizeof flips; f++) {
      memcpy(copy, buf, len);
      copy[i] ^= flips[f];
      int r = exercise(copy, len);
      silent += r < 0, tries++;
    }
  }
  CHECKF(silent == 0, "%d of %d damaged messages refused without a message", silent, tries);
  CHECK(exercise(buf, len) == 1);
  ir_diag d2 = {0};
  CHECK(tok_deserialize(NULL, 0, &t, &d2) == IR_BAD_FORMAT);
  free(copy);
  free(buf);
}

/* The Llama 2 vocabulary as GGUF stores it (scores, no merges) against llama.cpp's
 * vectors: exercises the merges derived from scores. */
static void check_gguf_spm(void) {
  char *js = read_file(TOKDIR "/llama-spm-gguf/vocab.json", NULL);
  cJSON *v = js ? cJSON_Parse(js) : NULL;
  CHECK(v != NULL);
  if (!v) return;
  int n = cJSON_GetArraySize(cJSON_GetObjectItem(v, "tokens"));
  const char **toks = malloc((size_t)n * sizeof *toks);
  float *scores = malloc((size_t)n * sizeof *scores);
  int32_t *types = malloc((size_t)n * sizeof *types);
  const cJSON *tk = cJSON_GetObjectItem(v, "tokens")->child;
  const cJSON *sc = cJSON_GetObjectItem(v, "scores")->child;
  const cJSON *ty = cJSON_GetObjectItem(v, "types")->child;
  for (int i = 0; i < n && tk && sc && ty; i++, tk = tk->next, sc = sc->next, ty = ty->next) {
    toks[i] = tk->valuestring;
    scores[i] = (float)sc->valuedouble;
    types[i] = ty->valueint;
  }
  tok_spec spec = {.model = TOK_BPE_SPM,
                   .pre = TOK_PRE_NONE,
                   .n_tokens = n,
                   .tokens = toks,
                   .token_types = types,
                   .scores = scores,
                   .byte_fallback = true,
                   .fuse_unk = true,
                   .add_prefix_space = true,
                   .add_bos = true,
                   .bos_id = 1,
                   .eos_id = 2,
                   .pad_id = -1,
                   .unk_id = 0};
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  CHECKF(tok_create(&spec, &t, &d) == IR_OK, "%s", d.msg);
  const cJSON *e;
  int i = 0, bad = 0, bad_dec = 0;
  cJSON_ArrayForEach(e, cJSON_GetObjectItem(v, "tests")) {
    const char *s = cJSON_GetObjectItem(e, "text")->valuestring;
    size_t nid, len;
    int32_t *ids = t ? encode(t, s, strlen(s), false, true, &nid) : NULL;
    if (ids && !same_ids("llama-spm-gguf", i, ids, nid, cJSON_GetObjectItem(e, "ids"))) bad++;
    char *back = ids ? decode(t, ids, nid, true, &len) : NULL;
    if (back && (len != strlen(s) || memcmp(back, s, len) != 0)) bad_dec++;
    free(back);
    free(ids);
    i++;
  }
  CHECKF(i == 47 && bad == 0, "llama-spm-gguf: %d of %d vectors differ", bad, i);
  CHECKF(bad_dec == 0, "llama-spm-gguf: %d vectors do not decode back", bad_dec);
  tok_destroy(t);
  free(toks);
  free(scores);
  free(types);
  cJSON_Delete(v);
  free(js);
}

/* ---- unsupported tokenizer.json ----------------------------------------------------- */

static void expect_unsupported(const char *json, const char *needle) {
  const char *path = TEST_TMP_DIR "/tok_unsupported.json";
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(json, f);
  fclose(f);
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  ir_status st = tok_load_hf(path, NULL, &t, &d);
  CHECKF(st == IR_UNSUPPORTED && strstr(d.msg, needle) && !t, "want '%s', got %s: %s", needle,
         ir_status_name(st), d.msg);
}

static void check_unsupported(void) {
#define BPE_MODEL                                                                                  \
  "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"
#define BYTE_LEVEL "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false}"
  expect_unsupported("{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}", "Unigram");
  expect_unsupported("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", "WordPiece");
  expect_unsupported("{" BPE_MODEL ",\"normalizer\":{\"type\":\"Lowercase\"}," BYTE_LEVEL "}",
                     "Lowercase");
  expect_unsupported("{" BPE_MODEL ",\"pre_tokenizer\":{\"type\":\"Whitespace\"}}", "Whitespace");
  expect_unsupported("{" BPE_MODEL ",\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                     "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+|[^\\\\w\\\\s]+\"},"
                     "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
                     "\"use_regex\":false}]}}",
                     "\\w+|[^\\w\\s]+");
  expect_unsupported("{" BPE_MODEL "}", "without ByteLevel");
  /* Split(" ") is a no-op only after Replace(" ", U+2581), and only when not inverted */
#define SPACE_SPLIT(inv)                                                                           \
  "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},"                          \
  "\"behavior\":\"MergedWithPrevious\",\"invert\":" inv "}"
#define SPM_REPLACE                                                                                \
  "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"                           \
  "\"content\":\"\xE2\x96\x81\"}"
  expect_unsupported("{" BPE_MODEL "," SPACE_SPLIT("false") "}", "'Split'");
  expect_unsupported("{" BPE_MODEL "," SPM_REPLACE "," SPACE_SPLIT("true") "}", "'Split'");
  ir_diag d = {0};
  irt_tokenizer *t = NULL;
  CHECK(tok_load_hf(TEST_TMP_DIR "/no/such/tokenizer.json", NULL, &t, &d) == IR_IO);
}

/* A tokenizer_config.json without chat_template: chat_template.jinja beside tokenizer.json
 * is the template (transformers >= 4.51 saves it so); with one, the config's wins. In a
 * directory of its own: other tests build from TEST_TMP_DIR and look for a tokenizer.json
 * beside their sources. */
static void check_template_beside(void) {
  const char *dir = TEST_TMP_DIR "/tok_jinja";
  const char *tpl = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}";
  char tj[600], jp[600], cp[600];
  snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
  snprintf(jp, sizeof jp, "%s/chat_template.jinja", dir);
  snprintf(cp, sizeof cp, "%s/tokenizer_config.json", dir);
  size_t n = 0;
  char *json = read_file(TOKDIR "/spm-gemma/tokenizer.json", &n);
  mkdir(dir, 0755);
  FILE *f[3] = {fopen(tj, "w"), fopen(jp, "w"), fopen(cp, "w")};
  bool ok = json && f[0] && f[1] && f[2] && fwrite(json, 1, n, f[0]) == n &&
            fputs(tpl, f[1]) >= 0 && fputs("{\"chat_template\": \"own\"}", f[2]) >= 0;
  for (int i = 0; i < 3; i++)
    if (f[i]) fclose(f[i]);
  free(json);
  CHECK(ok);
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  CHECKF(ok && tok_load_hf(tj, NULL, &t, &d) == IR_OK, "%s", d.msg);
  CHECK(t && tok_chat_template(t) && !strcmp(tok_chat_template(t), tpl));
  tok_destroy(t);
  t = NULL;
  CHECKF(ok && tok_load_hf(tj, cp, &t, &d) == IR_OK, "%s", d.msg);
  CHECK(t && tok_chat_template(t) && !strcmp(tok_chat_template(t), "own"));
  tok_destroy(t);
}

/* The tok_blob fuzzer's finds (tests/fuzz/regressions/tok_blob): a plan's tokenizer that
 * must be refused, or load and encode, and never hang. */
static void check_fuzz_regressions(void) {
  const char *dir = FIXTURES_DIR "/../fuzz/regressions/tok_blob";
  DIR *dp = opendir(dir);
  CHECKF(dp != NULL, "cannot open %s", dir);
  if (!dp) return;
  int n = 0;
  for (struct dirent *e; (e = readdir(dp));) {
    if (e->d_name[0] == '.') continue;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    size_t len = 0;
    char *buf = NULL;
    ir_diag d = {0};
    CHECKF(ir_file_read(path, 1 << 20, &buf, &len, &d) == IR_OK, "%s", d.msg);
    irt_tokenizer *t = NULL;
    ir_status st = buf ? tok_deserialize((const uint8_t *)buf, len, &t, &d) : IR_IO;
    if (st == IR_OK) { /* loaded: it must encode */
      int32_t ids[64];
      size_t k = 0;
      CHECK(tok_encode(t, "Hello world", 11, true, true, ids, 64, &k, &d) == IR_OK);
    }
    CHECKF(st == IR_OK || d.msg[0], "%s: refused without a message", e->d_name);
    tok_destroy(t);
    free(buf);
    n++;
  }
  closedir(dp);
  CHECK(n >= 1);
}

int main(void) {
  corpus c;
  CHECK(load_corpus(&c));
  static const char *const names[] = {"gpt2", "gpt2-prefix", "llama3",    "qwen2",     "smollm",
                                      "spm",  "spm-first",   "spm-split", "spm-gemma", "gpt2-real"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && c.text; i++) check_fixture(names[i], &c);
  check_config();
  if (c.text) check_gemma(&c);
  check_add_eos();
  check_spm_bytes();
  check_invalid_utf8();
  check_spec();
  check_gguf_spm();
  check_damage();
  check_unsupported();
  check_template_beside();
  check_fuzz_regressions();
  free(c.text);
  return tcheck_done("tokenizer");
}
