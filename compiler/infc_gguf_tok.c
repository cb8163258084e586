/* infc_gguf_tok: GGUF tokenizer metadata -> irt_tok_spec -> irt_tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infc_gguf_tok.h"

typedef struct gguf_tok_arrays {
  char **tokens, **merges;
  int32_t *types;
  uint64_t n_tokens, n_merges;
  char *chat;
  int32_t eog[2];
} gguf_tok_arrays;

static void free_arrays(gguf_tok_arrays *a) {
  for (uint64_t i = 0; a->tokens && i < a->n_tokens; i++) free(a->tokens[i]);
  for (uint64_t i = 0; a->merges && i < a->n_merges; i++) free(a->merges[i]);
  free(a->tokens), free(a->merges), free(a->types), free(a->chat);
}

/* NUL-terminated copies of a string array. */
static char **copy_strs(const infc_gguf_str *s, uint64_t n) {
  char **out = calloc(n + 1, sizeof *out);
  for (uint64_t i = 0; out && i < n; i++)
    if (!(out[i] = strndup(s[i].ptr ? s[i].ptr : "", s[i].len))) return out;
  return out;
}

static bool has(const infc_gguf *g, const char *key) { return infc_gguf_kv_find(g, key) != NULL; }

static int32_t opt_id(const infc_gguf *g, const char *key) {
  uint32_t v;
  return has(g, key) && infc_gguf_get_u32(g, key, &v, NULL) == IR_OK ? (int32_t)v : -1;
}

static bool opt_bool(const infc_gguf *g, const char *key, bool def) {
  bool v;
  return has(g, key) && infc_gguf_get_bool(g, key, &v, NULL) == IR_OK ? v : def;
}

