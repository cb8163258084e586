/* test_matmul_bf16: kn_matmul_bf16x multiplies bf16 W by x rounded to bf16 with f32 sums,
 * in the order of AVX512-BF16's vdpbf16ps (kn_matmul.c). Checked here:
 *   - every path this CPU runs (portable C, AVX2, AVX-512F with f32 FMAs, and
 *     vdpbf16ps itself where the CPU has it) gives the same bits, over shapes with k
 *     tails, with values whose products and sums go subnormal;
 *   - known answers that only the instruction's order gives: the odd product of a pair
 *     before the even one, subnormal x and products flushed to zero;
 *   - against a double reference of the bf16-rounded x, within f32 summation error;
 *   - a row's bits do not depend on the rows beside it (m = 1 against m = 37), plain and
 *     with the swiglu epilogue;
 *   - the same for W repacked as IR_BF16_X16 (kn_matmul_bf16x16) in its two orders: the
 *     chain order (one chain an output) and the tile order (AMX-BF16's: two chains a block
 *     of 16 pairs), each with known answers only it gives; where the CPU has AMX-BF16,
 *     tdpbf16ps is the oracle of the tile order;
 *   - block W (q8_0, q4_0, q4_1, in the GGUF and the 8-row interleaved layouts) with bf16
 *     activations (kn_matmul_bf16q): on every path, bit for bit the bf16x16 matmul of W's
 *     values (kn_dequant_row, the contract gguf-py checks in test_quant) rounded to bf16, in
 *     both orders, and a row alone as in the batch.
 * Where the CPU has AVX512-BF16, the instruction is the oracle of the order; elsewhere
 * the paths are checked against each other and the known answers. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "kn_bf16.h"
#include "kn_cpu.h"
#include "kn_quant.h"
#include "tcheck.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static uint32_t rnd_u32(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return (uint32_t)(g_rng >> 11);
}

static float rnd(void) { return (float)rnd_u32() / 2147483648.0f - 1.0f; } /* [-1, 1) */

/* Random values; with edges, a quarter of them tiny (products and sums subnormal), some
 * subnormal themselves, some zero. */
static float rnd_val(int edges) {
  float v = rnd();
  if (!edges) return v;
  switch (rnd_u32() % 8) {
  case 0: return v * 1e-19f;
  case 1: return v * 1e-39f; /* subnormal */
  case 2: return 0.0f;
  default: return v;
  }
}

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* With g_x16, W is packed as IR_BF16_X16 and run through kn_matmul_bf16x16, in the chain
 * order (g_x16 1) or the tile order (2). */
static int g_x16;

/* The paths of a case: the ISA cap and whether vdpbf16ps is on. The tile order runs on
 * the portable C, AVX-512F (x converted by the portable code, then by vcvtne2ps2bf16 where
 * the CPU has it), and AMX-BF16 (isa 3) where the CPU has it. */
static int g_amx;
static int n_paths(int has_dp) {
  return g_x16 == 2 ? 2 + has_dp + (has_dp && g_amx) : has_dp ? 4 : 3;
}
static int path_isa(int q) { return g_x16 == 2 ? (q == 0 ? 0 : q < 3 ? 2 : 3) : q < 3 ? q : 2; }
static int path_dp(int q) { return g_x16 == 2 ? q >= 2 : q == 3; }

static void run(int isa, int dp, float *y, const float *x, const uint16_t *w, const float *bias,
                int64_t m, int64_t n, int64_t k, int swiglu, kn_pool *p) {
  kn_matmul_set_max_isa(isa);
  kn_matmul_use_bf16dp(dp);
  if (g_x16) kn_matmul_set_x16_order(g_x16 == 2 ? KN_X16_TILE : KN_X16_CHAIN);
  if (!g_x16) {
    kn_matmul_bf16x(p, y, x, w, bias, m, n, k, swiglu);
    return;
  }
  int64_t rows = swiglu ? 2 * n : n;
  uint16_t *packed = malloc((size_t)(rows * k) * sizeof *packed);
  kn_x16_pack(w, rows, k, packed);
  kn_matmul_bf16x16(p, y, x, packed, bias, m, n, k, swiglu);
  free(packed);
}

