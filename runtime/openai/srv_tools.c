/* srv_tools: function calling (OpenAI "tools" / "tool_choice") in the form of the template
 * family. Hermes, as Qwen2.5's chat template writes it (every family but llama3.1): the
 * tools as JSON lines inside <tools></tools> at the end of the system turn, each call the
 * model makes as {"name": ..., "arguments": {...}} inside <tool_call></tool_call>, each tool
 * result in a user turn inside <tool_response></tool_response>. Llama 3.1's JSON form, as
 * its template writes it: the tools (indented JSON) and how to call them at the start of
 * the first user turn, a call as {"name": ..., "parameters": {...}} alone in the assistant
 * turn, a result as an "ipython" turn. "required" and a named tool_choice constrain the
 * completion to such calls with a grammar built from the tools' parameter schemas; "auto"
 * lets the model choose and reads the calls out of its text afterwards (as vLLM's hermes
 * and llama3_json parsers do). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openai.h"

#define TOOL_OPEN "<tool_call>"
#define TOOL_CLOSE "</tool_call>"

/* --- Python's json.dumps(v, ensure_ascii=False), which the template's tojson is ----------- */

static bool put_str(srv_buf *b, const char *s) { return srv_buf_put(b, s, strlen(s)); }

static bool py_string(srv_buf *b, const char *s) {
  bool ok = put_str(b, "\"");
  for (const unsigned char *p = (const unsigned char *)s; ok && *p; p++) {
    char esc[8];
    const char *e = *p == '"'    ? "\\\""
                    : *p == '\\' ? "\\\\"
                    : *p == '\n' ? "\\n"
                    : *p == '\r' ? "\\r"
                    : *p == '\t' ? "\\t"
                    : *p == '\b' ? "\\b"
                    : *p == '\f' ? "\\f"
                                 : NULL;
    if (!e && *p < 0x20) snprintf(esc, sizeof esc, "\\u%04x", *p), e = esc;
    ok = e ? put_str(b, e) : srv_buf_put(b, (const char *)p, 1);
  }
  return ok && put_str(b, "\"");
}

/* Integers as Python writes ints; other numbers as the shortest %g that reads back (Python's
 * float repr, but for where it switches to an exponent). */
static bool py_number(srv_buf *b, double v) {
  char s[40];
  if (v == floor(v) && fabs(v) < 1e16) {
    snprintf(s, sizeof s, "%.0f", v);
  } else {
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(s, sizeof s, "%.*g", prec, v);
      if (strtod(s, NULL) == v) break;
    }
    if (!strpbrk(s, ".eni")) strcat(s, ".0");
  }
  return put_str(b, s);
}

bool srv_json_py(const cJSON *v, srv_buf *b) {
  if (cJSON_IsNull(v)) return put_str(b, "null");
  if (cJSON_IsTrue(v)) return put_str(b, "true");
  if (cJSON_IsFalse(v)) return put_str(b, "false");
  if (cJSON_IsNumber(v)) return py_number(b, v->valuedouble);
  if (cJSON_IsString(v)) return py_string(b, v->valuestring);
  bool obj = cJSON_IsObject(v), ok = put_str(b, obj ? "{" : "[");
  for (const cJSON *x = v->child; ok && x; x = x->next) {
    if (x != v->child) ok = put_str(b, ", ");
    if (ok && obj) ok = py_string(b, x->string) && put_str(b, ": ");
    if (ok) ok = srv_json_py(x, b);
  }
  return ok && put_str(b, obj ? "}" : "]");
}

static bool put_indent(srv_buf *b, int n) {
  bool ok = put_str(b, "\n");
  for (int i = 0; ok && i < n; i++) ok = put_str(b, " ");
  return ok;
}

