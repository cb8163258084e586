// test_cuemu (label unit): the CUDA emulator itself (cuemu.h): thread and block indices,
// shuffles, mma, barriers, poisoned shared memory, and faults reported instead of hung on.
#include "cuemu.h"
#include "cuemu_host.h"

#include <stdio.h>
#include <string.h>

extern "C" {
#include "tcheck.h"
}

namespace {

// out[6 * (block * threads + thread)]: threadIdx.xyz, blockIdx.xyz.
__global__ void k_index(unsigned *out) {
  unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned *o = out + 6 * (b * nt + t);
  o[0] = threadIdx.x, o[1] = threadIdx.y, o[2] = threadIdx.z;
  o[3] = blockIdx.x, o[4] = blockIdx.y, o[5] = blockIdx.z;
}

// out[t] = lane t ^ 5's index; sum[t] = the warp's sum by butterfly.
__global__ void k_shfl(int *out, float *sum) {
  int t = (int)threadIdx.x;
  out[t] = __shfl_xor_sync(0xffffffffu, t, 5);
  float s = (float)t;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  sum[t] = s;
}

// out[b * 256 + t] = block b's s[255 - t], with or without the barrier in between.
__global__ void k_reverse(int *out, int sync) {
  __shared__ int s[256];
  s[threadIdx.x] = (int)(threadIdx.x + blockIdx.x);
  if (sync) __syncthreads();
  out[blockIdx.x * 256 + threadIdx.x] = s[255 - threadIdx.x];
}

// Odd threads leave before the barrier; the even ones still pass it.
__global__ void k_exit_early(int *out) {
  __shared__ int s[64];
  if (threadIdx.x & 1) return;
  s[threadIdx.x] = (int)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x ^ 2];
}

