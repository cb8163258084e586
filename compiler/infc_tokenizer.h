/* infc_tokenizer: finds the tokenizer that belongs with a source model and encodes it
 * for the plan: --tokenizer PATH if given (a tokenizer.json), else tokenizer.json (and
 * tokenizer_config.json) beside the checkpoint or model.onnx. A model without one still
 * builds: its plan then takes and returns token ids only. */
#ifndef INFC_TOKENIZER_H
#define INFC_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "ir_status.h"

typedef struct infc_tok_blob {
  uint8_t *data; /* encoded infc.tok.Tokenizer (malloc'd), NULL if none */
  size_t size;
  char origin[256]; /* where it came from, for the build report */
} infc_tok_blob;

/* Loads an HF tokenizer.json (with tokenizer_config.json beside it if present), checks
 * it against the model's vocabulary size (every id must be a row of the embedding), and
 * encodes it. */
ir_status infc_tokenizer_load_json(const char *json_path, int64_t model_vocab, infc_tok_blob *out,
                                   ir_diag *d);

/* The tokenizer beside `src` (a checkpoint dir, a .safetensors or .onnx file), or an
 * empty blob if there is none. */
ir_status infc_tokenizer_beside(const char *src, int64_t model_vocab, infc_tok_blob *out,
                                ir_diag *d);

typedef struct fmt_gguf fmt_gguf;
/* The tokenizer a GGUF file carries, encoded for a plan and checked against the model's
 * vocabulary size; an empty blob if the file has none. */
ir_status infc_gguf_tokenizer_blob(const fmt_gguf *g, int64_t model_vocab, infc_tok_blob *out,
                                   ir_diag *d);

void infc_tok_blob_free(infc_tok_blob *b);

#endif
