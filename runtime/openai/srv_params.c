/* srv_params: an OpenAI request body (completions or chat) to validated engine parameters.
 * Every refusal names the field (OpenAI's "param") and says what was expected; JSON null
 * counts as absent. Prompts are tokenized here so that length limits give a 400 with the
 * real counts before anything reaches the engine. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openai.h"

#define MAX_STOPS 16
#define MAX_STOP_LEN 256

bool srv_fail(srv_error *e, int status, const char *type, const char *code, const char *param,
              const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  e->status = status;
  e->type = type;
  e->code = code;
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return false;
}

bool srv_bad(srv_error *e, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  e->status = 400;
  e->type = "invalid_request_error";
  e->code = NULL;
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return false;
}

static const char *type_name(const cJSON *v) {
  return cJSON_IsString(v)   ? "a string"
         : cJSON_IsNumber(v) ? "a number"
         : cJSON_IsBool(v)   ? "a boolean"
         : cJSON_IsArray(v)  ? "an array"
         : cJSON_IsObject(v) ? "an object"
                             : "null";
}

bool srv_bad_type(srv_error *e, const char *k, const char *want, const cJSON *v) {
  return srv_bad(e, k, "Invalid type for '%s': expected %s, but got %s instead.", k, want,
                 type_name(v));
}

const cJSON *srv_field(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool is_int(const cJSON *v) {
  return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
         fabs(v->valuedouble) < 9e15;
}

/* Optional integer in [lo, hi]; *out unchanged when absent. */
static bool get_int(const cJSON *o, const char *k, int64_t lo, int64_t hi, int64_t *out,
                    srv_error *e) {
  const cJSON *v = srv_field(o, k);
  if (!v) return true;
  if (!is_int(v)) return srv_bad_type(e, k, "an integer", v);
  if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
    return srv_bad(e, k, "Invalid value for '%s': %.0f is outside [%lld, %lld].", k, v->valuedouble,
                   (long long)lo, (long long)hi);
  *out = (int64_t)v->valuedouble;
  return true;
}

static bool get_num(const cJSON *o, const char *k, double lo, double hi, float *out, srv_error *e) {
  const cJSON *v = srv_field(o, k);
  if (!v) return true;
  if (!cJSON_IsNumber(v)) return srv_bad_type(e, k, "a number", v);
  if (!(v->valuedouble >= lo && v->valuedouble <= hi))
    return srv_bad(e, k, "Invalid value for '%s': %g is outside [%g, %g].", k, v->valuedouble, lo,
                   hi);
  *out = (float)v->valuedouble;
  return true;
}

static bool get_bool(const cJSON *o, const char *k, bool *out, srv_error *e) {
  const cJSON *v = srv_field(o, k);
  if (!v) return true;
  if (!cJSON_IsBool(v)) return srv_bad_type(e, k, "a boolean", v);
  *out = cJSON_IsTrue(v);
  return true;
}

static bool check_model(srv_ctx *c, const cJSON *body, srv_error *e) {
  const cJSON *v = srv_field(body, "model");
  if (!v) return true; /* the one served model */
  if (!cJSON_IsString(v)) return srv_bad_type(e, "model", "a string", v);
  if (strcmp(v->valuestring, c->model_name))
    return srv_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                    "The model '%.200s' does not exist; this server serves '%.200s'.",
                    v->valuestring, c->model_name);
  return true;
}

/* --- prompts ---------------------------------------------------------------------------- */

static bool tokenize(srv_ctx *c, const char *text, bool add_special, const char *param,
                     srv_params *p, srv_error *e) {
  if (!c->tok)
    return srv_bad(e, param, "The served plan has no tokenizer: send the prompt as token ids.");
  size_t n = 0;
  irt_error err = {0};
  irt_status st =
      irt_tokenize_alloc(c->tok, text, strlen(text), add_special, true, &p->prompt, &n, &err);
  if (st == IRT_OOM) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  if (st != IRT_OK) return srv_bad(e, param, "Cannot tokenize '%s': %s", param, err.msg);
  p->n_prompt = (int64_t)n;
  return true;
}

/* An array of token ids within the vocabulary, as *out (owned, n + 1 long) and *n_out;
 * refusals name param. */
