/* test_passes: dce, fold and add+rms_norm fusion on hand-built graphs, the memory plan's
 * invariant on the real Llama graphs of the fixtures, and that fused / unfused and
 * folded / unfolded plans of the same checkpoint give the same logits (each fusion on its
 * own: test_fusion). */
#include "pass.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inferrt.h"
#include "infc_build.h"
#include "tcheck.h"

static ir_dim DS(ir_sym s) { return (ir_dim){.n = 0, .sym = s}; }
static ir_dim DN(int64_t n) { return (ir_dim){.n = n, .sym = IR_SYM_NONE}; }

static ir_graph *new_graph(void) {
  ir_graph *g = ir_graph_create();
  if (!g) abort();
  snprintf(g->config.arch, sizeof g->config.arch, "test");
  g->config.max_tokens = 16;
  g->config.max_seqs = 2;
  g->config.max_logits = 2;
  g->config.kv_block_size = 16;
  return g;
}

static int32_t input2(ir_graph *g, const char *name, int64_t cols) {
  ir_dim d[2] = {DS(IR_SYM_TOKENS), DN(cols)};
  return ir_graph_add_input(g, name, IR_F32, 2, d);
}

static int32_t weight(ir_graph *g, const char *name, ir_dtype dt, int rank, int64_t d0, int64_t d1,
                      const void *data) {
  int64_t shape[2] = {d0, d1};
  uint64_t n = (uint64_t)d0 * (uint64_t)(rank == 2 ? d1 : 1);
  return ir_graph_add_weight(g, name, dt, rank, shape, data, ir_dtype_bytes(dt, n));
}

static int32_t node(ir_graph *g, ir_op op, const char *name, int32_t a, int32_t b, int32_t c,
                    const ir_attr *attrs, int n_attrs) {
  int32_t in[3] = {a, b, c}, out = -1;
  int n_in = c >= 0 ? 3 : b >= 0 ? 2 : 1;
  ir_diag d = {0};
  CHECKF(ir_graph_add_node(g, op, name, in, n_in, attrs, n_attrs, &out, &d) >= 0, "%s: %s", name,
         d.msg);
  return out;
}

static int32_t find_node(const ir_graph *g, const char *name) {
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (strcmp(g->nodes[i].name, name) == 0) return i;
  return -1;
}

static int count_op(const ir_graph *g, ir_op op) {
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
  return n;
}

static void expect_valid(const ir_graph *g, const char *what) {
  ir_diag d = {0};
  CHECKF(ir_graph_verify(g, &d) == IR_OK, "%s: %s", what, d.msg);
}

static bool log_has(const pass_log *log, const char *s) {
  for (int i = 0; i < log->n; i++)
    if (strstr(log->lines[i], s)) return true;
  return false;
}

static float g_w8[64], g_w4[32], g_wd[32];

/* ---- (a) dead-code elimination -------------------------------------------------------- */

