/* fuzz_tok_blob: libFuzzer target for the tokenizer as a plan stores it: tok_deserialize
 * (text/tok_serial.c) of an encoded infc.tok.Tokenizer message (ir/tokenizer.proto), which
 * `inferrt` reads from every plan it opens; a tokenizer that loads is exercised as fuzz_tok.h
 * says. The input is the message's bytes. Build and run: tools/fuzz tok_blob. */
#include <stdint.h>

#include "fuzz_tok.h"
#include "fuzz_util.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  if (tok_deserialize(data, size, &t, &d) != IR_OK) {
    fz_note("deserialize", d.msg);
    return 0;
  }
  fz_exercise_tokenizer(t);
  tok_destroy(t);
  return 0;
}
