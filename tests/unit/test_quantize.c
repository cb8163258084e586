/* test_quantize: int8 / int4 weights with separate scales and zero points (matmul inputs
 * 3, 4) and W8A8. Kernels against a double-precision reference computed here from the
 * stored integers (not through the kernel's own dequantizer), on every instruction set
 * the CPU has; the SIMD paths bit for bit equal to kn_matmul on the dequantized W; batch
 * invariance; W8A8 bit-exact against the documented per-row quantization on every path,
 * AMX-INT8 (where the CPU has it) bit for bit AVX512-VNNI;
 * the IR rules; plan round trip; pass_quantize (error bounds, what it converts); and
 * SmoothQuant smoothing (f32 outputs kept, W8A8 error with an outlier channel reduced). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "ir_plan.h"
#include "kn_cpu.h"
#include "kn_matmul_wq.h"
#include "pass.h"
#include "ir_lazy.h"
#include "pass_quantize.h"
#include "tcheck.h"
#include "tref.h"

/* ---- helpers ------------------------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 32);
}

static float rnd(void) { return (float)(rnd_u32() >> 8) * (1.0f / (1 << 23)) - 1.0f; }

static float *rnd_vec(int64_t n) {
  float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = rnd();
  return v;
}

/* A random quantized W (n, k) and its parameters; owns its buffers. */
typedef struct qmat {
  kn_wq w;
  void *q, *s, *z;
  int64_t n, k;
} qmat;

static qmat qmat_make(ir_dtype qt, int64_t n, int64_t k, int64_t group, ir_dtype st,
                      ir_dtype zt /* IR_DTYPE_INVALID: symmetric */) {
  qmat m = {.n = n, .k = k};
  int64_t ng = k / group, qb = (int64_t)ir_dtype_bytes(qt, (uint64_t)(n * k));
  m.q = malloc((size_t)qb);
  for (int64_t i = 0; i < qb; i++) ((uint8_t *)m.q)[i] = (uint8_t)rnd_u32();
  m.s = malloc((size_t)(n * ng) * 4);
  for (int64_t i = 0; i < n * ng; i++) {
    float v = (0.002f + 0.048f * fabsf(rnd())) * (rnd() < 0 ? -1.0f : 1.0f);
    if (st == IR_F16) ((uint16_t *)m.s)[i] = ir_f32_to_f16(v);
    else ((float *)m.s)[i] = v;
  }
  if (zt != IR_DTYPE_INVALID) {
    m.z = malloc((size_t)(n * ng) * 4);
    for (int64_t i = 0; i < n * ng; i++) {
      /* fractional zero points: multiples of 1/64, exact in f16 (so q - z is exact) */
      float zf = (qt == IR_I4 ? 7.5f : 0.0f) + 8.0f * rnd();
      zf = (float)lrintf(zf * 64.0f) / 64.0f;
      if (zt == IR_F16) ((uint16_t *)m.z)[i] = ir_f32_to_f16(zf);
      else if (zt == IR_F32) ((float *)m.z)[i] = zf;
      else
        ((uint8_t *)m.z)[i] =
            qt == IR_I4 ? (uint8_t)(rnd_u32() % 16) : (uint8_t)(rnd_u32() % 41 - 20);
    }
  }
  m.w = (kn_wq){.q = m.q,
                .qt = qt,
                .scales = m.s,
                .st = st,
                .zp = m.z,
                .zt = zt != IR_DTYPE_INVALID ? zt : IR_U8,
                .group = group};
  return m;
}

static void qmat_free(qmat *m) { free(m->q), free(m->s), free(m->z); }

/* The stored integers read back by hand: q, zero point and scale of element (j, i). */
static double ref_value(const qmat *m, int64_t j, int64_t i) {
  const kn_wq *w = &m->w;
  int64_t g = j * (m->k / w->group) + i / w->group;
  int q;
  if (w->qt == IR_I8) {
    q = ((const int8_t *)w->q)[j * m->k + i];
  } else {
    uint8_t b = ((const uint8_t *)w->q)[(j * m->k + i) >> 1];
    q = (i & 1) ? b >> 4 : b & 0x0f;
  }
  double z = !w->zp            ? (w->qt == IR_I4 ? 8 : 0)
             : w->zt == IR_I8  ? ((const int8_t *)w->zp)[g]
             : w->zt == IR_F16 ? ir_f16_to_f32(((const uint16_t *)w->zp)[g])
             : w->zt == IR_F32 ? ((const float *)w->zp)[g]
                               : ((const uint8_t *)w->zp)[g];
  double s = w->st == IR_F16 ? ir_f16_to_f32(((const uint16_t *)w->scales)[g])
                             : ((const float *)w->scales)[g];
  return (double)(q - z) * s;
}

/* W dequantized as f32 (the kernel's contract: (q - z) * s rounded once). */
static float *ref_matrix(const qmat *m) {
  float *w = malloc((size_t)(m->n * m->k) * sizeof *w);
  for (int64_t j = 0; j < m->n; j++)
    for (int64_t i = 0; i < m->k; i++) w[j * m->k + i] = (float)ref_value(m, j, i);
  return w;
}

/* ---- weight-only kernels --------------------------------------------------------------- */

static void test_values(void) {
  /* int4: element 2t is the low nibble of byte t; symmetric zero point 8 */
  uint8_t q4[2] = {0x21, 0xf0};
  float s[1] = {0.5f};
  kn_wq w = {.q = q4, .qt = IR_I4, .scales = s, .st = IR_F32, .group = 4};
  CHECK(kn_wq_value(&w, 4, 0, 0) == (1 - 8) * 0.5f && kn_wq_value(&w, 4, 0, 1) == (2 - 8) * 0.5f);
  CHECK(kn_wq_value(&w, 4, 0, 2) == -4.0f && kn_wq_value(&w, 4, 0, 3) == 3.5f);
  uint8_t zp[1] = {3};
  w.zp = zp, w.zt = IR_U8;
  CHECK(kn_wq_value(&w, 4, 0, 3) == 6.0f);
  /* int8: signed, zero point 0 unless given (i8 zero points are signed) */
  int8_t q8[2] = {-128, 127};
  uint16_t s16[1] = {ir_f32_to_f16(0.25f)};
  int8_t z8[1] = {-2};
  kn_wq w8 = {.q = q8, .qt = IR_I8, .scales = s16, .st = IR_F16, .group = 2};
  CHECK(kn_wq_value(&w8, 2, 0, 0) == -32.0f && kn_wq_value(&w8, 2, 0, 1) == 31.75f);
  w8.zp = z8, w8.zt = IR_I8;
  CHECK(kn_wq_value(&w8, 2, 0, 0) == -31.5f);
}

typedef struct wq_case {
  ir_dtype qt;
  int64_t m, n, k, group;
  ir_dtype st, zt;
} wq_case;

