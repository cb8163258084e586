/* test_fusion: the fusion passes (rope into attention, q/k/v into one GEMM, gate/up +
 * swiglu into one GEMM with a swiglu epilogue, residual add + RMSNorm including the final
 * norm). On hand-built graphs: what each rewrites and what it must leave alone; on the
 * kernels: each fused kernel against the unfused pair, bit for bit; end to end: every
 * fusion alone, and all together, give the unfused plan's logits bit for bit on the
 * committed fixtures and on a block-quantized GGUF (q4_0 / q4_1 / q8_0). Bitwise is the
 * contract: no fusion changes an arithmetic operation or its order (the fused kernels call
 * the same rope / silu code on the same values, and the merged GEMM sums each output in
 * kn_matmul's fixed order whatever rows share the call). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "infc_build.h"
#include "infc_gguf_llama.h"
#include "inferrt.h"
#include "kn_cpu.h"
#include "ir_lazy.h"
#include "kn_quant.h"
#include "pass.h"
#include "tcheck.h"
#include "tmodel.h"

static uint32_t g_rng = 12345;
static float rnd(void) { /* uniform in [-1, 1) */
  g_rng = g_rng * 1664525u + 1013904223u;
  return (float)(g_rng >> 8) / (float)(1u << 23) - 1.0f;
}
static uint8_t rnd_byte(void) { return (uint8_t)((rnd() + 1.0f) * 127.9f); }

static float *rnd_vec(int64_t n, float scale) {
  float *v = malloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = rnd() * scale;
  return v;
}

/* A weight of `rows` x k in dtype dt with small random values (blocks: random quants,
 * scales about 0.01). malloc'd. */
static void *rnd_weight(ir_dtype dt, int64_t rows, int64_t k, uint64_t *out_bytes) {
  uint64_t bytes = ir_dtype_bytes(dt, (uint64_t)(rows * k));
  uint8_t *w = malloc(bytes);
  *out_bytes = bytes;
  if (!ir_dtype_is_quant(dt)) {
    for (int64_t i = 0; i < rows * k; i++) {
      float v = rnd() * 0.3f;
      if (dt == IR_F32) ((float *)w)[i] = v;
      else ((uint16_t *)w)[i] = dt == IR_F16 ? ir_f32_to_f16(v) : ir_f32_to_bf16(v);
    }
    return w;
  }
  int64_t bb = kn_quant_block_bytes(dt);
  for (uint64_t i = 0; i < bytes; i++) w[i] = rnd_byte();
  for (int64_t b = 0; b < rows * k / KN_QBLOCK; b++) { /* d (and m) as sane f16 values */
    uint16_t d = ir_f32_to_f16(0.01f + 0.004f * rnd()), m = ir_f32_to_f16(-0.08f);
    memcpy(w + b * bb, &d, 2);
    if (dt == IR_Q4_1) memcpy(w + b * bb + 2, &m, 2);
  }
  return w;
}

/* ---- hand-built graphs ----------------------------------------------------------------- */

enum { H = 64, NH = 4, NKV = 2, HD = 16, F = 96, P = 32 };

typedef struct layer_graph {
  ir_graph *g;
  int32_t x, pos, cs, rows;
  void *bufs[16];
  int n_bufs;
} layer_graph;

static int32_t lg_weight(layer_graph *l, const char *name, ir_dtype dt, int64_t rows, int64_t k) {
  uint64_t bytes;
  void *w = k ? rnd_weight(dt, rows, k, &bytes) : rnd_vec(rows, 0.5f);
  if (!k) bytes = (uint64_t)rows * sizeof(float);
  l->bufs[l->n_bufs++] = w;
  int64_t shape[2] = {rows, k};
  return ir_graph_add_weight(l->g, name, dt, k ? 2 : 1, shape, w, bytes);
}

static int32_t lg_node(layer_graph *l, ir_op op, const char *name, const int32_t *in, int n_in,
                       const ir_attr *a, int n_a) {
  int32_t out = -1;
  ir_diag d = {0};
  CHECKF(ir_graph_add_node(l->g, op, name, in, n_in, a, n_a, &out, &d) >= 0, "%s: %s", name, d.msg);
  return out;
}

static int32_t lg_proj(layer_graph *l, int32_t x, const char *name, ir_dtype dt, int64_t n,
                       int64_t k, bool bias) {
  char wn[64];
  snprintf(wn, sizeof wn, "%s.weight", name);
  int32_t in[3] = {x, lg_weight(l, wn, dt, n, k), -1};
  if (bias) snprintf(wn, sizeof wn, "%s.bias", name), in[2] = lg_weight(l, wn, IR_F32, n, 0);
  return lg_node(l, IR_OP_MATMUL, name, in, bias ? 3 : 2, NULL, 0);
}

