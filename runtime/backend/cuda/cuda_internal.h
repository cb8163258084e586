/* cuda_internal: the CUDA backend's context, shared by backend_cuda.c (device, memory,
 * modules, step upload, graphs) and cuda_ops.c (one launch sequence per IR node). Not
 * a public header; nothing here is exported from libinferrt_cuda.so. */
#ifndef IRT_CUDA_INTERNAL_H
#define IRT_CUDA_INTERNAL_H

#include <stdbool.h>

#include "backend.h"
#include "cu_api.h"

/* Every kernel the backend launches: kernels/cuda/<src>.cu, entry <fn>. */
typedef enum cuda_fn {
  CF_ADD,
  CF_ATTN_DECODE,
  CF_ATTN_REDUCE,
  CF_ATTN_PREFILL,
  CF_ATTN_PREFILL_TC,
  CF_CAST_F16,
  CF_CAST_BF16,
  CF_ADD_BIAS,
  CF_EMBED_F32,
  CF_EMBED_F16,
  CF_EMBED_BF16,
  CF_EMBED_Q8_0,
  CF_EMBED_Q4_0,
  CF_EMBED_Q4_1,
  CF_GATHER_ROWS,
  CF_GEMV_F32,
  CF_GEMV_F16,
  CF_GEMV_BF16,
  CF_GEMV_Q8_0,
  CF_GEMV_Q4_0,
  CF_GEMV_Q4_1,
  CF_GEMV_F32_SWIGLU,
  CF_GEMV_F16_SWIGLU,
  CF_GEMV_BF16_SWIGLU,
  CF_GEMV_Q8_0_SWIGLU,
  CF_GEMV_Q4_0_SWIGLU,
  CF_GEMV_Q4_1_SWIGLU,
  CF_GEMV_WQ_I4,
  CF_GEMV_WQ_I8,
  CF_GEMV_WQ_F8,
  CF_DEQUANT_WQ_I4,
  CF_DEQUANT_WQ_I8,
  CF_DEQUANT_WQ_F8,
  CF_KV_WRITE,
  CF_ROPE_KV_WRITE,
  CF_KV_WRITE_F16,
  CF_ROPE_KV_WRITE_F16,
  CF_ATTN_DECODE_F16,
  CF_ATTN_PREFILL_F16,
  CF_ATTN_PREFILL_TC_F16,
  CF_RMS_NORM,
  CF_ADD_RMS_NORM,
  CF_ROPE_NEOX,
  CF_ROPE_INTERLEAVED,
  CF_PICK,
  CF_SWIGLU,
  CF_SWIGLU_PACKED,
  CF_DEQUANT_Q8_0,
  CF_DEQUANT_Q4_0,
  CF_DEQUANT_Q4_1,
  CF_GEGLU,
  CF_SOFTCAP,
  CF_RMS_NORM_H,
  CF_ADD_RMS_NORM_H,
  CF_SWIGLU_PACKED_H,
  CF_PDL_READY, /* a marker: the plan's kernels call kn_pdl() first */
  CF_COUNT
} cuda_fn;

/* Fixed launch geometry of kernels/cuda (their compile-time defaults). */
#define CUDA_GEMV_M 4          /* gemv.cu and gemv_wq.cu GEMV_M: rows of x per CTA */
#define CUDA_GEMV_WARPS 4      /* gemv.cu and gemv_wq.cu GEMV_WARPS */
#define CUDA_ATTN_WARPS 4      /* attention.cu ATTN_WARPS */
#define CUDA_TILE_TOKENS 16    /* attention.cu ATTN_WARPS * PREFILL_ROWS */
#define CUDA_TC_TILE_TOKENS 64 /* attention.cu TC_WARPS * 16: kn_attn_prefill_tc */
#define CUDA_RMS_THREADS 256
#define CUDA_NORM_HEADS 256    /* kv_write.cu KV_NORM_HEADS: q + k heads it normalizes */
#define CUDA_PICK_THREADS 1024 /* sampling.cu PICK_THREADS */
/* Dense f32/f16/bf16 matmuls with more rows than this go to cuBLAS; fewer to the GEMV,
 * which reads the weights once per CUDA_GEMV_M rows. */
