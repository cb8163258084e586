// kn_cuda.cuh: what several kernels/cuda sources share. NVRTC gets it as a named header
// (compiler/infc_nvrtc.c, embedded as the sources are); the CPU emulator (tests/cuemu)
// finds it beside the source. Kernels include it as "kn_cuda.cuh".
#ifndef KN_CUDA_CUH
#define KN_CUDA_CUH

// GEMV geometry of gemv.cu and gemv_wq.cu (runtime/cuda/cuda_internal.h launches with it).
#ifndef GEMV_M
#define GEMV_M 4 /* rows of x per CTA */
#endif
#ifndef GEMV_WARPS
#define GEMV_WARPS 4 /* output columns per CTA, one a warp */
#endif

// f16 bits -> f32 (exact).
__device__ __forceinline__ float kn_f16_to_f32(unsigned short h) {
#ifdef CUEMU  // tests/cuemu: the kernel built for the CPU
  return cuemu_f16_to_f32(h);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#endif
}

// f32 -> f16 bits, rounded to nearest even.
__device__ __forceinline__ unsigned short kn_f32_to_f16(float x) {
#ifdef CUEMU
  return cuemu_f32_to_f16(x);
#else
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
#endif
}

// f32 -> bf16 bits, rounded to nearest even as ir_f32_to_bf16; a NaN stays a quiet NaN.
__device__ __forceinline__ unsigned short kn_f32_to_bf16(float x) {
  unsigned int u = __float_as_uint(x);
  unsigned int r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (unsigned short)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

// The GEMM operand copy that a producer writes beside its f32 output (rms_norm.cu,
// swiglu.cu's _h kernels): f16 or, with bf16 set, bf16 bits of v.
__device__ __forceinline__ unsigned short kn_f32_to_half(float v, int bf16) {
  return bf16 ? kn_f32_to_bf16(v) : kn_f32_to_f16(v);
}

// bf16 bits (in the low 16 of h) -> f32 (exact).
__device__ __forceinline__ float kn_bf16_to_f32(unsigned int h) { return __uint_as_float(h << 16); }

// Programmatic dependent launch (sm_90+). The backend launches a step's kernels with
// programmatic stream serialization, so a kernel's CTAs may be scheduled while its
// predecessor's last wave still runs (the launch latency, a few us a kernel inside a graph,
// overlaps it). Every kernel calls this first, before any global memory access: it waits
// for the predecessor grid to finish and its writes to be visible (so for every earlier
// grid, as each of them waited too), then lets the successor be scheduled. Without the
// launch attribute (older drivers, sm_80/sm_89, cuBLAS in between) it costs nothing.
// add.cu's kn_pdl_ready marks plans whose kernels all do this.
__device__ __forceinline__ void kn_pdl(void) {
#if !defined(CUEMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif
