/* chat_template: renders a conversation into the prompt text a model was trained on.
 * The engine does not interpret Jinja: it recognises the template family from the
 * template source (tokenizer_config.json / GGUF tokenizer.chat_template) or takes it by
 * name, and renders that family's format in C. A template it cannot recognise is an
 * error that names the known families. */
#ifndef TEXT_CHAT_TEMPLATE_H
#define TEXT_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "ir_status.h"

typedef enum chat_kind {
  CHAT_UNKNOWN = 0,
  CHAT_CHATML = 1,      /* <|im_start|>role\n...<|im_end|>\n (Qwen2, SmolLM, ...) */
  CHAT_LLAMA3 = 2,      /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
  CHAT_MISTRAL = 3,     /* [INST] ... [/INST] answer</s> (system joined to the first user turn) */
  CHAT_LLAMA2 = 4,      /* [INST] <<SYS>>\n...\n<</SYS>>\n\n ... [/INST] */
  CHAT_GEMMA = 5,       /* <start_of_turn>user\n...<end_of_turn>\n, assistant is "model";
                           a leading system message opens the first turn (Gemma 3's form) */
  CHAT_PHI3 = 6,        /* <|user|>\n...<|end|>\n<|assistant|>\n */
  CHAT_LLAMA31 = 7,     /* llama3 with Llama 3.1's system turn, always written: knowledge
                           cutoff, today's date, then the system message */
  CHAT_QWEN3 = 8,       /* chatml with Qwen3's thinking turns: <think>...</think> dropped from
                           assistant turns before the last query, the later ones rewritten
                           as "<think>\n" thoughts "\n</think>\n\n" answer; no_thinking opens
                           the new turn with an empty thought (enable_thinking false) */
  CHAT_DEEPSEEK_R1 = 9, /* DeepSeek-R1 and its distills: BOS, the system prompt, then
                               <｜User｜>... <｜Assistant｜>answer<｜end▁of▁sentence｜>, past
                               thoughts dropped; the new turn opens a thought (<think>\n),
                               closed at once with no_thinking */
} chat_kind;

/* The "Today Date" Llama 3.1's template writes (its literal; also what named llama3.1 gets). */
#define CHAT_LLAMA31_DATE "26 Jul 2024"

typedef struct chat_msg {
  const char *role; /* "system", "user", "assistant", or "ipython" (a tool's result) */
  const char *content;
  const char *reasoning; /* an assistant turn's thoughts given apart (reasoning_content), or
                            NULL: then qwen3 reads them out of content's <think> block */
} chat_msg;

typedef struct chat_tmpl {
  chat_kind kind;
  char default_system[512]; /* system prompt the template inserts when none is given */
  char bos[32];             /* BOS text the template writes itself ("" if none) */
  bool tools;               /* the conversation offers tools (llama3.1: "Environment: ipython") */
  bool no_thinking;         /* qwen3: enable_thinking false (an empty thought opens the turn) */
  char date[32];            /* llama3.1: the "Today Date" ("26 Jul 2024" as Llama 3.1's
                               template has it; "" for the day of rendering, "%d %b %Y" in
                               local time, as templates calling strftime_now get it) */
} chat_tmpl;

/* The family name ("chatml", "llama3", ...) and the reverse lookup (UNKNOWN if none). */
const char *chat_kind_name(chat_kind k);
chat_kind chat_kind_from_name(const char *name);

/* Recognises the family of a Jinja template source, with its default system prompt.
 * IR_UNSUPPORTED (message lists the families and --chat-template) if unrecognised. */
ir_status chat_template_detect(const char *source, chat_tmpl *out, ir_diag *d);

/* A byte range [start, end) of a rendering that was copied from a message's text. */
typedef struct chat_span {
  size_t start, end;
} chat_span;

/* Renders msgs; with add_generation_prompt the assistant's turn is opened at the end.
 * Writes at most cap bytes plus a NUL; *out_len is the full length (excluding NUL).
 * Unknown roles and a kind of UNKNOWN are IR_INVALID_ARG. */
ir_status chat_render(const chat_tmpl *t, const chat_msg *msgs, size_t n,
                      bool add_generation_prompt, char *buf, size_t cap, size_t *out_len,
                      ir_diag *d);
/* chat_render that also lists where the messages' own text went (content and thoughts,
 * by the provenance of each copied byte run; adjacent runs merged): up to cap_spans spans in
 * order, *n_spans of them (IR_OOM past cap_spans; 2 per message + 1 always suffice, as no
 * template writes a message's text twice). The tokenizer keeps special tokens out of them. */
ir_status chat_render_spans(const chat_tmpl *t, const chat_msg *msgs, size_t n,
                            bool add_generation_prompt, char *buf, size_t cap, size_t *out_len,
                            chat_span *spans, size_t cap_spans, size_t *n_spans, ir_diag *d);

#endif
