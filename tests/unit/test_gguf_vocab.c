/* test_gguf_vocab: the GGUF tokenizer path against llama.cpp's own tokenizer test vectors
 * (models/ggml-vocab-*.gguf with .inp/.out, from the llama-cpp-python source distribution,
 * fetched by tools/get-llama-vocabs into $INFC_LLAMA_VOCABS). For every vocabulary whose
 * tokenizer the engine supports, every vector must encode to llama.cpp's ids (no BOS, no
 * special-token parsing, as llama.cpp's test-tokenizer-0). Vocabularies of unsupported
 * kinds are listed, not failed. Also SmolLM2's vocabulary ($INFC_SMOLLM2, from
 * tools/get-smollm2) on the multilingual/code/emoji corpus, against llama.cpp's ids
 * (tests/fixtures/tokenizers/smollm2-gguf, tools/gen_smollm2_tok_fixture.py). Without the
 * environment variables the parts say they are skipped. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_gguf_tok.h"
#include "infc_util.h"
#include "tcheck.h"

#define SEP "\n__ggml_vocab_test__\n"

/* Compares one vector: text vs a line of space-separated ids. */
static bool check_vector(const irt_tokenizer *t, const char *text, size_t len, char *line,
                         const char *vocab, int idx) {
  int32_t ids[4096], want[4096];
  size_t n = 0, nw = 0;
  ir_diag d = {0};
  for (char *tok = strtok(line, " "); tok && nw < 4096; tok = strtok(NULL, " "))
    want[nw++] = atoi(tok);
  if (tok_encode(t, text, len, false, false, ids, 4096, &n, &d) != IR_OK) {
    fprintf(stderr, "%s #%d: %s\n", vocab, idx, d.msg);
    return false;
  }
  bool ok = n == nw && !memcmp(ids, want, n * sizeof *ids);
  if (!ok) fprintf(stderr, "%s #%d: %zu ids, llama.cpp %zu\n", vocab, idx, n, nw);
  return ok;
}

/* Returns the number of mismatching vectors, or -1 if the vocabulary is unsupported. */
static int run_vocab(const char *dir, const char *name, int *out_total) {
  char path[1024], inp_path[1100], out_path[1100], *inp = NULL, *out = NULL;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(inp_path, sizeof inp_path, "%s.inp", path);
  snprintf(out_path, sizeof out_path, "%s.out", path);
  ir_diag d = {0};
  fmt_gguf *g = NULL;
  irt_tokenizer *t = NULL;
  if (fmt_gguf_open(path, &g, &d) != IR_OK || fmt_gguf_tokenizer(g, &t, &d) != IR_OK || !t) {
    printf("  %-34s unsupported: %s\n", name, d.msg);
    fmt_gguf_close(g);
    return -1;
  }
  infc_read_file(inp_path, 1 << 20, &inp, NULL, &d);
  infc_read_file(out_path, 1 << 20, &out, NULL, &d);
  int bad = 0, total = 0;
  /* One .out line per vector, empty lines included (an empty text has no ids). */
  char *text = inp, *line = out;
  for (char *sep; text && line && (sep = strstr(text, SEP)); text = sep + strlen(SEP), total++) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    bad += !check_vector(t, text, (size_t)(sep - text), line, name, total);
    line = nl ? nl + 1 : NULL;
  }
  printf("  %-34s %d/%d vectors as llama.cpp\n", name, total - bad, total);
  *out_total = total;
  free(inp), free(out);
  tok_destroy(t);
  fmt_gguf_close(g);
  return bad;
}

static int json_ids(const cJSON *arr, int32_t *out, int cap) {
  int n = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, arr) if (n < cap) out[n++] = v->valueint;
  return n;
}

static bool same_ids(const irt_tokenizer *t, const char *text, size_t len, bool special,
                     const cJSON *want) {
  int32_t ids[8192], exp[8192];
  size_t n = 0;
  ir_diag d = {0};
  int ne = json_ids(want, exp, 8192);
  if (tok_encode(t, text, len, false, special, ids, 8192, &n, &d) != IR_OK) return false;
  return (int)n == ne && !memcmp(ids, exp, n * sizeof *ids);
}

static void test_smollm2_corpus(void) {
  const char *gguf = getenv("INFC_SMOLLM2");
  if (!gguf || !*gguf) {
    printf("skipped: set INFC_SMOLLM2 (tools/get-smollm2) for the SmolLM2 corpus check\n");
    return;
  }
  char *text = NULL, *json = NULL;
  ir_diag d = {0};
  fmt_gguf *g = NULL;
  irt_tokenizer *t = NULL;
  CHECKF(fmt_gguf_open(gguf, &g, &d) == IR_OK && fmt_gguf_tokenizer(g, &t, &d) == IR_OK && t, "%s",
         d.msg);
  infc_read_file(FIXTURES_DIR "/tokenizers/corpus.txt", 1 << 20, &text, NULL, &d);
  infc_read_file(FIXTURES_DIR "/tokenizers/smollm2-gguf/expected.json", 1 << 22, &json, NULL, &d);
  cJSON *root = json ? cJSON_Parse(json) : NULL;
  CHECKF(root && text, "cannot read the corpus or the llama.cpp fixture");
  int lines = 0, bad = 0;
  const cJSON *want = root ? cJSON_GetObjectItem(root, "lines")->child : NULL;
  for (char *p = text; t && p && *p && want; want = want->next, lines++) {
    char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) + 1 : strlen(p);
    bad += !same_ids(t, p, len, false, want);
    p += len;
  }
  const cJSON *s;
  cJSON_ArrayForEach(s, cJSON_GetObjectItem(root, "special")) {
    const char *st = cJSON_GetObjectItem(s, "text")->valuestring;
    bad += !same_ids(t, st, strlen(st), true, cJSON_GetObjectItem(s, "ids"));
  }
  printf("SmolLM2 GGUF vocabulary: %d corpus lines, %d differ from llama.cpp\n", lines, bad);
  CHECKF(lines >= 200 && bad == 0, "%d of %d lines differ from llama.cpp", bad, lines);
  cJSON_Delete(root);
  free(text), free(json);
  tok_destroy(t);
  fmt_gguf_close(g);
}

int main(void) {
  test_smollm2_corpus();
  const char *dir = getenv("INFC_LLAMA_VOCABS");
  if (!dir || !*dir) {
    return tcheck_skip("gguf_vocab", "set INFC_LLAMA_VOCABS (tools/get-llama-vocabs) to run "
                                     "llama.cpp's vectors");
  }
  DIR *dp = opendir(dir);
  CHECKF(dp != NULL, "cannot open %s", dir);
  if (!dp) return tcheck_done("gguf_vocab");
  int supported = 0, vectors = 0;
  struct dirent *e;
  while ((e = readdir(dp))) {
    size_t l = strlen(e->d_name);
    if (l < 6 || strcmp(e->d_name + l - 5, ".gguf") || strncmp(e->d_name, "ggml-vocab-", 11))
      continue;
    char inp[1200];
    snprintf(inp, sizeof inp, "%s/%s.inp", dir, e->d_name);
    if (!infc_file_exists(inp)) continue;
    int total = 0, bad = run_vocab(dir, e->d_name, &total);
    if (bad < 0) continue;
    supported++;
    vectors += total;
    CHECKF(bad == 0 && total > 0, "%s: %d of %d vectors differ from llama.cpp", e->d_name, bad,
           total);
  }
  closedir(dp);
  CHECKF(supported >= 4, "only %d vocabularies were supported", supported);
  printf("%d vocabularies, %d vectors\n", supported, vectors);
  return tcheck_done("gguf_vocab");
}