bool srv_json_py_indent(const cJSON *v, int indent, int level, srv_buf *b) {
  bool obj = cJSON_IsObject(v);
  if (indent <= 0 || !(obj || cJSON_IsArray(v)) || !v->child) return srv_json_py(v, b);
  bool ok = put_str(b, obj ? "{" : "[");
  for (const cJSON *x = v->child; ok && x; x = x->next) {
    ok = (x != v->child ? put_str(b, ",") : true) && put_indent(b, indent * (level + 1));
    if (ok && obj) ok = py_string(b, x->string) && put_str(b, ": ");
    if (ok) ok = srv_json_py_indent(x, indent, level + 1, b);
  }
  return ok && put_indent(b, indent * level) && put_str(b, obj ? "}" : "]");
}

srv_tool_format srv_tool_format_of(const char *family) {
  return family && !strcmp(family, "llama3.1") ? SRV_TOOLFMT_LLAMA3 : SRV_TOOLFMT_HERMES;
}

/* --- the request's tools ------------------------------------------------------------------ */

static bool valid_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 64) return false;
  for (; *s; s++)
    if (!(*s == '_' || *s == '-' || (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') ||
          (*s >= 'A' && *s <= 'Z')))
      return false;
  return true;
}

static bool check_tool(const cJSON *t, int i, srv_error *e) {
  char k[64];
  snprintf(k, sizeof k, "tools[%d]", i);
  const cJSON *type = srv_field(t, "type"), *fn = srv_field(t, "function");
  if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
      !cJSON_IsObject(fn))
    return srv_bad(e, k,
                   "Invalid value for '%s': expected {\"type\": \"function\", \"function\": "
                   "{\"name\": ..., \"parameters\": {...}}}.",
                   k);
  const cJSON *name = srv_field(fn, "name"), *params = srv_field(fn, "parameters"),
              *desc = srv_field(fn, "description");
  if (!cJSON_IsString(name) || !valid_name(name->valuestring))
    return srv_bad(e, k,
                   "Invalid value for '%s.function.name': expected 1 to 64 letters, digits, "
                   "'_' or '-'.",
                   k);
  if (params && !cJSON_IsObject(params))
    return srv_bad(e, k,
                   "Invalid type for '%s.function.parameters': expected a JSON Schema "
                   "object.",
                   k);
  if (desc && !cJSON_IsString(desc))
    return srv_bad(e, k, "Invalid type for '%s.function.description': expected a string.", k);
  return true;
}

static const char *tool_name(const cJSON *t) {
  return srv_field(srv_field(t, "function"), "name")->valuestring;
}

bool srv_tools_parse(const cJSON *body, srv_tools *t, srv_error *e) {
  memset(t, 0, sizeof *t);
  t->parallel = true;
  const cJSON *tools = srv_field(body, "tools"), *choice = srv_field(body, "tool_choice"),
              *par = srv_field(body, "parallel_tool_calls");
  if (tools && !cJSON_IsArray(tools))
    return srv_bad(e, "tools", "Invalid type for 'tools': expected an array of tools.");
  int n = tools ? cJSON_GetArraySize(tools) : 0, i = 0;
  for (const cJSON *x = n ? tools->child : NULL; x; x = x->next, i++)
    if (!check_tool(x, i, e)) return false;
  if (par && !cJSON_IsBool(par))
    return srv_bad(e, "parallel_tool_calls",
                   "Invalid type for 'parallel_tool_calls': expected a boolean.");
  t->parallel = !par || cJSON_IsTrue(par);
  t->mode = n ? SRV_TOOLS_AUTO : SRV_TOOLS_NONE;
  if (!choice) goto take;
  if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) {
    t->mode = SRV_TOOLS_NONE;
    return true; /* the tools stay out of the prompt */
  }
  if (!n) return srv_bad(e, "tool_choice", "'tool_choice' is only allowed when 'tools' are given.");
  if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto")) goto take;
  if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) {
    t->mode = SRV_TOOLS_REQUIRED;
    goto take;
  }
  const cJSON *fn = cJSON_IsObject(choice) ? srv_field(choice, "function") : NULL,
              *name = fn ? srv_field(fn, "name") : NULL;
  if (!cJSON_IsString(name))
    return srv_bad(e, "tool_choice",
                   "Invalid value for 'tool_choice': expected 'none', 'auto', "
                   "'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}.");
  i = 0;
  for (const cJSON *x = tools->child; x; x = x->next, i++)
    if (!strcmp(tool_name(x), name->valuestring)) break;
  if (i == n)
    return srv_bad(e, "tool_choice", "Invalid value for 'tool_choice': no tool is named '%.64s'.",
                   name->valuestring);
  t->mode = SRV_TOOLS_NAMED;
  t->named = i;
