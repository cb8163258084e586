/* fuzz_batch_line: libFuzzer target for `inferrt batch`'s untrusted lines: each input line
 * through the command's own line reader (runtime/cli/cli_batch.c batch_line_read: JSON,
 * custom_id, url, method, body) and, for a request, the request parser the batch then calls
 * (srv_params_from_json and what it calls); a refusal is rendered as the batch writes it
 * (srv_render_error). Each line is also read as a result line of a resumed run
 * (batch_result_id). The split into lines is the command's (blank ones dropped). The
 * context is fuzz_http_params': the gpt2 fixture's tokenizer, a 4096-token context, n up to
 * 4, no engine. The input is the JSONL file (its first 8 lines). Build and run:
 * tools/fuzz batch_line. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_batch.h"
#include "fuzz_srv.h"
#include "fuzz_util.h"
#include "inferrt.h"
#include "openai.h"

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

static void run_line(srv_ctx *c, const char *line, int64_t no) {
  batch_line l;
  srv_error e = {0};
  srv_params p;
  switch (batch_line_read(line, no, &l)) {
  case BATCH_LINE_ERROR: fz_note("line error", l.msg); break;
  case BATCH_REFUSED: error_line(&l.e); break;
  case BATCH_RUN:
    if (srv_params_from_json(c, l.ep, l.body, &p, &e)) {
      sink += (uint64_t)p.n_prompt + (uint64_t)p.max_tokens;
      srv_params_free(&p);
    } else {
      error_line(&e);
    }
    break;
  }
  bool failed = false; /* the same bytes as a result line read back on resume */
  const char *id = batch_result_id(l.o, &failed);
  sink += id ? strlen(id) + failed : 0;
  cJSON_Delete(l.o);
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
    run_line(&c, s, ++lines);
  }
  free(buf);
  return 0;
}
