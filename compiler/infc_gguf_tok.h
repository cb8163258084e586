/* infc_gguf_tok: the tokenizer a GGUF file carries (tokenizer.ggml.* metadata) mapped onto
 * the runtime tokenizer: model "gpt2" is byte-level BPE with the pre-tokenizer that
 * tokenizer.ggml.pre names; model "llama" is SentencePiece-style BPE with byte fallback
 * whose merges come from the token scores. */
#ifndef INFC_GGUF_TOK_H
#define INFC_GGUF_TOK_H

#include "infc_gguf.h"
#include "infc_tokenizer.h"
#include "inferrt.h"
#include "tokenizer.h"

/* *out is NULL (and IR_OK) when the file has no tokenizer. Owned by the caller. */
ir_status infc_gguf_tokenizer(const infc_gguf *g, irt_tokenizer **out, ir_diag *d);
/* The same, encoded for a plan and checked against the model's vocabulary size. */
ir_status infc_gguf_tokenizer_blob(const infc_gguf *g, int64_t model_vocab, infc_tok_blob *out,
                                   ir_diag *d);
/* Opens a .gguf file just for its tokenizer (inferrt tokenize --tokenizer model.gguf). */
irt_status infc_gguf_open_tokenizer(const char *path, irt_tokenizer **out, irt_error *err);

#endif