/* x -> q/k/v (dtype of k: kdt) -> rope q, k -> attention -> gate/up -> swiglu -> add ->
 * gather_rows -> rms_norm: one layer of the template in miniature. */
static layer_graph make_layer(ir_dtype kdt, bool bias) {
  layer_graph l = {.g = ir_graph_create()};
  ir_graph *g = l.g;
  snprintf(g->config.arch, sizeof g->config.arch, "test");
  g->config.max_tokens = 8, g->config.max_seqs = 2, g->config.max_logits = 2;
  g->config.kv_block_size = 16;
  ir_dim t = {.sym = IR_SYM_TOKENS}, dx[2] = {{.sym = IR_SYM_TOKENS}, {.n = H}};
  ir_dim dl = {.sym = IR_SYM_LOGITS};
  l.x = ir_graph_add_input(g, "x", IR_F32, 2, dx);
  l.pos = ir_graph_add_input(g, "positions", IR_I32, 1, &t);
  l.rows = ir_graph_add_input(g, "logit_rows", IR_I32, 1, &dl);
  int64_t cs_shape[3] = {P, HD / 2, 2};
  float *cs = rnd_vec(P * HD, 1.0f);
  l.bufs[l.n_bufs++] = cs;
  l.cs = ir_graph_add_weight(g, "rope.cos_sin", IR_F32, 3, cs_shape, cs, P * HD * sizeof *cs);
  int32_t q = lg_proj(&l, l.x, "l0.q_proj", IR_F32, NH * HD, H, bias);
  int32_t k = lg_proj(&l, l.x, "l0.k_proj", kdt, NKV * HD, H, bias);
  int32_t v = lg_proj(&l, l.x, "l0.v_proj", IR_F32, NKV * HD, H, bias);
  ir_attr ra[4] = {IR_AI(ir_attr_intern("n_heads"), NH), IR_AI(ir_attr_intern("head_dim"), HD),
                   IR_AI(ir_attr_intern("rot_dim"), HD), IR_AI(ir_attr_intern("neox"), 0)};
  int32_t rin[3] = {q, l.pos, l.cs};
  int32_t rq = lg_node(&l, IR_OP_ROPE, "l0.rope_q", rin, 3, ra, 4);
  rin[0] = k, ra[0] = IR_AI(ir_attr_intern("n_heads"), NKV);
  int32_t rk = lg_node(&l, IR_OP_ROPE, "l0.rope_k", rin, 3, ra, 4);
  ir_attr aa[5] = {IR_AI(ir_attr_intern("layer"), 0), IR_AI(ir_attr_intern("n_heads"), NH),
                   IR_AI(ir_attr_intern("n_kv_heads"), NKV), IR_AI(ir_attr_intern("head_dim"), HD),
                   IR_AF(ir_attr_intern("scale"), 0.25)};
  int32_t ain[3] = {rq, rk, v};
  int32_t att = lg_node(&l, IR_OP_ATTENTION, "l0.attn", ain, 3, aa, 5);
  int32_t gu[2] = {lg_proj(&l, att, "l0.gate_proj", IR_Q8_0, F, NH * HD, false),
                   lg_proj(&l, att, "l0.up_proj", IR_Q8_0, F, NH * HD, false)};
  int32_t m = lg_node(&l, IR_OP_SWIGLU, "l0.swiglu", gu, 2, NULL, 0);
  int32_t down = lg_proj(&l, m, "l0.down_proj", IR_F32, H, F, false);
  int32_t sum_in[2] = {l.x, down};
  int32_t sum = lg_node(&l, IR_OP_ADD, "l0.residual", sum_in, 2, NULL, 0);
  int32_t gin[2] = {sum, l.rows};
  int32_t gath = lg_node(&l, IR_OP_GATHER_ROWS, "logit_rows", gin, 2, NULL, 0);
  int32_t nin[2] = {gath, lg_weight(&l, "norm.weight", IR_F32, H, 0)};
  ir_attr eps = IR_AF(ir_attr_intern("eps"), 1e-5);
  CHECK(ir_graph_add_output(g, lg_node(&l, IR_OP_RMS_NORM, "final_norm", nin, 2, &eps, 1)));
  return l;
}

static void free_layer(layer_graph *l) {
  ir_graph_destroy(l->g);
  for (int i = 0; i < l->n_bufs; i++) free(l->bufs[i]);
}

static int count_op(const ir_graph *g, ir_op op) {
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
  return n;
}

