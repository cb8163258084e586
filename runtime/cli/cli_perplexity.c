/* cli_perplexity: `inferrt perplexity`: perplexity of a plan on a text file, and with
 * --ref, next-token top-1 agreement and KL divergence against a reference plan (e.g. the
 * f32 build of the same model) on exactly the same token windows. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct ppl_args {
  const char *plan, *ref, *file;
  int64_t ctx, max_tokens, threads;
  bool json;
  irt_kv_dtype kv_dtype, ref_kv_dtype;
} ppl_args;

static int usage(FILE *f) {
  fputs("usage: inferrt perplexity model.plan --file TEXT [options]\n\n"
        "  --file PATH        UTF-8 text, tokenized with the plan's tokenizer (required)\n"
        "  --ctx N            tokens per window (default 256); windows do not overlap and\n"
        "                     each token after a window's first is scored\n"
        "  --ref PLAN         a reference plan with the same vocabulary: also report its\n"
        "                     perplexity, top-1 agreement and mean KL(ref || model)\n"
        "  --max-tokens N     score at most the first N tokens of the text (default: all)\n"
        "  --kv-dtype T       " CLI_KV_DTYPE_USAGE "\n"
        "  --ref-kv-dtype T   the same for the --ref plan (default f32)\n"
        "  --threads N        CPU threads (default: all cores)\n"
        "  --json             print one JSON object\n",
        f);
  return f == stderr ? 2 : 0;
}

static int parse(int argc, char **argv, ppl_args *a) {
  static const struct option longs[] = {
      {"file", required_argument, 0, 'f'},     {"ctx", required_argument, 0, 'c'},
      {"ref", required_argument, 0, 'r'},      {"max-tokens", required_argument, 0, 'm'},
      {"threads", required_argument, 0, 't'},  {"json", no_argument, 0, 'j'},
      {"kv-dtype", required_argument, 0, 'k'}, {"ref-kv-dtype", required_argument, 0, 'K'},
      {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    if (c == 'f') a->file = optarg;
    else if (c == 'r') a->ref = optarg;
    else if (c == 'j') a->json = true;
    else if (c == 'k' && cli_parse_kv_dtype(optarg, &a->kv_dtype)) return 1;
    else if (c == 'K' && cli_parse_kv_dtype(optarg, &a->ref_kv_dtype)) return 1;
    else if (c == 'c' && !cli_parse_i64(optarg, 2, 1 << 20, &a->ctx))
      return cli_fail("--ctx: expected an integer >= 2");
    else if (c == 'm' && !cli_parse_i64(optarg, 2, INT64_MAX, &a->max_tokens))
      return cli_fail("--max-tokens: expected an integer >= 2");
    else if (c == 't' && !cli_parse_i64(optarg, 0, 4096, &a->threads))
      return cli_fail("--threads: expected an integer in [0, 4096]");
    else if (c == 'h') return usage(stdout) - 1;
    else if (c != 'c' && c != 'm' && c != 't' && c != 'k' && c != 'K') return usage(stderr);
  }
  if (optind == argc - 1) a->plan = argv[optind++];
  if (!a->plan || optind != argc) return usage(stderr);
  if (!a->file) return cli_fail("--file is required");
  return 0;
}

static char *read_text(const char *path, size_t *out_len) {
  FILE *f = irt_file_open(path, NULL); /* regular files only: a FIFO would block */
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  for (size_t r; buf && (r = fread(buf + len, 1, cap - len, f)) > 0;) {
    len += r;
    if (len == cap) {
      char *p = realloc(buf, cap *= 2);
      if (!p) free(buf);
      buf = p;
    }
  }
  fclose(f);
  *out_len = len;
  return buf;
}

/* Statistics over the scored positions. */
typedef struct ppl_sums {
  double nll, ref_nll, kl;
  int64_t scored, agree, windows;
  double ms;
} ppl_sums;

/* log-softmax pieces of one logit row: its max, log-sum-exp and argmax. */
static double row_lse(const float *z, int64_t v, int64_t *out_argmax) {
  float mx = z[0];
  int64_t am = 0;
  for (int64_t i = 1; i < v; i++)
    if (z[i] > mx) mx = z[i], am = i;
  double s = 0.0;
  for (int64_t i = 0; i < v; i++) s += exp((double)z[i] - mx);
  *out_argmax = am;
  return mx + log(s);
}

