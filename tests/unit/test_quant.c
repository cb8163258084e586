/* test_quant: block-quantized weights (q8_0, q4_0, q4_1): block decoding against hand-made
 * blocks; matmul and embedding against a naive dequantize-then-dot reference (double
 * precision within a bound, and the f32 kernel on the dequantized W bit for bit) on
 * every instruction set the CPU has; batch invariance; agreement of the SIMD paths; and
 * the IR rules and build-time folding that let a template use quantized weights. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "infc_util.h"
#include "ir.h"
#include "kn_cpu.h"
#include "kn_quant.h"
#include "pass.h"
#include "tcheck.h"
#include "tref.h"

static const ir_dtype k_qtypes[3] = {IR_Q8_0, IR_Q4_0, IR_Q4_1};

/* ---- helpers ---------------------------------------------------------------------- */

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

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

static void put_f16(uint8_t *p, float v) {
  uint16_t h = ir_f32_to_f16(v);
  p[0] = (uint8_t)h;
  p[1] = (uint8_t)(h >> 8);
}

/* n_rows x k of random blocks: random quants, scales in +-[0.002, 0.05), mins in +-0.5. */
static uint8_t *rnd_qmatrix(ir_dtype dt, int64_t n_rows, int64_t k) {
  uint64_t bytes = ir_dtype_bytes(dt, (uint64_t)(n_rows * k));
  uint8_t *w = malloc(bytes ? bytes : 1);
  int bb = kn_quant_block_bytes(dt);
  for (uint64_t b = 0; b < bytes / (uint64_t)bb; b++) {
    uint8_t *blk = w + b * (uint64_t)bb;
    for (int i = 0; i < bb; i++) blk[i] = (uint8_t)rnd_u32();
    put_f16(blk, (0.002f + 0.048f * fabsf(rnd())) * (rnd() < 0 ? -1.0f : 1.0f));
    if (dt == IR_Q4_1) put_f16(blk + 2, 0.5f * rnd());
  }
  return w;
}

static float *dequant_matrix(const uint8_t *w, ir_dtype dt, int64_t n_rows, int64_t k) {
  float *out = malloc((size_t)(n_rows * k) * sizeof *out);
  uint64_t row = ir_dtype_bytes(dt, (uint64_t)k);
  for (int64_t r = 0; r < n_rows; r++) kn_dequant_row(w + (uint64_t)r * row, dt, out + r * k, k);
  return out;
}

/* ---- block decoding --------------------------------------------------------------- */

static void test_blocks(void) {
  uint8_t q8[34], q40[18], q41[20];
  put_f16(q8, 0.5f);
  for (int i = 0; i < 32; i++) q8[2 + i] = (uint8_t)(int8_t)(i * 8 - 128);
  put_f16(q40, 2.0f);
  for (int i = 0; i < 16; i++) q40[2 + i] = (uint8_t)(i | (15 - i) << 4);
  put_f16(q41, 0.25f);
  put_f16(q41 + 2, -1.0f);
  for (int i = 0; i < 16; i++) q41[4 + i] = (uint8_t)((i * 3 % 16) | (i << 4));
  float o8[32], o40[32], o41[32];
  kn_dequant_row(q8, IR_Q8_0, o8, 32);
  kn_dequant_row(q40, IR_Q4_0, o40, 32);
  kn_dequant_row(q41, IR_Q4_1, o41, 32);
  int ok8 = 1, ok40 = 1, ok41 = 1, one = 1;
  for (int i = 0; i < 32; i++) {
    ok8 &= o8[i] == 0.5f * (float)(i * 8 - 128);
    int n40 = i < 16 ? i : 15 - (i - 16); /* low nibbles hold 0..15, high 16..31 */
    ok40 &= o40[i] == 2.0f * (float)(n40 - 8);
    int n41 = i < 16 ? i * 3 % 16 : i - 16;
    ok41 &= o41[i] == 0.25f * (float)n41 - 1.0f; /* exact here, so fma or not */
    one &= kn_dequant_one(q8, IR_Q8_0, (uint64_t)i) == o8[i] &&
           kn_dequant_one(q40, IR_Q4_0, (uint64_t)i) == o40[i] &&
           kn_dequant_one(q41, IR_Q4_1, (uint64_t)i) == o41[i];
  }
  CHECK(ok8);
  CHECK(ok40);
  CHECK(ok41);
  CHECK(one);
  CHECK(ir_dtype_bytes(IR_Q8_0, 64) == 68 && ir_dtype_bytes(IR_Q4_1, 48) == 0);
  /* the second block of a row is found by kn_dequant_one's flat index */
  uint8_t two[68];
  memcpy(two, q8, 34);
  memcpy(two + 34, q8, 34);
  CHECK(kn_dequant_one(two, IR_Q8_0, 37) == o8[5]);
}

