/* test_ir: graph construction, shape inference, the checks ir_graph_add_node makes on
 * its inputs, the verifier on graphs corrupted by hand, and the printer. */
#include "ir.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcheck.h"

/* ---- a small valid graph: one attention layer over the flat step batch --------------- */

enum { V = 16, H = 8, NH = 2, NKV = 1, HD = 4, P = 32 };

static float g_emb[V * H], g_norm[H], g_wq[NH * HD * H], g_wk[NKV * HD * H], g_wv[NKV * HD * H],
    g_wo[H * NH * HD], g_lm[V * H], g_cs[P * (HD / 2) * 2];

typedef struct tiny {
  ir_graph *g;
  int32_t tokens, positions, rows;                         /* inputs */
  int32_t emb, norm_w, wq, wk, wv, wo, lm;                 /* weights */
  int32_t x, h, q, k, v, rq, rk, att, o, sum, gat, logits; /* activations */
  int32_t n_embed, n_norm, n_q, n_att, n_add, n_logits;    /* node indices */
} tiny;

static ir_dim DS(ir_sym s) { return (ir_dim){.n = 0, .sym = s}; }
static ir_dim DN(int64_t n) { return (ir_dim){.n = n, .sym = IR_SYM_NONE}; }

static bool dims_are(const ir_graph *g, int32_t t, int rank, const ir_dim *want) {
  const ir_tensor *x = &g->tensors[t];
  if (x->rank != rank) return false;
  for (int i = 0; i < rank; i++) {
    if (x->dims[i].sym != want[i].sym) return false;
    if (want[i].sym == IR_SYM_NONE && x->dims[i].n != want[i].n) return false;
  }
  return true;
}

static bool has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static void set_config(ir_graph *g) {
  snprintf(g->config.arch, sizeof g->config.arch, "llama");
  g->config.vocab_size = V;
  g->config.hidden_size = H;
  g->config.n_layers = 1;
  g->config.n_heads = NH;
  g->config.n_kv_heads = NKV;
  g->config.head_dim = HD;
  g->config.max_position = P;
  g->config.max_tokens = 32;
  g->config.max_seqs = 4;
  g->config.max_logits = 4;
  g->config.kv_block_size = 16;
}

static int32_t w2(ir_graph *g, const char *name, int64_t n, int64_t k, const float *data) {
  int64_t shape[2] = {n, k};
  return ir_graph_add_weight(g, name, IR_F32, 2, shape, data, (uint64_t)(n * k) * 4);
}

static int32_t add(tiny *t, ir_op op, const char *name, const int32_t *in, int n_in,
                   const ir_attr *a, int n_a, int32_t *node) {
  ir_diag d = {0};
  int32_t out = -1;
  int32_t ni = ir_graph_add_node(t->g, op, name, in, n_in, a, n_a, &out, &d);
  CHECKF(ni >= 0, "add_node %s: %s", name, d.msg);
  if (node) *node = ni;
  return out;
}

static void tiny_inputs_weights(tiny *t) {
  ir_graph *g = t->g;
  ir_dim dt = DS(IR_SYM_TOKENS), dl = DS(IR_SYM_LOGITS);
  t->tokens = ir_graph_add_input(g, "tokens", IR_I32, 1, &dt);
  t->positions = ir_graph_add_input(g, "positions", IR_I32, 1, &dt);
  t->rows = ir_graph_add_input(g, "logit_rows", IR_I32, 1, &dl);
  t->emb = w2(g, "emb", V, H, g_emb);
  int64_t hs[1] = {H}, cs[3] = {P, HD / 2, 2};
  t->norm_w = ir_graph_add_weight(g, "norm_w", IR_F32, 1, hs, g_norm, H * 4);
  t->wq = w2(g, "wq", NH * HD, H, g_wq);
  t->wk = w2(g, "wk", NKV * HD, H, g_wk);
  t->wv = w2(g, "wv", NKV * HD, H, g_wv);
  t->wo = w2(g, "wo", H, NH * HD, g_wo);
  t->lm = w2(g, "lm", V, H, g_lm);
  int32_t c = ir_graph_add_weight(g, "cos_sin", IR_F32, 3, cs, g_cs, sizeof g_cs);
  CHECK(t->tokens >= 0 && t->positions >= 0 && t->rows >= 0 && t->emb >= 0 && c >= 0);
  CHECK(g->n_inputs == 3 && g->inputs[0] == t->tokens && g->inputs[2] == t->rows);
  CHECK(g->tensors[t->emb].kind == IR_TENSOR_WEIGHT && g->tensors[t->emb].data == g_emb);
  CHECK(g->tensors[t->tokens].kind == IR_TENSOR_INPUT && g->tensors[t->tokens].producer == -1);
}

