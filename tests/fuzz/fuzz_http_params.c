/* fuzz_http_params: libFuzzer target for the server's request bodies (runtime/server:
 * srv_params.c with what it calls: srv_tools.c for tools / tool_choice, srv_chat.c for the
 * messages, the chat templates, the grammar compilers for response_format / guided_* /
 * grammar, the tokenizer for prompts), as `inferrt serve` gets them from the network. The
 * context is what the server's has, without an engine (the parser needs none): the gpt2
 * fixture's tokenizer (a chatml template), a 4096-token context, n up to 4, served name
 * "fuzz". The input's first byte picks the setting, the rest is the body:
 *   bits 0-1  endpoint: /v1/completions, /v1/chat/completions, /tokenize, /detokenize
 *   bits 2-5  --chat-template override: none, or one family by name (an unknown one last)
 *   bit 6     the plan has no tokenizer (token-id prompts only)
 *   bit 7     --reasoning-format none and --allow-special-in-content
 * A refusal's error is rendered as the server sends it (srv_render_error). An accepted chat
 * request with tools also has its body read back as if the model had written it
 * (srv_tools_split, srv_think_split): the parsers of the model's output. Build and run:
 * tools/fuzz http_params. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_srv.h"
#include "fuzz_util.h"
#include "inferrt.h"
#include "openai.h"

static const char *const families[] = {NULL,     "chatml",   "qwen3",         "deepseek-r1",
                                       "llama3", "llama3.1", "mistral",       "llama2",
                                       "gemma",  "phi3",     "no-such-family"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  fz_srv_init("fuzz_http_params");
  return 0;
}

static volatile uint64_t sink;

/* The model's output parsers over text, as a job's rendering calls them. */
static void read_back(const srv_params *p, const char *text, size_t len) {
  srv_think th;
  srv_think_split(text, len, p->think_open, false, &th);
  srv_think_split(text, len, p->think_open, true, &th);
  sink += th.content_end - th.content + th.think_end - th.think;
  for (int fin = 0; fin < 2; fin++) {
    srv_tool_split sp = {0};
    if (srv_tools_split(p->tools.format, text, len, fin, &sp)) {
      for (int i = 0; i < sp.n_calls; i++)
        sink += strlen(sp.calls[i].name) + strlen(sp.calls[i].arguments);
      srv_tool_split_free(&sp);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  srv_ctx c = {.tok = data[0] & 0x40 ? NULL : tok,
               .info = &info,
               .chat_template =
                   families[((data[0] >> 2) & 15) % (sizeof families / sizeof *families)],
               .no_reasoning = data[0] & 0x80,
               .allow_special = data[0] & 0x80,
               .model_name = "fuzz",
               .max_n = 4,
               .id_salt = 42};
  const char *body = (const char *)data + 1;
  size_t len = size - 1;
  srv_error err = {0};
  bool ok = true;
  cJSON *out = NULL;
  switch (data[0] & 3) {
  case 0:
  case 1: {
    srv_params p;
    srv_endpoint ep = (data[0] & 3) ? SRV_CHAT : SRV_COMPLETIONS;
    ok = srv_params_parse(&c, ep, body, len, &p, &err);
    if (ok) {
      if (ep == SRV_CHAT && (p.tools.mode != SRV_TOOLS_NONE || p.think)) read_back(&p, body, len);
      srv_params_free(&p);
    }
    break;
  }
  case 2: ok = (out = srv_tokenize(&c, body, len, &err)) != NULL; break;
  default: ok = (out = srv_detokenize(&c, body, len, &err)) != NULL; break;
  }
  if (out) {
    char *s = cJSON_PrintUnformatted(out);
    free(s);
    cJSON_Delete(out);
  }
  if (!ok) {
    fz_note("refused", err.msg);
    char *s = srv_render_error(&err);
    if (s) sink += strlen(s);
    free(s);
  }
  return 0;
}
