// gemv_wq.cu: weight-only int8 / int4 / FP8 GEMV with separate scales and zero points (ONNX
// MatMulNBits, infc --quant int8|int4|fp8), y = x . W^T (+ bias), for every m (no cuBLAS
// path). x: (m, k) f32; q: (n, k) i8, or i4 two a byte (element 2t the low nibble of byte t,
// unsigned), or FP8 E4M3 codes (zero points none: w = value(code) * scale);
// scales (n, k / group) f32 (st 0) or f16 (st 1); zero points (n, k / group) by
// zt: 0 none (8 for i4, 0 for i8), 1 u8, 2 i8, 3 f16, 4 f32; bias (n) f32 or NULL; y (m, n).
// w = ((float)q - zp) * scale in f32, as kn_matmul_wq (kernels/cpu) computes it.
//
// As gemv.cu: one warp per output column, GEMV_M rows of x per CTA, one 16-byte weight load
// per chunk (32 i4 or 16 i8 values, one scale each: group % CHUNK == 0); lane i takes chunks
// i, i + 32, ...; the order of one y element's sum depends only on k, never on m. CTAs loop
// over row tiles past gridDim.y * GEMV_M, so any m fits in one launch.
// Launch: grid (ceil(n / GEMV_WARPS), min(ceil(m / GEMV_M), 65535)), block GEMV_WARPS * 32.

#include "kn_cuda.cuh"

__device__ __forceinline__ float wq_scale(const void *s, int st, long long i) {
  return st ? kn_f16_to_f32(__ldg((const unsigned short *)s + i)) : __ldg((const float *)s + i);
}

__device__ __forceinline__ float wq_zero(const void *z, int zt, long long i, float dflt) {
  switch (zt) {
  case 1: return (float)__ldg((const unsigned char *)z + i);
  case 2: return (float)(signed char)__ldg((const unsigned char *)z + i);
  case 3: return kn_f16_to_f32(__ldg((const unsigned short *)z + i));
  case 4: return __ldg((const float *)z + i);
  default: return dflt;
  }
}

// E4M3 -> f32, exact (ir_f8e4m3_to_f32's twin): bias 7, 0x7f / 0xff NaN, subnormals
// man * 2^-9.
__device__ __forceinline__ float wq_f8(unsigned int b) {
  unsigned int e = (b >> 3) & 15u, m = b & 7u;
  float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * (1.0f / 512.0f);
  if (e == 15u && m == 7u) v = __uint_as_float(0x7fc00000u);
  return (b & 0x80u) ? -v : v;
}

// The weight codes: 0 i8, 1 i4, 2 FP8 E4M3.
enum { WQ_I8 = 0, WQ_I4 = 1, WQ_F8 = 2 };

// The CHUNK values of one 16-byte load, as integers (or FP8 values) in f32.
template <int QT>
struct wq_q {
  enum { CHUNK = QT == WQ_I4 ? 32 : 16 };
  static __device__ __forceinline__ void unpack(float (&q)[CHUNK], uint4 u) {
    unsigned int v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        unsigned int b = (v[t] >> (8 * e)) & 0xffu;
        if (QT == WQ_I4) {
          q[8 * t + 2 * e] = (float)(b & 15u);
          q[8 * t + 2 * e + 1] = (float)(b >> 4);
        } else if (QT == WQ_F8) {
          q[4 * t + e] = wq_f8(b);
        } else {
          q[4 * t + e] = (float)(signed char)b;
        }
      }
  }
};

