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
