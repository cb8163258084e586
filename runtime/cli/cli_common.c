/* cli_common: argument helpers and tokenizer opening for the inferrt subcommands. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

int cli_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("inferrt: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

double cli_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool cli_parse_range(const char *v, int64_t hi, int64_t *lo, int64_t *out_hi) {
  char a[32], b[32];
  const char *c = strchr(v, ':');
  if (!c || c - v >= 31 || strlen(c + 1) >= 31)
    return cli_parse_i64(v, 1, hi, lo) && (*out_hi = *lo);
  snprintf(a, sizeof a, "%.*s", (int)(c - v), v);
  snprintf(b, sizeof b, "%s", c + 1);
  return cli_parse_i64(a, 1, hi, lo) && cli_parse_i64(b, *lo, hi, out_hi);
}

static const char *g_draft_path; /* --draft */

bool cli_has_draft(void) { return g_draft_path != NULL; }

irt_status cli_open_draft(irt_model *target, const irt_model_opts *mo, irt_engine_opts *eo,
                          irt_model **out, irt_error *err) {
  *out = NULL;
  if (!g_draft_path) return IRT_OK;
  irt_model_opts o = *mo;
  o.device = NULL; /* its plan's target */
  o.kv_tokens = irt_model_get_info(target)->kv_tokens;
  o.comm = NULL;
  irt_status st = irt_model_open(g_draft_path, &o, out, err);
  if (st != IRT_OK) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    snprintf(err->msg, sizeof err->msg, "--draft %.200s: %.300s", g_draft_path, why);
    return st;
  }
  eo->draft = *out;
  if (eo->spec_tokens == 0) eo->spec_tokens = 4;
  return IRT_OK;
}

int cli_parse_spec(const char *flag, const char *v, irt_engine_opts *eo) {
  int64_t a, b;
  if (!strcmp(flag, "draft")) {
    g_draft_path = v;
    return 0;
  }
  if (!strcmp(flag, "spec-always")) {
    eo->spec_always = true;
    return 0;
  }
  if (!strcmp(flag, "spec-tokens")) {
    if (!cli_parse_i64(v, 0, IRT_MAX_SPEC_TOKENS, &a))
      return cli_fail("--spec-tokens: expected 0..%d, got '%s'", IRT_MAX_SPEC_TOKENS, v);
    eo->spec_tokens = (int)a;
    return 0;
  }
  if (!cli_parse_range(v, 64, &a, &b))
    return cli_fail("--spec-ngram: expected MIN:MAX with 1 <= MIN <= MAX <= 64, got '%s'", v);
  eo->spec_ngram_min = (int)a, eo->spec_ngram_max = (int)b;
  return 0;
}

int cli_parse_kv_dtype(const char *s, irt_kv_dtype *out) {
  return irt_kv_dtype_parse(s, out)
             ? 0
             : cli_fail("--kv-dtype: expected f32, f16 or int8, got '%s'", s);
}

bool cli_parse_ids(const char *s, int32_t **out, int64_t *out_n) {
  int64_t cap = 16, n = 0;
  int32_t *ids = malloc((size_t)cap * sizeof *ids);
  while (ids && *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) break;
    if (n == cap) {
      int32_t *p = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
      if (!p) break;
      ids = p;
    }
    ids[n++] = (int32_t)v;
    s = *end ? end + 1 : end;
  }
  if (!ids || *s || n == 0) {
    free(ids);
    return false;
  }
  *out = ids;
  *out_n = n;
  return true;
}

static char *read_all(FILE *f, size_t *out_len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += r;
    if (n == cap) {
      char *p = realloc(buf, (cap *= 2) + 1);
      if (!p) free(buf);
      buf = p;
    }
  }
  if (buf) buf[n] = '\0';
  *out_len = n;
  return buf;
}

char *cli_read_stdin(size_t *out_len) { return read_all(stdin, out_len); }

char *cli_read_file(const char *path, size_t *out_len) {
  FILE *f = irt_file_open(path, NULL); /* regular files only: a FIFO would block */
  if (!f) return NULL;
  char *buf = read_all(f, out_len);
  fclose(f);
  return buf;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

irt_status cli_open_tokenizer(const char *path, irt_tokenizer **out, irt_error *err) {
  if (ends_with(path, ".gguf")) return irt_tokenizer_open_gguf(path, out, err);
  if (!ends_with(path, ".json")) return irt_tokenizer_open_plan(path, out, err);
  char cfg[4096];
  const char *slash = strrchr(path, '/');
  snprintf(cfg, sizeof cfg, "%.*stokenizer_config.json", slash ? (int)(slash - path + 1) : 0, path);
  return irt_tokenizer_open_json(path, access(cfg, R_OK) == 0 ? cfg : NULL, out, err);
}

/* A --cuda-dequant-gemm-m value (or its variable's): rows >= 0, 0 meaning never, which
 * irt_model_opts spells < 0. */
static bool dequant_rows(const char *v, int64_t *out) {
  if (!cli_parse_i64(v, 0, (int64_t)1 << 30, out)) return false;
  if (*out == 0) *out = -1;
  return true;
}

int cli_cuda_flag(int c, const char *v, cli_cuda *f) {
  switch (c) {
  case CLI_OPT_PRELOAD:
    if (!v || !strcmp(v, "background")) f->preload = IRT_PRELOAD_BACKGROUND;
    else if (!strcmp(v, "wait")) f->preload = IRT_PRELOAD_WAIT;
    else
      return cli_fail("--preload: want --preload, --preload=background or --preload=wait, not '%s'",
                      v);
    return 0;
  case CLI_OPT_CUDA_PROFILE: f->profile = f->profile_set = true; return 0;
  case CLI_OPT_CUDA_LIB: f->lib = v; return 0;
  case CLI_OPT_DRAFT: return cli_parse_spec("draft", v, NULL);
  case CLI_OPT_CUDA_DEQUANT:
    if (!dequant_rows(v, &f->dequant_gemm_m))
      return cli_fail("--cuda-dequant-gemm-m: want a row count >= 0 (0: never), not '%s'", v);
    f->dequant_set = true;
    return 0;
  default: return -1;
  }
}

static void log_stderr(void *user, irt_log_level level, const char *msg) {
  (void)user;
  fprintf(stderr, "inferrt: %s%s\n", level == IRT_LOG_WARN ? "warning: " : "", msg);
}

int cli_model_opts(irt_model_opts *mo, const cli_cuda *f) {
  mo->log = log_stderr;
  mo->preload = f->preload;
  const char *prof = getenv("INFERRT_CUDA_PROFILE");
  mo->cuda_profile = f->profile_set ? f->profile : prof && *prof && strcmp(prof, "0") != 0;
  const char *lib = getenv("INFERRT_CUDA_LIB");
  mo->cuda_lib = f->lib ? f->lib : lib && *lib ? lib : NULL;
  const char *pdl = getenv("INFERRT_CUDA_PDL"); /* 0: off, to compare */
  mo->no_cuda_pdl = pdl && !strcmp(pdl, "0");
  const char *m = getenv("INFERRT_CUDA_DEQUANT_GEMM_M");
  if (f->dequant_set) mo->cuda_dequant_gemm_m = f->dequant_gemm_m;
  else if (m && *m && !dequant_rows(m, &mo->cuda_dequant_gemm_m))
    return cli_fail("INFERRT_CUDA_DEQUANT_GEMM_M='%s': want a row count >= 0 (0: never)", m);
  return 0;
}
