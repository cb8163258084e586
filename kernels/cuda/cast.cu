// cast.cu: what the CUDA backend needs around cuBLAS GEMMs. kn_cast_f16 / kn_cast_bf16:
// out = x rounded to nearest-even f16 / bf16 (the activations of a GEMM whose weights are
// f16 / bf16: cuBLAS wants both operands in one type). kn_add_bias: y[r, :] += bias over
// m rows of n. kn_dequant_<t>: ggml blocks as f16, the weight operand cuBLAS takes for GGUF
// weights in prefill-sized GEMMs. Launch: any 1-D grid (grid-stride loops).

#include "kn_cuda.cuh"

extern "C" __global__ void kn_cast_f16(unsigned short *out, const float *x, long long n) {
  kn_pdl();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    out[i] = kn_f32_to_f16(x[i]);
  }
}

extern "C" __global__ void kn_cast_bf16(unsigned short *out, const float *x, long long n) {
  kn_pdl();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    out[i] = kn_f32_to_bf16(x[i]);
  }
}

extern "C" __global__ void kn_add_bias(float *y, const float *bias, long long m, long long n) {
  kn_pdl();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < m * n;
       i += (long long)gridDim.x * blockDim.x)
    y[i] += bias[i % n];
}

// kn_dequant_q8_0 / _q4_0 / _q4_1: out[0, 32 n_blocks) = the f16 values of n_blocks ggml
// blocks (layouts in embed.cu): d q (q8_0), d (q - 8) (q4_0), fma(d, q, m) (q4_1) in f32 as
// the CPU's kn_quant_value, rounded to nearest-even f16. Thread i writes values
// [8i, 8i + 8) of its block, one 16-byte store, so a warp's stores are contiguous.
__device__ __forceinline__ unsigned short dq_u16(const unsigned char *p) {
  return (unsigned short)(p[0] | (p[1] << 8));
}

__device__ __forceinline__ void dq_store8(unsigned short *out, const float v[8]) {
  unsigned int u[4];
  for (int j = 0; j < 4; j++)
    u[j] = (unsigned int)kn_f32_to_f16(v[2 * j]) |
           ((unsigned int)kn_f32_to_f16(v[2 * j + 1]) << 16);
  *(uint4 *)out = make_uint4(u[0], u[1], u[2], u[3]);
}

#define DEQUANT_ENTRY(name, BYTES, VALUE)                                                    \
  extern "C" __global__ void name(unsigned short *out, const unsigned char *w,                \
                                  long long n_blocks) { kn_pdl();                                      \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_blocks * 4;   \
         i += (long long)gridDim.x * blockDim.x) {                                          \
      const unsigned char *b = w + (i >> 2) * BYTES;                                         \
      const int j0 = (int)(i & 3) * 8;                                                       \
      const float d = kn_f16_to_f32(dq_u16(b));                                              \
      float v[8];                                                                            \
      for (int t = 0; t < 8; t++) {                                                          \
        const int j = j0 + t;                                                                \
        v[t] = VALUE;                                                                        \
      }                                                                                      \
      dq_store8(out + i * 8, v);                                                             \
    }                                                                                        \
  }

#define DQ_NIB(b, off, j) (float)((j) < 16 ? (b)[(off) + (j)] & 15 : (b)[(off) + (j) - 16] >> 4)
DEQUANT_ENTRY(kn_dequant_q8_0, 34, d * (float)(signed char)b[2 + j])
DEQUANT_ENTRY(kn_dequant_q4_0, 18, d * (DQ_NIB(b, 2, j) - 8.0f))
DEQUANT_ENTRY(kn_dequant_q4_1, 20, fmaf(d, DQ_NIB(b, 4, j), kn_f16_to_f32(dq_u16(b + 2))))
