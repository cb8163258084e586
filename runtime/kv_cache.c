/* kv_cache: block pool and free list. */
#include <stdlib.h>

#include "kv_cache.h"

ir_status irt_kv_cache_init(irt_kv_cache *kv, int64_t n_layers, int64_t n_kv_heads,
                            int64_t head_dim, int64_t block_size, int64_t tokens,
                            irt_kv_alloc_fn alloc, void *actx, ir_diag *d) {
  *kv = (irt_kv_cache){.n_layers = n_layers, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                       .block_size = block_size};
  kv->n_blocks = (tokens + block_size - 1) / block_size;
  if (kv->n_blocks <= 0 || kv->n_blocks > INT32_MAX)
    return ir_diag_set(d, IR_INVALID_ARG, "KV cache of %lld tokens is out of range",
                       (long long)tokens);
  kv->k = calloc((size_t)n_layers, sizeof *kv->k);
  kv->v = calloc((size_t)n_layers, sizeof *kv->v);
  kv->free_list = malloc((size_t)kv->n_blocks * sizeof *kv->free_list);
  size_t per_layer = (size_t)(kv->n_blocks * n_kv_heads * block_size * head_dim);
  kv->storage = kv->k && kv->v && kv->free_list
                    ? alloc(actx, per_layer * 2 * (size_t)n_layers * sizeof(float))
                    : NULL;
  if (!kv->storage) {
    free(kv->k), free(kv->v), free(kv->free_list);
    *kv = (irt_kv_cache){0};
    return ir_diag_set(d, IR_OOM, "cannot allocate a KV cache of %lld tokens",
                       (long long)tokens);
  }
  for (int64_t l = 0; l < n_layers; l++) {
    kv->k[l] = (float *)kv->storage + (size_t)(2 * l) * per_layer;
    kv->v[l] = (float *)kv->storage + (size_t)(2 * l + 1) * per_layer;
  }
  /* Lowest block ids come out first, so a fresh run always fills the pool the same way. */
  for (int64_t i = 0; i < kv->n_blocks; i++)
    kv->free_list[i] = (int32_t)(kv->n_blocks - 1 - i);
  kv->n_free = kv->n_blocks;
  return IR_OK;
}

void irt_kv_cache_release(irt_kv_cache *kv, irt_kv_free_fn free_fn, void *actx) {
  if (kv->storage) free_fn(actx, kv->storage);
  free(kv->k);
  free(kv->v);
  free(kv->free_list);
  *kv = (irt_kv_cache){0};
}

int32_t irt_kv_block_alloc(irt_kv_cache *kv) {
  return kv->n_free > 0 ? kv->free_list[--kv->n_free] : -1;
}

void irt_kv_block_free(irt_kv_cache *kv, int32_t block) {
  kv->free_list[kv->n_free++] = block;
}

uint64_t irt_kv_cache_bytes(const irt_kv_cache *kv) {
  return (uint64_t)(kv->n_blocks * kv->n_kv_heads * kv->block_size * kv->head_dim) * 2 *
         (uint64_t)kv->n_layers * sizeof(float);
}
