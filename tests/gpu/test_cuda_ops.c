/* test_cuda_ops (label gpu): every CUDA kernel of kernels/cuda against the CPU kernels
 * (kn_cpu.h) on fresh random data, through NVRTC (for the device's own arch) and the
 * driver API (libcuda via dlopen, so it builds anywhere). Outputs are poisoned with NaN
 * first, so an unwritten element fails. Bounds: ||gpu - cpu|| / ||cpu|| <= 1e-5 for
 * exact-order f32 ops (copies, elementwise), 1e-4 for reductions in another order
 * (norms, GEMV, attention with __expf), 2e-3 for the tensor-core prefill (f16 operands).
 * Exits 77 (ctest: skipped) printing "skipped: ..." without a GPU.
 * Built with CUDA_OPS_EMU (test_cuda_ops_emu, label unit) the same checks run each kernel
 * compiled as host C++ under the CPU emulator of tests/cuemu, with no GPU nor NVRTC.
 * Kernels take HEAD_DIM TEST_HEAD_DIM (64 unless built otherwise); ATTENTION_ONLY 1 runs the
 * attention and KV-write checks alone (the _hd128 builds: Llama-8B's head size, where the
 * tensor-core prefill takes 16 positions a chunk, not 32). */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CUDA_OPS_EMU
#include "cuemu_host.h"
#else
#include "infc_cuda_sources.h"
#include "infc_nvrtc.h"
#endif
#include "ir_dtype.h"
#include "kn_cpu.h"
#include "inferrt.h"
#include "backend.h"
#include "kn_matmul_wq.h"
#include "kn_quant.h"
#include "tcheck.h"

#ifndef TEST_HEAD_DIM
#define TEST_HEAD_DIM 64
#endif
#ifndef ATTENTION_ONLY
#define ATTENTION_ONLY 0
#endif
#define STR_(x) #x
#define STR(x) STR_(x)

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static struct {
  CUresult (*init)(unsigned);
  CUresult (*device_get)(int *, int);
  CUresult (*attr)(int *, int, int);
  CUresult (*ctx_retain)(void **, int);
  CUresult (*ctx_set)(void *);
  CUresult (*load)(void **, const void *);
  CUresult (*get_fn)(void **, void *, const char *);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*free)(CUdeviceptr);
  CUresult (*htod)(CUdeviceptr, const void *, size_t);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t);
  CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     void *, void **, void **);
  CUresult (*sync)(void);
  CUresult (*err)(CUresult, const char **);
} cu;
#ifndef CUDA_OPS_EMU
static infc_nvrtc *nv;
static int arch;
#endif

#define CU(call)                                                                                   \
  do {                                                                                             \
    CUresult r_ = (call);                                                                          \
    if (r_) {                                                                                      \
      const char *s_ = "?";                                                                        \
      cu.err(r_, &s_);                                                                             \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_);                           \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#ifdef CUDA_OPS_EMU
/* The driver calls the test makes, on the emulator: device memory is host memory. */
static void *dptr(CUdeviceptr p) { return (void *)(uintptr_t)p; }
static CUresult emu_alloc(CUdeviceptr *p, size_t n) {
  *p = (CUdeviceptr)(uintptr_t)malloc(n);
  return *p ? 0 : 2; /* CUDA_ERROR_OUT_OF_MEMORY */
}
static CUresult emu_free(CUdeviceptr p) {
  free(dptr(p));
  return 0;
}
static CUresult emu_htod(CUdeviceptr d, const void *h, size_t n) {
  memcpy(dptr(d), h, n);
  return 0;
}
static CUresult emu_dtoh(void *h, CUdeviceptr d, size_t n) {
  memcpy(h, dptr(d), n);
  return 0;
}
static CUresult emu_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                           unsigned bz, unsigned shmem, void *stream, void **args, void **extra) {
  return cuemu_launch(f, gx, gy, gz, bx, by, bz, args) ? 1 : 0; /* CUDA_ERROR_INVALID_VALUE */
}
static CUresult emu_sync(void) { return 0; }
static CUresult emu_err(CUresult r, const char **s) {
  *s = cuemu_error();
  return 0;
}

static const char *cu_open(void) {
  cu.alloc = emu_alloc, cu.free = emu_free, cu.htod = emu_htod, cu.dtoh = emu_dtoh;
  cu.launch = emu_launch, cu.sync = emu_sync, cu.err = emu_err;
  return NULL;
}

/* The emulator's build of entry fn of kernels/cuda/<file>.cu (compiled with the defines
 * kernel() below passes to NVRTC). */
static void *kernel(const char *file, const char *fn) {
  const struct cuemu_kernel *k = cuemu_find(file, fn);
  if (!k) {
    fprintf(stderr, "%s.cu: no entry %s in the emulator's kernel table\n", file, fn);
    exit(1);
  }
  return (void *)k;
}
#else
static int sym(void *lib, const char *name, void *out, size_t size) {
  void *p = dlsym(lib, name);
  if (p) memcpy(out, &p, size);
  return p != NULL;
}

static const char *cu_open(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) return "no libcuda (no NVIDIA driver)";
#define S(f, n) sym(lib, n, &cu.f, sizeof cu.f)
  if (!(S(init, "cuInit") && S(device_get, "cuDeviceGet") && S(attr, "cuDeviceGetAttribute") &&
        S(ctx_retain, "cuDevicePrimaryCtxRetain") && S(ctx_set, "cuCtxSetCurrent") &&
        S(load, "cuModuleLoadData") && S(get_fn, "cuModuleGetFunction") &&
        S(alloc, "cuMemAlloc_v2") && S(free, "cuMemFree_v2") && S(htod, "cuMemcpyHtoD_v2") &&
        S(dtoh, "cuMemcpyDtoH_v2") && S(launch, "cuLaunchKernel") && S(sync, "cuCtxSynchronize") &&
        S(err, "cuGetErrorString")))
    return "libcuda lacks driver API entry points";
#undef S
  int dev, major, minor;
  void *ctx;
  if (cu.init(0) || cu.device_get(&dev, 0)) return "no CUDA device found";
  CU(cu.attr(&major, 75, dev)); /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
  CU(cu.attr(&minor, 76, dev));
  arch = major * 10 + minor;
  CU(cu.ctx_retain(&ctx, dev));
  CU(cu.ctx_set(ctx));
  return NULL;
}

/* Compiles kernels/cuda/<name>.cu for this GPU with the test constants (once a file: the
 * module stays loaded), returns entry fn. */
static void *kernel(const char *file, const char *fn) {
  static const char *const defs[] = {"-DHEAD_DIM=" STR(TEST_HEAD_DIM), "-DBLOCK_SIZE=16",
                                     "-DGQA_GROUP=2"};
  static void *mods[64]; /* by source index */
  for (int i = 0; i < infc_cuda_n_sources && i < 64; i++) {
    if (strcmp(infc_cuda_sources[i].name, file)) continue;
    if (!mods[i]) {
      infc_nvrtc_image im;
      ir_diag d = {0};
      if (infc_nvrtc_compile(nv, infc_cuda_sources[i].text, file, arch, defs, 3, &im, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        exit(1);
      }
      CU(cu.load(&mods[i], im.cubin));
      infc_nvrtc_image_free(&im);
    }
    void *f;
    CU(cu.get_fn(&f, mods[i], fn));
    return f;
  }
  fprintf(stderr, "no kernel source %s\n", file);
  exit(1);
}
#endif

static CUdeviceptr up(const void *h, size_t n) {
  CUdeviceptr p;
  CU(cu.alloc(&p, n ? n : 1));
  if (n) CU(cu.htod(p, h, n));
  return p;
}
static CUdeviceptr poisoned(size_t n) {
  void *nan = malloc(n);
  memset(nan, 0xff, n);
  CUdeviceptr p = up(nan, n);
  free(nan);
  return p;
}
static void down(void *h, CUdeviceptr p, size_t n) { CU(cu.dtoh(h, p, n)); }
static void run(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, void **args) {
  CU(cu.launch(f, gx, gy, gz, bx, 1, 1, 0, NULL, args, NULL));
  CU(cu.sync());
}

static float frand(void) { return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f; }
static float *frands(size_t n) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = frand();
  return x;
}

static double rel_err(const float *out, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(out[i])) return INFINITY;
    num += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

#define CLOSE(what, out, ref, n, tol)                                                              \
  do {                                                                                             \
    double e_ = rel_err(out, ref, n);                                                              \
    printf("  %-28s rel err %.2e\n", what, e_);                                                    \
    CHECKF(e_ <= (tol), "%s: rel err %.3e > %.0e", what, e_, (double)(tol));                       \
  } while (0)

/* Random weights of dtype dt, rows x k: floats converted, random int8/int4 bytes, or random
 * blocks with a sane f16 scale (and min) in each block header. */
static uint8_t *weights(ir_dtype dt, int64_t rows, int64_t k) {
  size_t row = (size_t)ir_dtype_bytes(dt, (uint64_t)k), n = row * (size_t)rows;
  uint8_t *w = malloc(n);
  for (size_t i = 0; i < n; i++) w[i] = (uint8_t)rand();
  if (dt == IR_I8 || dt == IR_I4) return w; /* any byte is a value (scales are separate) */
  if (dt == IR_F8_E4M3) { /* any byte but the two NaNs, 0x7f and 0xff: normals, subnormals */
    for (size_t i = 0; i < n; i++)
      if ((w[i] & 0x7f) == 0x7f) w[i] ^= 0x01;
    return w;
  }
  if (dt == IR_F32 || dt == IR_F16 || dt == IR_BF16) {
    for (size_t i = 0; i < (size_t)(rows * k); i++) {
      float f = frand();
      uint16_t h = dt == IR_F16 ? ir_f32_to_f16(f) : ir_f32_to_bf16(f);
      if (dt == IR_F32) memcpy(w + 4 * i, &f, 4);
      else memcpy(w + 2 * i, &h, 2);
    }
    return w;
  }
  size_t bsz = dt == IR_Q8_0 ? 34 : dt == IR_Q4_0 ? 18 : 20;
  for (size_t b = 0; b < n / bsz; b++) {
    uint16_t d = ir_f32_to_f16(0.01f + 0.02f * (float)rand() / RAND_MAX);
    uint16_t m = ir_f32_to_f16(-0.1f * (float)rand() / RAND_MAX);
    memcpy(w + b * bsz, &d, 2);
    if (dt == IR_Q4_1) memcpy(w + b * bsz + 2, &m, 2);
  }
  return w;
}

