// gemv.cu: weight-only GEMV for decode, y = x . W^T (+ bias) (kn_matmul for small m;
// prefill and large batches use cuBLAS). x: (m, k) f32; W: (n, k) in f32, f16, bf16 or
// the ggml blocks q8_0 / q4_0 / q4_1 (ir/ir_dtype.h), read in place; bias (n) f32 or
// NULL; y: (m, n) f32.
//
// One warp per output column n, GEMV_M rows of x per CTA (their accumulators stay in
// registers, so each weight byte is read once per GEMV_M rows). Lane i takes the k-chunks
// i, i + 32, ...; the order of one y element's sum depends only on k, never on m.
// Launch: grid (ceil(n / GEMV_WARPS), ceil(m / GEMV_M)), block GEMV_WARPS * 32.
// Each kn_gemv_<type> has a kn_gemv_<type>_swiglu twin (gemv's SWIGLU below).
// Needs k % 32 == 0 for the block types, k % 8 == 0 for f16/bf16, k % 4 == 0 for f32,
// x 16-byte aligned and its rows too (k * 4 bytes).

#include "kn_cuda.cuh"

// Loads 8 consecutive x values of row r starting at column c.
__device__ __forceinline__ void gv_x8(float (&xv)[8], const float *x, long long c) {
  float4 a = __ldg((const float4 *)(x + c)), b = __ldg((const float4 *)(x + c + 4));
  xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
  xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
}

// Per-type chunk: CHUNK values of one weight row dotted with GEMV_M rows of x.
struct gv_q8_0 {
  enum { CHUNK = 32, BYTES = 34 };
  static __device__ __forceinline__ void dot(float (&acc)[GEMV_M], const unsigned char *blk,
                                             const float *x, long long c, int k, int rows) {
    float d = kn_f16_to_f32(*(const unsigned short *)blk);
    const unsigned short *qs = (const unsigned short *)(blk + 2);  // 2-byte aligned
    float w[32];
#pragma unroll
    for (int j = 0; j < 16; j++) {
      unsigned short u = __ldg(qs + j);
      w[2 * j] = (float)(signed char)(u & 0xff);
      w[2 * j + 1] = (float)(signed char)(u >> 8);
    }
#pragma unroll
    for (int r = 0; r < GEMV_M; r++) {
      if (r >= rows) break;
      float s = 0.0f, xv[8];
#pragma unroll
      for (int j = 0; j < 32; j += 8) {
        gv_x8(xv, x + (long long)r * k, c + j);
#pragma unroll
        for (int e = 0; e < 8; e++) s = fmaf(w[j + e], xv[e], s);
      }
      acc[r] = fmaf(d, s, acc[r]);
    }
  }
};

// q4_0 and q4_1 share the nibble layout: value j < 16 is the low nibble of qs[j],
// value j + 16 the high one. q4_1 adds m * sum(x) per block.
template <int HDR, bool MIN>
struct gv_q4 {
  enum { CHUNK = 32, BYTES = HDR + 16 };
  static __device__ __forceinline__ void dot(float (&acc)[GEMV_M], const unsigned char *blk,
                                             const float *x, long long c, int k, int rows) {
    const unsigned short *hd = (const unsigned short *)blk;
    float d = kn_f16_to_f32(hd[0]), mn = MIN ? kn_f16_to_f32(hd[1]) : 0.0f;
    const unsigned short *qs = (const unsigned short *)(blk + HDR);
    float w[32];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      unsigned int u = __ldg(qs + j);
      w[2 * j] = (float)((int)(u & 15) - (MIN ? 0 : 8));
      w[2 * j + 1] = (float)((int)((u >> 8) & 15) - (MIN ? 0 : 8));
      w[2 * j + 16] = (float)((int)((u >> 4) & 15) - (MIN ? 0 : 8));
      w[2 * j + 17] = (float)((int)(u >> 12) - (MIN ? 0 : 8));
    }
#pragma unroll
    for (int r = 0; r < GEMV_M; r++) {
      if (r >= rows) break;
      float s = 0.0f, sx = 0.0f, xv[8];
#pragma unroll
      for (int j = 0; j < 32; j += 8) {
        gv_x8(xv, x + (long long)r * k, c + j);
#pragma unroll
        for (int e = 0; e < 8; e++) {
          s = fmaf(w[j + e], xv[e], s);
          if (MIN) sx += xv[e];
        }
      }
      acc[r] = fmaf(d, s, acc[r]);
      if (MIN) acc[r] = fmaf(mn, sx, acc[r]);
    }
  }
};

