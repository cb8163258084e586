// cuemu.cpp: the CUDA emulator's scheduler (cuemu.h, cuemu_host.h). Every thread of a block
// is a ucontext fiber on the calling OS thread; blocks run one after another, so the
// function-static __shared__ arrays are the running block's shared memory.
#include "cuemu.h"
#include "cuemu_host.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define CUEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUEMU_ASAN 1
#endif
#endif
#ifdef CUEMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

// Bounds of the __shared__ section (weak: absent when no kernel has shared memory).
extern "C" char __start_cuemu_shared[] __attribute__((weak));
extern "C" char __stop_cuemu_shared[] __attribute__((weak));

namespace {

constexpr unsigned MAX_THREADS = 1024, WARP = 32, SLOT = 32; // SLOT: bytes a lane gives
#ifdef CUEMU_ASAN
const size_t STACK = 128 << 10; // instrumented frames are larger
#else
const size_t STACK = 64 << 10;
#endif

enum state { READY, AT_BARRIER, AT_WARP, EXITED, FAILED };

struct fiber {
  ucontext_t ctx;
  state st;
  unsigned seq;  // warp collectives done: picks the slot buffer
  void *fake;    // ASan's fake stack while switched out
  bool made;     // ctx holds a getcontext
  bool dirty;    // abandoned mid-kernel: its stack may hold ASan frame poison
};

struct warp {
  unsigned lanes, arrived;
  // Two buffers: a lane can only reuse one after every lane has passed the next collective.
  alignas(8) unsigned char slot[2][WARP][SLOT];
};
typedef unsigned char lane_bytes[SLOT];

struct emu {
  char *stacks;  // MAX_THREADS stacks, each above a guard page
  size_t stride;
  fiber f[MAX_THREADS];
  uint64_t ready[MAX_THREADS / 64]; // bit i: f[i].st == READY
  warp w[MAX_THREADS / WARP];
  ucontext_t main;
  void *main_fake;
  const void *main_bottom;
  size_t main_size;
  const cuemu_kernel *k;
  void **args;
  unsigned n, cur, live, at_barrier;
  char err[512];
};
emu S;

char *stack_of(unsigned i) { return S.stacks + i * S.stride + S.stride - STACK; }

// ASan must learn of every stack switch, or it reports the fibers' frames as errors.
void switch_start(void **fake, const void *bottom, size_t size) {
#ifdef CUEMU_ASAN
  __sanitizer_start_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}
void switch_finish(void *fake, const void **old_bottom, size_t *old_size) {
#ifdef CUEMU_ASAN
  __sanitizer_finish_switch_fiber(fake, old_bottom, old_size);
#else
  (void)fake, (void)old_bottom, (void)old_size;
#endif
}

__attribute__((format(printf, 1, 2))) int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(S.err, sizeof S.err, fmt, ap);
  va_end(ap);
  return 1;
}

void set_state(unsigned i, state st) {
  S.f[i].st = st;
  if (st == READY) S.ready[i / 64] |= 1ull << i % 64;
  else S.ready[i / 64] &= ~(1ull << i % 64);
}

void release(state st, unsigned from, unsigned to) {
  for (unsigned i = from; i < to; i++)
    if (S.f[i].st == st) set_state(i, READY);
}

// The lowest (or highest) ready thread, -1 if none.
int pick(bool highest) {
  const int nw = (int)(S.n + 63) / 64;
  for (int j = 0; j < nw; j++) {
    const int w = highest ? nw - 1 - j : j;
    if (S.ready[w]) return 64 * w + (highest ? 63 - __builtin_clzll(S.ready[w])
                                             : __builtin_ctzll(S.ready[w]));
  }
  return -1;
}

// Switches the running thread out to the scheduler.
void park(state st) {
  fiber &f = S.f[S.cur];
  set_state(S.cur, st);
  switch_start(&f.fake, S.main_bottom, S.main_size);
  swapcontext(&f.ctx, &S.main);
  switch_finish(f.fake, nullptr, nullptr);
}

void fiber_main(void) {
  switch_finish(nullptr, &S.main_bottom, &S.main_size);
  S.k->call(S.k->fn, S.args);
  set_state(S.cur, EXITED);
  S.live--;
  if (S.at_barrier && S.at_barrier == S.live) { // exited threads count as arrived
    S.at_barrier = 0;
    release(AT_BARRIER, 0, S.n);
  }
  switch_start(nullptr, S.main_bottom, S.main_size); // this fiber is done
  setcontext(&S.main);
}