static void test_elementwise(void) {
  const long long n = 100003;
  float *a = frands((size_t)n), *b = frands((size_t)n), *ref = malloc(n * 4), *out = malloc(n * 4);
  CUdeviceptr da = up(a, n * 4), db = up(b, n * 4), dout = poisoned(n * 4);
  void *args[] = {&dout, &da, &db, (void *)&n};
  run(kernel("add", "kn_add"), 256, 1, 1, 256, args);
  down(out, dout, n * 4);
  kn_add(NULL, ref, a, b, n);
  CLOSE("add", out, ref, (size_t)n, 1e-6);
  run(kernel("swiglu", "kn_swiglu"), 256, 1, 1, 256, args);
  down(out, dout, n * 4);
  kn_swiglu(NULL, ref, a, b, n);
  CLOSE("swiglu", out, ref, (size_t)n, 1e-5);
  /* Gemma's gelu_tanh gate over [-6, 6] (tanh saturates), and the soft cap 15 over [-40, 40]
   * (it bites from about 5), into another buffer and in place */
  for (long long i = 0; i < n; i++) a[i] *= 6.0f, b[i] *= 40.0f;
  CU(cu.htod(da, a, n * 4));
  CU(cu.htod(db, b, n * 4));
  run(kernel("swiglu", "kn_geglu"), 256, 1, 1, 256, args);
  down(out, dout, n * 4);
  kn_geglu(NULL, ref, a, b, n);
  CLOSE("geglu", out, ref, (size_t)n, 1e-5);
  const float cap = 15.0f;
  void *cargs[] = {&dout, &db, (void *)&n, (void *)&cap};
  run(kernel("swiglu", "kn_softcap"), 256, 1, 1, 256, cargs);
  down(out, dout, n * 4);
  kn_softcap(NULL, ref, b, n, cap);
  CLOSE("softcap", out, ref, (size_t)n, 1e-6);
  void *iargs[] = {&db, &db, (void *)&n, (void *)&cap};
  run(kernel("swiglu", "kn_softcap"), 256, 1, 1, 256, iargs);
  down(out, db, n * 4);
  CLOSE("softcap in place", out, ref, (size_t)n, 1e-6);
  cu.free(da), cu.free(db), cu.free(dout);
  free(a), free(b), free(ref), free(out);
}

static void test_norms(void) {
  const int rows = 7, dim = 576;
  const float eps = 1e-5f;
  size_t n = (size_t)rows * dim;
  float *a = frands(n), *b = frands(n), *w = frands(dim);
  float *ref = malloc(n * 4), *ref_sum = malloc(n * 4), *out = malloc(n * 4), *sum = malloc(n * 4);
  CUdeviceptr da = up(a, n * 4), db = up(b, n * 4), dw = up(w, dim * 4);
  CUdeviceptr dout = poisoned(n * 4), dsum = poisoned(n * 4);
  void *a1[] = {&dout, &da, &dw, (void *)&dim, (void *)&eps};
  run(kernel("rms_norm", "kn_rms_norm"), rows, 1, 1, 256, a1);
  down(out, dout, n * 4);
  kn_rms_norm(NULL, ref, a, w, rows, dim, eps);
  CLOSE("rms_norm", out, ref, n, 1e-5);
  void *a2[] = {&dout, &dsum, &da, &db, &dw, (void *)&dim, (void *)&eps};
  run(kernel("rms_norm", "kn_add_rms_norm"), rows, 1, 1, 256, a2);
  down(out, dout, n * 4);
  down(sum, dsum, n * 4);
  kn_add_rms_norm(NULL, ref, ref_sum, a, b, w, rows, dim, eps);
  CLOSE("add_rms_norm (sum)", sum, ref_sum, n, 1e-6);
  CLOSE("add_rms_norm", out, ref, n, 1e-5);
  cu.free(da), cu.free(db), cu.free(dw), cu.free(dout), cu.free(dsum);
  free(a), free(b), free(w), free(ref), free(ref_sum), free(out), free(sum);
}

static void test_rows(void) {
  const long long dim = 128;
  const int vocab = 50, n_tok = 9;
  int32_t ids[9] = {3, 0, 49, 7, 7, 12, 33, 1, 48};
  float *ref = malloc(n_tok * dim * 4), *out = malloc(n_tok * dim * 4);
  CUdeviceptr dids = up(ids, sizeof ids), dout = poisoned(n_tok * dim * 4);
  const ir_dtype dts[] = {IR_F32, IR_F16, IR_BF16, IR_Q8_0, IR_Q4_0, IR_Q4_1};
  for (int i = 0; i < 6; i++) {
    uint8_t *t = weights(dts[i], vocab, dim);
    CUdeviceptr dt = up(t, ir_dtype_bytes(dts[i], (uint64_t)(vocab * dim)));
    char fn[32], what[32];
    snprintf(fn, sizeof fn, "kn_embed_%s", ir_dtype_name(dts[i]));
    snprintf(what, sizeof what, "embed %s", ir_dtype_name(dts[i]));
    float scale = 1.0f;
    void *args[] = {&dout, &dt, &dids, (void *)&dim, &scale};
    run(kernel("embed", fn), n_tok, 1, 1, 128, args);
    down(out, dout, n_tok * dim * 4);
    kn_embed(NULL, ref, t, dts[i], ids, n_tok, dim);
    CLOSE(what, out, ref, (size_t)(n_tok * dim), 1e-6);
    scale = 11.3137085f; /* Gemma's sqrt(hidden) */
    run(kernel("embed", fn), n_tok, 1, 1, 128, args);
    down(out, dout, n_tok * dim * 4);
    kn_embed_scaled(NULL, ref, t, dts[i], ids, n_tok, dim, scale);
    snprintf(what, sizeof what, "embed %s scale %.4g", ir_dtype_name(dts[i]), (double)scale);
    CLOSE(what, out, ref, (size_t)(n_tok * dim), 1e-6);
    cu.free(dt);
    free(t);
  }
  float *x = frands(vocab * dim);
  CUdeviceptr dx = up(x, vocab * dim * 4);
  void *args[] = {&dout, &dx, &dids, (void *)&dim};
  run(kernel("gather_rows", "kn_gather_rows"), n_tok, 1, 1, 128, args);
  down(out, dout, n_tok * dim * 4);
  kn_gather_rows(NULL, ref, x, ids, n_tok, dim);
  CLOSE("gather_rows", out, ref, (size_t)(n_tok * dim), 0);
  cu.free(dx), cu.free(dids), cu.free(dout);
  free(x), free(ref), free(out);
}

static void test_gemv(void) {
  const int m = 5, n = 67, k = 256;
  float *x = frands(m * k), *bias = frands(n), *ref = malloc(m * n * 4), *out = malloc(m * n * 4);
  CUdeviceptr dx = up(x, m * k * 4), db = up(bias, n * 4), dy = poisoned(m * n * 4);
  const ir_dtype dts[] = {IR_F32, IR_F16, IR_BF16, IR_Q8_0, IR_Q4_0, IR_Q4_1};
  for (int i = 0; i < 6; i++) {
    uint8_t *w = weights(dts[i], n, k);
    CUdeviceptr dw = up(w, ir_dtype_bytes(dts[i], (uint64_t)n * k));
    char fn[32], what[32];
    snprintf(fn, sizeof fn, "kn_gemv_%s", ir_dtype_name(dts[i]));
    snprintf(what, sizeof what, "gemv %s", ir_dtype_name(dts[i]));
    void *args[] = {&dy, &dx, &dw, &db, (void *)&m, (void *)&n, (void *)&k};
    run(kernel("gemv", fn), (n + 3) / 4, (m + 3) / 4, 1, 128, args); /* GEMV_WARPS, GEMV_M 4 */
    down(out, dy, m * n * 4);
    kn_matmul(NULL, ref, x, w, dts[i], bias, m, n, k);
    CLOSE(what, out, ref, (size_t)(m * n), 1e-5);
    cu.free(dw);
    free(w);
  }
  cu.free(dx), cu.free(db), cu.free(dy);
  free(x), free(bias), free(ref), free(out);
}

/* Quantization parameters (n, ng) of type t, stored as gemv_wq.cu reads them. */
static void *qparams(ir_dtype t, int n, int ng, float lo, float span) {
  size_t cnt = (size_t)n * ng;
  void *p = malloc(cnt * 4);
  for (size_t i = 0; i < cnt; i++) {
    float v = lo + span * (frand() * 0.5f + 0.5f);
    if (t == IR_F16) ((uint16_t *)p)[i] = ir_f32_to_f16(v);
    else if (t == IR_F32) ((float *)p)[i] = v;
    else if (t == IR_I8) ((int8_t *)p)[i] = (int8_t)lrintf(v);
    else ((uint8_t *)p)[i] = (uint8_t)lrintf(v);
  }
  return p;
}

/* The weight-only cases of gemv_wq.cu: i4 / i8 / FP8 E4M3 weights, f32 / f16 scales, zero
 * points of every type or none (code: gemv_wq.cu's zt, 0 for none). */
