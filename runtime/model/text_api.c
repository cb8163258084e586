/* text_api: the public text API (tokenize, detokenize, streaming, chat formatting) over the
 * internal tokenizer and chat-template modules. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "fmt_gguf_tok.h"
#include "model.h"
#include "ir_alloc.h"

struct irt_text_stream {
  tok_stream s;
};

static irt_status done(irt_error *err, ir_status st, const ir_diag *d) {
  if (st != IR_OK) rt_error_from_diag(err, d);
  return rt_status_from_ir(st);
}

irt_status irt_tokenizer_open_json(const char *json, const char *config, irt_tokenizer **out,
                                   irt_error *err) {
  ir_diag d = {0};
  return done(err, tok_load_hf(json, config, out, &d), &d);
}

irt_status irt_tokenizer_open_gguf(const char *path, irt_tokenizer **out, irt_error *err) {
  fmt_gguf *g = NULL;
  ir_diag d = {0};
  *out = NULL;
  ir_status st = fmt_gguf_open(path, &g, &d);
  if (st == IR_OK) st = fmt_gguf_tokenizer(g, out, &d);
  if (st == IR_OK && !*out) st = ir_diag_set(&d, IR_INVALID_ARG, "%s has no tokenizer", path);
  fmt_gguf_close(g);
  return done(err, st, &d);
}

irt_status irt_tokenizer_open_plan(const char *path, irt_tokenizer **out, irt_error *err) {
  ir_diag d = {0};
  ir_plan *p = NULL;
  *out = NULL;
  ir_status st = ir_plan_open(path, IR_PLAN_VERIFY_META, &p, &d);
  if (st == IR_OK) st = model_plan_tokenizer(p, out, &d);
  if (st == IR_OK && !*out)
    st = ir_diag_set(&d, IR_INVALID_ARG,
                     "%s: the plan has no tokenizer (build it with a "
                     "tokenizer.json beside the checkpoint, or pass --tokenizer)",
                     path);
  ir_plan_close(p);
  return done(err, st, &d);
}

void irt_tokenizer_destroy(irt_tokenizer *t) { tok_destroy(t); }

irt_status irt_tokenize(const irt_tokenizer *t, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *ids, size_t cap, size_t *out_n,
                        irt_error *err) {
  ir_diag d = {0};
  return done(err, tok_encode(t, text, len, add_special, parse_special, ids, cap, out_n, &d), &d);
}

irt_status irt_tokenize_alloc(const irt_tokenizer *t, const char *text, size_t len,
                              bool add_special, bool parse_special, int32_t **ids, size_t *out_n,
                              irt_error *err) {
  ir_diag d = {0};
  return done(err, tok_encode_alloc(t, text, len, add_special, parse_special, ids, out_n, &d), &d);
}

irt_status irt_detokenize(const irt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                          char *buf, size_t cap, size_t *out_len, irt_error *err) {
  ir_diag d = {0};
  return done(err, tok_decode(t, ids, n, skip_special, buf, cap, out_len, &d), &d);
}

irt_status irt_detokenize_alloc(const irt_tokenizer *t, const int32_t *ids, size_t n,
                                bool skip_special, char **out, size_t *out_len, irt_error *err) {
  size_t cap = n * 64 + 64, len = 0; /* a guess; once more at the exact size past it */
  char *buf = ir_malloc(cap);
  irt_status st = buf ? irt_detokenize(t, ids, n, skip_special, buf, cap, &len, err) : IRT_OOM;
  if (st == IRT_OK && len >= cap) {
    char *p = ir_realloc(buf, cap = len + 1);
    st = p ? irt_detokenize(t, ids, n, skip_special, buf = p, cap, &len, err) : IRT_OOM;
  }
  if (st == IRT_OOM && err) *err = (irt_error){.status = IRT_OOM, .msg = "out of memory"};
  if (st != IRT_OK) {
    ir_free(buf);
    return st;
  }
  buf[len] = 0;
  *out = buf, *out_len = len;
  return IRT_OK;
}

bool irt_token_is_eog(const irt_tokenizer *t, int32_t id) { return tok_is_eog(t, id); }

int32_t irt_tokenizer_vocab_size(const irt_tokenizer *t) { return tok_vocab_size(t); }

irt_status irt_text_stream_create(const irt_tokenizer *t, bool skip_special, irt_text_stream **out,
                                  irt_error *err) {
  irt_text_stream *s = ir_calloc(1, sizeof *s);
  if (!s) {
    if (err) *err = (irt_error){.status = IRT_OOM, .msg = "out of memory"};
    return IRT_OOM;
  }
  tok_stream_init(&s->s, t, skip_special);
  *out = s;
  return IRT_OK;
}

void irt_text_stream_destroy(irt_text_stream *s) { ir_free(s); }

size_t irt_text_stream_push(irt_text_stream *s, int32_t id, char *buf, size_t cap) {
  return tok_stream_push(&s->s, id, buf, cap);
}

size_t irt_text_stream_finish(irt_text_stream *s, char *buf, size_t cap) {
  return tok_stream_finish(&s->s, buf, cap);
}

