/* srv_openai: OpenAI's JSON shapes for what a job produced: text_completion and
 * chat.completion objects, their streamed chunks (SSE "data: {...}\n\n", ending with
 * "data: [DONE]"), legacy and chat log-probabilities, usage, and error objects. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openai.h"

bool srv_buf_put(srv_buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = (b->len + n + 1) * 2 + 256;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
  return true;
}

void srv_buf_free(srv_buf *b) {
  free(b->p);
  *b = (srv_buf){0};
}

const char *srv_finish_name(irt_finish f) {
  return f == IRT_FINISH_STOP ? "stop" : f == IRT_FINISH_LENGTH ? "length" : "abort";
}

static void add_nullable_string(cJSON *o, const char *k, const char *v) {
  if (v && *v) cJSON_AddStringToObject(o, k, v);
  else cJSON_AddNullToObject(o, k);
}

char *srv_render_error(const srv_error *e) {
  cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
  cJSON_AddStringToObject(er, "message", e->msg);
  cJSON_AddStringToObject(er, "type", e->type ? e->type : "invalid_request_error");
  add_nullable_string(er, "param", e->param);
  add_nullable_string(er, "code", e->code);
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

/* --- token strings -------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  size_t len = s[0] < 0x80             ? 1
               : (s[0] & 0xE0) == 0xC0 ? 2
               : (s[0] & 0xF0) == 0xE0 ? 3
               : (s[0] & 0xF8) == 0xF0 ? 4
                                       : 0;
  if (!len || len > n || (len == 2 && s[0] < 0xC2)) return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  if (len == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))) return 0;
  if (len == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || s[0] > 0xF4 || (s[0] == 0xF4 && s[1] >= 0x90)))
    return 0;
  return len;
}

/* A token as raw bytes (*raw, *n_raw) and as a valid UTF-8 string with U+FFFD for the bytes
 * of partial characters (out, NUL-terminated); returns the string's code point count. */
typedef struct tok_text {
  char raw[256];
  size_t n_raw;
  char str[768];
  int64_t chars;
} tok_text;

static void token_text(const srv_ctx *c, int32_t id, tok_text *t) {
  irt_error err;
  size_t n = 0;
  t->n_raw = 0;
  if (c->tok && irt_detokenize(c->tok, &id, 1, false, t->raw, sizeof t->raw, &n, &err) == IRT_OK)
    t->n_raw = n < sizeof t->raw ? n : sizeof t->raw;
  size_t o = 0;
  t->chars = 0;
  for (size_t i = 0; i < t->n_raw && o + 4 < sizeof t->str;) {
    size_t k = t->raw[i] ? utf8_seq((const unsigned char *)t->raw + i, t->n_raw - i) : 0;
    if (k) memcpy(t->str + o, t->raw + i, k), o += k, i += k;
    else memcpy(t->str + o, "\xEF\xBF\xBD", 3), o += 3, i++;
    t->chars++;
  }
  t->str[o] = '\0';
}

static cJSON *bytes_array(const tok_text *t) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; i < t->n_raw; i++)
    cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)t->raw[i]));
  return a;
}

/* Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...], "refusal": null}.
 */
static cJSON *chat_logprobs(const srv_job *j, const srv_tok *toks, int64_t n) {
  cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
  tok_text t;
  for (int64_t i = 0; i < n; i++) {
    cJSON *e = cJSON_CreateObject(), *tops;
    token_text(j->c, toks[i].id, &t);
    cJSON_AddStringToObject(e, "token", t.str);
    cJSON_AddNumberToObject(e, "logprob", toks[i].logprob);
    cJSON_AddItemToObject(e, "bytes", bytes_array(&t));
    tops = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int k = 0; k < toks[i].n_top && k < j->p.logprobs; k++) {
      cJSON *a = cJSON_CreateObject();
      token_text(j->c, toks[i].top_id[k], &t);
      cJSON_AddStringToObject(a, "token", t.str);
      cJSON_AddNumberToObject(a, "logprob", toks[i].top_lp[k]);
      cJSON_AddItemToObject(a, "bytes", bytes_array(&t));
      cJSON_AddItemToArray(tops, a);
    }
    cJSON_AddItemToArray(content, e);
  }
  cJSON_AddNullToObject(o, "refusal");
  return o;
}

/* Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"};
 * each top dict holds the k alternatives plus the sampled token; a token without a logprob
 * (NAN: the echoed prompt's first) has null for both. Appends to o's lists; *offset
 * advances. */
