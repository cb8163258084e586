/* cli_tokenize: `inferrt tokenize` and `inferrt detokenize`. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct tok_args {
  const char *source; /* plan, tokenizer.json or .gguf */
  const char *text;
  const char *ids;
  bool json, no_special, skip_special;
} tok_args;

static int usage(FILE *f, bool detok) {
  if (detok)
    fputs("usage: inferrt detokenize (model.plan | --tokenizer PATH) --ids 1,2,3 [options]\n\n"
          "  --tokenizer PATH   a tokenizer.json, a .gguf file or a plan\n"
          "  --ids IDS          comma-separated token ids (required)\n"
          "  --skip-special     drop special tokens from the text\n"
          "  --json             print {\"text\": ...}\n",
          f);
  else
    fputs("usage: inferrt tokenize (model.plan | --tokenizer PATH) [--text TEXT] [options]\n\n"
          "  --tokenizer PATH   a tokenizer.json, a .gguf file or a plan\n"
          "  --text TEXT        the text (default: read standard input)\n"
          "  --no-special       no BOS/EOS, and special-token text stays plain text\n"
          "  --json             print {\"ids\": [...]}\n",
          f);
  return f == stderr ? 2 : 0;
}

static int parse(int argc, char **argv, tok_args *a, bool detok) {
  static const struct option longs[] = {{"tokenizer", required_argument, 0, 't'},
                                        {"text", required_argument, 0, 'x'},
                                        {"ids", required_argument, 0, 'i'},
                                        {"json", no_argument, 0, 'j'},
                                        {"no-special", no_argument, 0, 'n'},
                                        {"skip-special", no_argument, 0, 's'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    if (c == 't') a->source = optarg;
    else if (c == 'x' && !detok) a->text = optarg;
    else if (c == 'i' && detok) a->ids = optarg;
    else if (c == 'j') a->json = true;
    else if (c == 'n' && !detok) a->no_special = true;
    else if (c == 's' && detok) a->skip_special = true;
    else if (c == 'h') return usage(stdout, detok) - 1;
    else return usage(stderr, detok);
  }
  if (!a->source && optind == argc - 1) a->source = argv[optind++];
  if (!a->source || optind != argc) return usage(stderr, detok);
  if (detok && !a->ids) return cli_fail("--ids is required");
  return 0;
}

static int print_ids(const int32_t *ids, size_t n, bool json) {
  if (json) {
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "ids");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
    return 0;
  }
  for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
  putchar('\n');
  return 0;
}

int cmd_tokenize(int argc, char **argv) {
  tok_args a = {0};
  int rc = parse(argc, argv, &a, false);
  if (rc) return rc < 0 ? 0 : rc;
  irt_tokenizer *t = NULL;
  irt_error err = {0};
  if (cli_open_tokenizer(a.source, &t, &err) != IRT_OK) return cli_fail("%s", err.msg);
  size_t len = 0;
  char *owned = a.text ? NULL : cli_read_stdin(&len);
  const char *text = a.text ? a.text : owned;
  if (a.text) len = strlen(a.text);
  size_t n = 0;
  int32_t *ids = NULL;
  irt_status st =
      text ? irt_tokenize_alloc(t, text, len, !a.no_special, !a.no_special, &ids, &n, &err)
           : IRT_OOM;
  rc = st == IRT_OK ? print_ids(ids, n, a.json)
                    : cli_fail("%s", err.msg[0] ? err.msg : "out of memory");
  free(ids);
  free(owned);
  irt_tokenizer_destroy(t);
  return rc;
}

int cmd_detokenize(int argc, char **argv) {
  tok_args a = {0};
  int rc = parse(argc, argv, &a, true);
  if (rc) return rc < 0 ? 0 : rc;
  int32_t *ids = NULL;
  int64_t n = 0;
  if (!cli_parse_ids(a.ids, &ids, &n))
    return cli_fail("--ids: expected comma-separated non-negative integers");
  irt_tokenizer *t = NULL;
  irt_error err = {0};
  irt_status st = cli_open_tokenizer(a.source, &t, &err);
  size_t len = 0;
  char *buf = NULL;
  if (st == IRT_OK) st = irt_detokenize_alloc(t, ids, (size_t)n, a.skip_special, &buf, &len, &err);
  if (st == IRT_OK && a.json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "text", buf);
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
  } else if (st == IRT_OK) {
    fwrite(buf, 1, len, stdout);
    putchar('\n');
  }
  rc = st == IRT_OK ? 0 : cli_fail("%s", err.msg[0] ? err.msg : "out of memory");
  free(buf), free(ids);
  irt_tokenizer_destroy(t);
  return rc;
}