static const wq_case k_cases[] = {
    {IR_I4, 1, 13, 64, 32, IR_F32, IR_DTYPE_INVALID},
    {IR_I4, 5, 37, 128, 32, IR_F16, IR_U8},
    {IR_I4, 9, 20, 256, 64, IR_F16, IR_DTYPE_INVALID},
    {IR_I4, 3, 24, 384, 128, IR_F32, IR_U8},
    {IR_I4, 2, 8, 96, 96, IR_F32, IR_DTYPE_INVALID}, /* per channel */
    {IR_I4, 3, 21, 128, 32, IR_F16, IR_F16},         /* fractional zero points */
    {IR_I4, 1, 9, 64, 64, IR_F32, IR_F32},
    {IR_I8, 2, 10, 64, 32, IR_F16, IR_F16},
    {IR_I4, 4, 11, 40, 8, IR_F32, IR_U8},            /* group % 16 != 0: portable */
    {IR_I4, 3, 9, 42, 42, IR_F16, IR_DTYPE_INVALID}, /* k % 16 != 0: portable, tail */
    {IR_I8, 1, 19, 576, 576, IR_F32, IR_DTYPE_INVALID},
    {IR_I8, 6, 17, 160, 32, IR_F16, IR_I8},
    {IR_I8, 7, 33, 64, 16, IR_F32, IR_U8},
    {IR_I8, 2, 5, 30, 30, IR_F32, IR_I8},
};

/* Against the double-precision product of x and the dequantized W, and (SIMD paths, k and
 * group multiples of 16) bit for bit against kn_matmul on the f32 dequantized W. */
static void test_wq_matmul(kn_pool *p, int isa) {
  for (size_t c = 0; c < sizeof k_cases / sizeof *k_cases; c++) {
    const wq_case *t = &k_cases[c];
    qmat m = qmat_make(t->qt, t->n, t->k, t->group, t->st, t->zt);
    float *x = rnd_vec(t->m * t->k), *bias = rnd_vec(t->n), *wf = ref_matrix(&m);
    float *y = calloc((size_t)(t->m * t->n), sizeof *y), *yf = calloc((size_t)(t->m * t->n), 4);
    for (int b = 0; b < 2; b++) {
      const float *bb = b ? bias : NULL;
      kn_matmul_wq(p, y, x, &m.w, bb, t->m, t->n, t->k, KN_WQ_ACT_NONE);
      CHECKF(tref_matmul_ok(y, x, wf, bb, t->m, t->n, t->k, 2e-5),
             "isa %d case %zu (%s k=%lld group=%lld)", isa, c, ir_dtype_name(t->qt),
             (long long)t->k, (long long)t->group);
      if (isa > 0 && t->k % 16 == 0 && t->group % 16 == 0) {
        kn_matmul(p, yf, x, wf, IR_F32, bb, t->m, t->n, t->k);
        CHECKF(!memcmp(y, yf, (size_t)(t->m * t->n) * 4), "isa %d case %zu: not kn_matmul's bits",
               isa, c);
      }
    }
    for (int64_t j = 0; j < t->n; j += 3)
      CHECK(kn_wq_value(&m.w, t->k, j, t->k - 1) == wf[j * t->k + t->k - 1]);
    free(x), free(bias), free(wf), free(y), free(yf);
    qmat_free(&m);
  }
}

/* Each row alone (m = 1, one thread) equals that row inside a batch on four threads. */
static void test_invariance(kn_pool *p1, kn_pool *p4, ir_dtype qt, bool w8a8, int act, int64_t m,
                            int64_t n, int64_t k, int64_t group) {
  qmat q = qmat_make(qt, n, k, group, IR_F16, IR_DTYPE_INVALID);
  float *x = rnd_vec(m * k), *bias = rnd_vec(n);
  float *yb = calloc((size_t)(m * n), 4), *y1 = calloc((size_t)n, 4);
  (w8a8 ? kn_matmul_w8a8 : kn_matmul_wq)(p4, yb, x, &q.w, bias, m, n, k, act);
  int bad = 0;
  int64_t ny = act == KN_WQ_ACT_SWIGLU ? n / 2 : n;
  for (int64_t i = 0; i < m; i += (m > 40 ? 7 : 1)) {
    (w8a8 ? kn_matmul_w8a8 : kn_matmul_wq)(p1, y1, x + i * k, &q.w, bias, 1, n, k, act);
    bad += memcmp(y1, yb + i * ny, (size_t)ny * 4) != 0;
  }
  CHECKF(bad == 0, "%s%s m=%lld: %d rows differ alone vs batched", ir_dtype_name(qt),
         w8a8 ? " w8a8" : "", (long long)m, bad);
  free(x), free(bias), free(yb), free(y1);
  qmat_free(&q);
}

/* act = swiglu: bit for bit the plain matmul (gate rows, up rows) then kn_swiglu. */
static void test_swiglu(kn_pool *p, bool w8a8, ir_dtype qt, int64_t m, int64_t n, int64_t k,
                        int64_t group) {
  qmat q = qmat_make(qt, 2 * n, k, group, IR_F32, IR_DTYPE_INVALID);
  float *x = rnd_vec(m * k), *bias = rnd_vec(2 * n);
  float *z = calloc((size_t)(m * 2 * n), 4), *y = calloc((size_t)(m * n), 4);
  float *want = calloc((size_t)(m * n), 4);
  void (*mm)(kn_pool *, float *, const float *, const kn_wq *, const float *, int64_t, int64_t,
             int64_t, int) = w8a8 ? kn_matmul_w8a8 : kn_matmul_wq;
  mm(p, z, x, &q.w, bias, m, 2 * n, k, KN_WQ_ACT_NONE);
  for (int64_t i = 0; i < m; i++)
    kn_swiglu(NULL, want + i * n, z + i * 2 * n, z + i * 2 * n + n, n);
  mm(p, y, x, &q.w, bias, m, 2 * n, k, KN_WQ_ACT_SWIGLU);
  CHECKF(!memcmp(y, want, (size_t)(m * n) * 4), "swiglu epilogue %s%s m=%lld n=%lld",
         ir_dtype_name(qt), w8a8 ? " w8a8" : "", (long long)m, (long long)n);
  free(x), free(bias), free(z), free(y), free(want);
  qmat_free(&q);
}

/* ---- W8A8 --------------------------------------------------------------------------------- */

/* The documented per-row quantization, written out here independently. */
static void ref_quant_row(const float *x, int64_t k, int8_t *q, float *scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; i++)
    if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
  float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t i = 0; i < k; i++) {
    float v = x[i] * inv;
    q[i] = (int8_t)(v >= 127.0f ? 127 : v <= -127.0f ? -127 : (int)nearbyintf(v));
  }
  *scale = amax / 127.0f;
}