/* The family from a name or from the tokenizer's template; BOS text from the vocabulary. */
static ir_status pick_template(const irt_tokenizer *t, const char *name, chat_tmpl *ct,
                               ir_diag *d) {
  if (name) {
    memset(ct, 0, sizeof *ct);
    ct->kind = chat_kind_from_name(name);
    if (ct->kind == CHAT_UNKNOWN)
      return ir_diag_set(d, IR_INVALID_ARG,
                         "unknown chat template '%s' (chatml, qwen3, "
                         "deepseek-r1, llama3, llama3.1, mistral, llama2, gemma, phi3)",
                         name);
    if (ct->kind == CHAT_LLAMA31) snprintf(ct->date, sizeof ct->date, "%s", CHAT_LLAMA31_DATE);
    if (ct->kind != CHAT_CHATML && ct->kind != CHAT_PHI3 && tok_bos(t) >= 0) {
      size_t n = 0;
      int32_t bos = tok_bos(t);
      tok_decode(t, &bos, 1, false, ct->bos, sizeof ct->bos - 1, &n, d);
      ct->bos[n < sizeof ct->bos ? n : sizeof ct->bos - 1] = '\0';
    }
    return IR_OK;
  }
  return chat_template_detect(tok_chat_template(t), ct, d);
}

irt_status irt_chat_get_info(const irt_tokenizer *t, const char *name, irt_chat_info *out,
                             irt_error *err) {
  ir_diag d = {0};
  chat_tmpl ct;
  ir_status st = pick_template(t, name, &ct, &d);
  memset(out, 0, sizeof *out);
  if (st == IR_OK) {
    snprintf(out->family, sizeof out->family, "%s", chat_kind_name(ct.kind));
    snprintf(out->default_system, sizeof out->default_system, "%s", ct.default_system);
    out->thinks = ct.kind == CHAT_QWEN3 || ct.kind == CHAT_DEEPSEEK_R1;
  }
  return done(err, st, &d);
}

irt_status irt_chat_format_opts(const irt_tokenizer *t, const char *name,
                                const irt_chat_message *msgs, size_t n, bool gen,
                                const irt_chat_opts *opts, char *buf, size_t cap, size_t *out_len,
                                irt_error *err) {
  ir_diag d = {0};
  chat_tmpl ct;
  ir_status st = pick_template(t, name, &ct, &d);
  _Static_assert(sizeof(irt_chat_message) == sizeof(chat_msg), "same layout");
  ct.tools = opts && opts->tools;
  ct.no_thinking = opts && opts->no_thinking;
  if (st == IR_OK) st = chat_render(&ct, (const chat_msg *)msgs, n, gen, buf, cap, out_len, &d);
  return done(err, st, &d);
}

irt_status irt_chat_tokenize(const irt_tokenizer *t, const char *name, const irt_chat_message *msgs,
                             size_t n, bool gen, const irt_chat_opts *opts, bool allow_special,
                             int32_t **ids, size_t *n_ids, char **text_out, irt_error *err) {
  ir_diag d = {0};
  chat_tmpl ct;
  *ids = NULL, *n_ids = 0;
  if (text_out) *text_out = NULL;
  ir_status st = pick_template(t, name, &ct, &d);
  ct.tools = opts && opts->tools;
  ct.no_thinking = opts && opts->no_thinking;
  size_t cap = 4096, len = 0, n_spans = 0;
  for (size_t i = 0; i < n; i++)
    cap += (msgs[i].content ? strlen(msgs[i].content) : 0) +
           (msgs[i].reasoning ? strlen(msgs[i].reasoning) : 0) + 64;
  char *buf = NULL;
  chat_span *spans = ir_calloc(2 * n + 2, sizeof *spans);
  if (st == IR_OK && !spans) st = ir_diag_set(&d, IR_OOM, "out of memory");
  for (int pass = 0; st == IR_OK && pass < 2; pass++) { /* again when the estimate was short */
    ir_free(buf);
    if (!(buf = ir_malloc(cap + 1))) {
      st = ir_diag_set(&d, IR_OOM, "out of memory");
      break;
    }
    st = chat_render_spans(&ct, (const chat_msg *)msgs, n, gen, buf, cap + 1, &len, spans,
                           2 * n + 2, &n_spans, &d);
    if (st != IR_OK || len <= cap) break;
    cap = len;
  }
  _Static_assert(sizeof(chat_span) == sizeof(tok_span), "same layout");
  if (st == IR_OK)
    st = tok_encode_spans_alloc(t, buf, len, false, true,
                                allow_special ? NULL : (const tok_span *)spans,
                                allow_special ? 0 : n_spans, ids, n_ids, &d);
  ir_free(spans);
  if (st == IR_OK && text_out) *text_out = buf, buf = NULL;
  ir_free(buf);
  return done(err, st, &d);
}

irt_status irt_chat_format_tools(const irt_tokenizer *t, const char *name,
                                 const irt_chat_message *msgs, size_t n, bool gen, char *buf,
                                 size_t cap, size_t *out_len, irt_error *err) {
  irt_chat_opts o = {.tools = true};
  return irt_chat_format_opts(t, name, msgs, n, gen, &o, buf, cap, out_len, err);
}

irt_status irt_chat_format(const irt_tokenizer *t, const char *name, const irt_chat_message *msgs,
                           size_t n, bool gen, char *buf, size_t cap, size_t *out_len,
                           irt_error *err) {
  return irt_chat_format_opts(t, name, msgs, n, gen, NULL, buf, cap, out_len, err);
}