static void tiny_body(tiny *t) {
  int32_t cs = ir_graph_find_tensor(t->g, "cos_sin");
  ir_attr eps = IR_AF(ir_attr_intern("eps"), 1e-5);
  int32_t in[3] = {t->tokens, t->emb, -1};
  t->x = add(t, IR_OP_EMBED, "embed", in, 2, NULL, 0, &t->n_embed);
  in[0] = t->x, in[1] = t->norm_w;
  t->h = add(t, IR_OP_RMS_NORM, "norm", in, 2, &eps, 1, &t->n_norm);
  in[0] = t->h, in[1] = t->wq;
  t->q = add(t, IR_OP_MATMUL, "q_proj", in, 2, NULL, 0, &t->n_q);
  in[1] = t->wk;
  t->k = add(t, IR_OP_MATMUL, "k_proj", in, 2, NULL, 0, NULL);
  in[1] = t->wv;
  t->v = add(t, IR_OP_MATMUL, "v_proj", in, 2, NULL, 0, NULL);
  ir_attr rq[4] = {IR_AI(ir_attr_intern("n_heads"), NH), IR_AI(ir_attr_intern("head_dim"), HD),
                   IR_AI(ir_attr_intern("rot_dim"), HD), IR_AI(ir_attr_intern("neox"), 1)};
  int32_t rin[3] = {t->q, t->positions, cs};
  t->rq = add(t, IR_OP_ROPE, "rope_q", rin, 3, rq, 4, NULL);
  rq[0] = IR_AI(ir_attr_intern("n_heads"), NKV);
  rin[0] = t->k;
  t->rk = add(t, IR_OP_ROPE, "rope_k", rin, 3, rq, 4, NULL);
  ir_attr aa[5] = {IR_AI(ir_attr_intern("layer"), 0), IR_AI(ir_attr_intern("n_heads"), NH),
                   IR_AI(ir_attr_intern("n_kv_heads"), NKV), IR_AI(ir_attr_intern("head_dim"), HD),
                   IR_AF(ir_attr_intern("scale"), 0.5)};
  int32_t ain[3] = {t->rq, t->rk, t->v};
  t->att = add(t, IR_OP_ATTENTION, "attn", ain, 3, aa, 5, &t->n_att);
  in[0] = t->att, in[1] = t->wo;
  t->o = add(t, IR_OP_MATMUL, "o_proj", in, 2, NULL, 0, NULL);
  in[0] = t->x, in[1] = t->o;
  t->sum = add(t, IR_OP_ADD, "residual", in, 2, NULL, 0, &t->n_add);
  in[0] = t->sum, in[1] = t->rows;
  t->gat = add(t, IR_OP_GATHER_ROWS, "gather", in, 2, NULL, 0, NULL);
  in[0] = t->gat, in[1] = t->lm;
  t->logits = add(t, IR_OP_MATMUL, "logits", in, 2, NULL, 0, &t->n_logits);
  CHECK(ir_graph_add_output(t->g, t->logits));
}

static tiny tiny_build(void) {
  tiny t;
  memset(&t, 0, sizeof t);
  t.g = ir_graph_create();
  CHECK(t.g != NULL);
  if (!t.g) abort();
  set_config(t.g);
  tiny_inputs_weights(&t);
  tiny_body(&t);
  return t;
}

/* ---- construction and inference ------------------------------------------------------ */

static void test_attr_intern(void) {
  const char *e = ir_attr_intern("eps");
  CHECK(e != NULL && strcmp(e, "eps") == 0);
  char buf[8];
  snprintf(buf, sizeof buf, "eps");
  CHECK(ir_attr_intern(buf) == e); /* canonical pointer, whatever the caller's copy */
  CHECK(ir_attr_intern("n_kv_heads") != NULL);
  CHECK(ir_attr_intern("no_such_attribute") == NULL);
}

