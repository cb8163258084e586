/* chat_template: family detection and rendering. Each renderer mirrors the reference
 * Jinja template of its family (tests compare against Jinja's output). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_template.h"
#include "ir_alloc.h"

/* DeepSeek's special tokens spell their bars and spaces as U+FF5C and U+2581. */
#define FW_BAR "\xef\xbd\x9c"
#define SP "\xe2\x96\x81"

static const char *const k_names[] = {"unknown", "chatml", "llama3",   "mistral", "llama2",
                                      "gemma",   "phi3",   "llama3.1", "qwen3",   "deepseek-r1"};

const char *chat_kind_name(chat_kind k) {
  return (unsigned)k < sizeof k_names / sizeof *k_names ? k_names[k] : "unknown";
}

chat_kind chat_kind_from_name(const char *name) {
  for (size_t i = 1; i < sizeof k_names / sizeof *k_names; i++)
    if (!strcmp(name, k_names[i])) return (chat_kind)i;
  return CHAT_UNKNOWN;
}

/* A literal default system prompt: "<|im_start|>system" + newline (real or escaped) + text
 * up to "<|im_end|>", with no Jinja or quotes inside (else it is not a constant); the first
 * such literal of a template that tests for a system message of its own. */
static void chatml_default_system(const char *src, char *out, size_t cap) {
  out[0] = '\0';
  if (!strstr(src, "!= 'system'") && !strstr(src, "== 'system'")) return;
  for (const char *p = strstr(src, "<|im_start|>system"); p;
       p = strstr(p + 1, "<|im_start|>system")) {
    const char *q = p + strlen("<|im_start|>system");
    if (*q == '\n') q++;
    else if (q[0] == '\\' && q[1] == 'n') q += 2;
    else continue;
    const char *end = strstr(q, "<|im_end|>");
    if (!end || (size_t)(end - q) >= cap || end == q) continue;
    const char *c = q;
    while (c < end && *c != '\'' && *c != '"' && *c != '{' && *c != '}') c++;
    if (c < end) continue;
    memcpy(out, q, (size_t)(end - q));
    out[end - q] = '\0';
    return;
  }
}

ir_status chat_template_detect(const char *src, chat_tmpl *out, ir_diag *d) {
  memset(out, 0, sizeof *out);
  if (!src || !*src)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "the model has no chat template; pass --chat-template "
                       "NAME (chatml, qwen3, deepseek-r1, llama3, llama3.1, mistral, llama2, "
                       "gemma, phi3)");
  if (strstr(src, "<|im_start|>") && strstr(src, "Reasoning Mode")) /* not Qwen3's */
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "SmolLM3's chat template (its metadata system turn "
                       "and /think flags) is not one the engine renders yet; pass "
                       "--chat-template chatml for plain ChatML turns");
  if (strstr(src, "<" FW_BAR "User" FW_BAR ">") && strstr(src, "<" FW_BAR "Assistant" FW_BAR ">")) {
    out->kind = CHAT_DEEPSEEK_R1;
  } else if (strstr(src, "<|im_start|>") && strstr(src, "<think>") &&
             strstr(src, "enable_thinking")) {
    out->kind = CHAT_QWEN3;
  } else if (strstr(src, "<|im_start|>")) {
    out->kind = CHAT_CHATML;
    chatml_default_system(src, out->default_system, sizeof out->default_system);
  } else if (strstr(src, "<|start_header_id|>") && strstr(src, "Cutting Knowledge Date")) {
    out->kind = CHAT_LLAMA31;
    if (!strstr(src, "strftime_now"))
      snprintf(out->date, sizeof out->date, "%s", CHAT_LLAMA31_DATE);
  } else if (strstr(src, "<|start_header_id|>")) {
    out->kind = CHAT_LLAMA3;
  } else if (strstr(src, "<start_of_turn>")) { /* Gemma 1, 2 and 3 (their turn marker) */
    out->kind = CHAT_GEMMA;
  } else if (strstr(src, "<|user|>") && strstr(src, "<|end|>")) {
    out->kind = CHAT_PHI3;
  } else if (strstr(src, "<<SYS>>")) {
    out->kind = CHAT_LLAMA2;
  } else if (strstr(src, "[INST]")) {
    out->kind = CHAT_MISTRAL;
  } else {
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "the model's chat template is not one the engine can "
                       "render; pass --chat-template NAME (chatml, qwen3, deepseek-r1, "
                       "llama3, llama3.1, mistral, llama2, gemma, phi3)");
  }
  const char *bos = out->kind == CHAT_LLAMA3 || out->kind == CHAT_LLAMA31 ? "<|begin_of_text|>"
                    : out->kind == CHAT_GEMMA                             ? "<bos>"
                    : out->kind == CHAT_DEEPSEEK_R1 ? "<" FW_BAR "begin" SP "of" SP
                                                      "sentence" FW_BAR ">"
                    : out->kind == CHAT_MISTRAL || out->kind == CHAT_LLAMA2 ? "<s>"
                                                                            : "";
  if (strstr(src, "bos_token")) snprintf(out->bos, sizeof out->bos, "%s", bos);
  return IR_OK;
}