take:
  if (n && !(t->list = cJSON_Duplicate(tools, true)))
    return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  return true;
}

void srv_tools_free(srv_tools *t) {
  cJSON_Delete(t->list);
  t->list = NULL;
  t->mode = SRV_TOOLS_NONE;
}

/* --- the prompt ----------------------------------------------------------------------------- */

char *srv_tools_system(const srv_tools *t, const char *sys) {
  srv_buf b = {0};
  bool ok = (!sys || (put_str(&b, sys) && put_str(&b, "\n\n"))) &&
            put_str(&b, "# Tools\n\nYou may call one or more functions to assist with the "
                        "user query.\n\nYou are provided with function signatures within "
                        "<tools></tools> XML tags:\n<tools>");
  for (const cJSON *x = t->list ? t->list->child : NULL; ok && x; x = x->next)
    ok = put_str(&b, "\n") && srv_json_py(x, &b);
  ok = ok && put_str(&b, "\n</tools>\n\nFor each function call, return a json object with "
                         "function name and arguments within <tool_call></tool_call> XML "
                         "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                         "<args-json-object>}\n</tool_call>");
  if (!ok) srv_buf_free(&b);
  return b.p;
}

char *srv_tools_user(const srv_tools *t, const char *first) {
  srv_buf b = {0};
  bool ok = put_str(&b, "Given the following functions, please respond with a JSON for a "
                        "function call with its proper arguments that best answers the given "
                        "prompt.\n\nRespond in the format {\"name\": function name, "
                        "\"parameters\": dictionary of argument name and its value}.Do not use "
                        "variables.\n\n");
  for (const cJSON *x = t->list ? t->list->child : NULL; ok && x; x = x->next)
    ok = srv_json_py_indent(x, 4, 0, &b) && put_str(&b, "\n\n");
  size_t n = strlen(first);
  while (n && strchr(" \t\n\r\f\v", *first)) first++, n--; /* Jinja's trim */
  while (n && strchr(" \t\n\r\f\v", first[n - 1])) n--;
  ok = ok && srv_buf_put(&b, first, n);
  if (!ok) srv_buf_free(&b);
  return b.p;
}

char *srv_tools_assistant(srv_tool_format f, const char *content, const cJSON *calls, int msg,
                          srv_error *e) {
  char k[64];
  snprintf(k, sizeof k, "messages[%d].tool_calls", msg);
  if (!cJSON_IsArray(calls))
    return srv_bad(e, k, "Invalid type for '%s': expected an array.", k), NULL;
  if (f == SRV_TOOLFMT_LLAMA3 && cJSON_GetArraySize(calls) != 1)
    return srv_bad(e, k, "This model's template takes one tool call per assistant message."), NULL;
  srv_buf b = {0};
  bool ok = f == SRV_TOOLFMT_LLAMA3 || put_str(&b, content); /* Llama 3.1 drops the content */
  int i = 0;
  for (const cJSON *c = calls->child; ok && c; c = c->next, i++) {
    const cJSON *fn = srv_field(c, "function"), *name = fn ? srv_field(fn, "name") : NULL,
                *args = fn ? srv_field(fn, "arguments") : NULL;
    cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    if (!cJSON_IsString(name) || !cJSON_IsObject(parsed)) {
      cJSON_Delete(parsed);
      srv_buf_free(&b);
      return srv_bad(e, k,
                     "Invalid value for '%s[%d]': expected {\"function\": {\"name\": ..., "
                     "\"arguments\": a JSON object as a string}}.",
                     k, i),
             NULL;
    }
    if (f == SRV_TOOLFMT_LLAMA3)
      ok = put_str(&b, "{\"name\": \"") && put_str(&b, name->valuestring) &&
           put_str(&b, "\", \"parameters\": ") && srv_json_py(parsed, &b) && put_str(&b, "}");
    else /* Hermes: each call on its own lines, after the content if there is any */
      ok = (b.len ? put_str(&b, "\n") : true) && put_str(&b, TOOL_OPEN "\n{\"name\": \"") &&
           put_str(&b, name->valuestring) && put_str(&b, "\", \"arguments\": ") &&
           srv_json_py(parsed, &b) && put_str(&b, "}\n" TOOL_CLOSE);
    cJSON_Delete(parsed);
  }
  if (!ok) {
    srv_buf_free(&b);
    srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
  }
  return b.p ? b.p : strdup("");
}

