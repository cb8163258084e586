/* fmt_gguf_tok: the tokenizer a GGUF file carries (tokenizer.ggml.* metadata) mapped onto
 * the runtime tokenizer: model "gpt2" is byte-level BPE with the pre-tokenizer that
 * tokenizer.ggml.pre names; model "llama" is SentencePiece-style BPE with byte fallback
 * whose merges come from the token scores. */
#ifndef FMT_GGUF_TOK_H
#define FMT_GGUF_TOK_H

#include "fmt_gguf.h"
#include "tokenizer.h"

/* *out is NULL (and IR_OK) when the file has no tokenizer. Owned by the caller. */
ir_status fmt_gguf_tokenizer(const fmt_gguf *g, irt_tokenizer **out, ir_diag *d);

#endif