/* The paths against each other (and m = 1 against the batch). */
static void paths_case(kn_pool *p, int64_t m, int64_t n, int64_t k, int swiglu, int edges,
                       int has_dp) {
  int64_t rows = swiglu ? 2 * n : n;
  float *x = malloc((size_t)(m * k) * sizeof *x), *bias = malloc((size_t)rows * sizeof *bias);
  uint16_t *w = malloc((size_t)(rows * k) * sizeof *w);
  float *y[4], *y1 = malloc((size_t)n * sizeof *y1);
  for (int64_t i = 0; i < m * k; i++) x[i] = rnd_val(edges);
  for (int64_t i = 0; i < rows * k; i++) w[i] = ir_f32_to_bf16(rnd_val(edges));
  for (int64_t i = 0; i < rows; i++) bias[i] = rnd();
  int paths = n_paths(has_dp);
  for (int q = 0; q < paths; q++) {
    y[q] = malloc((size_t)(m * n) * sizeof *y[q]);
    run(path_isa(q), path_dp(q), y[q], x, w, bias, m, n, k, swiglu, p);
  }
  int same = 1; /* (swiglu's silu epilogue is vectorised per kernel width: dot products only) */
  for (int q = 1; q < paths && !swiglu; q++)
    same &= memcmp(y[0], y[q], (size_t)(m * n) * sizeof(float)) == 0;
  CHECKF(same, "m=%lld n=%lld k=%lld swiglu=%d edges=%d: paths differ", (long long)m, (long long)n,
         (long long)k, swiglu, edges);
  int alone = 1; /* each row by itself, on the best path */
  for (int64_t i = 0; i < m; i++) {
    run(path_isa(paths - 1), path_dp(paths - 1), y1, x + i * k, w, bias, 1, n, k, swiglu, NULL);
    alone &= memcmp(y1, y[paths - 1] + i * n, (size_t)n * sizeof(float)) == 0;
  }
  CHECKF(alone, "m=%lld n=%lld k=%lld swiglu=%d: a row alone differs from the batch", (long long)m,
         (long long)n, (long long)k, swiglu);
  if (swiglu) { /* each path: the plain matmul of the 2n rows, then the gate, bit for bit */
    float *z = malloc((size_t)(m * 2 * n) * sizeof *z), *g = malloc((size_t)(m * n) * sizeof *g);
    int gated = 1;
    for (int q = 0; q < paths; q++) {
      run(path_isa(q), path_dp(q), z, x, w, bias, m, 2 * n, k, 0, p);
      for (int64_t i = 0; i < m; i++) kn_silu_mul_n(g + i * n, z + i * 2 * n, z + i * 2 * n + n, n);
      gated &= memcmp(g, y[q], (size_t)(m * n) * sizeof(float)) == 0;
    }
    CHECKF(gated, "m=%lld n=%lld k=%lld: swiglu differs from the matmul then the gate",
           (long long)m, (long long)n, (long long)k);
    free(z), free(g);
  }
  if (!swiglu && !edges) { /* against double sums of the bf16 values */
    int ok = 1;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = bias[j], a = fabs(bias[j]);
        for (int64_t t = 0; t < k; t++) {
          double xv = ir_bf16_to_f32(ir_f32_to_bf16(x[i * k + t])),
                 wv = ir_bf16_to_f32(w[j * k + t]);
          s += xv * wv;
          a += fabs(xv * wv);
        }
        ok &= fabs(y[0][i * n + j] - s) <= 1e-5 * a + 1e-30;
      }
    CHECKF(ok, "m=%lld n=%lld k=%lld: off the double reference", (long long)m, (long long)n,
           (long long)k);
  }
  for (int q = 0; q < paths; q++) free(y[q]);
  free(x), free(bias), free(w), free(y1);
}

/* y of one row (n = 1) with x and w given, on every path; all must equal want. */
static void known(const char *what, const float *x, const float *w, int64_t k, float want,
                  int has_dp) {
  uint16_t wb[16 * 128]; /* 16 equal rows (a bf16x16 group) */
  for (int r = 0; r < 16; r++)
    for (int64_t i = 0; i < k; i++) wb[r * k + i] = ir_f32_to_bf16(w[i]);
  for (int q = 0; q < n_paths(has_dp); q++) {
    float y[16] = {0};
    run(path_isa(q), path_dp(q), y, x, wb, NULL, 1, 16, k, 0, NULL);
    CHECKF(memcmp(&y[0], &want, sizeof want) == 0 && memcmp(&y[15], &want, sizeof want) == 0,
           "%s%s, path %d: %.9g, want %.9g", what, g_x16 ? " (bf16x16)" : "", q, (double)y[0],
           (double)want);
  }
}