char *srv_tools_result(srv_tool_format f, const char *prev, const char *content) {
  srv_buf b = {0};
  if (f == SRV_TOOLFMT_LLAMA3) { /* the template's tojson of the content, a string */
    if (!py_string(&b, content)) srv_buf_free(&b);
    return b.p;
  }
  bool ok = (prev && *prev ? put_str(&b, prev) && put_str(&b, "\n") : true) &&
            put_str(&b, "<tool_response>\n") && put_str(&b, content) &&
            put_str(&b, "\n</tool_response>");
  if (!ok) srv_buf_free(&b);
  return b.p;
}

/* --- the grammar of required / named calls ------------------------------------------------ */

/* {"type": "object", "properties": {"name": {"const": N}, args_key: P}, ...} for a tool;
 * the parameters' $defs move up to the root, where their "#/$defs/.." refs point. */
static cJSON *call_schema(const cJSON *tool, const char *args_key, cJSON *root_defs, srv_error *e) {
  const cJSON *fn = srv_field(tool, "function"), *params = srv_field(fn, "parameters");
  cJSON *s = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(s, "properties");
  cJSON_AddStringToObject(s, "type", "object");
  cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "name"), "const", tool_name(tool));
  cJSON *args = params ? cJSON_Duplicate(params, true)
                       : cJSON_Parse("{\"type\": \"object\", \"properties\": {}}");
  for (int k = 0; args && k < 2; k++) {
    const char *key = k ? "definitions" : "$defs";
    cJSON *defs = cJSON_DetachItemFromObjectCaseSensitive(args, key);
    cJSON *into = cJSON_GetObjectItemCaseSensitive(root_defs, key);
    if (!into) into = cJSON_AddObjectToObject(root_defs, key);
    while (defs && defs->child) {
      cJSON *d = cJSON_DetachItemViaPointer(defs, defs->child);
      if (cJSON_GetObjectItemCaseSensitive(into, d->string)) {
        srv_bad(e, "tools",
                "Tools '%s' and another define '%s/%.60s': give the definitions "
                "distinct names.",
                tool_name(tool), key, d->string);
        cJSON_Delete(d), cJSON_Delete(defs), cJSON_Delete(args), cJSON_Delete(s);
        return NULL;
      }
      cJSON_AddItemToObject(into, d->string, d);
    }
    cJSON_Delete(defs);
  }
  cJSON_AddItemToObject(props, args_key, args);
  cJSON *req = cJSON_AddArrayToObject(s, "required");
  cJSON_AddItemToArray(req, cJSON_CreateString("name"));
  cJSON_AddItemToArray(req, cJSON_CreateString(args_key));
  cJSON_AddFalseToObject(s, "additionalProperties");
  return s;
}

