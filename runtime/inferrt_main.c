/* inferrt: the runtime's command line (generate). Uses only the public API. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "inferrt.h"

static int usage_main(FILE *f) {
  fputs("usage: inferrt <command> [options]\n\n"
        "commands:\n"
        "  generate model.plan --prompt-ids 1,2,3 [-n 32]   generate tokens from a prompt\n\n"
        "options: --help, --version. `inferrt <command> --help` for a command's options.\n", f);
  return f == stderr ? 2 : 0;
}

static int usage_generate(FILE *f) {
  fputs("usage: inferrt generate model.plan --prompt-ids IDS [options]\n\n"
        "  --prompt-ids IDS     comma-separated token ids (required)\n"
        "  -n, --max-tokens N   tokens to generate (default 32)\n"
        "  --temperature T      0 = greedy (default 0)\n"
        "  --top-k K            sample among the K most likely (default: all)\n"
        "  --top-p P            nucleus sampling mass (default 1)\n"
        "  --seed S             sampling seed (default 0)\n"
        "  --ignore-eos         keep generating after the end-of-sequence token\n"
        "  --threads N          CPU threads (default: all cores)\n"
        "  --json               print one JSON object with ids, finish reason and timings\n", f);
  return f == stderr ? 2 : 0;
}

static int fail(const char *msg) {
  fprintf(stderr, "inferrt: error: %s\n", msg);
  return 1;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Parses "1,2,3" into a malloc'd array. */
static int parse_ids(const char *s, int32_t **out, int64_t *out_n) {
  int64_t cap = 16, n = 0;
  int32_t *ids = malloc((size_t)cap * sizeof *ids);
  if (!ids) return -1;
  while (*s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
      free(ids);
      return -1;
    }
    if (n == cap) {
      int32_t *p = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
      if (!p) {
        free(ids);
        return -1;
      }
      ids = p;
    }
    ids[n++] = (int32_t)v;
    s = *end ? end + 1 : end;
  }
  *out = ids;
  *out_n = n;
  return n > 0 ? 0 : -1;
}

typedef struct gen_args {
  const char *plan;
  int32_t *prompt;
  int64_t n_prompt, max_new;
  irt_sampling sampling;
  int threads;
  bool json, ignore_eos;
} gen_args;

