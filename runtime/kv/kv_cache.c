/* kv_cache: block pool, reference counts, free list, LRU of cached blocks, prefix hash
 * table. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kv_cache.h"
#include "ir_alloc.h"

static void free_arrays(kv_cache *kv) {
  ir_free(kv->k), ir_free(kv->v), ir_free(kv->meta), ir_free(kv->tokens), ir_free(kv->free_list);
  ir_free(kv->k8), ir_free(kv->v8), ir_free(kv->k_scale), ir_free(kv->v_scale);
  ir_free(kv->k16), ir_free(kv->v16);
  ir_free(kv->buckets);
}

static bool alloc_arrays(kv_cache *kv) {
  size_t nb = (size_t)kv->n_blocks, nl = (size_t)kv->n_layers;
  kv->n_buckets = 1;
  while (kv->n_buckets < kv->n_blocks * 2) kv->n_buckets *= 2;
  kv->k = ir_calloc(nl, sizeof *kv->k);
  kv->v = ir_calloc(nl, sizeof *kv->v);
  kv->k8 = ir_calloc(nl, sizeof *kv->k8);
  kv->v8 = ir_calloc(nl, sizeof *kv->v8);
  kv->k16 = ir_calloc(nl, sizeof *kv->k16);
  kv->v16 = ir_calloc(nl, sizeof *kv->v16);
  kv->k_scale = ir_calloc(nl, sizeof *kv->k_scale);
  kv->v_scale = ir_calloc(nl, sizeof *kv->v_scale);
  kv->meta = ir_calloc(nb, sizeof *kv->meta);
  kv->tokens = ir_calloc(nb * (size_t)kv->block_size, sizeof *kv->tokens);
  kv->free_list = ir_malloc(nb * sizeof *kv->free_list);
  kv->buckets = ir_malloc((size_t)kv->n_buckets * sizeof *kv->buckets);
  return kv->k && kv->v && kv->k8 && kv->v8 && kv->k16 && kv->v16 && kv->k_scale && kv->v_scale &&
         kv->meta && kv->tokens && kv->free_list && kv->buckets;
}

uint64_t kv_token_bytes(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, kv_dtype_id dtype) {
  uint64_t row = dtype == KV_INT8  ? (uint64_t)head_dim + sizeof(float)
                 : dtype == KV_F16 ? (uint64_t)head_dim * sizeof(uint16_t)
                                   : (uint64_t)head_dim * sizeof(float);
  return row * 2 * (uint64_t)(n_layers * n_kv_heads);
}

/* Points the per-layer arrays into storage: f32 (or f16) K, V per layer; or, for int8, every
 * layer's K, V scales first (keeps them 4-aligned), then every layer's int8 K, V. */
static void carve_storage(kv_cache *kv) {
  size_t rows = (size_t)(kv->n_blocks * kv->n_kv_heads * kv->block_size);
  size_t per_layer = rows * (size_t)kv->head_dim;
  for (int64_t l = 0; l < kv->n_layers; l++) {
    size_t i = (size_t)l;
    if (kv->dtype == KV_F32) {
      kv->k[l] = (float *)kv->storage + 2 * i * per_layer;
      kv->v[l] = (float *)kv->storage + (2 * i + 1) * per_layer;
      continue;
    }
    if (kv->dtype == KV_F16) {
      kv->k16[l] = (uint16_t *)kv->storage + 2 * i * per_layer;
      kv->v16[l] = (uint16_t *)kv->storage + (2 * i + 1) * per_layer;
      continue;
    }
    kv->k_scale[l] = (float *)kv->storage + 2 * i * rows;
    kv->v_scale[l] = (float *)kv->storage + (2 * i + 1) * rows;
    int8_t *q = (int8_t *)((float *)kv->storage + 2 * (size_t)kv->n_layers * rows);
    kv->k8[l] = q + 2 * i * per_layer;
    kv->v8[l] = q + (2 * i + 1) * per_layer;
  }
}

ir_status kv_cache_init(kv_cache *kv, int64_t n_layers, int64_t n_kv_heads, int64_t head_dim,
                        int64_t block_size, int64_t tokens, kv_alloc_fn alloc, void *actx,
                        ir_diag *d) {
  return kv_cache_init_dtype(kv, n_layers, n_kv_heads, head_dim, block_size, tokens, KV_F32, alloc,
                             actx, d);
}