static void test_dce(void) {
  ir_graph *g = new_graph();
  int32_t x = input2(g, "x", 8);
  ir_dim one = DN(4);
  int32_t spare = ir_graph_add_input(g, "unused_input", IR_I32, 1, &one);
  int32_t wl = weight(g, "w_live", IR_F32, 2, 8, 8, g_w8);
  int32_t wd = weight(g, "w_dead", IR_F32, 2, 4, 8, g_wd);
  int32_t wq = weight(g, "wq", IR_F32, 2, 8, 8, g_w8), wk = weight(g, "wk", IR_F32, 2, 4, 8, g_w4);
  int32_t wv = weight(g, "wv", IR_F32, 2, 4, 8, g_w4);
  CHECK(spare >= 0 && wd >= 0);
  int32_t live = node(g, IR_OP_MATMUL, "live", x, wl, -1, NULL, 0);
  int32_t dead = node(g, IR_OP_MATMUL, "dead", x, wd, -1, NULL, 0);
  node(g, IR_OP_ADD, "dead2", dead, dead, -1, NULL, 0); /* dead only through its user */
  node(g, IR_OP_MATMUL, "dead_shares_weight", x, wl, -1, NULL, 0);
  int32_t q = node(g, IR_OP_MATMUL, "q", x, wq, -1, NULL, 0);
  int32_t k = node(g, IR_OP_MATMUL, "k", x, wk, -1, NULL, 0);
  int32_t v = node(g, IR_OP_MATMUL, "v", x, wv, -1, NULL, 0);
  ir_attr aa[5] = {IR_AI(ir_attr_intern("layer"), 0), IR_AI(ir_attr_intern("n_heads"), 2),
                   IR_AI(ir_attr_intern("n_kv_heads"), 1), IR_AI(ir_attr_intern("head_dim"), 4),
                   IR_AF(ir_attr_intern("scale"), 0.5)};
  node(g, IR_OP_ATTENTION, "attn", q, k, v, aa, 5); /* output unused: writes the KV cache */
  CHECK(ir_graph_add_output(g, live));
  expect_valid(g, "dce input");
  CHECK(g->n_nodes == 8);
  pass_opts o = {.fold = true, .fuse = true};
  pass_log log = {0};
  ir_diag d = {0};
  CHECKF(pass_dce(g, &o, &log, &d) == IR_OK, "%s", d.msg);
  expect_valid(g, "after dce");
  CHECK(g->n_nodes == 5);
  CHECK(find_node(g, "dead") < 0 && find_node(g, "dead2") < 0);
  CHECK(find_node(g, "dead_shares_weight") < 0);
  CHECK(ir_graph_find_tensor(g, "w_dead") < 0 && ir_graph_find_tensor(g, "dead") < 0);
  CHECK(ir_graph_find_tensor(g, "w_live") >= 0); /* still read by "live" */
  int32_t at = find_node(g, "attn");
  CHECK(at >= 0 && g->nodes[at].op == IR_OP_ATTENTION);
  CHECK(at >= 0 && find_node(g, "q") >= 0 && find_node(g, "k") >= 0 && find_node(g, "v") >= 0);
  CHECK(ir_graph_find_tensor(g, "attn") >= 0);
  CHECK(ir_graph_find_tensor(g, "unused_input") >= 0 && g->n_inputs == 2);
  int32_t lv = ir_graph_find_tensor(g, "live");
  CHECK(g->n_outputs == 1 && g->outputs[0] == lv);
  CHECK(lv >= 0 && g->tensors[lv].producer == find_node(g, "live"));
  CHECKF(log.n == 1 && log_has(&log, "removed 3 nodes"), "log: %s", log.n ? log.lines[0] : "");
  /* A second run finds nothing. */
  CHECK(pass_dce(g, &o, &log, &d) == IR_OK && g->n_nodes == 5 && log_has(&log, "removed 0"));
  pass_log_free(&log);
  ir_graph_destroy(g);
}

/* ---- (b) constant folding ------------------------------------------------------------- */

/* bf16 bit patterns: 1.5, -2.25, 2^-7, 0, -0, the smallest subnormal, inf, -inf, a NaN,
 * 3.3895e38 (largest finite), 1/3 rounded, -1e-3ish. */
static const uint16_t k_bf16[12] = {0x3FC0, 0xC010, 0x3C00, 0x0000, 0x8000, 0x0001,
                                    0x7F80, 0xFF80, 0x7FC1, 0x7F7F, 0x3EAB, 0xBA83};
/* f32 -> bf16 rounding cases, ties to even: 1+2^-8 -> 1.0, 1+3*2^-8 -> 1+2^-6 (0x3F82),
 * 1+2^-8+2^-20 -> 1+2^-7 (0x3F81), -(1+2^-8) -> -1.0 (0xBF80) ... */
static const float k_round_in[12] = {1.00390625f, 1.01171875f, 1.00390720f, -1.00390625f,
                                     0.0f,        2.0f,        -3.0f,       65504.0f,
                                     1e-3f,       0.1f,        100.0f,      1.0f};
static const uint16_t k_round_out[12] = {0x3F80, 0x3F82, 0x3F81, 0xBF80, 0x0000, 0x4000,
                                         0xC040, 0x4780, 0x3A83, 0x3DCD, 0x42C8, 0x3F80};

static float g_a[12], g_b[12], g_row[3], g_scalar[1];
static uint16_t g_h1[12], g_h2[12];

