/* cli_generate: `inferrt generate` — prompt ids, text or a chat message in; ids or
 * streamed text out, with EOS and stop strings. Uses only the public API. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define MAX_STOPS 8

typedef struct gen_args {
  const char *plan, *prompt, *chat, *system, *chat_template;
  int32_t *ids;
  int64_t n_ids, max_new;
  irt_sampling sampling;
  int64_t threads;
  const char *device;
  bool no_cuda_graphs;
  irt_kv_dtype kv_dtype;
  const char *stops[MAX_STOPS];
  int n_stops;
  bool json, ignore_eos, no_thinking, allow_special;
  irt_engine_opts spec; /* its speculative decoding fields */
  char *grammar;        /* GBNF from --grammar*, --json-schema* or --json-object (owned) */
  const char *grammar_flag;
  /* what only the engine does (these take run_engine) */
  float presence, frequency, repetition;
  int64_t min_tokens;
  int32_t *stop_ids, *bias_ids;
  float *bias;
  int64_t n_stop_ids, n_bias;
  cli_cuda cuda;
} gen_args;

static int usage(FILE *f) {
  fputs("usage: inferrt generate model.plan (--prompt-ids IDS | --prompt TEXT | --chat MSG) "
        "[options]\n\n"
        "  --prompt-ids IDS     comma-separated token ids\n"
        "  --prompt TEXT        text, tokenized with the plan's tokenizer\n"
        "  --chat MSG           a user message, formatted with the model's chat template\n"
        "  --system MSG         system message for --chat\n"
        "  --chat-template NAME chatml, qwen3, deepseek-r1, llama3, llama3.1, mistral,\n"
        "                       llama2, gemma or phi3 (default: the model's)\n"
        "  --no-thinking        --chat with a thinking template (qwen3): enable_thinking false\n"
        "  --allow-special-in-content\n"
        "                       parse special tokens spelled in --chat/--system (by default\n"
        "                       message text is text; --prompt always parses them)\n"
        "  -n, --max-tokens N   tokens to generate (default 32; --chat: 256)\n"
        "  --temperature T      0 = greedy (default 0)\n"
        "  --top-k K            sample among the K most likely (default: all)\n"
        "  --top-p P            nucleus sampling mass (default 1)\n"
        "  --min-p P            drop tokens under P times the likeliest's probability (0: off)\n"
        "  --seed S             sampling seed (default 0)\n"
        "  --stop STR           stop when the text contains STR (repeatable, up to 8)\n"
        "  --ignore-eos         keep generating after end-of-generation tokens\n"
        "  --presence-penalty X, --frequency-penalty X   OpenAI's penalties, in [-2, 2]\n"
        "  --repetition-penalty X   vLLM's (prompt and output tokens), in (0, 2]; 1: off\n"
        "  --logit-bias ID:B,...    add B in [-100, 100] to token ID's logit\n"
        "  --min-tokens N       no end of generation (nor stop token ids) before N tokens\n"
        "  --stop-token-ids IDS stop at any of these comma-separated token ids\n"
        "  --threads N          CPU threads (default: all cores)\n"
        "  --device DEV         cpu or cuda (default: the plan's target)\n"
        "  --no-cuda-graphs     CUDA: run decode steps kernel by kernel\n" CLI_CUDA_USAGE
        "  --kv-dtype T         " CLI_KV_DTYPE_USAGE "\n"
        "  --spec-tokens K      speculative decoding by prompt lookup: up to K draft tokens\n"
        "                       a step, checked against plain decoding (same output)\n"
        "  --spec-ngram MIN:MAX n-gram sizes it matches, longest first (default 2:4)\n"
        "  --draft PLAN         drafts from a smaller model with the same tokenizer (K 4 by\n"
        "                       default): greedy output unchanged, sampled output exactly\n"
        "                       distributed as without (speculative sampling)\n"
        "  --grammar GBNF       constrain the text to a grammar (llama.cpp's GBNF, rule root)\n"
        "  --grammar-file FILE  the same, read from FILE\n"
        "  --json-schema JSON   constrain the text to JSON values this JSON Schema describes\n"
        "  --json-schema-file FILE   the same, read from FILE\n"
        "  --json-object        constrain the text to a JSON object\n"
        "  --regex RE           constrain the text to match a regular expression whole\n"
        "  --json               print one JSON object with ids, text, finish reason and timings\n",
        f);
  return f == stderr ? 2 : 0;
}

