// cast.cu: what the CUDA backend needs around cuBLAS GEMMs. kn_cast_f16 / kn_cast_bf16:
// out = x rounded to nearest-even f16 / bf16 (the activations of a GEMM whose weights are
// f16 / bf16: cuBLAS wants both operands in one type). kn_add_bias: y[r, :] += bias over
// m rows of n. Launch: any 1-D grid (grid-stride loops).

#include "kn_cuda.cuh"

extern "C" __global__ void kn_cast_f16(unsigned short *out, const float *x, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    out[i] = kn_f32_to_f16(x[i]);
  }
}

extern "C" __global__ void kn_cast_bf16(unsigned short *out, const float *x, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    unsigned int u = __float_as_uint(x[i]);
    // NaN stays a quiet NaN; everything else rounds to nearest even, as ir_f32_to_bf16.
    unsigned int r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    out[i] = (unsigned short)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
  }
}

extern "C" __global__ void kn_add_bias(float *y, const float *bias, long long m, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < m * n;
       i += (long long)gridDim.x * blockDim.x)
    y[i] += bias[i % n];
}