static int parse_generate(int argc, char **argv, gen_args *a) {
  static const struct option longs[] = {
      {"prompt-ids", required_argument, 0, 1}, {"max-tokens", required_argument, 0, 'n'},
      {"temperature", required_argument, 0, 2}, {"top-k", required_argument, 0, 3},
      {"top-p", required_argument, 0, 4},     {"seed", required_argument, 0, 5},
      {"threads", required_argument, 0, 6},   {"json", no_argument, 0, 7},
      {"ignore-eos", no_argument, 0, 8},      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  int c;
  char *end;
  while ((c = getopt_long(argc, argv, "n:h", longs, NULL)) != -1) {
    switch (c) {
    case 1:
      if (parse_ids(optarg, &a->prompt, &a->n_prompt)) return fail("--prompt-ids: expected comma-separated non-negative integers");
      break;
    case 'n': a->max_new = strtoll(optarg, &end, 10); if (*end || a->max_new < 0) return fail("-n: expected a non-negative integer"); break;
    case 2: a->sampling.temperature = strtof(optarg, &end); if (*end || a->sampling.temperature < 0) return fail("--temperature: expected a number >= 0"); break;
    case 3: a->sampling.top_k = (int)strtol(optarg, &end, 10); if (*end) return fail("--top-k: expected an integer"); break;
    case 4: a->sampling.top_p = strtof(optarg, &end); if (*end || a->sampling.top_p <= 0 || a->sampling.top_p > 1) return fail("--top-p: expected a number in (0, 1]"); break;
    case 5: a->sampling.seed = strtoull(optarg, &end, 10); if (*end) return fail("--seed: expected an integer"); break;
    case 6: a->threads = (int)strtol(optarg, &end, 10); if (*end || a->threads < 0) return fail("--threads: expected a non-negative integer"); break;
    case 7: a->json = true; break;
    case 8: a->ignore_eos = true; break;
    case 'h': usage_generate(stdout); return -1;
    default: return usage_generate(stderr);
    }
  }
  if (optind != argc - 1) return usage_generate(stderr);
  if (!a->prompt) return fail("--prompt-ids is required");
  a->plan = argv[optind];
  return 0;
}

typedef struct gen_result {
  int32_t *ids;
  int64_t n;
  const char *finish;
  double load_ms, prefill_ms, decode_ms;
} gen_result;

/* Prefill the prompt, then sample one token per step until EOS, -n, or the context. */
static irt_status run_generate(irt_model *m, const gen_args *a, gen_result *r, irt_error *err) {
  const irt_model_info *info = irt_model_get_info(m);
  irt_seq *s = NULL;
  irt_sampler *smp = NULL;
  float *logits = malloc((size_t)info->vocab_size * sizeof *logits);
  r->ids = malloc((size_t)(a->max_new + 1) * sizeof *r->ids);
  r->finish = "length";
  irt_status st = logits && r->ids ? IRT_OK : IRT_OOM;
  if (st == IRT_OK) st = irt_seq_create(m, &s, err);
  if (st == IRT_OK) st = irt_sampler_create(&a->sampling, info->vocab_size, &smp, err);
  double t0 = now_ms();
  if (st == IRT_OK && a->max_new > 0)
    st = irt_seq_decode(m, s, a->prompt, a->n_prompt, logits, false, err);
  r->prefill_ms = now_ms() - t0;
  t0 = now_ms();
  while (st == IRT_OK && r->n < a->max_new) {
    int32_t tok = irt_sampler_sample(smp, logits);
    r->ids[r->n++] = tok;
    if (!a->ignore_eos && tok == info->eos_token_id) {
      r->finish = "stop";
      break;
    }
    if (r->n == a->max_new || irt_seq_length(s) + 1 >= info->context_length) break;
    st = irt_seq_decode(m, s, &tok, 1, logits, false, err);
  }
  r->decode_ms = now_ms() - t0;
  irt_sampler_destroy(smp);
  irt_seq_destroy(s);
  free(logits);
  return st;
}

static void print_ids(const int32_t *ids, int64_t n) {
  for (int64_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
}

static void print_result(const gen_args *a, const gen_result *r) {
  double pf = r->prefill_ms > 0 ? (double)a->n_prompt / (r->prefill_ms / 1e3) : 0;
  double dc = r->n > 1 && r->decode_ms > 0 ? (double)(r->n - 1) / (r->decode_ms / 1e3) : 0;
  if (!a->json) {
    print_ids(r->ids, r->n);
    printf("\n");
    fprintf(stderr, "inferrt: %lld tokens (%s); load %.1f ms, prefill %.1f tok/s, decode %.1f tok/s\n",
            (long long)r->n, r->finish, r->load_ms, pf, dc);
    return;
  }
  printf("{\"prompt_ids\":[");
  print_ids(a->prompt, a->n_prompt);
  printf("],\"generated_ids\":[");
  print_ids(r->ids, r->n);
  printf("],\"finish_reason\":\"%s\",\"timings\":{\"load_ms\":%.3f,\"prefill_tokens_per_s\":%.3f,"
         "\"decode_tokens_per_s\":%.3f}}\n", r->finish, r->load_ms, pf, dc);
}

static int cmd_generate(int argc, char **argv) {
  gen_args a = {.max_new = 32, .sampling = irt_sampling_default()};
  int rc = parse_generate(argc, argv, &a);
  if (rc) {
    free(a.prompt);
    return rc < 0 ? 0 : rc;
  }
  irt_model_opts o = irt_model_opts_default();
  o.n_threads = a.threads;
  irt_model *m = NULL;
  irt_error err = {0};
  gen_result r = {0};
  double t0 = now_ms();
  irt_status st = irt_model_open(a.plan, &o, &m, &err);
  r.load_ms = now_ms() - t0;
  if (st == IRT_OK && a.n_prompt >= irt_model_get_info(m)->context_length) {
    snprintf(err.msg, sizeof err.msg, "prompt of %lld tokens does not fit the context of %lld",
             (long long)a.n_prompt, (long long)irt_model_get_info(m)->context_length);
    st = IRT_INVALID_ARG;
  }
  if (st == IRT_OK) st = run_generate(m, &a, &r, &err);
  if (st == IRT_OK) print_result(&a, &r);
  else fail(err.msg[0] ? err.msg : irt_status_name(st));
  free(r.ids);
  free(a.prompt);
  irt_model_close(m);
  return st == IRT_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage_main(stderr);
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("inferrt %s\n", INFC_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) return usage_main(stdout);
  if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
  fprintf(stderr, "inferrt: error: unknown command '%s'\n", cmd);
  return usage_main(stderr);
}
