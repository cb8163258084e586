/* kv_cache: block pool, reference counts, free list, LRU of cached blocks, prefix hash
 * table. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kv_cache.h"

static void free_arrays(irt_kv_cache *kv) {
  free(kv->k), free(kv->v), free(kv->meta), free(kv->tokens), free(kv->free_list);
  free(kv->buckets);
}

static bool alloc_arrays(irt_kv_cache *kv) {
  size_t nb = (size_t)kv->n_blocks;
  kv->n_buckets = 1;
  while (kv->n_buckets < kv->n_blocks * 2) kv->n_buckets *= 2;
  kv->k = calloc((size_t)kv->n_layers, sizeof *kv->k);
  kv->v = calloc((size_t)kv->n_layers, sizeof *kv->v);
  kv->meta = calloc(nb, sizeof *kv->meta);
  kv->tokens = calloc(nb * (size_t)kv->block_size, sizeof *kv->tokens);
  kv->free_list = malloc(nb * sizeof *kv->free_list);
  kv->buckets = malloc((size_t)kv->n_buckets * sizeof *kv->buckets);
  return kv->k && kv->v && kv->meta && kv->tokens && kv->free_list && kv->buckets;
}

ir_status irt_kv_cache_init(irt_kv_cache *kv, int64_t n_layers, int64_t n_kv_heads,
                            int64_t head_dim, int64_t block_size, int64_t tokens,
                            irt_kv_alloc_fn alloc, void *actx, ir_diag *d) {
  *kv = (irt_kv_cache){.n_layers = n_layers, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                       .block_size = block_size, .lru_head = -1, .lru_tail = -1};
  kv->n_blocks = (tokens + block_size - 1) / block_size;
  if (kv->n_blocks <= 0 || kv->n_blocks > INT32_MAX / 2)
    return ir_diag_set(d, IR_INVALID_ARG, "KV cache of %lld tokens is out of range",
                       (long long)tokens);
  size_t per_layer = (size_t)(kv->n_blocks * n_kv_heads * block_size * head_dim);
  kv->storage = alloc_arrays(kv) ? alloc(actx, per_layer * 2 * (size_t)n_layers * sizeof(float))
                                 : NULL;
  if (!kv->storage) {
    free_arrays(kv);
    *kv = (irt_kv_cache){0};
    return ir_diag_set(d, IR_OOM, "cannot allocate a KV cache of %lld tokens", (long long)tokens);
  }
  for (int64_t l = 0; l < n_layers; l++) {
    kv->k[l] = (float *)kv->storage + (size_t)(2 * l) * per_layer;
    kv->v[l] = (float *)kv->storage + (size_t)(2 * l + 1) * per_layer;
  }
  /* Lowest block ids come out first, so a fresh run always fills the pool the same way. */
  for (int64_t i = 0; i < kv->n_blocks; i++) {
    kv->free_list[i] = (int32_t)(kv->n_blocks - 1 - i);
    kv->meta[i] = (irt_kv_meta){.lru_prev = -1, .lru_next = -1, .hnext = -1};
  }
  memset(kv->buckets, 0xff, (size_t)kv->n_buckets * sizeof *kv->buckets);
  kv->n_free = kv->n_blocks;
  return IR_OK;
}

void irt_kv_cache_release(irt_kv_cache *kv, irt_kv_free_fn free_fn, void *actx) {
  if (kv->storage) free_fn(actx, kv->storage);
  free_arrays(kv);
  *kv = (irt_kv_cache){0};
}

uint64_t irt_kv_cache_bytes(const irt_kv_cache *kv) {
  return (uint64_t)(kv->n_blocks * kv->n_kv_heads * kv->block_size * kv->head_dim) * 2 *
         (uint64_t)kv->n_layers * sizeof(float);
}

/* --- LRU of evictable (cached, unreferenced) blocks --------------------------------------- */

static void lru_remove(irt_kv_cache *kv, int32_t b) {
  irt_kv_meta *m = &kv->meta[b];
  if (m->lru_prev >= 0) kv->meta[m->lru_prev].lru_next = m->lru_next;
  else kv->lru_head = m->lru_next;
  if (m->lru_next >= 0) kv->meta[m->lru_next].lru_prev = m->lru_prev;
  else kv->lru_tail = m->lru_prev;
  m->lru_prev = m->lru_next = -1;
  kv->n_evictable--;
}

static void lru_push(irt_kv_cache *kv, int32_t b) {
  irt_kv_meta *m = &kv->meta[b];
  m->lru_prev = kv->lru_tail;
  m->lru_next = -1;
  if (kv->lru_tail >= 0) kv->meta[kv->lru_tail].lru_next = b;
  else kv->lru_head = b;
  kv->lru_tail = b;
  kv->n_evictable++;
}

/* --- hash table ------------------------------------------------------------------------- */

static int32_t *bucket_of(irt_kv_cache *kv, uint64_t hash) {
  return &kv->buckets[hash & (uint64_t)(kv->n_buckets - 1)];
}

