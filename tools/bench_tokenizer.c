/* bench_tokenizer: encode throughput of the runtime tokenizer (single thread).
 * usage: bench_tokenizer tokenizer.json text.txt [bytes] [min_seconds]
 * The text is repeated to about `bytes` (default 1 MiB) and encoded whole, with special
 * tokens parsed, until min_seconds (default 1) have passed; prints one JSON line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *repeat_file(const char *path, size_t want, size_t *out_len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  size_t n = (size_t)ftell(f), len = 0;
  fseek(f, 0, SEEK_SET);
  char *one = malloc(n + 1);
  if (!one || fread(one, 1, n, f) != n || n == 0) {
    fclose(f);
    free(one);
    return NULL;
  }
  fclose(f);
  size_t reps = (want + n - 1) / n;
  char *text = malloc(reps * n + 1);
  for (size_t i = 0; text && i < reps; i++, len += n) memcpy(text + len, one, n);
  free(one);
  *out_len = len;
  return text;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: bench_tokenizer tokenizer.json text.txt [bytes] [min_seconds]\n");
    return 2;
  }
  size_t want = argc > 3 ? (size_t)atol(argv[3]) : (1u << 20), len = 0, n = 0;
  double min_s = argc > 4 ? atof(argv[4]) : 1.0;
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  double t0 = now();
  if (tok_load_hf(argv[1], NULL, &t, &d) != IR_OK) {
    fprintf(stderr, "bench_tokenizer: error: %s\n", d.msg);
    return 1;
  }
  double load_s = now() - t0;
  char *text = repeat_file(argv[2], want, &len);
  int32_t *ids = text ? malloc((len + 16) * sizeof *ids) : NULL;
  if (!ids) {
    fprintf(stderr, "bench_tokenizer: error: cannot read %s\n", argv[2]);
    return 1;
  }
  int iters = 0;
  double best = 1e30, start = now();
  while (iters < 3 || now() - start < min_s) {
    double a = now();
    if (tok_encode(t, text, len, false, true, ids, len + 16, &n, &d) != IR_OK) {
      fprintf(stderr, "bench_tokenizer: error: %s\n", d.msg);
      return 1;
    }
    double s = now() - a;
    if (s < best) best = s;
    iters++;
  }
  printf("{\"bytes\": %zu, \"tokens\": %zu, \"iters\": %d, \"best_s\": %.6f, \"mb_per_s\": %.2f, "
         "\"load_ms\": %.1f}\n",
         len, n, iters, best, (double)len / best / 1e6, load_s * 1e3);
  free(ids);
  free(text);
  tok_destroy(t);
  return 0;
}
