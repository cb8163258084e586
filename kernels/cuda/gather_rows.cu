// gather_rows.cu: out[r, :] = x[rows[r], :] (kn_gather_rows), e.g. the rows that want
// logits. Launch: grid (n_rows), block (256).

#include "kn_cuda.cuh"

extern "C" __global__ void kn_gather_rows(float *out, const float *x, const int *rows,
                                          long long dim) {
  kn_pdl();
  const float *src = x + (long long)rows[blockIdx.x] * dim;
  float *dst = out + (long long)blockIdx.x * dim;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}