ir_status kv_cache_init_dtype(kv_cache *kv, int64_t n_layers, int64_t n_kv_heads, int64_t head_dim,
                              int64_t block_size, int64_t tokens, kv_dtype_id dtype,
                              kv_alloc_fn alloc, void *actx, ir_diag *d) {
  *kv = (kv_cache){.n_layers = n_layers,
                   .n_kv_heads = n_kv_heads,
                   .head_dim = head_dim,
                   .block_size = block_size,
                   .dtype = dtype,
                   .lru_head = -1,
                   .lru_tail = -1};
  kv->n_blocks = (tokens + block_size - 1) / block_size;
  if (kv->n_blocks <= 0 || kv->n_blocks > INT32_MAX / 2)
    return ir_diag_set(d, IR_INVALID_ARG, "KV cache of %lld tokens is out of range",
                       (long long)tokens);
  if (dtype != KV_F32 && dtype != KV_INT8 && dtype != KV_F16)
    return ir_diag_set(d, IR_INVALID_ARG, "unknown KV cache dtype %d", (int)dtype);
  kv->storage = alloc_arrays(kv) ? alloc(actx, (size_t)kv_cache_bytes(kv)) : NULL;
  if (!kv->storage) {
    free_arrays(kv);
    *kv = (kv_cache){0};
    return ir_diag_set(d, IR_OOM, "cannot allocate a KV cache of %lld tokens", (long long)tokens);
  }
  carve_storage(kv);
  /* Lowest block ids come out first, so a fresh run always fills the pool the same way. */
  for (int64_t i = 0; i < kv->n_blocks; i++) {
    kv->free_list[i] = (int32_t)(kv->n_blocks - 1 - i);
    kv->meta[i] = (kv_meta){.lru_prev = -1, .lru_next = -1, .hnext = -1};
  }
  memset(kv->buckets, 0xff, (size_t)kv->n_buckets * sizeof *kv->buckets);
  kv->n_free = kv->n_blocks;
  return IR_OK;
}

void kv_cache_release(kv_cache *kv, kv_free_fn free_fn, void *actx) {
  if (kv->storage) free_fn(actx, kv->storage);
  free_arrays(kv);
  *kv = (kv_cache){0};
}

uint64_t kv_cache_bytes(const kv_cache *kv) {
  return (uint64_t)(kv->n_blocks * kv->block_size) *
         kv_token_bytes(kv->n_layers, kv->n_kv_heads, kv->head_dim, kv->dtype);
}

/* --- LRU of evictable (cached, unreferenced) blocks --------------------------------------- */

static void lru_remove(kv_cache *kv, int32_t b) {
  kv_meta *m = &kv->meta[b];
  if (m->lru_prev >= 0) kv->meta[m->lru_prev].lru_next = m->lru_next;
  else kv->lru_head = m->lru_next;
  if (m->lru_next >= 0) kv->meta[m->lru_next].lru_prev = m->lru_prev;
  else kv->lru_tail = m->lru_prev;
  m->lru_prev = m->lru_next = -1;
  kv->n_evictable--;
}

static void lru_push(kv_cache *kv, int32_t b) {
  kv_meta *m = &kv->meta[b];
  m->lru_prev = kv->lru_tail;
  m->lru_next = -1;
  if (kv->lru_tail >= 0) kv->meta[kv->lru_tail].lru_next = b;
  else kv->lru_head = b;
  kv->lru_tail = b;
  kv->n_evictable++;
}

/* --- hash table ------------------------------------------------------------------------- */

static int32_t *bucket_of(kv_cache *kv, uint64_t hash) {
  return &kv->buckets[hash & (uint64_t)(kv->n_buckets - 1)];
}

static void unregister(kv_cache *kv, int32_t b) {
  int32_t *p = bucket_of(kv, kv->meta[b].hash);
  while (*p != b) p = &kv->meta[*p].hnext;
  *p = kv->meta[b].hnext;
  kv->meta[b].hnext = -1;
  kv->meta[b].cached = false;
  kv->meta[b].hash = 0;
}

uint64_t kv_chain_hash(uint64_t parent, const int32_t *tokens, int64_t n, uint64_t tenant) {
  uint64_t pair[2] = {parent, tenant};
  uint64_t h =
      XXH3_64bits_withSeed(tokens, (size_t)n * sizeof *tokens, XXH3_64bits(pair, sizeof pair));
  return h ? h : 1; /* 0 means "no parent" */
}

static int32_t find(kv_cache *kv, uint64_t parent, const int32_t *tokens, uint64_t tenant) {
  uint64_t h = kv_chain_hash(parent, tokens, kv->block_size, tenant);
  for (int32_t b = *bucket_of(kv, h); b >= 0; b = kv->meta[b].hnext) {
    const kv_meta *m = &kv->meta[b];
    /* Verify, not just trust the hash: a collision must never hand out wrong KV. */
    if (m->hash == h && m->parent == parent && m->tenant == tenant &&
        !memcmp(&kv->tokens[(size_t)b * (size_t)kv->block_size], tokens,
                (size_t)kv->block_size * sizeof *tokens))
      return b;
  }
  return -1;
}

