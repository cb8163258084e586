/* test_matmul_panel: kn_matmul's panel path (several x rows against f16, bf16 or
 * block-quantized W: each panel of W rows converted to f32 once, then swept by every row)
 * must give exactly the bits of the single-row path, which converts W in registers: on
 * every instruction set this CPU runs, for plain and swiglu-epilogue matmuls, at batch
 * sizes on both sides of the threshold and on edge tiles, threaded and not, and with a
 * k too long for a panel (the fallback). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kn_cpu.h"
#include "kn_quant.h"
#include "tcheck.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd_u32(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 11);
}

static float rnd(void) { return (float)rnd_u32() / 2147483648.0f - 1.0f; } /* [-1, 1) */

static float *rnd_vec(int64_t n) {
  float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = rnd();
  return v;
}

static void put_u16(uint8_t *p, uint16_t h) {
  p[0] = (uint8_t)h;
  p[1] = (uint8_t)(h >> 8);
}

/* (n, k) of dtype dt with random values (finite, modest scales for block types). */
static uint8_t *rnd_matrix(ir_dtype dt, int64_t n, int64_t k) {
  uint64_t bytes = ir_dtype_bytes(dt, (uint64_t)(n * k));
  uint8_t *w = malloc(bytes);
  if (dt == IR_F16 || dt == IR_BF16) {
    for (uint64_t i = 0; i < bytes / 2; i++) {
      float v = rnd();
      put_u16(w + 2 * i, dt == IR_F16 ? ir_f32_to_f16(v) : ir_f32_to_bf16(v));
    }
    return w;
  }
  int bb = kn_quant_block_bytes(dt);
  for (uint64_t b = 0; b < bytes / (uint64_t)bb; b++) {
    uint8_t *blk = w + b * (uint64_t)bb;
    for (int i = 0; i < bb; i++) blk[i] = (uint8_t)rnd_u32();
    put_u16(blk, ir_f32_to_f16(0.002f + 0.05f * fabsf(rnd())));
    if (dt == IR_Q4_1) put_u16(blk + 2, ir_f32_to_f16(0.5f * rnd()));
  }
  return w;
}

/* y (m rows) against each row computed alone. swiglu: W has 2n rows. */
static void panel_case(kn_pool *pm, kn_pool *p1, ir_dtype dt, int isa, bool swiglu, int64_t m,
                       int64_t n, int64_t k) {
  int64_t rows = swiglu ? 2 * n : n;
  uint8_t *w = rnd_matrix(dt, rows, k);
  float *x = rnd_vec(m * k), *bias = rnd_vec(rows), *y = rnd_vec(m * n), *y1 = rnd_vec(n);
  if (swiglu) kn_matmul_swiglu(pm, y, x, w, dt, bias, m, n, k);
  else kn_matmul(pm, y, x, w, dt, bias, m, n, k);
  int ok = 1;
  for (int64_t i = 0; i < m; i++) {
    kn_pool *p = i % 2 ? p1 : NULL;
    if (swiglu) kn_matmul_swiglu(p, y1, x + i * k, w, dt, bias, 1, n, k);
    else kn_matmul(p, y1, x + i * k, w, dt, bias, 1, n, k);
    ok &= memcmp(y1, y + i * n, (size_t)n * sizeof(float)) == 0;
  }
  CHECKF(ok, "dt=%s isa=%d swiglu=%d m=%lld n=%lld k=%lld: rows differ from single-row bits",
         ir_dtype_name(dt), isa, swiglu, (long long)m, (long long)n, (long long)k);
  free(w), free(x), free(bias), free(y), free(y1);
}

int main(void) {
  kn_pool *p1 = kn_pool_create(1), *p3 = kn_pool_create(3);
  CHECK(p1 != NULL && p3 != NULL);
  if (!p1 || !p3) return tcheck_done("matmul_panel");
  static const ir_dtype dts[] = {IR_F16, IR_BF16, IR_Q8_0, IR_Q4_0, IR_Q4_1};
  /* m: below, at and past the thresholds (3 for block-quantized W on AVX2, else 8), past
   * one m tile (64) with leftovers of 1..3. */
  static const int64_t ms[] = {2, 3, 4, 7, 8, 9, 11, 70}, ns[] = {1, 7, 33, 300};
  for (int isa = 0; isa <= 2; isa++) {
    kn_matmul_set_max_isa(isa);
    for (int d = 0; d < 5; d++) {
      bool q = ir_dtype_is_quant(dts[d]);
      int64_t ks[2] = {q ? 32 : 5, q ? 576 : 172}; /* f16/bf16: k % 16 tails too */
      for (int mi = 0; mi < 8; mi++)
        for (int ni = 0; ni < 4; ni++)
          for (int ki = 0; ki < 2; ki++)
            for (int sw = 0; sw < 2; sw++)
              panel_case((mi + ni) % 2 ? p3 : NULL, p1, dts[d], isa, sw, ms[mi], ns[ni], ks[ki]);
      /* A W row too long for a panel of one kernel width: the in-register fallback. */
      panel_case(p3, p1, dts[d], isa, false, 9, 5, 16384 + 32);
    }
  }
  kn_matmul_set_max_isa(2);
  kn_pool_destroy(p1);
  kn_pool_destroy(p3);
  return tcheck_done("matmul_panel");
}