// 8 halves (one 16-byte load) per chunk.
template <bool BF16>
struct gv_half {
  enum { CHUNK = 8, BYTES = 16 };
  static __device__ __forceinline__ void dot(float (&acc)[GEMV_M], const unsigned char *p,
                                             const float *x, long long c, int k, int rows) {
    uint4 u = __ldg((const uint4 *)p);
    unsigned int h[4] = {u.x, u.y, u.z, u.w};
    float w[8];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const unsigned int lo = h[j] & 0xffff, hi = h[j] >> 16;
      w[2 * j] = BF16 ? kn_bf16_to_f32(lo) : kn_f16_to_f32((unsigned short)lo);
      w[2 * j + 1] = BF16 ? kn_bf16_to_f32(hi) : kn_f16_to_f32((unsigned short)hi);
    }
#pragma unroll
    for (int r = 0; r < GEMV_M; r++) {
      if (r >= rows) break;
      float xv[8], s = acc[r];
      gv_x8(xv, x + (long long)r * k, c);
#pragma unroll
      for (int e = 0; e < 8; e++) s = fmaf(w[e], xv[e], s);
      acc[r] = s;
    }
  }
};

struct gv_f32 {
  enum { CHUNK = 4, BYTES = 16 };
  static __device__ __forceinline__ void dot(float (&acc)[GEMV_M], const unsigned char *p,
                                             const float *x, long long c, int k, int rows) {
    float4 wv = __ldg((const float4 *)p);
#pragma unroll
    for (int r = 0; r < GEMV_M; r++) {
      if (r >= rows) break;
      float4 xv = __ldg((const float4 *)(x + (long long)r * k + c));
      acc[r] = fmaf(wv.w, xv.w, fmaf(wv.z, xv.z, fmaf(wv.y, xv.y, fmaf(wv.x, xv.x, acc[r]))));
    }
  }
};

// SWIGLU: the gate/up projection of a fused gate_up matmul with its swiglu epilogue. W has
// 2n rows, gate rows [0, n) then up rows [n, 2n), bias (2n) or NULL, and y (m, n) = silu(g)
// * u with g, u the biased sums of column col's gate and up rows, as kn_matmul_swiglu: each
// warp dots both rows, so the 2n-wide intermediate is never stored.
template <class T, bool SWIGLU>
__device__ __forceinline__ void gemv(float *y, const float *x, const unsigned char *w,
                                     const float *bias, int m, int n, int k) {
  const int lane = threadIdx.x & 31;
  const int col = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  const int r0 = blockIdx.y * GEMV_M;
  if (col >= n) return;
  const int rows = min(GEMV_M, m - r0);
  const int n_chunks = k / T::CHUNK;
  const long long row_bytes = (long long)n_chunks * T::BYTES;
  const unsigned char *wg = w + (long long)col * row_bytes, *wu = wg + (long long)n * row_bytes;
  const float *xr = x + (long long)r0 * k;
  float ag[GEMV_M], au[GEMV_M];
#pragma unroll
  for (int r = 0; r < GEMV_M; r++) ag[r] = au[r] = 0.0f;
  for (int ch = lane; ch < n_chunks; ch += 32) {
    T::dot(ag, wg + (long long)ch * T::BYTES, xr, (long long)ch * T::CHUNK, k, rows);
    if (SWIGLU) T::dot(au, wu + (long long)ch * T::BYTES, xr, (long long)ch * T::CHUNK, k, rows);
  }
  const float bg = bias ? bias[col] : 0.0f, bu = SWIGLU && bias ? bias[n + col] : 0.0f;
#pragma unroll
  for (int r = 0; r < GEMV_M; r++) {
    float g = ag[r], u = au[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      g += __shfl_xor_sync(0xffffffffu, g, o);
      if (SWIGLU) u += __shfl_xor_sync(0xffffffffu, u, o);
    }
    g += bg;
    if (lane == 0 && r < rows)
      y[(long long)(r0 + r) * n + col] = SWIGLU ? g / (1.0f + __expf(-g)) * (u + bu) : g;
  }
}

// The swiglu entries cap registers at 128 (q8_0 spills on sm_80 under ptxas's own choice
// of 96).
#define GEMV_ENTRY(name, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                             \
      name(float *y, const float *x, const unsigned char *w, const float *bias, int m, int n, \
           int k) { kn_pdl();                                                                         \
    gemv<T, false>(y, x, w, bias, m, n, k);                                                 \
  }                                                                                         \
  extern "C" __global__ void __maxnreg__(128)                                               \
      name##_swiglu(float *y, const float *x, const unsigned char *w, const float *bias,      \
                    int m, int n, int k) { kn_pdl();                                                  \
    gemv<T, true>(y, x, w, bias, m, n, k);                                                  \
  }

GEMV_ENTRY(kn_gemv_q8_0, gv_q8_0)
typedef gv_q4<2, false> gv_q4_0;
typedef gv_q4<4, true> gv_q4_1;
GEMV_ENTRY(kn_gemv_q4_0, gv_q4_0)
GEMV_ENTRY(kn_gemv_q4_1, gv_q4_1)
typedef gv_half<false> gv_f16w;
typedef gv_half<true> gv_bf16w;
GEMV_ENTRY(kn_gemv_f16, gv_f16w)
GEMV_ENTRY(kn_gemv_bf16, gv_bf16w)
GEMV_ENTRY(kn_gemv_f32, gv_f32)