static void test_inference(void) {
  tiny t = tiny_build();
  ir_graph *g = t.g;
  ir_dim tv[2] = {DS(IR_SYM_TOKENS), DN(H)};
  CHECK(dims_are(g, t.x, 2, tv)); /* embed: [T] x [V,H] -> [T,H] */
  CHECK(g->tensors[t.x].dtype == IR_F32 && g->tensors[t.x].kind == IR_TENSOR_ACT);
  CHECK(g->tensors[t.x].producer == t.n_embed);
  CHECK(dims_are(g, t.h, 2, tv));
  ir_dim qd[2] = {DS(IR_SYM_TOKENS), DN(NH * HD)}, kd[2] = {DS(IR_SYM_TOKENS), DN(NKV * HD)};
  CHECK(dims_are(g, t.q, 2, qd)); /* matmul [T,K] x [N,K] -> [T,N], T stays symbolic */
  CHECK(dims_are(g, t.k, 2, kd));
  CHECK(dims_are(g, t.rq, 2, qd) && dims_are(g, t.rk, 2, kd)); /* rope: like x */
  CHECK(dims_are(g, t.att, 2, qd));                            /* attention: like q */
  ir_dim lh[2] = {DS(IR_SYM_LOGITS), DN(H)}, lv[2] = {DS(IR_SYM_LOGITS), DN(V)};
  CHECK(dims_are(g, t.gat, 2, lh)); /* gather_rows: [T,H] x [L] -> [L,H] */
  CHECK(dims_are(g, t.logits, 2, lv));
  CHECK(strcmp(g->tensors[t.q].name, "q_proj") == 0); /* single output: the node's name */
  CHECK(ir_graph_find_tensor(g, "logits") == t.logits);
  CHECK(ir_graph_find_tensor(g, "nope") == -1);
  CHECK(g->n_nodes == 12 && g->nodes[t.n_att].op == IR_OP_ATTENTION);
  CHECK(ir_node_attr_f(&g->nodes[t.n_norm], "eps", 0) == 1e-5);
  CHECK(ir_node_attr_i(&g->nodes[t.n_att], "n_kv_heads", -1) == NKV);
  CHECK(ir_node_attr_i(&g->nodes[t.n_att], "rot_dim", -7) == -7);
  /* sizes with symbols at the step limits, and bound to a concrete step */
  CHECK(ir_tensor_elems(g, &g->tensors[t.q], NULL) == 32u * NH * HD);
  int64_t syms[IR_SYM_COUNT] = {0, 5, 1, 2};
  CHECK(ir_tensor_bytes(g, &g->tensors[t.logits], syms) == 2u * V * 4);
  ir_diag d = {0};
  CHECKF(ir_graph_verify(g, &d) == IR_OK, "%s", d.msg);
  ir_graph_destroy(g);
}

/* Tries a node that must be refused; checks nothing was added and the message. */
static void expect_refused(ir_graph *g, ir_op op, const char *name, const int32_t *in, int n_in,
                           const ir_attr *a, int n_a, const char *want1, const char *want2) {
  int32_t nt = g->n_tensors, nn = g->n_nodes, out = -99;
  ir_diag d = {0};
  int32_t r = ir_graph_add_node(g, op, name, in, n_in, a, n_a, &out, &d);
  CHECKF(r == -1, "node %s was accepted", name);
  CHECK(d.status != IR_OK);
  CHECK(g->n_tensors == nt && g->n_nodes == nn && out == -99);
  CHECKF(has(d.msg, name), "message does not name the node: %s", d.msg);
  CHECKF(has(d.msg, want1), "message lacks '%s': %s", want1, d.msg);
  CHECKF(!want2 || has(d.msg, want2), "message lacks '%s': %s", want2, d.msg);
}