static void test_w8a8(kn_pool *p, int isa, int64_t m, int64_t n, int64_t k) {
  qmat q = qmat_make(IR_I8, n, k, k, IR_F32, IR_DTYPE_INVALID);
  float *x = rnd_vec(m * k), *bias = rnd_vec(n), *wf = ref_matrix(&q);
  for (int64_t i = 0; i < k; i++) x[i] = 0.0f; /* a zero row: scale 0, output = bias */
  if (m > 2) x[2 * k + 1] = 40.0f;             /* an outlier row */
  float *y = calloc((size_t)(m * n), 4);
  int8_t *xq = malloc((size_t)k);
  kn_matmul_w8a8(p, y, x, &q.w, bias, m, n, k, KN_WQ_ACT_NONE);
  int exact = 0, near = 0;
  for (int64_t i = 0; i < m; i++) {
    float sx;
    ref_quant_row(x + i * k, k, xq, &sx);
    for (int64_t j = 0; j < n; j++) {
      int64_t dot = 0;
      double ref = bias[j], wabs = 0.0;
      for (int64_t l = 0; l < k; l++) {
        dot += (int64_t)xq[l] * ((const int8_t *)q.q)[j * k + l];
        ref += (double)x[i * k + l] * wf[j * k + l];
        wabs += fabs(wf[j * k + l]);
      }
      float want = (float)dot * (sx * ((const float *)q.s)[j]) + bias[j];
      exact += y[i * n + j] == want;
      /* rounding x to the grid moves each term by at most sx/2 * |w| */
      near += fabs(y[i * n + j] - ref) <= 0.5 * sx * wabs * (1 + 1e-5) + 1e-5 * fabs(ref) + 1e-6;
    }
  }
  CHECKF(exact == m * n, "w8a8 isa %d (%s) m=%lld k=%lld: %d of %lld bit-exact", isa,
         kn_matmul_w8a8_path(), (long long)m, (long long)k, exact, (long long)(m * n));
  CHECKF(near == m * n, "w8a8 isa %d: %d of %lld within the activation-rounding bound", isa, near,
         (long long)(m * n));
  free(x), free(bias), free(wf), free(y), free(xq);
  qmat_free(&q);
}

/* The documented W8A8 result with bias (or none) and the swiglu epilogue, from the stored
 * integers; y is (m, n) or (m, n / 2) with swiglu. */
static void ref_w8a8(float *y, const float *x, const qmat *q, const float *bias, int64_t m,
                     int64_t n, int64_t k, int act) {
  int64_t ny = act == KN_WQ_ACT_SWIGLU ? n / 2 : n;
  int8_t *xq = malloc((size_t)k);
  float *z = malloc((size_t)n * 4);
  for (int64_t i = 0; i < m; i++) {
    float sx;
    ref_quant_row(x + i * k, k, xq, &sx);
    for (int64_t j = 0; j < n; j++) {
      int64_t dot = 0;
      for (int64_t l = 0; l < k; l++) dot += (int64_t)xq[l] * ((const int8_t *)q->q)[j * k + l];
      z[j] = (float)dot * (sx * ((const float *)q->s)[j]);
      if (bias) z[j] += bias[j]; /* not + 0.0f: that would turn -0 into +0 */
    }
    for (int64_t j = 0; j < ny; j++)
      y[i * ny + j] = act == KN_WQ_ACT_SWIGLU ? kn_silu_mul(z[j], z[ny + j]) : z[j];
  }
  free(xq), free(z);
}

/* One shape against the documented result, bit for bit: from 16 rows on AVX512-VNNI
 * without AMX, prefill's tiles take the interleaved W (w8x_tile) -- row groups of 6 and
 * their leftovers, 16-column groups and a partial last one, k tails within a quad and a
 * 64-byte step, swiglu's gate and up groups, bias or none. */
static void w8a8_ref_case(kn_pool *p, int64_t m, int64_t n, int64_t k, bool with_bias, int act) {
  qmat q = qmat_make(IR_I8, n, k, k, IR_F32, IR_DTYPE_INVALID);
  float *x = rnd_vec(m * k), *bias = with_bias ? rnd_vec(n) : NULL;
  int64_t ny = act == KN_WQ_ACT_SWIGLU ? n / 2 : n;
  size_t bytes = (size_t)(m * ny) * 4;
  float *y = malloc(bytes), *want = malloc(bytes);
  if (m > 1) x[k + 3] = 40.0f;                               /* an outlier row */
  for (int64_t i = 0; i < k; i++) x[(m - 1) * k + i] = 0.0f; /* a zero row: the bias */
  kn_matmul_w8a8(p, y, x, &q.w, bias, m, n, k, act);
  ref_w8a8(want, x, &q, bias, m, n, k, act);
  CHECKF(!memcmp(y, want, bytes), "w8a8 %s m=%lld n=%lld k=%lld bias=%d act=%d: not the reference",
         kn_matmul_w8a8_path(), (long long)m, (long long)n, (long long)k, with_bias, act);
  free(x), free(bias), free(y), free(want);
  qmat_free(&q);
}

static void test_w8a8_shapes(kn_pool *p1, kn_pool *p4) {
  static const int64_t ms[] = {16, 17, 40, 64, 100}, ns[] = {16, 24, 40, 100},
                       ks[] = {64, 96, 99, 576};
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 4; c++)
        for (int v = 0; v < 8; v++) /* bias or none, swiglu or none, one thread or four */
          w8a8_ref_case(v & 4 ? p4 : p1, ms[a], ns[b], ks[c], v & 1,
                        v & 2 ? KN_WQ_ACT_SWIGLU : KN_WQ_ACT_NONE);
  w8a8_ref_case(p4, 256, 512, 576, true, KN_WQ_ACT_NONE); /* many tasks */
  w8a8_ref_case(p4, 600, 40, 96, true, KN_WQ_ACT_SWIGLU); /* two row tiles */
  w8a8_ref_case(p4, 192, 384, 1536, true, KN_WQ_ACT_SWIGLU);
  w8a8_ref_case(p4, 40, 24, 3000, false, KN_WQ_ACT_NONE); /* a tile of few columns */
}

/* One shape on AMX (isa 3, pool pa) and on AVX512-VNNI (isa 2, one thread): the same bits,
 * and the reference's. */
static void amx_case(kn_pool *pa, kn_pool *p1, int64_t m, int64_t n, int64_t k, bool with_bias,
                     int act) {
  qmat q = qmat_make(IR_I8, n, k, k, IR_F32, IR_DTYPE_INVALID);
  float *x = rnd_vec(m * k), *bias = with_bias ? rnd_vec(n) : NULL;
  int64_t ny = act == KN_WQ_ACT_SWIGLU ? n / 2 : n;
  size_t bytes = (size_t)(m * ny) * 4;
  float *ya = malloc(bytes), *yv = malloc(bytes), *want = malloc(bytes);
  if (m > 1) x[k + 3] = 40.0f; /* an outlier row */
  kn_matmul_wq_set_max_isa(3);
  kn_matmul_w8a8(pa, ya, x, &q.w, bias, m, n, k, act);
  kn_matmul_wq_set_max_isa(2);
  kn_matmul_w8a8(p1, yv, x, &q.w, bias, m, n, k, act);
  ref_w8a8(want, x, &q, bias, m, n, k, act);
  CHECKF(!memcmp(ya, yv, bytes) && !memcmp(ya, want, bytes),
         "amx m=%lld n=%lld k=%lld bias=%d act=%d: amx %s vnni, %s reference", (long long)m,
         (long long)n, (long long)k, with_bias, act,
         memcmp(ya, yv, bytes) ? "!=" : "==", memcmp(ya, want, bytes) ? "!=" : "==");
  free(x), free(bias), free(ya), free(yv), free(want);
  qmat_free(&q);
}