bool srv_tools_grammar(const srv_tools *t, char **gbnf, srv_error *e) {
  *gbnf = NULL;
  if (t->mode != SRV_TOOLS_REQUIRED && t->mode != SRV_TOOLS_NAMED) return true;
  cJSON *root = cJSON_CreateObject(), *any = cJSON_AddArrayToObject(root, "anyOf");
  int i = 0;
  bool ok = root != NULL;
  for (const cJSON *x = t->list->child; ok && x; x = x->next, i++) {
    if (t->mode == SRV_TOOLS_NAMED && i != t->named) continue;
    const char *key = t->format == SRV_TOOLFMT_LLAMA3 ? "parameters" : "arguments";
    cJSON *s = call_schema(x, key, root, e);
    if (!s) ok = false;
    else cJSON_AddItemToArray(any, s);
  }
  char *schema = ok ? cJSON_PrintUnformatted(root) : NULL, *json = NULL;
  cJSON_Delete(root);
  irt_error ie = {0};
  if (ok && irt_grammar_json(schema, &json, &ie) != IRT_OK)
    ok =
        srv_bad(e, "tools", "Cannot constrain the completion to the tools' parameters: %s", ie.msg);
  free(schema);
  /* The JSON grammar ends with its start rule, "root ::= rN": that rule becomes one call. */
  char *last = ok ? strstr(json, "\nroot ::= ") : NULL;
  while (last && strstr(last + 1, "\nroot ::= ")) last = strstr(last + 1, "\nroot ::= ");
  if (ok && !last) ok = srv_fail(e, 500, "server_error", NULL, NULL, "unexpected JSON grammar");
  srv_buf b = {0};
  if (ok) {
    *last = '\0';
    bool many = t->parallel && t->mode == SRV_TOOLS_REQUIRED;
    ok = put_str(&b, json) && put_str(&b, "\ncall ::= ") && put_str(&b, last + 10);
    if (t->format == SRV_TOOLFMT_LLAMA3) /* calls joined by "; " */
      ok = ok && put_str(&b, many ? "root ::= call (\"; \" call)*\n" : "root ::= call\n");
    else
      ok = ok && put_str(&b, "block ::= \"" TOOL_OPEN "\\n\" call \"\\n" TOOL_CLOSE "\"\n") &&
           put_str(&b, many ? "root ::= block (\"\\n\" block)*\n" : "root ::= block\n");
    if (!ok) srv_buf_free(&b);
  }
  free(json);
  if (ok && irt_grammar_check(b.p, &ie) != IRT_OK)
    ok = srv_bad(e, "tools", "Cannot constrain the completion to the tools: %s", ie.msg);
  if (!ok) srv_buf_free(&b);
  *gbnf = b.p;
  return ok;
}

/* --- reading calls out of a completion ------------------------------------------------------ */

/* A call's JSON: {"name": string, "arguments" (or "parameters"): object}. */
static bool call_of(const cJSON *j, srv_tool_call *out) {
  const cJSON *name = j ? srv_field(j, "name") : NULL, *args = j ? srv_field(j, "arguments") : NULL;
  if (!args && j) args = srv_field(j, "parameters");
  bool ok = cJSON_IsObject(j) && cJSON_IsString(name) && (!args || cJSON_IsObject(args));
  srv_buf b = {0};
  if (ok) ok = args ? srv_json_py(args, &b) : put_str(&b, "{}");
  if (ok) ok = (out->name = strdup(name->valuestring)) != NULL;
  if (ok) out->arguments = b.p;
  else srv_buf_free(&b);
  return ok;
}

/* A Hermes block's text as a call. */
static bool parse_call(const char *s, size_t n, srv_tool_call *out) {
  cJSON *j = cJSON_ParseWithLength(s, n);
  bool ok = call_of(j, out);
  cJSON_Delete(j);
  return ok;
}