static int32_t find_op(const ir_graph *g, ir_op op) {
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == op) return i;
  return -1;
}

static ir_status run_pass(ir_graph *g,
                          ir_status (*fn)(ir_graph *, const pass_opts *, pass_log *, ir_diag *)) {
  pass_opts o = {.fold = true, .fuse = true};
  pass_log log = {0};
  ir_diag d = {0};
  ir_status st = fn(g, &o, &log, &d);
  if (st == IR_OK) st = ir_graph_verify(g, &d);
  CHECKF(st == IR_OK, "%s", d.msg);
  pass_log_free(&log);
  return st;
}

static void test_graph_fusions(void) {
  layer_graph l = make_layer(IR_F32, true);
  ir_graph *g = l.g;
  int32_t wq = ir_graph_find_tensor(g, "l0.q_proj.weight");
  int32_t wk = ir_graph_find_tensor(g, "l0.k_proj.weight");
  int32_t bv = ir_graph_find_tensor(g, "l0.v_proj.bias");
  const void *wq_data = g->tensors[wq].data, *wk_data = g->tensors[wk].data;
  const void *bv_data = g->tensors[bv].data;
  /* qkv first: the attention reads ropes, not matmuls, so nothing merges */
  run_pass(g, pass_fuse_qkv);
  CHECK(count_op(g, IR_OP_MATMUL) == 6 && count_op(g, IR_OP_ROPE) == 2);
  run_pass(g, pass_fuse_rope_attention);
  CHECK(count_op(g, IR_OP_ROPE) == 0);
  const ir_node *a = &g->nodes[find_op(g, IR_OP_ATTENTION)];
  CHECK(a->n_in == 5 && a->in[3] == ir_graph_find_tensor(g, "positions") &&
        a->in[4] == ir_graph_find_tensor(g, "rope.cos_sin"));
  CHECK(ir_node_attr_i(a, "rot_dim", 0) == HD && ir_node_attr_i(a, "neox", 1) == 0);
  run_pass(g, pass_fuse_qkv);
  CHECK(count_op(g, IR_OP_MATMUL) == 4);
  a = &g->nodes[find_op(g, IR_OP_ATTENTION)];
  CHECK(a->in[1] == -1 && a->in[2] == -1);
  CHECK(ir_graph_materialize(g, &(ir_diag){0}) == IR_OK); /* the fused weights: recipes until now */
  const ir_tensor *qkv = &g->tensors[a->in[0]];
  CHECK(qkv->dims[1].n == (NH + 2 * NKV) * HD && qkv->producer >= 0);
  const ir_node *mm = &g->nodes[qkv->producer];
  const ir_tensor *w = &g->tensors[mm->in[1]], *b = &g->tensors[mm->in[2]];
  CHECKF(!strcmp(mm->name, "l0.qkv_proj") && !strcmp(w->name, "l0.qkv_proj.weight"), "%s %s",
         mm->name, w->name);
  /* [wq; wk; wv] along N, and the biases likewise */
  size_t qb = NH * HD * H * sizeof(float), kb = NKV * HD * H * sizeof(float);
  CHECK(w->dims[0].n == (NH + 2 * NKV) * HD && w->dims[1].n == H);
  CHECK(!memcmp(w->data, wq_data, qb) && !memcmp((const char *)w->data + qb, wk_data, kb));
  CHECK(b->dims[0].n == (NH + 2 * NKV) * HD &&
        !memcmp((const float *)b->data + (NH + NKV) * HD, bv_data, NKV * HD * sizeof(float)));
  CHECK(ir_graph_find_tensor(g, "l0.q_proj.weight") < 0); /* the originals are gone */
  run_pass(g, pass_fuse_gate_up);
  CHECK(count_op(g, IR_OP_SWIGLU) == 0 && count_op(g, IR_OP_MATMUL) == 3);
  int32_t gu = ir_graph_find_tensor(g, "l0.gate_up_proj.weight");
  CHECK(gu >= 0 && g->tensors[gu].dtype == IR_Q8_0 && g->tensors[gu].dims[0].n == 2 * F);
  const ir_node *gm = &g->nodes[g->tensors[ir_graph_find_tensor(g, "l0.swiglu")].producer];
  CHECK(gm->op == IR_OP_MATMUL && ir_node_attr_i(gm, "act", 0) == IR_ACT_SWIGLU);
  /* the final norm moves before its gather and fuses with the residual add */
  run_pass(g, pass_fuse_add_rms_norm);
  CHECK(count_op(g, IR_OP_ADD) == 0 && count_op(g, IR_OP_ADD_RMS_NORM) == 1);
  int32_t last = g->n_nodes - 1;
  CHECK(g->nodes[last].op == IR_OP_GATHER_ROWS && g->outputs[0] == g->nodes[last].out[0]);
  CHECK(g->tensors[g->nodes[last].in[0]].producer == find_op(g, IR_OP_ADD_RMS_NORM));
  free_layer(&l);
}