/* --- rendering -------------------------------------------------------------------------- */

typedef struct sbuf {
  char *buf;
  size_t cap, len;
  /* provenance (chat_render_spans): the messages' text ranges, and the spans of the
   * output copied from them */
  const char *const *lo, *const *hi; /* (n_src) */
  size_t n_src;
  chat_span *spans;
  size_t n_spans, cap_spans;
  bool spans_short;
} sbuf;

/* Records [s->len, s->len + n) as message text when t lies in a message's text. Adjacent
 * spans merge. */
static void note_span(sbuf *s, const char *t, size_t n) {
  bool text = false;
  for (size_t i = 0; i < s->n_src && !text; i++) text = t >= s->lo[i] && t + n <= s->hi[i];
  if (!text || !n) return;
  if (s->n_spans && s->spans[s->n_spans - 1].end == s->len) {
    s->spans[s->n_spans - 1].end += n;
  } else if (s->n_spans < s->cap_spans) {
    s->spans[s->n_spans++] = (chat_span){s->len, s->len + n};
  } else {
    s->spans_short = true;
  }
}

static void put_n(sbuf *s, const char *t, size_t n) {
  if (s->spans) note_span(s, t, n);
  if (s->len < s->cap) {
    size_t room = s->cap - s->len;
    memcpy(s->buf + s->len, t, n < room ? n : room);
  }
  s->len += n;
}

static void put(sbuf *s, const char *t) { put_n(s, t, strlen(t)); }

/* Jinja's |trim: strips leading and trailing whitespace. */
static void put_trim(sbuf *s, const char *t) {
  size_t n = strlen(t);
  while (n && strchr(" \t\n\r\f\v", *t)) t++, n--;
  while (n && strchr(" \t\n\r\f\v", t[n - 1])) n--;
  put_n(s, t, n);
}

static int role_of(const char *r) {
  return !strcmp(r, "system")      ? 0
         : !strcmp(r, "user")      ? 1
         : !strcmp(r, "assistant") ? 2
         : !strcmp(r, "ipython")   ? 3
                                   : -1;
}

/* One ChatML turn: <|im_start|>role\ncontent<|im_end|>\n. */
static void chatml_turn(sbuf *s, const char *role, const char *content) {
  put(s, "<|im_start|>");
  put(s, role);
  put(s, "\n");
  put(s, content);
  put(s, "<|im_end|>\n");
}

static void render_chatml(const chat_tmpl *t, const chat_msg *m, size_t n, bool gen, sbuf *s) {
  for (size_t i = 0; i < n; i++) {
    if (i == 0 && role_of(m[0].role) != 0 && t->default_system[0])
      chatml_turn(s, "system", t->default_system);
    chatml_turn(s, m[i].role, m[i].content);
  }
  if (gen) put(s, "<|im_start|>assistant\n");
}