static bool take_ids(srv_ctx *c, const cJSON *arr, const char *param, int32_t **out, int64_t *n_out,
                     srv_error *e) {
  int n = cJSON_GetArraySize(arr);
  int32_t *ids = *out = malloc(((size_t)n + 1) * sizeof *ids);
  if (!ids) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  int k = 0;
  for (const cJSON *v = arr->child; v; v = v->next, k++) {
    if (!is_int(v))
      return srv_bad(e, param,
                     "Invalid type for '%s[%d]': expected a token id, but got %s instead.", param,
                     k, type_name(v));
    if (v->valuedouble < 0 || v->valuedouble >= (double)c->info->vocab_size)
      return srv_bad(e, param,
                     "Invalid value for '%s[%d]': token id %.0f is outside the vocabulary of "
                     "%lld.",
                     param, k, v->valuedouble, (long long)c->info->vocab_size);
    ids[k] = (int32_t)v->valuedouble;
  }
  *n_out = n;
  return true;
}

/* "prompt": a string, an array of token ids, or a one-element array of either. */
static bool parse_prompt(srv_ctx *c, const cJSON *body, srv_params *p, srv_error *e) {
  const cJSON *v = srv_field(body, "prompt");
  if (!v) return srv_bad(e, "prompt", "Missing required parameter: 'prompt'.");
  if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
      (cJSON_IsString(v->child) || cJSON_IsArray(v->child)))
    v = v->child;
  else if (cJSON_IsArray(v) && v->child && (cJSON_IsString(v->child) || cJSON_IsArray(v->child)))
    return srv_bad(e, "prompt", "Only one prompt per request is supported; send several requests.");
  if (cJSON_IsString(v) && p->echo && !(p->echo_text = strdup(v->valuestring)))
    return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  if (cJSON_IsString(v)) return tokenize(c, v->valuestring, true, "prompt", p, e);
  if (!cJSON_IsArray(v)) return srv_bad_type(e, "prompt", "a string or an array of token ids", v);
  if (!v->child) return srv_bad(e, "prompt", "Invalid value for 'prompt': the prompt is empty.");
  if (!take_ids(c, v, "prompt", &p->prompt, &p->n_prompt, e)) return false;
  size_t n = 0;
  irt_error ie = {0};
  if (p->echo && !c->tok)
    return srv_bad(e, "echo", "'echo' of a token-id prompt needs a tokenizer; the plan has none.");
  if (p->echo && irt_detokenize_alloc(c->tok, p->prompt, (size_t)p->n_prompt, false, &p->echo_text,
                                      &n, &ie) != IRT_OK)
    return srv_fail(e, 500, "server_error", NULL, NULL, "cannot detokenize: %s", ie.msg);
  return true;
}

/* vLLM's chat_template_kwargs: the template's variables; enable_thinking is the one the
 * renderer has (thinking templates), others are accepted and, as a template would that does
 * not read them, unused. */
static bool parse_template_kwargs(const cJSON *body, srv_params *p, srv_error *e) {
  const cJSON *kw = srv_field(body, "chat_template_kwargs");
  if (!kw) return true;
  if (!cJSON_IsObject(kw)) return srv_bad_type(e, "chat_template_kwargs", "an object", kw);
  const cJSON *think = srv_field(kw, "enable_thinking");
  if (think && !cJSON_IsBool(think))
    return srv_bad_type(e, "chat_template_kwargs.enable_thinking", "a boolean", think);
  p->no_thinking = think && cJSON_IsFalse(think);
  return true;
}

/* Whether the rendered prompt leaves the model inside a thought block (a template that
 * opens the turn with "<think>" itself). */
static bool ends_in_thought(const char *text, size_t len) {
  while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) len--;
  return len >= 7 && !memcmp(text + len - 7, "<think>", 7);
}

