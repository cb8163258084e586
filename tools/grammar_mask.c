/* grammar_mask: the tokens a grammar allows after given token prefixes, for comparing the
 * engine's token masks against other engines (tools/check-grammar-llamacpp.py). Prints
 * the grammar's GBNF as one JSON string line, then, for each line of standard input
 * (comma-separated token ids, possibly none), the ids the grammar allows next,
 * comma-separated, or "reject" when the prefix itself is not allowed.
 * usage: grammar_mask TOKENIZER (--gbnf FILE | --regex FILE | --json-schema FILE | --json-object)
 * TOKENIZER: a plan, a tokenizer.json or a GGUF file. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

static int fail(const char *msg) {
  fprintf(stderr, "grammar_mask: error: %s\n", msg);
  return 1;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
  if (s) s[n] = 0;
  fclose(f);
  return s;
}

static irt_status open_tokenizer(const char *path, irt_tokenizer **t, irt_error *err) {
  size_t n = strlen(path);
  if (n > 5 && !strcmp(path + n - 5, ".json")) return irt_tokenizer_open_json(path, NULL, t, err);
  return irt_tokenizer_open_plan(path, t, err);
}

/* One prefix: its ids taken one by one, then the mask. */
static void answer(const gram *g, const gram_trie *trie, char *line, uint8_t *mask, int32_t V) {
  gram_state *s = NULL;
  bool ok = gram_state_create(g, &s, NULL) == IR_OK;
  for (char *p = line; ok && *p && *p != '\n';) {
    char *end;
    long id = strtol(p, &end, 10);
    ok = end != p && id >= 0 && id < V && gram_state_take(s, trie, (int32_t)id);
    p = *end == ',' ? end + 1 : end;
  }
  if (!ok) {
    puts("reject");
  } else {
    gram_mask(s, trie, mask);
    bool first = true;
    for (int32_t id = 0; id < V; id++)
      if (mask[id]) printf(first ? "%d" : ",%d", id), first = false;
    putchar('\n');
  }
  fflush(stdout);
  gram_state_destroy(s);
}

int main(int argc, char **argv) {
  if (argc < 3)
    return fail("usage: grammar_mask TOKENIZER (--gbnf F | --regex F | --json-schema F | "
                "--json-object)");
  irt_error err = {0};
  char *src = NULL, *text = argc > 3 ? read_file(argv[3]) : NULL;
  if (!strcmp(argv[2], "--gbnf") && text) src = text, text = NULL;
  else if (!strcmp(argv[2], "--json-schema") && text) irt_grammar_json(text, &src, &err);
  else if (!strcmp(argv[2], "--regex") && text) irt_grammar_regex(text, &src, &err);
  else if (!strcmp(argv[2], "--json-object")) irt_grammar_json(NULL, &src, &err);
  free(text);
  if (!src) return fail(err.msg[0] ? err.msg : "cannot read the grammar");
  irt_tokenizer *t = NULL;
  gram *g = NULL;
  ir_diag gd = {0};
  if (open_tokenizer(argv[1], &t, &err) != IRT_OK) return fail(err.msg);
  if (gram_compile(src, &g, &gd) != IR_OK) return fail(gd.msg);
  cJSON *js = cJSON_CreateString(src);
  char *line1 = cJSON_PrintUnformatted(js);
  puts(line1);
  free(line1);
  cJSON_Delete(js);
  gram_trie *trie = gram_trie_create(t);
  int32_t V = irt_tokenizer_vocab_size(t);
  uint8_t *mask = malloc((size_t)V);
  static char line[1 << 20];
  while (trie && mask && fgets(line, sizeof line, stdin)) answer(g, trie, line, mask, V);
  free(mask);
  gram_trie_destroy(trie);
  gram_destroy(g);
  irt_tokenizer_destroy(t);
  free(src);
  return 0;
}
