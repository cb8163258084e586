/* backend: the vtable every execution backend implements (CPU now, CUDA later), and the
 * step descriptor that tells kernels how the flat token batch maps onto sequences and
 * the paged KV cache. */
#ifndef IRT_BACKEND_H
#define IRT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir.h"
#include "ir_plan.h"
#include "kv_cache.h"
#include "ir_alloc.h"

/* One step of the flat batch. Token t belongs to step-sequence tok_seq[t] at absolute
 * position tok_pos[t]; step-sequence s owns the physical KV blocks
 * block_tables[s * max_blocks .. + n_blocks). Every pointer here is host memory. */
/* A tensor-parallel model's collectives (inferrt.h's irt_comm, as the backends see it):
 * each returns 0 or nonzero on a transport failure. */
typedef struct backend_comm {
  int rank, size;
  void *ctx;
  int (*all_reduce_sum_f32)(void *ctx, float *buf, size_t n);
  int (*all_gather)(void *ctx, const void *send, size_t bytes, void *recv);
} backend_comm;

typedef struct model_step {
  int64_t syms[IR_SYM_COUNT]; /* T, S, L values for this step */
  const int32_t *tok_seq;
  const int32_t *tok_pos;
  /* (T) 1 where the row is a generated token (irt_seq_set_prompt_len), 0 for a prompt's;
   * NULL when the plan runs both kinds alike. Matmuls with act_bf16 over block weights
   * take prompt rows with bf16 activations, generated rows with int8 ones. */
  const uint8_t *tok_gen;
  const int32_t *block_tables;
  int64_t max_blocks;
  const kv_cache *kv;
  /* Device backends only (run_step): the step's inputs in host memory, which the backend
   * uploads itself, and a KV block no sequence owns (padding tokens write there). */
  const int32_t *tokens;     /* (T) */
  const int32_t *logit_rows; /* (L) */
  int32_t pad_block;         /* -1 if none */
  const backend_comm *comm;  /* tensor parallelism's collectives, or NULL (one rank) */
} model_step;

/* One token choice on a device (backend_ops.pick): from row `row` of the step's logits,
 * with the sampler's settings and its uniform draw u (runtime/model/sampler.c's function). The
 * layouts are kernels/cuda/sampling.cu's kn_pick_args and kn_pick_out. */
#define PICK_TOP 20 /* most alternatives a pick reports (IRT_MAX_TOP_LOGPROBS) */
typedef struct pick_req {
  float temperature, top_p;
  int32_t top_k, row;
  double u;
  int32_t n_top;          /* alternatives wanted, at most PICK_TOP */
  int32_t n_pen, pen_off; /* penalties: entries [pen_off, + n_pen) of the pick's pen arrays */
  float min_p;
} pick_req;
typedef struct pick_res {
  int32_t token;
  float logprob;
} pick_res;
_Static_assert(sizeof(pick_req) == 40 && sizeof(pick_res) == 8, "kn_pick layouts");
/* For picks on a device (sampler.c): the sampler's settings, and the uniform
 * in [0, 1) that its next irt_sampler_sample would draw (the generator moves on). */
struct irt_sampler;
struct irt_sampling;
const struct irt_sampling *sampler_params(const struct irt_sampler *s);
double sampler_draw(struct irt_sampler *s);
/* The draw `ahead` draws after the next one, the generator left where it is. */
double sampler_peek(const struct irt_sampler *s, int64_t ahead);
/* The uniform a pick samples with (irt_pick.draw: the next draw, which moves the
 * generator, or a peeked one); 0 for a greedy sampler, which draws nothing. */
struct irt_pick;
double pick_draw(struct irt_pick *p);
/* irt_sampler_sample with the draw u given (the generator does not move). */
int32_t sampler_sample_u(struct irt_sampler *s, const float *logits, double u);
/* The distribution sampler_sample_u draws from for these logits: probs[id] is the chance
 * that it returns id for u uniform in [0, 1) -- a kept candidate's weight over the kept
 * sum, 0 for the rest; greedy: 1 at the argmax. (vocab) floats. */
void sampler_probs(struct irt_sampler *s, const float *logits, float *probs);
/* The k largest logits, largest first (lower id first among equal ones), as ids and
 * logprobs (logit - lse). */
void sampler_top_logprobs(const float *logits, int64_t vocab, double lse, int k, int32_t *ids,
                          float *lps);