static void test_add_node_refuses(void) {
  tiny t = tiny_build();
  ir_graph *g = t.g;
  int32_t w6 = w2(g, "w_k6", 4, 6, g_wq); /* K = 6, x has K = 8 */
  int32_t in[3] = {t.h, w6, -1};
  expect_refused(g, IR_OP_MATMUL, "mm_bad_k", in, 2, NULL, 0, "expected 6", NULL);
  in[0] = t.positions, in[1] = t.h; /* x must be f32 */
  expect_refused(g, IR_OP_MATMUL, "mm_int_x", in, 2, NULL, 0, "dtype", NULL);
  in[0] = t.h, in[1] = t.wq, in[2] = t.norm_w; /* bias [8] for N = 8 is fine ... */
  CHECK(ir_graph_add_node(g, IR_OP_MATMUL, "mm_bias", in, 3, NULL, 0, NULL, NULL) >= 0);
  in[1] = t.wk; /* ... but not for N = 4 */
  expect_refused(g, IR_OP_MATMUL, "mm_bad_bias", in, 3, NULL, 0, "norm_w", NULL);
  in[0] = t.x, in[1] = t.emb; /* embed ids must be i32 */
  expect_refused(g, IR_OP_EMBED, "embed_f32_ids", in, 2, NULL, 0, "dtype", "f32");
  in[0] = t.tokens, in[1] = t.positions; /* table must be a float type */
  expect_refused(g, IR_OP_EMBED, "embed_int_table", in, 2, NULL, 0, "positions", "i32");
  in[0] = t.x, in[1] = t.norm_w;
  expect_refused(g, IR_OP_RMS_NORM, "norm_no_eps", in, 2, NULL, 0, "eps", NULL);
  ir_attr wrong = IR_AF(ir_attr_intern("scale"), 1.0);
  expect_refused(g, IR_OP_RMS_NORM, "norm_scale_only", in, 2, &wrong, 1, "eps", NULL);
  in[0] = t.x;
  expect_refused(g, IR_OP_MATMUL, "mm_one_input", in, 1, NULL, 0, "missing input", NULL);
  ir_attr aa[5] = {IR_AI(ir_attr_intern("layer"), 0), IR_AI(ir_attr_intern("n_heads"), 3),
                   IR_AI(ir_attr_intern("n_kv_heads"), 2), IR_AI(ir_attr_intern("head_dim"), 4),
                   IR_AF(ir_attr_intern("scale"), 0.5)};
  int32_t ain[3] = {t.rq, t.rk, t.v};
  expect_refused(g, IR_OP_ATTENTION, "attn_3_over_2", ain, 3, aa, 5, "multiple", NULL);
  ir_attr missing[4] = {aa[0], aa[1], aa[3], aa[4]};
  expect_refused(g, IR_OP_ATTENTION, "attn_no_kv", ain, 3, missing, 4, "n_kv_heads", NULL);
  int32_t bin[2] = {t.q, t.k}; /* [T,8] + [T,4] */
  expect_refused(g, IR_OP_ADD, "add_mismatch", bin, 2, NULL, 0, "q_proj", "k_proj");
  ir_diag d = {0};
  CHECKF(ir_graph_verify(g, &d) == IR_OK, "refusals left the graph invalid: %s", d.msg);
  ir_graph_destroy(g);
}

/* ---- the verifier on corrupted graphs ------------------------------------------------ */

static void expect_invalid(tiny *t, const char *what, const char *want1, const char *want2) {
  ir_diag d = {0};
  ir_status st = ir_graph_verify(t->g, &d);
  CHECKF(st != IR_OK, "verifier accepted: %s", what);
  if (st != IR_OK) {
    CHECKF(d.status == st && d.msg[0], "%s: no message", what);
    CHECKF(has(d.msg, want1), "%s: message lacks '%s': %s", what, want1, d.msg);
    CHECKF(!want2 || has(d.msg, want2), "%s: message lacks '%s': %s", what, want2, d.msg);
  }
  ir_graph_destroy(t->g);
  t->g = NULL;
}

static void test_verify_valid(void) {
  tiny t = tiny_build();
  ir_diag d = {0};
  CHECKF(ir_graph_verify(t.g, &d) == IR_OK, "%s", d.msg);
  CHECK(d.status == IR_OK && d.msg[0] == 0);
  ir_graph_destroy(t.g);
}