void kv_block_register(kv_cache *kv, int32_t b, uint64_t parent, const int32_t *tokens,
                       uint64_t tenant) {
  if (kv->meta[b].cached || find(kv, parent, tokens, tenant) >= 0) return;
  kv_meta *m = &kv->meta[b];
  m->hash = kv_chain_hash(parent, tokens, kv->block_size, tenant);
  m->parent = parent;
  m->tenant = tenant;
  m->cached = true;
  memcpy(&kv->tokens[(size_t)b * (size_t)kv->block_size], tokens,
         (size_t)kv->block_size * sizeof *tokens);
  int32_t *head = bucket_of(kv, m->hash);
  m->hnext = *head;
  *head = b;
  if (kv->on_cache) kv->on_cache(kv->on_cache_ctx, kv, b, true);
}

int32_t kv_prefix_lookup(kv_cache *kv, uint64_t parent, const int32_t *tokens, uint64_t tenant) {
  int32_t b = find(kv, parent, tokens, tenant);
  if (b >= 0) kv_block_ref(kv, b);
  return b;
}

uint64_t kv_block_hash(const kv_cache *kv, int32_t b) {
  return kv->meta[b].cached ? kv->meta[b].hash : 0;
}

/* --- allocation ---------------------------------------------------------------------------- */

int32_t kv_block_alloc(kv_cache *kv) {
  int32_t b;
  if (kv->n_free > 0) {
    b = kv->free_list[--kv->n_free];
  } else if (kv->lru_head >= 0) {
    b = kv->lru_head;
    lru_remove(kv, b);
    if (kv->on_cache) kv->on_cache(kv->on_cache_ctx, kv, b, false);
    unregister(kv, b);
    kv->evictions++;
  } else {
    return -1;
  }
  kv->meta[b].ref = 1;
  return b;
}

void kv_block_ref(kv_cache *kv, int32_t b) {
  if (kv->meta[b].ref++ == 0 && kv->meta[b].cached) lru_remove(kv, b);
}

void kv_block_unref(kv_cache *kv, int32_t b) {
  if (--kv->meta[b].ref > 0) return;
  if (kv->meta[b].cached) lru_push(kv, b);
  else kv->free_list[kv->n_free++] = b;
}

int64_t kv_available(const kv_cache *kv) { return kv->n_free + kv->n_evictable; }

int64_t kv_in_use(const kv_cache *kv) { return kv->n_blocks - kv->n_free - kv->n_evictable; }

static void copy_bytes(kv_cache *kv, void *base, int32_t src, int32_t dst, size_t bytes) {
  char *b = base;
  if (kv->copy) kv->copy(kv->copy_ctx, b + (size_t)dst * bytes, b + (size_t)src * bytes, bytes);
  else memcpy(b + (size_t)dst * bytes, b + (size_t)src * bytes, bytes);
}

void kv_block_copy(kv_cache *kv, int32_t src, int32_t dst) {
  if (kv->on_copy) kv->on_copy(kv->on_copy_ctx, src, dst);
  size_t rows = (size_t)(kv->n_kv_heads * kv->block_size);
  size_t per_block = rows * (size_t)kv->head_dim;
  for (int64_t l = 0; l < kv->n_layers; l++) {
    if (kv->dtype == KV_F32) {
      copy_bytes(kv, kv->k[l], src, dst, per_block * sizeof(float));
      copy_bytes(kv, kv->v[l], src, dst, per_block * sizeof(float));
      continue;
    }
    if (kv->dtype == KV_F16) {
      copy_bytes(kv, kv->k16[l], src, dst, per_block * sizeof(uint16_t));
      copy_bytes(kv, kv->v16[l], src, dst, per_block * sizeof(uint16_t));
      continue;
    }
    copy_bytes(kv, kv->k8[l], src, dst, per_block);
    copy_bytes(kv, kv->v8[l], src, dst, per_block);
    copy_bytes(kv, kv->k_scale[l], src, dst, rows * sizeof(float));
    copy_bytes(kv, kv->v_scale[l], src, dst, rows * sizeof(float));
  }
}

uint64_t kv_role_tenant(const kv_cache *kv, uint64_t tenant, int64_t j, int64_t prompt_len) {
  int64_t bs = kv->block_size, p = prompt_len - j * bs;
  if (!kv->row_roles || p >= bs) return tenant;
  uint64_t x = (uint64_t)(p < 0 ? 0 : p) + 1; /* 1 .. bs: how many prompt positions, plus one */
  x *= 0x9e3779b97f4a7c15ull;
  return tenant ^ (x ^ x >> 29);
}
