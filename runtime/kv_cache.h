/* kv_cache: the paged KV cache. A pool of fixed-size blocks, each holding block_size
 * consecutive positions of one sequence for every layer; a free list hands them out.
 * Layout per layer: k, v as (n_blocks, n_kv_heads, block_size, head_dim) f32.
 * Allocated once at model open; nothing here allocates afterwards. */
#ifndef IRT_KV_CACHE_H
#define IRT_KV_CACHE_H

#include <stdint.h>

#include "ir_status.h"

typedef struct irt_kv_cache {
  int64_t n_layers, n_kv_heads, head_dim, block_size, n_blocks;
  float **k; /* (n_layers) pointers into one allocation */
  float **v;
  void *storage;
  int32_t *free_list; /* stack of free block ids */
  int64_t n_free;
} irt_kv_cache;

typedef void *(*irt_kv_alloc_fn)(void *ctx, size_t bytes);
typedef void (*irt_kv_free_fn)(void *ctx, void *p);

/* Creates a pool of ceil(tokens / block_size) blocks in memory from `alloc`. */
ir_status irt_kv_cache_init(irt_kv_cache *kv, int64_t n_layers, int64_t n_kv_heads,
                            int64_t head_dim, int64_t block_size, int64_t tokens,
                            irt_kv_alloc_fn alloc, void *actx, ir_diag *d);
void irt_kv_cache_release(irt_kv_cache *kv, irt_kv_free_fn free_fn, void *actx);

/* Takes a free block; -1 if the pool is exhausted. */
int32_t irt_kv_block_alloc(irt_kv_cache *kv);
void irt_kv_block_free(irt_kv_cache *kv, int32_t block);
uint64_t irt_kv_cache_bytes(const irt_kv_cache *kv);

#endif