/* ---- matmul ----------------------------------------------------------------------- */

/* Against a double reference, error bound relative to sum |x_i w_i| (tests/unit/tref.h). */
static int matmul_ok(const float *y, const float *x, const float *w, const float *bias, int64_t m,
                     int64_t n, int64_t k) {
  return tref_matmul_ok(y, x, w, bias, m, n, k, 2e-5);
}

/* Against a double reference of the dequantized W, and bit for bit against the f32
 * kernel on that W: the quantized kernels dequantize in registers to exactly the values
 * kn_dequant_row gives, then sum in the f32 order. */
static void matmul_case(kn_pool *p, ir_dtype dt, int isa, bool bias_on, int64_t m, int64_t n,
                        int64_t k) {
  uint8_t *wq = rnd_qmatrix(dt, n, k);
  float *w = dequant_matrix(wq, dt, n, k), *x = rnd_vec(m * k), *y = rnd_vec(m * n);
  float *yf = rnd_vec(m * n), *bias = bias_on ? rnd_vec(n) : NULL;
  kn_matmul(p, y, x, wq, dt, bias, m, n, k);
  kn_matmul(p, yf, x, w, IR_F32, bias, m, n, k);
  CHECKF(matmul_ok(y, x, w, bias, m, n, k), "dt=%s isa=%d bias=%d m=%lld n=%lld k=%lld",
         ir_dtype_name(dt), isa, bias_on, (long long)m, (long long)n, (long long)k);
  CHECKF(memcmp(y, yf, (size_t)(m * n) * sizeof(float)) == 0,
         "dt=%s isa=%d m=%lld n=%lld k=%lld: not the f32 kernel's bits on dequantized W",
         ir_dtype_name(dt), isa, (long long)m, (long long)n, (long long)k);
  free(wq), free(w), free(x), free(y), free(yf), free(bias);
}

static void test_matmul(kn_pool *p4, int isa) {
  static const int64_t ms[] = {1, 2, 5, 17}, ns[] = {1, 3, 10, 300}, ks[] = {32, 64, 576};
  for (int d = 0; d < 3; d++)
    for (int mi = 0; mi < 4; mi++)
      for (int ni = 0; ni < 4; ni++)
        for (int ki = 0; ki < 3; ki++)
          matmul_case(mi == 2 ? NULL : p4, k_qtypes[d], isa, (mi + ni) % 2, ms[mi], ns[ni], ks[ki]);
  for (int d = 0; d < 3; d++) matmul_case(p4, k_qtypes[d], isa, true, 70, 1000, 160);
}

/* Row i alone (serial, and on one thread) and inside batches of 5 and 17 rows on four
 * threads must agree bit for bit. */