template <int QT>
__device__ __forceinline__ void gemv_wq(float *y, const float *x, const unsigned char *w,
                                        const float *bias, const void *scales, const void *zp,
                                        int m, int n, int k, int group, int st, int zt) {
  typedef wq_q<QT> Q;
  const int lane = threadIdx.x & 31;
  const int col = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (col >= n) return;
  const int n_chunks = k / Q::CHUNK, ng = k / group;
  const unsigned char *wr = w + (long long)col * n_chunks * 16;
  const long long prow = (long long)col * ng;
  const float b = bias ? bias[col] : 0.0f, dflt = QT == WQ_I4 ? 8.0f : 0.0f;
  for (int r0 = blockIdx.y * GEMV_M; r0 < m; r0 += gridDim.y * GEMV_M) {
    const int rows = min(GEMV_M, m - r0);
    const float *xr = x + (long long)r0 * k;
    float acc[GEMV_M];
#pragma unroll
    for (int r = 0; r < GEMV_M; r++) acc[r] = 0.0f;
    for (int ch = lane; ch < n_chunks; ch += 32) {
      const long long c = (long long)ch * Q::CHUNK, gi = prow + c / group;
      const float s = wq_scale(scales, st, gi), z = wq_zero(zp, zt, gi, dflt);
      float wv[Q::CHUNK];
      Q::unpack(wv, __ldg((const uint4 *)(wr + (long long)ch * 16)));
#pragma unroll
      for (int j = 0; j < Q::CHUNK; j++) wv[j] = (wv[j] - z) * s;
#pragma unroll
      for (int r = 0; r < GEMV_M; r++) {
        if (r >= rows) break;
        const float *xp = xr + (long long)r * k + c;
        float a = acc[r];
#pragma unroll
        for (int j = 0; j < Q::CHUNK; j += 4) {
          float4 xv = __ldg((const float4 *)(xp + j));
          a = fmaf(wv[j + 3], xv.w, fmaf(wv[j + 2], xv.z, fmaf(wv[j + 1], xv.y,
                                                                  fmaf(wv[j], xv.x, a))));
        }
        acc[r] = a;
      }
    }
#pragma unroll
    for (int r = 0; r < GEMV_M; r++) {
      float s = acc[r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0 && r < rows) y[(long long)(r0 + r) * n + col] = s + b;
    }
  }
}

#define GEMV_WQ_ENTRY(name, QT)                                                                \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                \
      name(float *y, const float *x, const unsigned char *w, const float *bias,                \
           const void *scales, const void *zp, int m, int n, int k, int group, int st,         \
           int zt) { kn_pdl();                                                                           \
    gemv_wq<QT>(y, x, w, bias, scales, zp, m, n, k, group, st, zt);                           \
  }

GEMV_WQ_ENTRY(kn_gemv_wq_i4, WQ_I4)
GEMV_WQ_ENTRY(kn_gemv_wq_i8, WQ_I8)
GEMV_WQ_ENTRY(kn_gemv_wq_f8, WQ_F8)

// kn_dequant_wq_i4 / _i8 / _f8: out (n, k) f16 = ((float)q - zp) * scale, the f32 value
// kn_matmul_wq computes (kn_wq_value), rounded to nearest-even f16: the weights a prefill
// GEMM on cuBLAS reads (from the backend's dequantize-from-m rows). Thread i writes values
// [8i, 8i + 8) of the matrix (k % 16 == 0: a row holds whole 8-value runs, and a group, a
// multiple of 16 columns, whole runs too), one 16-byte store.
template <int QT>
__device__ __forceinline__ void dequant_wq(unsigned short *out, const unsigned char *w,
                                           const void *scales, const void *zp, long long n,
                                           int k, int group, int st, int zt) {
  const long long runs = n * (long long)k / 8;
  const int ng = k / group;
  const float dflt = QT == WQ_I4 ? 8.0f : 0.0f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < runs;
       i += (long long)gridDim.x * blockDim.x) {
    const long long e = i * 8, row = e / k;
    const int col = (int)(e - row * k);
    const long long gi = row * ng + col / group;
    const float s = wq_scale(scales, st, gi), z = wq_zero(zp, zt, gi, dflt);
    unsigned int u[4];
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const long long at = e + j + h;
        float q;
        if (QT == WQ_I4) {
          const unsigned int b = __ldg(w + at / 2);
          q = (float)((at & 1) ? b >> 4 : b & 15u);
        } else if (QT == WQ_F8) {
          q = wq_f8(__ldg(w + at));
        } else {
          q = (float)(signed char)__ldg(w + at);
        }
        v[h] = (q - z) * s;
      }
      u[j / 2] = (unsigned int)kn_f32_to_f16(v[0]) | ((unsigned int)kn_f32_to_f16(v[1]) << 16);
    }
    *(uint4 *)(out + e) = make_uint4(u[0], u[1], u[2], u[3]);
  }
}

#define DEQUANT_WQ_ENTRY(name, QT)                                                             \
  extern "C" __global__ void name(unsigned short *out, const unsigned char *w,                 \
                                  const void *scales, const void *zp, long long n, int k,      \
                                  int group, int st, int zt) { kn_pdl();                                 \
    dequant_wq<QT>(out, w, scales, zp, n, k, group, st, zt);                                   \
  }

DEQUANT_WQ_ENTRY(kn_dequant_wq_i4, WQ_I4)
DEQUANT_WQ_ENTRY(kn_dequant_wq_i8, WQ_I8)
DEQUANT_WQ_ENTRY(kn_dequant_wq_f8, WQ_F8)
