/* infc_onnx_llm: serves exported causal-LM graphs as LLM plans. Recognises the
 * Llama decoder in an ONNX graph (torch.onnx.export of HF Llama-family models, with or
 * without optimum-style past_key_values inputs: embedding Gather, RMSNorm
 * pow/mean/add/sqrt/div/mul, q/k/v (+ bias) and o MatMuls, rotate-half or interleaved
 * RoPE, the past-KV Concat, scaled masked softmax attention with GQA repeat_kv, SwiGLU,
 * final norm, lm_head), extracts its weights under their HF names and builds the program
 * with model_llama_build, so the plan runs on the flat step batch and the paged KV cache
 * like a safetensors checkpoint (present.* outputs are dropped; attention_mask is taken
 * as all ones: sequences never share a row of the step batch). */
#ifndef INFC_ONNX_LLM_H
#define INFC_ONNX_LLM_H

#include <stddef.h>

#include "infc_onnx.h"
#include "model_template.h"

#define INFC_ONNX_LLM_RECOGNISED 256

/* Loads `path`. If its graph is a causal LM (an input "input_ids" and an output
 * "logits"), recognises the decoder and builds the LLM program: *out_is_lm true,
 * *out_model and *out_graph set (owned by the caller; close the model after destroying
 * the graph), out_hash as infc_onnx_import, and `recognised` (INFC_ONNX_LLM_RECOGNISED
 * bytes) a one-line summary ("2 attention blocks -> paged attention, GQA 4/2, ...").
 * A causal LM whose structure is not matched fails naming the part that was not,
 * unless all its input dims are fixed: then, as for any other graph, *out_is_lm is
 * false, nothing is kept, `recognised` says why it is not a servable LLM, and the caller
 * imports the generic graph. max_position_embeddings, bos and eos come from a
 * config.json beside the model when there is one (else 2048, -1, -1). */
ir_status infc_onnx_llm_import(const char *path, const model_build_opts *bo, bool *out_is_lm,
                               infc_onnx **out_model, ir_graph **out_graph, char *out_hash,
                               char *recognised, ir_diag *d);

#endif
