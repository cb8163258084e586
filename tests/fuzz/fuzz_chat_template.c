/* fuzz_chat_template: libFuzzer target for the chat templates (text/chat_template.c):
 * family detection from a Jinja source (tokenizer_config.json's or GGUF's chat_template,
 * untrusted like the rest of the model) and the renderers over a conversation (the request's
 * messages). Input layout:
 *   byte 0    flags: bit 0 add_generation_prompt, bit 1 tools offered, bit 2 no_thinking,
 *             bit 3 the template part is a family name (--chat-template) not a source,
 *             bit 4 llama3.1's date "" (the day of rendering; else the fixed one)
 *   then      the template source (or name), up to the first NUL byte
 *   then      the messages: NUL-separated fields taken three at a time (role, content,
 *             reasoning; an empty reasoning is none), at most 16 messages
 * A rendering is made into a short buffer and into one of its full length: the short one
 * must be the full one's prefix, NUL-terminated; the spans of the messages' text must lie
 * in order inside the output, and 2 per message + 1 must suffice as the header says (a
 * violation traps). Build and run: tools/fuzz chat_template. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "fuzz_util.h"

#define MAX_MSGS 16
#define SHORT 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t flags = data[0];
  char *text = fz_strndup(data + 1, size - 1), *end = text + (size - 1);
  /* fields: the template, then up to 3 * MAX_MSGS message fields */
  char *field[1 + 3 * MAX_MSGS];
  int nf = 0;
  for (char *p = text; nf < 1 + 3 * MAX_MSGS;) {
    field[nf++] = p;
    p += strlen(p);
    if (p >= end) break;
    p++;
  }
  chat_msg msgs[MAX_MSGS];
  size_t n = 0;
  for (int i = 1; i + 1 < nf; i += 3, n++)
    msgs[n] = (chat_msg){.role = field[i],
                         .content = field[i + 1],
                         .reasoning = i + 2 < nf && *field[i + 2] ? field[i + 2] : NULL};
  chat_tmpl t;
  ir_diag d = {0};
  ir_status st;
  if (flags & 8) {
    memset(&t, 0, sizeof t);
    t.kind = chat_kind_from_name(field[0]);
    st = t.kind == CHAT_UNKNOWN ? IR_UNSUPPORTED : IR_OK;
    (void)chat_kind_name(t.kind);
  } else {
    st = chat_template_detect(field[0], &t, &d);
  }
  if (st != IR_OK) {
    fz_note("detect", d.msg);
    free(text);
    return 0;
  }
  t.tools = flags & 2;
  t.no_thinking = flags & 4;
  if (flags & 16) t.date[0] = 0;
  bool gen = flags & 1;
  char small[SHORT];
  size_t len = 0, len2 = 0, n_spans = 0;
  d = (ir_diag){0};
  if (chat_render(&t, msgs, n, gen, small, sizeof small, &len, &d) != IR_OK) {
    fz_note("render", d.msg);
    free(text);
    return 0;
  }
  if (strlen(small) != (len < SHORT ? len : SHORT - 1)) __builtin_trap(); /* NUL misplaced */
  char *full = malloc(len + 1);
  chat_span *spans = malloc((2 * n + 1) * sizeof *spans);
  d = (ir_diag){0};
  st = chat_render_spans(&t, msgs, n, gen, full, len + 1, &len2, spans, 2 * n + 1, &n_spans, &d);
  if (st != IR_OK) __builtin_trap(); /* 2 per message + 1 spans did not suffice */
  if (len2 != len || memcmp(small, full, strlen(small)) || full[len]) __builtin_trap();
  for (size_t i = 0; i < n_spans; i++) /* in order, inside the output */
    if (spans[i].start > spans[i].end || spans[i].end > len ||
        (i && spans[i].start < spans[i - 1].end))
      __builtin_trap();
  free(spans);
  free(full);
  free(text);
  return 0;
}