/* What the passes must leave alone. */
static void test_graph_refusals(void) {
  /* k in another dtype: rope folds, the projections stay apart */
  layer_graph l = make_layer(IR_F16, false);
  run_pass(l.g, pass_fuse_rope_attention);
  run_pass(l.g, pass_fuse_qkv);
  CHECK(count_op(l.g, IR_OP_MATMUL) == 6 && count_op(l.g, IR_OP_ROPE) == 0);
  free_layer(&l);
  /* a rope output read twice (also a graph output) keeps its node; q's matmul output read
   * twice keeps the projections apart */
  l = make_layer(IR_F32, false);
  int32_t rq = ir_graph_find_tensor(l.g, "l0.rope_q");
  CHECK(ir_graph_add_output(l.g, rq));
  run_pass(l.g, pass_fuse_rope_attention);
  CHECK(count_op(l.g, IR_OP_ROPE) == 2);
  free_layer(&l);
  l = make_layer(IR_F32, false);
  run_pass(l.g, pass_fuse_rope_attention);
  CHECK(ir_graph_add_output(l.g, ir_graph_find_tensor(l.g, "l0.k_proj")));
  run_pass(l.g, pass_fuse_qkv);
  CHECK(count_op(l.g, IR_OP_MATMUL) == 6);
  free_layer(&l);
  /* a matmul that carries an attribute (an epilogue, quant params) is not plain */
  l = make_layer(IR_F32, false);
  ir_node *up = &l.g->nodes[l.g->tensors[ir_graph_find_tensor(l.g, "l0.up_proj")].producer];
  up->attrs[up->n_attrs++] = IR_AI(ir_attr_intern("act_int8"), 0);
  run_pass(l.g, pass_fuse_gate_up);
  CHECK(count_op(l.g, IR_OP_SWIGLU) == 1);
  free_layer(&l);
}

/* The verifier's contract for the fused forms. */
static void test_verifier(void) {
  layer_graph l = make_layer(IR_F32, false);
  run_pass(l.g, pass_fuse_rope_attention);
  run_pass(l.g, pass_fuse_qkv);
  run_pass(l.g, pass_fuse_gate_up);
  ir_graph *g = l.g;
  ir_diag d = {0};
  ir_node *a = &g->nodes[find_op(g, IR_OP_ATTENTION)];
  int32_t cs = a->in[4], x = ir_graph_find_tensor(g, "x"); /* indices moved in the passes */
  a->in[4] = -1;                                           /* positions without the table */
  CHECK(ir_graph_verify(g, &d) != IR_OK && strstr(d.msg, "cos/sin table"));
  a->in[4] = cs;
  a->in[1] = x; /* k present, v absent */
  d = (ir_diag){0};
  CHECKF(ir_graph_verify(g, &d) != IR_OK && strstr(d.msg, "missing input 2"), "%s", d.msg);
  a->in[1] = -1;
  int32_t keep = a->in[0];
  a->in[0] = x; /* packed input of the wrong width */
  d = (ir_diag){0};
  CHECKF(ir_graph_verify(g, &d) != IR_OK && strstr(d.msg, "expected 128"), "%s", d.msg);
  a->in[0] = keep;
  /* the folded q/k norm: both weights, of head_dim, and qk_eps */
  int32_t wn = ir_graph_find_tensor(g, "norm.weight"); /* [H]: not head_dim */
  a->n_in = 7, a->in[5] = wn, a->in[6] = -1;
  d = (ir_diag){0};
  CHECKF(ir_graph_verify(g, &d) != IR_OK && strstr(d.msg, "both weights"), "%s", d.msg);
  a->in[6] = wn;
  d = (ir_diag){0};
  CHECKF(ir_graph_verify(g, &d) != IR_OK && strstr(d.msg, "qk_eps"), "%s", d.msg);
  a->attrs[a->n_attrs++] = IR_AF(ir_attr_intern("qk_eps"), 1e-6);
  d = (ir_diag){0};
  CHECKF(ir_graph_verify(g, &d) != IR_OK && strstr(d.msg, "expected 16"), "%s", d.msg);
  a->n_in = 5, a->n_attrs--;
  ir_node *gm = &g->nodes[g->tensors[ir_graph_find_tensor(g, "l0.swiglu")].producer];
  gm->attrs[gm->n_attrs - 1].i = 7;
  d = (ir_diag){0};
  CHECKF(ir_graph_verify(g, &d) != IR_OK && strstr(d.msg, "unknown matmul epilogue act=7"), "%s",
         d.msg);
  gm->attrs[gm->n_attrs - 1].i = IR_ACT_SWIGLU;
  d = (ir_diag){0};
  CHECKF(ir_graph_verify(g, &d) == IR_OK, "%s", d.msg);
  free_layer(&l);
}

