// add.cu: out = a + b elementwise over n values (kn_add); out may alias a or b.
// Launch: any 1-D grid (grid-stride loop).

extern "C" __global__ void kn_add(float *out, const float *a, const float *b, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = a[i] + b[i];
}
