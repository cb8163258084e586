// attention.cu: paged attention over the block-table KV layout of kernels/cpu/kn_cpu.h
// (kn_kv_layer, kn_attn_batch): out = softmax(q k^T * scale) v per head over each token's
// causal context, head h reading kv head h / GQA_GROUP. The new K/V of the step must be in
// the cache first (kv_write.cu). f32 everywhere, CUDA cores (the cache is f32).
//
// Compile-time: HEAD_DIM (a multiple of 32, or at most 32), BLOCK_SIZE (KV block tokens), GQA_GROUP
// (n_heads / n_kv_heads), ATTN_WARPS (warps per CTA), PREFILL_ROWS (query rows per warp).
// Layouts: q, out (n_tok, n_heads, HEAD_DIM); k, v (n_blocks, n_kv_heads, BLOCK_SIZE,
// HEAD_DIM); block_tables (n_seq, max_blocks).
//
// Each warp runs an online softmax over whole KV blocks: lane i owns dims i, i+32, ...
// of q and of the accumulator, so K and V rows load coalesced; the scores of a block are
// finished by a butterfly, so every lane holds them all and needs no shared memory.

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 16
#endif
#ifndef GQA_GROUP
#define GQA_GROUP 1
#endif
#ifndef ATTN_WARPS
#define ATTN_WARPS 4
#endif
#ifndef PREFILL_ROWS
#define PREFILL_ROWS 4
#endif
#if HEAD_DIM < 1 || HEAD_DIM > 256 || (HEAD_DIM > 32 && HEAD_DIM % 32 != 0)
#error "HEAD_DIM must be at most 32 or a multiple of 32, at most 256"
#endif
#if BLOCK_SIZE < 1 || BLOCK_SIZE > 32
#error "BLOCK_SIZE must be in [1, 32]"
#endif
#define DPL ((HEAD_DIM + 31) / 32) /* dims per lane */
/* Does lane own dim lane + 32 i? Always, but for a head under 32 dims (tiny test models). */
#define DIM_OK(i) (HEAD_DIM % 32 == 0 || lane + 32 * (i) < HEAD_DIM)
#define NEG_INF (-__int_as_float(0x7f800000))

// One warp: rows r < R of one (sequence, head) attend to the logical KV blocks
// b0, b0 + step, ... < b1 of block table bt; row r sees positions <= lim[r] (lim < 0: none).
template <int R>
__device__ __forceinline__ void attn_blocks(const float (&q)[R][DPL], float (&acc)[R][DPL],
                                            float (&m)[R], float (&l)[R], const int (&lim)[R],
                                            const float *k, const float *v, const int *bt,
                                            int kvh, int n_kv_heads, int b0, int b1, int step) {
  const int lane = threadIdx.x & 31;
  for (int b = b0; b < b1; b += step) {
    long long base = ((long long)bt[b] * n_kv_heads + kvh) * (BLOCK_SIZE * HEAD_DIM) + lane;
    const float *kb = k + base, *vb = v + base;
    const int p0 = b * BLOCK_SIZE;
    float s[R][BLOCK_SIZE];
#pragma unroll
    for (int j = 0; j < BLOCK_SIZE; j++) {
      float kd[DPL];
#pragma unroll
      for (int i = 0; i < DPL; i++) kd[i] = DIM_OK(i) ? __ldg(kb + j * HEAD_DIM + 32 * i) : 0.0f;
#pragma unroll
      for (int r = 0; r < R; r++) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) a = fmaf(q[r][i], kd[i], a);
        s[r][j] = a;
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
      for (int j = 0; j < BLOCK_SIZE; j++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s[r][j] += __shfl_xor_sync(0xffffffffu, s[r][j], o);
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      float mx = m[r];
#pragma unroll
      for (int j = 0; j < BLOCK_SIZE; j++) {
        if (p0 + j > lim[r]) s[r][j] = NEG_INF;
        mx = fmaxf(mx, s[r][j]);
      }
      if (mx == NEG_INF) {  // nothing visible yet for this row
#pragma unroll
        for (int j = 0; j < BLOCK_SIZE; j++) s[r][j] = 0.0f;
        continue;
      }
      float alpha = __expf(m[r] - mx);  // m = -inf gives 0
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < BLOCK_SIZE; j++) {
        s[r][j] = __expf(s[r][j] - mx);
        sum += s[r][j];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
#pragma unroll
      for (int i = 0; i < DPL; i++) acc[r][i] *= alpha;
    }
#pragma unroll
    for (int j = 0; j < BLOCK_SIZE; j++) {
      float vd[DPL];
#pragma unroll
      for (int i = 0; i < DPL; i++) vd[i] = DIM_OK(i) ? __ldg(vb + j * HEAD_DIM + 32 * i) : 0.0f;
#pragma unroll
      for (int r = 0; r < R; r++) {
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[r][i] = fmaf(s[r][j], vd[i], acc[r][i]);
      }
    }
  }
}