// Stops the launch from inside a thread: the scheduler sees FAILED and gives up.
void abort_launch(void) {
  park(FAILED);
  abort(); // never resumed
}

int alloc_stacks(void) {
  long page = sysconf(_SC_PAGESIZE);
  S.stride = STACK + (size_t)page;
  void *p = mmap(nullptr, S.stride * MAX_THREADS, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return fail("cannot map %u fiber stacks", MAX_THREADS);
  S.stacks = (char *)p;
  for (unsigned i = 0; i < MAX_THREADS; i++) // overflow faults instead of corrupting
    mprotect(S.stacks + i * S.stride, (size_t)page, PROT_NONE);
  return 0;
}

void make_fiber(unsigned i) {
  fiber &f = S.f[i];
  if (!f.made) getcontext(&f.ctx), f.made = true;
#ifdef CUEMU_ASAN
  if (f.dirty) ASAN_UNPOISON_MEMORY_REGION(stack_of(i), STACK);
#endif
  f.dirty = false;
  f.ctx.uc_stack.ss_sp = stack_of(i);
  f.ctx.uc_stack.ss_size = STACK;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, fiber_main, 0);
  set_state(i, READY);
  f.seq = 0;
}

void resume(unsigned i) {
  S.cur = i;
  threadIdx.x = i % blockDim.x;
  threadIdx.y = i / blockDim.x % blockDim.y;
  threadIdx.z = i / (blockDim.x * blockDim.y);
  switch_start(&S.main_fake, stack_of(i), STACK);
  swapcontext(&S.main, &S.f[i].ctx);
  switch_finish(S.main_fake, nullptr, nullptr);
}

int deadlock(void) {
  unsigned bar = 0, wc = 0, done = 0;
  for (unsigned i = 0; i < S.n; i++) {
    bar += S.f[i].st == AT_BARRIER;
    wc += S.f[i].st == AT_WARP;
    done += S.f[i].st == EXITED;
  }
  return fail("%s block (%u,%u,%u): deadlock: %u threads wait at __syncthreads, %u at a "
              "shuffle or mma (whose warp lacks lanes that exited or wait elsewhere), %u exited",
              S.k->name, blockIdx.x, blockIdx.y, blockIdx.z, bar, wc, done);
}

// Runs every thread of the block at blockIdx to its end. The lowest ready thread runs next
// (the highest when `down`), so early warps race ahead to the next barrier: a read of
// shared memory that another thread has yet to write, or has already overwritten, shows.
int run_block(bool down) {
  if (__start_cuemu_shared) // uninitialised shared memory reads as NaN
    memset(__start_cuemu_shared, 0xff, (size_t)(__stop_cuemu_shared - __start_cuemu_shared));
  memset(S.ready, 0, sizeof S.ready);
  for (unsigned i = 0; i < S.n; i++) make_fiber(i);
  for (unsigned w = 0; w * WARP < S.n; w++)
    S.w[w].lanes = S.n - w * WARP < WARP ? S.n - w * WARP : WARP, S.w[w].arrived = 0;
  S.live = S.n;
  S.at_barrier = 0;
  int rc = 0;
  for (int i; !rc && (i = pick(down)) >= 0;) {
    resume((unsigned)i);
    rc = S.f[i].st == FAILED;
  }
  if (!rc && S.live) rc = deadlock();
  if (rc)
    for (unsigned i = 0; i < S.n; i++) S.f[i].dirty = S.f[i].st != EXITED;
  return rc;
}

// A warp collective: publishes this lane's size bytes and returns every lane's, [lane][SLOT],
// valid until this lane's next collective. Stops the launch unless the whole warp takes part.
const lane_bytes *warp_collect(const char *op, unsigned mask, const void *mine, size_t size) {
  fiber &f = S.f[S.cur];
  warp &w = S.w[S.cur / WARP];
  const unsigned lane = S.cur % WARP, base = S.cur - lane;
  const unsigned full = w.lanes == WARP ? ~0u : (1u << w.lanes) - 1;
  if ((mask & full) != full) {
    fail("%s thread %u: %s with mask %#x: only whole-warp collectives are emulated", S.k->name,
         S.cur, op, mask);
    abort_launch();
  }
  const unsigned b = f.seq++ & 1;
  memcpy(w.slot[b][lane], mine, size);
  if (++w.arrived < w.lanes) {
    park(AT_WARP);
  } else {
    w.arrived = 0;
    release(AT_WARP, base, base + w.lanes);
  }
  return w.slot[b];
}