static bool parse_messages(srv_ctx *c, const cJSON *body, const srv_tools *tools, srv_params *p,
                           srv_error *e) {
  const cJSON *v = srv_field(body, "messages");
  if (!v) return srv_bad(e, "messages", "Missing required parameter: 'messages'.");
  if (!cJSON_IsArray(v)) return srv_bad_type(e, "messages", "an array", v);
  if (!v->child) return srv_bad(e, "messages", "Invalid value for 'messages': the array is empty.");
  if (!c->tok)
    return srv_bad(e, "messages",
                   "The served plan has no tokenizer: use /v1/completions with token ids.");
  irt_chat_info info;
  irt_error err = {0};
  if (irt_chat_get_info(c->tok, c->chat_template, &info, &err) != IRT_OK)
    return srv_bad(e, "messages", "Cannot format the conversation: %s", err.msg);
  if (!parse_template_kwargs(body, p, e)) return false;
  p->think = info.thinks && !c->no_reasoning;
  srv_chat chat;
  if (!srv_chat_build(v, tools, &info, &chat, e)) return false;
  char *text = NULL;
  bool ok = true;
  size_t n = 0;
  irt_chat_opts opts = {.tools = tools->mode != SRV_TOOLS_NONE, .no_thinking = p->no_thinking};
  irt_status st = irt_chat_tokenize(c->tok, c->chat_template, chat.msgs, (size_t)chat.n, true,
                                    &opts, c->allow_special, &p->prompt, &n, &text, &err);
  if (st == IRT_OOM) ok = srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  else if (st != IRT_OK) ok = srv_bad(e, "messages", "Cannot format the conversation: %s", err.msg);
  p->n_prompt = (int64_t)n;
  if (ok) p->think_open = p->think && ends_in_thought(text, strlen(text));
  srv_chat_free(&chat);
  free(text);
  return ok;
}

/* --- sampling and output ------------------------------------------------------------------ */

static bool parse_stop(const cJSON *body, srv_params *p, srv_error *e) {
  const cJSON *v = srv_field(body, "stop");
  if (!v) return true;
  const cJSON *one = cJSON_IsString(v) ? v : NULL;
  if (!one && !cJSON_IsArray(v))
    return srv_bad_type(e, "stop", "a string or an array of strings", v);
  int n = one ? 1 : cJSON_GetArraySize(v);
  if (n > MAX_STOPS)
    return srv_bad(e, "stop", "Invalid value for 'stop': at most %d strings.", MAX_STOPS);
  p->stop = calloc((size_t)n + 1, sizeof *p->stop);
  if (!p->stop) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  for (const cJSON *s = one ? one : v->child; s && p->n_stop < n; s = s->next) {
    if (!cJSON_IsString(s)) return srv_bad_type(e, "stop", "a string or an array of strings", s);
    size_t len = strlen(s->valuestring);
    if (len == 0 || len > MAX_STOP_LEN)
      return srv_bad(e, "stop", "Invalid value for 'stop': each string needs 1 to %d bytes.",
                     MAX_STOP_LEN);
    if (!(p->stop[p->n_stop++] = strdup(s->valuestring)))
      return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  }
  return true;
}

static bool parse_logprobs(srv_endpoint ep, const cJSON *body, srv_params *p, srv_error *e) {
  int64_t k = -1;
  if (ep == SRV_COMPLETIONS) {
    if (!get_int(body, "logprobs", 0, IRT_MAX_TOP_LOGPROBS, &k, e)) return false;
    p->logprobs = (int)k;
    return true;
  }
  bool on = false;
  if (!get_bool(body, "logprobs", &on, e)) return false;
  if (!get_int(body, "top_logprobs", 0, IRT_MAX_TOP_LOGPROBS, &k, e)) return false;
  if (k >= 0 && !on)
    return srv_bad(e, "top_logprobs",
                   "Invalid value for 'top_logprobs': it needs 'logprobs' set to true.");
  p->logprobs = on ? (k > 0 ? (int)k : 0) : -1;
  return true;
}

