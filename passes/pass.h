/* pass: the compiler's graph-to-graph passes and the pipeline that runs them.
 * Each pass rewrites the graph in place, leaves it valid (the pipeline verifies after
 * every pass), and appends one line saying what it changed to the pass log. */
#ifndef PASS_H
#define PASS_H

#include <stdbool.h>
#include <stdio.h>

#include "ir.h"

/* The fusions, as bits of pass_opts.no_fuse. */
typedef enum pass_fusion {
  PASS_FUSE_ROPE_ATTENTION = 1u << 0, /* rope(q), rope(k) -> attention: rope in attention */
  PASS_FUSE_QKV = 1u << 1,            /* q/k/v matmuls -> one matmul, packed attention */
  PASS_FUSE_GATE_UP = 1u << 2,        /* gate/up matmuls + swiglu -> one matmul, act=swiglu */
  PASS_FUSE_ADD_RMS_NORM = 1u << 3,   /* residual add + rms_norm -> add_rms_norm */
  PASS_FUSE_ALL = (1u << 4) - 1,
} pass_fusion;

/* The bit of a fusion named "rope_attention", "qkv", "gate_up" or "add_rms_norm" (with or
 * without a "fuse_" prefix); 0 for any other name. */
unsigned pass_fusion_from_name(const char *name);

typedef struct pass_opts {
  bool fold;        /* constant folding */
  bool fuse;        /* fusion passes */
  unsigned no_fuse; /* pass_fusion bits of fusions to skip even when fuse is set */
  FILE *dump_ir;    /* when set, the IR is printed here after each pass */
  const struct pass_quant_opts *quant; /* weight quantization (pass_quantize.h); NULL: none */
  const char *quant_calib; /* w8a8: activation maxima for smoothing (pass_quantize.h); NULL */
  bool act_int8;     /* matmuls of q8_0/q4_0/q4_1 weights take int8 activations (pass_act_int8) */
  bool act_bf16;     /* matmuls of bf16 weights take bf16 activations (pass_act_bf16) */
  bool attn_bf16;    /* attentions take bf16 products (pass_act_bf16) */
  bool repack;       /* their weights interleaved by 8 rows for the CPU kernels (pass_repack) */
  bool capture_plan; /* target cuda: plan the CUDA Graph decode buckets */
  const int64_t *decode_buckets; /* the buckets asked for; NULL: 1, 2, 4, ... up to the limit */
  int32_t n_decode_buckets;
  /* Threads for the weights the passes make (quantization, run when the plan is written:
   * the recipes keep this pointer, so the pool must outlive the write); NULL: serial. */
  struct kn_pool *pool;
} pass_opts;

/* What the passes did, in numbers. The build report reads these; the passes' log lines
 * that summarise them are written from the same fields (pass_results_line). */
#define PASS_MAX_PASSES 16
typedef struct pass_results {
  int nodes_before, nodes_after; /* the pipeline's input and output */
  int n_deltas;                  /* the passes that changed the node count, in order */
  struct {
    const char *pass; /* static */
    int delta;
  } deltas[PASS_MAX_PASSES];
  bool quantized; /* pass_quantize ran */
  struct {
    char scheme[64]; /* pass_quant_format's text */
    int n_done, n_kept, n_regrouped, n_smoothed;
    int64_t values, regroup_g, regroup_k;
    uint64_t bytes_before, bytes_after; /* the matmul weights quantized */
    uint64_t all_before, all_after;     /* every weight */
    char kept[160];                     /* weights left as built, and why */
  } quant;
  bool act_int8_ran;
  int act_int8_done, act_int8_long; /* matmuls given int8 activations; left f32 (K too long) */
  int act_bf16_done;                /* matmuls given bf16 activations */
  int act_bf16_blocks;              /* ... of them over q8_0/q4_0/q4_1 weights */
  int act_bf16_attn;                /* attentions given bf16 products */
  bool repack_ran;
  int repack_done, repack_bf16; /* weights interleaved; of them bf16 (by 16 rows) */
  uint64_t repack_bytes;
  bool repack_some_kept;
} pass_results;

typedef enum pass_line {
  PASS_LINE_OPS,      /* "ops: 454 -> 275 (fold -59, fuse_qkv -60, ...)" */
  PASS_LINE_QUANT,    /* "quantize int4:g32:asym: 84 matmul weights ..." */
  PASS_LINE_ACT_INT8, /* "act_int8: 84 q8_0/q4_0/q4_1 matmuls take int8 activations" */
  PASS_LINE_REPACK,   /* "repack: 84 weights (61.2 MiB) interleaved by 8 rows" */
  PASS_LINE_ACT_BF16, /* "act_bf16: 211 bf16 matmuls take bf16 activations, 30 attentions ..." */
} pass_line;

/* The summary line of one result into buf (as the pass log has it); false, with buf empty,
 * when that pass did not run. */