static bool weight_bits_are(const ir_graph *g, int32_t mm, const uint32_t *want32,
                            const uint16_t *want16, ir_dtype dt) {
  int32_t w = g->nodes[mm].in[1];
  const ir_tensor *t = &g->tensors[w];
  if (t->kind != IR_TENSOR_WEIGHT || t->dtype != dt || t->nbytes != ir_dtype_bytes(dt, 12))
    return false;
  return want32 ? memcmp(t->data, want32, 48) == 0 : memcmp(t->data, want16, 24) == 0;
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void fold_build(ir_graph *g) {
  ir_attr to32 = IR_AI(ir_attr_intern("to"), IR_F32), to16 = IR_AI(ir_attr_intern("to"), IR_BF16);
  int32_t x = input2(g, "x", 3);
  int32_t wb = weight(g, "wb", IR_BF16, 2, 4, 3, k_bf16);
  int32_t a = weight(g, "a", IR_F32, 2, 4, 3, g_a), b = weight(g, "b", IR_F32, 2, 4, 3, g_b);
  int32_t r = weight(g, "row", IR_F32, 1, 3, 0, g_row);
  int32_t s = weight(g, "scalar", IR_F32, 1, 1, 0, g_scalar);
  int32_t e = weight(g, "e", IR_F32, 2, 4, 3, k_round_in);
  int32_t h1 = weight(g, "h1", IR_F16, 2, 4, 3, g_h1), h2 = weight(g, "h2", IR_F16, 2, 4, 3, g_h2);
  int32_t outs[7];
  outs[0] = node(g, IR_OP_CAST, "wb.f32", wb, -1, -1, &to32, 1);
  outs[1] = node(g, IR_OP_ADD, "a+b", a, b, -1, NULL, 0);
  outs[2] = node(g, IR_OP_MUL, "a*row", a, r, -1, NULL, 0);
  outs[3] = node(g, IR_OP_MUL, "a*scalar", a, s, -1, NULL, 0);
  int32_t c = node(g, IR_OP_CAST, "wb.f32.again", wb, -1, -1, &to32, 1);
  outs[4] = node(g, IR_OP_ADD, "cast+b", c, b, -1, NULL, 0); /* folds in the same sweep */
  outs[5] = node(g, IR_OP_CAST, "e.bf16", e, -1, -1, &to16, 1);
  outs[6] = node(g, IR_OP_ADD, "h1+h2", h1, h2, -1, NULL, 0);
  const char *mm[7] = {"mm0", "mm1", "mm2", "mm3", "mm4", "mm5", "mm6"};
  for (int i = 0; i < 7; i++)
    CHECK(ir_graph_add_output(g, node(g, IR_OP_MATMUL, mm[i], x, outs[i], -1, NULL, 0)));
}

static void fold_expect(const ir_graph *g) {
  uint32_t want[12];
  uint16_t want16[12];
  for (int i = 0; i < 12; i++) want[i] = (uint32_t)k_bf16[i] << 16; /* bf16 -> f32 is exact */
  CHECK(weight_bits_are(g, find_node(g, "mm0"), want, NULL, IR_F32));
  for (int i = 0; i < 12; i++) want[i] = f32_bits(g_a[i] + g_b[i]);
  CHECK(weight_bits_are(g, find_node(g, "mm1"), want, NULL, IR_F32));
  for (int i = 0; i < 12; i++) want[i] = f32_bits(g_a[i] * g_row[i % 3]);
  CHECK(weight_bits_are(g, find_node(g, "mm2"), want, NULL, IR_F32));
  for (int i = 0; i < 12; i++) want[i] = f32_bits(g_a[i] * g_scalar[0]);
  CHECK(weight_bits_are(g, find_node(g, "mm3"), want, NULL, IR_F32));
  for (int i = 0; i < 12; i++) want[i] = f32_bits(ir_bf16_to_f32(k_bf16[i]) + g_b[i]);
  CHECK(weight_bits_are(g, find_node(g, "mm4"), want, NULL, IR_F32));
  CHECK(weight_bits_are(g, find_node(g, "mm5"), NULL, k_round_out, IR_BF16));
  for (int i = 0; i < 12; i++)
    want16[i] = ir_f32_to_f16(ir_f16_to_f32(g_h1[i]) + ir_f16_to_f32(g_h2[i]));
  CHECK(weight_bits_are(g, find_node(g, "mm6"), NULL, want16, IR_F16));
  /* 1.5 + 2.5 = 4.0 exactly in f16: 0x4400 */
  int32_t w6 = g->nodes[find_node(g, "mm6")].in[1];
  CHECK(((const uint16_t *)g->tensors[w6].data)[0] == 0x4400);
}

static void test_fold(void) {
  for (int i = 0; i < 12; i++) {
    g_a[i] = (float)i * 0.37f - 1.9f;
    g_b[i] = 1.0f / (float)(i + 3);
    g_h1[i] = ir_f32_to_f16(1.5f + (float)i * 0.125f);
    g_h2[i] = ir_f32_to_f16(2.5f - (float)i * 0.3f);
  }
  g_row[0] = 2.0f, g_row[1] = -0.5f, g_row[2] = 3.25f, g_scalar[0] = -1.75f;
  for (int i = 0; i < 12; i++) /* the table above agrees with the conversion helper */
    CHECKF(ir_f32_to_bf16(k_round_in[i]) == k_round_out[i], "round case %d: %04x", i,
           ir_f32_to_bf16(k_round_in[i]));
  ir_graph *g = new_graph();
  fold_build(g);
  expect_valid(g, "fold input");
  CHECK(g->n_nodes == 15);
  pass_opts o = {.fold = true, .fuse = false};
  pass_log log = {0};
  ir_diag d = {0};
  CHECKF(pass_fold(g, &o, &log, &d) == IR_OK, "%s", d.msg);
  expect_valid(g, "after fold");
  CHECKF(g->n_nodes == 7 && count_op(g, IR_OP_MATMUL) == 7, "%d nodes left", g->n_nodes);
  CHECK(log_has(&log, "folded 8 nodes"));
  fold_expect(g);
  /* Source weights nobody reads any more are gone; folded ones are owned by the graph. */
  CHECK(ir_graph_find_tensor(g, "wb") < 0 && ir_graph_find_tensor(g, "a") < 0);
  CHECK(ir_graph_find_tensor(g, "h1") < 0 && ir_graph_find_tensor(g, "wb.f32.again") < 0);
  CHECK(g->n_owned >= 7);
  for (int32_t i = 0; i < g->n_tensors; i++)
    CHECK(g->tensors[i].kind != IR_TENSOR_ACT || g->tensors[i].producer >= 0);
  pass_log_free(&log);
  ir_graph_destroy(g);
}

/* A cast whose input is a step input is not constant: fold must leave it. */
static void test_fold_leaves_runtime_values(void) {
  ir_graph *g = new_graph();
  int32_t x = input2(g, "x", 3);
  ir_attr to = IR_AI(ir_attr_intern("to"), IR_BF16);
  CHECK(ir_graph_add_output(g, node(g, IR_OP_CAST, "x.bf16", x, -1, -1, &to, 1)));
  pass_opts o = {.fold = true};
  pass_log log = {0};
  ir_diag d = {0};
  CHECK(pass_fold(g, &o, &log, &d) == IR_OK && log_has(&log, "folded 0"));
  CHECK(g->n_nodes == 1 && g->nodes[0].op == IR_OP_CAST);
  expect_valid(g, "fold of a runtime cast");
  pass_log_free(&log);
  ir_graph_destroy(g);
}

/* ---- (c) add + rms_norm fusion --------------------------------------------------------- */

static float g_nw[8] = {1, 0.5f, 2, 1, 1, 1, 0.25f, 3};

static void test_fuse(void) {
  ir_graph *g = new_graph();
  int32_t x = input2(g, "x", 8);
  int32_t w = weight(g, "w", IR_F32, 2, 8, 8, g_w8), nw = weight(g, "nw", IR_F32, 1, 8, 0, g_nw);
  ir_attr eps = IR_AF(ir_attr_intern("eps"), 3e-5);
  int32_t y = node(g, IR_OP_MATMUL, "proj", x, w, -1, NULL, 0);
  int32_t sum = node(g, IR_OP_ADD, "residual", x, y, -1, NULL, 0);
  int32_t z = node(g, IR_OP_RMS_NORM, "norm", sum, nw, -1, &eps, 1);
  int32_t m = node(g, IR_OP_MATMUL, "mlp", z, w, -1, NULL, 0);
  int32_t out = node(g, IR_OP_ADD, "residual2", sum, m, -1, NULL, 0); /* no norm after it */
  CHECK(ir_graph_add_output(g, out));
  CHECK(g->n_nodes == 5);
  pass_opts o = {.fold = true, .fuse = true};
  pass_log log = {0};
  ir_diag d = {0};
  CHECKF(pass_fuse_add_rms_norm(g, &o, &log, &d) == IR_OK, "%s", d.msg);
  expect_valid(g, "after fuse");
  CHECK(g->n_nodes == 4 && count_op(g, IR_OP_ADD_RMS_NORM) == 1 && count_op(g, IR_OP_ADD) == 1);
  CHECK(count_op(g, IR_OP_RMS_NORM) == 0 && log_has(&log, "fused 1"));
  int32_t f = -1;
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == IR_OP_ADD_RMS_NORM) f = i;
  CHECK(f == 1);
  if (f < 0) {
    pass_log_free(&log);
    ir_graph_destroy(g);
    return;
  }
  const ir_node *fn = &g->nodes[f];
  int32_t tz = ir_graph_find_tensor(g, "norm"), ts = ir_graph_find_tensor(g, "residual");
  CHECK(fn->n_in == 3 && fn->n_out == 2 && fn->out[0] == tz && fn->out[1] == ts);
  CHECK(fn->in[0] == ir_graph_find_tensor(g, "x") && fn->in[1] == ir_graph_find_tensor(g, "proj"));
  CHECK(fn->in[2] == ir_graph_find_tensor(g, "nw"));
  CHECK(ir_node_attr_f(fn, "eps", 0) == 3e-5);
  CHECK(g->tensors[tz].producer == f && g->tensors[ts].producer == f);
  /* both outputs still consumed: the normed value by mlp, the sum by the second add */
  int32_t mi = find_node(g, "mlp"), ri = find_node(g, "residual2");
  CHECK(mi > f && g->nodes[mi].in[0] == tz);
  CHECK(ri > f && g->nodes[ri].in[0] == ts);
  /* the rest of the pipeline accepts it */
  CHECKF(pass_memory_plan(g, &o, &log, &d) == IR_OK && ir_graph_verify(g, &d) == IR_OK, "%s",
         d.msg);
  CHECK(g->tensors[tz].arena_offset >= 0); /* both outputs live at the node: apart */
  CHECK(g->tensors[ts].arena_offset != g->tensors[tz].arena_offset);
  pass_log_free(&log);
  ir_graph_destroy(g);
}

