/* test_think: the server's split of a thinking model's answer (runtime/server/srv_think.c).
 * Whole answers against the split Qwen3's template implies (thoughts between "<think>" and
 * the first "</think>", '\n' trimmed around both parts); then the streaming contract on
 * every answer fed one byte at a time and in random chunks: what each partial split
 * releases never changes later (the released thoughts and content only grow, each a
 * prefix of the final part), and the pieces joined are the whole split. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "openai.h"
#include "tcheck.h"

typedef struct part {
  char think[512], content[512];
  bool has;
} part;

static void whole(const char *text, bool open, part *out) {
  srv_think t;
  size_t len = strlen(text);
  srv_think_split(text, len, open, true, &t);
  CHECKF(t.content_end == len && t.think <= t.think_end && t.think_end <= t.content,
         "'%s': offsets %zu %zu %zu %zu", text, t.think, t.think_end, t.content, t.content_end);
  snprintf(out->think, sizeof out->think, "%.*s", (int)(t.think_end - t.think), text + t.think);
  snprintf(out->content, sizeof out->content, "%.*s", (int)(len - t.content), text + t.content);
  out->has = t.has;
}

/* Streams text in pieces of `step` bytes (0: random 1..7) and checks the contract. */
static void stream(const char *text, bool open, int step, unsigned seed) {
  part want;
  whole(text, open, &want);
  size_t len = strlen(text), sent_think = 0, sent_content = 0, at = 0;
  char think[512] = "", content[512] = "";
  srand(seed);
  bool ok = true;
  while (ok) {
    bool final = at == len;
    srv_think t;
    srv_think_split(text, at, open, final, &t);
    if (t.has) {
      size_t from = sent_think > t.think ? sent_think : t.think;
      if (t.think_end > from) {
        strncat(think, text + from, t.think_end - from);
        sent_think = t.think_end;
      }
    }
    size_t from = sent_content > t.content ? sent_content : t.content;
    if (t.content_end > from) {
      strncat(content, text + from, t.content_end - from);
      sent_content = t.content_end;
    }
    /* released so far: prefixes of the final parts */
    ok = !strncmp(think, want.think, strlen(think)) &&
         !strncmp(content, want.content, strlen(content));
    if (final) break;
    at += step ? (size_t)step : 1 + (size_t)(rand() % 7);
    if (at > len) at = len;
  }
  CHECKF(ok && !strcmp(think, want.think) && !strcmp(content, want.content),
         "'%s' (open %d, step %d): streamed '%s' | '%s', whole '%s' | '%s'", text, open, step,
         think, content, want.think, want.content);
}

int main(void) {
  static const struct {
    const char *text;
    bool open, has;
    const char *think, *content;
  } k[] = {
      {"<think>\nSeven has no divisors.\n\n</think>\n\nYes.", false, true, "Seven has no divisors.",
       "Yes."},
      {"No block here.", false, false, "", "No block here."},
      {"<thin", false, false, "", "<thin"}, /* ended before it became a tag */
      {"<think>\nstill thinking\n", false, true, "still thinking", ""}, /* cut off */
      {"<think></think>", false, true, "", ""},
      {"<think>\n\n</think>\n\n", false, true, "", ""},
      {"<think>a</think>b</think>c", false, true, "a", "b</think>c"}, /* the first ends it */
      {"<think>x\n</thi", false, true, "x\n</thi", ""},
      {"<think>a\n\nb</think>\n\n\nc\n", false, true, "a\n\nb", "c\n"},
      {" <think>a</think>b", false, false, "", " <think>a</think>b"},     /* not at the start */
      {"Planning.\n</think>\n\nDone.", true, true, "Planning.", "Done."}, /* prompt opened it */
      {"\n\nhm", true, true, "hm", ""},
      {"", false, false, "", ""},
      {"<think>", false, true, "", ""},
  };
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    part p;
    whole(k[i].text, k[i].open, &p);
    CHECKF(p.has == k[i].has && !strcmp(p.think, k[i].think) && !strcmp(p.content, k[i].content),
           "'%s': has %d think '%s' content '%s'", k[i].text, p.has, p.think, p.content);
    for (int step = 0; step <= 3; step++)
      for (unsigned seed = 1; seed <= (step ? 1u : 20u); seed++)
        stream(k[i].text, k[i].open, step, seed);
  }
  /* random answers over the alphabet the tags are made of */
  static const char *const bits[] = {"<think>", "</think>", "\n", "<", "</", "<thi", "a", "k>"};
  for (unsigned s = 0; s < 400; s++) {
    char text[256] = "";
    srand(1000 + s);
    for (int n = rand() % 12; n-- > 0;) strcat(text, bits[rand() % 8]);
    for (int open = 0; open < 2; open++) {
      stream(text, open, 1, s);
      stream(text, open, 0, s);
    }
  }
  return tcheck_done("think");
}
