/* fuzz_grammar: libFuzzer target for the grammar engine, whose input is a request's. The
 * first line is GBNF, a JSON Schema or a regular expression (by its first byte); the rest is
 * text fed to the compiled grammar byte by byte. Build: tools/fuzz grammar. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "inferrt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  char *src = malloc(size + 1);
  memcpy(src, data + 1, size - 1);
  src[size - 1] = 0;
  char *nl = memchr(src, '\n', size - 1), *text = nl ? nl + 1 : src + size - 1;
  if (nl) *nl = 0;
  ir_diag err = {0};
  char *gbnf = NULL;
  ir_status st = IR_OK;
  switch (data[0] % 4) {
  case 0: gbnf = strdup(src); break;
  case 1: st = gram_json(src, &gbnf, &err); break;
  case 2: st = gram_regex(src, &gbnf, &err); break;
  default: st = gram_json(NULL, &gbnf, &err); break;
  }
  gram *g = NULL;
  if (st == IR_OK && gbnf && gram_compile(gbnf, &g, &err) == IR_OK) {
    gram_state *s = NULL;
    if (gram_state_create(g, &s, &err) == IR_OK) {
      for (const char *p = text; *p; p++)
        if (!gram_state_advance(s, (const uint8_t *)p, 1)) break;
      (void)gram_state_accepting(s);
      (void)gram_state_can_continue(s);
      gram_state_destroy(s);
    }
    gram_destroy(g);
  }
  free(gbnf);
  free(src);
  return 0;
}
