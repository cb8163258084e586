// cuemu.h: the CUDA device API of kernels/cuda/*.cu for host C++17, so that a kernel source
// compiled by g++ after this header runs on the CPU under cuemu.cpp's scheduler. NVRTC never
// sees this file. Kernel sources put inline PTX under #ifndef CUEMU, with an #ifdef CUEMU
// branch calling the cuemu_* helpers below.
//
// Emulated: grids of blocks of up to 1024 threads (threadIdx, blockIdx, blockDim, gridDim);
// each thread a fiber, blocks run one after another; __syncthreads (exited threads count as
// arrived); __shfl_xor_sync over whole warps; __shared__ memory per block, filled with 0xff
// bytes (a NaN) before every block so a read of an unwritten element shows; f16 <-> f32 as
// IEEE conversions (round to nearest even, as cvt.rn.f16.f32); mma.m16n8k16 with f16
// operands and f32 accumulators, as a warp-collective exchange of the fragments (products
// summed in double, rounded once: the tensor cores' own rounding is not modelled); __ldg and
// vector loads as plain loads (UBSan checks their alignment). Deadlocks are reported.
// Threads switch only at barriers and warp collectives; the lowest ready thread runs first
// (the highest in every other block), so early warps race ahead and a missing barrier shows
// as a read of poison or of data already overwritten, as a rule.
// Not emulated: parallelism and the memory model (a race the barriers do not order and that
// order does not expose goes unseen), warp divergence and timing, collectives over part of a
// warp (the mask must be full), atomic contention (an atomic is a plain read-modify-write:
// threads never switch inside one), dynamic shared memory, streams. __expf and rsqrtf are
// precise here, not the GPU's approximations, and there is no FMA contraction.
#ifndef CUEMU_H
#define CUEMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <utility>

#define CUEMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define __align__(n) __attribute__((aligned(n)))
// Static, so one array per kernel; cuemu.cpp poisons the section before each block.
#define __shared__ static __attribute__((section("cuemu_shared")))

struct uint3 {
  unsigned int x, y, z;
};
typedef uint3 dim3;
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return {x, y, z, w};
}

// Set by the scheduler before it resumes a thread.
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

extern "C" void __syncthreads(void);
// The value of lane ^ lane_mask; every lane of the warp takes part.
extern "C" uint64_t cuemu_shfl_xor(unsigned int mask, uint64_t bits, int lane_mask, int width);
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, d += a b: this lane's fragments in the
// PTX ISA layout (a[4] and b0, b1 pairs of f16, the lower element in the low half; d[4]).
extern "C" void cuemu_mma_m16n8k16_f16(float *d, const unsigned int *a, unsigned int b0,
                                       unsigned int b1);

template <class T> inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of T");
  uint64_t b = 0;
  memcpy(&b, &v, sizeof v);
  b = cuemu_shfl_xor(mask, b, lane_mask, width);
  memcpy(&v, &b, sizeof v);
  return v;
}

template <class T> inline T __ldg(const T *p) { return *p; }

template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value &&
                                          std::is_arithmetic<B>::value>::type>
inline typename std::common_type<A, B>::type min(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  return (C)a < (C)b ? (C)a : (C)b;
}
template <class A, class B,
          class = typename std::enable_if<std::is_arithmetic<A>::value &&
                                          std::is_arithmetic<B>::value>::type>
inline typename std::common_type<A, B>::type max(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  return (C)a > (C)b ? (C)a : (C)b;
}

// Threads switch only at barriers and warp collectives, so a plain add is atomic here.
template <class T> inline T atomicAdd(T *p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}

inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline int __float_as_int(float f) {
  int i;
  memcpy(&i, &f, 4);
  return i;
}
inline float __uint_as_float(unsigned int u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  memcpy(&u, &f, 4);
  return u;
}

// IEEE binary16 conversions through the compiler's _Float16 (libgcc), independent of the
// ir_dtype.h helpers the tests compare against.
#ifndef __FLT16_MAX__
#error "cuemu needs _Float16 (GCC 12 or later on x86-64 or AArch64)"
#endif
inline unsigned short cuemu_f32_to_f16(float f) {
  _Float16 h = (_Float16)f;
  unsigned short u;
  memcpy(&u, &h, 2);
  return u;
}
inline float cuemu_f16_to_f32(unsigned short u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}
// cvt.rn.f16x2.f32: {lo, hi} to f16, lo in the low half.
inline unsigned int cuemu_pack_f16x2(float lo, float hi) {
  return cuemu_f32_to_f16(lo) | (unsigned int)cuemu_f32_to_f16(hi) << 16;
}

// One kernel entry: its source file (without .cu), its name, and a call from
// cuLaunchKernel-style arguments (args[i] points to the value of parameter i).
struct cuemu_kernel {
  const char *file, *name;
  void (*fn)(void);
  void (*call)(void (*fn)(void), void **args);
};

template <class T> inline T cuemu_arg(void *p) {
  static_assert(std::is_trivially_copyable<T>::value, "kernel parameter type");
  T v;
  memcpy(&v, p, sizeof v);
  return v;
}
template <class... A, size_t... I>
inline void cuemu_unpack(void (*fn)(A...), void **args, std::index_sequence<I...>) {
  fn(cuemu_arg<A>(args[I])...);
}
template <class... A> void cuemu_invoke(void (*fn)(void), void **args) {
  cuemu_unpack(reinterpret_cast<void (*)(A...)>(fn), args, std::index_sequence_for<A...>{});
}
template <class... A>
inline cuemu_kernel cuemu_kernel_of(const char *file, const char *name, void (*fn)(A...)) {
  return {file, name, reinterpret_cast<void (*)(void)>(fn), cuemu_invoke<A...>};
}

// A kernel file's table, linked into the registry at static initialisation
// (tests/cuemu/cuemu_gen.cmake writes one per file).
struct cuemu_module {
  const cuemu_kernel *kernels;
  int n;
  cuemu_module *next;
  cuemu_module(const cuemu_kernel *k, int count);
};

#endif