static bool parse_sampling(srv_ctx *c, const cJSON *body, srv_params *p, srv_error *e) {
  int64_t top_k = 0, n = 1, seed = -1;
  p->sampling = irt_sampling_default();
  p->sampling.temperature = 1.0f;
  if (!get_num(body, "temperature", 0, 2, &p->sampling.temperature, e)) return false;
  const cJSON *tp = srv_field(body, "top_p");
  if (tp && cJSON_IsNumber(tp) && tp->valuedouble <= 0)
    return srv_bad(e, "top_p", "Invalid value for 'top_p': it must be greater than 0.");
  if (!get_num(body, "top_p", 0, 1, &p->sampling.top_p, e)) return false;
  if (!get_num(body, "min_p", 0, 1, &p->sampling.min_p, e)) return false;
  if (!get_int(body, "top_k", -1, 1 << 30, &top_k, e)) return false;
  p->sampling.top_k = top_k > 0 ? (int)top_k : 0;
  if (!get_int(body, "seed", INT64_MIN / 2, INT64_MAX / 2, &seed, e)) return false;
  p->sampling.seed = srv_field(body, "seed")
                         ? (uint64_t)seed
                         : c->id_salt ^ (atomic_fetch_add(&c->next_id, 1) * 0x9e3779b97f4a7c15ull);
  if (!get_int(body, "n", 1, c->max_n, &n, e)) return false;
  p->n = (int)n;
  int64_t best_of = n; /* completions: sample best_of, return the n that score highest */
  if (!get_int(body, "best_of", 1, c->max_n, &best_of, e)) return false;
  if (best_of < n)
    return srv_bad(e, "best_of", "'best_of' must be greater than or equal to 'n' (%d < %d).",
                   (int)best_of, (int)n);
  if (best_of > n) p->n_return = (int)n, p->n = (int)best_of;
  if (!get_num(body, "length_penalty", -10, 10, &p->length_penalty, e)) return false;
  if (!get_num(body, "presence_penalty", -2, 2, &p->presence_penalty, e)) return false;
  if (!get_num(body, "frequency_penalty", -2, 2, &p->frequency_penalty, e)) return false;
  p->repetition_penalty = 1;
  const cJSON *rp = srv_field(body, "repetition_penalty");
  if (rp && cJSON_IsNumber(rp) && rp->valuedouble <= 0)
    return srv_bad(e, "repetition_penalty",
                   "Invalid value for 'repetition_penalty': it must be greater than 0.");
  if (!get_num(body, "repetition_penalty", 0, 2, &p->repetition_penalty, e)) return false;
  if (!get_int(body, "min_tokens", 0, INT32_MAX, &p->min_tokens, e)) return false;
  if (!get_bool(body, "include_stop_str_in_output", &p->include_stop_str, e)) return false;
  return get_bool(body, "ignore_eos", &p->ignore_eos, e);
}

/* vLLM's stop_token_ids: an array of token ids within the vocabulary. */
static bool parse_stop_ids(srv_ctx *c, const cJSON *body, srv_params *p, srv_error *e) {
  const cJSON *v = srv_field(body, "stop_token_ids");
  if (!v) return true;
  if (!cJSON_IsArray(v)) return srv_bad_type(e, "stop_token_ids", "an array of token ids", v);
  if (cJSON_GetArraySize(v) > IRT_MAX_STOP_TOKEN_IDS)
    return srv_bad(e, "stop_token_ids", "Invalid value for 'stop_token_ids': at most %d ids.",
                   IRT_MAX_STOP_TOKEN_IDS);
  int64_t n = 0;
  bool ok = take_ids(c, v, "stop_token_ids", &p->stop_ids, &n, e);
  p->n_stop_ids = (int)n;
  return ok;
}

/* logit_bias: {"token id": bias in [-100, 100], ...}, ids within the vocabulary. */
static bool parse_logit_bias(srv_ctx *c, const cJSON *body, srv_params *p, srv_error *e) {
  const cJSON *lb = srv_field(body, "logit_bias"), *it;
  if (!lb) return true;
  if (!cJSON_IsObject(lb)) return srv_bad_type(e, "logit_bias", "an object", lb);
  int n = cJSON_GetArraySize(lb);
  if (n > IRT_MAX_LOGIT_BIAS)
    return srv_bad(e, "logit_bias", "Invalid value for 'logit_bias': %d tokens; at most %d.", n,
                   IRT_MAX_LOGIT_BIAS);
  if (n == 0) return true;
  p->bias_ids = malloc((size_t)n * sizeof *p->bias_ids);
  p->bias = malloc((size_t)n * sizeof *p->bias);
  if (!p->bias_ids || !p->bias)
    return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  cJSON_ArrayForEach(it, lb) {
    char *end = NULL;
    long long id = strtoll(it->string, &end, 10);
    if (!*it->string || *end || id < 0 || id >= c->info->vocab_size)
      return srv_bad(e, "logit_bias",
                     "Invalid key in 'logit_bias': '%.40s' is not a token id in [0, %lld).",
                     it->string, (long long)c->info->vocab_size);
    if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
      return srv_bad(e, "logit_bias",
                     "Invalid value in 'logit_bias' for token %lld: expected a number in "
                     "[-100, 100].",
                     id);
    for (int i = 0; i < p->n_bias; i++)
      if (p->bias_ids[i] == (int32_t)id)
        return srv_bad(e, "logit_bias", "Invalid 'logit_bias': token %lld appears twice.", id);
    p->bias_ids[p->n_bias] = (int32_t)id;
    p->bias[p->n_bias++] = (float)it->valuedouble;
  }
  return true;
}