/* --grammar, --grammar-file, --json-schema, --json-schema-file, --json-object, --regex
 * (one of them). */
static int set_grammar(gen_args *a, int c, const char *v) {
  static const char *names[] = {"--grammar",          "--grammar-file", "--json-schema",
                                "--json-schema-file", "--json-object",  "--regex"};
  const char *flag = names[c - 20];
  if (a->grammar) return cli_fail("%s: only one of %s and %s", flag, a->grammar_flag, flag);
  a->grammar_flag = flag;
  size_t len;
  char *text = c == 21 || c == 23 ? cli_read_file(v, &len) : c == 24 ? NULL : strdup(v);
  if ((c == 21 || c == 23) && !text) return cli_fail("%s: cannot read %s", flag, v);
  irt_error err = {0};
  irt_status st = IRT_OK;
  if (c == 20 || c == 21) a->grammar = text, text = NULL;
  else if (c == 25) st = irt_grammar_regex(text, &a->grammar, &err);
  else st = irt_grammar_json(text, &a->grammar, &err);
  free(text);
  if (st == IRT_OK && irt_grammar_check(a->grammar, &err) != IRT_OK) st = err.status;
  return st == IRT_OK ? 0 : cli_fail("%s: %s", flag, err.msg);
}

static int set_penalty(gen_args *a, int c, const char *v) {
  static const char *names[] = {"--presence-penalty", "--frequency-penalty",
                                "--repetition-penalty"};
  char *end;
  float x = strtof(v, &end);
  bool rep = c == 28, ok = !*end && *v && (rep ? x > 0 && x <= 2 : x >= -2 && x <= 2);
  if (!ok)
    return cli_fail("%s: expected a number in %s", names[c - 26], rep ? "(0, 2]" : "[-2, 2]");
  *(c == 26 ? &a->presence : c == 27 ? &a->frequency : &a->repetition) = x;
  return 0;
}

/* --logit-bias ID:BIAS,... */
static int parse_bias(gen_args *a, const char *v) {
  for (const char *p = v; *p;) {
    char *end;
    long long id = strtoll(p, &end, 10);
    float b = end > p && *end == ':' ? strtof(end + 1, &end) : NAN;
    if (!(id >= 0 && id < INT32_MAX && b >= -100 && b <= 100) || (*end && *end != ','))
      return cli_fail(
          "--logit-bias: expected ID:BIAS pairs (BIAS in [-100, 100]), comma-separated");
    int32_t *ids = realloc(a->bias_ids, (size_t)(a->n_bias + 1) * sizeof *ids);
    if (ids) a->bias_ids = ids;
    float *bs = ids ? realloc(a->bias, (size_t)(a->n_bias + 1) * sizeof *bs) : NULL;
    if (!bs) return cli_fail("out of memory");
    a->bias = bs;
    a->bias_ids[a->n_bias] = (int32_t)id, a->bias[a->n_bias++] = b;
    p = *end ? end + 1 : end;
  }
  return 0;
}