static void test_verify_corrupt(void) {
  tiny t = tiny_build();
  t.g->nodes[t.n_q].in[1] = t.g->n_tensors + 7;
  expect_invalid(&t, "input index out of range", "q_proj", "refers to tensor");

  t = tiny_build();
  t.g->nodes[t.n_q].in[0] = -5; /* only -1 means absent */
  expect_invalid(&t, "negative input index", "q_proj", NULL);

  t = tiny_build(); /* the norm reads the residual sum, produced four nodes later */
  t.g->nodes[t.n_norm].in[0] = t.sum;
  expect_invalid(&t, "use before def", "norm", "residual");

  t = tiny_build(); /* a node reading its own output */
  t.g->nodes[t.n_add].in[1] = t.sum;
  expect_invalid(&t, "self use", "residual", NULL);

  t = tiny_build(); /* declared [T,9], inference gives [T,8] */
  t.g->tensors[t.q].dims[1].n = 9;
  expect_invalid(&t, "declared shape differs", "q_proj", NULL);

  t = tiny_build(); /* declared static [32,8] instead of symbolic [T,8] */
  t.g->tensors[t.x].dims[0] = DN(32);
  expect_invalid(&t, "static dim for a symbolic one", "embed", NULL);

  t = tiny_build();
  t.g->tensors[t.logits].dtype = IR_F16;
  expect_invalid(&t, "declared dtype differs", "logits", "f16");

  t = tiny_build();
  t.g->tensors[t.wq].nbytes -= 4;
  expect_invalid(&t, "weight nbytes short", "wq", NULL);

  t = tiny_build();
  t.g->tensors[t.lm].nbytes *= 2;
  expect_invalid(&t, "weight nbytes long", "lm", NULL);

  t = tiny_build();
  t.g->tensors[t.wo].data = NULL;
  expect_invalid(&t, "weight without data", "wo", NULL);

  t = tiny_build();
  t.g->n_outputs = 0;
  expect_invalid(&t, "no outputs", "no outputs", NULL);

  t = tiny_build();
  t.g->outputs[0] = t.g->n_tensors;
  expect_invalid(&t, "output index out of range", "output", NULL);

  t = tiny_build();
  t.g->tensors[t.v].dtype = IR_DTYPE_INVALID;
  expect_invalid(&t, "dtype 0", "v_proj", "dtype");

  t = tiny_build();
  t.g->tensors[t.norm_w].dtype = (ir_dtype)(IR_DTYPE_COUNT + 3);
  expect_invalid(&t, "dtype past the enum", "norm_w", "dtype");

  t = tiny_build(); /* an activation nobody produces */
  t.g->tensors[t.o].producer = -1;
  expect_invalid(&t, "act without producer", "o_proj", NULL);

  t = tiny_build();
  t.g->tensors[t.emb].dims[0] = DS(IR_SYM_TOKENS);
  expect_invalid(&t, "symbolic weight dim", "emb", NULL);

  t = tiny_build();
  t.g->nodes[t.n_att].attrs[2].i = 3; /* n_kv_heads 3 does not divide n_heads 2 */
  expect_invalid(&t, "bad attention geometry after construction", "attn", NULL);

  t = tiny_build();
  t.g->config.max_logits = t.g->config.max_tokens + 1;
  expect_invalid(&t, "step limits", "max_logits", NULL);
}

/* The verifier's contract: "each activation has exactly one producer". A tensor that
 * names node 0 as producer while node 0 writes something else is never written, and a
 * reader of it would read stale arena bytes. */
static void test_verify_orphan_activation(void) {
  tiny t = tiny_build();
  ir_dim dims[2] = {DS(IR_SYM_TOKENS), DN(H)};
  int32_t orphan = ir_graph_add_tensor(t.g, "orphan", IR_F32, 2, dims, IR_TENSOR_ACT);
  CHECK(orphan >= 0);
  t.g->tensors[orphan].producer = t.n_embed; /* embed's real output is t.x */
  t.g->nodes[t.n_add].in[0] = orphan;        /* residual reads it instead of x */
  expect_invalid(&t, "activation its producer does not write", "orphan", NULL);
}

/* ---- printer ---------------------------------------------------------------------------- */

