/* model_llama: the Llama-family template (Llama 2/3, Mistral, Qwen2, SmolLM, ...).
 * Builds the flat-step-batch program: embed -> N x (norm, q/k/v, [q/k norm], rope, attention,
 * o-proj, residual, norm, gate/up, swiglu, down, residual) -> gather logit rows ->
 * norm -> lm_head. Step inputs: tokens[T], positions[T], logit_rows[L];
 * output: logits[L, vocab] f32. */
#ifndef MODEL_LLAMA_H
#define MODEL_LLAMA_H

#include "ir.h"
#include "model_template.h"

/* How the rope's frequencies are scaled for a longer context (HF rope_type). */
typedef enum model_rope_scaling {
  MODEL_ROPE_DEFAULT = 0,
  MODEL_ROPE_LINEAR = 1,   /* every frequency / factor */
  MODEL_ROPE_LLAMA3 = 2,   /* Llama 3.1: low frequencies / factor, a smooth ramp to the high */
  MODEL_ROPE_YARN = 3,     /* YaRN: frequency pairs ramp from kept (fast) to / factor (slow),
                            cos and sin scaled by the attention factor */
  MODEL_ROPE_LONGROPE = 4, /* Phi-3.5 / Phi-4: each frequency / its long factor where the
                              plan's context exceeds the original one, else / its short
                              factor (vLLM's and llama.cpp's choice; transformers switches
                              per sequence length); cos, sin scaled by the attention factor */
} model_rope_scaling;

#define MODEL_ROPE_MAX_FACTORS 128 /* longrope factors: one per rotated pair (head_dim <= 256) */

typedef struct model_llama_params {
  char arch[32];
  int64_t vocab_size;
  int64_t hidden_size;
  int64_t n_layers;
  int64_t n_heads;
  int64_t n_kv_heads;
  int64_t head_dim;      /* hidden_size / n_heads unless the config says otherwise */
  int64_t rot_dim;       /* dims of each head the rope rotates (partial rotary), 0: head_dim */
  int64_t no_rope_every; /* SmolLM3: every n-th layer (l + 1 = n, 2n, ...) has no rope; 0: none */
  int64_t intermediate_size;
  int64_t max_position;
  double rms_norm_eps;
  double rope_theta;
  model_rope_scaling rope_scaling;
  double rope_factor;                    /* linear, llama3 */
  double rope_low_freq, rope_high_freq;  /* llama3: low_freq_factor, high_freq_factor */
  int64_t rope_orig_context;             /* llama3, yarn: original_max_position_embeddings */
  double rope_beta_fast, rope_beta_slow; /* yarn: the ramp's ends in rotations (32, 1) */
  bool rope_yarn_truncate;               /* yarn: the ramp's ends rounded outwards (true) */
  double rope_attn_factor;               /* yarn, longrope: cos/sin scale */
  float rope_long[MODEL_ROPE_MAX_FACTORS], rope_short[MODEL_ROPE_MAX_FACTORS]; /* longrope */
  const float *rope_freq_factors; /* GGUF rope_freqs.weight: (head_dim / 2) divisors of
                                          the frequencies (llama.cpp's form of llama3), or
                                          NULL; read while the graph is built */
  bool tie_word_embeddings;
  bool attention_bias;   /* q/k/v projections carry a bias (Qwen2) */
  bool qk_norm;          /* q and k RMSNorm per head (weights [head_dim]) before rope (Qwen3) */
  bool fused_proj;       /* the checkpoint stores self_attn.qkv_proj (q rows, k rows, v rows) and
                          mlp.gate_up_proj (gate rows, up rows), as Phi-3: read as row views */
  bool rope_interleaved; /* rotate adjacent pairs (2i, 2i+1): GGUF llama, whose converter
                            permuted the q/k rows; false: rotate-half (i, i + d/2) as HF */
  /* Gemma 2 / Gemma 3 */
  bool norm_plus_one;      /* every RMSNorm weight w is used as 1 + w (HF gemma; llama.cpp's
                           converter stores 1 + w, so GGUF leaves this false) */
  double embed_scale;      /* > 0: embeddings times this in f32 (Gemma: sqrt(hidden_size)) */
  int act;                 /* the MLP's gate: IR_ACT_SWIGLU (0 reads as it) or IR_ACT_GEGLU */
  bool sandwich_norms;     /* Gemma: the attention's and the MLP's outputs are normalized before
                           their residual adds (post_attention_layernorm,
                           post_feedforward_layernorm; pre_feedforward_layernorm before the
                           MLP) */
  double attn_scale;       /* > 0: the scores' scale (Gemma: query_pre_attn_scalar^-0.5); 0:
                           1 / sqrt(head_dim) */
  double attn_softcap;     /* > 0: scores soft-capped at this (Gemma 2) */
  double final_softcap;    /* > 0: logits soft-capped at this (Gemma 2) */
  int64_t sliding_window;  /* > 0: the sliding layers attend this many positions */
  int64_t swa_period;      /* with a window: layer l attends all when (l + 1) % swa_period == 0
                           (Gemma 2: 2, Gemma 3: 6), the others slide; 0: all slide */
  int64_t swa_first;       /* with a window: the layers before this one attend all (Qwen2's
                           max_window_layers); 0: from the first */
  double rope_local_theta; /* > 0: the sliding layers' rope has this base and no scaling
                              (Gemma 3's rope_local_base_freq); 0: one rope for all */
  int64_t bos_token_id;
  int64_t eos_token_id;
} model_llama_params;

/* Whether layer l attends a sliding window (sliding_window, swa_first and swa_period). */
bool model_llama_layer_slides(const model_llama_params *p, int64_t l);

/* The dims of each head the rope rotates: rot_dim, or all head_dim when it is 0. */
int64_t model_llama_rot_dims(const model_llama_params *p);

/* Checks the parameters for consistency (positive sizes, heads divisible, ...). */
ir_status model_llama_check(const model_llama_params *p, ir_diag *d);

/* Builds the graph. Missing or mis-shaped checkpoint tensors are reported by name.
 * Matmul weights and the embedding may be f32, f16, bf16 or block-quantized (q8_0,
 * q4_0, q4_1); norm weights and biases of any of those types are cast to f32.
 * *out is owned by the caller (ir_graph_destroy). */
ir_status model_llama_build(const model_llama_params *p, const model_tensor_src *src,
                            const model_build_opts *bo, ir_graph **out, ir_diag *d);

#endif