// Decode, split-K flash-decoding. Grid (n_tok, n_heads, n_splits), block ATTN_WARPS * 32.
// Split z covers logical blocks [z * blocks_per_split, +blocks_per_split) of the token's
// context, its warps taking every ATTN_WARPS-th block. With one split the result goes
// straight to out; otherwise the unnormalised partial (n_tok, n_heads, n_splits, HEAD_DIM)
// and its (max, sum) (n_tok, n_heads, n_splits, 2) go to part_acc / part_ml for
// kn_attn_decode_reduce.
extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
    kn_attn_decode(float *out, float *part_acc, float *part_ml, const float *q, const float *k,
                   const float *v, const int *tok_seq, const int *tok_pos,
                   const int *block_tables, int max_blocks, int n_heads, int n_kv_heads,
                   float scale, int blocks_per_split) {
  __shared__ float sm_acc[ATTN_WARPS][HEAD_DIM];
  __shared__ float sm_ml[ATTN_WARPS][2];
  const int t = blockIdx.x, h = blockIdx.y, z = blockIdx.z;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int pos = tok_pos[t];
  const int b0 = z * blocks_per_split;
  const int b1 = min(b0 + blocks_per_split, pos / BLOCK_SIZE + 1);
  const float *qt = q + ((long long)t * n_heads + h) * HEAD_DIM + lane;
  float qr[1][DPL], acc[1][DPL], m[1] = {NEG_INF}, l[1] = {0.0f};
  const int lim[1] = {pos};
#pragma unroll
  for (int i = 0; i < DPL; i++) {
    qr[0][i] = DIM_OK(i) ? qt[32 * i] * scale : 0.0f;
    acc[0][i] = 0.0f;
  }
  attn_blocks<1>(qr, acc, m, l, lim, k, v, block_tables + (long long)tok_seq[t] * max_blocks,
                 h / GQA_GROUP, n_kv_heads, b0 + w, b1, ATTN_WARPS);
#pragma unroll
  for (int i = 0; i < DPL; i++)
    if (DIM_OK(i)) sm_acc[w][lane + 32 * i] = acc[0][i];
  if (lane == 0) {
    sm_ml[w][0] = m[0];
    sm_ml[w][1] = l[0];
  }
  __syncthreads();
  float mx = NEG_INF;
#pragma unroll
  for (int u = 0; u < ATTN_WARPS; u++) mx = fmaxf(mx, sm_ml[u][0]);
  float wt[ATTN_WARPS], sum = 0.0f;
#pragma unroll
  for (int u = 0; u < ATTN_WARPS; u++) {
    wt[u] = sm_ml[u][0] == NEG_INF ? 0.0f : __expf(sm_ml[u][0] - mx);
    sum += sm_ml[u][1] * wt[u];
  }
  const long long row = ((long long)t * n_heads + h) * gridDim.z + z;
  for (int d = threadIdx.x; d < HEAD_DIM; d += ATTN_WARPS * 32) {
    float a = 0.0f;
#pragma unroll
    for (int u = 0; u < ATTN_WARPS; u++) a += sm_acc[u][d] * wt[u];
    if (gridDim.z == 1)
      out[((long long)t * n_heads + h) * HEAD_DIM + d] = sum > 0.0f ? a / sum : 0.0f;
    else
      part_acc[row * HEAD_DIM + d] = a;
  }
  if (gridDim.z > 1 && threadIdx.x == 0) {
    part_ml[row * 2] = mx;
    part_ml[row * 2 + 1] = sum;
  }
}