bool pass_results_line(const pass_results *r, pass_line which, char *buf, size_t len);

/* A growing list of one-line summaries ("dce: removed 3 nodes, 1 tensor"), and the numbers
 * behind the report's lines. */
typedef struct pass_log {
  char **lines;
  int n;
  pass_results res;
} pass_log;

void pass_log_add(pass_log *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pass_log_free(pass_log *log);

ir_status pass_dce(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
ir_status pass_fold(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
ir_status pass_fuse_add_rms_norm(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
ir_status pass_memory_plan(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
/* The CUDA Graph capture plan: the decode batch sizes the runtime captures one graph for
 * (config.decode_buckets). Arena offsets are already fixed by the memory plan, so one
 * graph per bucket replays with the same addresses every step. */
ir_status pass_capture_plan(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
/* rope(q), rope(k) feeding only an attention -> that attention with inputs (q, k, v, pos,
 * cos_sin) and the rope attrs: the kernel rotates q and k itself (k as it enters the KV
 * cache). Bit-identical: kn_rope's arithmetic on the same values. */
ir_status pass_fuse_rope_attention(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
/* Three plain matmuls of one x feeding only an attention's q, k, v -> one matmul whose
 * weight (and bias) is [wq; wk; wv] concatenated along N at build time, and the attention
 * reads the packed [T, (nh + 2 nkv) hd] result in place. Weights must be constants of one
 * dtype (f32, f16, bf16, q8_0, q4_0, q4_1: rows are whole blocks, so rows concatenate);
 * matmuls with more inputs or attributes (separate quant params) are left alone. */
ir_status pass_fuse_qkv(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);
/* swiglu(matmul(x, wg), matmul(x, wu)) -> matmul(x, [wg; wu]; act=swiglu): one GEMM whose
 * epilogue writes silu(gate) * up, with no [T, 2F] intermediate. Same conditions. */
ir_status pass_fuse_gate_up(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);

/* Every matmul whose weight is block-quantized (q8_0, q4_0, q4_1) with K <= IR_Q8_ACT_MAX_K
 * gets act_int8 = 1: the CPU quantizes x to int8 per 32-value block and sums in integers
 * (kn_matmul_q8), as llama.cpp does -- about 1.5x faster decode on AVX2, at the precision
 * of 8-bit activations. Runs when o->act_int8 (infc's act_dtype int8, or auto on CPU). */
ir_status pass_act_int8(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);

/* Every matmul with a bf16 weight (rank 2) gets act_bf16 = 1: the CPU rounds x to bf16 and
 * sums bf16 products in f32 (AVX512-BF16's vdpbf16ps order, kn_matmul_bf16x): twice the
 * multiply rate of f32 activations, with bf16's 8-bit mantissa on x (when o->act_bf16:
 * infc's act_dtype bf16). So does every matmul of a q8_0/q4_0/q4_1 weight over the step's
 * token rows whose rows fill 16-row groups (K <= IR_Q8_ACT_MAX_K), but the logits
 * projection (which keeps act_int8): a step's prompt rows multiply W tiles converted to
 * bf16 once a call (kn_matmul_bf16q, the tile unit's prefill), its generated rows keep
 * int8 activations (model_step.tok_gen). With o->attn_bf16 (attn_dtype bf16, or auto with
 * act_dtype bf16) every attention gets it: q . k and p . v on bf16 values in the same order
 * (kn_attention's bf16 order). Logs a line only when a node took it. */
ir_status pass_act_bf16(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);

/* The weights of act_int8 matmuls (q8_0, q4_0, q4_1; rows a multiple of 8, of 16 for a
 * fused gate/up) rewritten in the 8-row interleaved layout (IR_*_X8, ir_dtype.h), which
 * the CPU kernels read with a third of the instructions. A weight with any reader other
 * than such a matmul or an embedding lookup (which reads both layouts) keeps its layout.
 * Runs after act_int8, when o->repack (infc's passes.repack, on by default) and act_int8. */
ir_status pass_repack(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);

/* fold -> dce -> fusions -> memory plan, verifying after each. Logs one more line,
 * "ops: A -> B (pass -n, ...)": the node count before and after and what each pass took. */
ir_status pass_pipeline_run(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);

/* --- helpers shared by passes ----------------------------------------------------------- */

/* Replaces every use of tensor `from` (node inputs and graph outputs) with `to`. */
void pass_replace_uses(ir_graph *g, int32_t from, int32_t to);
/* How many times tensor t is read (node inputs; a graph output counts once); the last
 * reading node in *out_user (-1 if none). */
int pass_count_uses(const ir_graph *g, int32_t t, int32_t *out_user);
/* Removes nodes with dead[i] set and then every tensor no live node or graph
 * input/output refers to, renumbering indices. dead may be NULL. Returns the counts. */
bool pass_compact(ir_graph *g, const bool *dead, int32_t *out_nodes_removed,
                  int32_t *out_tensors_removed);

#endif