static void unregister(irt_kv_cache *kv, int32_t b) {
  int32_t *p = bucket_of(kv, kv->meta[b].hash);
  while (*p != b) p = &kv->meta[*p].hnext;
  *p = kv->meta[b].hnext;
  kv->meta[b].hnext = -1;
  kv->meta[b].cached = false;
  kv->meta[b].hash = 0;
}

uint64_t irt_kv_chain_hash(uint64_t parent, const int32_t *tokens, int64_t n, uint64_t tenant) {
  uint64_t pair[2] = {parent, tenant};
  uint64_t h = XXH3_64bits_withSeed(tokens, (size_t)n * sizeof *tokens, XXH3_64bits(pair, sizeof pair));
  return h ? h : 1; /* 0 means "no parent" */
}

static int32_t find(irt_kv_cache *kv, uint64_t parent, const int32_t *tokens, uint64_t tenant) {
  uint64_t h = irt_kv_chain_hash(parent, tokens, kv->block_size, tenant);
  for (int32_t b = *bucket_of(kv, h); b >= 0; b = kv->meta[b].hnext) {
    const irt_kv_meta *m = &kv->meta[b];
    /* Verify, not just trust the hash: a collision must never hand out wrong KV. */
    if (m->hash == h && m->parent == parent && m->tenant == tenant &&
        !memcmp(&kv->tokens[(size_t)b * (size_t)kv->block_size], tokens,
                (size_t)kv->block_size * sizeof *tokens))
      return b;
  }
  return -1;
}

void irt_kv_block_register(irt_kv_cache *kv, int32_t b, uint64_t parent, const int32_t *tokens,
                           uint64_t tenant) {
  if (kv->meta[b].cached || find(kv, parent, tokens, tenant) >= 0) return;
  irt_kv_meta *m = &kv->meta[b];
  m->hash = irt_kv_chain_hash(parent, tokens, kv->block_size, tenant);
  m->parent = parent;
  m->tenant = tenant;
  m->cached = true;
  memcpy(&kv->tokens[(size_t)b * (size_t)kv->block_size], tokens,
         (size_t)kv->block_size * sizeof *tokens);
  int32_t *head = bucket_of(kv, m->hash);
  m->hnext = *head;
  *head = b;
}

int32_t irt_kv_prefix_lookup(irt_kv_cache *kv, uint64_t parent, const int32_t *tokens,
                             uint64_t tenant) {
  int32_t b = find(kv, parent, tokens, tenant);
  if (b >= 0) irt_kv_block_ref(kv, b);
  return b;
}

uint64_t irt_kv_block_hash(const irt_kv_cache *kv, int32_t b) {
  return kv->meta[b].cached ? kv->meta[b].hash : 0;
}

/* --- allocation ---------------------------------------------------------------------------- */

int32_t irt_kv_block_alloc(irt_kv_cache *kv) {
  int32_t b;
  if (kv->n_free > 0) {
    b = kv->free_list[--kv->n_free];
  } else if (kv->lru_head >= 0) {
    b = kv->lru_head;
    lru_remove(kv, b);
    unregister(kv, b);
    kv->evictions++;
  } else {
    return -1;
  }
  kv->meta[b].ref = 1;
  return b;
}

void irt_kv_block_ref(irt_kv_cache *kv, int32_t b) {
  if (kv->meta[b].ref++ == 0 && kv->meta[b].cached) lru_remove(kv, b);
}

void irt_kv_block_unref(irt_kv_cache *kv, int32_t b) {
  if (--kv->meta[b].ref > 0) return;
  if (kv->meta[b].cached) lru_push(kv, b);
  else kv->free_list[kv->n_free++] = b;
}

int64_t irt_kv_available(const irt_kv_cache *kv) { return kv->n_free + kv->n_evictable; }

int64_t irt_kv_in_use(const irt_kv_cache *kv) {
  return kv->n_blocks - kv->n_free - kv->n_evictable;
}

void irt_kv_block_copy(irt_kv_cache *kv, int32_t src, int32_t dst) {
  size_t per_block = (size_t)(kv->n_kv_heads * kv->block_size * kv->head_dim);
  for (int64_t l = 0; l < kv->n_layers; l++) {
    float *k = kv->k[l], *v = kv->v[l];
    if (kv->copy) {
      kv->copy(kv->copy_ctx, k + (size_t)dst * per_block, k + (size_t)src * per_block,
               per_block * sizeof(float));
      kv->copy(kv->copy_ctx, v + (size_t)dst * per_block, v + (size_t)src * per_block,
               per_block * sizeof(float));
      continue;
    }
    memcpy(k + (size_t)dst * per_block, k + (size_t)src * per_block, per_block * sizeof(float));
    memcpy(v + (size_t)dst * per_block, v + (size_t)src * per_block, per_block * sizeof(float));
  }
}