/* Jinja's strip('\n') / lstrip('\n') / rstrip('\n') of [*p, *p + *n). */
static void nl_trim(const char **p, size_t *n, bool left, bool right) {
  while (left && *n && **p == '\n') (*p)++, (*n)--;
  while (right && *n && (*p)[*n - 1] == '\n') (*n)--;
}

/* What follows the last </think> of c (c itself if none): an answer without its thoughts. */
static const char *after_thoughts(const char *c) {
  for (const char *e = strstr(c, "</think>"); e; e = strstr(e + 1, "</think>"))
    c = e + strlen("</think>");
  return c;
}

/* A tool result the Hermes form wrote as a user turn: not a query. */
static bool tool_response(const char *c) {
  size_t n = strlen(c), open = strlen("<tool_response>"), close = strlen("</tool_response>");
  return n >= open + close && !strncmp(c, "<tool_response>", open) &&
         !strcmp(c + n - close, "</tool_response>");
}

/* Qwen3's assistant turn: its thoughts (the message's own, or those of content's think
 * block: before the first </think>, after the last <think>) and the answer (after the last
 * </think>), written out only after the last query, as Qwen3-0.6B's template does. */
static void qwen3_assistant(const chat_msg *m, bool after_query, bool last, sbuf *s) {
  const char *content = m->content, *think = m->reasoning ? m->reasoning : "";
  size_t cn = strlen(content), tn = strlen(think);
  const char *end = m->reasoning ? NULL : strstr(content, "</think>");
  if (end) {
    think = content, tn = (size_t)(end - content);
    for (const char *o = strstr(content, "<think>"); o && o < end; o = strstr(o + 1, "<think>"))
      think = o + strlen("<think>"), tn = (size_t)(end - think);
    nl_trim(&think, &tn, true, true);
    content = after_thoughts(content);
    cn = strlen(content);
    nl_trim(&content, &cn, true, false);
  }
  put(s, "<|im_start|>assistant\n");
  if (after_query && (last || tn)) {
    nl_trim(&think, &tn, true, true);
    put(s, "<think>\n");
    put_n(s, think, tn);
    put(s, "\n</think>\n\n");
    nl_trim(&content, &cn, true, false);
  }
  put_n(s, content, cn);
  put(s, "<|im_end|>\n");
}

static void render_qwen3(const chat_tmpl *t, const chat_msg *m, size_t n, bool gen, sbuf *s) {
  size_t last_query = n ? n - 1 : 0;
  for (size_t i = n; i-- > 0;)
    if (role_of(m[i].role) == 1 && !tool_response(m[i].content)) {
      last_query = i;
      break;
    }
  for (size_t i = 0; i < n; i++) {
    if (role_of(m[i].role) == 2) {
      qwen3_assistant(&m[i], i > last_query, i + 1 == n, s);
      continue;
    }
    chatml_turn(s, m[i].role, m[i].content);
  }
  if (gen)
    put(s, t->no_thinking ? "<|im_start|>assistant\n<think>\n\n</think>\n\n"
                          : "<|im_start|>assistant\n");
}

/* DeepSeek-R1's template: BOS and the (last) system message's text, user turns after
 * <｜User｜>, assistant turns after <｜Assistant｜> with their thoughts (up to the last
 * </think>) dropped, each closed by <｜end▁of▁sentence｜>; the new turn opens a thought. */
static void render_deepseek_r1(const chat_tmpl *t, const chat_msg *m, size_t n, bool gen, sbuf *s) {
  static const char user[] = "<" FW_BAR "User" FW_BAR ">";
  static const char assistant[] = "<" FW_BAR "Assistant" FW_BAR ">";
  static const char eos[] = "<" FW_BAR "end" SP "of" SP "sentence" FW_BAR ">";
  put(s, t->bos);
  const char *sys = "";
  for (size_t i = 0; i < n; i++)
    if (role_of(m[i].role) == 0) sys = m[i].content;
  put(s, sys);
  for (size_t i = 0; i < n; i++) {
    int r = role_of(m[i].role);
    if (r == 1) {
      put(s, user);
      put(s, m[i].content);
    } else if (r == 2) {
      put(s, assistant);
      put(s, after_thoughts(m[i].content));
      put(s, eos);
    }
  }
  if (gen) {
    put(s, assistant);
    put(s, t->no_thinking ? "<think>\n</think>" : "<think>\n");
  }
}