static void matmul_invariance(kn_pool *p1, kn_pool *p4, ir_dtype dt, int isa, int64_t n,
                              int64_t k) {
  enum { M = 17 };
  uint8_t *wq = rnd_qmatrix(dt, n, k);
  float *x = rnd_vec(M * k), *bias = rnd_vec(n), *y17 = rnd_vec(M * n), *y5 = rnd_vec(5 * n);
  float *y1 = rnd_vec(n);
  kn_matmul(p4, y17, x, wq, dt, bias, M, n, k);
  int ok = 1;
  for (int64_t i = 0; i < M; i++) {
    kn_matmul(i % 2 ? p1 : NULL, y1, x + i * k, wq, dt, bias, 1, n, k);
    ok &= memcmp(y1, y17 + i * n, (size_t)n * sizeof(float)) == 0;
  }
  for (int64_t i0 = 0; i0 + 5 <= M; i0 += 3) {
    kn_matmul(p4, y5, x + i0 * k, wq, dt, bias, 5, n, k);
    ok &= memcmp(y5, y17 + i0 * n, 5 * (size_t)n * sizeof(float)) == 0;
  }
  CHECKF(ok, "batch invariance dt=%s isa=%d n=%lld k=%lld", ir_dtype_name(dt), isa, (long long)n,
         (long long)k);
  free(wq), free(x), free(bias), free(y17), free(y5), free(y1);
}

/* The AVX2 and AVX-512 kernels follow one order with FMA: the same bits. */
static void test_isa_agree(kn_pool *p4) {
  for (int d = 0; d < 3; d++) {
    enum { M = 9, N = 70, K = 320 };
    uint8_t *wq = rnd_qmatrix(k_qtypes[d], N, K);
    float *x = rnd_vec(M * K), *ya = rnd_vec(M * N), *yb = rnd_vec(M * N);
    kn_matmul_set_max_isa(1);
    kn_matmul(p4, ya, x, wq, k_qtypes[d], NULL, M, N, K);
    kn_matmul_set_max_isa(2);
    kn_matmul(p4, yb, x, wq, k_qtypes[d], NULL, M, N, K);
    CHECKF(memcmp(ya, yb, sizeof(float) * M * N) == 0, "avx2 vs avx-512 dt=%s",
           ir_dtype_name(k_qtypes[d]));
    free(wq), free(x), free(ya), free(yb);
  }
}

/* ---- quantizing (kn_quant_row) against gguf-py ---------------------------------------- */

/* tests/fixtures/quant-blocks/blocks.json (tools/gen_quant_fixture.py): f32 rows and the
 * blocks gguf-py's port of ggml's reference quantizers makes of them. Ours must be the
 * same bytes. */
static void test_quant_row(void) {
  char path[1200], *text = NULL;
  ir_diag d = {0};
  snprintf(path, sizeof path, "%s/quant-blocks/blocks.json", FIXTURES_DIR);
  CHECKF(infc_read_file(path, 1u << 20, &text, NULL, &d) == IR_OK, "%s", d.msg);
  cJSON *root = text ? cJSON_Parse(text) : NULL;
  free(text);
  const cJSON *rows = cJSON_GetObjectItem(root, "rows"), *row;
  CHECK(cJSON_GetArraySize(rows) >= 4);
  static const char *const names[3] = {"q8_0", "q4_0", "q4_1"};
  cJSON_ArrayForEach(row, rows) {
    const cJSON *bits = cJSON_GetObjectItem(row, "bits");
    int n = cJSON_GetArraySize(bits);
    float *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++) {
      uint32_t b = (uint32_t)cJSON_GetArrayItem(bits, i)->valuedouble;
      memcpy(x + i, &b, 4);
    }
    for (int t = 0; t < 3; t++) {
      const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(row, names[t]));
      size_t bytes = ir_dtype_bytes(k_qtypes[t], (uint64_t)n);
      uint8_t *got = malloc(bytes);
      kn_quant_row(x, k_qtypes[t], got, n);
      char *hex = malloc(2 * bytes + 1);
      for (size_t i = 0; i < bytes; i++) snprintf(hex + 2 * i, 3, "%02x", got[i]);
      size_t bad = 0;
      while (want && bad < 2 * bytes && hex[bad] == want[bad]) bad++;
      CHECKF(want && strlen(want) == 2 * bytes && bad == 2 * bytes,
             "%s of %d values: gguf-py's blocks differ from byte %zu (block %zu)", names[t], n,
             bad / 2, bad / 2 / (size_t)kn_quant_block_bytes(k_qtypes[t]));
      free(got), free(hex);
    }
    free(x);
  }
  cJSON_Delete(root);
}