// Combines the splits of kn_attn_decode. Grid (n_tok, n_heads), block HEAD_DIM.
extern "C" __global__ void __launch_bounds__(HEAD_DIM)
    kn_attn_decode_reduce(float *out, const float *part_acc, const float *part_ml, int n_heads,
                          int n_splits) {
  const long long row = (long long)blockIdx.x * n_heads + blockIdx.y;
  const float *ml = part_ml + row * n_splits * 2;
  float mx = NEG_INF;
  for (int z = 0; z < n_splits; z++) mx = fmaxf(mx, ml[2 * z]);
  float a = 0.0f, sum = 0.0f;
  for (int z = 0; z < n_splits; z++) {
    if (ml[2 * z] == NEG_INF) continue;
    float wt = __expf(ml[2 * z] - mx);
    sum += ml[2 * z + 1] * wt;
    a += part_acc[(row * n_splits + z) * HEAD_DIM + threadIdx.x] * wt;
  }
  out[row * HEAD_DIM + threadIdx.x] = sum > 0.0f ? a / sum : 0.0f;
}

// Prefill chunks: tiled flash-attention. Grid (n_tiles, n_heads), block ATTN_WARPS * 32.
// The host cuts the flat batch into tiles of at most ATTN_WARPS * PREFILL_ROWS consecutive
// tokens of one sequence: tile x is tokens [tile_tok0[x], + tile_ntok[x]). Each warp keeps
// PREFILL_ROWS query rows in registers, so every K/V element it loads serves them all;
// the warps of a tile read the same blocks, which L1 shares.
extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
    kn_attn_prefill(float *out, const float *q, const float *k, const float *v,
                    const int *tok_seq, const int *tok_pos, const int *block_tables,
                    int max_blocks, int n_heads, int n_kv_heads, float scale,
                    const int *tile_tok0, const int *tile_ntok) {
  const int h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int tok0 = tile_tok0[blockIdx.x], ntok = tile_ntok[blockIdx.x];
  const int r0 = w * PREFILL_ROWS;
  if (r0 >= ntok) return;
  float qr[PREFILL_ROWS][DPL], acc[PREFILL_ROWS][DPL], m[PREFILL_ROWS], l[PREFILL_ROWS];
  int lim[PREFILL_ROWS], last = 0;
#pragma unroll
  for (int r = 0; r < PREFILL_ROWS; r++) {
    const bool ok = r0 + r < ntok;
    const int t = tok0 + r0 + r;
    lim[r] = ok ? tok_pos[t] : -1;
    last = max(last, lim[r]);
    m[r] = NEG_INF;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
      qr[r][i] = ok && DIM_OK(i)
                     ? q[((long long)t * n_heads + h) * HEAD_DIM + lane + 32 * i] * scale
                     : 0.0f;
      acc[r][i] = 0.0f;
    }
  }
  attn_blocks<PREFILL_ROWS>(qr, acc, m, l, lim, k, v,
                            block_tables + (long long)tok_seq[tok0] * max_blocks,
                            h / GQA_GROUP, n_kv_heads, 0, last / BLOCK_SIZE + 1, 1);
#pragma unroll
  for (int r = 0; r < PREFILL_ROWS; r++) {
    if (r0 + r >= ntok) break;
    float *o = out + ((long long)(tok0 + r0 + r) * n_heads + h) * HEAD_DIM + lane;
#pragma unroll
    for (int i = 0; i < DPL; i++)
      if (DIM_OK(i)) o[32 * i] = l[r] > 0.0f ? acc[r][i] / l[r] : 0.0f;
  }
}
