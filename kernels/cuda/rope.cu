// rope.cu: rotary embedding in place on x (n_tok, n_heads, head_dim), rotating the first
// rot_dim dims of each head (kn_rope). cos_sin: (max_pos, rot_dim/2, 2) f32 holding
// (cos, sin) of pos * inv_freq[i]; pos[t] < max_pos is checked by the host.
// kn_rope_neox: pairs (i, i + rot_dim/2) as HF Llama; kn_rope_interleaved: pairs (2i, 2i+1).
// Launch: grid (n_tok), block (min(1024, n_heads * rot_dim / 2) rounded to a warp).

#include "kn_cuda.cuh"

template <bool NEOX>
__device__ __forceinline__ void rope_row(float *x, const int *pos, const float *cos_sin,
                                         int n_heads, int head_dim, int rot_dim) {
  int half = rot_dim / 2;
  const float *cs = cos_sin + (long long)pos[blockIdx.x] * rot_dim;
  float *xt = x + (long long)blockIdx.x * n_heads * head_dim;
  for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
    int h = k / half, i = k % half;
    float c = cs[2 * i], s = cs[2 * i + 1];
    float *xh = xt + (long long)h * head_dim;
    int i0 = NEOX ? i : 2 * i, i1 = NEOX ? i + half : 2 * i + 1;
    float a = xh[i0], b = xh[i1];
    xh[i0] = a * c - b * s;
    xh[i1] = b * c + a * s;
  }
}

extern "C" __global__ void kn_rope_neox(float *x, const int *pos, const float *cos_sin,
                                        int n_heads, int head_dim, int rot_dim) {
  kn_pdl();
  rope_row<true>(x, pos, cos_sin, n_heads, head_dim, rot_dim);
}

extern "C" __global__ void kn_rope_interleaved(float *x, const int *pos, const float *cos_sin,
                                               int n_heads, int head_dim, int rot_dim) {
  kn_pdl();
  rope_row<false>(x, pos, cos_sin, n_heads, head_dim, rot_dim);
}