/* pass_opts.no_fuse skips fusions one by one; the log says what each pass took. */
static void test_pipeline_log(void) {
  CHECK(pass_fusion_from_name("qkv") == PASS_FUSE_QKV);
  CHECK(pass_fusion_from_name("fuse_gate_up") == PASS_FUSE_GATE_UP);
  CHECK(pass_fusion_from_name("swiglu") == 0);
  layer_graph l = make_layer(IR_F32, false);
  int before = l.g->n_nodes;
  pass_opts o = {.fold = true, .fuse = true, .no_fuse = PASS_FUSE_GATE_UP};
  pass_log log = {0};
  ir_diag d = {0};
  CHECKF(pass_pipeline_run(l.g, &o, &log, &d) == IR_OK, "%s", d.msg);
  char want[160];
  snprintf(want, sizeof want,
           "ops: %d -> %d (fuse_rope_attention -2, fuse_qkv -2, "
           "fuse_add_rms_norm -1)",
           before, before - 5);
  CHECK(log.n > 0 && l.g->n_nodes == before - 5);
  CHECKF(log.n > 0 && !strcmp(log.lines[log.n - 1], want), "'%s'",
         log.n ? log.lines[log.n - 1] : "");
  CHECK(count_op(l.g, IR_OP_SWIGLU) == 1);
  pass_log_free(&log);
  free_layer(&l);
  infc_options io = infc_options_default();
  CHECK(infc_options_set(&io, "no_fuse", "qkv,rope_attention", &d) == IR_OK &&
        io.no_fuse == (PASS_FUSE_QKV | PASS_FUSE_ROPE_ATTENTION));
  CHECK(infc_options_set(&io, "passes.fuse_qkv", "true", &d) == IR_OK &&
        io.no_fuse == PASS_FUSE_ROPE_ATTENTION);
  CHECK(infc_options_set(&io, "no_fuse", "qkv,bogus", &d) == IR_INVALID_ARG &&
        strstr(d.msg, "'bogus' is not one of"));
  CHECK(infc_options_set(&io, "passes.fuse_gate_up", "maybe", &d) == IR_INVALID_ARG);
}

/* ---- kernels --------------------------------------------------------------------------- */

/* kn_matmul_swiglu against kn_matmul then kn_swiglu, bit for bit, for every weight dtype,
 * instruction set, a few m (decode, leftovers of the blocked kernel, several tiles), with
 * and without bias, on 1 and 3 threads. */
static void test_matmul_swiglu(void) {
  const ir_dtype dts[6] = {IR_F32, IR_F16, IR_BF16, IR_Q8_0, IR_Q4_0, IR_Q4_1};
  const int64_t ms[3] = {1, 7, 70}, n = 44, k = 96;
  kn_pool *pools[2] = {kn_pool_create(1), kn_pool_create(3)};
  float *x = rnd_vec(70 * k, 1.0f), *bias = rnd_vec(2 * n, 0.5f);
  float *z = malloc(70 * 2 * n * sizeof *z), *ref = malloc(70 * n * sizeof *ref);
  float *y = malloc(70 * n * sizeof *y), *up = malloc(70 * n * sizeof *up);
  int bad = 0, runs = 0;
  for (int di = 0; di < 6; di++) {
    uint64_t bytes;
    void *w = rnd_weight(dts[di], 2 * n, k, &bytes);
    for (int isa = 0; isa <= 2; isa++) {
      int prev = kn_matmul_set_max_isa(isa);
      for (int mi = 0; mi < 3; mi++)
        for (int bi = 0; bi < 2; bi++)
          for (int pi = 0; pi < 2; pi++) {
            int64_t m = ms[mi];
            const float *bp = bi ? bias : NULL;
            kn_matmul(pools[pi], z, x, w, dts[di], bp, m, 2 * n, k);
            for (int64_t i = 0; i < m; i++) /* split z into gate (ref) and up halves */
              memcpy(ref + i * n, z + i * 2 * n, n * sizeof *z),
                  memcpy(up + i * n, z + i * 2 * n + n, n * sizeof *z);
            kn_swiglu(pools[pi], ref, ref, up, m * n);
            memset(y, 0xff, (size_t)(m * n) * sizeof *y);
            kn_matmul_swiglu(pools[pi], y, x, w, dts[di], bp, m, n, k);
            bad += memcmp(y, ref, (size_t)(m * n) * sizeof *y) != 0;
            runs++;
          }
      kn_matmul_set_max_isa(prev);
    }
    free(w);
  }
  CHECKF(bad == 0, "%d of %d swiglu-epilogue runs differ from matmul + swiglu", bad, runs);
  free(x), free(bias), free(z), free(ref), free(y), free(up);
  kn_pool_destroy(pools[0]);
  kn_pool_destroy(pools[1]);
}

