/* fmt_gguf_tok: GGUF tokenizer metadata -> tok_spec -> irt_tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_gguf_tok.h"
#include "ir_alloc.h"

typedef struct gguf_tok_arrays {
  char **tokens, **merges;
  int32_t *types;
  uint64_t n_tokens, n_merges;
  char *chat;
  int32_t eog[2];
} gguf_tok_arrays;

static void free_arrays(gguf_tok_arrays *a) {
  for (uint64_t i = 0; a->tokens && i < a->n_tokens; i++) ir_free(a->tokens[i]);
  for (uint64_t i = 0; a->merges && i < a->n_merges; i++) ir_free(a->merges[i]);
  ir_free(a->tokens), ir_free(a->merges), ir_free(a->types), ir_free(a->chat);
}

/* NUL-terminated copies of a string array; a string holding a NUL byte is refused (a token
 * is text: a NUL would cut it short in every C string that later holds it). */
static ir_status copy_strs(const fmt_gguf *g, const char *key, const fmt_gguf_str *s, uint64_t n,
                           char ***out, ir_diag *d) {
  if (!(*out = ir_calloc(n + 1, sizeof **out))) return ir_diag_set(d, IR_OOM, "out of memory");
  for (uint64_t i = 0; i < n; i++) {
    if (s[i].len && memchr(s[i].ptr, 0, s[i].len))
      return ir_diag_set(d, IR_BAD_FORMAT, "%s: %s[%llu] holds a NUL byte", fmt_gguf_path(g), key,
                         (unsigned long long)i);
    if (!((*out)[i] = ir_strndup(s[i].ptr ? s[i].ptr : "", s[i].len)))
      return ir_diag_set(d, IR_OOM, "out of memory");
  }
  return IR_OK;
}

static bool has(const fmt_gguf *g, const char *key) { return fmt_gguf_kv_find(g, key) != NULL; }

/* An optional token id: absent is -1; present, it must be an unsigned integer naming one of
 * the n_tokens tokens (a wrong type or an id past the vocabulary is refused, not ignored). */
static ir_status opt_id(const fmt_gguf *g, const char *key, int32_t n_tokens, int32_t *out,
                        ir_diag *d) {
  uint32_t v;
  *out = -1;
  if (!has(g, key)) return IR_OK;
  ir_status st = fmt_gguf_get_u32(g, key, &v, d);
  if (st != IR_OK) return st;
  if (v >= (uint32_t)n_tokens)
    return ir_diag_set(d, IR_BAD_FORMAT, "%s: %s is %u, past the %d tokens", fmt_gguf_path(g), key,
                       v, n_tokens);
  *out = (int32_t)v;
  return IR_OK;
}

static ir_status opt_bool(const fmt_gguf *g, const char *key, bool *v, ir_diag *d) {
  return has(g, key) ? fmt_gguf_get_bool(g, key, v, d) : IR_OK;
}

/* The byte-level pre-tokenizer (and its flags) that tokenizer.ggml.pre names. */
static ir_status pick_pre(const fmt_gguf *g, tok_spec *s, ir_diag *d) {
  fmt_gguf_str pre = {0};
  s->pre = TOK_PRE_GPT2;
  if (!has(g, "tokenizer.ggml.pre")) return IR_OK;
  ir_status st = fmt_gguf_get_str(g, "tokenizer.ggml.pre", &pre, d);
  if (st != IR_OK) return st;
  if (fmt_gguf_str_eq(pre, "default") || fmt_gguf_str_eq(pre, "gpt-2")) return IR_OK;
  if (fmt_gguf_str_eq(pre, "llama-bpe") || fmt_gguf_str_eq(pre, "llama3")) {
    s->pre = TOK_PRE_LLAMA3;
    s->ignore_merges = true;
  } else if (fmt_gguf_str_eq(pre, "qwen2")) {
    s->pre = TOK_PRE_QWEN2;
    s->nfc = true;
  } else if (fmt_gguf_str_eq(pre, "smollm")) {
    s->pre = TOK_PRE_SMOLLM;
  } else {
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "%s: tokenizer.ggml.pre '%.*s' is not supported "
                       "(default, gpt-2, llama-bpe, llama3, qwen2, smollm)",
                       fmt_gguf_path(g), (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
  }
  return IR_OK;
}

static ir_status read_vocab(const fmt_gguf *g, tok_spec *s, gguf_tok_arrays *a, ir_diag *d) {
  const fmt_gguf_str *toks, *merges;
  const int64_t *types = NULL;
  uint64_t n_types = 0;
  ir_status st = fmt_gguf_get_strs(g, "tokenizer.ggml.tokens", &toks, &a->n_tokens, d);
  if (st != IR_OK) return st;
  if (a->n_tokens == 0 || a->n_tokens > INT32_MAX)
    return ir_diag_set(d, IR_BAD_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries",
                       fmt_gguf_path(g), (unsigned long long)a->n_tokens);
  if ((st = copy_strs(g, "tokenizer.ggml.tokens", toks, a->n_tokens, &a->tokens, d)) != IR_OK)
    return st;
  if (has(g, "tokenizer.ggml.merges")) {
    if ((st = fmt_gguf_get_strs(g, "tokenizer.ggml.merges", &merges, &a->n_merges, d)) != IR_OK)
      return st;
    if (a->n_merges > INT32_MAX)
      return ir_diag_set(d, IR_BAD_FORMAT, "%s: tokenizer.ggml.merges has %llu entries",
                         fmt_gguf_path(g), (unsigned long long)a->n_merges);
    st = copy_strs(g, "tokenizer.ggml.merges", merges, a->n_merges, &a->merges, d);
    if (st != IR_OK) return st;
  }
  if (has(g, "tokenizer.ggml.token_type") &&
      (st = fmt_gguf_get_ints(g, "tokenizer.ggml.token_type", &types, &n_types, d)) != IR_OK)
    return st;
  if (types && n_types != a->n_tokens)
    return ir_diag_set(d, IR_BAD_FORMAT, "%s: %llu token types for %llu tokens", fmt_gguf_path(g),
                       (unsigned long long)n_types, (unsigned long long)a->n_tokens);
  if (types && !(a->types = ir_malloc(a->n_tokens * sizeof *a->types)))
    return ir_diag_set(d, IR_OOM, "out of memory");
  for (uint64_t i = 0; types && i < a->n_tokens;
       i++) { /* llama.cpp's enum: 0 undefined .. 6 byte */
    if (types[i] < 0 || types[i] > 6)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "%s: tokenizer.ggml.token_type[%llu] is %lld, not a "
                         "token type (0-6)",
                         fmt_gguf_path(g), (unsigned long long)i, (long long)types[i]);
    a->types[i] = types[i] >= 1 ? (int32_t)types[i] : TOK_NORMAL;
  }
  s->n_tokens = (int32_t)a->n_tokens;
  s->tokens = (const char *const *)a->tokens;
  s->token_types = a->types;
  s->n_merges = (int32_t)a->n_merges;
  s->merges = (const char *const *)a->merges;
  return IR_OK;
}