/* AMX-INT8 sums the same int32 dot products as VNNI: 16-row blocks with row leftovers,
 * column and W edges, k tails and the stack limit on k; the 4-thread pool runs the AMX
 * path on its workers, each loading its own tile configuration. */
static void test_w8a8_amx(kn_pool *p1, kn_pool *p4) {
  int prev = kn_matmul_wq_set_max_isa(3);
  bool amx = !strcmp(kn_matmul_w8a8_path(), "amx-int8");
  kn_matmul_wq_set_max_isa(prev);
  if (!amx) {
    printf("quantize: no AMX-INT8 on this CPU (or not allowed by the OS): AMX cases skipped\n");
    return;
  }
  static const int64_t ms[] = {16, 17, 40, 64, 100}, ns[] = {16, 24, 40, 100},
                       ks[] = {64, 96, 100, 576};
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 4; c++)
        for (int v = 0; v < 4; v++)
          amx_case(v & 2 ? p4 : p1, p1, ms[a], ns[b], ks[c], v & 1,
                   v & 2 ? KN_WQ_ACT_SWIGLU : KN_WQ_ACT_NONE);
  amx_case(p4, p1, 256, 512, 576, true, KN_WQ_ACT_NONE); /* many tasks: worker threads */
  amx_case(p4, p1, 192, 384, 1536, true, KN_WQ_ACT_SWIGLU);
  amx_case(p4, p1, 48, 40, 8192, false, KN_WQ_ACT_NONE); /* the longest k AMX takes */
  amx_case(p4, p1, 48, 40, 8193, false, KN_WQ_ACT_NONE); /* past it: VNNI */
  amx_case(p4, p1, 33, 15, 64, true, KN_WQ_ACT_NONE);    /* W under 16 rows: VNNI */
  kn_matmul_wq_set_max_isa(prev);
}

/* ---- IR rules and the plan ------------------------------------------------------------------ */

typedef struct ir_fix {
  ir_graph *g;
  int32_t x, w4, w8, s, s_bad, z, z_bad, wf;
} ir_fix;

static ir_fix ir_fix_make(void) {
  static uint8_t q[16 * 64], zb[16 * 4];
  static float sf[16 * 4], wfd[16 * 64];
  ir_fix f = {.g = ir_graph_create()};
  f.g->config =
      (ir_model_config){.max_tokens = 8, .max_seqs = 1, .max_logits = 1, .kv_block_size = 16};
  ir_dim xd[2] = {{.sym = IR_SYM_TOKENS}, {.n = 64}};
  f.x = ir_graph_add_input(f.g, "x", IR_F32, 2, xd);
  f.w4 = ir_graph_add_weight(f.g, "w4", IR_I4, 2, (int64_t[]){16, 64}, q, 16 * 32);
  f.w8 = ir_graph_add_weight(f.g, "w8", IR_I8, 2, (int64_t[]){16, 64}, q, 16 * 64);
  f.s = ir_graph_add_weight(f.g, "s", IR_F32, 2, (int64_t[]){16, 2}, sf, 16 * 2 * 4);
  f.s_bad = ir_graph_add_weight(f.g, "s3", IR_F32, 2, (int64_t[]){16, 3}, sf, 16 * 3 * 4);
  f.z = ir_graph_add_weight(f.g, "z", IR_U8, 2, (int64_t[]){16, 2}, zb, 16 * 2);
  f.z_bad = ir_graph_add_weight(f.g, "z4", IR_U8, 2, (int64_t[]){16, 4}, zb, 16 * 4);
  f.wf = ir_graph_add_weight(f.g, "wf", IR_F32, 2, (int64_t[]){16, 64}, wfd, 16 * 64 * 4);
  return f;
}

static bool add_mm(ir_fix *f, const char *name, int32_t w, int32_t s, int32_t z, bool a8,
                   const char *want_msg) {
  int32_t in[5] = {f->x, w, -1, s, z};
  ir_attr at = IR_AI(ir_attr_intern("act_int8"), 1);
  ir_diag d = {0};
  int32_t out;
  bool ok = ir_graph_add_node(f->g, IR_OP_MATMUL, name, in,
                              z >= 0   ? 5
                              : s >= 0 ? 4
                                       : 2,
                              a8 ? &at : NULL, a8 ? 1 : 0, &out, &d) >= 0;
  if (want_msg) CHECKF(!ok && strstr(d.msg, want_msg), "%s: '%s'", name, d.msg);
  else CHECKF(ok, "%s: %s", name, d.msg);
  return ok;
}

static void test_ir_rules(void) {
  ir_fix f = ir_fix_make();
  add_mm(&f, "i4_g32", f.w4, f.s, -1, false, NULL);
  add_mm(&f, "i4_g32_zp", f.w4, f.s, f.z, false, NULL);
  add_mm(&f, "i8_w8a8", f.w8, -1, -1, false, "needs scales");
  add_mm(&f, "i4_no_scales", f.w4, -1, -1, false, "needs scales");
  add_mm(&f, "i4_bad_group", f.w4, f.s_bad, -1, false, "equal groups");
  add_mm(&f, "i4_zp_shape", f.w4, f.s, f.z_bad, false, "z4");
  add_mm(&f, "i4_a8", f.w4, f.s, -1, true, "act_int8");
  add_mm(&f, "i8_a8_grouped", f.w8, f.s, -1, true, "act_int8");
  add_mm(&f, "f32_scales", f.wf, f.s, -1, false, "go with an i8, i4 or f8_e4m3");
  add_mm(&f, "f32_a8", f.wf, -1, -1, true, "act_int8 goes with an i8 weight");
  ir_diag d = {0};
  CHECK(ir_graph_add_output(f.g, ir_graph_find_tensor(f.g, "i4_g32_zp")));
  CHECKF(ir_graph_verify(f.g, &d) == IR_OK, "%s", d.msg);
  ir_graph_destroy(f.g);
}

