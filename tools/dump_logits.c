/* dump_logits: teacher-forced logits of a plan, for comparing against other engines
 * (tools/check-llamacpp.py). Feeds the given token ids through one sequence and writes
 * the logits of every position as raw little-endian f32, row-major (n_ids x vocab), to
 * --out (or stdout). Uses only the public inferrt API.
 * usage: dump_logits model.plan --ids 1,2,3 [--threads N] [--out FILE] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inferrt.h"

static int fail(const char *msg) {
  fprintf(stderr, "dump_logits: error: %s\n", msg);
  return 1;
}

/* "1,2,3" -> malloc'd ids; -1 on a malformed list. */
static int parse_ids(const char *s, int32_t **out, int64_t *out_n) {
  int64_t n = 1;
  for (const char *p = s; *p; p++) n += *p == ',';
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  if (!ids) return -1;
  for (int64_t i = 0; i < n; i++) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
      free(ids);
      return -1;
    }
    ids[i] = (int32_t)v;
    s = *end ? end + 1 : end;
  }
  *out = ids;
  *out_n = n;
  return 0;
}

int main(int argc, char **argv) {
  const char *plan = NULL, *out_path = NULL, *ids_arg = NULL;
  int threads = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ids") && i + 1 < argc) ids_arg = argv[++i];
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (argv[i][0] != '-' && !plan) plan = argv[i];
    else return fail("usage: dump_logits model.plan --ids 1,2,3 [--threads N] [--out FILE]");
  }
  int32_t *ids = NULL;
  int64_t n = 0;
  if (!plan || !ids_arg)
    return fail("usage: dump_logits model.plan --ids 1,2,3 [--threads N] [--out FILE]");
  if (parse_ids(ids_arg, &ids, &n)) return fail("--ids: expected comma-separated token ids");
  irt_model_opts o = irt_model_opts_default();
  o.n_threads = threads;
  irt_model *m = NULL;
  irt_seq *s = NULL;
  irt_error err = {0};
  float *lg = NULL;
  irt_status st = irt_model_open(plan, &o, &m, &err);
  int64_t V = st == IRT_OK ? irt_model_get_info(m)->vocab_size : 0;
  if (st == IRT_OK && !(lg = malloc((size_t)(n * V) * sizeof *lg))) st = IRT_OOM;
  if (st == IRT_OK) st = irt_seq_create(m, &s, &err);
  if (st == IRT_OK) st = irt_seq_decode(m, s, ids, n, lg, true, &err);
  int rc = 0;
  if (st != IRT_OK) {
    rc = fail(err.msg[0] ? err.msg : irt_status_name(st));
  } else {
    FILE *f = out_path ? fopen(out_path, "wb") : stdout;
    if (!f || fwrite(lg, sizeof *lg, (size_t)(n * V), f) != (size_t)(n * V))
      rc = fail("write failed");
    if (f && f != stdout) fclose(f);
    if (!rc) fprintf(stderr, "dump_logits: %lld x %lld logits\n", (long long)n, (long long)V);
  }
  free(lg);
  free(ids);
  irt_seq_destroy(s);
  irt_model_close(m);
  return rc;
}
