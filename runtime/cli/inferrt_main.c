/* inferrt: the runtime's command line. Each subcommand lives in its own cli_*.c file and
 * uses only the public API (runtime/include/inferrt.h). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static int usage(FILE *f) {
  fputs("usage: inferrt <command> [options]\n\n"
        "commands:\n"
        "  generate model.plan (--prompt TEXT | --chat MSG | --prompt-ids IDS)  generate text\n"
        "  tokenize (model.plan | --tokenizer PATH) --text TEXT     print token ids\n"
        "  detokenize (model.plan | --tokenizer PATH) --ids IDS     print text\n"
        "  bench model.plan [--requests N ...]      synthetic serving workload\n"
        "  run model.plan --input [NAME=]F.pb ...   run a generic (e.g. ONNX) program\n"
        "  serve model.plan [--port N ...]          OpenAI-compatible HTTP server\n"
        "  batch model.plan --input F --output F    offline OpenAI batch-style jobs\n"
        "  perplexity model.plan --file TEXT [--ref PLAN]  perplexity, top-1 agreement\n"
        "  verify model.plan                        check every checksum (weights included)\n\n"
        "options: --help, --version. `inferrt <command> --help` for a command's options.\n",
        f);
  return f == stderr ? 2 : 0;
}

static int run(const char *cmd, int argc, char **argv) {
  if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
  if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
  if (!strcmp(cmd, "detokenize")) return cmd_detokenize(argc - 1, argv + 1);
  if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
  if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
  if (!strcmp(cmd, "serve")) return cmd_serve(argc - 1, argv + 1);
  if (!strcmp(cmd, "batch")) return cmd_batch(argc - 1, argv + 1);
  if (!strcmp(cmd, "perplexity")) return cmd_perplexity(argc - 1, argv + 1);
  if (!strcmp(cmd, "verify")) return cmd_verify(argc - 1, argv + 1);
  fprintf(stderr, "inferrt: error: unknown command '%s'\n", cmd);
  return usage(stderr);
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("inferrt %s\n", INFC_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) return usage(stdout);
  if (cli_dist_init(cmd)) return 1;
  int rc = run(cmd, argc, argv);
  if (rc) cli_dist_abort(rc); /* under mpirun the other ranks may wait on this one */
  return rc;
}
