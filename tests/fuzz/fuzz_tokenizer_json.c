/* fuzz_tokenizer_json: libFuzzer target for the HF tokenizer.json loader (text/tok_hf.c:
 * model, vocab, merges, added tokens, normalizer, pre-tokenizer, post-processor, and the
 * tokenizer_config.json beside it) and the tokenizer it builds (tok_create), which is then
 * exercised as fuzz_tok.h says: encode, decode, stream, serialize and read back. The input is
 * tokenizer.json's text, optionally followed by a NUL byte and tokenizer_config.json's text
 * (JSON holds no raw NUL, so the split is unambiguous). Build and run: tools/fuzz
 * tokenizer_json. */
#include <stdint.h>
#include <string.h>

#include "fuzz_tok.h"
#include "fuzz_util.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  size_t jlen = nul ? (size_t)(nul - data) : size;
  const char *json = fz_write("tokenizer.json", data, jlen);
  const char *cfg = nul ? fz_write("tokenizer_config.json", nul + 1, size - jlen - 1) : NULL;
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  if (tok_load_hf(json, cfg, &t, &d) != IR_OK) {
    fz_note("load", d.msg);
    return 0;
  }
  fz_exercise_tokenizer(t);
  tok_destroy(t);
  return 0;
}
