/* fuzz_batch_line: libFuzzer target for `inferrt batch`'s input lines
 * ({"custom_id", "method", "url", "body"} per line) down to the request parser. The line
 * dispatch of runtime/cli/cli_batch.c (run_line) is static and tied to the engine, so this
 * harness repeats its steps: split the input into lines as split_lines does (blank ones
 * dropped), parse each, check custom_id / url / method / body in run_line's order, drop
 * "stream" and "stream_options" as run_request does, then srv_params_from_json
 * (runtime/server/srv_params.c and what it calls) for the endpoint the url names; a refusal
 * is rendered as the batch writes it (srv_render_error). The context is fuzz_http_params':
 * the gpt2 fixture's tokenizer, a 4096-token context, n up to 4, no engine. The input is the
 * JSONL file (its first 8 lines). Build and run: tools/fuzz batch_line. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_srv.h"
#include "fuzz_util.h"
#include "inferrt.h"
#include "srv.h"

#define MAX_LINES 8


int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  fz_srv_init("fuzz_batch_line");
  return 0;
}

static volatile uint64_t sink;

static void error_line(const srv_error *e) {
  fz_note("refused", e->msg);
  char *s = srv_render_error(e);
  cJSON *o = s ? cJSON_Parse(s) : NULL; /* the batch re-parses it into the result line */
  if (!o) __builtin_trap();             /* the error body is not JSON */
  cJSON_Delete(o);
  free(s);
}

static void run_line(srv_ctx *c, const char *line) {
  cJSON *o = cJSON_Parse(line);
  const cJSON *cid = cJSON_GetObjectItemCaseSensitive(o, "custom_id");
  const cJSON *method = cJSON_GetObjectItemCaseSensitive(o, "method");
  const cJSON *url = cJSON_GetObjectItemCaseSensitive(o, "url");
  cJSON *body = cJSON_GetObjectItemCaseSensitive(o, "body");
  srv_error e = {0};
  if (!o || !cJSON_IsObject(o) || !cJSON_IsString(cid) || !cid->valuestring[0]) {
    /* invalid_json_line / missing_custom_id */
  } else if (!cJSON_IsString(url) || (strcmp(url->valuestring, "/v1/completions") &&
                                      strcmp(url->valuestring, "/v1/chat/completions"))) {
    srv_fail(&e, 404, "invalid_request_error", "unknown_url", "url", "Unknown request URL: %.200s.",
             cJSON_IsString(url) ? url->valuestring : "(none)");
    error_line(&e);
  } else if (!cJSON_IsString(method) || strcmp(method->valuestring, "POST")) {
    srv_fail(&e, 405, "invalid_request_error", "method_not_allowed", "method",
             "The method must be POST.");
    error_line(&e);
  } else if (!cJSON_IsObject(body)) {
    srv_bad(&e, "body", "The line needs a JSON object 'body'.");
    error_line(&e);
  } else {
    srv_endpoint ep = strcmp(url->valuestring, "/v1/completions") ? SRV_CHAT : SRV_COMPLETIONS;
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream");
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream_options");
    srv_params p;
    if (srv_params_from_json(c, ep, body, &p, &e)) {
      sink += (uint64_t)p.n_prompt + (uint64_t)p.max_tokens;
      srv_params_free(&p);
    } else {
      error_line(&e);
    }
  }
  cJSON_Delete(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  srv_ctx c = {.tok = tok, .info = &info, .model_name = "fuzz", .max_n = 4, .id_salt = 42};
  char *buf = fz_strndup(data, size);
  int lines = 0;
  for (size_t start = 0, i = 0; i <= size && lines < MAX_LINES; i++) {
    if (i < size && buf[i] != '\n') continue;
    buf[i] = '\0';
    char *s = buf + start;
    start = i + 1;
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    if (!*s) continue;
    run_line(&c, s);
    lines++;
  }
  free(buf);
  return 0;
}
