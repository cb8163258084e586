/* kv_cache: the paged KV cache and its prefix cache.
 *
 * A pool of fixed-size blocks, each holding block_size consecutive positions of one
 * sequence for every layer. Layout per layer: k, v as (n_blocks, n_kv_heads, block_size,
 * head_dim) f32, or with KV_INT8 the same shape in int8 plus one f32 scale per (block,
 * kv head, slot) in k_scale / v_scale (n_blocks, n_kv_heads, block_size): symmetric,
 * scale = max|x| / 127, so a token's cached values depend on that token alone. Blocks are
 * reference counted: sequences that share a prompt prefix
 * (parallel sampling, prefix-cache hits) hold the same blocks; a writer copies a shared
 * block first (copy-on-write, done by the caller with kv_block_copy).
 *
 * Prefix cache: a full block may be registered under a chain hash of (parent block's
 * hash, its tokens, tenant). A later prompt with the same prefix and tenant finds it and
 * skips that prefill. Registered blocks whose last holder let go stay cached in an LRU
 * list and are reclaimed (oldest first) only when the free list is empty. A tenant never
 * finds another tenant's blocks: the tenant is part of the hash and checked on a hit.
 *
 * Everything is allocated at init; nothing here allocates afterwards. Not thread-safe:
 * one engine thread owns the cache. */
#ifndef IRT_KV_CACHE_H
#define IRT_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir_status.h"

typedef struct kv_meta {
  int32_t ref;
  bool cached;
  uint64_t hash, parent, tenant;
  int32_t lru_prev, lru_next; /* evictable list: ref == 0 && cached */
  int32_t hnext;              /* hash bucket chain */
} kv_meta;

/* Element type of the cached K and V. */
typedef enum kv_dtype_id { KV_F32 = 0, KV_INT8 = 1, KV_F16 = 2 } kv_dtype_id;

typedef struct kv_cache {
  int64_t n_layers, n_kv_heads, head_dim, block_size, n_blocks;
  kv_dtype_id dtype;
  float **k; /* (n_layers) pointers into one allocation with KV_F32, else NULL entries */
  float **v;
  int8_t **k8, **v8;          /* (n_layers) with KV_INT8, else NULL entries */
  uint16_t **k16, **v16;      /* (n_layers) with KV_F16, else NULL entries */
  float **k_scale, **v_scale; /* (n_layers) with KV_INT8, else NULL entries */
  void *storage;
  kv_meta *meta;      /* (n_blocks) */
  int32_t *tokens;    /* (n_blocks, block_size) tokens of registered blocks */
  int32_t *free_list; /* stack of blocks with ref 0 that are not cached */
  int64_t n_free;
  int32_t lru_head, lru_tail;
  int64_t n_evictable;
  int32_t *buckets; /* (n_buckets) heads of hash chains, -1 if empty */
  int64_t n_buckets;
  uint64_t evictions;
  /* Block copies through the backend when its memory is not the host's (set after init;
   * NULL: memcpy). */
  void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
  void *copy_ctx;
  /* told when a block enters the prefix cache (stored true: its hash, parent and tokens are
   * set) and when it leaves it (evicted for reuse), for KV-aware routers */
  void (*on_cache)(void *ctx, const struct kv_cache *kv, int32_t block, bool stored);
  void *on_cache_ctx;
  /* told of every kv_block_copy (tensor parallelism: rank 0 sends them to the other ranks) */
  void (*on_copy)(void *ctx, int32_t src, int32_t dst);
  void *on_copy_ctx;
  /* the model's prompt rows and generated rows take different kernels (irt_seq_set_prompt_len):
   * a block's key then also names how many of its positions were prompt (kv_role_tenant) */
  bool row_roles;
} kv_cache;

/* The tenant key of block j (block_size tokens from position j * block_size) of a sequence
 * whose first prompt_len positions are its prompt: the tenant's own where the block is all
 * prompt or the cache has no roles; salted by the block's prompt positions otherwise, so
 * KV computed from generated rows is only found by a sequence that has them there too. */
uint64_t kv_role_tenant(const kv_cache *kv, uint64_t tenant, int64_t j, int64_t prompt_len);

typedef void *(*kv_alloc_fn)(void *ctx, size_t bytes);
typedef void (*kv_free_fn)(void *ctx, void *p);

/* Creates a pool of ceil(tokens / block_size) f32 blocks in memory from `alloc`. */
ir_status kv_cache_init(kv_cache *kv, int64_t n_layers, int64_t n_kv_heads, int64_t head_dim,
                        int64_t block_size, int64_t tokens, kv_alloc_fn alloc, void *actx,
                        ir_diag *d);
/* The same with the element type chosen. */
ir_status kv_cache_init_dtype(kv_cache *kv, int64_t n_layers, int64_t n_kv_heads, int64_t head_dim,
                              int64_t block_size, int64_t tokens, kv_dtype_id dtype,
                              kv_alloc_fn alloc, void *actx, ir_diag *d);
void kv_cache_release(kv_cache *kv, kv_free_fn free_fn, void *actx);
uint64_t kv_cache_bytes(const kv_cache *kv);
/* Bytes one token takes over all layers (K and V, scales included). */
uint64_t kv_token_bytes(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, kv_dtype_id dtype);

/* A block with ref 1: a free one, else the least recently used cached one (which leaves
 * the prefix cache). -1 if every block is held. */
int32_t kv_block_alloc(kv_cache *kv);
void kv_block_ref(kv_cache *kv, int32_t block);
/* Drops one reference; at zero a cached block becomes evictable, any other is freed. */
void kv_block_unref(kv_cache *kv, int32_t block);
/* Blocks an allocation could get now (free + evictable). */
int64_t kv_available(const kv_cache *kv);
/* Blocks held by at least one sequence. */
int64_t kv_in_use(const kv_cache *kv);
/* Copies block src's K and V (all layers) into dst (through kv->copy when set). */
void kv_block_copy(kv_cache *kv, int32_t src, int32_t dst);

/* The chain hash of a full block: parent hash (0 for the first block), its block_size
 * tokens, and the tenant hash. */
uint64_t kv_chain_hash(uint64_t parent, const int32_t *tokens, int64_t n, uint64_t tenant);
/* Registers a full, held block under its chain hash (no-op if an equal block is already
 * registered, or if this one is). */
void kv_block_register(kv_cache *kv, int32_t block, uint64_t parent, const int32_t *tokens,
                       uint64_t tenant);
/* The registered block for (parent, tokens, tenant), with a reference taken; -1 if none. */
int32_t kv_prefix_lookup(kv_cache *kv, uint64_t parent, const int32_t *tokens, uint64_t tenant);
/* The chain hash a registered block was stored under (0 if it is not registered). */
uint64_t kv_block_hash(const kv_cache *kv, int32_t block);

#endif