static const struct wq_case {
  ir_dtype qt, st, zt;
  int group, code;
} k_wq_cases[] = {{IR_I4, IR_F32, IR_U8, 32, 0},      {IR_I4, IR_F32, IR_U8, 64, 1},
                  {IR_I4, IR_F16, IR_F16, 128, 3},    {IR_I4, IR_F16, IR_F32, 256, 4},
                  {IR_I8, IR_F32, IR_U8, 256, 0},     {IR_I8, IR_F16, IR_I8, 16, 2},
                  {IR_F8_E4M3, IR_F32, IR_U8, 256, 0}};

/* One case's random weight (n, k) on both sides: host arrays behind w, device copies. */
typedef struct wq_set {
  kn_wq w;
  int st, zt; /* gemv_wq.cu's codes */
  CUdeviceptr dq, ds, dz;
} wq_set;

static wq_set wq_make(const struct wq_case *c, int n, int k) {
  int ng = k / c->group;
  bool i4 = c->qt == IR_I4;
  wq_set s = {.st = c->st == IR_F16, .zt = c->code};
  s.w = (kn_wq){.q = weights(c->qt, n, k),
                .qt = c->qt,
                .scales = qparams(c->st, n, ng, 0.002f, 0.02f),
                .st = c->st,
                .zp = c->code ? qparams(c->zt, n, ng, i4 ? 4.0f : -8.0f, i4 ? 8.0f : 16.0f) : NULL,
                .zt = c->zt,
                .group = c->group};
  s.dq = up(s.w.q, ir_dtype_bytes(c->qt, (uint64_t)n * k));
  s.ds = up(s.w.scales, (size_t)n * ng * ir_dtype_bytes(c->st, 1));
  s.dz = c->code ? up(s.w.zp, (size_t)n * ng * ir_dtype_bytes(c->zt, 1)) : 0;
  return s;
}

static void wq_free(wq_set *s) {
  cu.free(s->dq), cu.free(s->ds);
  if (s->dz) cu.free(s->dz);
  free((void *)s->w.q), free((void *)s->w.scales), free((void *)s->w.zp);
}

/* gemv_wq.cu's entry `base`_i4 / _i8 / _f8 for weights of type qt. */
static void *wq_kernel(const char *base, ir_dtype qt) {
  char name[64];
  snprintf(name, sizeof name, "kn_%s_%s", base,
           qt == IR_I4        ? "i4"
           : qt == IR_F8_E4M3 ? "f8"
                              : "i8");
  return kernel("gemv_wq", name);
}

static void wq_what(char *buf, size_t len, const char *kind, const struct wq_case *c) {
  snprintf(buf, len, "%s %s %s zp %s g%d", kind, ir_dtype_name(c->qt), ir_dtype_name(c->st),
           c->code ? ir_dtype_name(c->zt) : "-", c->group);
}

/* gemv_wq.cu against kn_matmul_wq, m = 1, 3, 9 (9 also with one CTA row looping over its row
 * tiles). */
static void test_gemv_wq(void) {
  const int n = 67, k = 256, ms[] = {1, 3, 9};
  float *x = frands(9 * k), *bias = frands(n), *ref = malloc(9 * n * 4), *out = malloc(9 * n * 4);
  float *nan = malloc(9 * n * 4);
  memset(nan, 0xff, 9 * n * 4);
  CUdeviceptr dx = up(x, 9 * k * 4), db = up(bias, n * 4), dy = up(nan, 9 * n * 4);
  for (size_t c = 0; c < sizeof k_wq_cases / sizeof k_wq_cases[0]; c++) {
    wq_set ws = wq_make(&k_wq_cases[c], n, k);
    int group = ws.w.group;
    void *f = wq_kernel("gemv_wq", ws.w.qt);
    for (int mi = 0; mi < 4; mi++) {
      int m = ms[mi < 3 ? mi : 2];
      void *args[] = {&dy, &dx,        &ws.dq,     &db,    &ws.ds, &ws.dz,
                      &m,  (void *)&n, (void *)&k, &group, &ws.st, &ws.zt};
      CU(cu.htod(dy, nan, (size_t)m * n * 4)); /* an unwritten element fails */
      run(f, (n + 3) / 4, mi < 3 ? (unsigned)(m + 3) / 4 : 1, 1, 128, args);
      down(out, dy, (size_t)m * n * 4);
      kn_matmul_wq(NULL, ref, x, &ws.w, bias, m, n, k, KN_WQ_ACT_NONE);
      char what[64], full[80];
      wq_what(what, sizeof what, "gemv_wq", &k_wq_cases[c]);
      snprintf(full, sizeof full, "%s m%d%s", what, m, mi == 3 ? " 1cta" : "");
      CLOSE(full, out, ref, (size_t)(m * n), 1e-5);
    }
    wq_free(&ws);
  }
  cu.free(dx), cu.free(db), cu.free(dy);
  free(x), free(bias), free(ref), free(out), free(nan);
}

/* kn_dequant_wq_* (the f16 weights of the cuBLAS prefill path) against kn_wq_value rounded
 * to f16 on the CPU: every value's bits. */
static void test_dequant_wq(void) {
  const int n = 67, k = 256;
  uint16_t *out = malloc((size_t)n * k * 2);
  for (size_t c = 0; c < sizeof k_wq_cases / sizeof k_wq_cases[0]; c++) {
    wq_set ws = wq_make(&k_wq_cases[c], n, k);
    int group = ws.w.group;
    memset(out, 0xff, (size_t)n * k * 2);
    CUdeviceptr dout = up(out, (size_t)n * k * 2);
    long long rows = n;
    void *args[] = {&dout, &ws.dq, &ws.ds, &ws.dz, &rows, (void *)&k, &group, &ws.st, &ws.zt};
    run(wq_kernel("dequant_wq", ws.w.qt), 5, 1, 1, 256, args);
    down(out, dout, (size_t)n * k * 2);
    int bad = 0;
    for (int j = 0; j < n; j++)
      for (int i = 0; i < k; i++)
        bad += out[j * k + i] != ir_f32_to_f16(kn_wq_value(&ws.w, k, j, i));
    char what[64];
    wq_what(what, sizeof what, "dequant_wq", &k_wq_cases[c]);
    CHECKF(bad == 0, "%s: %d of %d f16 values differ", what, bad, n * k);
    cu.free(dout);
    wq_free(&ws);
  }
  free(out);
}

/* The rope table (max_pos, rot / 2, 2) of (cos, sin) of pos * 10000^(-2i / rot); rot 0
 * gives one zeroed row pair per position (a table nothing reads). */
static float *cos_sin_table(int max_pos, int rot) {
  float *cs = calloc((size_t)max_pos * (rot ? rot : 2), sizeof *cs);
  for (int p = 0; p < max_pos; p++)
    for (int i = 0; i < rot / 2; i++) {
      double a = p * pow(10000.0, -2.0 * i / rot);
      cs[(p * rot / 2 + i) * 2] = (float)cos(a);
      cs[(p * rot / 2 + i) * 2 + 1] = (float)sin(a);
    }
  return cs;
}

static void test_rope(void) {
  const int n_tok = 5, n_heads = 4, hd = 64, max_pos = 40;
  int32_t pos[5] = {0, 1, 17, 39, 5};
  for (int neox = 0; neox < 2; neox++) {
    for (int rot = 32; rot <= 64; rot += 32) {
      float *cs = cos_sin_table(max_pos, rot), *x = frands(n_tok * n_heads * hd);
      float *ref = malloc(n_tok * n_heads * hd * 4);
      memcpy(ref, x, n_tok * n_heads * hd * 4);
      CUdeviceptr dx = up(x, n_tok * n_heads * hd * 4), dp = up(pos, sizeof pos);
      CUdeviceptr dc = up(cs, max_pos * rot * 4);
      void *args[] = {&dx, &dp, &dc, (void *)&n_heads, (void *)&hd, (void *)&rot};
      run(kernel("rope", neox ? "kn_rope_neox" : "kn_rope_interleaved"), n_tok, 1, 1, 128, args);
      down(x, dx, n_tok * n_heads * hd * 4);
      kn_rope(NULL, ref, pos, cs, n_tok, n_heads, hd, rot, neox);
      char what[32];
      snprintf(what, sizeof what, "rope %s rot %d", neox ? "neox" : "interleaved", rot);
      CLOSE(what, x, ref, (size_t)(n_tok * n_heads * hd), 1e-6);
      cu.free(dx), cu.free(dp), cu.free(dc);
      free(cs), free(x), free(ref);
    }
  }
}

/* The last two arguments of every attention kernel for full attention: no sliding window,
 * no score soft cap. */
static const int k_no_window = 0;
static const float k_no_cap = 0.0f;
#define FULL_ATTN (void *)&k_no_window, (void *)&k_no_cap

/* Paged attention: seq 0 decodes one token at position 37 over blocks {3, 0, 5}; seq 1
 * prefills positions 10..29 over blocks {1, 4}; earlier positions are already cached. */
enum { HD = TEST_HEAD_DIM, BS = 16, NH = 4, NKV = 2, NBLK = 6, MAXB = 3, NT = 21 };

/* Block tables of the two sequences, and the sizes of the cache, of q and of the new K. */
static const int32_t attn_bt[2 * MAXB] = {3, 0, 5, 1, 4, 2};
#define ATTN_CACHE ((size_t)NBLK * NKV * BS * HD)
#define ATTN_QN ((size_t)NT * NH * HD)
#define ATTN_KVN ((size_t)NT * NKV * HD)

static void attn_setup(int32_t *seq, int32_t *pos) {
  seq[0] = 0, pos[0] = 37;
  for (int t = 1; t < NT; t++) seq[t] = 1, pos[t] = 9 + t;
}

