/* cli_verify: `inferrt verify model.plan`: checks every checksum of a plan (the weights
 * included, which opening a model skips for speed) and its offsets. Exit 0 and one line
 * on a sound plan; the error and exit 1 otherwise. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static int usage(void) {
  fputs("usage: inferrt verify model.plan\n\n"
        "Checks the header, metadata, weights and kernels checksums and every section\n"
        "offset. `inferrt generate|serve|...` check all but the weights checksum when they\n"
        "open a plan (so a plan loads in milliseconds); run this after copying a plan, or\n"
        "before serving one from untrusted storage.\n",
        stdout);
  return 0;
}

int cmd_verify(int argc, char **argv) {
  const char *plan = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage();
    if (argv[i][0] == '-' || plan)
      return cli_fail("verify: unexpected '%s' (usage: inferrt verify model.plan)", argv[i]);
    plan = argv[i];
  }
  if (!plan) return cli_fail("verify: no plan given (usage: inferrt verify model.plan)");
  irt_error err = {0};
  double t0 = cli_now_ms();
  if (irt_plan_verify(plan, &err) != IRT_OK) return cli_fail("%s", err.msg);
  printf("%s: ok (all checksums match, %.0f ms)\n", plan, cli_now_ms() - t0);
  return 0;
}