/* kn_attention_paged_io over a packed qkv with the rope folded in, against kn_rope on
 * copies of q and k and kn_attention_paged: the outputs and the KV cache bit for bit. */
static void attention_case(int64_t hd, int64_t rot, int neox) {
  enum { T = 9, NB = 4, BS = 4, MP = 16 };
  const int64_t nh = 4, nkv = 2, W = (nh + 2 * nkv) * hd, cache = NB * nkv * BS * hd;
  int32_t seq[T] = {0, 0, 0, 0, 0, 1, 1, 1, 1}, pos[T] = {3, 4, 5, 6, 7, 0, 1, 2, 3};
  int32_t tables[2 * NB] = {2, 0, -1, -1, 1, 3, -1, -1};
  kn_attn_batch b = {
      .n_tok = T, .tok_seq = seq, .tok_pos = pos, .max_blocks_per_seq = NB, .block_tables = tables};
  float *qkv = rnd_vec(T * W, 1.0f), *cs = rnd_vec(MP * rot, 1.0f);
  float *q = malloc(T * nh * hd * sizeof *q), *k = malloc(T * nkv * hd * sizeof *k);
  float *v = malloc(T * nkv * hd * sizeof *v);
  for (int64_t t = 0; t < T; t++) {
    memcpy(q + t * nh * hd, qkv + t * W, nh * hd * sizeof *q);
    memcpy(k + t * nkv * hd, qkv + t * W + nh * hd, nkv * hd * sizeof *k);
    memcpy(v + t * nkv * hd, qkv + t * W + (nh + nkv) * hd, nkv * hd * sizeof *v);
  }
  float *kc[2], *vc[2], *out[2];
  float *prior = rnd_vec(2 * cache, 1.0f); /* earlier positions already in the cache */
  for (int i = 0; i < 2; i++) {
    kc[i] = malloc(cache * sizeof(float)), vc[i] = malloc(cache * sizeof(float));
    memcpy(kc[i], prior, cache * sizeof(float));
    memcpy(vc[i], prior + cache, cache * sizeof(float));
    out[i] = malloc(T * nh * hd * sizeof(float));
  }
  kn_pool *p = kn_pool_create(3);
  kn_rope(p, q, pos, cs, T, nh, hd, rot, neox);
  kn_rope(p, k, pos, cs, T, nkv, hd, rot, neox);
  kn_kv_layer kv = {
      .k = kc[0], .v = vc[0], .n_blocks = NB, .block_size = BS, .n_kv_heads = nkv, .head_dim = hd};
  kn_attention_paged(p, out[0], q, k, v, &kv, &b, nh, 0.3f);
  kv.k = kc[1], kv.v = vc[1];
  kn_attn_io io = {.q = qkv,
                   .k = qkv + nh * hd,
                   .v = qkv + (nh + nkv) * hd,
                   .q_stride = W,
                   .kv_stride = W,
                   .pos = pos,
                   .cos_sin = cs,
                   .rot_dim = rot,
                   .neox = neox};
  kn_attention_paged_io(p, out[1], &io, &kv, &b, nh, 0.3f);
  CHECKF(!memcmp(out[0], out[1], T * nh * hd * sizeof(float)) &&
             !memcmp(kc[0], kc[1], cache * sizeof(float)) &&
             !memcmp(vc[0], vc[1], cache * sizeof(float)),
         "packed rope attention differs (head_dim %lld, rot %lld, neox %d)", (long long)hd,
         (long long)rot, neox);
  kn_pool_destroy(p);
  for (int i = 0; i < 2; i++) free(kc[i]), free(vc[i]), free(out[i]);
  free(qkv), free(cs), free(q), free(k), free(v), free(prior);
}

/* ---- end to end ------------------------------------------------------------------------ */

static const int32_t k_prompt[12] = {150, 67, 199, 109, 92, 104, 65, 153, 18, 129, 211, 169};
enum { N_PROMPT = 12, N_DECODE = 6 };