static bool parse_stream(const cJSON *body, srv_params *p, srv_error *e) {
  if (!get_bool(body, "stream", &p->stream, e)) return false;
  const cJSON *so = srv_field(body, "stream_options");
  if (!so) return true;
  if (!cJSON_IsObject(so)) return srv_bad_type(e, "stream_options", "an object", so);
  if (!p->stream)
    return srv_bad(e, "stream_options",
                   "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
  const cJSON *iu = srv_field(so, "include_usage");
  if (iu && !cJSON_IsBool(iu))
    return srv_bad_type(e, "stream_options.include_usage", "a boolean", iu);
  p->include_usage = iu && cJSON_IsTrue(iu);
  return true;
}

/* Fields this server does not implement are refused rather than silently ignored. */
static bool refuse_unsupported(const cJSON *body, srv_endpoint ep, srv_error *e) {
  const cJSON *v;
  if ((v = srv_field(body, "user")) && !cJSON_IsString(v))
    return srv_bad_type(e, "user", "a string", v);
  if (ep == SRV_COMPLETIONS && (v = srv_field(body, "suffix")))
    return srv_bad(e, "suffix", "'suffix' is not supported.");
  if (ep == SRV_COMPLETIONS &&
      ((v = srv_field(body, "tools")) || (v = srv_field(body, "tool_choice"))))
    return srv_bad(e, v->string, "'%s' belongs to /v1/chat/completions.", v->string);
  if ((v = srv_field(body, "functions")) || (v = srv_field(body, "function_call")))
    return srv_bad(e, v->string,
                   "'%s' (the legacy form of function calling) is not supported: "
                   "use 'tools' and 'tool_choice'.",
                   v->string);
  if ((v = srv_field(body, "use_beam_search")) && !cJSON_IsFalse(v))
    return srv_bad(e, "use_beam_search", "Beam search is not supported.");
  if ((v = srv_field(body, "skip_special_tokens")) && !cJSON_IsTrue(v))
    return srv_bad(e, "skip_special_tokens",
                   "Only 'skip_special_tokens': true is supported (special tokens have no text).");
  const cJSON *bo = srv_field(body, "best_of"), *n = srv_field(body, "n");
  if (ep == SRV_CHAT && bo &&
      (!is_int(bo) || bo->valuedouble != (n && is_int(n) ? n->valuedouble : 1)))
    return srv_bad(e, "best_of", "'best_of' belongs to /v1/completions.");
  return true;
}

/* The grammar a field asks for: GBNF text (*gbnf, malloc'd), or false with e set. */
static bool grammar_of(const char *k, const cJSON *v, char **gbnf, srv_error *e) {
  irt_error ie = {0};
  irt_status st = IRT_OK;
  *gbnf = NULL;
  if (!strcmp(k, "response_format")) {
    const cJSON *t = cJSON_IsObject(v) ? srv_field(v, "type") : NULL;
    if (!cJSON_IsString(t))
      return srv_bad(e, k,
                     "Invalid value for 'response_format': expected an object with a 'type'.");
    if (!strcmp(t->valuestring, "text")) return true;
    if (!strcmp(t->valuestring, "json_object")) {
      st = irt_grammar_json(NULL, gbnf, &ie);
    } else if (!strcmp(t->valuestring, "json_schema")) {
      const cJSON *js = srv_field(v, "json_schema"), *sc = js ? srv_field(js, "schema") : NULL;
      if (!cJSON_IsObject(js) || !sc)
        return srv_bad(e, "response_format.json_schema",
                       "Invalid value for 'response_format': type 'json_schema' needs "
                       "'json_schema': {\"name\": ..., \"schema\": {...}}.");
      k = "response_format.json_schema.schema", v = sc;
    } else {
      return srv_bad(e, k,
                     "Invalid value for 'response_format.type': '%.40s' (expected 'text', "
                     "'json_object' or 'json_schema').",
                     t->valuestring);
    }
  }
  if (!*gbnf && st == IRT_OK) {
    if (!strcmp(k, "guided_grammar") || !strcmp(k, "grammar")) {
      if (!cJSON_IsString(v)) return srv_bad_type(e, k, "a string (GBNF)", v);
      if (!(*gbnf = strdup(v->valuestring)))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    } else if (!strcmp(k, "guided_regex")) {
      if (!cJSON_IsString(v)) return srv_bad_type(e, k, "a string (a regular expression)", v);
      st = irt_grammar_regex(v->valuestring, gbnf, &ie);
    } else if (!strcmp(k, "guided_choice")) {
      int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
      const char **ch = calloc((size_t)(n ? n : 1), sizeof *ch);
      if (!ch) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
      int i = 0;
      for (const cJSON *x = n ? v->child : NULL; x; x = x->next)
        ch[i++] = cJSON_IsString(x) ? x->valuestring : NULL;
      for (i = 0; i < n && ch[i]; i++) {}
      if (n == 0 || i < n) {
        free(ch);
        return srv_bad_type(e, k, "a non-empty array of strings", v);
      }
      st = irt_grammar_choice(ch, n, gbnf, &ie);
      free(ch);
    } else { /* a JSON Schema: guided_json, json_schema, response_format's */
      if (cJSON_IsString(v) && !strcmp(k, "guided_json")) {
        st = irt_grammar_json(v->valuestring, gbnf, &ie);
      } else if (cJSON_IsObject(v) || cJSON_IsBool(v)) {
        char *schema = cJSON_PrintUnformatted(v);
        st = schema ? irt_grammar_json(schema, gbnf, &ie) : IRT_OOM;
        free(schema);
      } else {
        return srv_bad_type(e, k, "a JSON Schema object", v);
      }
    }
  }
  if (st != IRT_OK) return srv_bad(e, k, "Invalid '%s': %s", k, ie.msg);
  if (*gbnf && irt_grammar_check(*gbnf, &ie) != IRT_OK) { /* this field's 400, not a 500 */
    free(*gbnf), *gbnf = NULL;
    return srv_bad(e, k, "Invalid '%s': %s", k, ie.msg);
  }
  return true;
}

/* Constrained decoding: OpenAI's response_format, vLLM's guided_json / guided_choice /
 * guided_regex / guided_grammar, llama.cpp's grammar / json_schema; at most one of them. */
static bool parse_grammar(srv_ctx *c, const cJSON *body, srv_params *p, srv_error *e) {
  static const char *keys[] = {"response_format", "guided_json", "guided_choice", "guided_regex",
                               "guided_grammar",  "grammar",     "json_schema"};
  const char *seen = NULL;
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    const cJSON *v = srv_field(body, keys[i]);
    if (!v) continue;
    if (seen) return srv_bad(e, keys[i], "'%s' and '%s' cannot be given together.", seen, keys[i]);
    seen = keys[i];
    if (!grammar_of(keys[i], v, &p->grammar, e)) return false;
    if (p->grammar && !c->tok)
      return srv_bad(e, keys[i],
                     "Constrained decoding needs a tokenizer; the served plan has none.");
  }
  return true;
}

