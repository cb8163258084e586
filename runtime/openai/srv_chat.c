/* srv_chat: a chat request's "messages" as the messages the chat template renders. Content
 * parts are joined; with tools, the calls an assistant made and the tools' results are
 * written as the template family's tool form (srv_tools.c), and the tools go where that
 * family puts them: the end of the system turn (Hermes) or the start of the first user
 * turn (Llama 3.1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openai.h"

/* A message's content: a string or an array of {"type": "text", "text": ...} parts, joined. */
static char *message_text(const cJSON *m, int i, bool may_be_null, srv_error *e) {
  char key[64];
  snprintf(key, sizeof key, "messages[%d].content", i);
  const cJSON *v = srv_field(m, "content");
  if (!v && may_be_null) return strdup("");
  if (!v) return srv_bad(e, key, "Missing required parameter: '%s'.", key), NULL;
  if (cJSON_IsString(v)) return strdup(v->valuestring);
  if (!cJSON_IsArray(v))
    return srv_bad_type(e, key, "a string or an array of content parts", v), NULL;
  srv_buf b = {0};
  for (const cJSON *part = v->child; part; part = part->next) {
    const cJSON *t = srv_field(part, "type"), *text = srv_field(part, "text");
    if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(text)) {
      srv_buf_free(&b);
      return srv_bad(
                 e, key,
                 "Only text content parts ({\"type\": \"text\", \"text\": ...}) are supported."),
             NULL;
    }
    srv_buf_put(&b, text->valuestring, strlen(text->valuestring));
  }
  srv_buf_put(&b, "", 1);
  return b.p;
}

static bool oom(srv_error *e) {
  return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

/* Message i as the next template message (tool results of the Hermes form join the turn
 * of the results before them). */
static bool take_message(const cJSON *m, int i, srv_tool_format fmt, srv_chat *c, srv_error *e) {
  char key[64];
  snprintf(key, sizeof key, "messages[%d].role", i);
  const cJSON *role = srv_field(m, "role"), *calls = srv_field(m, "tool_calls");
  if (!cJSON_IsObject(m)) return srv_bad_type(e, "messages", "an object for each message", m);
  if (!role) return srv_bad(e, key, "Missing required parameter: '%s'.", key);
  if (!cJSON_IsString(role)) return srv_bad_type(e, key, "a string", role);
  const char *r = role->valuestring;
  if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") &&
      strcmp(r, "assistant") && strcmp(r, "tool"))
    return srv_bad(e, key,
                   "Invalid value for '%s': '%.64s' (supported: system, developer, user, "
                   "assistant, tool).",
                   key, r);
  bool assistant = !strcmp(r, "assistant"), tool = !strcmp(r, "tool");
  if (calls && cJSON_IsArray(calls) && !calls->child) calls = NULL;
  char *text = message_text(m, i, assistant, e), *t = NULL;
  if (!text) return false;
  int k = c->n;
  if (tool) {
    bool join = fmt == SRV_TOOLFMT_HERMES && k > 0 && c->is_tool[k - 1];
    t = srv_tools_result(fmt, join ? c->texts[k - 1] : NULL, text);
    if (join && t) free(c->texts[--k]);
    c->msgs[k].role = fmt == SRV_TOOLFMT_LLAMA3 ? "ipython" : "user";
  } else {
    t = assistant && calls ? srv_tools_assistant(fmt, text, calls, i, e) : text;
    if (t == text) text = NULL;
    c->msgs[k].role = !strcmp(r, "developer") ? "system" : r;
  }
  free(text);
  if (!t) return tool ? oom(e) : false; /* srv_tools_assistant said why */
  c->texts[k] = t, c->msgs[k].content = t, c->is_tool[k] = tool;
  c->msgs[k].reasoning = NULL;
  /* an assistant turn's thoughts, as the server split them (vLLM's reasoning_content, or
   * its newer name reasoning): borrowed from the request */
  const cJSON *rc = assistant ? srv_field(m, "reasoning_content") : NULL;
  if (assistant && !rc) rc = srv_field(m, "reasoning");
  if (rc && !cJSON_IsString(rc)) {
    snprintf(key, sizeof key, "messages[%d].%s", i, rc->string);
    c->n = k + 1; /* texts[k] is freed with the rest */
    return srv_bad_type(e, key, "a string", rc);
  }
  if (rc) c->msgs[k].reasoning = rc->valuestring;
  c->n = k + 1;
  return true;
}

/* Hermes: the system turn ends with the tools (the caller's, or the template's default). */
static bool hermes_tools(const srv_tools *t, const irt_chat_info *info, srv_chat *c, srv_error *e) {
  bool has = c->n > 0 && !strcmp(c->msgs[0].role, "system");
  /* without a system message Qwen3 writes the tools alone, Qwen2.5 its default prompt
   * (which may be "") and a blank line */
  const char *sys = has                              ? c->texts[0]
                    : !strcmp(info->family, "qwen3") ? NULL
                                                     : info->default_system;
  char *s = srv_tools_system(t, sys);
  if (!s) return oom(e);
  if (has) {
    free(c->texts[0]);
  } else {
    memmove(c->msgs + 1, c->msgs, (size_t)c->n * sizeof *c->msgs);
    memmove(c->texts + 1, c->texts, (size_t)c->n * sizeof *c->texts);
    c->n++;
    c->msgs[0].role = "system";
    c->msgs[0].reasoning = NULL;
  }
  c->texts[0] = s, c->msgs[0].content = s;
  return true;
}

/* Llama 3.1: the tools open the first message after the system turn, a user turn. */
static bool llama3_tools(const srv_tools *t, srv_chat *c, srv_error *e) {
  int k = c->n > 0 && !strcmp(c->msgs[0].role, "system");
  if (k == c->n)
    return srv_bad(e, "messages",
                   "With tools, this model's template needs a first user message "
                   "to put them in.");
  char *s = srv_tools_user(t, c->texts[k]);
  if (!s) return oom(e);
  free(c->texts[k]);
  c->texts[k] = s, c->msgs[k].content = s, c->msgs[k].role = "user";
  return true;
}

bool srv_chat_build(const cJSON *messages, const srv_tools *t, const irt_chat_info *info,
                    srv_chat *c, srv_error *e) {
  memset(c, 0, sizeof *c);
  int n = cJSON_GetArraySize(messages), i = 0;
  c->msgs = calloc((size_t)n + 1, sizeof *c->msgs);
  c->texts = calloc((size_t)n + 1, sizeof *c->texts);
  c->is_tool = calloc((size_t)n + 1, sizeof *c->is_tool);
  bool ok = c->msgs && c->texts && c->is_tool ? true : oom(e);
  srv_tool_format fmt = t->mode != SRV_TOOLS_NONE ? t->format : srv_tool_format_of(info->family);
  for (const cJSON *m = messages->child; ok && m; m = m->next, i++)
    ok = take_message(m, i, fmt, c, e);
  if (ok && t->mode != SRV_TOOLS_NONE)
    ok = fmt == SRV_TOOLFMT_LLAMA3 ? llama3_tools(t, c, e) : hermes_tools(t, info, c, e);
  if (!ok) srv_chat_free(c);
  return ok;
}

void srv_chat_free(srv_chat *c) {
  for (int j = 0; c->texts && j < c->n; j++) free(c->texts[j]);
  free(c->texts), free(c->msgs), free(c->is_tool);
  memset(c, 0, sizeof *c);
}