/* ---- int8 activations (kn_matmul_q8) ------------------------------------------------ */

/* The documented quantization of one 32-value block of x, restated. */
static float q8_quant_block(const float *x, int8_t *q) {
  float amax = 0.0f;
  for (int i = 0; i < KN_QBLOCK; i++) amax = fmaxf(amax, fabsf(x[i]));
  float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < KN_QBLOCK; i++) q[i] = (int8_t)fminf(fmaxf(rintf(x[i] * id), -127), 127);
  return amax / 127.0f;
}

/* y against (a) the integer dot of the documented codes, summed in double: within f32
 * rounding of the terms; (b) the dequantized-W matmul of the unquantized x: within the
 * half step each x value may move, sum_i |w_i| dx_i / 2. */
static int q8_row_ok(const float *y, const float *x, const uint8_t *wq, const float *w, ir_dtype dt,
                     const float *bias, int64_t n, int64_t k, double *worst) {
  int64_t rb = (int64_t)ir_dtype_bytes(dt, (uint64_t)k);
  int ok = 1;
  for (int64_t j = 0; j < n; j++) {
    double ref = bias ? bias[j] : 0.0, mag = fabs(ref), exact = ref, step = 0.0;
    for (int64_t b = 0; b < k / KN_QBLOCK; b++) {
      int8_t xq[KN_QBLOCK];
      float dx = q8_quant_block(x + b * KN_QBLOCK, xq), q[KN_QBLOCK], dw, mw;
      kn_quant_block(wq + j * rb + b * kn_quant_block_bytes(dt), dt, q, &dw, &mw);
      double dot = 0, adot = 0, sx = 0;
      for (int i = 0; i < KN_QBLOCK; i++) {
        dot += (double)q[i] * xq[i], adot += fabs((double)q[i] * xq[i]), sx += xq[i];
        double wi = w[j * k + b * KN_QBLOCK + i];
        exact += wi * x[b * KN_QBLOCK + i], step += fabs(wi) * dx / 2;
      }
      ref += (double)dw * dx * dot + (double)mw * dx * sx;
      mag += fabs((double)dw * dx) * adot + fabs((double)mw * dx * sx);
    }
    double e = fabs(y[j] - ref) / (mag + 1e-30);
    if (e > *worst) *worst = e;
    ok &= fabs(y[j] - ref) <= 1e-5 * mag + 1e-30;
    ok &= fabs(y[j] - exact) <= step * 1.0001 + 1e-5 * mag + 1e-6;
  }
  return ok;
}

/* W in the 8-row interleaved layout (x8: n a multiple of 8), or the GGUF one as made. */
static uint8_t *maybe_x8(const uint8_t *wq, ir_dtype dt, int64_t rows, int64_t k, bool x8,
                         ir_dtype *wt) {
  size_t bytes = (size_t)ir_dtype_bytes(dt, (uint64_t)(rows * k));
  uint8_t *w = malloc(bytes);
  if (!w) abort();
  if (x8) kn_x8_pack(wq, dt, rows, k, w);
  else memcpy(w, wq, bytes);
  *wt = x8 ? ir_dtype_x8_of(dt) : dt;
  return w;
}