/* The request's tools, in the form of the served template's family. */
static bool take_tools(srv_ctx *c, const cJSON *body, srv_tools *t, srv_error *e) {
  if (!srv_tools_parse(body, t, e)) return false;
  irt_chat_info info;
  irt_error err = {0};
  if (t->mode != SRV_TOOLS_NONE && c->tok &&
      irt_chat_get_info(c->tok, c->chat_template, &info, &err) == IRT_OK) {
    if (!strcmp(info.family, "deepseek-r1")) /* its own call tokens: not written yet */
      return srv_bad(e, "tools",
                     "Function calling is not supported with this model's chat "
                     "template (deepseek-r1).");
    t->format = srv_tool_format_of(info.family);
  }
  return true;
}

/* tool_choice "required" or a named tool: the completion is calls, by a grammar. */
static bool parse_tools(srv_ctx *c, const cJSON *body, srv_params *p, srv_error *e) {
  if (!take_tools(c, body, &p->tools, e)) return false;
  if (p->tools.mode != SRV_TOOLS_REQUIRED && p->tools.mode != SRV_TOOLS_NAMED) return true;
  if (p->grammar)
    return srv_bad(e, "tool_choice",
                   "A 'tool_choice' of 'required' or a named tool decides the "
                   "completion's form itself: drop 'response_format' / 'guided_*' / 'grammar'.");
  if (!c->tok)
    return srv_bad(e, "tool_choice", "Tool calls need a tokenizer; the served plan has none.");
  return srv_tools_grammar(&p->tools, &p->grammar, e);
}