/* More known answers, on every path (k 32 or more: x converted by the vector code too). */
static void known_more(int has_dp) {
  float x[64] = {0}, w[64] = {0};
  x[0] = 0x1p64f, w[0] = bits_f(0x00400000u); /* a subnormal w is zero, whatever x */
  known("subnormal w flushed", x, w, 32, 0.0f, has_dp);
  memset(x, 0, sizeof x), memset(w, 0, sizeof w);
  x[0] = 1.0f + 0x1p-8f, w[0] = 1.0f;            /* a tie: to even, 1 */
  x[1] = 1.0f + 3 * 0x1p-8f, w[1] = 1.0f;        /* a tie: to even, 1 + 2^-6 */
  x[2] = 1.0f + 0x1p-8f + 0x1p-20f, w[2] = 1.0f; /* past the tie: 1 + 2^-7 */
  known("x rounded to nearest even", x, w, 40, 3.0f + 0x1p-6f + 0x1p-7f, has_dp);
  /* An exact 2^-126 - 2^-150 (x1 w1 = 2^-126 first, then -2^-150): tiny before rounding to
   * the subnormal grid, so flushed, as FTZ does (the grid's rounding would give 2^-126). */
  memset(x, 0, sizeof x), memset(w, 0, sizeof w);
  if (g_x16 != 2) {
    x[0] = 0x1p-75f, w[0] = -0x1p-75f, x[1] = 0x1p-63f, w[1] = 0x1p-63f;
    known("tiny before rounding flushed", x, w, 2, 0.0f, has_dp);
    return;
  }
  /* the tile order: the two in one (the even) chain, as x0 w0 then x2 w2; products in two
   * chains meet only in their sum (-2^-150 flushed to -0 alone, then -0 + 2^-126) */
  x[0] = 0x1p-63f, w[0] = 0x1p-63f, x[2] = 0x1p-75f, w[2] = -0x1p-75f;
  known("tiny before rounding flushed", x, w, 4, 0.0f, has_dp);
  memset(x, 0, sizeof x), memset(w, 0, sizeof w);
  x[0] = 0x1p-75f, w[0] = -0x1p-75f, x[1] = 0x1p-63f, w[1] = 0x1p-63f;
  known("a tiny chain flushed alone", x, w, 2, 0x1p-126f, has_dp);
}

/* An empty graph with small step limits (the verifier wants positive ones). */
static ir_graph *small_graph(void) {
  ir_graph *g = ir_graph_create();
  g->config =
      (ir_model_config){.max_tokens = 8, .max_seqs = 1, .max_logits = 1, .kv_block_size = 16};
  return g;
}

