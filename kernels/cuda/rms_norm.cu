// rms_norm.cu: RMSNorm and fused residual-add + RMSNorm over rows of f32 (kn_rms_norm,
// kn_add_rms_norm). One CTA of RMS_THREADS threads per row; the reduction order depends
// only on dim and RMS_THREADS, never on the number of rows (batch invariance).
// Launch: grid (n_rows), block (RMS_THREADS).

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
extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    kn_rms_norm(float *out, const float *x, const float *w, int dim, float eps) {
  const float *xr = x + (long long)blockIdx.x * dim;
  float *or_ = out + (long long)blockIdx.x * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += RMS_THREADS) ss += xr[i] * xr[i];
  float inv = rsqrtf(rms_block_sum(ss) / (float)dim + eps);
  for (int i = threadIdx.x; i < dim; i += RMS_THREADS) or_[i] = xr[i] * inv * w[i];
}

// sum = a + b (to out_sum, which may alias a or b), out = rms_norm(sum).
extern "C" __global__ void __launch_bounds__(RMS_THREADS)
    kn_add_rms_norm(float *out, float *out_sum, const float *a, const float *b, const float *w,
                    int dim, float eps) {
  long long base = (long long)blockIdx.x * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += RMS_THREADS) {
    float s = a[base + i] + b[base + i];
    out_sum[base + i] = s;
    ss += s * s;
  }
  float inv = rsqrtf(rms_block_sum(ss) / (float)dim + eps);
  for (int i = threadIdx.x; i < dim; i += RMS_THREADS)
    out[base + i] = out_sum[base + i] * inv * w[i];
}