/* vLLM's truncate_prompt_tokens: only the prompt's last k tokens are kept. */
static bool truncate_prompt(const cJSON *body, srv_params *p, srv_error *e) {
  int64_t k = 0;
  if (!get_int(body, "truncate_prompt_tokens", 1, INT32_MAX, &k, e)) return false;
  if (k == 0 || p->n_prompt <= k) return true;
  if (p->echo)
    return srv_bad(e, "truncate_prompt_tokens",
                   "'truncate_prompt_tokens' cannot be combined with 'echo'.");
  memmove(p->prompt, p->prompt + (p->n_prompt - k), (size_t)k * sizeof *p->prompt);
  p->n_prompt = k;
  return true;
}

/* Length limits: the prompt must leave room, and so must the asked-for completion. */
static bool parse_lengths(srv_ctx *c, srv_endpoint ep, const cJSON *body, srv_params *p,
                          srv_error *e) {
  int64_t ctx = c->info->context_length, room = ctx - p->n_prompt, max = -1;
  const char *what = ep == SRV_CHAT ? "messages" : "prompt";
  if (p->n_prompt == 0)
    return srv_bad(e, what, "Invalid value for '%s': the prompt is empty.", what);
  if (room <= 0)
    return srv_fail(e, 400, "invalid_request_error", "context_length_exceeded", what,
                    "This model's maximum context length is %lld tokens. However, your %s has %lld "
                    "tokens. Please reduce the length of the %s.",
                    (long long)ctx, ep == SRV_CHAT ? "messages" : "prompt", (long long)p->n_prompt,
                    what);
  const char *key = ep == SRV_CHAT && srv_field(body, "max_completion_tokens")
                        ? "max_completion_tokens"
                        : "max_tokens";
  if (!get_int(body, key, p->echo ? 0 : 1, INT32_MAX, &max, e)) return false;
  if (max == 0) { /* echo alone: the prompt (and its logprobs), no completion */
    p->echo_only = true;
    p->max_tokens = 1;
    return true;
  }
  if (max > room)
    return srv_fail(e, 400, "invalid_request_error", "context_length_exceeded", key,
                    "This model's maximum context length is %lld tokens. However, you requested "
                    "%lld tokens (%lld in the %s, %lld for the completion). Please reduce the "
                    "length of the %s or the completion.",
                    (long long)ctx, (long long)(p->n_prompt + max), (long long)p->n_prompt, what,
                    (long long)max, what);
  p->max_tokens = max > 0 ? max : ep == SRV_COMPLETIONS && room > 16 ? 16 : room;
  if (p->min_tokens > p->max_tokens)
    return srv_bad(e, "min_tokens",
                   "Invalid value for 'min_tokens': %lld is more than the %lld "
                   "tokens of the completion.",
                   (long long)p->min_tokens, (long long)p->max_tokens);
  if (p->min_tokens > 0 && p->grammar)
    return srv_bad(e, "min_tokens", "'min_tokens' cannot be combined with constrained decoding.");
  return true;
}

/* The JSON object of a request body; NULL with *e set when it is not one. */
static cJSON *parse_body(const char *body, size_t len, srv_error *e) {
  cJSON *j = cJSON_ParseWithLength(body, len);
  if (!j) {
    srv_bad(e, NULL,
            "We could not parse the JSON body of your request. The body must "
            "be a JSON object (see the OpenAI API reference).");
    return NULL;
  }
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    srv_bad(e, NULL, "The request body must be a JSON object.");
    return NULL;
  }
  return j;
}

bool srv_params_from_json(srv_ctx *c, srv_endpoint ep, const cJSON *body, srv_params *p,
                          srv_error *err) {
  memset(p, 0, sizeof *p);
  p->ep = ep;
  p->logprobs = -1;
  bool ok = true;
  if (!cJSON_IsObject(body)) ok = srv_bad(err, NULL, "The request body must be a JSON object.");
  if (ok) ok = check_model(c, body, err) && refuse_unsupported(body, ep, err);
  if (ok) ok = parse_sampling(c, body, p, err) && parse_stop(body, p, err);
  if (ok) ok = parse_stop_ids(c, body, p, err);
  if (ok) ok = parse_logit_bias(c, body, p, err) && parse_grammar(c, body, p, err);
  if (ok) ok = parse_logprobs(ep, body, p, err) && parse_stream(body, p, err);
  if (ok && p->n_return && p->stream)
    ok = srv_bad(err, "best_of",
                 "'best_of' cannot be used with 'stream': the best completions "
                 "are known only when all have finished.");
  if (ok && p->n_stop && !c->tok)
    ok = srv_bad(err, "stop", "Stop strings need a tokenizer; the served plan has none.");
  if (ok && ep == SRV_COMPLETIONS) ok = get_bool(body, "echo", &p->echo, err);
  if (ok && ep == SRV_CHAT) ok = parse_tools(c, body, p, err);
  if (ok)
    ok =
        ep == SRV_CHAT ? parse_messages(c, body, &p->tools, p, err) : parse_prompt(c, body, p, err);
  if (ok) ok = truncate_prompt(body, p, err) && parse_lengths(c, ep, body, p, err);
  if (!ok) srv_params_free(p);
  return ok;
}