static void q8_case(kn_pool *p, ir_dtype dt, int isa, bool bias_on, int64_t m, int64_t n, int64_t k,
                    bool x8, double *worst) {
  uint8_t *wq = rnd_qmatrix(dt, 2 * n, k);
  ir_dtype wt;
  uint8_t *wl = maybe_x8(wq, dt, 2 * n, k, x8, &wt);
  float *w = dequant_matrix(wq, dt, 2 * n, k), *x = rnd_vec(m * k), *y = rnd_vec(2 * m * n);
  float *ys = rnd_vec(m * n), *bias = bias_on ? rnd_vec(2 * n) : NULL;
  if (m > 1) memset(x + k, 0, (size_t)k * sizeof *x);              /* an all-zero row */
  for (int64_t i = 0; i < k && m > 2; i++) x[2 * k + i] *= 300.0f; /* and a large one */
  kn_matmul_q8(p, y, x, wl, wt, bias, m, 2 * n, k, false);
  kn_matmul_q8(p, ys, x, wl, wt, bias, m, n, k, true);
  int ok = 1, sw = 1;
  for (int64_t i = 0; i < m; i++) {
    ok &= q8_row_ok(y + i * 2 * n, x + i * k, wq, w, dt, bias, 2 * n, k, worst);
    for (int64_t j = 0; j < n; j++) /* the epilogue on the plain matmul's z, bit for bit */
      sw &= ys[i * n + j] == kn_silu_mul(y[i * 2 * n + j], y[i * 2 * n + n + j]);
  }
  CHECKF(ok, "q8 dt=%s isa=%d bias=%d m=%lld n=%lld k=%lld", ir_dtype_name(wt), isa, bias_on,
         (long long)m, (long long)n, (long long)k);
  CHECKF(sw, "q8 swiglu dt=%s isa=%d m=%lld n=%lld", ir_dtype_name(wt), isa, (long long)m,
         (long long)n);
  free(wq), free(wl), free(w), free(x), free(y), free(ys), free(bias);
}

/* Row i alone (serial, one thread) and in batches on four threads: the same bits; and the
 * portable path against the SIMD one. */
static void q8_invariance(kn_pool *p1, kn_pool *p4, ir_dtype base, int64_t n, int64_t k, bool x8) {
  enum { M = 17 };
  uint8_t *w0 = rnd_qmatrix(base, n, k);
  ir_dtype dt;
  uint8_t *wq = maybe_x8(w0, base, n, k, x8, &dt);
  free(w0);
  float *x = rnd_vec(M * k), *bias = rnd_vec(n), *y17 = rnd_vec(M * n), *y5 = rnd_vec(5 * n);
  float *y1 = rnd_vec(n), *yc = rnd_vec(M * n);
  kn_matmul_q8(p4, y17, x, wq, dt, bias, M, n, k, false);
  int ok = 1;
  for (int64_t i = 0; i < M; i++) {
    kn_matmul_q8(i % 2 ? p1 : NULL, y1, x + i * k, wq, dt, bias, 1, n, k, false);
    ok &= memcmp(y1, y17 + i * n, (size_t)n * sizeof(float)) == 0;
  }
  for (int64_t i0 = 0; i0 + 5 <= M; i0 += 3) {
    kn_matmul_q8(p4, y5, x + i0 * k, wq, dt, bias, 5, n, k, false);
    ok &= memcmp(y5, y17 + i0 * n, 5 * (size_t)n * sizeof(float)) == 0;
  }
  int prev = kn_matmul_set_max_isa(0);
  kn_matmul_q8(p4, yc, x, wq, dt, bias, M, n, k, false);
  kn_matmul_set_max_isa(prev);
  CHECKF(ok, "q8 batch invariance dt=%s n=%lld k=%lld", ir_dtype_name(dt), (long long)n,
         (long long)k);
  CHECKF(memcmp(yc, y17, (size_t)(M * n) * sizeof(float)) == 0,
         "q8 portable vs SIMD dt=%s n=%lld k=%lld", ir_dtype_name(dt), (long long)n, (long long)k);
  free(wq), free(x), free(bias), free(y17), free(y5), free(y1), free(yc);
}

/* The GGUF layout (any n) and the 8-row interleaved one (n a multiple of 8): the same
 * integer reference decides both (their orders differ, within f32 rounding). */