/* The IR's rules for the bf16-activation matmuls (hostile plans meet these on load). */
static void ir_rules(void) {
  static uint16_t wd[48 * 64];
  ir_graph *g = small_graph();
  ir_dim xd[2] = {{.sym = IR_SYM_TOKENS}, {.n = 64}};
  int32_t x = ir_graph_add_input(g, "x", IR_F32, 2, xd);
  int32_t ids = ir_graph_add_input(g, "ids", IR_I32, 1, (ir_dim[]){{.sym = IR_SYM_TOKENS}});
  int32_t wb = ir_graph_add_weight(g, "wb", IR_BF16, 2, (int64_t[]){32, 64}, wd, 32 * 64 * 2);
  int32_t w16 = ir_graph_add_weight(g, "w16", IR_BF16_X16, 2, (int64_t[]){32, 64}, wd, 32 * 64 * 2);
  int32_t w48 = ir_graph_add_weight(g, "w48", IR_BF16_X16, 2, (int64_t[]){48, 64}, wd, 48 * 64 * 2);
  int32_t wf = ir_graph_add_weight(g, "wf", IR_F32, 2, (int64_t[]){8, 64}, wd, 8 * 64 * 4);
  int32_t wq = ir_graph_add_weight(g, "wq", IR_Q4_1, 2, (int64_t[]){32, 64}, wd, 32 * 2 * 20);
  int32_t wq8 = ir_graph_add_weight(g, "wq8", IR_Q8_0_X8, 2, (int64_t[]){16, 64}, wd, 16 * 2 * 34);
  int32_t wq24 = ir_graph_add_weight(g, "wq24", IR_Q4_0, 2, (int64_t[]){24, 64}, wd, 24 * 2 * 18);
  struct {
    const char *name;
    int32_t w;
    bool bf16, swiglu, int8;
    const char *want; /* NULL: accepted */
  } cases[] = {
      {"q4_1", wq, true, false, false, NULL},
      {"q4_1_swiglu", wq, true, true, false, NULL},
      {"q8_0_x8", wq8, true, false, false, NULL},
      {"q8_0_x8_int8", wq8, false, false, true, NULL},
      {"q8_0_x8_none", wq8, false, false, false, "needs act_int8 or act_bf16"},
      {"q8_0_x8_swiglu", wq8, true, true, false, "whole 16-row groups"},
      {"q4_0_24", wq24, true, false, false, "whole 16-row groups"},
      {"q4_1_both", wq, true, false, true, "exclude each other"},
      {"bf16", wb, true, false, false, NULL},
      {"x16", w16, true, false, false, NULL},
      {"x16_swiglu", w16, true, true, false, NULL},
      {"x16_swiglu_48", w48, true, true, false, "whole 16-row groups"},
      {"x16_no_act", w16, false, false, false, "needs act_bf16"},
      {"f32_act_bf16", wf, true, false, false, "act_bf16 goes with a bf16 or q8_0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ir_attr at[3];
    int na = 0;
    if (cases[i].bf16) at[na++] = IR_AI(ir_attr_intern("act_bf16"), 1);
    if (cases[i].int8) at[na++] = IR_AI(ir_attr_intern("act_int8"), 1);
    if (cases[i].swiglu) at[na++] = IR_AI(ir_attr_intern("act"), IR_ACT_SWIGLU);
    ir_diag d = {0};
    int32_t out;
    bool ok = ir_graph_add_node(g, IR_OP_MATMUL, cases[i].name, (int32_t[]){x, cases[i].w}, 2, at,
                                na, &out, &d) >= 0;
    if (cases[i].want)
      CHECKF(!ok && strstr(d.msg, cases[i].want), "%s: '%s'", cases[i].name, d.msg);
    else CHECKF(ok, "%s: %s", cases[i].name, d.msg);
  }
  /* block weights with act_bf16 take the step's token rows only (a row's kind picks its
   * kernel): a matmul over the logit rows is refused */
  ir_dim ld[2] = {{.sym = IR_SYM_LOGITS}, {.n = 64}};
  int32_t xl = ir_graph_add_input(g, "xl", IR_F32, 2, ld);
  ir_attr bf = IR_AI(ir_attr_intern("act_bf16"), 1);
  ir_diag dl = {0};
  int32_t outl;
  CHECKF(ir_graph_add_node(g, IR_OP_MATMUL, "q4_1_logit_rows", (int32_t[]){xl, wq}, 2, &bf, 1,
                           &outl, &dl) < 0 &&
             strstr(dl.msg, "token rows"),
         "act_bf16 over a block weight on the logit rows: '%s'", dl.msg);
  ir_diag d = {0};
  int32_t out;
  CHECKF(ir_graph_add_node(g, IR_OP_EMBED, "embed_x16", (int32_t[]){ids, w16}, 2, NULL, 0, &out,
                           &d) < 0 &&
             strstr(d.msg, "matmuls only"),
         "a bf16x16 embedding table: '%s'", d.msg);
  ir_graph_destroy(g);
  /* a bf16x16 weight of 8 rows, or of an odd K, is refused (when added or verified) */
  for (int c = 0; c < 2; c++) {
    ir_graph *g2 = small_graph();
    ir_diag d2 = {0};
    int64_t dims[2] = {c ? 16 : 8, c ? 63 : 64};
    bool refused =
        ir_graph_add_weight(g2, "w", IR_BF16_X16, 2, dims, wd, dims[0] * dims[1] * 2) < 0 ||
        (ir_graph_verify(g2, &d2) != IR_OK && strstr(d2.msg, "multiple of 16 rows"));
    CHECKF(refused, "a bf16x16 weight of %lld x %lld accepted: '%s'", (long long)dims[0],
           (long long)dims[1], d2.msg);
    ir_graph_destroy(g2);
  }
}

/* kn_matmul_bf16q: W quantized to dt (base layout, or interleaved with x8) against the
 * bf16x16 matmul of its values rounded to bf16 (the best path of the current order), on
 * every path; then each row alone. */
static void q16_case(kn_pool *p, ir_dtype dt, int x8, int64_t m, int64_t n, int64_t k, int swiglu,
                     int has_dp) {
  int64_t rows = swiglu ? 2 * n : n;
  size_t wbytes = (size_t)ir_dtype_bytes(dt, (uint64_t)(rows * k));
  float *x = malloc((size_t)(m * k) * sizeof *x), *bias = malloc((size_t)rows * sizeof *bias);
  float *wf = malloc((size_t)(rows * k) * sizeof *wf);
  uint8_t *wq = malloc(wbytes), *wx = malloc(wbytes);
  uint16_t *wb = malloc((size_t)(rows * k) * sizeof *wb);
  float *ref = malloc((size_t)(m * n) * sizeof *ref), *y = malloc((size_t)(m * n) * sizeof *y);
  for (int64_t i = 0; i < m * k; i++) x[i] = rnd() * 4.0f;
  for (int64_t i = 0; i < rows * k; i++) wf[i] = rnd() * (i % 7 ? 0.05f : 1.0f);
  for (int64_t i = 0; i < rows; i++) bias[i] = rnd();
  for (int64_t r = 0; r < rows; r++)
    kn_quant_row(wf + r * k, dt, wq + r * ir_dtype_bytes(dt, (uint64_t)k), k);
  kn_dequant_row(wq, dt, wf, rows * k);
  for (int64_t i = 0; i < rows * k; i++) wb[i] = kn_bf16_round(wf[i]);
  if (x8) kn_x8_pack(wq, dt, rows, k, wx);
  else memcpy(wx, wq, wbytes);
  ir_dtype wt = x8 ? ir_dtype_x8_of(dt) : dt;
  int paths = n_paths(has_dp), same = 1, alone = 1;
  run(path_isa(paths - 1), path_dp(paths - 1), ref, x, wb, bias, m, n, k, swiglu, p);
  for (int q = 0; q < paths; q++) {
    run(path_isa(q), path_dp(q), y, x, wb, bias, 0, n, k, swiglu, p); /* (sets the path) */
    kn_matmul_bf16q(q % 2 ? p : NULL, y, x, wx, wt, bias, m, n, k, swiglu);
    /* (swiglu's silu epilogue is vectorised per kernel width: the same path only) */
    if (!swiglu || q == paths - 1) same &= memcmp(ref, y, (size_t)(m * n) * sizeof *y) == 0;
  }
  for (int64_t i = 0; i < m && i < 40; i++) {
    kn_matmul_bf16q(NULL, y, x + i * k, wx, wt, bias, 1, n, k, swiglu);
    alone &= memcmp(y, ref + i * n, (size_t)n * sizeof *y) == 0;
  }
  CHECKF(same && alone, "%s%s m=%lld n=%lld k=%lld swiglu=%d order=%d: %s", ir_dtype_name(dt),
         x8 ? " x8" : "", (long long)m, (long long)n, (long long)k, swiglu, g_x16,
         same ? "a row alone differs from the batch" : "off the bf16 matmul of W's values");
  free(x), free(bias), free(wf), free(wq), free(wx), free(wb), free(ref), free(y);
}

static void q16_cases(kn_pool *p3, int has_dp) {
  static const ir_dtype dts[] = {IR_Q8_0, IR_Q4_0, IR_Q4_1};
  static const int64_t ms[] = {1, 3, 37, 600}, ns[] = {16, 48, 80}, ks[] = {32, 64, 576};
  int c = 0;
  for (int di = 0; di < 3; di++)
    for (int x8 = 0; x8 < 2; x8++)
      for (int mi = 0; mi < 4; mi++, c++)
        q16_case(p3, dts[di], x8, ms[mi], ns[c % 3], ks[(c / 3) % 3], c % 2, has_dp);
  q16_case(p3, IR_Q4_1, 1, 70, 96, 1536, 1, has_dp);
  q16_case(p3, IR_Q8_0, 1, 520, 160, 2048, 0, has_dp);
}

/* The IR_BF16_X16 cases of the current order: known answers, then the paths. */
static void x16_cases(kn_pool *p3, int has_dp) {
  float x[64] = {0}, w[64] = {0};
  x[0] = bits_f(0x00400000u), w[0] = 1.0f;
  x[1] = w[1] = 0x1p-70f;
  known("subnormals flushed", x, w, 2, 0.0f, has_dp);
  known_more(has_dp);
  static const int64_t ms[] = {1, 2, 5, 37}, ns16[] = {16, 48, 80}, ks16[] = {2, 6, 64, 66, 576};
  for (int mi = 0; mi < 4; mi++)
    for (int ni = 0; ni < 3; ni++)
      for (int ki = 0; ki < 5; ki++)
        for (int sw = 0; sw < 2; sw++)
          paths_case(mi % 2 ? p3 : NULL, ms[mi], ns16[ni], ks16[ki], sw, (ki + ni) % 2, has_dp);
  paths_case(p3, 70, 96, 576, 1, 1, has_dp);
  paths_case(p3, 150, 48, 1536, 0, 1, has_dp);
  paths_case(p3, 40, 32, 2100, 1, 1, has_dp); /* k blocks of KN_MM_X16_KB pairs, a short tail */
}

int main(void) {
  kn_pool *p3 = kn_pool_create(3);
  CHECK(p3 != NULL);
  if (!p3) return tcheck_done("matmul_bf16");
  kn_matmul_set_max_isa(2);
  kn_matmul_use_bf16dp(1);
  int has_dp = kn_matmul_bf16dp();
  printf("AVX512-BF16 %s\n", has_dp ? "present: vdpbf16ps checked against the f32-FMA paths"
                                    : "absent: the f32-FMA paths checked against each other");
  kn_matmul_set_max_isa(3);
  g_amx = kn_cpu_has_amx_bf16() && kn_cpu_isa() >= 3;
  kn_matmul_set_max_isa(2);
  printf("AMX-BF16 %s\n",
         g_amx ? "present: tdpbf16ps checked against the tile order's other paths"
               : "absent: the tile order checked on the portable and AVX-512F paths");

  /* Lane 0 takes pairs 0 and 16 (k 0, 1 and 32, 33). The documented order adds x1 w1, x0 w0,
   * x33 w33, x32 w32: 2^-24 + 0 + 2^-24 + 1 = 1 + 2^-23 exactly; an even-first order
   * rounds 2^-24 + 1 to 1 before the second 2^-24 (1.0). */
  float x[64] = {0}, w[64] = {0};
  x[1] = w[1] = x[33] = w[33] = 0x1p-12f;
  x[32] = w[32] = 1.0f;
  known("odd product first", x, w, 34, 1.0f + 0x1p-23f, has_dp);
  /* Subnormal x is zero; a subnormal product (2^-70 * 2^-70) flushes to zero. */
  memset(x, 0, sizeof x), memset(w, 0, sizeof w);
  x[0] = bits_f(0x00400000u), w[0] = 1.0f; /* 2^-127 */
  x[1] = w[1] = 0x1p-70f;
  known("subnormals flushed", x, w, 2, 0.0f, has_dp);
  x[2] = 1.0f, w[2] = 3.0f; /* ... and a normal sum is kept */
  known("normal kept", x, w, 3, 3.0f, has_dp);
  known_more(has_dp);

  static const int64_t ms[] = {1, 2, 5, 37}, ns[] = {1, 9, 40},
                       ks[] = {1, 5, 31, 32, 33, 64, 172, 576};
  for (int mi = 0; mi < 4; mi++)
    for (int ni = 0; ni < 3; ni++)
      for (int ki = 0; ki < 8; ki++)
        for (int sw = 0; sw < 2; sw++)
          paths_case(mi % 2 ? p3 : NULL, ms[mi], ns[ni], ks[ki], sw, (ki + ni) % 2, has_dp);
  /* past the stack buffer of converted rows (heap), and a long row */
  paths_case(p3, 70, 33, 576, 0, 1, has_dp);
  paths_case(p3, 3, 5, 40000, 1, 0, has_dp);

  /* bf16x16, chain order: one chain an output over the pairs. Pairs 0, 1 (k 0-3) in order
   * x1 w1, x0 w0, x3 w3, x2 w2: 2^-24 + 0 + 2^-24 + 1 = 1 + 2^-23 exactly (the k-lane
   * order above folds 2^-24 into 1 + 0 and gives 1; an even-first chain gives 1 too). */
  g_x16 = 1;
  memset(x, 0, sizeof x), memset(w, 0, sizeof w);
  x[1] = w[1] = x[3] = w[3] = 0x1p-12f;
  x[2] = w[2] = 1.0f;
  known("one chain, odd product first", x, w, 4, 1.0f + 0x1p-23f, has_dp);
  /* ... and where the tile order differs: x0 w0 = 1, x1 w1 = x3 w3 = 2^-24; the chain
   * gives 2^-24 + 1 = 1 (a tie, to even) and 1 + 2^-24 = 1 again */
  memset(x, 0, sizeof x), memset(w, 0, sizeof w);
  x[0] = w[0] = 1.0f, x[1] = w[1] = x[3] = w[3] = 0x1p-12f;
  known("one chain, not two", x, w, 4, 1.0f, has_dp);
  x16_cases(p3, has_dp);

  /* bf16x16, tile order: two chains a block of 16 pairs. The same x and w: the even chain
   * 1, the odd one 2^-24 + 2^-24 = 2^-23, then 1 + 2^-23 exactly. */
  g_x16 = 2;
  known("two chains, then their sum", x, w, 4, 1.0f + 0x1p-23f, has_dp);
  /* blocks: x0 w0 = 1 in block 0, x32 w32 = x33 w33 = 2^-24 in block 1 (pair 16): block 1's
   * 2^-24 + 2^-24 goes into the sum whole (1 + 2^-23); chains over all of k would give
   * (1 + 2^-24) + 2^-24 = 1 */
  memset(x, 0, sizeof x), memset(w, 0, sizeof w);
  x[0] = w[0] = 1.0f, x[32] = w[32] = x[33] = w[33] = 0x1p-12f;
  known("blocks of 16 pairs", x, w, 34, 1.0f + 0x1p-23f, has_dp);
  /* a short last block is the instruction's over zero pairs, each adding +0: block 0 leaves
   * -1.5 2^-126, block 1 adds 2^-126 (-0.5 2^-126: flushed to -0), pair 32's products
   * -2^-130 flush to -0; without the zero pairs -0 + (-0 + -0) = -0, with them +0 */
  float x3[128] = {0}, w3[128] = {0};
  x3[0] = -1.5f * 0x1p-63f, w3[0] = 0x1p-63f, x3[32] = w3[32] = 0x1p-63f;
  x3[64] = -0x1p-65f, w3[64] = 0x1p-65f, x3[65] = 0x1p-65f, w3[65] = -0x1p-65f;
  known("a short block's zero pairs", x3, w3, 66, 0.0f, has_dp);
  x16_cases(p3, has_dp);
  q16_cases(p3, has_dp);
  g_x16 = 1;
  q16_cases(p3, has_dp);
  g_x16 = 0;
  kn_matmul_set_x16_order(-1);
  /* k = 0: the bias, as kn_matmul gives it */
  float bias0[16], y0[16], y1[16], x0[1] = {0};
  for (int i = 0; i < 16; i++) bias0[i] = (float)i - 3.5f;
  kn_matmul_bf16x(NULL, y0, x0, (const uint16_t *)bias0, bias0, 1, 16, 0, false);
  kn_matmul_bf16x16(NULL, y1, x0, bias0, bias0, 1, 16, 0, false);
  CHECK(memcmp(y0, bias0, sizeof y0) == 0 && memcmp(y1, bias0, sizeof y1) == 0);
  ir_rules();
  kn_matmul_set_max_isa(2);
  kn_matmul_use_bf16dp(1);
  kn_pool_destroy(p3);
  return tcheck_done("matmul_bf16");
}