/* The byte-level pre-tokenizer (and its flags) that tokenizer.ggml.pre names. */
static ir_status pick_pre(const infc_gguf *g, irt_tok_spec *s, ir_diag *d) {
  infc_gguf_str pre = {0};
  s->pre = IRT_TOK_PRE_GPT2;
  if (!has(g, "tokenizer.ggml.pre")) return IR_OK;
  ir_status st = infc_gguf_get_str(g, "tokenizer.ggml.pre", &pre, d);
  if (st != IR_OK) return st;
  if (infc_gguf_str_eq(pre, "default") || infc_gguf_str_eq(pre, "gpt-2")) return IR_OK;
  if (infc_gguf_str_eq(pre, "llama-bpe") || infc_gguf_str_eq(pre, "llama3")) {
    s->pre = IRT_TOK_PRE_LLAMA3;
    s->ignore_merges = true;
  } else if (infc_gguf_str_eq(pre, "qwen2")) {
    s->pre = IRT_TOK_PRE_QWEN2;
    s->nfc = true;
  } else if (infc_gguf_str_eq(pre, "smollm")) {
    s->pre = IRT_TOK_PRE_SMOLLM;
  } else {
    return ir_diag_set(d, IR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%.*s' is not supported "
                       "(default, gpt-2, llama-bpe, llama3, qwen2, smollm)", infc_gguf_path(g),
                       (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
  }
  return IR_OK;
}

static ir_status read_vocab(const infc_gguf *g, irt_tok_spec *s, gguf_tok_arrays *a, ir_diag *d) {
  const infc_gguf_str *toks, *merges;
  const int64_t *types = NULL;
  uint64_t n_types = 0;
  ir_status st = infc_gguf_get_strs(g, "tokenizer.ggml.tokens", &toks, &a->n_tokens, d);
  if (st != IR_OK) return st;
  if (a->n_tokens == 0 || a->n_tokens > INT32_MAX)
    return ir_diag_set(d, IR_BAD_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
                       infc_gguf_path(g), (unsigned long long)a->n_tokens);
  if (!(a->tokens = copy_strs(toks, a->n_tokens))) return ir_diag_set(d, IR_OOM, "out of memory");
  if (has(g, "tokenizer.ggml.merges")) {
    if ((st = infc_gguf_get_strs(g, "tokenizer.ggml.merges", &merges, &a->n_merges, d)) != IR_OK)
      return st;
    if (!(a->merges = copy_strs(merges, a->n_merges))) return ir_diag_set(d, IR_OOM, "out of memory");
  }
  if (has(g, "tokenizer.ggml.token_type") &&
      (st = infc_gguf_get_ints(g, "tokenizer.ggml.token_type", &types, &n_types, d)) != IR_OK)
    return st;
  if (types && n_types != a->n_tokens)
    return ir_diag_set(d, IR_BAD_FORMAT, "%s: %llu token types for %llu tokens", infc_gguf_path(g),
                       (unsigned long long)n_types, (unsigned long long)a->n_tokens);
  if (types && !(a->types = malloc(a->n_tokens * sizeof *a->types)))
    return ir_diag_set(d, IR_OOM, "out of memory");
  for (uint64_t i = 0; types && i < a->n_tokens; i++)
    a->types[i] = types[i] >= 1 && types[i] <= 6 ? (int32_t)types[i] : IRT_TOK_NORMAL;
  s->n_tokens = (int32_t)a->n_tokens;
  s->tokens = (const char *const *)a->tokens;
  s->token_types = a->types;
  s->n_merges = (int32_t)a->n_merges;
  s->merges = (const char *const *)a->merges;
  return IR_OK;
}

static ir_status read_model(const infc_gguf *g, irt_tok_spec *s, ir_diag *d) {
  infc_gguf_str model;
  ir_status st = infc_gguf_get_str(g, "tokenizer.ggml.model", &model, d);
  if (st != IR_OK) return st;
  if (infc_gguf_str_eq(model, "gpt2")) {
    s->model = IRT_TOK_BPE_BYTE_LEVEL;
    s->add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token", false);
    return pick_pre(g, s, d);
  }
  if (infc_gguf_str_eq(model, "llama")) {
    const float *scores = NULL;
    uint64_t n = 0;
    s->model = IRT_TOK_BPE_SPM;
    s->pre = IRT_TOK_PRE_NONE;
    s->byte_fallback = s->fuse_unk = true;
    s->add_prefix_space = opt_bool(g, "tokenizer.ggml.add_space_prefix", true);
    s->add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token", true);
    if (has(g, "tokenizer.ggml.scores") &&
        (st = infc_gguf_get_floats(g, "tokenizer.ggml.scores", &scores, &n, d)) != IR_OK)
      return st;
    s->scores = n == (uint64_t)s->n_tokens ? scores : NULL;
    return IR_OK;
  }
  return ir_diag_set(d, IR_UNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' is not supported (gpt2, "
                     "llama)", infc_gguf_path(g), (int)(model.len > 64 ? 64 : model.len), model.ptr);
}

static void read_specials(const infc_gguf *g, irt_tok_spec *s, gguf_tok_arrays *a) {
  infc_gguf_str tpl;
  s->bos_id = opt_id(g, "tokenizer.ggml.bos_token_id");
  s->eos_id = opt_id(g, "tokenizer.ggml.eos_token_id");
  s->unk_id = opt_id(g, "tokenizer.ggml.unknown_token_id");
  s->pad_id = opt_id(g, "tokenizer.ggml.padding_token_id");
  s->add_eos = opt_bool(g, "tokenizer.ggml.add_eos_token", false);
  int n = 0;
  const char *keys[2] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  for (int i = 0; i < 2; i++)
    if ((a->eog[n] = opt_id(g, keys[i])) >= 0) n++;
  s->eos_ids = n ? a->eog : NULL;
  s->n_eos_ids = n;
  if (has(g, "tokenizer.chat_template") &&
      infc_gguf_get_str(g, "tokenizer.chat_template", &tpl, NULL) == IR_OK)
    a->chat = strndup(tpl.ptr, tpl.len);
  s->chat_template = a->chat;
}

ir_status infc_gguf_tokenizer(const infc_gguf *g, irt_tokenizer **out, ir_diag *d) {
  *out = NULL;
  if (!has(g, "tokenizer.ggml.model")) return IR_OK;
  irt_tok_spec s = {0};
  gguf_tok_arrays a = {0};
  ir_status st = read_vocab(g, &s, &a, d);
  if (st == IR_OK) st = read_model(g, &s, d);
  if (st == IR_OK) {
    read_specials(g, &s, &a);
    st = irt_tok_create(&s, out, d);
  }
  free_arrays(&a);
  if (st != IR_OK) ir_diag_prefix(d, "tokenizer");
  return st;
}

ir_status infc_gguf_tokenizer_blob(const infc_gguf *g, int64_t model_vocab, infc_tok_blob *out,
                                   ir_diag *d) {
  irt_tokenizer *t = NULL;
  memset(out, 0, sizeof *out);
  ir_status st = infc_gguf_tokenizer(g, &t, d);
  if (st != IR_OK || !t) return st;
  if (model_vocab > 0 && irt_tok_vocab_size(t) > model_vocab)
    st = ir_diag_set(d, IR_BAD_FORMAT, "%s: the tokenizer has %d tokens but the model's "
                     "vocabulary has %lld rows", infc_gguf_path(g), irt_tok_vocab_size(t),
                     (long long)model_vocab);
  if (st == IR_OK) st = irt_tok_serialize(t, &out->data, &out->size, d);
  if (st == IR_OK) snprintf(out->origin, sizeof out->origin, "%s (GGUF metadata)", infc_gguf_path(g));
  irt_tok_destroy(t);
  return st;
}

irt_status infc_gguf_open_tokenizer(const char *path, irt_tokenizer **out, irt_error *err) {
  infc_gguf *g = NULL;
  ir_diag d = {0};
  *out = NULL;
  ir_status st = infc_gguf_open(path, &g, &d);
  if (st == IR_OK) st = infc_gguf_tokenizer(g, out, &d);
  if (st == IR_OK && !*out) st = ir_diag_set(&d, IR_INVALID_ARG, "%s has no tokenizer", path);
  infc_gguf_close(g);
  if (st != IR_OK && err) {
    err->status = (irt_status)st;
    snprintf(err->msg, sizeof err->msg, "%s", d.msg);
  }
  return (irt_status)st;
}