static void test_print(void) {
  tiny t = tiny_build();
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  CHECK(f != NULL);
  if (!f) return;
  ir_graph_print(t.g, f);
  fclose(f);
  CHECK(len > 0 && buf != NULL);
  const char *want[] = {"embed(",  "rms_norm(",     "matmul(",   "rope(",        "attention(",
                        "add(",    "gather_rows(",  "%tokens",   "%logit_rows",  "%q_proj",
                        "%logits", "%wq:f32[8,8]",  "eps=1e-05", "n_kv_heads=1", "[T,8]",
                        "[L,16]",  "output %logits"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    CHECKF(has(buf, want[i]), "printout lacks '%s':\n%s", want[i], buf);
  free(buf);
  ir_graph_destroy(t.g);
}

/* FP8 E4M3 against the OCP 8-bit floating point spec (E4M3FN): bias 7, no infinities,
 * S.1111.111 NaN, largest 448, smallest normal 2^-6, smallest subnormal 2^-9; every code
 * but the NaNs round-trips, codes order as their values, and f32 -> e4m3 rounds to the
 * nearest code, ties to even, saturating. */
static void test_f8_e4m3(void) {
  static const struct {
    uint8_t code;
    float v;
  } spec[] = {{0x00, 0.0f},      {0x38, 1.0f},         {0x40, 2.0f},         {0x7e, 448.0f},
              {0x08, 0.015625f}, {0x01, 0.001953125f}, {0x07, 0.013671875f}, {0xb8, -1.0f},
              {0xfe, -448.0f},   {0x3c, 1.5f},         {0x3f, 1.875f}};
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
    CHECKF(ir_f8e4m3_to_f32(spec[i].code) == spec[i].v, "code 0x%02x: %g", spec[i].code,
           ir_f8e4m3_to_f32(spec[i].code));
    CHECKF(ir_f32_to_f8e4m3(spec[i].v) == spec[i].code, "%g: 0x%02x", spec[i].v,
           ir_f32_to_f8e4m3(spec[i].v));
  }
  CHECK(ir_f8e4m3_to_f32(0x7f) != ir_f8e4m3_to_f32(0x7f) && ir_f32_to_f8e4m3(NAN) == 0x7f);
  int bad = 0;
  for (int c = 0; c < 0x7f; c++) { /* positive codes ascend; every one round-trips */
    bad += ir_f32_to_f8e4m3(ir_f8e4m3_to_f32((uint8_t)c)) != c;
    bad += ir_f32_to_f8e4m3(ir_f8e4m3_to_f32((uint8_t)(c | 0x80))) != (c | 0x80) && c;
    if (c) bad += !(ir_f8e4m3_to_f32((uint8_t)c) > ir_f8e4m3_to_f32((uint8_t)(c - 1)));
    if (c && c < 0x7e) { /* the midpoint to the next code goes to the even one */
      float lo = ir_f8e4m3_to_f32((uint8_t)c), hi = ir_f8e4m3_to_f32((uint8_t)(c + 1));
      bad += ir_f32_to_f8e4m3(0.5f * (lo + hi)) != ((c & 1) ? c + 1 : c);
      bad += ir_f32_to_f8e4m3(lo + 0.26f * (hi - lo)) != c;
      bad += ir_f32_to_f8e4m3(lo + 0.74f * (hi - lo)) != c + 1;
    }
  }
  CHECKF(!bad, "%d round-trip, order or rounding failures", bad);
  CHECK(ir_f32_to_f8e4m3(1e9f) == 0x7e && ir_f32_to_f8e4m3(-INFINITY) == 0xfe &&
        ir_f32_to_f8e4m3(460.0f) == 0x7e && ir_f32_to_f8e4m3(1e-30f) == 0x00);
  CHECK(ir_dtype_bytes(IR_F8_E4M3, 10) == 10 && !strcmp(ir_dtype_name(IR_F8_E4M3), "f8_e4m3"));
}

static void test_names_and_destroy(void) {
  CHECK(strcmp(ir_op_name(IR_OP_ADD_RMS_NORM), "add_rms_norm") == 0);
  CHECK(ir_op_from_name("gather_rows") == IR_OP_GATHER_ROWS);
  CHECK(ir_op_from_name("conv") == IR_OP_INVALID);
  CHECK(strcmp(ir_op_name(IR_OP_COUNT), "invalid") == 0);
  CHECK(strcmp(ir_op_name((ir_op)9999), "invalid") == 0);
  CHECK(strcmp(ir_op_name(IR_OP_ND_TRILU), "nd.trilu") == 0);
  CHECK(ir_op_from_name("nd.attention") == IR_OP_ND_ATTENTION);
  for (int op = 1; op < IR_OP_COUNT; op++) /* every op has a name of its own */
    CHECKF(ir_op_from_name(ir_op_name((ir_op)op)) == (ir_op)op, "op %d", op);
  CHECK(strcmp(ir_sym_name(IR_SYM_LOGITS), "L") == 0);
  ir_graph_destroy(NULL); /* a no-op */
  ir_graph *g = ir_graph_create();
  void *buf = malloc(32);
  CHECK(ir_graph_adopt(g, buf)); /* freed by destroy: ASan reports a leak otherwise */
  ir_graph_destroy(g);
}

int main(void) {
  for (size_t i = 0; i < sizeof g_cs / sizeof *g_cs; i++) g_cs[i] = (float)i * 0.01f;
  test_attr_intern();
  test_inference();
  test_add_node_refuses();
  test_verify_valid();
  test_verify_corrupt();
  test_verify_orphan_activation();
  test_print();
  test_names_and_destroy();
  test_f8_e4m3();
  return tcheck_done("test_ir");
}