/* The norm weight is computed after the add (a runtime cast): fusing would read it
 * before it exists, so the pass must leave the pair alone. */
static void test_fuse_respects_order(void) {
  static const uint16_t nwb[8] = {0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80};
  ir_graph *g = new_graph();
  int32_t x = input2(g, "x", 8), w = weight(g, "w", IR_F32, 2, 8, 8, g_w8);
  int32_t nw = weight(g, "nw", IR_BF16, 1, 8, 0, nwb);
  ir_attr eps = IR_AF(ir_attr_intern("eps"), 1e-6), to = IR_AI(ir_attr_intern("to"), IR_F32);
  int32_t y = node(g, IR_OP_MATMUL, "proj", x, w, -1, NULL, 0);
  int32_t sum = node(g, IR_OP_ADD, "residual", x, y, -1, NULL, 0);
  int32_t nwf = node(g, IR_OP_CAST, "nw.f32", nw, -1, -1, &to, 1);
  CHECK(ir_graph_add_output(g, node(g, IR_OP_RMS_NORM, "norm", sum, nwf, -1, &eps, 1)));
  pass_opts o = {.fold = false, .fuse = true};
  pass_log log = {0};
  ir_diag d = {0};
  CHECK(pass_fuse_add_rms_norm(g, &o, &log, &d) == IR_OK);
  expect_valid(g, "fuse with a late norm weight");
  CHECK(count_op(g, IR_OP_ADD_RMS_NORM) == 0 && g->n_nodes == 4);
  pass_log_free(&log);
  ir_graph_destroy(g);
}