/* A plan holding an i4 matmul with zero points and an i8 W8A8 one reads back the same. */
static void test_plan_round_trip(void) {
  static uint8_t q[8 * 64], z[8 * 2];
  static uint16_t s[8 * 2], s1[8];
  ir_graph *g = ir_graph_create();
  g->config =
      (ir_model_config){.max_tokens = 8, .max_seqs = 1, .max_logits = 1, .kv_block_size = 16};
  ir_dim xd[2] = {{.sym = IR_SYM_TOKENS}, {.n = 64}};
  int32_t x = ir_graph_add_input(g, "x", IR_F32, 2, xd);
  int32_t w4 = ir_graph_add_weight(g, "w4", IR_I4, 2, (int64_t[]){8, 64}, q, 8 * 32);
  int32_t w8 = ir_graph_add_weight(g, "w8", IR_I8, 2, (int64_t[]){8, 64}, q, 8 * 64);
  int32_t sc = ir_graph_add_weight(g, "s", IR_F16, 2, (int64_t[]){8, 2}, s, sizeof s);
  int32_t sc1 = ir_graph_add_weight(g, "s1", IR_F16, 2, (int64_t[]){8, 1}, s1, sizeof s1);
  int32_t zp = ir_graph_add_weight(g, "z", IR_U8, 2, (int64_t[]){8, 2}, z, sizeof z);
  ir_attr a8 = IR_AI(ir_attr_intern("act_int8"), 1);
  ir_diag d = {0};
  int32_t y4, y8;
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm4", (int32_t[]){x, w4, -1, sc, zp}, 5, NULL, 0, &y4,
                          &d) >= 0);
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm8", (int32_t[]){x, w8, -1, sc1}, 4, &a8, 1, &y8,
                          &d) >= 0);
  CHECK(ir_graph_add_output(g, y4) && ir_graph_add_output(g, y8));
  pass_opts o = {0};
  pass_log log = {0};
  CHECKF(pass_memory_plan(g, &o, &log, &d) == IR_OK, "%s", d.msg);
  const char *path = TEST_TMP_DIR "/quantize-rt.plan";
  CHECKF(ir_plan_write(g, NULL, path, &d) == IR_OK, "%s", d.msg);
  ir_plan *p = NULL;
  CHECKF(ir_plan_open(path, IR_PLAN_VERIFY_ALL, &p, &d) == IR_OK, "%s", d.msg);
  if (p) {
    const ir_graph *r = ir_plan_graph(p);
    int32_t n4 = -1, n8 = -1;
    for (int32_t i = 0; i < r->n_nodes; i++) {
      if (!strcmp(r->nodes[i].name, "mm4")) n4 = i;
      if (!strcmp(r->nodes[i].name, "mm8")) n8 = i;
    }
    CHECK(n4 >= 0 && n8 >= 0);
    if (n4 >= 0 && n8 >= 0) {
      const ir_node *a = &r->nodes[n4], *b = &r->nodes[n8];
      CHECK(a->n_in == 5 && r->tensors[a->in[1]].dtype == IR_I4 &&
            r->tensors[a->in[3]].dtype == IR_F16 && r->tensors[a->in[4]].dtype == IR_U8 &&
            r->tensors[a->in[1]].nbytes == 8 * 32);
      CHECK(b->n_in == 4 && ir_node_attr_i(b, "act_int8", 0) == 1 &&
            r->tensors[b->in[1]].dtype == IR_I8);
    }
  }
  ir_plan_close(p);
  pass_log_free(&log);
  ir_graph_destroy(g);
}

/* ---- pass_quantize ---------------------------------------------------------------------------- */

static void test_parse(void) {
  static const char *const good[][2] = {
      {"none", "none"},
      {"int8", "int8:sym"},
      {"int8:asym", "int8:asym"},
      {"int4", "int4:g32:sym"},
      {"int4:g128:asym", "int4:g128:asym"},
      {"int4:asym:g64", "int4:g64:asym"},
      {"w8a8", "w8a8"},
      {"int4:g32:sym:lm_head", "int4:g32:sym:lm_head"},
      {"q8_0", "q8_0"},
      {"q4_0", "q4_0"},
      {"q4_1:lm_head", "q4_1:lm_head"},
  };
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    pass_quant_opts q;
    ir_diag d = {0};
    char buf[64] = "";
    CHECKF(pass_quant_parse(good[i][0], &q, &d) == IR_OK, "%s: %s", good[i][0], d.msg);
    pass_quant_format(&q, buf, sizeof buf);
    CHECKF(!strcmp(buf, good[i][1]), "%s -> %s", good[i][0], buf);
  }
  static const char *const bad[][2] = {
      {"int3", "expected none"},
      {"int4:g33", "g33"},
      {"int4:g8", "g8"},
      {"int4:fast", "fast"},
      {"w8a8:asym", "w8a8"},
      {"none:asym", "none"},
      {"", "expected"},
      {"q4_1:g64", "fixed block format"},
      {"q8_0:sym", "fixed block format"},
      {"q4_0:asym", "fixed block format"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    pass_quant_opts q;
    ir_diag d = {0};
    CHECKF(pass_quant_parse(bad[i][0], &q, &d) == IR_INVALID_ARG && strstr(d.msg, bad[i][1]),
           "'%s' gave '%s'", bad[i][0], d.msg);
  }
}

/* Squared error of one group dequantized from pass_quant_matrix's output. */
static double group_err(const float *w, const qmat *m, int64_t j, int64_t g) {
  double e = 0.0;
  for (int64_t i = g * m->w.group; i < (g + 1) * m->w.group; i++) {
    double v = w[j * m->k + i] - ref_value(m, j, i);
    e += v * v;
  }
  return e;
}

/* Round to nearest at the plain scale (Q4_0's max / -8, int8's amax / 127, or min/max
 * onto the code range): the baseline the searched scales must never lose to. */
static double rtn_err(const float *w, int64_t n, ir_dtype qt, bool asym, ir_dtype st) {
  float lo = w[0], hi = w[0], m = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    lo = fminf(lo, w[i]), hi = fmaxf(hi, w[i]);
    if (fabsf(w[i]) > fabsf(m)) m = w[i];
  }
  int cl = qt == IR_I4 ? 0 : asym ? -128 : -127, ch = qt == IR_I4 ? 15 : 127;
  double s, z;
  if (!asym) {
    s = qt == IR_I4 ? m / -8.0 : fabsf(m) / 127.0, z = qt == IR_I4 ? 8 : 0;
  } else {
    s = (hi - lo) / (ch - cl);
    z = qt == IR_I4 ? cl - lo / s : nearbyint(cl - lo / s);
  }
  s = st == IR_F16 ? ir_f16_to_f32(ir_f32_to_f16((float)s)) : (float)s; /* as stored */
  if (qt == IR_I4 && asym) z = ir_f16_to_f32(ir_f32_to_f16((float)z));
  double e = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double c = s != 0.0 ? fmin(fmax(nearbyint(w[i] / s + z), cl), ch) : z;
    double v = w[i] - (c - z) * s;
    e += v * v;
  }
  return e;
}

/* Searched scales: never worse than round-to-nearest per group, codes in range, overall
 * error near the uniform-quantization figure, and a grid the format can hold is kept
 * exactly (int4 g32 asym on Q4_1-like data). */
