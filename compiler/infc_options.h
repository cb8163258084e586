/* infc_options: build options from build.yaml (libyaml) and the command line.
 *
 *   dtype: auto | f32 | f16 | bf16    # weight dtype in the plan (auto: as the checkpoint)
 *   max_tokens: 512                   # tokens per step (T); sizes the activation arena
 *                                     # (target cuda: 2048 unless set)
 *   max_seqs: 64                      # sequences per step (S)
 *   max_logits: 64                    # logit rows per step (L)
 *   kv_block_size: 16                 # tokens per KV cache block
 *   max_context: 0                    # cap on context length (0: the model's)
 *   tp: 1                             # tensor-parallel ranks: every rank's shard in the
 *                                     # plan (run with mpirun -n tp)
 *   quant: none                       # int8[:asym][:gN] | int4[:g32|g64|g128][:sym|asym]
 *                                     # | w8a8 | q8_0 | q4_0 | q4_1 (each may add
 *                                     # :lm_head); pass_quantize.h
 *   quant_calib: ""                   # w8a8: activation maxima (tools/w8a8-calib)
 *   act_dtype: auto | f32 | int8 | bf16  # activations of q8_0/q4_0/q4_1 matmuls: int8
 *                                     # per 32-value block (auto: on target cpu); bf16:
 *                                     # that, and bf16 activations of bf16 matmuls
 *   attn_dtype: auto | f32 | bf16     # attention's q.k and p.v products (CPU): bf16 values
 *                                     # (auto: with act_dtype bf16, else f32)
 *   target: cpu | cuda
 *   arch: sm_80,sm_90                 # target cuda: GPU archs to compile kernels for
 *   passes: { fold: true, fuse: true }  # and fuse_rope_attention, fuse_qkv, fuse_gate_up,
 *                                        # fuse_add_rms_norm: true|false, one fusion each;
 *                                        # repack: true (the CPU's 8-row weight layout)
 *   no_fuse: qkv,gate_up                 # the same as a list (also --no-fuse=LIST)
 */
#ifndef INFC_OPTIONS_H
#define INFC_OPTIONS_H

#include <stdbool.h>

#include "ir_status.h"
#include "model_template.h"
#include "pass_quantize.h"

/* act_dtype: auto (int8 for q8_0/q4_0/q4_1 weights on target cpu, else f32), f32, int8,
 * bf16 (as int8, and bf16 activations for bf16 weights: a CPU path that rounds x). */
typedef enum infc_act_dtype {
  INFC_ACT_AUTO = 0,
  INFC_ACT_F32 = 1,
  INFC_ACT_INT8 = 2,
  INFC_ACT_BF16 = 3,
} infc_act_dtype;

/* attn_dtype: auto (bf16 with act_dtype bf16, else f32), f32, bf16 (q . k and p . v on
 * bf16 values, f32 sums: kn_attention's bf16 order; a CPU path). */
typedef enum infc_attn_dtype {
  INFC_ATTN_AUTO = 0,
  INFC_ATTN_F32 = 1,
  INFC_ATTN_BF16 = 2,
} infc_attn_dtype;

/* A generic graph input's shape range (--shape NAME=1..64x3x224x224, or build.yaml's
 * `shapes: {NAME: ...}`): each dim a number or a range lo..hi. */
#define INFC_MAX_SHAPES 16
typedef struct infc_shape {
  char input[128];
  int rank;
  int64_t min[IR_MAX_RANK], max[IR_MAX_RANK];
} infc_shape;

/* The range a symbolic dim gets when no --shape names it. */
#define INFC_DEFAULT_DIM_MIN 1
#define INFC_DEFAULT_DIM_MAX 64

typedef struct infc_options {
  model_build_opts model;
  bool fold;
  bool fuse;
  bool repack;         /* passes.repack: interleave block-quantized CPU matmul weights by 8 rows */
  unsigned no_fuse;    /* pass_fusion bits (passes/pass.h) of fusions to skip */
  bool max_tokens_set; /* max_tokens given: target cuda keeps it (else INFC_CUDA_MAX_TOKENS) */
  char target[16];
  char arch[64];              /* target cuda: GPU archs, "sm_80,sm_90" ("" = that default) */
  char cache_dir[4096];       /* target cuda: NVRTC's compile cache ("" = none; the infc CLI's
                               --cache-dir, default ~/.cache/infc). Not recorded in the plan:
                               it decides where outputs are kept, not what they are */
  char tokenizer[4096];       /* --tokenizer PATH: a tokenizer.json to embed ("" = find one) */
  pass_quant_opts quant;      /* --quant SCHEME: weight quantization (passes/pass_quantize.h) */
  char quant_calib[4096];     /* --quant-calib FILE: w8a8 activation maxima ("" = none) */
  infc_act_dtype act_dtype;   /* --act-dtype: activations of block-quantized matmuls */
  infc_attn_dtype attn_dtype; /* --attn-dtype: attention's products */
  /* target cuda: --decode-buckets LIST, the CUDA Graph decode batch sizes (0: the default
   * 1, 2, 4, ... up to the step limit; checked against the limits by pass_capture_plan) */
  int32_t n_decode_buckets;
  int64_t decode_buckets[IR_MAX_DECODE_BUCKETS];
  /* generic ONNX graphs: ranges of their inputs' symbolic dims (others: the defaults) */
  int n_shapes;
  infc_shape shapes[INFC_MAX_SHAPES];
} infc_options;

/* A CUDA plan's default step: 2048 tokens, not the CPU's 512. On an H200 (kernels/cuda/NOTES.md)
 * a 2048-token prompt prefilled at 324k tok/s in one step against 164k in 512-token chunks:
 * a 512-token step leaves most SMs idle in attention and launch-bound GEMMs, while a CPU step
 * of 2048 would only hold decodes back longer. vLLM's and TensorRT-LLM's defaults on such
 * GPUs are larger still (8192). */
#define INFC_CUDA_MAX_TOKENS 2048

infc_options infc_options_default(void);

/* Applies one option given as text (from YAML or a --key value flag). Unknown keys and
 * bad values are errors naming the key. */
ir_status infc_options_set(infc_options *o, const char *key, const char *value, ir_diag *d);

/* Reads a build.yaml; keys as above, `passes` as a nested mapping. Errors name the line. */
ir_status infc_options_load_yaml(infc_options *o, const char *path, ir_diag *d);

/* The effective options as key/value text, for recording in the plan. Fills up to `cap`
 * entries of keys/values (values are written into `buf` of len bytes). Returns count. */
/* Whether block-quantized matmuls take int8 activations under these options. */
bool infc_options_act_int8(const infc_options *o);
/* Whether bf16 matmuls take bf16 activations (act_dtype bf16). */
bool infc_options_act_bf16(const infc_options *o);
/* Whether attention takes bf16 products (attn_dtype bf16, or auto with act_dtype bf16). */
bool infc_options_attn_bf16(const infc_options *o);

int infc_options_describe(const infc_options *o, const char **keys, const char **values, int cap,
                          char *buf, size_t len);

#endif
