// attention.cu: paged attention over the block-table KV layout of kernels/cpu/kn_cpu.h
// (kn_kv_layer, kn_attn_batch): out = softmax(q k^T * scale) v per head over each token's
// causal context, head h reading kv head h / GQA_GROUP. window > 0: a token at position p
// sees positions p - window < j <= p only (sliding window; whole KV blocks before it are
// skipped); softcap > 0: each scaled score s becomes softcap * tanh(s / softcap) before the
// softmax (Gemma 2; kn_attn_io.window, .softcap). The new K/V of the step must be in
// the cache first (kv_write.cu). The cache is f32, or f16 bits for the _f16 entries
// (--kv-dtype f16); the arithmetic is f32 on CUDA cores but for kn_attn_prefill_tc*.
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

#include "kn_cuda.cuh"

// A cache element as f32.
__device__ __forceinline__ float kv_ld(const float *p) { return __ldg(p); }
__device__ __forceinline__ float kv_ld(const unsigned short *p) { return kn_f16_to_f32(__ldg(p)); }
/* Does lane own dim lane + 32 i? Always, but for a head under 32 dims (tiny test models). */
#define DIM_OK(i) (HEAD_DIM % 32 == 0 || lane + 32 * (i) < HEAD_DIM)
#define NEG_INF (-__int_as_float(0x7f800000))

// The first position a token at pos sees: pos - window + 1 under a sliding window.
__device__ __forceinline__ int attn_lo(int pos, int window) {
  return window > 0 ? max(0, pos + 1 - window) : 0;
}

// The window as the masks take it: a row at position lim sees lim - span < p <= lim
// (positions stay below 2^30, so no window is 2^30).
__device__ __forceinline__ int attn_span(int window) { return window > 0 ? window : 1 << 30; }