/* add(a[8], b[1]) is a valid scalar-broadcast add of equal rank, but add_rms_norm needs b
 * shaped like a: the pass must not fuse it (it leaves a graph the verifier refuses). */
static void test_fuse_scalar_broadcast(void) {
  static float one[1] = {2.0f};
  ir_graph *g = new_graph();
  ir_dim d8 = DN(8);
  int32_t a = ir_graph_add_input(g, "a", IR_F32, 1, &d8);
  int32_t b = weight(g, "b", IR_F32, 1, 1, 0, one), nw = weight(g, "nw", IR_F32, 1, 8, 0, g_nw);
  ir_attr eps = IR_AF(ir_attr_intern("eps"), 1e-6);
  int32_t s = node(g, IR_OP_ADD, "add_scalar", a, b, -1, NULL, 0);
  CHECK(ir_graph_add_output(g, node(g, IR_OP_RMS_NORM, "norm", s, nw, -1, &eps, 1)));
  expect_valid(g, "scalar add + norm");
  pass_opts o = {.fold = false, .fuse = true};
  pass_log log = {0};
  ir_diag d = {0};
  CHECK(pass_fuse_add_rms_norm(g, &o, &log, &d) == IR_OK);
  CHECKF(ir_graph_verify(g, &d) == IR_OK, "fuse broke a scalar-broadcast add: %s", d.msg);
  pass_log_free(&log);
  ir_graph_destroy(g);
}