static void legacy_add(const srv_job *j, cJSON *o, const srv_tok *toks, int64_t n,
                       int64_t *offset) {
  cJSON *tokens = cJSON_GetObjectItemCaseSensitive(o, "tokens"),
        *lps = cJSON_GetObjectItemCaseSensitive(o, "token_logprobs"),
        *tops = cJSON_GetObjectItemCaseSensitive(o, "top_logprobs"),
        *offs = cJSON_GetObjectItemCaseSensitive(o, "text_offset");
  tok_text t;
  for (int64_t i = 0; i < n; i++) {
    token_text(j->c, toks[i].id, &t);
    bool none = isnan(toks[i].logprob);
    cJSON_AddItemToArray(tokens, cJSON_CreateString(t.str));
    cJSON_AddItemToArray(lps, none ? cJSON_CreateNull() : cJSON_CreateNumber(toks[i].logprob));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
    *offset += t.chars;
    if (none) {
      cJSON_AddItemToArray(tops, cJSON_CreateNull());
      continue;
    }
    cJSON *d = cJSON_CreateObject();
    for (int k = 0; k <= toks[i].n_top && k <= j->p.logprobs; k++) {
      bool sampled = k == toks[i].n_top || k == j->p.logprobs;
      token_text(j->c, sampled ? toks[i].id : toks[i].top_id[k], &t);
      if (!cJSON_GetObjectItemCaseSensitive(d, t.str))
        cJSON_AddNumberToObject(d, t.str, sampled ? toks[i].logprob : toks[i].top_lp[k]);
    }
    cJSON_AddItemToArray(tops, d);
  }
}

static cJSON *legacy_logprobs(const srv_job *j, const srv_tok *toks, int64_t n, int64_t *offset) {
  cJSON *o = cJSON_CreateObject();
  const char *keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
  for (int k = 0; k < 4; k++) cJSON_AddArrayToObject(o, keys[k]);
  legacy_add(j, o, toks, n, offset);
  return o;
}

/* --- whole responses -------------------------------------------------------------------- */

/* "tool_calls" when a completion that ended by itself made calls the model chose to make
 * (tool_choice auto or required); a named tool_choice ends with "stop", as OpenAI's does. */
static const char *finish_of(const srv_job *j, const srv_choice *ch, int n_calls) {
  if (n_calls > 0 && ch->finish == IRT_FINISH_STOP && j->p.tools.mode != SRV_TOOLS_NAMED)
    return "tool_calls";
  return srv_finish_name(ch->finish);
}

static cJSON *tool_call_json(const srv_job *j, int choice, int k, const srv_tool_call *c,
                             bool with_index) {
  cJSON *o = cJSON_CreateObject(), *fn;
  char id[32];
  srv_tool_call_id(j->id, choice, k, id);
  if (with_index) cJSON_AddNumberToObject(o, "index", k);
  cJSON_AddStringToObject(o, "id", id);
  cJSON_AddStringToObject(o, "type", "function");
  fn = cJSON_AddObjectToObject(o, "function");
  cJSON_AddStringToObject(fn, "name", c->name);
  cJSON_AddStringToObject(fn, "arguments", c->arguments);
  return o;
}

/* Choice i's thoughts and the rest (without thoughts, all of it is the rest). */
static srv_think think_of(const srv_job *j, const srv_choice *ch, bool final) {
  srv_think t = {.content = 0, .content_end = ch->len};
  if (j->p.ep == SRV_CHAT && j->p.think)
    srv_think_split(ch->text ? ch->text : "", ch->len, j->p.think_open, final, &t);
  return t;
}

/* A chat message: its thoughts (a thinking template's, as reasoning_content), content, and
 * the calls read out of the content when the request has tools. Returns the number of
 * calls. */
