// kv_write.cu: writes each token's new K and V into the paged cache at its position
// (the first half of kn_attention_paged). Cache layout per layer, as kn_kv_layer:
// k, v: (n_blocks, n_kv_heads, BLOCK_SIZE, HEAD_DIM) f32, or f16 bits for the _f16 entries
// (--kv-dtype f16: rounded to nearest even, as the CPU's f16 cache); token t of step-sequence
// tok_seq[t] at position tok_pos[t] goes to physical block
// block_tables[tok_seq[t] * max_blocks + tok_pos[t] / BLOCK_SIZE].
// k_new, v_new: (n_tok, n_kv_heads, HEAD_DIM). Launch: grid (n_tok), block (256).

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 16
#endif
// Most q + k heads of a token that kn_rope_kv_write normalizes (cuda_ops checks it).
#define KV_NORM_HEADS 256

#include "kn_cuda.cuh"

// A cache element from f32: stored as is, or rounded to f16.
__device__ __forceinline__ float kv_elem(float *, float x) { return x; }
__device__ __forceinline__ unsigned short kv_elem(unsigned short *, float x) {
  return kn_f32_to_f16(x);
}

template <class KV>
__device__ __forceinline__ void kv_write(KV *k_cache, KV *v_cache, const float *k_new,
                                         const float *v_new, const int *tok_seq,
                                         const int *tok_pos, const int *block_tables,
                                         int max_blocks, int n_kv_heads) {
  int t = blockIdx.x, pos = tok_pos[t];
  long long blk = block_tables[(long long)tok_seq[t] * max_blocks + pos / BLOCK_SIZE];
  int off = pos % BLOCK_SIZE;
  for (int i = threadIdx.x; i < n_kv_heads * HEAD_DIM; i += blockDim.x) {
    int h = i / HEAD_DIM, d = i % HEAD_DIM;
    long long dst = ((blk * n_kv_heads + h) * BLOCK_SIZE + off) * HEAD_DIM + d;
    long long src = (long long)t * n_kv_heads * HEAD_DIM + i;
    k_cache[dst] = kv_elem(k_cache, k_new[src]);
    v_cache[dst] = kv_elem(v_cache, v_new[src]);
  }
}

extern "C" __global__ void kn_kv_write(float *k_cache, float *v_cache, const float *k_new,
                                       const float *v_new, const int *tok_seq,
                                       const int *tok_pos, const int *block_tables,
                                       int max_blocks, int n_kv_heads) {
  kn_pdl();
  kv_write(k_cache, v_cache, k_new, v_new, tok_seq, tok_pos, block_tables, max_blocks,
           n_kv_heads);
}

extern "C" __global__ void kn_kv_write_f16(unsigned short *k_cache, unsigned short *v_cache,
                                           const float *k_new, const float *v_new,
                                           const int *tok_seq, const int *tok_pos,
                                           const int *block_tables, int max_blocks,
                                           int n_kv_heads) {
  kn_pdl();
  kv_write(k_cache, v_cache, k_new, v_new, tok_seq, tok_pos, block_tables, max_blocks,
           n_kv_heads);
}

// Element j of a head row x as the rope reads it: normalized by w and inv (kn_rms_norm's
// w * (x * inv)), or as is when w is NULL.
__device__ __forceinline__ float head_at(const float *x, const float *w, float inv, int j) {
  return w ? w[j] * (x[j] * inv) : x[j];
}

// Value d of a head row x (head_at) after rotary embedding of its first rot_dim dims
// (kn_rope's arithmetic) with cs = the (cos, sin) row of the position; rot_dim 0: x[d].
__device__ __forceinline__ float rope_at(const float *x, const float *w, float inv, int d,
                                         const float *cs, int rot_dim, bool neox) {
  const float xd = head_at(x, w, inv, d);
  if (d >= rot_dim) return xd;
  const int half = rot_dim / 2;
  if (neox) {
    const int i = d < half ? d : d - half;
    const float c = cs[2 * i], s = cs[2 * i + 1];
    return d < half ? xd * c - head_at(x, w, inv, d + half) * s
                    : xd * c + head_at(x, w, inv, i) * s;
  }
  const int i = d / 2;
  const float c = cs[2 * i], s = cs[2 * i + 1];
  return d % 2 == 0 ? xd * c - head_at(x, w, inv, d + 1) * s
                    : xd * c + head_at(x, w, inv, d - 1) * s;
}

