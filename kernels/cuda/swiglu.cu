// swiglu.cu: the gated activations of the MLPs, out = silu(gate) * up (kn_swiglu) and
// gelu_tanh(gate) * up (kn_geglu, Gemma), elementwise over n values, out may alias gate or
// up; and the tanh soft cap of Gemma 2's logits (kn_softcap). Launch: any 1-D grid
// (grid-stride loop).

#include "kn_cuda.cuh"

extern "C" __global__ void kn_swiglu(float *out, const float *gate, const float *up,
                                     long long n) {
  kn_pdl();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float g = gate[i];
    out[i] = g / (1.0f + __expf(-g)) * up[i];
  }
}

// The epilogue of a fused gate_up matmul that went through cuBLAS: z (m, 2n) holds the
// gate sums in columns [0, n) and the up sums in [n, 2n) (bias added); out (m, n) =
// silu(gate) * up, as kn_matmul_swiglu; kn_swiglu_packed_h also writes outh, out's f16
// (bf16 when bf16 != 0) copy for the down projection's cuBLAS GEMM (no cast launch).
// Launch: any 1-D grid (grid-stride loop).
__device__ __forceinline__ void swiglu_packed(float *out, unsigned short *outh, int bf16,
                                              const float *z, long long m, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < m * n;
       i += (long long)gridDim.x * blockDim.x) {
    const float *zr = z + i / n * 2 * n;
    float g = zr[i % n];
    const float v = g / (1.0f + __expf(-g)) * zr[n + i % n];
    out[i] = v;
    if (outh) outh[i] = kn_f32_to_half(v, bf16);
  }
}

extern "C" __global__ void kn_swiglu_packed(float *out, const float *z, long long m,
                                            long long n) {
  kn_pdl();
  swiglu_packed(out, nullptr, 0, z, m, n);
}

extern "C" __global__ void kn_swiglu_packed_h(float *out, unsigned short *outh, const float *z,
                                              long long m, long long n, int bf16) {
  kn_pdl();
  swiglu_packed(out, outh, bf16, z, m, n);
}

// out = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) u in f32, the formula as written
// (the unfused swiglu op with act = IR_ACT_GEGLU; the CPU's kn_geglu takes it as
// g sigmoid(2z) u, within a few ulp; memory-bound here, so tanhf costs nothing).
extern "C" __global__ void kn_geglu(float *out, const float *gate, const float *up,
                                    long long n) {
  kn_pdl();
  const float beta = 0.7978845608028654f, kappa = 0.044715f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + tanhf(beta * (g + kappa * g * g * g))) * up[i];
  }
}

// out = cap * tanh(x / cap) over n values (kn_softcap; cap > 0); out may alias x.
extern "C" __global__ void kn_softcap(float *out, const float *x, long long n, float cap) {
  kn_pdl();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = cap * tanhf(x[i] / cap);
}
