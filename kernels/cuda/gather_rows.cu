// gather_rows.cu: out[r, :] = x[rows[r], :] (kn_gather_rows), e.g. the rows that want
// logits. Launch: grid (n_rows), block (256).

extern "C" __global__ void kn_gather_rows(float *out, const float *x, const int *rows,
                                          long long dim) {
  const float *src = x + (long long)rows[blockIdx.x] * dim;
  float *dst = out + (long long)blockIdx.x * dim;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}