static int chat_message(const srv_job *j, int i, cJSON *m) {
  const srv_choice *ch = &j->ch[i];
  const char *all = ch->text ? ch->text : "";
  srv_think th = think_of(j, ch, true);
  const char *text = all + th.content;
  size_t len = ch->len - th.content;
  srv_tool_split sp = {0};
  cJSON_AddStringToObject(m, "role", "assistant");
  if (j->p.think) {
    char *r = th.has ? strndup(all + th.think, th.think_end - th.think) : NULL;
    if (r) cJSON_AddStringToObject(m, "reasoning_content", r);
    else cJSON_AddNullToObject(m, "reasoning_content");
    free(r);
  }
  if (j->p.tools.mode == SRV_TOOLS_NONE ||
      !srv_tools_split(j->p.tools.format, text, len, true, &sp) || sp.n_calls == 0) {
    if (len || !th.has) cJSON_AddStringToObject(m, "content", text);
    else cJSON_AddNullToObject(m, "content"); /* thoughts only (cut off while thinking) */
    cJSON_AddNullToObject(m, "refusal");
    srv_tool_split_free(&sp);
    return 0;
  }
  srv_buf b = {0};
  srv_buf_put(&b, text, sp.content_len);
  srv_buf_put(&b, text + sp.rest, len - sp.rest);
  if (b.len) cJSON_AddStringToObject(m, "content", b.p);
  else cJSON_AddNullToObject(m, "content");
  srv_buf_free(&b);
  cJSON_AddNullToObject(m, "refusal");
  cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
  for (int k = 0; k < sp.n_calls; k++)
    cJSON_AddItemToArray(calls, tool_call_json(j, i, k, &sp.calls[k], false));
  int n = sp.n_calls;
  srv_tool_split_free(&sp);
  return n;
}

static cJSON *envelope(const srv_job *j, bool chunk) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", j->id);
  cJSON_AddStringToObject(o, "object",
                          j->p.ep == SRV_CHAT
                              ? (chunk ? "chat.completion.chunk" : "chat.completion")
                              : "text_completion");
  cJSON_AddNumberToObject(o, "created", (double)j->created);
  cJSON_AddStringToObject(o, "model", j->c->model_name);
  cJSON_AddStringToObject(o, "system_fingerprint", "inferrt-" INFC_VERSION);
  return o;
}

static cJSON *usage(const srv_job *j) {
  int64_t gen = 0;
  for (int i = 0; i < j->p.n; i++) gen += j->ch[i].n_gen;
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->prompt_tokens);
  cJSON_AddNumberToObject(u, "completion_tokens", (double)gen);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(j->prompt_tokens + gen));
  cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
  cJSON_AddNumberToObject(d, "cached_tokens", (double)j->cached_tokens);
  return u;
}

/* best_of's score of a completion: its cumulative logprob over tokens^length_penalty. */
static double score(const srv_job *j, const srv_choice *ch) {
  double len = ch->n_gen > 0 ? (double)ch->n_gen : 1.0;
  return j->p.length_penalty != 0 ? ch->cum_lp / pow(len, j->p.length_penalty) : ch->cum_lp;
}

/* The completions returned, into order (p.n entries of room): all of them, or with best_of
 * the n_return of the highest score, best first (the earlier among equal scores). Returns
 * how many. */
static int returned(const srv_job *j, int *order) {
  const int n = j->p.n_return > 0 ? j->p.n_return : j->p.n;
  for (int i = 0; i < j->p.n; i++) order[i] = i;
  for (int k = 0; j->p.n_return > 0 && k < n; k++) { /* selection: n_return of at most max_n */
    int best = k;
    for (int i = k + 1; i < j->p.n; i++)
      if (score(j, &j->ch[order[i]]) > score(j, &j->ch[order[best]]) ||
          (score(j, &j->ch[order[i]]) == score(j, &j->ch[order[best]]) && order[i] < order[best]))
        best = i;
    int t = order[k];
    order[k] = order[best], order[best] = t;
  }
  return n;
}

cJSON *srv_render_response(srv_job *j) {
  pthread_mutex_lock(&j->mu);
  cJSON *o = envelope(j, false), *choices = cJSON_AddArrayToObject(o, "choices");
  int *order = malloc((size_t)j->p.n * sizeof *order);
  int n_out = order ? returned(j, order) : 0;
  if (!order) cJSON_AddStringToObject(o, "error", "out of memory");
  for (int k = 0; k < n_out; k++) {
    const int i = order[k];
    const srv_choice *ch = &j->ch[i];
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", k);
    int n_calls = 0;
    if (j->p.ep == SRV_CHAT) {
      n_calls = chat_message(j, i, cJSON_AddObjectToObject(c, "message"));
    } else if (j->p.echo) { /* the prompt, then the completion */
      char *t = malloc(strlen(j->p.echo_text) + ch->len + 1);
      if (t) sprintf(t, "%s%s", j->p.echo_text, ch->text ? ch->text : "");
      cJSON_AddStringToObject(c, "text", t ? t : "");
      free(t);
    } else {
      cJSON_AddStringToObject(c, "text", ch->text ? ch->text : "");
    }
    int64_t offset = 0;
    cJSON *lp = NULL;
    if (j->p.logprobs >= 0 && j->p.ep == SRV_CHAT) {
      lp = chat_logprobs(j, ch->toks, ch->n_toks);
    } else if (j->p.logprobs >= 0) {
      lp = legacy_logprobs(j, j->ptoks, j->n_ptoks, &offset); /* echo: the prompt's first */
      legacy_add(j, lp, ch->toks, ch->n_toks, &offset);
    }
    if (lp) cJSON_AddItemToObject(c, "logprobs", lp);
    else cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish_of(j, ch, n_calls));
    cJSON_AddItemToArray(choices, c);
  }
  free(order);
  cJSON_AddItemToObject(o, "usage", usage(j));
  pthread_mutex_unlock(&j->mu);
  return o;
}