#define CUDA_GEMV_MAX_M 4
/* GGUF block weights (q8_0, q4_0, q4_1) in a matmul of at least this many rows (prefill
 * chunks, the largest decode buckets) are dequantized to f16 (kn_dequant_*) for cuBLAS:
 * the GEMV would read them once per CUDA_GEMV_M rows. irt_model_opts.cuda_dequant_gemm_m (--cuda-dequant-gemm-m)
 * overrides it (0: never), to compare. */
#define CUDA_DEQUANT_GEMM_M BACKEND_CUDA_DEQUANT_GEMM_M
#define CUDA_MAX_BUCKETS IR_MAX_DECODE_BUCKETS

/* $INFERRT_CUDA_PROFILE=1: the time of every node of every step (CUDA events around each;
 * graphs off), summed by (step kind, what the node is) and printed when the backend closes;
 * beside it the host's time to enqueue the node (launches, cuBLAS calls): a row whose host
 * time is near its device time is launch-bound, the device waiting on the host. */
#define CUDA_PROF_ROWS 64
typedef struct cuda_prof {
  bool on;
  CUevent *ev; /* (n_ev): before node 0, after each node */
  int n_ev;
  int *row_of;     /* (n_nodes) the row node i adds to in this step */
  double *host_of; /* (n_nodes) node i's enqueue time in this step, ms */
  struct {
    char what[48];
    bool decode;
    double ms, host_ms;
    long long launches;
  } rows[CUDA_PROF_ROWS];
  int n_rows;
  double step_ms[2]; /* prefill, decode steps: their whole time */
  long long steps[2];
} cuda_prof;