static int parse_value(gen_args *a, int c, const char *v) {
  int64_t x;
  char *end;
  switch (c) {
  case 1:
    return cli_parse_ids(v, &a->ids, &a->n_ids)
               ? 0
               : cli_fail("--prompt-ids: expected comma-separated non-negative integers");
  case 'n':
    return cli_parse_i64(v, 0, 1 << 24, &a->max_new)
               ? 0
               : cli_fail("-n: expected a non-negative integer");
  case 2:
    a->sampling.temperature = strtof(v, &end);
    return *end || a->sampling.temperature < 0 ? cli_fail("--temperature: expected a number >= 0")
                                               : 0;
  case 3:
    if (!cli_parse_i64(v, 0, 1 << 30, &x))
      return cli_fail("--top-k: expected a non-negative integer");
    a->sampling.top_k = (int)x;
    return 0;
  case 4:
    a->sampling.top_p = strtof(v, &end);
    return *end || !(a->sampling.top_p > 0 && a->sampling.top_p <= 1)
               ? cli_fail("--top-p: expected a number in (0, 1]")
               : 0;
  case 5:
    a->sampling.seed = strtoull(v, &end, 10);
    return *end ? cli_fail("--seed: expected an integer") : 0;
  case 6:
    return cli_parse_i64(v, 0, 4096, &a->threads)
               ? 0
               : cli_fail("--threads: expected a non-negative integer");
  case 9: a->prompt = v; return 0;
  case 10: a->chat = v; return 0;
  case 11: a->system = v; return 0;
  case 12: a->chat_template = v; return 0;
  case 14: a->device = v; return 0;
  case 16: return cli_parse_kv_dtype(v, &a->kv_dtype);
  case 17: return cli_parse_spec("spec-tokens", v, &a->spec);
  case 18: return cli_parse_spec("spec-ngram", v, &a->spec);
  case 19:
    a->sampling.min_p = strtof(v, &end);
    return *end || !(a->sampling.min_p >= 0 && a->sampling.min_p <= 1)
               ? cli_fail("--min-p: expected a number in [0, 1]")
               : 0;
  case 13:
    if (a->n_stops == MAX_STOPS || !*v)
      return cli_fail("--stop: at most %d non-empty strings", MAX_STOPS);
    a->stops[a->n_stops++] = v;
    return 0;
  case 20:
  case 21:
  case 22:
  case 23:
  case 24:
  case 25: return set_grammar(a, c, v);
  case 26:
  case 27:
  case 28: return set_penalty(a, c, v);
  case 29:
    return cli_parse_i64(v, 0, 1 << 24, &a->min_tokens)
               ? 0
               : cli_fail("--min-tokens: expected a non-negative integer");
  case 30:
    return cli_parse_ids(v, &a->stop_ids, &a->n_stop_ids)
               ? 0
               : cli_fail("--stop-token-ids: expected comma-separated non-negative integers");
  case 31: return parse_bias(a, v);
  default: return usage(stderr);
  }
}