static void test_attention(void) {
  const int32_t *bt = attn_bt;
  int32_t seq[NT], pos[NT];
  attn_setup(seq, pos);
  const size_t cache = ATTN_CACHE, qn = ATTN_QN, kvn = ATTN_KVN;
  float *k = frands(cache), *v = frands(cache), *q = frands(qn), *kn = frands(kvn),
        *vn = frands(kvn), *ref = malloc(qn * 4), *out = malloc(qn * 4), *kc = malloc(cache * 4);
  CUdeviceptr dk = up(k, cache * 4), dv = up(v, cache * 4), dq = up(q, qn * 4);
  CUdeviceptr dkn = up(kn, kvn * 4), dvn = up(vn, kvn * 4), dseq = up(seq, sizeof seq);
  CUdeviceptr dpos = up(pos, sizeof pos), dbt = up(attn_bt, sizeof attn_bt),
              dout = poisoned(qn * 4);
  const int maxb = MAXB, nh = NH, nkv = NKV;
  const float scale = 0.125f;
  kn_kv_layer kv = {
      .k = k, .v = v, .n_blocks = NBLK, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
  kn_attn_batch b = {NT, seq, pos, MAXB, bt};
  kn_attention_paged(NULL, ref, q, kn, vn, &kv, &b, NH, scale); /* also writes k, v */

  void *wa[] = {&dk, &dv, &dkn, &dvn, &dseq, &dpos, &dbt, (void *)&maxb, (void *)&nkv};
  run(kernel("kv_write", "kn_kv_write"), NT, 1, 1, 128, wa);
  down(kc, dk, cache * 4);
  CLOSE("kv_write k", kc, k, cache, 0);
  down(kc, dv, cache * 4);
  CLOSE("kv_write v", kc, v, cache, 0);

  void *decode = kernel("attention", "kn_attn_decode");
  CUdeviceptr pacc = poisoned(qn * 2 * 4), pml = poisoned((size_t)NT * NH * 2 * 2 * 4);
  int bps = MAXB;
  void *da[] = {&dout,       &pacc,        &pml,           &dq,  &dk,
                &dv,         &dseq,        &dpos,          &dbt, (void *)&maxb,
                (void *)&nh, (void *)&nkv, (void *)&scale, &bps, FULL_ATTN};
  run(decode, NT, NH, 1, 128, da);
  down(out, dout, qn * 4);
  CLOSE("attn decode, 1 split", out, ref, qn, 1e-4);

  bps = 2; /* two splits of up to 2 blocks, then the reduction */
  CUdeviceptr dout2 = poisoned(qn * 4);
  run(decode, NT, NH, 2, 128, da);
  int splits = 2;
  void *ra[] = {&dout2, &pacc, &pml, (void *)&nh, &splits};
  run(kernel("attention", "kn_attn_decode_reduce"), NT, NH, 1, HD, ra);
  down(out, dout2, qn * 4);
  CLOSE("attn decode, 2 splits", out, ref, qn, 1e-4);

  /* tiles of <= 4 warps x 4 rows, then two empty ones (a captured drafted step's fixed grid
   * of one tile a token: their CTAs write nothing) */
  int32_t tok0[5] = {0, 1, 17, 0, 0}, ntok[5] = {1, 16, 4, 0, 0};
  CUdeviceptr dt0 = up(tok0, sizeof tok0), dnt = up(ntok, sizeof ntok), dout3 = poisoned(qn * 4);
  void *pa[] = {&dout3,         &dq,  &dk,           &dv,         &dseq,
                &dpos,          &dbt, (void *)&maxb, (void *)&nh, (void *)&nkv,
                (void *)&scale, &dt0, &dnt,          FULL_ATTN};
  run(kernel("attention", "kn_attn_prefill"), 5, NH, 1, 128, pa);
  down(out, dout3, qn * 4);
  CLOSE("attn prefill tiles (2 empty)", out, ref, qn, 1e-4);

  /* The tensor-core prefill (f16 operands, f32 accumulation): tiles of up to 64 tokens of
   * one sequence. Bound 2e-3: q, k, v and the probabilities are rounded to f16 (2^-11
   * relative each). */
  static const struct {
    int n;
    int32_t t0[5], nt[5];
  } tilings[] = {{2, {0, 1}, {1, 20}}, {5, {0, 1, 9, 0, 0}, {1, 8, 12, 0, 0}}};
  for (int c = 0; c < 2; c++) {
    CUdeviceptr ct0 = up(tilings[c].t0, sizeof tilings[c].t0);
    CUdeviceptr cnt = up(tilings[c].nt, sizeof tilings[c].nt), cout = poisoned(qn * 4);
    void *ta[] = {&cout,          &dq,  &dk,           &dv,         &dseq,
                  &dpos,          &dbt, (void *)&maxb, (void *)&nh, (void *)&nkv,
                  (void *)&scale, &ct0, &cnt,          FULL_ATTN};
    run(kernel("attention", "kn_attn_prefill_tc"), (unsigned)tilings[c].n, NH, 1, 128, ta);
    down(out, cout, qn * 4);
    CLOSE(c ? "attn prefill tc, 3 tiles, 2 empty" : "attn prefill tc, 2 tiles", out, ref, qn, 2e-3);
    cu.free(ct0), cu.free(cnt), cu.free(cout);
  }

  CUdeviceptr all[] = {dk,   dv,   dq,  dkn,   dvn, dseq, dpos, dbt,
                       dout, pacc, pml, dout2, dt0, dnt,  dout3};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu.free(all[i]);
  free(k), free(v), free(q), free(kn), free(vn), free(ref), free(out), free(kc);
}

/* The f16 cache (--kv-dtype f16): the _f16 entries against kn_attention_paged on an f16
 * cache (the same rounding of K and V; bit-exact cache writes). */
static void test_attention_f16(void) {
  const int32_t *bt = attn_bt;
  int32_t seq[NT], pos[NT];
  attn_setup(seq, pos);
  const size_t cache = ATTN_CACHE, qn = ATTN_QN, kvn = ATTN_KVN;
  float *q = frands(qn), *kn = frands(kvn), *vn = frands(kvn), *ref = malloc(qn * 4);
  float *out = malloc(qn * 4);
  uint16_t *k = malloc(cache * 2), *v = malloc(cache * 2), *got = malloc(cache * 2);
  for (size_t i = 0; i < cache; i++) k[i] = ir_f32_to_f16(frand()), v[i] = ir_f32_to_f16(frand());
  CUdeviceptr dk = up(k, cache * 2), dv = up(v, cache * 2), dq = up(q, qn * 4);
  CUdeviceptr dkn = up(kn, kvn * 4), dvn = up(vn, kvn * 4), dseq = up(seq, sizeof seq);
  CUdeviceptr dpos = up(pos, sizeof pos), dbt = up(attn_bt, sizeof attn_bt);
  const int maxb = MAXB, nh = NH, nkv = NKV;
  const float scale = 0.125f;
  kn_kv_layer kv = {
      .n_blocks = NBLK, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD, .k16 = k, .v16 = v};
  kn_attn_batch b = {NT, seq, pos, MAXB, bt};
  kn_attention_paged(NULL, ref, q, kn, vn, &kv, &b, NH, scale); /* also writes k, v */

  void *wa[] = {&dk, &dv, &dkn, &dvn, &dseq, &dpos, &dbt, (void *)&maxb, (void *)&nkv};
  run(kernel("kv_write", "kn_kv_write_f16"), NT, 1, 1, 128, wa);
  down(got, dk, cache * 2);
  int bad = memcmp(got, k, cache * 2) != 0;
  down(got, dv, cache * 2);
  bad += memcmp(got, v, cache * 2) != 0;
  printf("  kv_write f16                 %s\n", bad ? "differs" : "bit-exact");
  CHECK(bad == 0);

  CUdeviceptr dout[4], pacc = poisoned(qn * 2 * 4), pml = poisoned((size_t)NT * NH * 2 * 2 * 4);
  for (int i = 0; i < 4; i++) dout[i] = poisoned(qn * 4);
  for (int splits = 1; splits <= 2; splits++) {
    int bps = splits == 1 ? MAXB : 2;
    void *da[] = {&dout[splits - 1],
                  &pacc,
                  &pml,
                  &dq,
                  &dk,
                  &dv,
                  &dseq,
                  &dpos,
                  &dbt,
                  (void *)&maxb,
                  (void *)&nh,
                  (void *)&nkv,
                  (void *)&scale,
                  &bps,
                  FULL_ATTN};
    run(kernel("attention", "kn_attn_decode_f16"), NT, NH, (unsigned)splits, 128, da);
    if (splits == 2) {
      void *ra[] = {&dout[1], &pacc, &pml, (void *)&nh, &splits};
      run(kernel("attention", "kn_attn_decode_reduce"), NT, NH, 1, HD, ra);
    }
    down(out, dout[splits - 1], qn * 4);
    CLOSE(splits == 1 ? "attn decode f16, 1 split" : "attn decode f16, 2 splits", out, ref, qn,
          1e-4);
  }
  int32_t tok0[3] = {0, 1, 17}, ntok[3] = {1, 16, 4}, tc0[2] = {0, 1}, tcn[2] = {1, 20};
  CUdeviceptr dt0 = up(tok0, sizeof tok0), dnt = up(ntok, sizeof ntok);
  CUdeviceptr ct0 = up(tc0, sizeof tc0), cnt = up(tcn, sizeof tcn);
  void *pa[] = {&dout[2],       &dq,  &dk,           &dv,         &dseq,
                &dpos,          &dbt, (void *)&maxb, (void *)&nh, (void *)&nkv,
                (void *)&scale, &dt0, &dnt,          FULL_ATTN};
  run(kernel("attention", "kn_attn_prefill_f16"), 3, NH, 1, 128, pa);
  down(out, dout[2], qn * 4);
  CLOSE("attn prefill f16", out, ref, qn, 1e-4);
  void *ta[] = {&dout[3],       &dq,  &dk,           &dv,         &dseq,
                &dpos,          &dbt, (void *)&maxb, (void *)&nh, (void *)&nkv,
                (void *)&scale, &ct0, &cnt,          FULL_ATTN};
  run(kernel("attention", "kn_attn_prefill_tc_f16"), 2, NH, 1, 128, ta);
  down(out, dout[3], qn * 4);
  CLOSE("attn prefill tc f16", out, ref, qn, 2e-3);

  CUdeviceptr all[] = {dk,  dv,  dq,  dkn, dvn, dseq,    dpos,    dbt,     pacc,
                       pml, dt0, dnt, ct0, cnt, dout[0], dout[1], dout[2], dout[3]};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu.free(all[i]);
  free(q), free(kn), free(vn), free(ref), free(out), free(k), free(v), free(got);
}

/* Sliding-window and soft-capped attention (Gemma 2 / 3) against kn_attention_paged_io, GQA
 * 2: seq 0 decodes position 90 (its 6th block), seq 1 prefills positions 20..69 (one tile
 * of 50 for the tensor cores: its later warps skip chunks wholly before their windows),
 * seq 2 decodes position 3 (a context inside every window). Windows 5, 17 and 40 start
 * mid-block and span 1 to 4 blocks; softcap 2 over scores of spread about 1.3 (scale 0.5)
 * bites. Each case is checked to change the result, then run through decode (1, 2 and 3
 * splits over the window's blocks, as cuda_ops.c shares them out), the prefill tiles and
 * two tensor-core tilings; the f16 cache for one case of both. Bounds as test_attention. */
enum { WNT = 52, WMAXB = 6, WNBLK = 16, WSPLITS = 3 };

/* cuda_ops.c's blocks_per_split: the window's blocks (all WMAXB without one) over splits. */
static int window_bps(int window, int splits) {
  int nb = window > 0 ? (window + BS - 2) / BS + 1 : WMAXB;
  if (nb > WMAXB) nb = WMAXB;
  return (nb + splits - 1) / splits;
}

typedef struct win_bufs {
  CUdeviceptr q, seq, pos, bt, pacc, pml, out;
  float *got;
} win_bufs;

/* The window/softcap kernels of one cache type (f32 or f16 entries) against ref. */
static void window_runs(const win_bufs *w, CUdeviceptr dk, CUdeviceptr dv, bool f16, int window,
                        float cap, const float *ref, const char *what) {
  const int maxb = WMAXB, nh = NH, nkv = NKV;
  const float scale = 0.5f;
  const size_t qn = (size_t)WNT * NH * HD;
  CUdeviceptr out = w->out, q = w->q, seq = w->seq, pos = w->pos, bt = w->bt;
  CUdeviceptr pacc = w->pacc, pml = w->pml;
  char name[96], fn[40];
  snprintf(fn, sizeof fn, "kn_attn_decode%s", f16 ? "_f16" : "");
  for (int splits = 1; splits <= WSPLITS; splits++) {
    int bps = window_bps(window, splits);
    void *da[] = {&out,        &pacc,        &pml,           &q,   &dk,
                  &dv,         &seq,         &pos,           &bt,  (void *)&maxb,
                  (void *)&nh, (void *)&nkv, (void *)&scale, &bps, &window,
                  &cap};
    CU(cu.htod(out, w->got, qn * 4)); /* NaN: an unwritten element fails */
    run(kernel("attention", fn), WNT, NH, (unsigned)splits, 128, da);
    if (splits > 1) {
      void *ra[] = {&out, &pacc, &pml, (void *)&nh, &splits};
      run(kernel("attention", "kn_attn_decode_reduce"), WNT, NH, 1, HD, ra);
    }
    down(w->got + qn, out, qn * 4);
    snprintf(name, sizeof name, "%s decode %d split%s", what, splits, splits > 1 ? "s" : "");
    CLOSE(name, w->got + qn, ref, qn, 1e-4);
  }
  static const struct {
    int n;
    int32_t t0[6], nt[6];
  } tilings[] = {{6, {0, 1, 17, 33, 49, 51}, {1, 16, 16, 16, 2, 1}}, /* kn_attn_prefill: <= 16 */
                 {3, {0, 1, 51}, {1, 50, 1}},                        /* tensor cores: <= 64 */
                 {4, {0, 1, 21, 51}, {1, 20, 30, 1}}};
  for (int c = 0; c < 3; c++) {
    CUdeviceptr t0 = up(tilings[c].t0, sizeof tilings[c].t0);
    CUdeviceptr tn = up(tilings[c].nt, sizeof tilings[c].nt);
    void *pa[] = {&out,           &q,  &dk,           &dv,         &seq,
                  &pos,           &bt, (void *)&maxb, (void *)&nh, (void *)&nkv,
                  (void *)&scale, &t0, &tn,           &window,     &cap};
    snprintf(fn, sizeof fn, "kn_attn_prefill%s%s", c ? "_tc" : "", f16 ? "_f16" : "");
    CU(cu.htod(out, w->got, qn * 4));
    run(kernel("attention", fn), (unsigned)tilings[c].n, NH, 1, 128, pa);
    down(w->got + qn, out, qn * 4);
    snprintf(name, sizeof name, "%s prefill%s", what,
             c == 0   ? " tiles"
             : c == 1 ? " tc, 1 tile of 50"
                      : " tc, 20 + 30");
    CLOSE(name, w->got + qn, ref, qn, c ? 2e-3 : 1e-4);
    cu.free(t0), cu.free(tn);
  }
}

static void test_attention_window(void) {
  static const int32_t bt[3 * WMAXB] = {7, 2,  11, 0,  5, 14, 3, 9,  12,
                                        1, 13, 15, 10, 6, 4,  8, 15, 15};
  int32_t seq[WNT], pos[WNT];
  seq[0] = 0, pos[0] = 90;
  for (int t = 1; t < WNT - 1; t++) seq[t] = 1, pos[t] = 19 + t;
  seq[WNT - 1] = 2, pos[WNT - 1] = 3;
  const size_t cache = (size_t)WNBLK * NKV * BS * HD, qn = (size_t)WNT * NH * HD;
  const size_t kvn = (size_t)WNT * NKV * HD;
  float *k = frands(cache), *v = frands(cache), *q = frands(qn), *kn = frands(kvn);
  float *vn = frands(kvn), *full = malloc(qn * 4), *ref = malloc(qn * 4);
  uint16_t *k16 = malloc(cache * 2), *v16 = malloc(cache * 2);
  kn_kv_layer kv = {
      .k = k, .v = v, .n_blocks = WNBLK, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
  kn_attn_batch b = {WNT, seq, pos, WMAXB, bt};
  kn_attn_io io = {
      .q = q, .k = kn, .v = vn, .q_stride = NH * HD, .kv_stride = NKV * HD, .pos = pos};
  kn_attention_paged_io(NULL, full, &io, &kv, &b, NH, 0.5f); /* writes the new K, V */
  for (size_t i = 0; i < cache; i++) k16[i] = ir_f32_to_f16(k[i]), v16[i] = ir_f32_to_f16(v[i]);
  win_bufs w = {.q = up(q, qn * 4),
                .seq = up(seq, sizeof seq),
                .pos = up(pos, sizeof pos),
                .bt = up(bt, sizeof bt),
                .pacc = poisoned(qn * WSPLITS * 4),
                .pml = poisoned((size_t)WNT * NH * WSPLITS * 2 * 4),
                .out = poisoned(qn * 4),
                .got = malloc(qn * 2 * 4)};
  memset(w.got, 0xff, qn * 4);
  CUdeviceptr dk = up(k, cache * 4), dv = up(v, cache * 4);
  CUdeviceptr dk16 = up(k16, cache * 2), dv16 = up(v16, cache * 2);
  static const struct {
    int window;
    float cap;
  } cases[] = {{0, 0.0f}, {5, 0.0f}, {17, 0.0f}, {0, 2.0f}, {17, 2.0f}, {40, 2.0f}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    io.window = cases[c].window, io.softcap = cases[c].cap;
    kn_attention_paged_io(NULL, ref, &io, &kv, &b, NH, 0.5f);
    char what[48];
    snprintf(what, sizeof what, "attn window %d softcap %g", cases[c].window, (double)cases[c].cap);
    if (c > 0) { /* the case changes the result, so the checks below see it honoured */
      double e = rel_err(ref, full, qn);
      CHECKF(e > 0.05, "%s: only %.3e from full attention", what, e);
    }
    window_runs(&w, dk, dv, false, cases[c].window, cases[c].cap, ref, what);
  }
  kn_kv_layer kv16 = {.n_blocks = WNBLK,
                      .block_size = BS,
                      .n_kv_heads = NKV,
                      .head_dim = HD,
                      .k16 = k16,
                      .v16 = v16};
  io.window = 17, io.softcap = 2.0f;
  kn_attention_paged_io(NULL, ref, &io, &kv16, &b, NH, 0.5f);
  window_runs(&w, dk16, dv16, true, 17, 2.0f, ref, "attn f16 window 17 softcap 2");
  CUdeviceptr all[] = {w.q, w.seq, w.pos, w.bt, w.pacc, w.pml, w.out, dk, dv, dk16, dv16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu.free(all[i]);
  free(k), free(v), free(q), free(kn), free(vn), free(full), free(ref), free(k16), free(v16);
  free(w.got);
}

/* The fused gate_up GEMV (kn_gemv_<type>_swiglu) against kn_matmul_swiglu, m = 1..5, and
 * kn_swiglu_packed (the epilogue after cuBLAS / gemv_wq) over kn_matmul's (m, 2n) sums. */
static void test_gemv_swiglu(void) {
  const int n = 67, k = 256, mmax = 5;
  float *x = frands(mmax * k), *bias = frands(2 * n), *ref = malloc(mmax * n * 4);
  float *out = malloc(mmax * n * 4), *z = malloc(mmax * 2 * n * 4);
  CUdeviceptr dx = up(x, mmax * k * 4), db = up(bias, 2 * n * 4);
  const ir_dtype dts[] = {IR_F32, IR_F16, IR_BF16, IR_Q8_0, IR_Q4_0, IR_Q4_1};
  for (int i = 0; i < 6; i++) {
    uint8_t *w = weights(dts[i], 2 * n, k);
    CUdeviceptr dw = up(w, ir_dtype_bytes(dts[i], (uint64_t)2 * n * k));
    char fn[40];
    snprintf(fn, sizeof fn, "kn_gemv_%s_swiglu", ir_dtype_name(dts[i]));
    void *f = kernel("gemv", fn);
    for (int m = 1; m <= mmax; m += 2) {
      CUdeviceptr dy = poisoned(m * n * 4);
      void *args[] = {&dy, &dx, &dw, &db, &m, (void *)&n, (void *)&k};
      run(f, (n + 3) / 4, (m + 3) / 4, 1, 128, args);
      down(out, dy, m * n * 4);
      kn_matmul_swiglu(NULL, ref, x, w, dts[i], bias, m, n, k);
      char what[48];
      snprintf(what, sizeof what, "gemv %s swiglu m%d", ir_dtype_name(dts[i]), m);
      CLOSE(what, out, ref, (size_t)(m * n), 1e-5);
      cu.free(dy);
    }
    if (dts[i] == IR_F32) { /* the packed epilogue over the same sums */
      const long long mm = mmax, nn = n;
      kn_matmul(NULL, z, x, w, IR_F32, bias, mmax, 2 * n, k);
      kn_matmul_swiglu(NULL, ref, x, w, IR_F32, bias, mmax, n, k);
      CUdeviceptr dz = up(z, mmax * 2 * n * 4), dy = poisoned(mmax * n * 4);
      void *args[] = {&dy, &dz, (void *)&mm, (void *)&nn};
      run(kernel("swiglu", "kn_swiglu_packed"), 2, 1, 1, 128, args);
      down(out, dy, mmax * n * 4);
      CLOSE("swiglu packed", out, ref, (size_t)(mmax * n), 1e-6);
      cu.free(dz), cu.free(dy);
    }
    cu.free(dw);
    free(w);
  }
  cu.free(dx), cu.free(db);
  free(x), free(bias), free(ref), free(out), free(z);
}

/* The fused attention front (kn_rope_kv_write) and the attention kernels reading its rotated
 * q from their own output buffer, against kn_attention_paged_io: a packed qkv with rope
 * (neox and interleaved, all dims or half rotated), and separate q/k/v without rope; with
 * the per-head q/k norm (Qwen3) before the rope, and alone. */
static void test_fused_attention(void) {
  const int32_t *bt = attn_bt;
  int32_t seq[NT], pos[NT];
  attn_setup(seq, pos);
  const int W = (NH + 2 * NKV) * HD, max_pos = 40;
  const size_t cache = (size_t)NBLK * NKV * BS * HD, qn = (size_t)NT * NH * HD;
  float *k0 = frands(cache), *v0 = frands(cache), *qkv = frands((size_t)NT * W);
  float *k = malloc(cache * 4), *v = malloc(cache * 4), *ref = malloc(qn * 4);
  float *out = malloc(qn * 4), *got = malloc(cache * 4);
  CUdeviceptr dqkv = up(qkv, (size_t)NT * W * 4), dseq = up(seq, sizeof seq);
  CUdeviceptr dpos = up(pos, sizeof pos), dbt = up(attn_bt, sizeof attn_bt);
  const int maxb = MAXB, nh = NH, nkv = NKV;
  const float scale = 0.125f;
  static const struct {
    int packed, rot, neox, norm;
  } cases[] = {{1, HD, 1, 0}, {1, HD, 0, 0}, {1, HD / 2, 1, 0},
               {0, 0, 1, 0},  {1, HD, 1, 1}, {0, 0, 1, 1}};
  float *wqn = frands(HD), *wkn = frands(HD);
  CUdeviceptr dwq = up(wqn, HD * 4), dwk = up(wkn, HD * 4);
  const float qk_eps = 1e-6f;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int rot = cases[c].rot, neox = cases[c].neox;
    CUdeviceptr dqn = cases[c].norm ? dwq : 0, dkw = cases[c].norm ? dwk : 0;
    const size_t csb = (size_t)max_pos * (rot ? rot : 2) * 4;
    float *cs = cos_sin_table(max_pos, rot);
    long long qs = cases[c].packed ? W : NH * HD, kvs = cases[c].packed ? W : NKV * HD;
    /* separate q, k, v: the first NT * NH * HD, then NT * NKV * HD floats of qkv each */
    size_t ko = cases[c].packed ? (size_t)NH * HD : qn;
    size_t vo = cases[c].packed ? (size_t)(NH + NKV) * HD : qn + (size_t)NT * NKV * HD;
    memcpy(k, k0, cache * 4), memcpy(v, v0, cache * 4);
    kn_kv_layer kv = {
        .k = k, .v = v, .n_blocks = NBLK, .block_size = BS, .n_kv_heads = NKV, .head_dim = HD};
    kn_attn_batch b = {NT, seq, pos, MAXB, bt};
    kn_attn_io io = {.q = qkv,
                     .k = qkv + ko,
                     .v = qkv + vo,
                     .q_stride = qs,
                     .kv_stride = kvs,
                     .pos = pos,
                     .cos_sin = rot ? cs : NULL,
                     .rot_dim = rot,
                     .neox = neox,
                     .q_norm = cases[c].norm ? wqn : NULL,
                     .k_norm = cases[c].norm ? wkn : NULL,
                     .qk_eps = qk_eps};
    kn_attention_paged_io(NULL, ref, &io, &kv, &b, NH, scale);

    CUdeviceptr dk = up(k0, cache * 4), dv = up(v0, cache * 4), dcs = up(cs, csb);
    CUdeviceptr dkn = dqkv + ko * 4, dvn = dqkv + vo * 4;
    CUdeviceptr dout[3] = {poisoned(qn * 4), poisoned(qn * 4), poisoned(qn * 4)};
    for (int o = 0; o < 3; o++) { /* the rotated q into each output buffer */
      void *wa[] = {&dout[o], &dk,   &dv,   &dqkv, &dkn,          &dvn,           &qs,
                    &kvs,     &dseq, &dpos, &dbt,  (void *)&maxb, (void *)&nh,    (void *)&nkv,
                    &dcs,     &rot,  &neox, &dqn,  &dkw,          (void *)&qk_eps};
      run(kernel("kv_write", "kn_rope_kv_write"), NT, 1, 1, 256, wa);
    }
    char what[64];
    snprintf(what, sizeof what, "rope_kv_write %s rot %d %s%s k", cases[c].packed ? "qkv" : "q,k,v",
             rot, neox ? "neox" : "il", cases[c].norm ? " qk-norm" : "");
    down(got, dk, cache * 4);
    CLOSE(what, got, k, cache, cases[c].norm ? 1e-5 : 1e-6); /* rsqrtf against 1 / sqrtf */
    down(got, dv, cache * 4);
    what[strlen(what) - 1] = 'v';
    CLOSE(what, got, v, cache, 0);

    CUdeviceptr pacc = poisoned(qn * 2 * 4), pml = poisoned((size_t)NT * NH * 2 * 2 * 4);
    int bps = MAXB;
    void *da[] = {&dout[0],    &pacc,        &pml,           &dout[0], &dk,
                  &dv,         &dseq,        &dpos,          &dbt,     (void *)&maxb,
                  (void *)&nh, (void *)&nkv, (void *)&scale, &bps,     FULL_ATTN};
    run(kernel("attention", "kn_attn_decode"), NT, NH, 1, 128, da);
    down(out, dout[0], qn * 4);
    snprintf(what, sizeof what, "  then decode, q = out");
    CLOSE(what, out, ref, qn, 1e-4);
    bps = 2;
    void *da2[] = {&dout[1],    &pacc,        &pml,           &dout[1], &dk,
                   &dv,         &dseq,        &dpos,          &dbt,     (void *)&maxb,
                   (void *)&nh, (void *)&nkv, (void *)&scale, &bps,     FULL_ATTN};
    run(kernel("attention", "kn_attn_decode"), NT, NH, 2, 128, da2);
    int splits = 2;
    void *ra[] = {&dout[1], &pacc, &pml, (void *)&nh, &splits};
    run(kernel("attention", "kn_attn_decode_reduce"), NT, NH, 1, HD, ra);
    down(out, dout[1], qn * 4);
    CLOSE("  then decode 2 splits, q = out", out, ref, qn, 1e-4);
    int32_t tok0[3] = {0, 1, 17}, ntok[3] = {1, 16, 4};
    CUdeviceptr dt0 = up(tok0, sizeof tok0), dnt = up(ntok, sizeof ntok);
    void *pa[] = {&dout[2],       &dout[2], &dk,           &dv,         &dseq,
                  &dpos,          &dbt,     (void *)&maxb, (void *)&nh, (void *)&nkv,
                  (void *)&scale, &dt0,     &dnt,          FULL_ATTN};
    run(kernel("attention", "kn_attn_prefill"), 3, NH, 1, 128, pa);
    down(out, dout[2], qn * 4);
    CLOSE("  then prefill tiles, q = out", out, ref, qn, 1e-4);
    CUdeviceptr all[] = {dk, dv, dcs, dout[0], dout[1], dout[2], pacc, pml, dt0, dnt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu.free(all[i]);
    free(cs);
  }
  cu.free(dqkv), cu.free(dseq), cu.free(dpos), cu.free(dbt), cu.free(dwq), cu.free(dwk);
  free(k0), free(v0), free(qkv), free(k), free(v), free(ref), free(out), free(got);
  free(wqn), free(wkn);
}

typedef struct pick_set {
  float temperature, top_p;
  int top_k;
  float min_p;
} pick_set;

/* The id of the j-th largest logit of x (lower id first among equals). */
static int32_t rank_id(const float *x, int vocab, int j) {
  int32_t ids[PICK_TOP];
  float lps[PICK_TOP];
  sampler_top_logprobs(x, vocab, 0.0, j + 1 < vocab ? j + 1 : vocab, ids, lps);
  return ids[j + 1 < vocab ? j : vocab - 1];
}

/* The lowest id in [0, vocab) not among ids[0..n) (-1s skipped). */
static int32_t free_id(const int32_t *ids, int n, int vocab) {
  for (int32_t v = 0; v < vocab; v++) {
    bool used = false;
    for (int i = 0; i < n; i++) used |= ids[i] == v;
    if (!used) return v;
  }
  return 0;
}

/* kn_pick over rows x (rows, vocab) for every setting and seed against runtime/model/sampler.c;
 * returns the picks, and adds the matches and the largest logprob error. */
static pick_res *pick_rows(const char *what, const float *x, int vocab, int rows,
                           const pick_set *set, int n_set, int seeds, double *lp_err) {
  enum { PEN = 6 };
  const int n = n_set * rows * seeds;
  pick_req *req = malloc(sizeof *req * (size_t)n);
  int32_t *want = malloc(sizeof *want * (size_t)n), *pen_ids = malloc(sizeof(int32_t) * PEN * n);
  float *pen_sub = malloc(sizeof(float) * PEN * (size_t)n);
  int n_pen = 0;
  for (int si = 0, k = 0; si < n_set; si++)
    for (int r = 0; r < rows; r++)
      for (int seed = 0; seed < seeds; seed++, k++) {
        irt_sampling p = {set[si].temperature, set[si].top_k, set[si].top_p, 1000u * seed + 7u,
                          set[si].min_p};
        irt_sampler *cpu, *dev;
        irt_error err;
        CHECK(irt_sampler_create(&p, vocab, &cpu, &err) == IRT_OK);
        CHECK(irt_sampler_create(&p, vocab, &dev, &err) == IRT_OK);
        want[k] = irt_sampler_sample(cpu, x + (size_t)r * vocab);
        req[k] = (pick_req){p.temperature,
                            p.top_p,
                            p.top_k,
                            r,
                            p.temperature > 0 ? sampler_draw(dev) : 0.0,
                            k % 3 == 0   ? PICK_TOP
                            : k % 3 == 1 ? 0
                                         : 5,
                            0,
                            0,
                            p.min_p};
        if (k % 4 == 1) { /* penalties on the row's PEN best ids, and a few others */
          req[k].n_pen = PEN, req[k].pen_off = n_pen;
          for (int j = 0; j < PEN; j++) {
            int32_t id =
                j < PEN / 2 ? rank_id(x + (size_t)r * vocab, vocab, j) : (j * 7919) % vocab;
            bool dup = false;
            for (int i = n_pen; i < n_pen + j; i++) dup |= pen_ids[i] == id;
            pen_ids[n_pen + j] = dup ? -1 : id; /* distinct ids only */
            pen_sub[n_pen + j] = 0.4f + 0.3f * (float)(j % 3);
          }
          for (int j = 0; j < PEN; j++) /* a duplicate becomes another unused id */
            if (pen_ids[n_pen + j] < 0) pen_ids[n_pen + j] = free_id(pen_ids + n_pen, PEN, vocab);
          float *w = malloc(sizeof(float) * (size_t)vocab);
          memcpy(w, x + (size_t)r * vocab, sizeof(float) * (size_t)vocab);
          for (int j = 0; j < PEN; j++) w[pen_ids[n_pen + j]] -= pen_sub[n_pen + j];
          want[k] = sampler_sample_u(cpu, w, req[k].u);
          free(w);
          n_pen += PEN;
        }
        irt_sampler_destroy(cpu), irt_sampler_destroy(dev);
      }
  CUdeviceptr dx = up(x, sizeof(float) * (size_t)vocab * rows);
  CUdeviceptr dreq = up(req, sizeof *req * (size_t)n);
  CUdeviceptr dout = poisoned(sizeof(pick_res) * (size_t)n);
  CUdeviceptr dtop = poisoned(sizeof(pick_res) * (size_t)n * PICK_TOP);
  CUdeviceptr dwork = poisoned(sizeof(float) * (size_t)n * vocab);
  CUdeviceptr dpid = up(pen_ids, sizeof(int32_t) * (size_t)(n_pen ? n_pen : 1));
  CUdeviceptr dpsub = up(pen_sub, sizeof(float) * (size_t)(n_pen ? n_pen : 1));
  void *args[] = {&dout, &dtop, &dx, &dreq, &vocab, &dwork, &dpid, &dpsub};
  run(kernel("sampling", "kn_pick"), (unsigned)n, 1, 1, 1024, args);
  pick_res *out = malloc(sizeof *out * (size_t)n);
  pick_res *top = malloc(sizeof *top * (size_t)n * PICK_TOP);
  down(out, dout, sizeof *out * (size_t)n);
  down(top, dtop, sizeof *top * (size_t)n * PICK_TOP);
  int same = 0, top_bad = 0;
  for (int k = 0; k < n; k++) {
    int r = req[k].row, t = out[k].token;
    same += t == want[k];
    CHECKF(t == want[k],
           "%s pick %d (T %.2f top_k %d top_p %.2f min_p %g row %d u %.17g): %d, want %d", what, k,
           req[k].temperature, req[k].top_k, req[k].top_p, req[k].min_p, r, req[k].u, t, want[k]);
    if (t < 0 || t >= vocab) continue;
    const float *row = x + (size_t)r * vocab;
    double lse = kn_log_sum_exp(row, vocab), e = fabs(out[k].logprob - ((double)row[t] - lse));
    if (!(e <= *lp_err)) *lp_err = e;
    int32_t ids[PICK_TOP];
    float lps[PICK_TOP];
    int nt = req[k].n_top < vocab ? req[k].n_top : vocab;
    sampler_top_logprobs(row, vocab, lse, nt, ids, lps);
    for (int j = 0; j < nt; j++) {
      const pick_res *g = &top[(size_t)k * PICK_TOP + j];
      top_bad += g->token != ids[j];
      if (!(fabs(g->logprob - lps[j]) <= *lp_err)) *lp_err = fabs(g->logprob - lps[j]);
    }
  }
  printf("  pick, %-22s %d/%d tokens as the CPU sampler, %d alternatives differ\n", what, same, n,
         top_bad);
  CHECKF(top_bad == 0, "%s: %d alternatives differ", what, top_bad);
  cu.free(dx), cu.free(dreq), cu.free(dout), cu.free(dtop), cu.free(dwork), cu.free(dpid);
  cu.free(dpsub);
  free(req), free(want), free(top), free(pen_ids), free(pen_sub);
  return out;
}

/* sampling.cu kn_pick against runtime/model/sampler.c, the function it must equal: for each
 * setting and seed, the CPU sampler samples the row while a sampler of the same seed hands
 * its draw to the kernel; the tokens must be the same and the logprob the token's
 * log-softmax (kn_log_sum_exp). Rows: spread logits with a few peaks, bf16-rounded ones
 * (many equal logits), one all equal; then small vocabularies (fewer ids than threads, or
 * than a warp) with masked (-inf) ids, large logits and extreme settings. */
static void test_pick(void) {
  enum { VOCAB = 49152, SMALL = 1000, TINY = 7 };
  static const pick_set set[] = {
      {0.0f, 1.0f, 0, 0},     {1.0f, 1.0f, 0, 0},      {0.7f, 0.95f, 0, 0},   {0.8f, 0.9f, 40, 0},
      {1.5f, 1.0f, 1, 0},     {1.0f, 0.5f, 0, 0},      {0.3f, 1.0f, 5000, 0}, {2.0f, 0.99f, 100, 0},
      {1.0f, 1.0f, 0, 0.05f}, {1.5f, 0.9f, 50, 0.02f}, {0.8f, 1.0f, 0, 0.5f}};
  static const pick_set edge[] = {
      {0.05f, 1.0f, 0, 0}, {1.0f, 0.01f, 0, 0},   {3.0f, 1.0f, 2000, 0},  {1.0f, 0.999f, 3, 0},
      {0.0f, 1.0f, 0, 0},  {1.0f, 1.0f, 0, 1.0f}, {2.0f, 1.0f, 0, 0.001f}};
  float *x = malloc(sizeof(float) * VOCAB * 3), *y = malloc(sizeof(float) * SMALL * 2);
  for (int i = 0; i < VOCAB; i++) {
    float g = frand() + frand() + frand(); /* about normal */
    x[i] = 4.0f * g + (i % 997 == 0 ? 12.0f * frand() + 6.0f : 0.0f);
    x[VOCAB + i] = ir_bf16_to_f32(ir_f32_to_bf16(3.0f * g));
    x[2 * VOCAB + i] = 0.25f;
  }
  x[17] = x[4000] = 30.0f; /* a tie for the max: the lower id is the argmax */
  for (int i = 0; i < SMALL; i++) {
    y[i] = i % 3 ? 5.0f * frand() : -INFINITY; /* a third masked */
    y[SMALL + i] = 3000.0f + 20.0f * frand();  /* far from zero */
  }
  double lp_err = 0;
  pick_res *out = pick_rows("49152 ids", x, VOCAB, 3, set, 11, 6, &lp_err);
  CHECK(out[0].token == 17); /* greedy on row 0: the tie's lower id */
  free(out);
  free(pick_rows("1000 ids, edge cases", y, SMALL, 2, edge, 7, 4, &lp_err));
  free(pick_rows("7 ids", y + SMALL + 100, TINY, 1, set, 11, 4, &lp_err));
  printf("  pick: logprob err %.2e\n", lp_err);
  CHECKF(lp_err <= 1e-5, "logprob err %.3e", lp_err);
  free(x), free(y);
}

/* The producers' _h forms (rms_norm.cu, swiglu.cu): the same f32 output as the plain kernel,
 * and beside it the f16 / bf16 copy a cuBLAS GEMM reads, bit for bit kn_cast_*'s rounding
 * of that output (ir_f32_to_f16 / ir_f32_to_bf16). */
static int half_diffs(const uint16_t *h, const float *x, size_t n, int bf16) {
  int bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != (bf16 ? ir_f32_to_bf16(x[i]) : ir_f32_to_f16(x[i]));
  return bad;
}

static void test_half_copies(void) {
  const int rows = 7, dim = 576;
  const long long m = rows, hn = 300;
  const float eps = 1e-5f;
  const size_t n = (size_t)rows * dim, nz = (size_t)(m * 2 * hn);
  float *a = frands(n), *b = frands(n), *w = frands(dim), *z = frands(nz);
  float *ref = malloc(n * 4), *ref_sum = malloc(n * 4), *out = malloc(n * 4);
  float *sum = malloc(n * 4);
  uint16_t *h = malloc(n * 2);
  CUdeviceptr da = up(a, n * 4), db = up(b, n * 4), dw = up(w, dim * 4), dz = up(z, nz * 4);
  for (int bf16 = 0; bf16 <= 1; bf16++) {
    CUdeviceptr dout = poisoned(n * 4), dsum = poisoned(n * 4), dh = poisoned(n * 2);
    void *a1[] = {&dout, &dh, &da, &dw, (void *)&dim, (void *)&eps, &bf16};
    run(kernel("rms_norm", "kn_rms_norm_h"), rows, 1, 1, 256, a1);
    down(out, dout, n * 4), down(h, dh, n * 2);
    kn_rms_norm(NULL, ref, a, w, rows, dim, eps);
    CLOSE(bf16 ? "rms_norm_h (bf16 copy)" : "rms_norm_h (f16 copy)", out, ref, n, 1e-5);
    int bad = half_diffs(h, out, n, bf16);
    void *a2[] = {&dout, &dh, &dsum, &da, &db, &dw, (void *)&dim, (void *)&eps, &bf16};
    run(kernel("rms_norm", "kn_add_rms_norm_h"), rows, 1, 1, 256, a2);
    down(out, dout, n * 4), down(sum, dsum, n * 4), down(h, dh, n * 2);
    kn_add_rms_norm(NULL, ref, ref_sum, a, b, w, rows, dim, eps);
    CLOSE("add_rms_norm_h (sum)", sum, ref_sum, n, 1e-6);
    CLOSE("add_rms_norm_h", out, ref, n, 1e-5);
    bad += half_diffs(h, out, n, bf16);
    CUdeviceptr dy = poisoned((size_t)(m * hn) * 4);
    void *a3[] = {&dy, &dh, &dz, (void *)&m, (void *)&hn, &bf16};
    run(kernel("swiglu", "kn_swiglu_packed_h"), 3, 1, 1, 128, a3);
    down(out, dy, (size_t)(m * hn) * 4), down(h, dh, (size_t)(m * hn) * 2);
    for (long long i = 0; i < m * hn; i++) {
      const float g = z[i / hn * 2 * hn + i % hn], u = z[i / hn * 2 * hn + hn + i % hn];
      ref[i] = g / (1.0f + expf(-g)) * u;
    }
    CLOSE("swiglu_packed_h", out, ref, (size_t)(m * hn), 1e-6);
    bad += half_diffs(h, out, (size_t)(m * hn), bf16);
    printf("  _h copies, %s                %d of %zu differ from the cast\n",
           bf16 ? "bf16" : "f16 ", bad, 2 * n + (size_t)(m * hn));
    CHECK(bad == 0);
    cu.free(dout), cu.free(dsum), cu.free(dh), cu.free(dy);
  }
  cu.free(da), cu.free(db), cu.free(dw), cu.free(dz);
  free(a), free(b), free(w), free(z), free(ref), free(ref_sum), free(out), free(sum), free(h);
}

/* cast.cu: activations to f16 / bf16 for cuBLAS (bit-exact against ir_f32_to_f16 /
 * ir_f32_to_bf16, both round to nearest even) and the bias add after the GEMM. */
static void test_cast(void) {
  const long long n = 70001, rows = 37, cols = 1891;
  float *x = frands((size_t)n);
  for (long long i = 0; i < n; i++) x[i] *= (float)(1 << (i % 24)) / 4096.0f; /* wide range */
  uint16_t *h = malloc((size_t)n * 2);
  CUdeviceptr dx = up(x, (size_t)n * 4), dh = poisoned((size_t)n * 2);
  void *args[] = {&dh, &dx, (void *)&n};
  int bad16 = 0, bad_bf = 0;
  run(kernel("cast", "kn_cast_f16"), 64, 1, 1, 256, args);
  down(h, dh, (size_t)n * 2);
  for (long long i = 0; i < n; i++) bad16 += h[i] != ir_f32_to_f16(x[i]);
  run(kernel("cast", "kn_cast_bf16"), 64, 1, 1, 256, args);
  down(h, dh, (size_t)n * 2);
  for (long long i = 0; i < n; i++) bad_bf += h[i] != ir_f32_to_bf16(x[i]);
  printf("  cast f16 / bf16               %d / %d of %lld differ\n", bad16, bad_bf, n);
  CHECK(bad16 == 0 && bad_bf == 0);
  float *y = frands((size_t)(rows * cols)), *b = frands((size_t)cols);
  float *ref = malloc((size_t)(rows * cols) * 4);
  for (long long i = 0; i < rows * cols; i++) ref[i] = y[i] + b[i % cols];
  CUdeviceptr dy = up(y, (size_t)(rows * cols) * 4), db = up(b, (size_t)cols * 4);
  void *bargs[] = {&dy, &db, (void *)&rows, (void *)&cols};
  run(kernel("cast", "kn_add_bias"), 128, 1, 1, 256, bargs);
  down(y, dy, (size_t)(rows * cols) * 4);
  CLOSE("add_bias", y, ref, (size_t)(rows * cols), 0);
  cu.free(dx), cu.free(dh), cu.free(dy), cu.free(db);
  free(x), free(h), free(y), free(b), free(ref);
}

/* cast.cu kn_dequant_*: ggml blocks (made by kn_quant_row from values over 2^-12 .. 2^11)
 * to f16, bit-exact against ir_f32_to_f16 of the CPU's kn_dequant_row; a grid smaller than
 * the work covers it by striding. */
static void test_dequant(void) {
  const ir_dtype dts[] = {IR_Q8_0, IR_Q4_0, IR_Q4_1};
  const long long blocks = 1031, n = blocks * 32;
  float *x = frands((size_t)n), *ref = malloc((size_t)n * 4);
  for (long long i = 0; i < n; i++) x[i] *= (float)(1 << (i / 32 % 24)) / 4096.0f;
  uint8_t *q = malloc((size_t)blocks * 34);
  uint16_t *h = malloc((size_t)n * 2);
  for (int t = 0; t < 3; t++) {
    kn_quant_row(x, dts[t], q, n);
    kn_dequant_row(q, dts[t], ref, n);
    CUdeviceptr dq = up(q, (size_t)(blocks * kn_quant_block_bytes(dts[t]))),
                dh = poisoned((size_t)n * 2);
    char fn[32];
    snprintf(fn, sizeof fn, "kn_dequant_%s", ir_dtype_name(dts[t]));
    void *args[] = {&dh, &dq, (void *)&blocks};
    run(kernel("cast", fn), 3, 1, 1, 256, args);
    down(h, dh, (size_t)n * 2);
    int bad = 0;
    for (long long i = 0; i < n; i++) bad += h[i] != ir_f32_to_f16(ref[i]);
    printf("  dequant %-4s to f16           %d of %lld differ\n", ir_dtype_name(dts[t]), bad, n);
    CHECKF(bad == 0, "%s: %d values differ", fn, bad);
    cu.free(dq), cu.free(dh);
  }
  free(x), free(ref), free(q), free(h);
}

int main(void) {
#ifdef CUDA_OPS_EMU
  cu_open();
  printf("device: cpu emulator\n");
#else
  const char *why = cu_open();
  ir_diag d = {0};
  if (!why && infc_nvrtc_open(&nv, &d) != IR_OK) why = d.msg;
  if (nv) infc_nvrtc_set_cache(nv, getenv("INFC_CACHE_DIR")); /* the tests' shared cache */
  if (why) return tcheck_skip("cuda_ops", why);
  printf("device sm_%d\n", arch);
#endif
  printf("head_dim %d%s\n", HD, ATTENTION_ONLY ? ", attention alone" : "");
  srand(1234);
  if (!ATTENTION_ONLY) {
    test_elementwise();
    test_norms();
    test_rows();
    test_gemv();
    test_gemv_wq();
    test_dequant_wq();
    test_dequant();
    test_rope();
  }
  test_attention();
  test_attention_f16();
  test_fused_attention();
  test_attention_window();
  if (!ATTENTION_ONLY) {
    test_gemv_swiglu();
    test_pick();
    test_cast();
    test_half_copies();
  }
#ifndef CUDA_OPS_EMU
  infc_nvrtc_close(nv);
#endif
  return tcheck_done("cuda_ops");
}