// One warp: rows r < R of one (sequence, head) attend to the logical KV blocks
// b0, b0 + step, ... < b1 of block table bt; row r sees positions lim[r] - span < p <=
// lim[r] (lim < 0: none; span: attn_span), its scores soft-capped first when softcap > 0
// (times 1 / softcap for the CPU's division: the same for a power-of-two cap). The masks
// compare slot j with the row's bounds within the block: one unsigned compare of lim - p
// per slot took 255 registers at HEAD_DIM 16 (ptxas 13.0), this 128 to 142.
template <int R, class KV>
__device__ __forceinline__ void attn_blocks(const float (&q)[R][DPL], float (&acc)[R][DPL],
                                            float (&m)[R], float (&l)[R], const int (&lim)[R],
                                            int span, const KV *k, const KV *v,
                                            const int *bt, int kvh, int n_kv_heads, int b0,
                                            int b1, int step, float softcap) {
  const float inv_cap = softcap > 0.0f ? 1.0f / softcap : 0.0f;
  const int lane = threadIdx.x & 31;
  for (int b = b0; b < b1; b += step) {
    long long base = ((long long)bt[b] * n_kv_heads + kvh) * (BLOCK_SIZE * HEAD_DIM) + lane;
    const KV *kb = k + base, *vb = v + base;
    const int p0 = b * BLOCK_SIZE;
    float s[R][BLOCK_SIZE];
#pragma unroll
    for (int j = 0; j < BLOCK_SIZE; j++) {
      float kd[DPL];
#pragma unroll
      for (int i = 0; i < DPL; i++) kd[i] = DIM_OK(i) ? kv_ld(kb + j * HEAD_DIM + 32 * i) : 0.0f;
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
    if (softcap > 0.0f) {  // uniform: full-precision tanhf, as kn_softcap1
#pragma unroll
      for (int r = 0; r < R; r++) {
#pragma unroll
        for (int j = 0; j < BLOCK_SIZE; j++) s[r][j] = softcap * tanhf(s[r][j] * inv_cap);
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      float mx = m[r];
      const int hi = lim[r] - p0, cut = hi - span;  // slots cut < j <= hi are seen
#pragma unroll
      for (int j = 0; j < BLOCK_SIZE; j++) {
        if (j > hi || j <= cut) s[r][j] = NEG_INF;
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
      for (int i = 0; i < DPL; i++) vd[i] = DIM_OK(i) ? kv_ld(vb + j * HEAD_DIM + 32 * i) : 0.0f;
#pragma unroll
      for (int r = 0; r < R; r++) {
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[r][i] = fmaf(s[r][j], vd[i], acc[r][i]);
      }
    }
  }
}

// Decode, split-K flash-decoding. Grid (n_tok, n_heads, n_splits), block ATTN_WARPS * 32.
// Split z covers logical blocks [b + z * blocks_per_split, +blocks_per_split) of the token's
// context, b the block of its first visible position (0 but under a sliding window: the
// splits then cover the window alone), its warps taking every ATTN_WARPS-th block. With one
// split the result goes straight to out; otherwise the unnormalised partial (n_tok, n_heads,
// n_splits, HEAD_DIM) and its (max, sum) (n_tok, n_heads, n_splits, 2) go to part_acc /
// part_ml for kn_attn_decode_reduce.
template <class KV>
__device__ __forceinline__ void attn_decode(float *out, float *part_acc, float *part_ml,
                                            const float *q, const KV *k, const KV *v,
                                            const int *tok_seq, const int *tok_pos,
                                            const int *block_tables, int max_blocks,
                                            int n_heads, int n_kv_heads, float scale,
                                            int blocks_per_split, int window, float softcap) {
  __shared__ float sm_acc[ATTN_WARPS][HEAD_DIM];
  __shared__ float sm_ml[ATTN_WARPS][2];
  const int t = blockIdx.x, h = blockIdx.y, z = blockIdx.z;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int pos = tok_pos[t], lo = attn_lo(pos, window);
  const int b0 = lo / BLOCK_SIZE + z * blocks_per_split;
  const int b1 = min(b0 + blocks_per_split, pos / BLOCK_SIZE + 1);
  const float *qt = q + ((long long)t * n_heads + h) * HEAD_DIM + lane;
  float qr[1][DPL], acc[1][DPL], m[1] = {NEG_INF}, l[1] = {0.0f};
  const int lim[1] = {pos};
#pragma unroll
  for (int i = 0; i < DPL; i++) {
    qr[0][i] = DIM_OK(i) ? qt[32 * i] * scale : 0.0f;
    acc[0][i] = 0.0f;
  }
  attn_blocks<1, KV>(qr, acc, m, l, lim, attn_span(window), k, v,
                     block_tables + (long long)tok_seq[t] * max_blocks, h / GQA_GROUP,
                     n_kv_heads, b0 + w, b1, ATTN_WARPS, softcap);
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

#define ATTN_DECODE_ENTRY(name, KV)                                                            \
  extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)                               \
      name(float *out, float *part_acc, float *part_ml, const float *q, const KV *k,          \
           const KV *v, const int *tok_seq, const int *tok_pos, const int *block_tables,      \
           int max_blocks, int n_heads, int n_kv_heads, float scale, int blocks_per_split,   \
           int window, float softcap) { kn_pdl();                                                        \
    attn_decode(out, part_acc, part_ml, q, k, v, tok_seq, tok_pos, block_tables, max_blocks, \
                n_heads, n_kv_heads, scale, blocks_per_split, window, softcap);               \
  }
ATTN_DECODE_ENTRY(kn_attn_decode, float)
ATTN_DECODE_ENTRY(kn_attn_decode_f16, unsigned short)

// Combines the splits of kn_attn_decode. Grid (n_tok, n_heads), block HEAD_DIM.
extern "C" __global__ void __launch_bounds__(HEAD_DIM)
    kn_attn_decode_reduce(float *out, const float *part_acc, const float *part_ml, int n_heads,
                          int n_splits) {
  kn_pdl();
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
// the warps of a tile read the same blocks, which L1 shares. Under a sliding window a warp
// starts at the block of its rows' first visible position.
template <class KV>
__device__ __forceinline__ void attn_prefill(float *out, const float *q, const KV *k,
                                             const KV *v, const int *tok_seq,
                                             const int *tok_pos, const int *block_tables,
                                             int max_blocks, int n_heads, int n_kv_heads,
                                             float scale, const int *tile_tok0,
                                             const int *tile_ntok, int window, float softcap) {
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
  // the warp's first row has its smallest position: a tile is consecutive positions
  const int first = attn_lo(lim[0], window);
  attn_blocks<PREFILL_ROWS, KV>(qr, acc, m, l, lim, attn_span(window), k, v,
                                block_tables + (long long)tok_seq[tok0] * max_blocks,
                                h / GQA_GROUP, n_kv_heads, first / BLOCK_SIZE,
                                last / BLOCK_SIZE + 1, 1, softcap);
#pragma unroll
  for (int r = 0; r < PREFILL_ROWS; r++) {
    if (r0 + r >= ntok) break;
    float *o = out + ((long long)(tok0 + r0 + r) * n_heads + h) * HEAD_DIM + lane;
#pragma unroll
    for (int i = 0; i < DPL; i++)
      if (DIM_OK(i)) o[32 * i] = l[r] > 0.0f ? acc[r][i] / l[r] : 0.0f;
  }
}

// The prefill entries' parameters (kn_attn_prefill and kn_attn_prefill_tc, by KV type).
#define ATTN_PREFILL_PARAMS(KV)                                                                \
  float *out, const float *q, const KV *k, const KV *v, const int *tok_seq,                    \
      const int *tok_pos, const int *block_tables, int max_blocks, int n_heads,                \
      int n_kv_heads, float scale, const int *tile_tok0, const int *tile_ntok, int window,     \
      float softcap
#define ATTN_PREFILL_ARGS                                                                      \
  out, q, k, v, tok_seq, tok_pos, block_tables, max_blocks, n_heads, n_kv_heads, scale,        \
      tile_tok0, tile_ntok, window, softcap

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
    kn_attn_prefill(ATTN_PREFILL_PARAMS(float)) {
  kn_pdl();
  attn_prefill(ATTN_PREFILL_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
    kn_attn_prefill_f16(ATTN_PREFILL_PARAMS(unsigned short)) {
  kn_pdl();
  attn_prefill(ATTN_PREFILL_ARGS);
}

// Prefill chunks on tensor cores (sm_80+): flash-attention with f16 operands and f32
// accumulation, for plans whose GEMMs already take f16/bf16 activations. Grid (n_tiles,
// n_heads), block TC_WARPS * 32; tile x is tokens [tile_tok0[x], + tile_ntok[x]) of one
// sequence, at most TC_WARPS * 16 (the host tiles by CUDA_TC_TILE_TOKENS); warp w owns
// query rows 16 w .. 16 w + 15 of the tile.
// Per chunk of TC_KC cached positions the CTA stages K and V as f16 rows in shared memory;
// each warp computes its 16 x TC_KC scores with mma.m16n8k16 (q pre-scaled, in registers
// as A fragments), runs the online softmax on the accumulators in registers, and feeds the
// probabilities straight back as the A fragments of P V (the accumulator layout of two
// n-tiles is the A layout of one k-step). Software-pipelined: the global loads of the next
// chunk (block table, then K and V) are in flight in registers while the warps compute on
// this one, so their latency hides behind the mma work; one shared buffer, two barriers a
// chunk. Fragment layouts (PTX ISA, mma.m16n8k16 .f16): lane = 4 g + c; A regs a0..a3 hold
// rows g, g+8, g, g+8 at columns 2c, 2c+1 (+8 for a2, a3); B regs b0, b1 hold rows (k) 2c,
// 2c+1 (+8 for b1) of column g; C/D d0..d3 hold rows g, g, g+8, g+8 at columns 2c, 2c+1, 2c,
// 2c+1. K rows give B (k = dim) as one 32-bit load; V's B (k = position) pairs two rows,
// two 16-bit loads: with the TC_KP pitch both are free of bank conflicts, and so are the
// staging stores (a warp writes 8-byte pieces of whole rows), which a transposed V was not.
// Under a sliding window the chunks start at the tile's first visible position, and a
// warp skips those wholly before its rows' windows.
#if HEAD_DIM % 16 == 0 && HEAD_DIM <= 128
#define TC_WARPS 4
#define TC_KC (HEAD_DIM > 64 ? 16 : 32) /* positions per chunk: fewer registers at 128 */
#define TC_KP (HEAD_DIM + 8)             /* sK, sV row pitch (halves) */
#define TC_GROUPS (TC_KC * HEAD_DIM / 4) /* 4-element pieces of K (and of V) a chunk */
#define TC_NL ((TC_GROUPS + TC_WARPS * 32 - 1) / (TC_WARPS * 32)) /* pieces a thread */

#ifdef CUEMU  // tests/cuemu: the kernel built for the CPU (a warp-collective mma there)
__device__ __forceinline__ unsigned tc_pack(float lo, float hi) {
  return cuemu_pack_f16x2(lo, hi);
}
__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                       unsigned b1) {
  cuemu_mma_m16n8k16_f16(d, a, b0, b1);
}
#else
// {lo, hi} rounded to nearest-even f16, lo in the low half.
__device__ __forceinline__ unsigned tc_pack(float lo, float hi) {
  unsigned u;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
  return u;
}
// d += a b for one m16n8k16 tile (f16 operands, f32 accumulators).
__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                       unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Four cache elements as loaded (tc_ld), and as two f16 pairs {p0, p1} (x), {p2, p3} (y):
// rounded from an f32 cache, as they are in an f16 one.
__device__ __forceinline__ float4 tc_ld(const float *p) { return __ldg((const float4 *)p); }
__device__ __forceinline__ uint2 tc_ld(const unsigned short *p) {
  return __ldg((const uint2 *)p);
}
__device__ __forceinline__ uint2 tc_f16x4(float4 x) {
  uint2 r;
  r.x = tc_pack(x.x, x.y), r.y = tc_pack(x.z, x.w);
  return r;
}
__device__ __forceinline__ uint2 tc_f16x4(uint2 x) { return x; }
template <class KV> struct tc_raw { typedef float4 t; };  // a piece as loaded
template <> struct tc_raw<unsigned short> { typedef uint2 t; };

template <class KV>
__device__ __forceinline__ void attn_prefill_tc(ATTN_PREFILL_PARAMS(KV)) {
  __shared__ __align__(16) unsigned short sK[TC_KC * TC_KP];
  __shared__ __align__(16) unsigned short sV[TC_KC * TC_KP];
  const int h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int tok0 = tile_tok0[blockIdx.x], ntok = tile_ntok[blockIdx.x];
  if (ntok <= 0) return;  // an empty tile of a captured step's fixed grid: the whole CTA
  const int kvh = h / GQA_GROUP;
  const int *bt = block_tables + (long long)tok_seq[tok0] * max_blocks;
  // Rows g and g + 8 of this warp: their token's position, -1 past the tile.
  const int ra = 16 * w + g, rb = ra + 8;
  const int lim_a = ra < ntok ? tok_pos[tok0 + ra] : -1;
  const int lim_b = rb < ntok ? tok_pos[tok0 + rb] : -1;
  // The tile's tokens are consecutive positions of one sequence: its first is the smallest,
  // its last the largest.
  const int first = attn_lo(tok_pos[tok0], window), last = tok_pos[tok0 + ntok - 1];
  int wfirst = 0x7fffffff, wlast = -1;  // the positions this warp's rows see, at most
  for (int r = 16 * w; r < min(16 * w + 16, ntok); r++) {
    wfirst = min(wfirst, attn_lo(tok_pos[tok0 + r], window));
    wlast = max(wlast, tok_pos[tok0 + r]);
  }
  const float inv_cap = softcap > 0.0f ? 1.0f / softcap : 0.0f;
  const int span = attn_span(window);

  unsigned qa[HEAD_DIM / 16][4];  // q * scale as A fragments, one per 16 dims
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
    const int d0 = 16 * kk + 2 * c;
    const float *qa_row = q + ((long long)(tok0 + ra) * n_heads + h) * HEAD_DIM;
    const float *qb_row = q + ((long long)(tok0 + rb) * n_heads + h) * HEAD_DIM;
    const bool oa = lim_a >= 0, ob = lim_b >= 0;
    qa[kk][0] = tc_pack(oa ? qa_row[d0] * scale : 0.0f, oa ? qa_row[d0 + 1] * scale : 0.0f);
    qa[kk][1] = tc_pack(ob ? qb_row[d0] * scale : 0.0f, ob ? qb_row[d0 + 1] * scale : 0.0f);
    qa[kk][2] = tc_pack(oa ? qa_row[d0 + 8] * scale : 0.0f, oa ? qa_row[d0 + 9] * scale : 0.0f);
    qa[kk][3] = tc_pack(ob ? qb_row[d0 + 8] * scale : 0.0f, ob ? qb_row[d0 + 9] * scale : 0.0f);
  }
  float o[HEAD_DIM / 8][4];
#pragma unroll
  for (int dn = 0; dn < HEAD_DIM / 8; dn++) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
  float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.0f, l_b = 0.0f;

  // Piece u of a chunk: position j, dims d .. d + 3 of it (thread-strided, so a warp loads
  // and stores whole rows); its pieces past `last` or past the chunk are zeros.
  typedef typename tc_raw<KV>::t raw;
  raw kr[TC_NL], vr[TC_NL];
  const auto load = [&](int p0) {
#pragma unroll
    for (int u = 0; u < TC_NL; u++) {
      const int i = threadIdx.x + u * TC_WARPS * 32;
      const int j = i / (HEAD_DIM / 4), d = 4 * (i % (HEAD_DIM / 4)), p = p0 + j;
      kr[u] = vr[u] = raw{};
      if (i < TC_GROUPS && p <= last) {
        const long long row = (((long long)bt[p / BLOCK_SIZE] * n_kv_heads + kvh) * BLOCK_SIZE +
                               p % BLOCK_SIZE) * HEAD_DIM + d;
        kr[u] = tc_ld(k + row);
        vr[u] = tc_ld(v + row);
      }
    }
  };
  load(first);
  for (int p0 = first; p0 <= last; p0 += TC_KC) {
    __syncthreads();  // the previous chunk's fragments are read
#pragma unroll
    for (int u = 0; u < TC_NL; u++) {
      const int i = threadIdx.x + u * TC_WARPS * 32;
      if (TC_GROUPS % (TC_WARPS * 32) != 0 && i >= TC_GROUPS) break;
      const int at = i / (HEAD_DIM / 4) * TC_KP + 4 * (i % (HEAD_DIM / 4));
      *(uint2 *)&sK[at] = tc_f16x4(kr[u]);
      *(uint2 *)&sV[at] = tc_f16x4(vr[u]);
    }
    __syncthreads();
    if (p0 + TC_KC <= last) load(p0 + TC_KC);  // in flight while this chunk computes
    // causal, or before the window: no row of this warp sees the chunk (warp-uniform)
    if (p0 > wlast || p0 + TC_KC <= wfirst) continue;

    float s[TC_KC / 8][4];  // scores: n-tile nt covers positions p0 + 8 nt ..
#pragma unroll
    for (int nt = 0; nt < TC_KC / 8; nt++) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
        const unsigned short *kp = &sK[(8 * nt + g) * TC_KP + 16 * kk + 2 * c];
        tc_mma(s[nt], qa[kk], *(const unsigned *)kp, *(const unsigned *)(kp + 8));
      }
    }
    if (softcap > 0.0f) {  // uniform
#pragma unroll
      for (int nt = 0; nt < TC_KC / 8; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = softcap * tanhf(s[nt][e] * inv_cap);
      }
    }
    // Online softmax for rows a (g) and b (g + 8); each row's 32 scores are spread over
    // the 4 lanes of its quad, 8 each.
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int nt = 0; nt < TC_KC / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int p = p0 + 8 * nt + 2 * c + e;
        if (p > lim_a || p <= lim_a - span) s[nt][e] = NEG_INF;
        if (p > lim_b || p <= lim_b - span) s[nt][2 + e] = NEG_INF;
        mx_a = fmaxf(mx_a, s[nt][e]);
        mx_b = fmaxf(mx_b, s[nt][2 + e]);
      }
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    // A row with nothing visible yet keeps m = -inf: its probabilities are 0, alpha 1.
    const float alpha_a = mx_a == NEG_INF ? 1.0f : __expf(m_a - mx_a);
    const float alpha_b = mx_b == NEG_INF ? 1.0f : __expf(m_b - mx_b);
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int nt = 0; nt < TC_KC / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        s[nt][e] = mx_a == NEG_INF ? 0.0f : __expf(s[nt][e] - mx_a);
        s[nt][2 + e] = mx_b == NEG_INF ? 0.0f : __expf(s[nt][2 + e] - mx_b);
        sum_a += s[nt][e];
        sum_b += s[nt][2 + e];
      }
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      sum_a += __shfl_xor_sync(0xffffffffu, sum_a, off);
      sum_b += __shfl_xor_sync(0xffffffffu, sum_b, off);
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    m_a = mx_a, m_b = mx_b;
#pragma unroll
    for (int dn = 0; dn < HEAD_DIM / 8; dn++) {
      o[dn][0] *= alpha_a, o[dn][1] *= alpha_a;
      o[dn][2] *= alpha_b, o[dn][3] *= alpha_b;
    }
    // O += P V: k-step ks takes score n-tiles 2 ks and 2 ks + 1 as its A fragment.
#pragma unroll
    for (int ks = 0; ks < TC_KC / 16; ks++) {
      const unsigned pa[4] = {tc_pack(s[2 * ks][0], s[2 * ks][1]),
                              tc_pack(s[2 * ks][2], s[2 * ks][3]),
                              tc_pack(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                              tc_pack(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int dn = 0; dn < HEAD_DIM / 8; dn++) {
        const unsigned short *vp = &sV[(16 * ks + 2 * c) * TC_KP + 8 * dn + g];
        tc_mma(o[dn], pa, vp[0] | (unsigned)vp[TC_KP] << 16,
               vp[8 * TC_KP] | (unsigned)vp[9 * TC_KP] << 16);
      }
    }
  }
  const float ia = l_a > 0.0f ? 1.0f / l_a : 0.0f, ib = l_b > 0.0f ? 1.0f / l_b : 0.0f;
#pragma unroll
  for (int dn = 0; dn < HEAD_DIM / 8; dn++) {
    const int d = 8 * dn + 2 * c;
    if (lim_a >= 0) {
      float *oa = out + ((long long)(tok0 + ra) * n_heads + h) * HEAD_DIM + d;
      oa[0] = o[dn][0] * ia, oa[1] = o[dn][1] * ia;
    }
    if (lim_b >= 0) {
      float *ob = out + ((long long)(tok0 + rb) * n_heads + h) * HEAD_DIM + d;
      ob[0] = o[dn][2] * ib, ob[1] = o[dn][3] * ib;
    }
  }
}

// __maxnreg__ rather than __launch_bounds__: under the latter ptxas spills at HEAD_DIM 128
// on sm_90 (168 registers); capped at 200 it uses about 175 and none spill.
extern "C" __global__ void __maxnreg__(200) kn_attn_prefill_tc(ATTN_PREFILL_PARAMS(float)) {
  kn_pdl();
  attn_prefill_tc(ATTN_PREFILL_ARGS);
}
extern "C" __global__ void __maxnreg__(200)
    kn_attn_prefill_tc_f16(ATTN_PREFILL_PARAMS(unsigned short)) {
  kn_pdl();
  attn_prefill_tc(ATTN_PREFILL_ARGS);
}
#endif
