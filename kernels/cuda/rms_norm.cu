// rms_norm.cu: RMSNorm and fused residual-add + RMSNorm over rows of f32 (kn_rms_norm,
// kn_add_rms_norm). One CTA of RMS_THREADS threads per row; the reduction order depends
// only on dim and RMS_THREADS, never on the number of rows (batch invariance).
// The _h forms also write outh, the f16 (bf16 when bf16 != 0) copy of out that the next
// cuBLAS GEMM reads, sparing it a cast launch (kn_cast_*: the same rounding).
// Launch: grid (n_rows), block (RMS_THREADS).

#include "kn_cuda.cuh"

#ifndef RMS_THREADS
#define RMS_THREADS 256
#endif
#if RMS_THREADS % 32 != 0 || RMS_THREADS > 1024
#error "RMS_THREADS must be a multiple of 32, at most 1024"
#endif

__device__ __forceinline__ float rms_block_sum(float v) {
  __shared__ float part[RMS_THREADS / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < RMS_THREADS / 32; w++) s += part[w];  // same order in every thread
  return s;
}

// out may alias x: every element is read before the barrier inside rms_block_sum and each
// thread writes only the elements it read.
__device__ __forceinline__ void rms_norm_row(float *out, unsigned short *outh, int bf16,
                                             const float *x, const float *w, int dim,
                                             float eps) {
  const long long base = (long long)blockIdx.x * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += RMS_THREADS) ss += x[base + i] * x[base + i];
  float inv = rsqrtf(rms_block_sum(ss) / (float)dim + eps);
  for (int i = threadIdx.x; i < dim; i += RMS_THREADS) {
    const float v = x[base + i] * inv * w[i];
    out[base + i] = v;
    if (outh) outh[base + i] = kn_f32_to_half(v, bf16);
  }
}

// sum = a + b (to out_sum, which may alias a or b), out = rms_norm(sum).
__device__ __forceinline__ void add_rms_norm_row(float *out, unsigned short *outh, int bf16,
                                                 float *out_sum, const float *a,
                                                 const float *b, const float *w, int dim,
                                                 float eps) {
  const long long base = (long long)blockIdx.x * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += RMS_THREADS) {
    float s = a[base + i] + b[base + i];
    out_sum[base + i] = s;
    ss += s * s;
  }
  float inv = rsqrtf(rms_block_sum(ss) / (float)dim + eps);
  for (int i = threadIdx.x; i < dim; i += RMS_THREADS) {
    const float v = out_sum[base + i] * inv * w[i];
    out[base + i] = v;
    if (outh) outh[base + i] = kn_f32_to_half(v, bf16);
  }
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    kn_rms_norm(float *out, const float *x, const float *w, int dim, float eps) {
  kn_pdl();
  rms_norm_row(out, nullptr, 0, x, w, dim, eps);
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    kn_add_rms_norm(float *out, float *out_sum, const float *a, const float *b, const float *w,
                    int dim, float eps) {
  kn_pdl();
  add_rms_norm_row(out, nullptr, 0, out_sum, a, b, w, dim, eps);
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    kn_rms_norm_h(float *out, unsigned short *outh, const float *x, const float *w, int dim,
                  float eps, int bf16) {
  kn_pdl();
  rms_norm_row(out, outh, bf16, x, w, dim, eps);
}

extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    kn_add_rms_norm_h(float *out, unsigned short *outh, float *out_sum, const float *a,
                      const float *b, const float *w, int dim, float eps, int bf16) {
  kn_pdl();
  add_rms_norm_row(out, outh, bf16, out_sum, a, b, w, dim, eps);
}
