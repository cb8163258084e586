/* pass_canon: canonicalization of a generic n-d graph onto the fused LLM ops.
 *
 * pass_canon_llm recognises a causal LM's decoder in a graph the ONNX frontend imported as
 * it is (generic n-d ops), specialized at one size: S new tokens after P past ones, the
 * attention mask bound to all ones and the positions to P..P+S-1, so that everything the
 * exporter computed from shapes, the mask and the positions (the causal mask, the rope
 * tables, the attention scale) has been folded to constants. It recognises the parts by
 * what they compute, not by node sequences:
 *   - norms: w * x * 1/sqrt(mean(x^2) + eps) in any of its spellings (Pow or x*x,
 *     ReduceMean or ReduceSum/N, Sqrt+Reciprocal, Div, Pow -0.5, operands either way) or
 *     RMSNormalization;
 *   - attention: each Softmax whose input is Q.K^T (times constants, plus a constant mask
 *     or Where-selected by one) and whose output multiplies V; Q, K and V traced back to
 *     projections (MatMul or Gemm by constant weights, plus bias) of one normalized hidden
 *     state. The data movement between (reshapes, transposes, head expansion in any form,
 *     the past-KV Concat) is judged by evaluating it on numbered values: head h of Q must
 *     read columns h*hd.., K and V heads h/(H/KV) of theirs, new tokens after the past;
 *   - the mask by its values (allowed exactly where t <= P + s), the scale as the product
 *     of every constant on Q, K and the scores, the rope by its rotation (evaluated:
 *     rotate-half or adjacent pairs) and its folded cos/sin tables (the frequencies read
 *     off them: theta^(-2i/d) for some theta, or carried as they are);
 *   - the MLP as down(act(gate) * up), act silu (x * sigmoid(x)) or tanh-GELU;
 *   - embedding Gather by input_ids, final norm, lm_head whose output is the logits.
 * Anything else fails IR_UNSUPPORTED naming the node and what it does not do. */
#ifndef PASS_CANON_H
#define PASS_CANON_H

#include "llama.h"
#include "pass.h"

/* The graph's interface at its specialization. */
typedef struct pass_llm_io {
  int32_t input_ids; /* the token ids input, [1, S] */
  int32_t logits;    /* the logits output, [1, S, vocab] */
  int64_t past;      /* P: tokens before these (0 or 1; past-KV inputs hold P) */
  int64_t seq;       /* S */
} pass_llm_io;

typedef struct pass_llm_weight {
  char name[96]; /* the HF name the template looks up */
  model_tensor t;
} pass_llm_weight;

/* What was recognised: the template's parameters and its weights by HF name. */
typedef struct pass_llm {
  model_llama_params p;
  int n_past;        /* past-KV Concats (two per layer when the graph has a KV cache) */
  bool rope_tabled;  /* the frequencies are not theta^(-2i/d): carried as factors */
  float *rope_freqs; /* (head_dim / 2) frequencies read off the tables */
  pass_llm_weight *w;
  int n_w, cap_w;
  void **owned; /* buffers of transposed weights, given to the built graph */
  int n_owned, cap_owned;
} pass_llm;

/* Recognises the decoder of g (see above) into *out (zeroed first; free with
 * pass_llm_free). Weights point into g's tensors or into out->owned. */
ir_status pass_canon_llm(const ir_graph *g, const pass_llm_io *io, pass_llm *out, ir_diag *d);

/* Builds the fused program from what was recognised (model_llama_build); the graph adopts
 * out->owned. p's limits (max_position, bos, eos) are the caller's to set first. */
ir_status pass_canon_llm_build(pass_llm *r, const model_build_opts *bo, ir_graph **out, ir_diag *d);

/* One line: "2 attention blocks -> paged attention, GQA 4/2, head_dim 16; ...". */
void pass_llm_describe(const pass_llm *r, char *out, size_t len);

void pass_llm_free(pass_llm *r);

#endif