/* ---- (d) memory plan invariant on the real graphs --------------------------------------- */

typedef struct range {
  int32_t first, last;
} range;

static void live_ranges(const ir_graph *g, range *r) {
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const ir_tensor *t = &g->tensors[i];
    r[i].first = t->kind == IR_TENSOR_INPUT ? 0 : t->producer;
    r[i].last = r[i].first;
  }
  for (int32_t j = 0; j < g->n_nodes; j++)
    for (int k = 0; k < g->nodes[j].n_in; k++) {
      int32_t t = g->nodes[j].in[k];
      if (t >= 0 && r[t].last < j) r[t].last = j;
    }
  for (int32_t i = 0; i < g->n_outputs; i++) r[g->outputs[i]].last = g->n_nodes;
}

/* Counts violations of the plan's invariant (printing the first few when `say`):
 * every arena tensor placed 64-byte aligned inside the arena, and no two tensors whose
 * live ranges meet sharing a byte. */
static int plan_violations(const ir_graph *g, bool say) {
  range *r = malloc(sizeof *r * (size_t)g->n_tensors);
  if (!r) abort();
  live_ranges(g, r);
  int bad = 0;
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const ir_tensor *a = &g->tensors[i];
    if (a->kind == IR_TENSOR_WEIGHT) continue;
    uint64_t ab = ir_tensor_bytes(g, a, NULL);
    if (a->arena_offset < 0 || a->arena_offset % 64 != 0 ||
        (uint64_t)a->arena_offset + ab > g->arena_size) {
      if (say && bad < 5)
        fprintf(stderr, "'%s' at %lld (+%llu) in a %llu-byte arena\n", a->name,
                (long long)a->arena_offset, (unsigned long long)ab,
                (unsigned long long)g->arena_size);
      bad++;
      continue;
    }
    for (int32_t j = i + 1; j < g->n_tensors; j++) {
      const ir_tensor *b = &g->tensors[j];
      if (b->kind == IR_TENSOR_WEIGHT || r[i].last < r[j].first || r[j].last < r[i].first) continue;
      uint64_t ao = (uint64_t)a->arena_offset, bo = (uint64_t)b->arena_offset;
      if (b->arena_offset < 0 || ao + ab <= bo || bo + ir_tensor_bytes(g, b, NULL) <= ao) continue;
      if (say && bad < 5)
        fprintf(stderr, "'%s' [%d,%d] and '%s' [%d,%d] share bytes\n", a->name, r[i].first,
                r[i].last, b->name, r[j].first, r[j].last);
      bad++;
    }
  }
  free(r);
  return bad;
}

static void check_plan(ir_graph *g, const char *what) {
  uint64_t total = 0;
  for (int32_t i = 0; i < g->n_tensors; i++)
    if (g->tensors[i].kind != IR_TENSOR_WEIGHT) total += ir_tensor_bytes(g, &g->tensors[i], NULL);
  CHECKF(plan_violations(g, true) == 0, "%s: memory plan invariant broken", what);
  CHECKF(total > 0 && g->arena_size < total, "%s: no reuse (%llu of %llu bytes)", what,
         (unsigned long long)g->arena_size, (unsigned long long)total);
  /* The checker itself catches a clash: put embed's output on the tokens input, both
   * live at node 0. */
  int32_t tok = ir_graph_find_tensor(g, "tokens"), emb = ir_graph_find_tensor(g, "embed");
  CHECK(tok >= 0 && emb >= 0);
  if (tok < 0 || emb < 0) return;
  int64_t keep = g->tensors[emb].arena_offset;
  g->tensors[emb].arena_offset = g->tensors[tok].arena_offset;
  CHECK(plan_violations(g, false) > 0);
  g->tensors[emb].arena_offset = keep + 32; /* misaligned */
  CHECK(plan_violations(g, false) > 0);
  g->tensors[emb].arena_offset = keep;
}