/* --- streaming ---------------------------------------------------------------------------- */

static void put_event(srv_buf *out, cJSON *o) {
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!s) return;
  srv_buf_put(out, "data: ", 6);
  srv_buf_put(out, s, strlen(s));
  srv_buf_put(out, "\n\n", 2);
  free(s);
}

/* One chunk for choice i: role (chat's first), new text and logprobs, or the finish. */
static void put_chunk(const srv_job *j, srv_buf *out, int i, const char *role, const char *text,
                      size_t len, cJSON *logprobs, const char *finish) {
  cJSON *o = envelope(j, true), *choices = cJSON_AddArrayToObject(o, "choices"),
        *c = cJSON_CreateObject();
  cJSON_AddNumberToObject(c, "index", i);
  char *t = strndup(text ? text : "", len);
  if (j->p.ep == SRV_CHAT) {
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (role) cJSON_AddStringToObject(d, "role", role);
    if (role || len || logprobs) cJSON_AddStringToObject(d, "content", t ? t : "");
  } else {
    cJSON_AddStringToObject(c, "text", t ? t : "");
  }
  free(t);
  if (logprobs) cJSON_AddItemToObject(c, "logprobs", logprobs);
  else cJSON_AddNullToObject(c, "logprobs");
  if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
  else cJSON_AddNullToObject(c, "finish_reason");
  cJSON_AddItemToArray(choices, c);
  if (j->p.include_usage) cJSON_AddNullToObject(o, "usage");
  put_event(out, o);
}

/* Sends a chat chunk for choice i with the given delta (thoughts or a call), its logprobs
 * (NULL: none) and no finish. */
static void put_delta_chunk(const srv_job *j, srv_buf *out, int i, cJSON *delta, cJSON *logprobs) {
  cJSON *o = envelope(j, true), *choices = cJSON_AddArrayToObject(o, "choices"),
        *c = cJSON_CreateObject();
  cJSON_AddNumberToObject(c, "index", i);
  cJSON_AddItemToObject(c, "delta", delta);
  if (logprobs) cJSON_AddItemToObject(c, "logprobs", logprobs);
  else cJSON_AddNullToObject(c, "logprobs");
  cJSON_AddNullToObject(c, "finish_reason");
  cJSON_AddItemToArray(choices, c);
  if (j->p.include_usage) cJSON_AddNullToObject(o, "usage");
  put_event(out, o);
}

/* A chunk of choice i's thoughts (delta.reasoning_content, as vLLM streams them). */
static void put_think_chunk(const srv_job *j, srv_buf *out, int i, const char *text, size_t len,
                            cJSON *logprobs) {
  cJSON *d = cJSON_CreateObject();
  char *t = strndup(text, len);
  cJSON_AddStringToObject(d, "reasoning_content", t ? t : "");
  free(t);
  put_delta_chunk(j, out, i, d, logprobs);
}

/* A chunk with one whole tool call (OpenAI's delta.tool_calls, which clients accumulate). */
static void put_call_chunk(const srv_job *j, srv_buf *out, int i, int k,
                           const srv_tool_call *call) {
  cJSON *d = cJSON_CreateObject();
  cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"),
                       tool_call_json(j, i, k, call, true));
  put_delta_chunk(j, out, i, d, NULL);
}

/* The logprobs of choice i's tokens not streamed yet (NULL if none or not asked). */
static cJSON *new_logprobs(srv_job *j, srv_choice *ch) {
  if (j->p.logprobs < 0 || ch->n_toks <= ch->sent_toks) return NULL;
  cJSON *lp = j->p.ep == SRV_CHAT
                  ? chat_logprobs(j, ch->toks + ch->sent_toks, ch->n_toks - ch->sent_toks)
                  : legacy_logprobs(j, ch->toks + ch->sent_toks, ch->n_toks - ch->sent_toks,
                                    &ch->sent_offset);
  ch->sent_toks = ch->n_toks;
  return lp;
}