/* How many bytes at the end of text could begin "<tool_call>" (held back from a stream). */
static size_t partial_open(const char *text, size_t len) {
  size_t k = strlen(TOOL_OPEN) - 1;
  for (k = k < len ? k : len; k > 0; k--)
    if (!memcmp(text + len - k, TOOL_OPEN, k)) return k;
  return 0;
}

static const char *find(const char *s, const char *end, const char *what) {
  size_t n = strlen(what);
  for (; s + n <= end; s++)
    if (*s == *what && !memcmp(s, what, n)) return s;
  return NULL;
}

/* Llama 3.1: calls when the text is JSON objects joined by ";", read once it is whole. */
static bool split_llama3(const char *text, size_t len, bool final, srv_tool_split *out) {
  size_t i = 0;
  while (i < len && text[i] && strchr(" \t\n\r", text[i])) i++; /* strchr finds a NUL too */
  if (i < len && text[i] != '{') {                              /* prose: all content */
    out->content_len = len;
    return true;
  }
  if (!final) return true; /* perhaps calls: nothing shown yet */
  char *s = strndup(text, len);
  if (!s) return false;
  const char *p = s + i;
  while (*p) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(p, &end, false);
    srv_tool_call c = {0};
    bool ok = call_of(j, &c);
    cJSON_Delete(j);
    if (!ok) { /* not a call: it and what follows are content (all of it, for the first) */
      out->rest = out->n_calls ? (size_t)(p - s) : 0;
      break;
    }
    srv_tool_call *v = realloc(out->calls, (size_t)(out->n_calls + 1) * sizeof *v);
    if (!v) {
      free(c.name), free(c.arguments), free(s);
      return false;
    }
    out->calls = v;
    out->calls[out->n_calls++] = c;
    p = end;
    while (*p && strchr(" \t\n\r", *p)) p++;
    if (*p == ';') p++;
    while (*p && strchr(" \t\n\r", *p)) p++;
  }
  if (!out->n_calls) out->content_len = len, out->rest = len;
  free(s);
  return true;
}

bool srv_tools_split(srv_tool_format f, const char *text, size_t len, bool final,
                     srv_tool_split *out) {
  memset(out, 0, sizeof *out);
  if (f == SRV_TOOLFMT_LLAMA3) {
    out->rest = len;
    return split_llama3(text, len, final, out);
  }
  const char *end = text + len, *p = find(text, end, TOOL_OPEN);
  out->rest = len;
  if (!p) {
    out->content_len = final ? len : len - partial_open(text, len);
    return true;
  }
  out->content_len = (size_t)(p - text);
  while (p) {
    const char *body = p + strlen(TOOL_OPEN), *close = find(body, end, TOOL_CLOSE);
    if (!close && !final) return true; /* a call still being written */
    const char *stop = close ? close : end;
    srv_tool_call c = {0};
    if (!parse_call(body, (size_t)(stop - body), &c)) {
      out->rest = (size_t)(p - text); /* not a call: it and what follows are content */
      return true;
    }
    srv_tool_call *v = realloc(out->calls, (size_t)(out->n_calls + 1) * sizeof *v);
    if (!v) {
      free(c.name), free(c.arguments);
      return false;
    }
    out->calls = v;
    out->calls[out->n_calls++] = c;
    p = close ? find(close, end, TOOL_OPEN) : NULL;
  }
  return true;
}

void srv_tool_split_free(srv_tool_split *s) {
  for (int i = 0; i < s->n_calls; i++) free(s->calls[i].name), free(s->calls[i].arguments);
  free(s->calls);
  memset(s, 0, sizeof *s);
}

void srv_tool_call_id(const char *job_id, int choice, int call, char out[32]) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *s = job_id; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  h = (h ^ (uint64_t)choice * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  uint64_t g = (h ^ (uint64_t)(call + 1) * 0x94d049bb133111ebull) * 0x9e3779b97f4a7c15ull;
  snprintf(out, 32, "call_%012llx%012llx", (unsigned long long)(h >> 16),
           (unsigned long long)(g >> 16));
}