static void test_matmul_q8(kn_pool *p1, kn_pool *p4) {
  static const int64_t ms[] = {1, 2, 3, 6}, ns[] = {1, 3, 10, 150}, ks[] = {32, 96, 576};
  static const int64_t ms8[] = {1, 4, 5, 7}, ns8[] = {8, 16, 24, 152};
  double worst = 0;
  for (int isa = 0; isa <= 2; isa++) {
    kn_matmul_set_max_isa(isa);
    for (int d = 0; d < 3; d++)
      for (int mi = 0; mi < 4; mi++)
        for (int ni = 0; ni < 4; ni++)
          for (int ki = 0; ki < 3; ki++) {
            q8_case(mi == 2 ? NULL : p4, k_qtypes[d], isa, (mi + ni) % 2, ms[mi], ns[ni], ks[ki],
                    false, &worst);
            q8_case(mi == 2 ? NULL : p4, k_qtypes[d], isa, (mi + ni) % 2, ms8[mi], ns8[ni], ks[ki],
                    true, &worst);
          }
  }
  kn_matmul_set_max_isa(3);
  bool amx = kn_cpu_isa() >= 3;
  for (int d = 0; d < 3; d++) {
    q8_case(p4, k_qtypes[d], 2, true, 70, 300, 1536, false, &worst);
    /* x8 with AMX where the CPU has it (16-row blocks, the rest on VNNI; n = 152 leaves
     * a lone group, and 88 swiglu columns one too), else AVX-512 again */
    q8_case(p4, k_qtypes[d], 3, true, 70, 304, 1536, true, &worst);
    q8_case(p4, k_qtypes[d], 3, false, 48, 152, 576, true, &worst);
    q8_case(p1, k_qtypes[d], 3, true, 33, 88, 96, true, &worst);
    q8_invariance(p1, p4, k_qtypes[d], 300, 576, false);
    q8_invariance(p1, p4, k_qtypes[d], 7, 32, false);
    /* x8: AVX2, AVX-512 and AMX (groups in pairs; n = 152 leaves a lone one) against C */
    for (int isa = 1; isa <= 3; isa++) {
      kn_matmul_set_max_isa(isa);
      q8_invariance(p1, p4, k_qtypes[d], 304, 576, true);
      q8_invariance(p1, p4, k_qtypes[d], 152, 96, true);
      q8_invariance(p1, p4, k_qtypes[d], 8, 32, true);
    }
    kn_matmul_set_max_isa(2);
  }
  printf("kn_matmul_q8: worst error against the integer reference %.2e of the term sum; "
         "AMX %s\n",
         worst, amx ? "tested" : "not on this CPU (its cases ran on AVX-512)");
}

/* ---- embedding -------------------------------------------------------------------- */

/* Tables in both layouts: every row as kn_dequant_row gives it from the GGUF bytes. */
static void test_embed(kn_pool *p4) {
  enum { V = 56, H = 96, T = 40 };
  for (int d = 0; d < 6; d++) {
    ir_dtype wt;
    uint8_t *tab = rnd_qmatrix(k_qtypes[d % 3], V, H);
    uint8_t *tl = maybe_x8(tab, k_qtypes[d % 3], V, H, d >= 3, &wt);
    float *ref = dequant_matrix(tab, k_qtypes[d % 3], V, H), *out = rnd_vec(T * H);
    int32_t ids[T];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 7 + 3) % V);
    kn_embed(p4, out, tl, wt, ids, T, H);
    int ok = 1;
    for (int t = 0; t < T; t++) ok &= memcmp(out + t * H, ref + ids[t] * H, H * sizeof(float)) == 0;
    CHECKF(ok, "embed dt=%s", ir_dtype_name(wt));
    if (d >= 3) { /* the interleaved bytes are a permutation: each block comes back whole */
      int64_t rb = (int64_t)ir_dtype_bytes(k_qtypes[d % 3], H),
              bb = kn_quant_block_bytes(k_qtypes[d % 3]);
      int same = 1;
      for (int64_t r = 0; r < V; r++)
        for (int64_t b = 0; b < H / KN_QBLOCK; b++) {
          uint8_t blk[34];
          kn_x8_block(tl, k_qtypes[d % 3], H, r, b, blk);
          same &= memcmp(blk, tab + r * rb + b * bb, (size_t)bb) == 0;
        }
      CHECKF(same, "x8 blocks round trip dt=%s", ir_dtype_name(wt));
    }
    free(tab), free(tl), free(ref), free(out);
  }
}

/* ---- the repack pass ---------------------------------------------------------------- */