static int parse(int argc, char **argv, gen_args *a) {
  static const struct option longs[] = {{"prompt-ids", required_argument, 0, 1},
                                        {"max-tokens", required_argument, 0, 'n'},
                                        {"temperature", required_argument, 0, 2},
                                        {"top-k", required_argument, 0, 3},
                                        {"top-p", required_argument, 0, 4},
                                        {"seed", required_argument, 0, 5},
                                        {"threads", required_argument, 0, 6},
                                        {"json", no_argument, 0, 7},
                                        {"ignore-eos", no_argument, 0, 8},
                                        {"prompt", required_argument, 0, 9},
                                        {"chat", required_argument, 0, 10},
                                        {"system", required_argument, 0, 11},
                                        {"chat-template", required_argument, 0, 12},
                                        {"stop", required_argument, 0, 13},
                                        {"device", required_argument, 0, 14},
                                        {"no-cuda-graphs", no_argument, 0, 15},
                                        {"kv-dtype", required_argument, 0, 16},
                                        {"spec-tokens", required_argument, 0, 17},
                                        {"spec-ngram", required_argument, 0, 18},
                                        {"min-p", required_argument, 0, 19},
                                        {"grammar", required_argument, 0, 20},
                                        {"grammar-file", required_argument, 0, 21},
                                        {"json-schema", required_argument, 0, 22},
                                        {"json-schema-file", required_argument, 0, 23},
                                        {"json-object", no_argument, 0, 24},
                                        {"regex", required_argument, 0, 25},
                                        {"presence-penalty", required_argument, 0, 26},
                                        {"frequency-penalty", required_argument, 0, 27},
                                        {"repetition-penalty", required_argument, 0, 28},
                                        {"min-tokens", required_argument, 0, 29},
                                        {"stop-token-ids", required_argument, 0, 30},
                                        {"logit-bias", required_argument, 0, 31},
                                        {"no-thinking", no_argument, 0, 32},
                                        {"allow-special-in-content", no_argument, 0, 33},
                                        CLI_DRAFT_LONGOPT,
                                        CLI_CUDA_LONGOPTS,
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  int c, rc;
  a->max_new = -1;
  while ((c = getopt_long(argc, argv, "n:h", longs, NULL)) != -1) {
    if ((rc = cli_cuda_flag(c, optarg, &a->cuda)) >= 0) {
      if (rc) return rc;
      continue;
    }
    if (c == 'h') return usage(stdout) - 1;
    if (c == 7) a->json = true;
    else if (c == 8) a->ignore_eos = true;
    else if (c == 15) a->no_cuda_graphs = true;
    else if (c == 32) a->no_thinking = true;
    else if (c == 33) a->allow_special = true;
    else if (c == 24 && (rc = set_grammar(a, c, NULL))) return rc;
    else if (c == 24) continue;
    else if ((rc = parse_value(a, c, optarg))) return rc;
  }
  if (optind != argc - 1) return usage(stderr);
  if (!!a->ids + !!a->prompt + !!a->chat != 1)
    return cli_fail("give exactly one of --prompt-ids, --prompt and --chat");
  if (a->max_new < 0) a->max_new = a->chat ? 256 : 32;
  a->plan = argv[optind];
  return 0;
}

typedef struct gen_state {
  irt_model *m;
  const irt_tokenizer *tok;
  irt_text_stream *stream;
  int32_t *ctx; /* the prompt, the generated tokens, then room for drafts */
  int32_t *out; /* ctx + the prompt's length */
  int64_t n_out;
  int64_t drafted, kept; /* draft tokens proposed by prompt lookup; kept */
  char *text;
  size_t len, cap, printed;
  const char *finish;
  double load_ms, prefill_ms, decode_ms;
} gen_state;

/* Prompt ids from --prompt-ids, --prompt or --chat. */
static irt_status prompt_ids(gen_args *a, const irt_tokenizer *t, irt_error *err) {
  if (a->ids) return IRT_OK;
  if (!t) {
    snprintf(err->msg, sizeof err->msg,
             "the plan has no tokenizer: use --prompt-ids, or rebuild "
             "it with a tokenizer.json beside the checkpoint");
    return err->status = IRT_INVALID_ARG;
  }
  size_t n = 0;
  irt_status st;
  if (a->chat) {
    irt_chat_message msgs[2] = {{.role = "system", .content = a->system},
                                {.role = "user", .content = a->chat}};
    irt_chat_opts co = {.no_thinking = a->no_thinking};
    st = irt_chat_tokenize(t, a->chat_template, a->system ? msgs : msgs + 1, a->system ? 2 : 1,
                           true, &co, a->allow_special, &a->ids, &n, NULL, err);
  } else {
    st = irt_tokenize_alloc(t, a->prompt, strlen(a->prompt), true, true, &a->ids, &n, err);
  }
  a->n_ids = (int64_t)n;
  return st;
}

/* Longest suffix of s[0..len) that is a proper prefix of some stop string. */
static size_t stop_overlap(const gen_args *a, const char *s, size_t len) {
  size_t best = 0;
  for (int i = 0; i < a->n_stops; i++)
    for (size_t k = strlen(a->stops[i]) - 1; k > best; k--)
      if (k <= len && !memcmp(s + len - k, a->stops[i], k)) {
        best = k;
        break;
      }
  return best;
}

/* Appends the token's text; returns true when a stop string completed. */
static bool add_text(gen_state *g, const gen_args *a, int32_t id) {
  char piece[256];
  size_t n = irt_text_stream_push(g->stream, id, piece, sizeof piece);
  if (n > sizeof piece) n = sizeof piece;
  if (g->len + n + 1 > g->cap) {
    size_t cap = (g->cap + n + 1) * 2;
    char *p = realloc(g->text, cap);
    if (!p) return true;
    g->text = p, g->cap = cap;
  }
  memcpy(g->text + g->len, piece, n);
  g->len += n;
  g->text[g->len] = '\0';
  size_t safe = g->len - stop_overlap(a, g->text, g->len);
  for (int i = 0; i < a->n_stops; i++) {
    char *hit = strstr(g->text, a->stops[i]);
    if (hit && (size_t)(hit - g->text) < safe) safe = (size_t)(hit - g->text);
    if (hit) g->finish = "stop";
  }
  if (!a->json && safe > g->printed) {
    fwrite(g->text + g->printed, 1, safe - g->printed, stdout);
    fflush(stdout);
  }
  if (safe > g->printed) g->printed = safe;
  if (!strcmp(g->finish, "stop")) g->len = g->printed, g->text[g->len] = '\0';
  return !strcmp(g->finish, "stop");
}

static bool is_end(const gen_state *g, const gen_args *a, int32_t tok) {
  if (a->ignore_eos) return false;
  if (g->tok) return irt_token_is_eog(g->tok, tok);
  return tok == irt_model_get_info(g->m)->eos_token_id;
}

/* At the end (not at a stop string, which cuts the text): the bytes of a partial character
 * the stream still holds, as U+FFFD, and what a possible stop string held back. */
static void flush_text(gen_state *g, const gen_args *a) {
  if (!g->stream) return;
  char piece[64];
  size_t n = irt_text_stream_finish(g->stream, piece, sizeof piece);
  if (n > sizeof piece) n = sizeof piece;
  if (g->len + n + 1 > g->cap) {
    size_t cap = (g->cap + n + 1) * 2;
    char *p = realloc(g->text, cap);
    if (!p) return;
    g->text = p, g->cap = cap;
  }
  memcpy(g->text + g->len, piece, n);
  g->len += n;
  g->text[g->len] = '\0';
  if (!a->json && g->len > g->printed) fwrite(g->text + g->printed, 1, g->len - g->printed, stdout);
  g->printed = g->len;
}

/* Records a generated token; true when generation ends with it. */
static bool take(gen_state *g, const gen_args *a, int32_t tok) {
  g->out[g->n_out++] = tok;
  if (is_end(g, a, tok)) {
    g->finish = "stop";
    flush_text(g, a);
    return true;
  }
  if (g->stream && add_text(g, a, tok)) return true;
  if (g->n_out < a->max_new) return false;
  flush_text(g, a);
  return true;
}

/* One step of n tokens whose next token(s) the step picks itself: with all_logits one
 * pick per token (pick j taking draw j ahead), else one pick of the last token's row. */
static irt_status step_pick(irt_model *m, irt_seq *s, const int32_t *tokens, int64_t n,
                            bool all_logits, irt_sampler *smp, irt_pick *pk, irt_error *err) {
  for (int64_t j = 0; j < (all_logits ? n : 1); j++)
    pk[j] = (irt_pick){.sampler = smp, .draw = all_logits ? (int)j + 1 : 0};
  irt_batch_item it = {.seq = s, .tokens = tokens, .n = n, .all_logits = all_logits, .pick = pk};
  return irt_decode_batch(m, &it, 1, err);
}

/* Prefill, then one token a step, each picked in the step (on a GPU the logits stay
 * there); with --spec-tokens, a step also checks the drafts that prompt lookup finds and
 * keeps those the sampler picks itself, row by row: each row takes the draw it would take
 * without drafts, and the generator then skips the rows used, so the tokens (and draws)
 * are exactly those of decoding without drafts. */
static irt_status run(gen_state *g, const gen_args *a, irt_error *err) {
  const irt_model_info *info = irt_model_get_info(g->m);
  int K = a->spec.spec_tokens;
  irt_seq *s = NULL;
  irt_sampler *smp = NULL;
  irt_pick pk[IRT_MAX_SPEC_TOKENS + 1];
  memset(pk, 0, sizeof pk);
  g->ctx = malloc((size_t)(a->n_ids + a->max_new + K + 1) * sizeof *g->ctx);
  irt_status st = g->ctx ? IRT_OK : IRT_OOM;
  if (st == IRT_OK) memcpy(g->ctx, a->ids, (size_t)a->n_ids * sizeof *g->ctx);
  g->out = g->ctx ? g->ctx + a->n_ids : NULL;
  if (st == IRT_OK) st = irt_seq_create(g->m, &s, err);
  if (st == IRT_OK) irt_seq_set_prompt_len(s, a->n_ids);
  if (st == IRT_OK) st = irt_sampler_create(&a->sampling, info->vocab_size, &smp, err);
  double t0 = cli_now_ms();
  /* the prompt in steps of the plan's size, the last one picking the first token */
  int64_t last = a->n_ids - 1 - (a->n_ids - 1) % info->max_step_tokens;
  if (st == IRT_OK && a->max_new > 0 && last > 0)
    st = irt_seq_decode(g->m, s, a->ids, last, NULL, false, err);
  if (st == IRT_OK && a->max_new > 0)
    st = step_pick(g->m, s, a->ids + last, a->n_ids - last, false, smp, pk, err);
  g->prefill_ms = cli_now_ms() - t0;
  t0 = cli_now_ms();
  int32_t tok = pk[0].token;
  while (st == IRT_OK && g->n_out < a->max_new) {
    int64_t len = irt_seq_length(s), n_ctx = a->n_ids + g->n_out + 1;
    if (take(g, a, tok) || len + 1 >= info->context_length) break;
    int64_t cap = K, lim[2] = {a->max_new - g->n_out - 1, info->context_length - len - 2};
    for (int j = 0; j < 2; j++) cap = lim[j] < cap ? lim[j] : cap;
    int d = cap > 0 ? irt_prompt_lookup(g->ctx, n_ctx, a->spec.spec_ngram_min,
                                        a->spec.spec_ngram_max, (int)cap)
                    : 0;
    int32_t draft[IRT_MAX_SPEC_TOKENS];
    memcpy(draft, g->ctx + n_ctx, (size_t)d * sizeof *draft); /* take() overwrites them */
    st = step_pick(g->m, s, g->ctx + n_ctx - 1, 1 + d, d > 0, smp, pk, err);
    tok = pk[0].token;
    if (st != IRT_OK || d == 0) continue;
    g->drafted += d;
    int i = 0;
    bool done = false;
    for (; i < d && !done && pk[i].token == draft[i]; i++) {
      g->kept++;
      done = take(g, a, pk[i].token);
    }
    if (done) break;
    irt_sampler_skip(smp, i + 1);     /* rows 0..i drew */
    tok = pk[i].token;                /* the pick that rejected a draft, or the one after all */
    irt_seq_truncate(s, len + 1 + i); /* the token and the drafts kept */
  }
  g->decode_ms = cli_now_ms() - t0;
  irt_sampler_destroy(smp);
  irt_seq_destroy(s);
  return st;
}

typedef struct eng_run {
  gen_state *g;
  const gen_args *a;
  double t0;
} eng_run;

static void on_event(void *user, const irt_event *ev) {
  eng_run *r = user;
  gen_state *g = r->g;
  if (ev->token >= 0 && g->n_out == 0) g->prefill_ms = cli_now_ms() - r->t0;
  if (ev->token >= 0) g->out[g->n_out++] = ev->token;
  if (ev->text_len && g->len + ev->text_len + 1 > g->cap) {
    size_t cap = (g->cap + ev->text_len + 1) * 2;
    char *p = realloc(g->text, cap);
    if (!p) return;
    g->text = p, g->cap = cap;
  }
  if (ev->text_len) {
    memcpy(g->text + g->len, ev->text, ev->text_len);
    g->len += ev->text_len;
    g->text[g->len] = '\0';
    if (!r->a->json && g->stream) fwrite(ev->text, 1, ev->text_len, stdout), fflush(stdout);
  }
  if (ev->finish) g->finish = ev->finish == IRT_FINISH_STOP ? "stop" : "length";
}

/* Whether the request needs what only the engine does: a grammar's state and masks,
 * penalties, logit_bias, min_tokens, stop token ids. */
static bool needs_engine(const gen_args *a) {
  return a->grammar || a->presence != 0 || a->frequency != 0 ||
         (a->repetition != 0 && a->repetition != 1) || a->min_tokens > 0 || a->n_stop_ids > 0 ||
         a->n_bias > 0;
}

/* One request through the engine (a grammar, penalties, ...: needs_engine). */
static irt_status run_engine(gen_state *g, const gen_args *a, irt_error *err) {
  irt_engine *e = NULL;
  irt_engine_opts eo = a->spec;
  eo.spec_always = true; /* as run() drafts: by the kept-count rule alone */
  g->ctx = malloc((size_t)(a->n_ids + a->max_new + 1) * sizeof *g->ctx);
  if (!g->ctx) return IRT_OOM;
  g->out = g->ctx + a->n_ids;
  eng_run r = {g, a, cli_now_ms()};
  irt_request q = {.prompt_ids = a->ids,
                   .n_prompt = (size_t)a->n_ids,
                   .sampling = a->sampling,
                   .max_tokens = a->max_new,
                   .stop = a->stops,
                   .n_stop = a->n_stops,
                   .ignore_eos = a->ignore_eos,
                   .on_event = on_event,
                   .user = &r,
                   .grammar = a->grammar,
                   .presence_penalty = a->presence,
                   .frequency_penalty = a->frequency,
                   .repetition_penalty = a->repetition,
                   .min_tokens = a->min_tokens,
                   .stop_token_ids = a->stop_ids,
                   .n_stop_token_ids = (int)a->n_stop_ids,
                   .logit_bias_ids = a->bias_ids,
                   .logit_bias = a->bias,
                   .n_logit_bias = (int)a->n_bias};
  irt_status st = irt_engine_create(g->m, &eo, &e, err);
  if (st == IRT_OK && a->max_new > 0) st = irt_engine_submit(e, &q, NULL, err);
  if (st == IRT_OK && a->max_new > 0) st = irt_engine_run(e, err);
  g->decode_ms = cli_now_ms() - r.t0 - g->prefill_ms;
  irt_engine_stats es = {0};
  if (e) irt_engine_get_stats(e, &es);
  g->drafted = es.spec_draft_tokens, g->kept = es.spec_accepted_tokens;
  irt_engine_destroy(e);
  return st;
}

static void add_ids(cJSON *o, const char *key, const int32_t *ids, int64_t n) {
  cJSON *arr = cJSON_AddArrayToObject(o, key);
  for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
}

static void print_result(const gen_args *a, const gen_state *g) {
  double pf = g->prefill_ms > 0 ? (double)a->n_ids / (g->prefill_ms / 1e3) : 0;
  double dc = g->n_out > 1 && g->decode_ms > 0 ? (double)(g->n_out - 1) / (g->decode_ms / 1e3) : 0;
  if (!a->json) {
    if (g->stream) {
      fputc('\n', stdout);
    } else {
      for (int64_t i = 0; i < g->n_out; i++) printf("%s%d", i ? "," : "", g->out[i]);
      putchar('\n');
    }
    fflush(stdout); /* the text first, then the stats line, even through a pipe */
    fprintf(stderr,
            "inferrt: %lld prompt + %lld generated tokens (%s); load %.1f ms, prefill "
            "%.1f tok/s, decode %.1f tok/s\n",
            (long long)a->n_ids, (long long)g->n_out, g->finish, g->load_ms, pf, dc);
    if (g->drafted)
      fprintf(stderr, "inferrt: speculation: %lld draft tokens, %lld kept\n", (long long)g->drafted,
              (long long)g->kept);
    return;
  }
  cJSON *o = cJSON_CreateObject(), *t;
  add_ids(o, "prompt_ids", a->ids, a->n_ids);
  add_ids(o, "generated_ids", g->out, g->n_out);
  if (g->stream) cJSON_AddStringToObject(o, "text", g->text ? g->text : "");
  cJSON_AddStringToObject(o, "finish_reason", g->finish);
  cJSON_AddStringToObject(o, "device", irt_model_get_info(g->m)->device);
  t = cJSON_AddObjectToObject(o, "timings");
  cJSON_AddNumberToObject(t, "load_ms", g->load_ms);
  cJSON_AddNumberToObject(t, "prefill_tokens_per_s", pf);
  cJSON_AddNumberToObject(t, "decode_tokens_per_s", dc);
  if (a->spec.spec_tokens) {
    cJSON_AddNumberToObject(o, "spec_draft_tokens", (double)g->drafted);
    cJSON_AddNumberToObject(o, "spec_accepted_tokens", (double)g->kept);
  }
  char *s = cJSON_PrintUnformatted(o);
  puts(s);
  free(s);
  cJSON_Delete(o);
}

int cmd_generate(int argc, char **argv) {
  gen_args a = {.sampling = irt_sampling_default()};
  int rc = parse(argc, argv, &a);
  if (rc) {
    free(a.ids), free(a.grammar), free(a.stop_ids), free(a.bias_ids), free(a.bias);
    return rc < 0 ? 0 : rc;
  }
  irt_model_opts o = irt_model_opts_default();
  o.n_threads = (int)a.threads;
  o.device = a.device;
  o.no_cuda_graphs = a.no_cuda_graphs;
  if (cli_model_opts(&o, &a.cuda)) return 1;
  o.kv_dtype = a.kv_dtype;
  irt_error err = {0};
  gen_state g = {.finish = "length"};
  double t0 = cli_now_ms();
  irt_status st = cli_model_open(a.plan, &o, &g.m, &err);
  g.load_ms = cli_now_ms() - t0;
  if (st == IRT_OK) {
    g.tok = irt_model_get_tokenizer(g.m);
    bool text_mode = !a.ids;
    st = prompt_ids(&a, g.tok, &err);
    if (st == IRT_OK && text_mode) st = irt_text_stream_create(g.tok, true, &g.stream, &err);
  }
  int64_t ctx = g.m ? irt_model_get_info(g.m)->context_length : 0;
  if (st == IRT_OK && a.n_ids >= ctx) {
    snprintf(err.msg, sizeof err.msg, "prompt of %lld tokens does not fit the context of %lld",
             (long long)a.n_ids, (long long)ctx);
    st = IRT_INVALID_ARG;
  }
  if (st == IRT_OK && a.n_ids == 0) {
    snprintf(err.msg, sizeof err.msg, "the prompt is empty");
    st = IRT_INVALID_ARG;
  }
  if (st == IRT_OK && a.grammar && !g.tok) {
    snprintf(err.msg, sizeof err.msg, "%s needs a plan with a tokenizer", a.grammar_flag);
    st = IRT_INVALID_ARG;
  }
  irt_model *draft = NULL;
  if (st == IRT_OK) st = cli_open_draft(g.m, &o, &a.spec, &draft, &err);
  bool engine = needs_engine(&a) || draft; /* drafts of a model: the engine's */
  if (st == IRT_OK) st = engine ? run_engine(&g, &a, &err) : run(&g, &a, &err);
  if (st == IRT_OK && !engine && strcmp(g.finish, "stop")) flush_text(&g, &a); /* context full */
  if (st == IRT_OK) print_result(&a, &g);
  else cli_fail("%s", err.msg[0] ? err.msg : irt_status_name(st));
  irt_text_stream_destroy(g.stream);
  irt_model_close(draft);
  free(g.ctx), free(g.text), free(a.ids), free(a.grammar);
  free(a.stop_ids), free(a.bias_ids), free(a.bias);
  cli_model_close(g.m);
  return st == IRT_OK ? 0 : 1;
}
