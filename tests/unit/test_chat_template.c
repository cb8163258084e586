/* test_chat_template: the C renderer against Jinja2 renderings of each family's reference
 * template (tests/fixtures/chat, made by tools/gen_chat_fixtures.py): the family is
 * detected from the template source, then every conversation renders byte-identically. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "chat_template.h"
#include "infc_util.h"
#include "tcheck.h"

static void run_case(const cJSON *root, const cJSON *c) {
  const char *name = cJSON_GetObjectItem(c, "template")->valuestring;
  const cJSON *tpl = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "templates"), name);
  const char *src = cJSON_GetObjectItem(tpl, "source")->valuestring;
  const char *kind = cJSON_GetObjectItem(c, "kind")->valuestring;
  int ci = cJSON_GetObjectItem(c, "conversation")->valueint;
  bool gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
  const cJSON *conv = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "conversations"), ci);
  chat_msg msgs[16];
  size_t n = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, conv) {
    const cJSON *r = cJSON_GetObjectItem(m, "reasoning_content");
    msgs[n].role = cJSON_GetObjectItem(m, "role")->valuestring;
    msgs[n].reasoning = r ? r->valuestring : NULL;
    msgs[n++].content = cJSON_GetObjectItem(m, "content")->valuestring;
  }
  chat_tmpl t;
  ir_diag d = {0};
  CHECKF(chat_template_detect(src, &t, &d) == IR_OK, "%s: %s", name, d.msg);
  CHECKF(!strcmp(chat_kind_name(t.kind), kind), "%s: detected %s, want %s", name,
         chat_kind_name(t.kind), kind);
  const cJSON *think = cJSON_GetObjectItem(c, "enable_thinking");
  t.no_thinking = think && cJSON_IsFalse(think);
  if (t.kind == CHAT_LLAMA31 && !t.date[0]) /* today's date: the fixture's fixed day */
    snprintf(t.date, sizeof t.date, "%s", cJSON_GetObjectItem(root, "strftime_now")->valuestring);
  char buf[4096];
  size_t len = 0;
  CHECK(chat_render(&t, msgs, n, gen, buf, sizeof buf, &len, &d) == IR_OK);
  const char *want = cJSON_GetObjectItem(c, "expected")->valuestring;
  CHECKF(len == strlen(want) && !strcmp(buf, want),
         "%s conversation %d gen=%d%s:\n got: %s\nwant: %s", name, ci, gen,
         t.no_thinking ? " no_thinking" : "", buf, want);
}

static void test_errors(void) {
  chat_tmpl t;
  ir_diag d = {0};
  CHECK(chat_template_detect("{{ messages | tojson }}", &t, &d) == IR_UNSUPPORTED);
  CHECK(strstr(d.msg, "--chat-template") != NULL);
  d = (ir_diag){0};
  CHECK(chat_template_detect(NULL, &t, &d) == IR_UNSUPPORTED);
  t = (chat_tmpl){.kind = CHAT_CHATML};
  chat_msg bad = {.role = "robot", .content = "hi"};
  char buf[64];
  size_t len;
  d = (ir_diag){0};
  CHECK(chat_render(&t, &bad, 1, true, buf, sizeof buf, &len, &d) == IR_INVALID_ARG);
  /* Truncation reports the full length and stays NUL-terminated. */
  chat_msg ok = {.role = "user", .content = "a long enough message to overflow a tiny buffer"};
  CHECK(chat_render(&t, &ok, 1, true, buf, 8, &len, &d) == IR_OK);
  CHECK(len > 8 && strlen(buf) == 7);
  CHECK(chat_kind_from_name("llama3") == CHAT_LLAMA3);
  CHECK(chat_kind_from_name("llama3.1") == CHAT_LLAMA31);
  /* A template that asks strftime_now gets the day of rendering. */
  t = (chat_tmpl){.kind = CHAT_LLAMA31};
  char today[32], want[64];
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  strftime(today, sizeof today, "%d %b %Y", &tm);
  snprintf(want, sizeof want, "Today Date: %s\n\n<|eot_id|>", today);
  char big[512];
  CHECK(chat_render(&t, &ok, 1, true, big, sizeof big, &len, &d) == IR_OK);
  CHECKF(strstr(big, want) != NULL, "%s", big);
  CHECK(chat_kind_from_name("nope") == CHAT_UNKNOWN);
  /* Gemma: roles that do not alternate, where its templates raise, are rendered as given
   * (as llama.cpp does); a system message first still opens the next turn */
  t = (chat_tmpl){.kind = CHAT_GEMMA, .bos = "<bos>"};
  chat_msg twice[] = {{.role = "system", .content = "S"},
                      {.role = "assistant", .content = " a "},
                      {.role = "user", .content = "b"},
                      {.role = "user", .content = "c"}};
  CHECK(chat_render(&t, twice, 4, false, big, sizeof big, &len, &d) == IR_OK);
  CHECKF(!strcmp(big, "<bos><start_of_turn>model\nS\n\na<end_of_turn>\n<start_of_turn>user\n"
                      "b<end_of_turn>\n<start_of_turn>user\nc<end_of_turn>\n"),
         "%s", big);
  /* SmolLM3's template has ChatML, <think> and enable_thinking too, but is not Qwen3's */
  d = (ir_diag){0};
  CHECK(chat_template_detect("{%- if enable_thinking -%}<|im_start|>system\n## Metadata\n"
                             "Reasoning Mode: /think<think></think>",
                             &t, &d) == IR_UNSUPPORTED &&
        strstr(d.msg, "SmolLM3") && strstr(d.msg, "--chat-template"));
}

int main(void) {
  char *text = NULL;
  ir_diag d = {0};
  CHECKF(infc_read_file(FIXTURES_DIR "/chat/chat_templates.json", 1u << 20, &text, NULL, &d) ==
             IR_OK,
         "%s", d.msg);
  cJSON *root = text ? cJSON_Parse(text) : NULL;
  const cJSON *c;
  int n = 0;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
    run_case(root, c);
    n++;
  }
  CHECKF(n >= 256, "only %d cases", n);
  test_errors();
  cJSON_Delete(root);
  free(text);
  return tcheck_done("chat_template");
}
