/* infc_gguf_llama: a GGUF model of the Llama family as the Llama template's parameters
 * and tensor source. general.architecture "llama" (Llama, Mistral, SmolLM, ... as
 * llama.cpp's converter writes them), "qwen2", "qwen3", "phi3", "smollm3", "gemma2" and
 * "gemma3" (the text model) are accepted. */
#ifndef INFC_GGUF_LLAMA_H
#define INFC_GGUF_LLAMA_H

#include <stdbool.h>
#include <stddef.h>

#include "fmt_gguf.h"
#include "llama.h"

/* Reads <arch>.block_count, .context_length, .embedding_length, .feed_forward_length,
 * .attention.head_count[_kv], .attention.key_length, .attention.layer_norm_rms_epsilon,
 * .rope.freq_base, .rope.dimension_count, .vocab_size (or the tokenizer.ggml.tokens
 * length) and tokenizer.ggml.bos/eos_token_id; ties the embeddings when there is no
 * output.weight. llama-arch files get interleaved RoPE: llama.cpp's converter permutes
 * the q/k projection rows for it. Refuses (IR_UNSUPPORTED, naming the key or tensor)
 * what the template cannot express: another architecture, experts, rope scaling,
 * partial rotary, and tensor types the kernels lack. Messages start with the path. */
ir_status infc_gguf_llama_params(const fmt_gguf *g, model_llama_params *out, ir_diag *d);

/* A tensor source over g (which must stay open while it is used) that answers HF names
 * ("model.layers.3.self_attn.q_proj.weight") with the GGUF tensor ("blk.3.attn_q.weight"),
 * its shape row-major as the template expects. */
model_tensor_src infc_gguf_llama_src(const fmt_gguf *g);

/* The GGUF name of an HF tensor name into buf; false if it has none or buf is short.
 * _arch: as the converter names them for general.architecture arch (gemma2 and gemma3
 * name their norms apart); the plain form is llama's. */
bool infc_gguf_llama_name(const char *hf, char *buf, size_t len);
bool infc_gguf_llama_name_arch(const char *arch, const char *hf, char *buf, size_t len);

#endif