static int32_t add_w(ir_graph *g, const char *name, ir_dtype dt, int64_t r, int64_t c,
                     const void *data) {
  int64_t shape[2] = {r, c};
  uint64_t bytes = ir_dtype_bytes(dt, (uint64_t)(r * c));
  return ir_graph_add_weight(g, name, dt, 2, shape, data, bytes);
}

/* Which weights pass_repack interleaves: those whose every reader takes the layout. */
static void test_repack_pass(void) {
  ir_graph *g = ir_graph_create();
  g->config =
      (ir_model_config){.max_tokens = 8, .max_seqs = 1, .max_logits = 8, .kv_block_size = 16};
  ir_dim t = {.sym = IR_SYM_TOKENS}, dims[2] = {t, {.n = 64}};
  int32_t x = ir_graph_add_input(g, "x", IR_F32, 2, dims);
  int32_t ids = ir_graph_add_input(g, "ids", IR_I32, 1, &t);
  uint8_t *data[5];
  static const int64_t rows[5] = {16, 12, 16, 24, 32};
  int32_t w[5];
  for (int i = 0; i < 5; i++) {
    char name[8];
    snprintf(name, sizeof name, "w%d", i);
    data[i] = rnd_qmatrix(IR_Q4_0, rows[i], 64);
    w[i] = add_w(g, name, IR_Q4_0, rows[i], 64, data[i]);
  }
  ir_attr a8 = IR_AI(ir_attr_intern("act_int8"), 1);
  ir_attr sw[2] = {a8, IR_AI(ir_attr_intern("act"), IR_ACT_SWIGLU)};
  ir_diag d = {0};
  int32_t out = -1, in[2] = {ids, w[0]};
  CHECK(ir_graph_add_node(g, IR_OP_EMBED, "emb", in, 2, NULL, 0, &out, &d) >= 0); /* tied */
  for (int i = 0; i < 5; i++) {
    in[0] = x, in[1] = w[i];
    CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm", in, 2, i >= 3 ? sw : &a8, i >= 3 ? 2 : 1, &out,
                            &d) >= 0);
  }
  in[1] = w[2];
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm_f32", in, 2, NULL, 0, &out, &d) >= 0);
  CHECK(ir_graph_add_output(g, out));
  pass_log log = {0};
  CHECK(pass_repack(g, &(pass_opts){.act_int8 = true, .repack = true}, &log, &d) == IR_OK);
  ir_status vs = ir_graph_verify(g, &d);
  CHECKF(vs == IR_OK, "%s", d.msg);
  /* w0: embedding + act_int8 matmul; w1: 12 rows; w2: a f32-activation reader too;
   * w3: a gate/up of 12 + 12 rows; w4: 16 + 16 */
  static const ir_dtype want[5] = {IR_Q4_0_X8, IR_Q4_0, IR_Q4_0, IR_Q4_0, IR_Q4_0_X8};
  for (int i = 0; i < 5; i++)
    CHECKF(g->tensors[w[i]].dtype == want[i], "w%d is %s", i,
           ir_dtype_name(g->tensors[w[i]].dtype));
  /* a matmul of an interleaved weight without act_int8 is refused by the IR */
  in[1] = w[0];
  d = (ir_diag){0};
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm_x8_f32", in, 2, NULL, 0, &out, &d) < 0);
  CHECKF(strstr(d.msg, "needs act_int8") != NULL, "%s", d.msg);
  pass_log_free(&log);
  ir_graph_destroy(g);
  for (int i = 0; i < 5; i++) free(data[i]);
}

/* ---- IR rules and folding --------------------------------------------------------- */

