/* openai: the OpenAI protocol layer over the engine, shared by `inferrt serve` (runtime/server,
 * HTTP) and `inferrt batch` (runtime/cli): request bodies to engine parameters, one request
 * through the engine, and the response JSON. It sees the public API (inferrt.h) only and
 * knows nothing of HTTP. Modules:
 *   srv_params.c   request bodies -> validated parameters (OpenAI error on refusal)
 *   srv_job.c      one request through the engine: events in, per-choice state out
 *   srv_openai.c   OpenAI response, SSE chunk and error JSON
 *   srv_chat.c     chat messages -> the template's messages (tool calls and results too)
 *   srv_tools.c    function calling: tools in the prompt, calls constrained or read back
 *   srv_think.c    a thinking model's answer split into thoughts and the rest
 * Threading: a srv_ctx is shared by every connection thread and the engine thread; jobs
 * lock themselves. */
#ifndef IRT_OPENAI_H
#define IRT_OPENAI_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "inferrt.h"

typedef enum srv_endpoint { SRV_COMPLETIONS = 0, SRV_CHAT = 1 } srv_endpoint;

/* An OpenAI error: {"error": {"message", "type", "param", "code"}} with an HTTP status. */
typedef struct srv_error {
  int status;
  const char *type; /* static, e.g. "invalid_request_error" */
  const char *code; /* static or NULL (JSON null) */
  char param[96];   /* "" is JSON null */
  char msg[512];
} srv_error;

