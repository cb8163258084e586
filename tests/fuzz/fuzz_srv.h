/* fuzz_srv: what the server-side targets (http_params, batch_line) parse requests against:
 * the gpt2 fixture tokenizer and a model description, no engine (the parsers need none). */
#ifndef FUZZ_SRV_H
#define FUZZ_SRV_H

#include <stdio.h>
#include <stdlib.h>

#include "inferrt.h"

static irt_tokenizer *tok;
static irt_model_info info = {.arch = "llama",
                              .context_length = 4096,
                              .max_step_seqs = 4,
                              .max_step_logits = 4,
                              .bos_token_id = -1,
                              .eos_token_id = -1};

/* Loads the tokenizer (aborts naming the target if the fixture is absent). */
static void fz_srv_init(const char *target) {
  irt_error err = {0};
  if (irt_tokenizer_open_json(FUZZ_FIXTURES "/tokenizers/gpt2/tokenizer.json",
                              FUZZ_FIXTURES "/tokenizers/gpt2/tokenizer_config.json", &tok,
                              &err) != IRT_OK) {
    fprintf(stderr, "%s: cannot load the tokenizer: %s\n", target, err.msg);
    abort();
  }
  info.vocab_size = irt_tokenizer_vocab_size(tok);
}

#endif
