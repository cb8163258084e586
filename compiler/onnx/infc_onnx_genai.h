/* infc_onnx_genai: serves decoder graphs written by the ONNX Runtime GenAI model builder
 * (onnxruntime_genai.models.builder) as LLM plans. Recognises its contrib ops —
 * GroupQueryAttention (packed or separate q/k/v, past/present KV, rotary inside the op or
 * in com.microsoft RotaryEmbedding nodes), MatMulNBits (4-bit block-quantized weights),
 * SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization (RMSNorm with the
 * residual add) — plus the embedding Gather, the Sigmoid/Mul SwiGLU MLP and lm_head, and
 * rebuilds the decoder with the Llama template (models/llama.h) on the paged KV cache.
 * MatMulNBits weights are dequantized to f32 at import exactly as the op defines them:
 * w = (q - zero_point) * scale per block along K (zero point 8 when absent). */
#ifndef INFC_ONNX_GENAI_H
#define INFC_ONNX_GENAI_H

#include <stdbool.h>

#include "infc_onnx.h"
#include "model_template.h"

/* True when the model's graph holds a com.microsoft GroupQueryAttention node. */
bool infc_onnx_genai_detect(const infc_onnx *m);

/* Recognises the decoder of m (loaded by the caller, a causal LM: input_ids -> logits)
 * and builds the LLM program. Takes ownership of m: on success *out_model = m (close it
 * after destroying *out_graph, whose weights may point into its mappings), on failure m
 * is closed. out_hash: 16 hex digits + NUL, as infc_onnx_import. recognised
 * (INFC_ONNX_LLM_RECOGNISED bytes) gets a one-line summary. A part of the graph that is
 * not matched, or an attribute whose effect the template cannot reproduce (a sliding
 * window, softcap, scaled RoPE, ...), fails with IR_UNSUPPORTED naming the node, its op
 * and the attribute; a malformed quantized weight with IR_BAD_FORMAT. context_length,
 * bos and eos come from a genai_config.json beside the model (else a config.json, else
 * the cos cache length, -1, -1). */
ir_status infc_onnx_genai_import(infc_onnx *m, const char *path, const model_build_opts *bo,
                                 infc_onnx **out_model, ir_graph **out_graph, char *out_hash,
                                 char *recognised, ir_diag *d);

#endif