/* Fills e and returns false (so parsers can `return srv_fail(...)`). */
bool srv_fail(srv_error *e, int status, const char *type, const char *code, const char *param,
              const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Shorthand for a 400 invalid_request_error naming `param`. */
bool srv_bad(srv_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The field k of o, or NULL when absent or JSON null (which counts as absent). */
const cJSON *srv_field(const cJSON *o, const char *k);
/* "Invalid type for 'k': expected want, but got <v's type> instead." (a 400). */
bool srv_bad_type(srv_error *e, const char *k, const char *want, const cJSON *v);

/* What every request needs: borrowed model, engine and tokenizer, and the served name. */
typedef struct srv_ctx {
  irt_model *m;
  irt_engine *e;
  const irt_tokenizer *tok; /* NULL when the plan has none: token-id prompts only */
  const irt_model_info *info;
  const char *chat_template; /* family name override, or NULL for the model's own */
  bool no_reasoning;         /* --reasoning-format none: thoughts stay in content */
  bool allow_special;        /* --allow-special-in-content: message text may spell special
                                tokens (by default it is text: irt_chat_tokenize) */
  char model_name[256];
  int64_t created; /* unix seconds, for /v1/models */
  int64_t max_n;   /* completions per request the engine can hold */
  /* Called once per finished generation (on the engine thread; must not block), or NULL:
   * ttft_s and tpot_s < 0 when not measured; cancelled when its client went away. */
  void (*on_done)(void *cls, double ttft_s, double tpot_s, double e2e_s, bool cancelled);
  void *on_done_cls;
  atomic_uint_fast64_t next_id;
  uint64_t id_salt;
} srv_ctx;

/* --- srv_think.c -------------------------------------------------------------------------- */

/* A thinking model's answer: its thoughts and the rest. With `final` (no more text comes)
 * the whole split; else what a later byte may still change is left out of both parts (a
 * tail that may be the start of "<think>" or "</think>", the thoughts' trailing newlines,
 * the newlines that open the rest). */
typedef struct srv_think {
  bool has;                    /* a thought block: the answer opened one, or the prompt did */
  bool closed;                 /* and "</think>" ended it */
  size_t think, think_end;     /* the thoughts: text[think, think_end), newlines trimmed */
  size_t content, content_end; /* the rest: text[content, content_end) (all of it if !has;
                                  empty while the thoughts go on, or if they never ended) */
} srv_think;
/* open: the prompt ended inside a thought block (the template opened it). */
void srv_think_split(const char *text, size_t len, bool open, bool final, srv_think *out);

/* --- srv_tools.c -------------------------------------------------------------------------- */

typedef struct srv_buf {
  char *p;
  size_t len, cap, off; /* off: bytes already handed on (streaming) */
} srv_buf;

typedef enum srv_tool_mode {
  SRV_TOOLS_NONE = 0, /* no tools, or tool_choice "none" (the tools stay out of the prompt) */
  SRV_TOOLS_AUTO,     /* the model may call tools; calls are read out of its text */
  SRV_TOOLS_REQUIRED, /* one or more calls (a grammar), of any of the tools */
  SRV_TOOLS_NAMED,    /* a call of the named tool (a grammar) */
} srv_tool_mode;

/* How tools, calls and results are written: the Hermes form Qwen2.5's template uses (every
 * family but llama3.1), or Llama 3.1's JSON form: the tools at the start of the first user
 * turn, a call as {"name": ..., "parameters": {...}} alone in the assistant turn (several
 * joined by ";"), a result as an "ipython" turn holding a JSON string. */
typedef enum srv_tool_format { SRV_TOOLFMT_HERMES = 0, SRV_TOOLFMT_LLAMA3 = 1 } srv_tool_format;
srv_tool_format srv_tool_format_of(const char *family);

typedef struct srv_tools {
  cJSON *list; /* (owned) the request's tools, as given; NULL in mode NONE */
  srv_tool_mode mode;
  srv_tool_format format;
  int named;     /* NAMED: the tool's index in list */
  bool parallel; /* parallel_tool_calls: REQUIRED may make several calls */
} srv_tools;

/* "tools", "tool_choice" and "parallel_tool_calls" of a chat request. False with e set (a
 * 400 naming the field) on a bad tool, an unknown name or a choice without tools. */
bool srv_tools_parse(const cJSON *body, srv_tools *t, srv_error *e);
void srv_tools_free(srv_tools *t);
/* Hermes: the system turn's text: sys and a blank line (none for a NULL sys), then the
 * tools block. malloc'd (NULL: out of memory). */
char *srv_tools_system(const srv_tools *t, const char *sys);
/* Llama 3.1: the first user turn's text: the tools and how to call them, then first (trimmed).
 * malloc'd (NULL: out of memory). */
char *srv_tools_user(const srv_tools *t, const char *first);
/* An assistant turn with tool_calls as its text: Hermes, content then one <tool_call> block
 * per call; Llama 3.1, the one call's JSON (its template takes one). Arguments, a JSON
 * string, are written as the template's tojson writes the object. malloc'd; NULL with e
 * set (naming messages[msg]) when a call is malformed, or out of memory. */
char *srv_tools_assistant(srv_tool_format f, const char *content, const cJSON *calls, int msg,
                          srv_error *e);
/* A tool turn's text: Hermes, a <tool_response> block after prev (the results before it in
 * the same turn, or NULL); Llama 3.1, content as a JSON string. malloc'd (NULL: out of memory). */
char *srv_tools_result(srv_tool_format f, const char *prev, const char *content);
/* GBNF for the completion of REQUIRED / NAMED modes; *gbnf NULL for the others. False with
 * e set when a tool's parameters cannot be a grammar (unsupported JSON Schema keywords). */
bool srv_tools_grammar(const srv_tools *t, char **gbnf, srv_error *e);

typedef struct srv_tool_call {
  char *name, *arguments; /* owned; arguments: a JSON object's text */
} srv_tool_call;

typedef struct srv_tool_split {
  size_t content_len;   /* text before the first call (or, mid-stream, what may be shown) */
  srv_tool_call *calls; /* (n_calls) the complete, well-formed calls, in order */
  int n_calls;
  size_t rest; /* where the text is content again: a block that is not a call, and what
                  follows it (len when there is none) */
} srv_tool_split;

/* Reads the calls out of a completion's text. Hermes: mid-stream (!final) a call is taken
 * once its block closes, and a possible start of "<tool_call>" at the end is not content
 * yet. Llama 3.1: a text that starts with "{" (after blanks) is calls, read at the end.
 * False only when out of memory. */
bool srv_tools_split(srv_tool_format f, const char *text, size_t len, bool final,
                     srv_tool_split *out);
void srv_tool_split_free(srv_tool_split *s);
/* A call's id: "call_" and 24 hex digits, fixed by the job's id and the indices. */
void srv_tool_call_id(const char *job_id, int choice, int call, char out[32]);
/* Python's json.dumps(v, ensure_ascii=False): ", " and ": " separators, keys in order;
 * with indent > 0, json.dumps(v, indent=indent) (one item a line, "," and ": "). */
bool srv_json_py(const cJSON *v, srv_buf *b);
bool srv_json_py_indent(const cJSON *v, int indent, int level, srv_buf *b);

/* --- srv_chat.c --------------------------------------------------------------------------- */

typedef struct srv_chat {
  irt_chat_message *msgs; /* (n) roles static, contents = texts */
  char **texts;           /* (n) owned */
  bool *is_tool;          /* (n) a turn of tool results */
  int n;
} srv_chat;

/* The template's messages for a request's "messages" (a non-empty array) with its tools
 * (mode NONE: none) in the family's form. False with e set (a 400 naming the message). */
bool srv_chat_build(const cJSON *messages, const srv_tools *t, const irt_chat_info *info,
                    srv_chat *out, srv_error *e);
void srv_chat_free(srv_chat *c);

/* --- srv_params.c ------------------------------------------------------------------------- */

typedef struct srv_params {
  srv_endpoint ep;
  int32_t *prompt; /* (n_prompt) owned */
  int64_t n_prompt;
  int64_t max_tokens;
  irt_sampling sampling;
  char **stop; /* (n_stop) owned */
  int n_stop;
  int n;                /* completions the engine samples: best_of when given, else n */
  int n_return;         /* the ones returned, those of the highest score (0: all n) */
  float length_penalty; /* best_of's score: cumulative logprob / tokens^length_penalty */
  int logprobs;         /* -1: not asked; else alternatives per token (0..20) */
  float presence_penalty, frequency_penalty;
  float repetition_penalty; /* vLLM's; 1: off */
  int64_t min_tokens;       /* vLLM's */
  int32_t *stop_ids;        /* vLLM's stop_token_ids: (n_stop_ids) owned */
  int n_stop_ids;
  int32_t *bias_ids; /* logit_bias: (n_bias) owned */
  float *bias;
  int n_bias;
  char *grammar;   /* GBNF from response_format / guided_* / grammar (owned), or NULL */
  bool echo;       /* completions: the prompt comes back before the completion, */
  bool echo_only;  /* and with max_tokens 0, alone (the engine runs one token, dropped) */
  char *echo_text; /* the prompt's text (owned) */
  srv_tools tools; /* chat: function calling (mode NONE without tools) */
  bool stream, include_usage, ignore_eos;
  bool include_stop_str; /* vLLM's include_stop_str_in_output */
  bool think;            /* chat with a thinking template: thoughts come as reasoning_content */
  bool think_open;       /* the prompt ends inside a thought block */
  bool no_thinking;      /* chat_template_kwargs.enable_thinking false */
  const char *tenant;    /* from the API key (borrowed); NULL: shared */
  int priority;
} srv_params;

/* Validates an OpenAI request body for ep and tokenizes its prompt. False (err filled:
 * 400 naming the field, 404 for an unknown model) on refusal. */
bool srv_params_from_json(srv_ctx *c, srv_endpoint ep, const cJSON *body, srv_params *p,
                          srv_error *err);
/* The same from raw bytes (malformed JSON is a 400). */
bool srv_params_parse(srv_ctx *c, srv_endpoint ep, const char *body, size_t len, srv_params *p,
                      srv_error *err);
/* /tokenize (vLLM's): {"prompt": text or ids} or {"messages": [...]} (the chat template
 * applied) to {"count", "max_model_len", "tokens"}; /detokenize: {"tokens": [ids]} to
 * {"prompt": text}. NULL with *err set on a bad body. */
cJSON *srv_tokenize(srv_ctx *c, const char *body, size_t len, srv_error *err);
cJSON *srv_detokenize(srv_ctx *c, const char *body, size_t len, srv_error *err);
void srv_params_free(srv_params *p);

/* --- srv_job.c ---------------------------------------------------------------------------- */

typedef struct srv_tok { /* one generated token, kept when logprobs were asked for */
  int32_t id;
  float logprob;
  int n_top;
  int32_t top_id[IRT_MAX_TOP_LOGPROBS];
  float top_lp[IRT_MAX_TOP_LOGPROBS];
} srv_tok;

typedef struct srv_choice {
  char *text; /* everything generated so far (stop strings cut) */
  size_t len, cap;
  srv_tok *toks; /* (n_toks) with logprobs only */
  int64_t n_toks, cap_toks;
  int64_t n_gen; /* tokens generated */
  double cum_lp; /* their log-probabilities summed (best_of's score) */
  irt_finish finish;
  /* the stream's cursor (consumer side) */
  size_t sent_len;
  int64_t sent_toks, sent_offset; /* text_offset of the next streamed token (completions) */
  bool sent_role, sent_finish, sent_echo;
  int sent_calls;    /* tool calls streamed */
  bool sent_rest;    /* the text after a malformed call, streamed as content at the end */
  size_t sent_think; /* end of the thoughts streamed as reasoning_content */
} srv_choice;

typedef struct srv_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs; /* the caller's and the engine's */
  srv_ctx *c;
  srv_params p;
  irt_request_id rid;
  char id[48]; /* "cmpl-..." / "chatcmpl-..." */
  int64_t created;
  srv_choice *ch; /* (p.n) */
  srv_tok *ptoks; /* echo with logprobs: (p.n_prompt) the prompt's tokens; the first has no
                      logprob (NAN), the others come from the engine as they are scored */
  int64_t n_ptoks;
  int64_t prompt_tokens, cached_tokens;
  bool done;                        /* the engine sent its last event */
  bool cancelled;                   /* we asked the engine to stop (client gone) */
  bool failed;                      /* ended CANCELLED without our asking: the engine failed */
  double t_submit, t_first, t_done; /* ms, monotonic */
  uint64_t events, seen;            /* events received; seen by the consumer's last wait */
  void (*wake)(void *cls);          /* set by srv_job_park: called once, under mu, at news */
  void *wake_cls;
} srv_job;

/* Submits p (moved into the job; p is zeroed). NULL with err filled when the engine refuses
 * (429 when its queue is full, 400 for bad parameters); p is then unchanged and still the
 * caller's to retry or to srv_params_free. The job is referenced by the caller
 * and by the engine until its last event; the caller ends its share with srv_job_release. */
srv_job *srv_job_submit(srv_ctx *c, srv_params *p, srv_error *err);
/* Waits up to timeout_ms for news (any new event); returns j->done. Lock-free to call. */
bool srv_job_wait(srv_job *j, int timeout_ms);
/* The non-blocking form of srv_job_wait, for an event-driven consumer: with no news since
 * the last wait or park, calls park(cls) (e.g. suspends the connection) and arranges for
 * wake(cls) to be called once, under the job's lock, at the next event; returns true. With
 * news, marks it seen and returns false (*done then says whether the job is done). park and
 * wake both run under the job's lock, so a wake can never come before its park. */
bool srv_job_park(srv_job *j, void (*park)(void *), void (*wake)(void *), void *cls, bool *done);
/* Asks the engine to stop the request (idempotent); its sequences are freed at the next step. */
void srv_job_cancel(srv_job *j);
void srv_job_release(srv_job *j);

/* --- srv_openai.c ------------------------------------------------------------------------- */

bool srv_buf_put(srv_buf *b, const char *s, size_t n);
void srv_buf_free(srv_buf *b);

/* {"error": {...}} as a malloc'd string. */
char *srv_render_error(const srv_error *e);
/* The whole response of a finished job (completions or chat), as a cJSON object. */
cJSON *srv_render_response(srv_job *j);
/* Appends the SSE chunks for what is new since the last call; after the last event also the
 * finish chunks, the usage chunk (include_usage) and "data: [DONE]". Returns true when the
 * stream is complete. Takes the job's lock. */
bool srv_render_stream(srv_job *j, srv_buf *out);
/* The finish_reason string of a completion. */
const char *srv_finish_name(irt_finish f);

#endif
