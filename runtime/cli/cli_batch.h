/* cli_batch: the parsers of `inferrt batch`'s untrusted text, apart from the command so that
 * they can be fuzzed (tests/fuzz/fuzz_batch_line.c): an input line, and a result line read
 * back when a run resumes. */
#ifndef CLI_BATCH_H
#define CLI_BATCH_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "openai.h"

typedef enum batch_verdict {
  BATCH_RUN,        /* a request: ep and body */
  BATCH_LINE_ERROR, /* not a request line: its result is an error object (code, msg) */
  BATCH_REFUSED,    /* a request line the API refuses: its result is e's error response */
} batch_verdict;

/* One input line, {"custom_id", "method": "POST", "url", "body"}, checked in this order: JSON,
 * a non-empty custom_id, the url (/v1/completions or /v1/chat/completions), the method, a
 * body object. The body of a request to run has "stream" and "stream_options" removed (batch
 * results are whole). */
typedef struct batch_line {
  cJSON *o;               /* the parsed line (NULL: not JSON); free it with cJSON_Delete */
  const char *id;         /* its custom_id, or fallback */
  char fallback[32];      /* "line-N" (N: the line's number in the input) */
  srv_endpoint ep;        /* BATCH_RUN */
  cJSON *body;            /* BATCH_RUN: borrowed from o */
  const char *code, *msg; /* BATCH_LINE_ERROR */
  srv_error e;            /* BATCH_REFUSED */
} batch_line;
batch_verdict batch_line_read(const char *line, int64_t line_no, batch_line *out);

/* A result line's custom_id when the line is a whole result ({"custom_id", "response" with
 * status_code and body, or "error"}), else NULL; *failed when it is not a 200 response. */
const char *batch_result_id(const cJSON *o, bool *failed);

#endif
