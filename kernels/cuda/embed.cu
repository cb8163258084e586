// embed.cu: token embedding lookup, out[t, :] = f32(table[ids[t], :]) * scale
// (kn_embed_scaled; scale 1 is kn_embed, exactly). One CTA per token; table dtypes f32,
// f16, bf16 and the ggml blocks q8_0/q4_0/q4_1. ids are checked by the host (0 <= id < vocab).

#include "kn_cuda.cuh"

extern "C" __global__ void kn_embed_f32(float *out, const float *table, const int *ids,
                                        long long dim, float scale) {
  kn_pdl();
  const float *row = table + (long long)ids[blockIdx.x] * dim;
  float *o = out + (long long)blockIdx.x * dim;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) o[i] = row[i] * scale;
}

extern "C" __global__ void kn_embed_f16(float *out, const unsigned short *table, const int *ids,
                                        long long dim, float scale) {
  kn_pdl();
  const unsigned short *row = table + (long long)ids[blockIdx.x] * dim;
  float *o = out + (long long)blockIdx.x * dim;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) o[i] = kn_f16_to_f32(row[i]) * scale;
}

extern "C" __global__ void kn_embed_bf16(float *out, const unsigned short *table,
                                         const int *ids, long long dim, float scale) {
  kn_pdl();
  const unsigned short *row = table + (long long)ids[blockIdx.x] * dim;
  float *o = out + (long long)blockIdx.x * dim;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) o[i] = kn_bf16_to_f32(row[i]) * scale;
}

// Block layouts (ir/ir_dtype.h): q8_0 {f16 d; i8 q[32]} 34 B, q4_0 {f16 d; u8 qs[16]} 18 B,
// q4_1 {f16 d; f16 m; u8 qs[16]} 20 B. In q4 blocks value j < 16 is the low nibble of
// qs[j], value j + 16 the high nibble.
__device__ __forceinline__ unsigned short emb_u16(const unsigned char *p) {
  return (unsigned short)(p[0] | (p[1] << 8));
}

extern "C" __global__ void kn_embed_q8_0(float *out, const unsigned char *table, const int *ids,
                                         long long dim, float scale) {
  kn_pdl();
  const unsigned char *row = table + (long long)ids[blockIdx.x] * (dim / 32) * 34;
  float *o = out + (long long)blockIdx.x * dim;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) {
    const unsigned char *blk = row + (i / 32) * 34;
    o[i] = kn_f16_to_f32(emb_u16(blk)) * (float)(signed char)blk[2 + i % 32] * scale;
  }
}

extern "C" __global__ void kn_embed_q4_0(float *out, const unsigned char *table, const int *ids,
                                         long long dim, float scale) {
  kn_pdl();
  const unsigned char *row = table + (long long)ids[blockIdx.x] * (dim / 32) * 18;
  float *o = out + (long long)blockIdx.x * dim;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) {
    const unsigned char *blk = row + (i / 32) * 18;
    int j = (int)(i % 32);
    int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
    o[i] = kn_f16_to_f32(emb_u16(blk)) * (float)(q - 8) * scale;
  }
}

extern "C" __global__ void kn_embed_q4_1(float *out, const unsigned char *table, const int *ids,
                                         long long dim, float scale) {
  kn_pdl();
  const unsigned char *row = table + (long long)ids[blockIdx.x] * (dim / 32) * 20;
  float *o = out + (long long)blockIdx.x * dim;
  for (long long i = threadIdx.x; i < dim; i += blockDim.x) {
    const unsigned char *blk = row + (i / 32) * 20;
    int j = (int)(i % 32);
    int q = j < 16 ? (blk[4 + j] & 15) : (blk[4 + j - 16] >> 4);
    o[i] = (kn_f16_to_f32(emb_u16(blk)) * (float)q + kn_f16_to_f32(emb_u16(blk + 2))) * scale;
  }
}
