/* backend: the vtable every execution backend implements (CPU now, CUDA later), and the
 * step descriptor that tells kernels how the flat token batch maps onto sequences and
 * the paged KV cache. */
#ifndef IRT_BACKEND_H
#define IRT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "ir.h"
#include "kv_cache.h"

/* One step of the flat batch. Token t belongs to step-sequence tok_seq[t] at absolute
 * position tok_pos[t]; step-sequence s owns the physical KV blocks
 * block_tables[s * max_blocks .. + n_blocks). */
typedef struct irt_step {
  int64_t syms[IR_SYM_COUNT]; /* T, S, L values for this step */
  const int32_t *tok_seq;
  const int32_t *tok_pos;
  const int32_t *block_tables;
  int64_t max_blocks;
  const irt_kv_cache *kv;
} irt_step;

typedef struct irt_backend_ops {
  const char *name;
  /* Checks at load time that every node of g can run here. */
  ir_status (*check)(void *ctx, const ir_graph *g, ir_diag *d);
  /* Runs node `ni`; ptrs[t] is the address of tensor t (weights and arena). */
  ir_status (*run_node)(void *ctx, const ir_graph *g, int32_t ni, void *const *ptrs,
                        const irt_step *step, ir_diag *d);
  /* Zeroed, 64-byte aligned memory that kernels of this backend can address. */
  void *(*alloc)(void *ctx, size_t bytes);
  void (*free)(void *ctx, void *p);
  void (*destroy)(void *ctx);
} irt_backend_ops;

typedef struct irt_backend {
  const irt_backend_ops *ops;
  void *ctx;
} irt_backend;

/* The CPU backend with a pool of n_threads workers (<= 0: all cores). */
ir_status irt_backend_cpu_create(int n_threads, irt_backend *out, ir_diag *d);
/* Releases the backend's context; a zeroed backend is a no-op. */
void irt_backend_destroy(irt_backend *b);

#endif