/* KL(p || q) of two logit rows with their log-sum-exps. */
static double row_kl(const float *p, double lp, const float *q, double lq, int64_t v) {
  double kl = 0.0;
  for (int64_t i = 0; i < v; i++) {
    double a = p[i] - lp;
    kl += exp(a) * (a - (q[i] - lq));
  }
  return kl;
}

/* All logits of one window through a fresh sequence of model m. */
static irt_status window_logits(irt_model *m, const int32_t *ids, int64_t n, float *lg,
                                irt_error *err) {
  irt_seq *s = NULL;
  irt_status st = irt_seq_create(m, &s, err);
  if (st == IRT_OK) st = irt_seq_decode(m, s, ids, n, lg, true, err);
  irt_seq_destroy(s);
  return st;
}

static void score_window(const int32_t *ids, int64_t n, const float *lg, const float *rl, int64_t v,
                         ppl_sums *sum) {
  for (int64_t t = 0; t + 1 < n; t++) {
    const float *z = lg + t * v;
    int64_t am, ram;
    double lse = row_lse(z, v, &am);
    sum->nll += lse - z[ids[t + 1]];
    if (rl) {
      const float *r = rl + t * v;
      double rlse = row_lse(r, v, &ram);
      sum->ref_nll += rlse - r[ids[t + 1]];
      sum->agree += am == ram;
      sum->kl += row_kl(r, rlse, z, lse, v);
    }
    sum->scored++;
  }
  sum->windows++;
}

static irt_status run_windows(const ppl_args *a, irt_model *m, irt_model *ref, const int32_t *ids,
                              int64_t n, ppl_sums *sum, irt_error *err) {
  int64_t v = irt_model_get_info(m)->vocab_size, ctx = a->ctx;
  float *lg = malloc((size_t)(ctx * v) * sizeof *lg);
  float *rl = ref ? malloc((size_t)(ctx * v) * sizeof *rl) : NULL;
  irt_status st = lg && (rl || !ref) ? IRT_OK : IRT_OOM;
  for (int64_t off = 0; st == IRT_OK && off + 1 < n; off += ctx) {
    int64_t w = n - off < ctx ? n - off : ctx;
    double t0 = cli_now_ms();
    st = window_logits(m, ids + off, w, lg, err);
    sum->ms += cli_now_ms() - t0;
    if (st == IRT_OK && ref) st = window_logits(ref, ids + off, w, rl, err);
    if (st == IRT_OK) score_window(ids + off, w, lg, rl, v, sum);
  }
  if (st == IRT_OOM && !err->msg[0]) snprintf(err->msg, sizeof err->msg, "out of memory");
  free(lg), free(rl);
  return st;
}

static void print_result(const ppl_args *a, const ppl_sums *s, int64_t n_tok) {
  double n = (double)(s->scored > 0 ? s->scored : 1), ppl = exp(s->nll / n);
  double tps = s->ms > 0 ? (double)(s->scored + s->windows) / (s->ms / 1000.0) : 0.0;
  if (a->json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tokens", (double)n_tok);
    cJSON_AddNumberToObject(o, "scored", (double)s->scored);
    cJSON_AddNumberToObject(o, "windows", (double)s->windows);
    cJSON_AddNumberToObject(o, "ctx", (double)a->ctx);
    cJSON_AddNumberToObject(o, "perplexity", ppl);
    cJSON_AddNumberToObject(o, "nll", s->nll / n);
    cJSON_AddNumberToObject(o, "tokens_per_s", tps);
    if (a->ref) {
      cJSON_AddNumberToObject(o, "ref_perplexity", exp(s->ref_nll / n));
      cJSON_AddNumberToObject(o, "delta_pct", 100.0 * (ppl / exp(s->ref_nll / n) - 1.0));
      cJSON_AddNumberToObject(o, "top1_agreement", (double)s->agree / n);
      cJSON_AddNumberToObject(o, "kl", s->kl / n);
    }
    char *txt = cJSON_PrintUnformatted(o);
    puts(txt);
    free(txt);
    cJSON_Delete(o);
    return;
  }
  printf("perplexity: %.4f over %lld scored tokens (%lld windows of <= %lld; %.0f tok/s)\n", ppl,
         (long long)s->scored, (long long)s->windows, (long long)a->ctx, tps);
  if (a->ref)
    printf("reference:  perplexity %.4f (model %+.2f%%), top-1 agreement %.2f%%, "
           "mean KL(ref || model) %.5f nats\n",
           exp(s->ref_nll / n), 100.0 * (ppl / exp(s->ref_nll / n) - 1.0),
           100.0 * (double)s->agree / n, s->kl / n);
}

