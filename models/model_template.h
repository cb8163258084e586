/* model: what architecture templates share: the source of checkpoint tensors (each
 * frontend implements it over its own file format) and the build options a template
 * honours. */
#ifndef MODEL_H
#define MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"

#define MODEL_MAX_RANK 8

typedef struct model_tensor {
  ir_dtype dtype;
  int rank;
  int64_t shape[MODEL_MAX_RANK];
  const void *data; /* borrowed from the frontend; outlives the graph build */
  uint64_t nbytes;
} model_tensor;

/* Looks tensors up by their HF name ("model.layers.0.self_attn.q_proj.weight").
 * find returns false if the checkpoint has no such tensor. */
typedef struct model_tensor_src {
  void *ctx;
  bool (*find)(void *ctx, const char *name, model_tensor *out);
} model_tensor_src;

typedef struct model_build_opts {
  ir_dtype weight_dtype; /* IR_DTYPE_INVALID: keep the checkpoint's dtype */
  int64_t max_tokens;    /* step limits; see ir_model_config */
  int64_t max_seqs;
  int64_t max_logits;
  int64_t kv_block_size;
  int64_t max_context; /* 0: the model's max_position_embeddings */
  /* tensor parallelism: build rank tp_rank's shard of tp_size (0 or 1: the whole model) */
  int tp_size;
  int tp_rank;
  /* 0: every decoder layer; n: the first n of them, then the final norm and the head (a
   * layer-skip draft of the same checkpoint, for speculative decoding) */
  int64_t layers;
} model_build_opts;

/* Defaults: keep dtype, T 512, S 64, L 64, block 16, full context. */
model_build_opts model_build_opts_default(void);

#endif