typedef struct backend_ops {
  const char *name;
  /* Checks at load time that every node of g can run here. */
  ir_status (*check)(void *ctx, const ir_graph *g, ir_diag *d);
  /* Runs node `ni`; ptrs[t] is the address of tensor t (weights and arena). */
  ir_status (*run_node)(void *ctx, const ir_graph *g, int32_t ni, void *const *ptrs,
                        const model_step *step, ir_diag *d);
  /* Zeroed, 64-byte aligned memory that kernels of this backend can address. */
  void *(*alloc)(void *ctx, size_t bytes);
  void (*free)(void *ctx, void *p);
  void (*destroy)(void *ctx);

  /* Device backends (memory the host cannot address) set the slots below; the CPU backend
   * leaves them NULL and the executor then reads and writes tensors in place and calls
   * run_node for every node. */
  /* Copies `bytes` of host data (a weight) into backend memory once, at load; *out is
   * freed with ir_free(). */
  ir_status (*upload)(void *ctx, const void *host, size_t bytes, void **out, ir_diag *d);
  /* Runs the whole program for one step: uploads the step descriptor and inputs from
   * step's host arrays, then queues every node (a backend may replay a captured graph).
   * Returns without waiting; errors of queued work surface in `read`. */
  ir_status (*run_step)(void *ctx, const ir_graph *g, void *const *ptrs, const model_step *step,
                        ir_diag *d);
  /* Copies backend memory to the host after all queued work; dst is complete on return. */
  ir_status (*read)(void *ctx, void *dst, const void *src, size_t bytes, ir_diag *d);
  /* Copies within backend memory, ordered with the queued work (KV copy-on-write). */
  void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
  /* Optional: chooses n tokens from rows of logits (L, vocab) in backend memory, after
   * the queued work, and returns when out[0..n) is on the host, and for each pick i with
   * n_top > 0 its alternatives in top[i * PICK_TOP ..] (as sampler_top_logprobs); a pick
   * with n_pen > 0 samples its row less pen_sub at pen_ids (entries pen_off..). n = 0
   * asks whether this backend can (IR_OK) or not (IR_UNSUPPORTED: an older plan). */
  ir_status (*pick)(void *ctx, const void *logits, int64_t vocab, int n, const pick_req *req,
                    const int32_t *pen_ids, const float *pen_sub, pick_res *out, pick_res *top,
                    ir_diag *d);
  /* Optional: the model's warm-up steps are over (statistics count from here). */
  void (*ready)(void *ctx);
  /* Free and total bytes of backend memory (for out-of-memory messages). */
  void (*mem_info)(void *ctx, uint64_t *out_free, uint64_t *out_total);
} backend_ops;

typedef struct rt_backend {
  const backend_ops *ops;
  void *ctx;
} rt_backend;

/* The CPU backend with a pool of n_threads workers (<= 0: all cores). */
ir_status backend_cpu_create(int n_threads, rt_backend *out, ir_diag *d);

/* --- the CUDA backend: libinferrt_cuda.so, loaded with dlopen ---------------------------
 * The library exports one function, IRT_CUDA_ENTRY, of type irt_cuda_create_fn. It loads
 * libcuda.so.1 and cuBLAS itself, so neither is needed until a CUDA plan is opened. */
#define IRT_CUDA_LIB "libinferrt_cuda.so"
/* The default of irt_model_opts.cuda_dequant_gemm_m (cuda_internal.h says why). */
#define BACKEND_CUDA_DEQUANT_GEMM_M 32
#define IRT_CUDA_ENTRY "irt_backend_cuda_create"
#define IRT_CUDA_ABI 6 /* bump when backend_ops, model_step or irt_cuda_opts change */
/* The struct sizes both sides compile with: a library built from another tree (ir.h's
 * graph, node and tensor, the step, the KV cache) is refused rather than misread. */
#define IRT_CUDA_LAYOUT                                                                            \
  ((uint64_t)sizeof(ir_graph) ^ ((uint64_t)sizeof(ir_node) << 12) ^                                \
   ((uint64_t)sizeof(ir_tensor) << 24) ^ ((uint64_t)sizeof(model_step) << 36) ^                    \
   ((uint64_t)sizeof(kv_cache) << 48))

typedef struct irt_cuda_opts {
  int abi;                       /* IRT_CUDA_ABI of the caller */
  uint64_t layout;               /* IRT_CUDA_LAYOUT of the caller */
  int device;                    /* CUDA device ordinal */
  bool graphs;                   /* capture and replay decode steps as CUDA Graphs */
  bool pdl;                      /* programmatic dependent launch where the GPU has it */
  int kv_dtype;                  /* kv_dtype_id of the KV cache: f32 or f16 */
  const ir_plan_kernel *kernels; /* the plan's kernel table (borrowed, in the mapping) */
  int n_kernels;
  bool profile;                                        /* irt_model_opts.cuda_profile */
  int64_t dequant_gemm_m;                              /* resolved: rows, 0 never */
  void (*log)(void *user, int level, const char *msg); /* irt_log_fn's shape; may be NULL */
  void *log_user;
  const char *lib; /* the library's path (irt_model_opts.cuda_lib), or NULL */
} irt_cuda_opts;

/* Creates the backend for graph g (sized by its config: step limits, heads). *out is
 * owned by the caller (backend_destroy). Errors: IR_DEVICE "no CUDA device found;
 * run with --device cpu or build a CPU plan"; IR_UNSUPPORTED when the plan has no image
 * for the GPU's arch (both named). */
typedef ir_status (*irt_cuda_create_fn)(const irt_cuda_opts *o, const ir_graph *g, rt_backend *out,
                                        ir_diag *d);

/* Loads libinferrt_cuda.so ($INFERRT_CUDA_LIB, else beside the executable, else the
 * library search path) and creates the CUDA backend. */
ir_status irt_backend_cuda_open(const irt_cuda_opts *o, const ir_graph *g, rt_backend *out,
                                ir_diag *d);
/* Releases the backend's context; a zeroed backend is a no-op. */
void backend_destroy(rt_backend *b);

#endif