/* New text and logprobs of choice i: thoughts (a thinking template's), then the content
 * before any call (held back while it may be the start of one), each call once its block
 * closes, and at the end what follows a block that is not a call. */
static void stream_text(srv_job *j, srv_buf *out, int i) {
  srv_choice *ch = &j->ch[i];
  const char *all = ch->text ? ch->text : "";
  bool tools = j->p.ep == SRV_CHAT && j->p.tools.mode != SRV_TOOLS_NONE, fin = ch->finish != 0;
  srv_think th = think_of(j, ch, fin);
  if (ch->sent_think < th.think) ch->sent_think = th.think;
  if (th.has && th.think_end > ch->sent_think) {
    put_think_chunk(j, out, i, all + ch->sent_think, th.think_end - ch->sent_think,
                    new_logprobs(j, ch));
    ch->sent_think = th.think_end;
  }
  /* the rest: offsets below are into it, sent_len into the whole text */
  const char *text = all + th.content;
  size_t len = th.content_end - th.content;
  if (ch->sent_len < th.content) ch->sent_len = th.content;
  srv_tool_split sp = {.content_len = len, .rest = len};
  if (tools && !srv_tools_split(j->p.tools.format, text, len, fin, &sp)) return;
  size_t upto = th.content + sp.content_len, rest = th.content + sp.rest;
  if (upto < ch->sent_len) upto = ch->sent_len;
  bool new_toks = j->p.logprobs >= 0 && ch->n_toks > ch->sent_toks;
  if (upto > ch->sent_len || new_toks) {
    put_chunk(j, out, i, NULL, all + ch->sent_len, upto - ch->sent_len, new_logprobs(j, ch), NULL);
    ch->sent_len = upto;
  }
  for (; ch->sent_calls < sp.n_calls; ch->sent_calls++)
    put_call_chunk(j, out, i, ch->sent_calls, &sp.calls[ch->sent_calls]);
  if (tools && fin && rest < ch->len && !ch->sent_rest) {
    put_chunk(j, out, i, NULL, all + rest, ch->len - rest, NULL, NULL);
    ch->sent_rest = true;
  }
  srv_tool_split_free(&sp);
}

static void stream_choice(srv_job *j, srv_buf *out, int i) {
  srv_choice *ch = &j->ch[i];
  if (j->p.echo && !ch->sent_echo) { /* first the prompt, with its logprobs once scored */
    bool lp = j->p.logprobs >= 0;
    if (lp && j->n_ptoks < j->p.n_prompt && !j->done) return;
    put_chunk(j, out, i, NULL, j->p.echo_text, strlen(j->p.echo_text),
              lp ? legacy_logprobs(j, j->ptoks, j->n_ptoks, &ch->sent_offset) : NULL, NULL);
    ch->sent_echo = true;
  }
  if (j->p.ep == SRV_CHAT && !ch->sent_role) {
    put_chunk(j, out, i, "assistant", "", 0, NULL, NULL);
    ch->sent_role = true;
  }
  stream_text(j, out, i);
  if (ch->finish && !ch->sent_finish && !j->failed) {
    put_chunk(j, out, i, NULL, "", 0, NULL, finish_of(j, ch, ch->sent_calls));
    ch->sent_finish = true;
  }
}

bool srv_render_stream(srv_job *j, srv_buf *out) {
  pthread_mutex_lock(&j->mu);
  for (int i = 0; i < j->p.n; i++) stream_choice(j, out, i);
  bool done = j->done;
  if (done && j->failed) {
    srv_error e;
    srv_fail(&e, 500, "server_error", NULL, NULL,
             "The engine failed while generating this response.");
    char *s = srv_render_error(&e);
    srv_buf_put(out, "data: ", 6);
    srv_buf_put(out, s, strlen(s));
    srv_buf_put(out, "\n\n", 2);
    free(s);
  }
  if (done && j->p.include_usage && !j->failed) {
    cJSON *o = envelope(j, true);
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage(j));
    put_event(out, o);
  }
  if (done) srv_buf_put(out, "data: [DONE]\n\n", 14);
  pthread_mutex_unlock(&j->mu);
  return done;
}