static void test_memory_plan(const char *fixture, bool fold, bool fuse, int64_t max_tokens) {
  char src[512], what[600];
  snprintf(src, sizeof src, "%s/%s", FIXTURES_DIR, fixture);
  snprintf(what, sizeof what, "%s fold=%d fuse=%d T=%lld", fixture, fold, fuse,
           (long long)max_tokens);
  infc_options opt = infc_options_default();
  opt.model.max_tokens = max_tokens; /* odd T: byte sizes that are not multiples of 64 */
  opt.model.max_seqs = max_tokens < 8 ? 2 : 64;
  opt.model.max_logits = max_tokens < 8 ? 3 : 64;
  infc_source *s = NULL;
  ir_graph *g = NULL;
  ir_diag d = {0};
  CHECKF(infc_source_open(src, &opt, &s, &g, &d) == IR_OK, "%s: %s", what, d.msg);
  if (!g) return;
  pass_opts po = {.fold = fold, .fuse = fuse};
  pass_log log = {0};
  CHECKF(pass_pipeline_run(g, &po, &log, &d) == IR_OK, "%s: %s", what, d.msg);
  CHECK(log_has(&log, "memory_plan"));
  check_plan(g, what);
  /* Every residual add feeds a norm (the last one the final norm, once that moves before
   * its gather_rows). Without fold, a cast of the norm weight sits between add and norm in
   * f16/bf16 checkpoints and blocks the fusion. */
  if (fuse && (fold || strcmp(fixture, "llama-gqa-f32") == 0))
    CHECK(count_op(g, IR_OP_ADD_RMS_NORM) == 2 * g->config.n_layers);
  if (!fuse) CHECK(count_op(g, IR_OP_ADD_RMS_NORM) == 0);
  if (!fold) CHECK(count_op(g, IR_OP_CAST) > 0 || strcmp(fixture, "llama-gqa-f32") == 0);
  if (fold) CHECK(count_op(g, IR_OP_CAST) == 0);
  pass_log_free(&log);
  ir_graph_destroy(g);
  infc_source_close(s);
}

/* ---- (e) same logits with and without an optimisation ------------------------------------ */

static const int32_t k_prompt[20] = {150, 67,  199, 109, 92,  104, 65,  153, 18,  129,
                                     211, 169, 79,  60,  210, 96,  144, 81,  209, 56};

/* Builds the fixture with the options into `plan` and decodes the prompt. Returns the
 * logits (n x vocab, malloc'd) or NULL. */
static float *build_and_run(const char *fixture, bool fold, bool fuse, const char *plan,
                            int *out_nodes, int64_t *out_vocab) {
  char src[512];
  snprintf(src, sizeof src, "%s/%s", FIXTURES_DIR, fixture);
  infc_options o = infc_options_default();
  o.fold = fold;
  o.fuse = fuse;
  infc_build_report rep;
  ir_diag d = {0};
  CHECKF(infc_build(src, &o, plan, NULL, &rep, &d) == IR_OK, "%s: %s", plan, d.msg);
  if (d.status != IR_OK) return NULL;
  *out_nodes = rep.nodes_after;
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = 2;
  irt_model *m = NULL;
  irt_seq *seq = NULL;
  irt_error err = {0};
  CHECKF(irt_model_open(plan, &mo, &m, &err) == IRT_OK, "%s: %s", plan, err.msg);
  if (!m) return NULL;
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = calloc((size_t)(20 * V), sizeof *lg);
  CHECK(irt_seq_create(m, &seq, &err) == IRT_OK);
  CHECKF(lg && seq && irt_seq_decode(m, seq, k_prompt, 20, lg, true, &err) == IRT_OK, "%s: %s",
         plan, err.msg);
  CHECK(seq && irt_seq_length(seq) == 20);
  irt_seq_destroy(seq);
  irt_model_close(m);
  /* the weights read in at open (irt_model_opts.preload): the same logits, bit for bit; an
   * unknown mode refused by name */
  for (int mode = IRT_PRELOAD_BACKGROUND; lg && mode <= IRT_PRELOAD_WAIT + 1; mode++) {
    irt_model_opts po = mo;
    po.preload = (irt_preload)mode;
    irt_model *pm = NULL;
    irt_status ps = irt_model_open(plan, &po, &pm, &err);
    if (mode > IRT_PRELOAD_WAIT) {
      CHECKF(ps == IRT_INVALID_ARG && strstr(err.msg, "preload"), "%d: %s", (int)ps, err.msg);
      continue;
    }
    float *pl = calloc((size_t)(20 * V), sizeof *pl);
    irt_seq *ps2 = NULL;
    CHECKF(ps == IRT_OK && irt_seq_create(pm, &ps2, &err) == IRT_OK &&
               irt_seq_decode(pm, ps2, k_prompt, 20, pl, true, &err) == IRT_OK,
           "preload %d: %s", mode, err.msg);
    CHECKF(!memcmp(pl, lg, (size_t)(20 * V) * sizeof *pl), "preload %d: other logits", mode);
    irt_seq_destroy(ps2);
    irt_model_close(pm);
    free(pl);
  }
  *out_vocab = V;
  return lg;
}

