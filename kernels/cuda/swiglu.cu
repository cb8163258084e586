// swiglu.cu: out = silu(gate) * up elementwise over n values (kn_swiglu); out may alias
// gate or up. Launch: any 1-D grid (grid-stride loop).

extern "C" __global__ void kn_swiglu(float *out, const float *gate, const float *up,
                                     long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float g = gate[i];
    out[i] = g / (1.0f + __expf(-g)) * up[i];
  }
}

// The epilogue of a fused gate_up matmul that went through cuBLAS: z (m, 2n) holds the
// gate sums in columns [0, n) and the up sums in [n, 2n) (bias added); out (m, n) =
// silu(gate) * up, as kn_matmul_swiglu. Launch: any 1-D grid (grid-stride loop).
extern "C" __global__ void kn_swiglu_packed(float *out, const float *z, long long m,
                                            long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < m * n;
       i += (long long)gridDim.x * blockDim.x) {
    const float *zr = z + i / n * 2 * n;
    float g = zr[i % n];
    out[i] = g / (1.0f + __expf(-g)) * zr[n + i % n];
  }
}