/* Builds src with the fusions of `fuse` (pass_fusion bits) into plan and returns the
 * logits of the prompt (every position, one prefill step) followed by N_DECODE greedy
 * steps through the KV cache, one row each: (N_PROMPT + N_DECODE) x V, malloc'd. */
static float *run_plan(const char *src, unsigned fuse, const char *plan, int *out_ops,
                       int64_t *out_v) {
  infc_options o = infc_options_default();
  o.fuse = fuse != 0;
  o.no_fuse = PASS_FUSE_ALL & ~fuse;
  infc_build_report rep = {0};
  ir_diag d = {0};
  CHECKF(infc_build(src, &o, plan, NULL, &rep, &d) == IR_OK, "%s: %s", src, d.msg);
  irt_model *m = d.status == IR_OK ? tmodel_open(plan) : NULL;
  if (!m) return NULL;
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = calloc((size_t)((N_PROMPT + N_DECODE) * V), sizeof *lg);
  irt_seq *s = NULL;
  irt_error err = {0};
  CHECK(irt_seq_create(m, &s, &err) == IRT_OK);
  int32_t ids[N_PROMPT];
  for (int i = 0; i < N_PROMPT; i++) ids[i] = (int32_t)(k_prompt[i] % V);
  bool ok = irt_seq_decode(m, s, ids, N_PROMPT, lg, true, &err) == IRT_OK;
  for (int i = 0; ok && i < N_DECODE; i++) {
    const float *row = lg + (N_PROMPT - 1 + i) * V;
    int32_t next = 0;
    for (int64_t j = 1; j < V; j++) next = row[j] > row[next] ? (int32_t)j : next;
    ok = irt_seq_decode(m, s, &next, 1, lg + (N_PROMPT + i) * V, true, &err) == IRT_OK;
  }
  CHECKF(ok, "%s: %s", plan, err.msg);
  irt_seq_destroy(s);
  irt_model_close(m);
  *out_ops = rep.nodes_after;
  *out_v = V;
  remove(plan);
  return lg;
}

/* Each fusion alone, then all, against none: bitwise, and fewer ops. */
static void compare_fusions(const char *src, const char *tag) {
  static const struct {
    const char *name;
    unsigned bits;
  } k[5] = {{"rope_attention", PASS_FUSE_ROPE_ATTENTION},
            {"qkv (needs rope_attention)", PASS_FUSE_ROPE_ATTENTION | PASS_FUSE_QKV},
            {"gate_up", PASS_FUSE_GATE_UP},
            {"add_rms_norm", PASS_FUSE_ADD_RMS_NORM},
            {"all", PASS_FUSE_ALL}};
  char plan[1200];
  snprintf(plan, sizeof plan, "%s/fusion_%s.plan", TEST_TMP_DIR, tag);
  int ops0 = 0, ops = 0, prev_ops = 1 << 30;
  int64_t V0 = 0, V = 0;
  float *ref = run_plan(src, 0, plan, &ops0, &V0);
  for (int i = 0; ref && i < 5; i++) {
    float *lg = run_plan(src, k[i].bits, plan, &ops, &V);
    size_t n = (size_t)((N_PROMPT + N_DECODE) * V0);
    bool same = lg && V == V0 && !memcmp(lg, ref, n * sizeof *lg);
    double maxd = 0;
    for (size_t j = 0; lg && V == V0 && j < n; j++)
      maxd = fmax(maxd, fabs((double)lg[j] - (double)ref[j]));
    printf("%s: fuse %-27s %3d -> %3d ops, %s (max |diff| %.3g)\n", tag, k[i].name, ops0, ops,
           same ? "bitwise identical logits" : "LOGITS DIFFER", maxd);
    CHECKF(same, "%s: fusion %s changed the logits (max |diff| %g)", tag, k[i].name, maxd);
    CHECKF(ops < ops0, "%s: fusion %s removed no op", tag, k[i].name);
    if (i == 4) CHECK(ops < prev_ops); /* all together beats any one */
    if (i < 4 && ops < prev_ops) prev_ops = ops;
    free(lg);
  }
  free(ref);
}

/* A Llama GGUF with random block-quantized matrices: q/k/v q4_0, gate/up q4_1, the rest
 * q8_0, except layer 1's k_proj in q8_0, which must keep that layer's projections apart
 * (and still run). Interleaved rope (GGUF llama). */