// inv[h] = 1 / rms of head h of the token's q heads then k heads (rsqrtf(mean(x^2) + eps));
// one warp a head.
__device__ __forceinline__ void head_inv_rms(float *inv, const float *qt, const float *kt,
                                             int n_heads, int n_kv_heads, float eps) {
  const int lane = threadIdx.x & 31;
  for (int h = threadIdx.x >> 5; h < n_heads + n_kv_heads; h += blockDim.x >> 5) {
    const float *x = h < n_heads ? qt + h * HEAD_DIM : kt + (h - n_heads) * HEAD_DIM;
    float ss = 0.0f;
    for (int d = lane; d < HEAD_DIM; d += 32) ss += x[d] * x[d];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) inv[h] = rsqrtf(ss / (float)HEAD_DIM + eps);
  }
  __syncthreads();
}

// The front half of an attention node with rope folded in and/or a packed qkv input (the
// fuse_rope_attention and fuse_qkv passes): token t's q heads, rotated, go to q_out
// (n_tok, n_heads, HEAD_DIM), where the attention kernels read them (q_out may be the
// attention's own output: each (token, head) row is read before it is written, by the
// same CTA); its k heads, rotated, and v heads go to the cache as kn_kv_write does.
// Row t of q is q + t * q_stride (likewise k, v with kv_stride), so a packed qkv row
// (q | k | v) is read in place. cos_sin (max_pos, rot_dim/2, 2) as rope.cu; rot_dim 0
// rotates nothing; neox 1 pairs (i, i + rot_dim/2), 0 pairs (2i, 2i+1). q_norm, k_norm
// (HEAD_DIM) f32, or NULL: every q and k head RMS-normalized (qk_eps) before the rope (the
// Qwen3 q/k norm folded in as well), at most KV_NORM_HEADS heads in all.
// Launch: grid (n_tok), block (256).
template <class KV>
__device__ __forceinline__ void rope_kv_write(float *q_out, KV *k_cache, KV *v_cache,
                                              const float *q, const float *k, const float *v,
                                              long long q_stride, long long kv_stride,
                                              const int *tok_seq, const int *tok_pos,
                                              const int *block_tables, int max_blocks,
                                              int n_heads, int n_kv_heads,
                                              const float *cos_sin, int rot_dim, int neox,
                                              const float *q_norm, const float *k_norm,
                                              float qk_eps) {
  __shared__ float inv[KV_NORM_HEADS];
  const int t = blockIdx.x, pos = tok_pos[t];
  const float *cs = cos_sin + (long long)pos * rot_dim;
  const float *qt = q + t * q_stride, *kt = k + t * kv_stride, *vt = v + t * kv_stride;
  if (q_norm) head_inv_rms(inv, qt, kt, n_heads, n_kv_heads, qk_eps);
  for (int i = threadIdx.x; i < n_heads * HEAD_DIM; i += blockDim.x) {
    const int h = i / HEAD_DIM;
    q_out[(long long)t * n_heads * HEAD_DIM + i] =
        rope_at(qt + h * HEAD_DIM, q_norm, q_norm ? inv[h] : 1.0f, i % HEAD_DIM, cs, rot_dim,
                neox != 0);
  }
  long long blk = block_tables[(long long)tok_seq[t] * max_blocks + pos / BLOCK_SIZE];
  int off = pos % BLOCK_SIZE;
  for (int i = threadIdx.x; i < n_kv_heads * HEAD_DIM; i += blockDim.x) {
    int h = i / HEAD_DIM, d = i % HEAD_DIM;
    long long dst = ((blk * n_kv_heads + h) * BLOCK_SIZE + off) * HEAD_DIM + d;
    const float kd = rope_at(kt + h * HEAD_DIM, k_norm, k_norm ? inv[n_heads + h] : 1.0f, d, cs,
                             rot_dim, neox != 0);
    k_cache[dst] = kv_elem(k_cache, kd);
    v_cache[dst] = kv_elem(v_cache, vt[i]);
  }
}

#define ROPE_KV_WRITE_ENTRY(name, KV)                                                          \
  extern "C" __global__ void name(float *q_out, KV *k_cache, KV *v_cache, const float *q,     \
                                  const float *k, const float *v, long long q_stride,         \
                                  long long kv_stride, const int *tok_seq, const int *tok_pos, \
                                  const int *block_tables, int max_blocks, int n_heads,       \
                                  int n_kv_heads, const float *cos_sin, int rot_dim,          \
                                  int neox, const float *q_norm, const float *k_norm,         \
                                  float qk_eps) { kn_pdl();                                             \
    rope_kv_write(q_out, k_cache, v_cache, q, k, v, q_stride, kv_stride, tok_seq, tok_pos,    \
                  block_tables, max_blocks, n_heads, n_kv_heads, cos_sin, rot_dim, neox,      \
                  q_norm, k_norm, qk_eps);                                                    \
  }
ROPE_KV_WRITE_ENTRY(kn_rope_kv_write, float)
ROPE_KV_WRITE_ENTRY(kn_rope_kv_write_f16, unsigned short)