static void test_quant_matrix(ir_dtype qt, int64_t group, bool asym, double max_rel) {
  const int64_t n = 12, k = 256, ng = k / group;
  float *w = rnd_vec(n * k);
  for (int64_t i = 0; i < n * k; i++)
    w[i] = w[i] * w[i] * w[i] + 0.1f * rnd(); /* heavy-ish tails */
  ir_dtype st = qt == IR_I4 || group < k ? IR_F16 : IR_F32;
  ir_dtype zt = !asym ? IR_DTYPE_INVALID : qt == IR_I4 ? IR_F16 : IR_I8;
  qmat m = qmat_make(qt, n, k, group, st, zt);
  pass_quant_matrix(w, n, k, qt, group, asym, st, m.q, m.s, m.z);
  double err = 0.0, tot = 0.0;
  int worse = 0, out_of_range = 0;
  for (int64_t j = 0; j < n; j++)
    for (int64_t g = 0; g < ng; g++) {
      double e = group_err(w, &m, j, g);
      worse += e > rtn_err(w + j * k + g * group, group, qt, asym, st) * (1 + 1e-9) + 1e-12;
      err += e;
    }
  for (int64_t i = 0; i < n * k; i++) {
    tot += (double)w[i] * w[i];
    out_of_range += qt == IR_I8 && !asym && ((const int8_t *)m.q)[i] == -128;
  }
  CHECKF(worse == 0, "%s g%lld%s: %d groups worse than round-to-nearest", ir_dtype_name(qt),
         (long long)group, asym ? " asym" : "", worse);
  CHECKF(sqrt(err / tot) < max_rel, "%s g%lld%s: relative error %.4f", ir_dtype_name(qt),
         (long long)group, asym ? " asym" : "", sqrt(err / tot));
  CHECK(out_of_range == 0);
  /* the dequantized values, quantized again, come back exactly (a Q4_1-style grid) */
  if (qt == IR_I4 && asym) {
    float *wq = ref_matrix(&m);
    qmat m2 = qmat_make(qt, n, k, group, st, zt);
    pass_quant_matrix(wq, n, k, qt, group, asym, st, m2.q, m2.s, m2.z);
    double e2 = 0.0;
    for (int64_t j = 0; j < n; j++)
      for (int64_t g = 0; g < ng; g++) e2 += group_err(wq, &m2, j, g);
    CHECKF(sqrt(e2 / tot) < 1e-3, "requantized grid: relative error %.6f", sqrt(e2 / tot));
    free(wq);
    qmat_free(&m2);
  }
  free(w);
  qmat_free(&m);
}

/* A two-matmul graph with a tied embedding: the projection is quantized, the logits
 * matmul (lm_head) only when asked; outputs stay near the f32 ones. */
static void test_pass(const char *spec, bool want_head, double max_rel) {
  const int64_t H = 64, V = 48;
  float *emb = rnd_vec(V * H), *wp = rnd_vec(H * H);
  ir_graph *g = ir_graph_create();
  g->config =
      (ir_model_config){.max_tokens = 4, .max_seqs = 1, .max_logits = 4, .kv_block_size = 16};
  ir_dim td[1] = {{.sym = IR_SYM_TOKENS}};
  int32_t ids = ir_graph_add_input(g, "ids", IR_I32, 1, td);
  int32_t te = ir_graph_add_weight(g, "emb", IR_F32, 2, (int64_t[]){V, H}, emb, V * H * 4);
  int32_t tp = ir_graph_add_weight(g, "proj", IR_F32, 2, (int64_t[]){H, H}, wp, H * H * 4);
  ir_diag d = {0};
  int32_t x, y, logits;
  CHECK(ir_graph_add_node(g, IR_OP_EMBED, "embed", (int32_t[]){ids, te}, 2, NULL, 0, &x, &d) >= 0);
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "proj", (int32_t[]){x, tp}, 2, NULL, 0, &y, &d) >= 0);
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "logits", (int32_t[]){y, te}, 2, NULL, 0, &logits, &d) >=
        0);
  CHECK(ir_graph_add_output(g, logits));
  pass_quant_opts q;
  CHECK(pass_quant_parse(spec, &q, &d) == IR_OK);
  pass_opts o = {.quant = &q};
  pass_log log = {0};
  CHECKF(pass_quantize(g, &o, &log, &d) == IR_OK && ir_graph_verify(g, &d) == IR_OK &&
             ir_graph_materialize(g, &d) == IR_OK,
         "%s: %s", spec, d.msg);
  CHECKF(log.n == 1 && strstr(log.lines[0], want_head ? "2 matmul weights" : "1 matmul weights"),
         "%s: %s", spec, log.n ? log.lines[0] : "no log");
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op != IR_OP_MATMUL) continue;
    bool head = !strcmp(n->name, "logits"), quant = g->tensors[n->in[1]].dtype != IR_F32;
    CHECKF(quant == (!head || want_head), "%s: node %s", spec, n->name);
    CHECK(ir_node_attr_i(n, "act_int8", 0) == (quant && q.scheme == PASS_QUANT_W8A8));
    if (!quant) continue;
    /* the quantized projection against the float one on random rows */
    const ir_tensor *tw = &g->tensors[n->in[1]], *ts = &g->tensors[n->in[3]];
    int64_t N = tw->dims[0].n;
    kn_wq kw = {.q = tw->data,
                .qt = tw->dtype,
                .scales = ts->data,
                .st = ts->dtype,
                .group = H / ts->dims[1].n};
    if (n->n_in > 4 && n->in[4] >= 0)
      kw.zp = g->tensors[n->in[4]].data, kw.zt = g->tensors[n->in[4]].dtype;
    float *xr = rnd_vec(3 * H), *yq = calloc((size_t)(3 * N), 4), *yf = calloc((size_t)(3 * N), 4);
    (kw.qt == IR_I8 && ir_node_attr_i(n, "act_int8", 0) ? kn_matmul_w8a8 : kn_matmul_wq)(
        NULL, yq, xr, &kw, NULL, 3, N, H, KN_WQ_ACT_NONE);
    kn_matmul(NULL, yf, xr, head ? emb : wp, IR_F32, NULL, 3, N, H);
    double e = 0.0, t = 0.0;
    for (int64_t i2 = 0; i2 < 3 * N; i2++)
      e += (yq[i2] - yf[i2]) * (yq[i2] - yf[i2]), t += yf[i2] * yf[i2];
    CHECKF(sqrt(e / t) < max_rel, "%s %s: output relative error %.4f", spec, n->name, sqrt(e / t));
    free(xr), free(yq), free(yf);
  }
  pass_log_free(&log);
  ir_graph_destroy(g);
  free(emb), free(wp);
}

/* ---- smoothing -------------------------------------------------------------------------- */

enum { SM_T = 6, SM_H = 64, SM_NA = 32, SM_NB = 32, SM_OUTLIER = 7 };

typedef struct sm_fix {
  float x[SM_T * SM_H], gamma[SM_H], gamma2[SM_H], wa[SM_NA * SM_H], wb[SM_NB * SM_H],
      wc[SM_NB * SM_H], amax[SM_H];
  int asked;
} sm_fix;

static const float *sm_amax(void *ctx, const char *norm_weight, int64_t k) {
  sm_fix *f = ctx;
  f->asked++;
  return k == SM_H && (!strcmp(norm_weight, "gamma") || !strcmp(norm_weight, "gamma2")) ? f->amax
                                                                                        : NULL;
}

/* y = matmul(rms_norm(x, gamma), w) in f32, or in W8A8 (w quantized per channel here). */
static void sm_forward(const float *x, const float *gamma, const float *w, int64_t n, bool w8a8,
                       float *y) {
  float xn[SM_T * SM_H];
  kn_rms_norm(NULL, xn, x, gamma, SM_T, SM_H, 1e-5f);
  if (!w8a8) {
    kn_matmul(NULL, y, xn, w, IR_F32, NULL, SM_T, n, SM_H);
    return;
  }
  int8_t *q = malloc((size_t)(n * SM_H));
  float *sc = malloc((size_t)n * sizeof *sc);
  pass_quant_matrix(w, n, SM_H, IR_I8, SM_H, false, IR_F32, q, sc, NULL);
  kn_wq kw = {.q = q, .qt = IR_I8, .scales = sc, .st = IR_F32, .group = SM_H};
  kn_matmul_w8a8(NULL, y, xn, &kw, NULL, SM_T, n, SM_H, KN_WQ_ACT_NONE);
  free(q), free(sc);
}