static ir_status read_model(const fmt_gguf *g, tok_spec *s, ir_diag *d) {
  fmt_gguf_str model;
  ir_status st = fmt_gguf_get_str(g, "tokenizer.ggml.model", &model, d);
  if (st != IR_OK) return st;
  if (fmt_gguf_str_eq(model, "gpt2")) {
    s->model = TOK_BPE_BYTE_LEVEL;
    s->add_bos = false;
    if ((st = opt_bool(g, "tokenizer.ggml.add_bos_token", &s->add_bos, d)) != IR_OK) return st;
    return pick_pre(g, s, d);
  }
  if (fmt_gguf_str_eq(model, "llama")) {
    const float *scores = NULL;
    uint64_t n = 0;
    s->model = TOK_BPE_SPM;
    s->pre = TOK_PRE_NONE;
    s->byte_fallback = s->fuse_unk = true;
    s->add_prefix_space = s->add_bos = true;
    if ((st = opt_bool(g, "tokenizer.ggml.add_space_prefix", &s->add_prefix_space, d)) != IR_OK ||
        (st = opt_bool(g, "tokenizer.ggml.add_bos_token", &s->add_bos, d)) != IR_OK)
      return st;
    if (has(g, "tokenizer.ggml.scores") &&
        (st = fmt_gguf_get_floats(g, "tokenizer.ggml.scores", &scores, &n, d)) != IR_OK)
      return st;
    if (scores && n != (uint64_t)s->n_tokens)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "%s: tokenizer.ggml.scores has %llu entries for %d "
                         "tokens",
                         fmt_gguf_path(g), (unsigned long long)n, s->n_tokens);
    s->scores = scores;
    return IR_OK;
  }
  return ir_diag_set(d, IR_UNSUPPORTED,
                     "%s: tokenizer.ggml.model '%.*s' is not supported (gpt2, "
                     "llama)",
                     fmt_gguf_path(g), (int)(model.len > 64 ? 64 : model.len), model.ptr);
}

static ir_status read_specials(const fmt_gguf *g, tok_spec *s, gguf_tok_arrays *a, ir_diag *d) {
  static const char *const id_keys[4] = {
      "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
      "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};
  int32_t *ids[4] = {&s->bos_id, &s->eos_id, &s->unk_id, &s->pad_id};
  ir_status st = IR_OK;
  for (int i = 0; i < 4 && st == IR_OK; i++) st = opt_id(g, id_keys[i], s->n_tokens, ids[i], d);
  s->add_eos = false;
  if (st == IR_OK) st = opt_bool(g, "tokenizer.ggml.add_eos_token", &s->add_eos, d);
  int n = 0;
  const char *keys[2] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  for (int i = 0; i < 2 && st == IR_OK; i++)
    if ((st = opt_id(g, keys[i], s->n_tokens, &a->eog[n], d)) == IR_OK && a->eog[n] >= 0) n++;
  s->eos_ids = n ? a->eog : NULL;
  s->n_eos_ids = n;
  fmt_gguf_str tpl;
  if (st == IR_OK && has(g, "tokenizer.chat_template") &&
      (st = fmt_gguf_get_str(g, "tokenizer.chat_template", &tpl, d)) == IR_OK) {
    if (tpl.len && memchr(tpl.ptr, 0, tpl.len))
      return ir_diag_set(d, IR_BAD_FORMAT, "%s: tokenizer.chat_template holds a NUL byte",
                         fmt_gguf_path(g));
    if (!(a->chat = ir_strndup(tpl.ptr, tpl.len))) return ir_diag_set(d, IR_OOM, "out of memory");
  }
  s->chat_template = a->chat;
  return st;
}

ir_status fmt_gguf_tokenizer(const fmt_gguf *g, irt_tokenizer **out, ir_diag *d) {
  *out = NULL;
  if (!has(g, "tokenizer.ggml.model")) return IR_OK;
  tok_spec s = {0};
  gguf_tok_arrays a = {0};
  ir_status st = read_vocab(g, &s, &a, d);
  if (st == IR_OK) st = read_model(g, &s, d);
  if (st == IR_OK) st = read_specials(g, &s, &a, d);
  if (st == IR_OK) st = tok_create(&s, out, d);
  free_arrays(&a);
  if (st != IR_OK) ir_diag_prefix(d, "tokenizer");
  return st;
}