/* The text as token ids (no BOS/EOS added, special-token text left as text). */
static irt_status tokenize_file(irt_model *m, const char *path, int32_t **out, int64_t *out_n,
                                irt_error *err) {
  const irt_tokenizer *t = irt_model_get_tokenizer(m);
  if (!t) {
    snprintf(err->msg, sizeof err->msg, "the plan has no tokenizer");
    return IRT_INVALID_ARG;
  }
  size_t len = 0, n = 0;
  char *text = read_text(path, &len);
  if (!text) {
    snprintf(err->msg, sizeof err->msg, "%s: cannot read", path);
    return IRT_IO;
  }
  int32_t *ids = NULL;
  irt_status st = irt_tokenize_alloc(t, text, len, false, false, &ids, &n, err);
  free(text);
  *out = st == IRT_OK ? ids : NULL;
  *out_n = (int64_t)n;
  return st;
}

static irt_status open_model(const ppl_args *a, const char *path, irt_kv_dtype kv_dtype,
                             irt_model **out, irt_error *err) {
  irt_model_opts o = irt_model_opts_default();
  cli_cuda env_only = {0};
  if (cli_model_opts(&o, &env_only)) return 1;
  o.n_threads = (int)a->threads;
  o.kv_dtype = kv_dtype;
  o.kv_tokens = a->ctx;
  irt_status st = irt_model_open(path, &o, out, err);
  if (st == IRT_OK && irt_model_get_info(*out)->context_length < a->ctx) {
    snprintf(err->msg, sizeof err->msg, "%s: --ctx %lld exceeds the plan's context (%lld)", path,
             (long long)a->ctx, (long long)irt_model_get_info(*out)->context_length);
    st = IRT_INVALID_ARG;
  }
  return st;
}

int cmd_perplexity(int argc, char **argv) {
  ppl_args a = {.ctx = 256};
  int rc = parse(argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  irt_model *m = NULL, *ref = NULL;
  irt_error err = {0};
  int32_t *ids = NULL;
  int64_t n = 0;
  ppl_sums sum = {0};
  irt_status st = open_model(&a, a.plan, a.kv_dtype, &m, &err);
  if (st == IRT_OK && a.ref) st = open_model(&a, a.ref, a.ref_kv_dtype, &ref, &err);
  if (st == IRT_OK && ref &&
      irt_model_get_info(ref)->vocab_size != irt_model_get_info(m)->vocab_size) {
    snprintf(err.msg, sizeof err.msg, "%s and %s have different vocabularies", a.plan, a.ref);
    st = IRT_INVALID_ARG;
  }
  if (st == IRT_OK) st = tokenize_file(m, a.file, &ids, &n, &err);
  if (st == IRT_OK && a.max_tokens && n > a.max_tokens) n = a.max_tokens;
  if (st == IRT_OK && n < 2) {
    snprintf(err.msg, sizeof err.msg, "%s: fewer than 2 tokens to score", a.file);
    st = IRT_INVALID_ARG;
  }
  if (st == IRT_OK) st = run_windows(&a, m, ref, ids, n, &sum, &err);
  if (st == IRT_OK) print_result(&a, &sum, n);
  rc = st == IRT_OK ? 0 : cli_fail("%s", err.msg[0] ? err.msg : irt_status_name(st));
  free(ids);
  irt_model_close(ref);
  irt_model_close(m);
  return rc;
}