/* Relative RMS difference of a and b (n values). */
static double rel_rms(const float *a, const float *b, int64_t n) {
  double e = 0.0, t = 0.0;
  for (int64_t i = 0; i < n; i++)
    e += (a[i] - b[i]) * (double)(a[i] - b[i]), t += b[i] * (double)b[i];
  return sqrt(e / t);
}

static int32_t sm_find(const ir_graph *g, const char *name) {
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (!strcmp(g->nodes[i].name, name)) return i;
  return 0;
}

static int32_t sm_node(ir_graph *g, ir_op op, const char *name, int32_t a, int32_t b) {
  ir_attr eps = IR_AF(ir_attr_intern("eps"), 1e-5f);
  ir_diag d = {0};
  int32_t out = -1;
  bool norm = op == IR_OP_RMS_NORM;
  CHECKF(ir_graph_add_node(g, op, name, (int32_t[]){a, b}, 2, norm ? &eps : NULL, norm ? 1 : 0,
                           &out, &d) >= 0,
         "%s: %s", name, d.msg);
  return out;
}

/* One norm feeding two projections a, b (smoothed), one whose output is also a graph
 * output (left alone) feeding c, and a projection o of a + b (no norm). */
static ir_graph *sm_graph(sm_fix *f) {
  ir_graph *g = ir_graph_create();
  g->config =
      (ir_model_config){.max_tokens = 8, .max_seqs = 1, .max_logits = 8, .kv_block_size = 16};
  ir_dim xd[2] = {{.sym = IR_SYM_TOKENS}, {.n = SM_H}};
  int32_t x = ir_graph_add_input(g, "x", IR_F32, 2, xd);
  int32_t tg = ir_graph_add_weight(g, "gamma", IR_F32, 1, (int64_t[]){SM_H}, f->gamma, SM_H * 4);
  int32_t tg2 = ir_graph_add_weight(g, "gamma2", IR_F32, 1, (int64_t[]){SM_H}, f->gamma2, SM_H * 4);
  int32_t ta =
      ir_graph_add_weight(g, "wa", IR_F32, 2, (int64_t[]){SM_NA, SM_H}, f->wa, sizeof f->wa);
  int32_t tb =
      ir_graph_add_weight(g, "wb", IR_F32, 2, (int64_t[]){SM_NB, SM_H}, f->wb, sizeof f->wb);
  int32_t tc =
      ir_graph_add_weight(g, "wc", IR_F32, 2, (int64_t[]){SM_NB, SM_H}, f->wc, sizeof f->wc);
  int32_t to =
      ir_graph_add_weight(g, "wo", IR_F32, 2, (int64_t[]){SM_NB, SM_NA}, f->wa, SM_NB * SM_NA * 4);
  int32_t n1 = sm_node(g, IR_OP_RMS_NORM, "norm", x, tg);
  int32_t n2 = sm_node(g, IR_OP_RMS_NORM, "norm2", x, tg2);
  /* (a graph output read straight from a matmul would make it the lm_head) */
  int32_t ya = sm_node(g, IR_OP_MATMUL, "a", n1, ta), yb = sm_node(g, IR_OP_MATMUL, "b", n1, tb);
  int32_t yc = sm_node(g, IR_OP_MATMUL, "c", n2, tc);
  int32_t yo = sm_node(g, IR_OP_MATMUL, "o", sm_node(g, IR_OP_ADD, "ab", ya, yb), to);
  CHECK(ir_graph_add_output(g, sm_node(g, IR_OP_ADD, "oo", yo, yo)));
  CHECK(ir_graph_add_output(g, sm_node(g, IR_OP_ADD, "cc", yc, yc)));
  CHECK(ir_graph_add_output(g, n2));
  return g;
}

/* The projections of a smoothed norm: the f32 outputs stay within rounding, the W8A8 error
 * with an outlier activation channel drops. */