static void render_llama3(const chat_tmpl *t, const chat_msg *m, size_t n, bool gen, sbuf *s) {
  put(s, t->bos);
  for (size_t i = 0; i < n; i++) {
    put(s, "<|start_header_id|>");
    put(s, m[i].role);
    put(s, "<|end_header_id|>\n\n");
    put_trim(s, m[i].content);
    put(s, "<|eot_id|>");
  }
  if (gen) put(s, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Llama 3.1 / 3.2 / 3.3: a system turn always, with the knowledge cutoff and the date
 * before the (trimmed) system message. */
static void render_llama31(const chat_tmpl *t, const chat_msg *m, size_t n, bool gen, sbuf *s) {
  char today[32];
  const char *date = t->date;
  if (!date[0]) {
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(today, sizeof today, "%d %b %Y", &tm))
      snprintf(today, sizeof today, "%s", CHAT_LLAMA31_DATE);
    date = today;
  }
  bool sys = n && role_of(m[0].role) == 0;
  put(s, t->bos);
  put(s, "<|start_header_id|>system<|end_header_id|>\n\n");
  if (t->tools) put(s, "Environment: ipython\n");
  put(s, "Cutting Knowledge Date: December 2023\nToday Date: ");
  put(s, date);
  put(s, "\n\n");
  if (sys) put_trim(s, m[0].content);
  put(s, "<|eot_id|>");
  chat_tmpl plain = *t;
  plain.bos[0] = '\0';
  render_llama3(&plain, m + sys, n - sys, gen, s);
}

/* Gemma 3's template: turns of trimmed text, the assistant's role written "model"; a
 * leading system message's text (untrimmed) and a blank line open the next message's turn,
 * and with no next message it is dropped; a later system message is a "system" turn.
 * Gemma 2's (and 1's) template raises on a system message instead; llama.cpp folds it into
 * the first user turn for all of them (llama_chat_apply_template's gemma case, which trims
 * it), so one renderer serves both. Roles that do not alternate user/model, where both
 * templates raise, are rendered as given: no other renderer here refuses what its template
 * raises on (Mistral's and Llama 2's raise too), nor does llama.cpp. */
static void render_gemma(const chat_tmpl *t, const chat_msg *m, size_t n, bool gen, sbuf *s) {
  bool sys = n && role_of(m[0].role) == 0;
  put(s, t->bos);
  for (size_t i = sys; i < n; i++) {
    put(s, "<start_of_turn>");
    put(s, role_of(m[i].role) == 2 ? "model" : m[i].role);
    put(s, "\n");
    if (sys && i == 1) {
      put(s, m[0].content);
      put(s, "\n\n");
    }
    put_trim(s, m[i].content);
    put(s, "<end_of_turn>\n");
  }
  if (gen) put(s, "<start_of_turn>model\n");
}

static void render_phi3(const chat_msg *m, size_t n, bool gen, sbuf *s) {
  for (size_t i = 0; i < n; i++) {
    put(s, "<|");
    put(s, m[i].role);
    put(s, "|>\n");
    put(s, m[i].content);
    put(s, "<|end|>\n");
  }
  if (gen) put(s, "<|assistant|>\n");
}

/* [INST] turns. Mistral joins a system prompt to the first user turn with a blank line;
 * Llama 2 wraps it in <<SYS>> and opens every user turn with BOS. */
static void render_inst(const chat_tmpl *t, const chat_msg *m, size_t n, sbuf *s) {
  bool llama2 = t->kind == CHAT_LLAMA2;
  const char *sys = n && role_of(m[0].role) == 0 ? m[0].content : NULL;
  if (!llama2) put(s, t->bos);
  for (size_t i = sys ? 1 : 0; i < n; i++) {
    bool first = i == (sys ? 1u : 0u);
    if (role_of(m[i].role) == 2) {
      put(s, llama2 ? " " : "");
      if (llama2) put_trim(s, m[i].content);
      else put(s, m[i].content);
      put(s, llama2 ? " </s>" : "</s>");
      continue;
    }
    if (llama2) put(s, t->bos);
    put(s, "[INST] ");
    if (first && sys) {
      put(s, llama2 ? "<<SYS>>\n" : "");
      put(s, sys);
      put(s, llama2 ? "\n<</SYS>>\n\n" : "\n\n");
    }
    if (llama2) put_trim(s, m[i].content);
    else put(s, m[i].content);
    put(s, " [/INST]");
  }
}

ir_status chat_render(const chat_tmpl *t, const chat_msg *msgs, size_t n, bool gen, char *buf,
                      size_t cap, size_t *out_len, ir_diag *d) {
  return chat_render_spans(t, msgs, n, gen, buf, cap, out_len, NULL, 0, NULL, d);
}

ir_status chat_render_spans(const chat_tmpl *t, const chat_msg *msgs, size_t n, bool gen, char *buf,
                            size_t cap, size_t *out_len, chat_span *spans, size_t cap_spans,
                            size_t *n_spans, ir_diag *d) {
  for (size_t i = 0; i < n; i++)
    if (!msgs[i].role || !msgs[i].content || role_of(msgs[i].role) < 0)
      return ir_diag_set(d, IR_INVALID_ARG,
                         "message %zu: role must be system, user, assistant "
                         "or ipython",
                         i);
  sbuf s = {.buf = buf, .cap = cap ? cap - 1 : 0};
  const char **ranges = NULL;
  if (spans) { /* each message's content and thoughts: [lo, hi) pairs */
    if (!(ranges = ir_malloc((4 * n + 1) * sizeof *ranges)))
      return ir_diag_set(d, IR_OOM, "out of memory");
    for (size_t i = 0; i < n; i++) {
      const char *r = msgs[i].reasoning ? msgs[i].reasoning : "";
      ranges[i] = msgs[i].content, ranges[2 * n + i] = msgs[i].content + strlen(msgs[i].content);
      ranges[n + i] = r, ranges[3 * n + i] = r + strlen(r);
    }
    s.lo = ranges, s.hi = ranges + 2 * n, s.n_src = 2 * n;
    s.spans = spans, s.cap_spans = cap_spans;
  }
  switch (t->kind) {
  case CHAT_CHATML: render_chatml(t, msgs, n, gen, &s); break;
  case CHAT_QWEN3: render_qwen3(t, msgs, n, gen, &s); break;
  case CHAT_DEEPSEEK_R1: render_deepseek_r1(t, msgs, n, gen, &s); break;
  case CHAT_LLAMA3: render_llama3(t, msgs, n, gen, &s); break;
  case CHAT_LLAMA31: render_llama31(t, msgs, n, gen, &s); break;
  case CHAT_GEMMA: render_gemma(t, msgs, n, gen, &s); break;
  case CHAT_PHI3: render_phi3(msgs, n, gen, &s); break;
  case CHAT_MISTRAL:
  case CHAT_LLAMA2: render_inst(t, msgs, n, &s); break;
  default: ir_free(ranges); return ir_diag_set(d, IR_INVALID_ARG, "no chat template selected");
  }
  ir_free(ranges);
  if (cap) buf[s.len < cap ? s.len : cap - 1] = '\0';
  *out_len = s.len;
  if (n_spans) *n_spans = s.n_spans;
  if (s.spans_short)
    return ir_diag_set(d, IR_OOM, "chat: more than %zu spans of message text", cap_spans);
  return IR_OK;
}