// Element (lo or hi) of a packed f16 pair.
float half_of(const unsigned char *p, int word, int hi) {
  unsigned u;
  memcpy(&u, p + 4 * word, 4);
  return cuemu_f16_to_f32((unsigned short)(hi ? u >> 16 : u & 0xffffu));
}

cuemu_module *modules;

} // namespace

cuemu_module::cuemu_module(const cuemu_kernel *k, int count) : kernels(k), n(count) {
  next = modules;
  modules = this;
}

extern "C" void __syncthreads(void) {
  if (++S.at_barrier < S.live) {
    park(AT_BARRIER);
    return;
  }
  S.at_barrier = 0;
  release(AT_BARRIER, 0, S.n);
}

extern "C" uint64_t cuemu_shfl_xor(unsigned int mask, uint64_t bits, int lane_mask, int width) {
  if (width < 1 || width > (int)WARP || (width & (width - 1))) {
    fail("%s thread %u: __shfl_xor_sync width %d", S.k->name, S.cur, width);
    abort_launch();
  }
  const lane_bytes *all = warp_collect("__shfl_xor_sync", mask, &bits, sizeof bits);
  const unsigned lane = S.cur % WARP, lanes = S.w[S.cur / WARP].lanes;
  unsigned src = lane ^ (unsigned)lane_mask;
  if (src / (unsigned)width != lane / (unsigned)width || src >= lanes) src = lane;
  memcpy(&bits, all[src], sizeof bits);
  return bits;
}

extern "C" void cuemu_mma_m16n8k16_f16(float *d, const unsigned int *a, unsigned int b0,
                                       unsigned int b1) {
  if (S.w[S.cur / WARP].lanes != WARP) {
    fail("%s thread %u: mma.m16n8k16 in a warp of %u lanes", S.k->name, S.cur,
         S.w[S.cur / WARP].lanes);
    abort_launch();
  }
  const unsigned mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  const lane_bytes *all = warp_collect("mma.m16n8k16", ~0u, mine, sizeof mine);
  float A[16][16], B[16][8]; // A row-major, B (k, n)
  for (unsigned l = 0; l < WARP; l++) {
    const int g = (int)l >> 2, c = (int)l & 3;
    for (int e = 0; e < 2; e++) {
      A[g][2 * c + e] = half_of(all[l], 0, e);
      A[g + 8][2 * c + e] = half_of(all[l], 1, e);
      A[g][2 * c + 8 + e] = half_of(all[l], 2, e);
      A[g + 8][2 * c + 8 + e] = half_of(all[l], 3, e);
      B[2 * c + e][g] = half_of(all[l], 4, e);
      B[2 * c + 8 + e][g] = half_of(all[l], 5, e);
    }
  }
  const int g = (int)(S.cur % WARP) >> 2, c = (int)(S.cur % WARP) & 3;
  for (int i = 0; i < 4; i++) { // d0..d3: rows g, g, g + 8, g + 8; columns 2c, 2c + 1
    const int r = g + 8 * (i >> 1), col = 2 * c + (i & 1);
    double s = d[i];
    for (int k = 0; k < 16; k++) s += (double)A[r][k] * B[k][col];
    d[i] = (float)s;
  }
}

extern "C" const cuemu_kernel *cuemu_find(const char *file, const char *name) {
  for (const cuemu_module *m = modules; m; m = m->next)
    for (int i = 0; i < m->n; i++)
      if (!strcmp(m->kernels[i].file, file) && !strcmp(m->kernels[i].name, name))
        return &m->kernels[i];
  return nullptr;
}

extern "C" int cuemu_launch(const cuemu_kernel *k, unsigned gx, unsigned gy, unsigned gz,
                            unsigned bx, unsigned by, unsigned bz, void **args) {
  S.err[0] = 0;
  if (!k) return fail("launch of no kernel");
  if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535 || bx > MAX_THREADS ||
      by > MAX_THREADS || bz > 64 || bx * by * bz > MAX_THREADS)
    return fail("%s: invalid launch: grid (%u,%u,%u), block (%u,%u,%u)", k->name, gx, gy, gz,
                bx, by, bz);
  if (!S.stacks && alloc_stacks()) return 1;
  S.k = k;
  S.args = args;
  S.n = bx * by * bz;
  blockDim = {bx, by, bz};
  gridDim = {gx, gy, gz};
  for (unsigned z = 0; z < gz; z++)
    for (unsigned y = 0; y < gy; y++)
      for (unsigned x = 0; x < gx; x++) {
        blockIdx = {x, y, z};
        if (run_block((x + y + z) & 1)) return 1;
      }
  return 0;
}

extern "C" const char *cuemu_error(void) { return S.err; }