typedef struct cuda_ctx {
  cu_api cu;
  cublas_api blas;
  cublas_handle blas_h; /* NULL until cuBLAS is loaded (first dense GEMM at check) */
  CUdevice dev;
  CUcontext ctx;
  int arch;       /* 90 for sm_90 */
  int n_sm;       /* multiprocessors */
  char name[128]; /* "NVIDIA H200" */
  CUstream stream;
  CUmodule mods[16];
  int n_mods;
  CUfunction fn[CF_COUNT];
  bool want_graphs;
  /* Programmatic dependent launch: sm_90+, cuLaunchKernelEx, the plan's kernels marked
   * (kn_pdl_ready) and every image loaded built for sm_90+ (an sm_8x image run on a newer
   * GPU has no griddepcontrol.wait), irt_cuda_opts.pdl, no profile; off after a capture
   * that failed with it and succeeded without. */
  bool pdl;
  int min_image_arch; /* the lowest arch of the kernel images loaded */
  bool after_copy;    /* the last op queued was a copy: the next launch is a plain one (a
                         programmatic edge joins two kernels only) */
  /* prefill attention on tensor cores (f16 operands): sm_80+, for plans whose GEMMs take
   * f16/bf16 activations anyway; tiles of CUDA_TC_TILE_TOKENS, else CUDA_TILE_TOKENS */
  bool tc_prefill;
  int tile_tokens;
  bool kv_f16; /* the KV cache holds f16 (the _F16 attention and KV-write kernels) */

  /* graph limits: the step limits of the plan */
  int64_t max_tokens, max_seqs, max_logits, max_blocks;
  int64_t n_heads, n_kv_heads, head_dim;
  int32_t t_tokens, t_positions, t_rows; /* input tensors, served from the step buffer */

  /* Step buffer: host (pinned) and device copies of one layout of int32 arrays, uploaded
   * with one copy per step. Fixed addresses, so captured graphs stay valid. */
  int32_t *stage; /* pinned host */
  CUdeviceptr d_stage;
  size_t off_tok, off_pos, off_seq, off_rows, off_tile0, off_tilen, off_bt; /* elements */
  size_t stage_elems;
  CUevent stage_ev; /* recorded after the last upload: the host copy may be reused */
  bool stage_busy;

  /* attention split-K scratch, sized for max_seqs decode tokens and n_splits splits (the
   * most a step uses) */
  CUdeviceptr part_acc, part_ml;
  int n_splits;
  /* GEMM scratch: activations as f16/bf16 (max_tokens x max k), cuBLAS workspace */
  CUdeviceptr xh;
  size_t xh_bytes;
  /* What xh holds: the f16 (or bf16) copy of tensor xh_tensor (-1: nothing; each step
   * starts so), written by a GEMM's cast, or by the tensor's producer (a norm or
   * kn_swiglu_packed, their _h kernels) when xh_wt[t] says a GEMM on weights of that type
   * (IR_F16 / IR_BF16 / block) reads t (0: none): every later GEMM on t skips its cast. */
  int32_t xh_tensor;
  bool xh_bf16;
  uint8_t *xh_wt; /* (n_tensors) */
  /* swiglu scratch: the (max_tokens x 2n) sums of a fused gate_up matmul run on cuBLAS */
  CUdeviceptr zh;
  size_t zh_bytes;
  /* dequantized weights: the f16 copy of the largest block-weight matrix taking cuBLAS */
  CUdeviceptr wh;
  size_t wh_bytes;
  int64_t dequant_gemm_m; /* rows (irt_cuda_opts.dequant_gemm_m); 0: never */
  void (*log)(void *user, int level, const char *msg); /* irt_cuda_opts.log, or NULL */
  void *log_user;
  CUdeviceptr blas_ws;
  /* token picks (kn_pick): max_logits requests, results, then PICK_TOP alternatives a
   * pick, pinned and on the device */
  void *pick_stage;
  CUdeviceptr d_pick;
  /* picks with penalties: their rows (max_logits x vocab, at the first such pick), and the
   * penalty lists, pinned and on the device (grown as needed) */
  CUdeviceptr d_pick_work;
  void *pen_stage;
  CUdeviceptr d_pen;
  size_t pen_cap; /* entries */

  /* Graphs, one per token-count bucket and step kind: [0] decode steps (one token a
   * sequence, split-K decode attention), [1] drafted steps (several tokens of some
   * sequences, every row's logits: tiled attention over a fixed grid of one tile a token) */
  int64_t bucket[CUDA_MAX_BUCKETS];
  CUgraphExec exec[2][CUDA_MAX_BUCKETS];
  bool warm[2][CUDA_MAX_BUCKETS];     /* ran once eagerly */
  bool no_graph[2][CUDA_MAX_BUCKETS]; /* its capture failed: it runs eagerly from then on */
  int n_buckets;
  cuda_prof prof;
} cuda_ctx;

/* What the kernels of one step see: symbol values, mode, device step arrays. */
typedef struct cuda_step {
  int64_t syms[IR_SYM_COUNT];
  bool decode; /* one token per sequence: split-K decode attention */
  int n_tiles; /* prefill attention tiles */
  const kv_cache *kv;
  int64_t max_blocks;
} cuda_step;

static inline CUdeviceptr cuda_dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }
static inline CUdeviceptr cuda_stage_ptr(const cuda_ctx *c, size_t off) {
  return c->d_stage + off * sizeof(int32_t);
}

/* ir_diag_set with the driver's text for r; returns IR_DEVICE (IR_OOM for out-of-memory). */
ir_status cuda_fail(cuda_ctx *c, CUresult r, const char *what, ir_diag *d);
/* Checks that every node of g has a kernel here; sizes the GEMM and swiglu scratch. */
ir_status cuda_ops_check(cuda_ctx *c, const ir_graph *g, ir_diag *d);
/* Queues node ni on c->stream. */
ir_status cuda_ops_run(cuda_ctx *c, const ir_graph *g, int32_t ni, void *const *ptrs,
                       const cuda_step *s, ir_diag *d);

#endif
