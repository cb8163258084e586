/* srv_think: a thinking model's answer split into its thoughts and the rest, as vLLM's
 * reasoning parsers and llama.cpp's reasoning_format give them (the thoughts as
 * reasoning_content, the rest as content). The answer opens with "<think>" (or the prompt
 * already did); the thoughts end at the first "</think>". Both parts drop the newlines
 * that Qwen3's template writes around them ("<think>\n" thoughts "\n</think>\n\n"), so a
 * client that sends them back as reasoning_content and content gets the same prompt. */
#include <string.h>

#include "openai.h"

static const char k_open[] = "<think>", k_close[] = "</think>";

/* The length of the longest proper prefix of tag that text[0, len) ends with. */
static size_t partial_tag(const char *text, size_t len, const char *tag) {
  size_t n = strlen(tag);
  for (size_t k = n - 1; k > 0; k--)
    if (k <= len && !memcmp(text + len - k, tag, k)) return k;
  return 0;
}

static const char *find_n(const char *text, size_t len, const char *tag) {
  size_t n = strlen(tag);
  for (size_t i = 0; i + n <= len; i++)
    if (!memcmp(text + i, tag, n)) return text + i;
  return NULL;
}

void srv_think_split(const char *text, size_t len, bool open, bool final, srv_think *out) {
  size_t no = strlen(k_open), nc = strlen(k_close);
  *out = (srv_think){.content = 0, .content_end = len};
  if (!open) {
    bool starts = len >= no && !memcmp(text, k_open, no);
    if (!starts) { /* no thoughts; a beginning that may still become "<think>" waits */
      if (!final && len < no && !memcmp(text, k_open, len)) out->content_end = 0;
      return;
    }
  }
  size_t b = open ? 0 : no;
  while (b < len && text[b] == '\n') b++;
  out->has = true;
  out->think = b;
  const char *close = find_n(text + b, len - b, k_close);
  size_t e = close ? (size_t)(close - text) : len;
  if (!close && !final) e -= partial_tag(text + b, len - b, k_close);
  size_t t = e;
  while (t > b && text[t - 1] == '\n')
    t--; /* trailing newlines: kept back until it is known
                                              whether thoughts follow them */
  out->think_end = t;
  if (!close) { /* still thinking (or cut off while thinking: then there is no answer) */
    out->content = out->content_end = len;
    return;
  }
  out->closed = true;
  size_t c = e + nc;
  while (c < len && text[c] == '\n') c++;
  out->content = c;
}