static void test_smooth(void) {
  static sm_fix f;
  for (int i = 0; i < SM_T * SM_H; i++) f.x[i] = rnd() * (i % SM_H == SM_OUTLIER ? 60.0f : 1.0f);
  for (int j = 0; j < SM_H; j++) f.gamma[j] = 1.0f + 0.5f * rnd(), f.gamma2[j] = f.gamma[j];
  for (int i = 0; i < SM_NA * SM_H; i++) f.wa[i] = 0.1f * rnd();
  for (int i = 0; i < SM_NB * SM_H; i++) f.wb[i] = 0.1f * rnd(), f.wc[i] = f.wb[i];
  float xn[SM_T * SM_H];
  kn_rms_norm(NULL, xn, f.x, f.gamma, SM_T, SM_H, 1e-5f);
  for (int i = 0; i < SM_T * SM_H; i++) f.amax[i % SM_H] = fmaxf(f.amax[i % SM_H], fabsf(xn[i]));

  ir_graph *g = sm_graph(&f);
  int32_t tc = ir_graph_find_tensor(g, "wc"), tg2 = ir_graph_find_tensor(g, "gamma2");

  pass_quant_opts q;
  ir_diag d = {0};
  CHECK(pass_quant_parse("w8a8", &q, &d) == IR_OK);
  pass_quant_smoothing sm = {.q = &q, .alpha = 0.5f, .amax = sm_amax, .ctx = &f};
  int n_done = -1;
  CHECKF(pass_quant_smooth(g, &sm, &n_done, &d) == IR_OK && ir_graph_verify(g, &d) == IR_OK &&
             ir_graph_materialize(g, &d) == IR_OK,
         "%s", d.msg);
  CHECKF(n_done == 1 && f.asked == 1, "smoothed %d norms, asked %d", n_done, f.asked);
  const ir_node *na = &g->nodes[sm_find(g, "a")];
  const ir_node *nb = &g->nodes[sm_find(g, "b")];
  const ir_node *nn = &g->nodes[sm_find(g, "norm")];
  const ir_node *nc = &g->nodes[sm_find(g, "c")];
  CHECK(!strcmp(g->tensors[na->in[1]].name, "wa.smoothed"));
  CHECK(!strcmp(g->tensors[nn->in[1]].name, "gamma.smoothed"));
  CHECK(nc->in[1] == tc && g->nodes[sm_find(g, "norm2")].in[1] == tg2);
  const float *sg = g->tensors[nn->in[1]].data;
  CHECKF(fabsf(sg[SM_OUTLIER]) < 0.2f * fabsf(f.gamma[SM_OUTLIER]),
         "the outlier channel's gamma: %g -> %g", f.gamma[SM_OUTLIER], sg[SM_OUTLIER]);

  static float y0[SM_T * SM_NA], y1[SM_T * SM_NA], yq0[SM_T * SM_NA], yq1[SM_T * SM_NA];
  const struct {
    const float *w0;
    int32_t node_w;
    int64_t n;
  } mm[2] = {{f.wa, na->in[1], SM_NA}, {f.wb, nb->in[1], SM_NB}};
  for (int m = 0; m < 2; m++) {
    const float *ws = g->tensors[mm[m].node_w].data;
    int64_t n = mm[m].n, cnt = SM_T * n;
    sm_forward(f.x, f.gamma, mm[m].w0, n, false, y0);
    sm_forward(f.x, sg, ws, n, false, y1);
    double e = rel_rms(y1, y0, cnt); /* f32 rounding: a few ulp per product */
    CHECKF(e < 1e-6, "smoothed f32 matmul %d: relative RMS %.3g", m, e);
    sm_forward(f.x, f.gamma, mm[m].w0, n, true, yq0);
    sm_forward(f.x, sg, ws, n, true, yq1);
    double e0 = rel_rms(yq0, y0, cnt), e1 = rel_rms(yq1, y0, cnt);
    /* measured 3.5x smaller; a smoothing that did nothing (or the wrong way) fails */
    CHECKF(e1 < 0.5 * e0, "w8a8 matmul %d: relative RMS %.4f plain, %.4f smoothed", m, e0, e1);
  }
  ir_graph_destroy(g);

  /* pass_quantize with a calibration file: the same smoothing, int8 activations only where
   * a norm feeds the matmul; a file for another model is refused */
  char path[] = "/tmp/test_quantize_calib_XXXXXX";
  int fd = mkstemp(path);
  FILE *fp = fd >= 0 ? fdopen(fd, "w") : NULL;
  CHECK(fp != NULL);
  if (!fp) return;
  fprintf(fp, "# maxima\ngamma %d", SM_H);
  for (int j = 0; j < SM_H; j++) fprintf(fp, " %.9g", f.amax[j]);
  fprintf(fp, "\n");
  fclose(fp);
  g = sm_graph(&f);
  pass_opts o = {.quant = &q, .quant_calib = path};
  pass_log log = {0};
  CHECKF(pass_quantize(g, &o, &log, &d) == IR_OK && ir_graph_verify(g, &d) == IR_OK &&
             ir_graph_materialize(g, &d) == IR_OK,
         "%s", d.msg);
  CHECKF(log.n == 1 && strstr(log.lines[0], "4 matmul weights") &&
             strstr(log.lines[0], "smoothed 1 norms"),
         "%s", log.n ? log.lines[0] : "no log");
  static const struct {
    const char *name;
    int a8;
  } want[] = {{"a", 1}, {"b", 1}, {"c", 1}, {"o", 0}};
  for (int i = 0; i < 4; i++)
    CHECKF(ir_node_attr_i(&g->nodes[sm_find(g, want[i].name)], "act_int8", 0) == want[i].a8,
           "act_int8 of %s", want[i].name);
  pass_log_free(&log);
  ir_graph_destroy(g);
  fp = fopen(path, "w");
  CHECK(fp != NULL);
  if (fp) fprintf(fp, "other %d 1 2\n", SM_H), fclose(fp);
  g = sm_graph(&f);
  CHECK(pass_quantize(g, &o, &log, &d) == IR_BAD_FORMAT && strstr(d.msg, "64 finite maxima"));
  ir_graph_destroy(g);
  pass_log_free(&log);
  remove(path);
}

int main(void) {
  kn_pool *p1 = kn_pool_create(1), *p4 = kn_pool_create(4);
  CHECK(p1 != NULL && p4 != NULL);
  if (!p1 || !p4) return tcheck_done("quantize");
  test_values();
  test_ir_rules();
  test_parse();
  /* uniform-ish data: int8 ~ 0.3%, int4 ~ 6-9% relative RMS error */
  test_quant_matrix(IR_I8, 256, false, 0.01);
  test_quant_matrix(IR_I8, 256, true, 0.01);
  test_quant_matrix(IR_I8, 32, false, 0.01);
  test_quant_matrix(IR_I4, 32, false, 0.12);
  test_quant_matrix(IR_I4, 32, true, 0.10);
  test_quant_matrix(IR_I4, 128, true, 0.12);
  test_quant_matrix(IR_I4, 64, false, 0.14);
  test_pass("int8", false, 0.01);
  test_pass("int8:lm_head", true, 0.01);
  test_pass("int4:g32:asym", false, 0.12);
  test_pass("int4:g64:sym:lm_head", true, 0.15);
  test_pass("w8a8", false, 0.02);
  test_pass("fp8", false, 0.05); /* E4M3: 3 mantissa bits, a relative step of 1/16 at most */
  test_pass("fp8:lm_head", true, 0.05);
  {
    pass_quant_opts q;
    ir_diag d = {0};
    CHECK(pass_quant_parse("fp8:g128", &q, &d) == IR_INVALID_ARG && strstr(d.msg, "per channel"));
    CHECK(pass_quant_parse("fp8:asym", &q, &d) == IR_INVALID_ARG);
  }
  test_smooth();
  test_plan_round_trip();
  /* Every path this CPU can run (a capped path the CPU lacks falls back to what it has). */
  for (int isa = 0; isa <= 3; isa++) {
    kn_matmul_wq_set_max_isa(isa);
    kn_matmul_set_max_isa(isa);
    test_wq_matmul(p4, isa);
    test_invariance(p1, p4, IR_I4, false, KN_WQ_ACT_NONE, 70, 45, 256, 32);
    test_invariance(p1, p4, IR_I8, false, KN_WQ_ACT_NONE, 9, 33, 576, 576);
    test_invariance(p1, p4, IR_I8, true, KN_WQ_ACT_NONE, 70, 45, 576, 576);
    test_invariance(p1, p4, IR_I8, true, KN_WQ_ACT_NONE, 5, 13, 100, 100);
    test_invariance(p1, p4, IR_I4, false, KN_WQ_ACT_SWIGLU, 37, 42, 128, 64);
    test_invariance(p1, p4, IR_I8, true, KN_WQ_ACT_SWIGLU, 37, 42, 128, 128);
    test_swiglu(p4, false, IR_I4, 9, 21, 128, 32);
    test_swiglu(p4, false, IR_I8, 1, 40, 64, 64);
    test_swiglu(p4, true, IR_I8, 6, 19, 96, 96);
#if defined(__x86_64__)
    if (isa == 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      CHECKF(strcmp(kn_matmul_w8a8_path(), "portable") != 0, "an AVX2 CPU runs W8A8 %s",
             kn_matmul_w8a8_path());
#endif
    test_w8a8(p4, isa, 7, 29, 576);
    test_w8a8(p4, isa, 3, 10, 77); /* k tails of every path */
    test_w8a8(p1, isa, 66, 9, 1536);
    test_w8a8_shapes(p1, p4);
  }
  kn_matmul_wq_set_max_isa(3);
  kn_matmul_set_max_isa(2);
  test_w8a8_amx(p1, p4);
  kn_pool_destroy(p1);
  kn_pool_destroy(p4);
  return tcheck_done("quantize");
}