static void test_ir_rules(void) {
  ir_graph *g = ir_graph_create();
  g->config =
      (ir_model_config){.max_tokens = 8, .max_seqs = 1, .max_logits = 8, .kv_block_size = 16};
  uint8_t *w64 = rnd_qmatrix(IR_Q4_1, 4, 64), *w48 = calloc(4 * 48, 1);
  ir_dim t = {.sym = IR_SYM_TOKENS};
  ir_dim dims[2] = {t, {.n = 64}}, dims48[2] = {t, {.n = 48}};
  int32_t x = ir_graph_add_input(g, "x", IR_F32, 2, dims);
  int32_t x48 = ir_graph_add_input(g, "x48", IR_F32, 2, dims48);
  int32_t ids = ir_graph_add_input(g, "ids", IR_I32, 1, &t);
  int32_t w = add_w(g, "w", IR_Q4_1, 4, 64, w64);
  int64_t shape48[2] = {4, 48};
  int32_t wbad = ir_graph_add_weight(g, "wbad", IR_Q8_0, 2, shape48, w48, 4 * 48);
  ir_diag d = {0};
  int32_t in[2] = {x, w}, out = -1;
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm", in, 2, NULL, 0, &out, &d) >= 0);
  in[0] = ids;
  CHECK(ir_graph_add_node(g, IR_OP_EMBED, "emb", in, 2, NULL, 0, &out, &d) >= 0);
  /* int8 activations: a block-quantized weight takes them, a float one does not */
  ir_attr a8 = IR_AI(ir_attr_intern("act_int8"), 1);
  in[0] = x;
  in[1] = w;
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm_a8", in, 2, &a8, 1, &out, &d) >= 0);
  float wf[4 * 64] = {0};
  in[1] = add_w(g, "wf", IR_F32, 4, 64, wf);
  d = (ir_diag){0};
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm_f32_a8", in, 2, &a8, 1, &out, &d) < 0);
  CHECKF(strstr(d.msg, "act_int8 goes with") != NULL, "%s", d.msg);
  in[0] = x48;
  in[1] = wbad;
  d = (ir_diag){0};
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm48", in, 2, NULL, 0, &out, &d) < 0);
  CHECKF(strstr(d.msg, "whole 32-value blocks") != NULL, "%s", d.msg);
  /* cast q4_1 -> f32 is allowed, and fold dequantizes it into a weight */
  ir_attr to = IR_AI(ir_attr_intern("to"), IR_F32);
  d = (ir_diag){0};
  int32_t cast = -1;
  CHECK(ir_graph_add_node(g, IR_OP_CAST, "w.f32", &w, 1, &to, 1, &cast, &d) >= 0);
  CHECK(ir_graph_add_output(g, cast));
  pass_log log = {0};
  pass_opts po = {.fold = true};
  CHECK(pass_fold(g, &po, &log, &d) == IR_OK);
  int32_t f = ir_graph_find_tensor(g, "w.f32");
  CHECK(f >= 0 && g->tensors[f].kind == IR_TENSOR_WEIGHT && g->tensors[f].dtype == IR_F32);
  if (f >= 0 && g->tensors[f].data) {
    float *ref = dequant_matrix(w64, IR_Q4_1, 4, 64);
    CHECK(memcmp(g->tensors[f].data, ref, 4 * 64 * sizeof(float)) == 0);
    free(ref);
  }
  pass_log_free(&log);
  ir_graph_destroy(g);
  free(w64), free(w48);
}

int main(void) {
  kn_pool *p1 = kn_pool_create(1), *p4 = kn_pool_create(4);
  CHECK(p1 != NULL && p4 != NULL);
  if (!p1 || !p4) return tcheck_done("quant");
  test_blocks();
  test_embed(p4);
  test_ir_rules();
  test_repack_pass();
  test_matmul_q8(p1, p4);
  test_quant_row();
  /* Every path this CPU can run: portable C, AVX2, AVX-512 (capped paths that the CPU
   * lacks fall back to the best it has, so this stays correct everywhere). */
  for (int isa = 0; isa <= 2; isa++) {
    kn_matmul_set_max_isa(isa);
    test_matmul(p4, isa);
    for (int d = 0; d < 3; d++) {
      matmul_invariance(p1, p4, k_qtypes[d], isa, 300, 576);
      matmul_invariance(p1, p4, k_qtypes[d], isa, 1000, 64);
      matmul_invariance(p1, p4, k_qtypes[d], isa, 7, 32);
    }
  }
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2")) test_isa_agree(p4);
#endif
  kn_matmul_set_max_isa(2);
  kn_pool_destroy(p1);
  kn_pool_destroy(p4);
  return tcheck_done("quant");
}
