/* infc_onnx_llm: serves exported causal-LM graphs as LLM plans. The graph is imported as
 * it is into the generic n-d IR at two small sizes (S new tokens after P = 0 or 1 past
 * ones; attention_mask bound to ones, position_ids to P..P+S-1, so the mask, the rope
 * tables and the shape arithmetic fold to constants), and the canonicalize pass
 * (passes/pass_canon.h) recognises the decoder by what it computes and rebuilds it with
 * the Llama template, so the plan runs on the flat step batch and the paged KV cache like a
 * safetensors checkpoint (present.* outputs are dropped; attention_mask is taken as all
 * ones: sequences never share a row of the step batch). ONNX Runtime GenAI builder
 * graphs go to onnx_genai.c. */
#ifndef INFC_ONNX_LLM_H
#define INFC_ONNX_LLM_H

#include <stddef.h>

#include "infc_onnx.h"
#include "model_template.h"

#define INFC_ONNX_LLM_RECOGNISED 512
#define INFC_ONNX_LLM_MAX_INPUTS 512 /* graph inputs: ids, mask, positions, past KV */
/* The recognition runs at 16 tokens (windows up to 11 show in the mask), or past the
 * sliding_window of a config.json beside the model when that is below this. */
#define INFC_ONNX_LLM_MAX_WINDOW_SEEN 16384

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