// Half of the warp leaves, the other half shuffles: a deadlock on a GPU too.
__global__ void k_deadlock(int *out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

__global__ void k_half_mask(int *out) { out[threadIdx.x] = __shfl_xor_sync(0xffffu, 1, 1); }

// dm (16, 8) = c + am (16, 16) bm (16, 8) by one mma.m16n8k16, fragments as the PTX ISA lays
// them out: lane 4 g + c holds A rows g, g + 8 at columns 2c, 2c + 1 (a0, a1) and 8 further
// (a2, a3), B column g at rows 2c, 2c + 1 (b0) and 8 further (b1), D rows g, g + 8 (d0, d1;
// d2, d3) at columns 2c, 2c + 1.
__global__ void k_mma(float *dm, const float *am, const float *bm, float c0) {
  const int g = (int)threadIdx.x >> 2, c = (int)threadIdx.x & 3;
  unsigned a[4];
  for (int i = 0; i < 4; i++) {
    const float *p = am + (g + 8 * (i & 1)) * 16 + 2 * c + 8 * (i >> 1);
    a[i] = cuemu_pack_f16x2(p[0], p[1]);
  }
  const unsigned b0 = cuemu_pack_f16x2(bm[2 * c * 8 + g], bm[(2 * c + 1) * 8 + g]);
  const unsigned b1 = cuemu_pack_f16x2(bm[(2 * c + 8) * 8 + g], bm[(2 * c + 9) * 8 + g]);
  float d[4] = {c0, c0, c0, c0};
  cuemu_mma_m16n8k16_f16(d, a, b0, b1);
  for (int i = 0; i < 4; i++) dm[(g + 8 * (i >> 1)) * 8 + 2 * c + (i & 1)] = d[i];
}

const cuemu_kernel kernels[] = {
    cuemu_kernel_of("test", "k_index", k_index),
    cuemu_kernel_of("test", "k_shfl", k_shfl),
    cuemu_kernel_of("test", "k_reverse", k_reverse),
    cuemu_kernel_of("test", "k_exit_early", k_exit_early),
    cuemu_kernel_of("test", "k_deadlock", k_deadlock),
    cuemu_kernel_of("test", "k_half_mask", k_half_mask),
    cuemu_kernel_of("test", "k_mma", k_mma),
};
cuemu_module registered(kernels, sizeof kernels / sizeof kernels[0]);

int launch(const char *name, dim3 g, dim3 b, void **args) {
  return cuemu_launch(cuemu_find("test", name), g.x, g.y, g.z, b.x, b.y, b.z, args);
}

void test_index(void) {
  const dim3 g = {3, 2, 2}, b = {4, 2, 3};
  const unsigned nb = 12, nt = 24;
  static unsigned out[6 * 12 * 24];
  unsigned *p = out;
  void *args[] = {&p};
  CHECK(launch("k_index", g, b, args) == 0);
  int bad = 0;
  for (unsigned i = 0; i < nb * nt; i++) {
    unsigned t = i % nt, k = i / nt;
    unsigned want[6] = {t % 4, t / 4 % 2, t / 8, k % 3, k / 3 % 2, k / 6};
    bad += memcmp(out + 6 * i, want, sizeof want) != 0;
  }
  CHECKF(bad == 0, "%d threads saw wrong indices", bad);
}

void test_shfl(void) {
  int out[64];
  float sum[64];
  int *po = out;
  float *ps = sum;
  void *args[] = {&po, &ps};
  CHECK(launch("k_shfl", {1, 1, 1}, {64, 1, 1}, args) == 0);
  for (int t = 0; t < 64; t++) {
    CHECK(out[t] == (t ^ 5));
    CHECK(sum[t] == (t < 32 ? 496.0f : 1520.0f));
  }
}

void test_mma(void) {
  float am[16 * 16], bm[16 * 8], dm[16 * 8];
  for (int i = 0; i < 16 * 16; i++) am[i] = (float)(i % 13 - 6) / 4; // exact in f16
  for (int i = 0; i < 16 * 8; i++) bm[i] = (float)(i % 7 - 3) / 2;
  float *pd = dm, c0 = 0.5f;
  const float *pa = am, *pb = bm;
  void *args[] = {&pd, &pa, &pb, &c0};
  CHECK(launch("k_mma", {1, 1, 1}, {32, 1, 1}, args) == 0);
  int bad = 0;
  for (int r = 0; r < 16; r++)
    for (int n = 0; n < 8; n++) {
      float want = c0;
      for (int k = 0; k < 16; k++) want += am[r * 16 + k] * bm[k * 8 + n];
      bad += dm[r * 8 + n] != want;
    }
  CHECKF(bad == 0, "%d of 128 mma results differ", bad);
}

void test_barrier(void) {
  static int out[2 * 256];
  int *p = out, sync = 1, torn = 0;
  void *args[] = {&p, &sync};
  CHECK(launch("k_reverse", {2, 1, 1}, {256, 1, 1}, args) == 0);
  for (int i = 0; i < 2 * 256; i++) CHECK(out[i] == 255 - i % 256 + i / 256);
  sync = 0; // a read before the write: the poison shows, in either block's run order
  CHECK(launch("k_reverse", {2, 1, 1}, {256, 1, 1}, args) == 0);
  CHECK(out[0] == -1 && out[256 + 255] == -1);
  for (int i = 0; i < 2 * 256; i++) torn += out[i] == -1;
  printf("  missing barrier: %d of 512 reads see poisoned shared memory\n", torn);
  int e[64];
  p = e;
  CHECK(launch("k_exit_early", {1, 1, 1}, {64, 1, 1}, args) == 0);
  for (int t = 0; t < 64; t += 2) CHECK(e[t] == (t ^ 2));
}

void test_faults(void) {
  int out[32];
  int *p = out;
  void *args[] = {&p};
  CHECK(launch("k_deadlock", {1, 1, 1}, {32, 1, 1}, args) == 1);
  printf("  %s\n", cuemu_error());
  CHECK(strstr(cuemu_error(), "deadlock") != NULL);
  CHECK(launch("k_half_mask", {1, 1, 1}, {32, 1, 1}, args) == 1);
  printf("  %s\n", cuemu_error());
  CHECK(launch("k_index", {1, 1, 1}, {1025, 1, 1}, args) == 1);
  printf("  %s\n", cuemu_error());
  CHECK(cuemu_find("test", "k_none") == NULL);
  test_shfl(); // the fibers left behind are reused
}

} // namespace

int main(void) {
  test_index();
  test_shfl();
  test_mma();
  test_barrier();
  test_faults();
  return tcheck_done("cuemu");
}