bool srv_params_parse(srv_ctx *c, srv_endpoint ep, const char *body, size_t len, srv_params *p,
                      srv_error *err) {
  memset(p, 0, sizeof *p);
  cJSON *j = parse_body(body, len, err);
  if (!j) return false;
  bool ok = srv_params_from_json(c, ep, j, p, err);
  cJSON_Delete(j);
  return ok;
}

void srv_params_free(srv_params *p) {
  for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
  free(p->stop);
  free(p->prompt);
  free(p->bias_ids);
  free(p->bias);
  free(p->stop_ids);
  p->stop_ids = NULL;
  p->n_stop_ids = 0;
  free(p->grammar);
  free(p->echo_text);
  srv_tools_free(&p->tools);
  p->grammar = NULL;
  p->echo_text = NULL;
  p->bias_ids = NULL;
  p->bias = NULL;
  p->n_bias = 0;
  p->stop = NULL;
  p->prompt = NULL;
  p->n_stop = 0;
  p->n_prompt = 0;
}

/* --- /tokenize and /detokenize ---------------------------------------------------------- */

cJSON *srv_tokenize(srv_ctx *c, const char *body, size_t len, srv_error *err) {
  cJSON *j = parse_body(body, len, err), *out = NULL;
  if (!j) return NULL;
  srv_params p;
  memset(&p, 0, sizeof p);
  bool ok = check_model(c, j, err), chat = srv_field(j, "messages") != NULL;
  if (ok && chat) ok = take_tools(c, j, &p.tools, err);
  if (ok) ok = chat ? parse_messages(c, j, &p.tools, &p, err) : parse_prompt(c, j, &p, err);
  if (ok && !(out = cJSON_CreateObject()))
    ok = srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
  if (ok) {
    cJSON_AddNumberToObject(out, "count", (double)p.n_prompt);
    cJSON_AddNumberToObject(out, "max_model_len", (double)c->info->context_length);
    cJSON *ids = cJSON_AddArrayToObject(out, "tokens");
    for (int64_t i = 0; i < p.n_prompt; i++)
      cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)p.prompt[i]));
  }
  srv_params_free(&p);
  cJSON_Delete(j);
  return out;
}

cJSON *srv_detokenize(srv_ctx *c, const char *body, size_t len, srv_error *err) {
  cJSON *j = parse_body(body, len, err), *out = NULL;
  if (!j) return NULL;
  srv_params p;
  memset(&p, 0, sizeof p);
  const cJSON *t = srv_field(j, "tokens");
  bool ok = check_model(c, j, err);
  if (ok && !t) ok = srv_bad(err, "tokens", "Missing required parameter: 'tokens'.");
  if (ok && !cJSON_IsArray(t)) ok = srv_bad_type(err, "tokens", "an array of token ids", t);
  if (ok && !c->tok) ok = srv_bad(err, "tokens", "The served plan has no tokenizer.");
  if (ok) ok = take_ids(c, t, "prompt", &p.prompt, &p.n_prompt, err);
  char *text = NULL;
  size_t n = 0;
  irt_error e = {0};
  if (ok && irt_detokenize_alloc(c->tok, p.prompt, (size_t)p.n_prompt, false, &text, &n, &e))
    ok = srv_fail(err, 500, "server_error", NULL, NULL, "cannot detokenize: %s", e.msg);
  if (ok && !(out = cJSON_CreateObject()))
    ok = srv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
  if (ok) cJSON_AddStringToObject(out, "prompt", text);
  free(text);
  srv_params_free(&p);
  cJSON_Delete(j);
  return out;
}