static bool write_quant_gguf(const char *path) {
  enum { HS = 64, FF = 96, L = 2, V = 64, NHh = 4, NKVh = 2, HDh = 16 };
  static const char *const mats[7] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
  const int64_t rows[7] = {NHh * HDh, NKVh * HDh, NKVh * HDh, HS, FF, FF, HS};
  const int64_t cols[7] = {HS, HS, HS, NHh * HDh, HS, HS, FF};
  gw_tensor ts[64];
  char names[64][128];
  void *bufs[64];
  int n = 0;
#define ADD(hf, dt, r, c)                                                                          \
  do {                                                                                             \
    CHECK(infc_gguf_llama_name(hf, names[n], sizeof names[n]));                                    \
    uint64_t nb;                                                                                   \
    bufs[n] = (c) ? rnd_weight(dt, r, c, &nb) : rnd_vec(r, 0.3f);                                  \
    if (!(c)) {                                                                                    \
      nb = (uint64_t)(r)*4;                                                                        \
      for (int64_t e = 0; e < (r); e++) ((float *)bufs[n])[e] += 1.0f;                             \
    }                                                                                              \
    uint32_t gt = dt == IR_F32 ? 0 : dt == IR_Q4_0 ? 2 : dt == IR_Q4_1 ? 3 : 8;                    \
    ts[n] = (gw_tensor){names[n],    gt,                                                           \
                        (c) ? 2 : 1, {(c) ? (uint64_t)(c) : (uint64_t)(r), (uint64_t)(r)},         \
                        bufs[n],     (size_t)nb};                                                  \
    n++;                                                                                           \
  } while (0)
  ADD("model.embed_tokens.weight", IR_Q8_0, V, HS);
  ADD("model.norm.weight", IR_F32, HS, 0);
  ADD("lm_head.weight", IR_Q8_0, V, HS);
  for (int l = 0; l < L; l++) {
    char hf[128];
    snprintf(hf, sizeof hf, "model.layers.%d.input_layernorm.weight", l);
    ADD(hf, IR_F32, HS, 0);
    snprintf(hf, sizeof hf, "model.layers.%d.post_attention_layernorm.weight", l);
    ADD(hf, IR_F32, HS, 0);
    for (int i = 0; i < 7; i++) {
      ir_dtype dt = i < 3 ? IR_Q4_0 : i == 4 || i == 5 ? IR_Q4_1 : IR_Q8_0;
      if (l == 1 && i == 1) dt = IR_Q8_0;
      snprintf(hf, sizeof hf, "model.layers.%d.%s.%s.weight", l, i < 4 ? "self_attn" : "mlp",
               mats[i]);
      ADD(hf, dt, rows[i], cols[i]);
    }
  }
#undef ADD
  gw w = {0};
  gw_header(&w, 3, (uint64_t)n, 9);
  kv_str(&w, "general.architecture", "llama");
  kv_u32(&w, "llama.block_count", L), kv_u32(&w, "llama.context_length", 128);
  kv_u32(&w, "llama.embedding_length", HS), kv_u32(&w, "llama.feed_forward_length", FF);
  kv_u32(&w, "llama.attention.head_count", NHh), kv_u32(&w, "llama.attention.head_count_kv", NKVh);
  kv_u32(&w, "llama.vocab_size", V);
  kv_f32(&w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  gw_tensors(&w, ts, n, 32);
  FILE *f = fopen(path, "wb");
  bool ok = f && fwrite(w.b, 1, w.n, f) == w.n;
  if (f) fclose(f);
  for (int i = 0; i < n; i++) free(bufs[i]);
  free(w.b);
  CHECKF(ok, "cannot write %s", path);
  return ok;
}

int main(void) {
  test_graph_fusions();
  test_graph_refusals();
  test_verifier();
  test_pipeline_log();
  test_matmul_swiglu();
  attention_case(16, 16, 1);
  attention_case(16, 16, 0);
  attention_case(64, 32, 1); /* partial rotary */
  /* qwen3: the q/k norms fold with the rope (a norm in slices of head_dim when unfused);
   * phi3: row views of the fused checkpoint matrices merged again, a partial rope */
  const char *fx[5] = {"llama-gqa-f32", "qwen2-bias-bf16", "llama-mha-f16", "qwen3-qknorm-bf16",
                       "phi3-fused-f32"};
  for (int i = 0; i < 5; i++) {
    char src[1024];
    snprintf(src, sizeof src, "%s/%s", FIXTURES_DIR, fx[i]);
    compare_fusions(src, fx[i]);
  }
  char gguf[1024];
  snprintf(gguf, sizeof gguf, "%s/fusion_quant.gguf", TEST_TMP_DIR);
  if (write_quant_gguf(gguf)) compare_fusions(gguf, "gguf-q4_0-q4_1-q8_0");
  remove(gguf);
  return tcheck_done("test_fusion");
}