static void compare_variants(const char *fixture, bool fold_a, bool fuse_a, bool fold_b,
                             bool fuse_b) {
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/passes_%s_a.plan", TEST_TMP_DIR, fixture);
  snprintf(pb, sizeof pb, "%s/passes_%s_b.plan", TEST_TMP_DIR, fixture);
  int na = 0, nb = 0;
  int64_t va = 0, vb = 0;
  float *a = build_and_run(fixture, fold_a, fuse_a, pa, &na, &va);
  float *b = build_and_run(fixture, fold_b, fuse_b, pb, &nb, &vb);
  CHECK(a && b && va == vb && va > 0);
  if (a && b && va == vb) {
    double maxd = 0;
    bool bitwise = memcmp(a, b, sizeof *a * (size_t)(20 * va)) == 0, finite = true;
    for (int64_t i = 0; i < 20 * va; i++) {
      finite = finite && isfinite(a[i]);
      double df = fabs((double)a[i] - (double)b[i]);
      if (df > maxd) maxd = df;
    }
    printf("%s: fold %d/%d fuse %d/%d: %d vs %d nodes, max |diff| %.3g over %lld logits%s\n",
           fixture, fold_a, fold_b, fuse_a, fuse_b, na, nb, maxd, (long long)(20 * va),
           bitwise ? " (bitwise identical)" : "");
    CHECK(finite);
    CHECKF(maxd <= 1e-5, "%s: max |diff| %g", fixture, maxd);
    CHECK(na < nb); /* variant a is the optimised one */
  }
  free(a);
  free(b);
  remove(pa);
  remove(pb);
}

int main(void) {
  for (int i = 0; i < 64; i++) g_w8[i] = (float)((i * 7) % 13) * 0.05f - 0.3f;
  for (int i = 0; i < 32; i++) g_w4[i] = (float)((i * 5) % 11) * 0.04f - 0.2f, g_wd[i] = 0.5f;
  test_dce();
  test_fold();
  test_fold_leaves_runtime_values();
  test_fuse();
  test_fuse_respects_order();
  test_fuse_scalar_broadcast();
  const char *fx[4] = {"llama-gqa-f32", "qwen2-bias-bf16", "llama-mha-f16", "qwen3-qknorm-bf16"};
  for (int i = 0; i < 4; i++) {
    test_memory_plan(fx[i], true, true, 512);
    test_memory_plan(fx[i], true, false, 512);
    test_memory_plan(fx[i], false, true, 512);
    test_memory_plan(fx[i], false, false, 7);
  }
  /* The fused kernel adds and normalises with the same f32 operations in the same order
   * as add followed by rms_norm, so the logits are expected bit-for-bit equal (the
   * printed line says whether they were); 1e-5 is the bound asserted. */
  for (int i = 0; i < 4; i++) compare_variants(fx[i], true, true, true, false);
  /* Folding turns bf16 norm weights and biases into f32 at build time with the same
   * conversion the runtime cast uses: again expected bitwise, asserted within 1e-5. */
  compare_variants("qwen2-bias-bf16", true, true, false, true);
  compare_variants("llama-mha-f16", true, true, false, true);
  compare_variants("qwen3-qknorm-bf16", true, true, false, true);
  return tcheck_done("test_passes");
}
