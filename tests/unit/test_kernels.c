/* test_kernels: every CPU kernel against a naive double-precision reference, plus the
 * batch-invariance guarantee (a row's bits do not depend on its batch or thread count). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kn_cpu.h"
#include "tcheck.h"
#include "tref.h"

/* ---- helpers ---------------------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float rnd(void) { /* uniform in [-1, 1) */
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (float)((g_rng >> 40) * (1.0 / (1 << 23))) - 1.0f;
}

static float *rnd_vec(int64_t n, float scale) {
  float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = rnd() * scale;
  return v;
}

static size_t dt_size(ir_dtype dt) { return dt == IR_F32 ? 4 : 2; }

/* Stores v in dtype dt and rounds v to what dt holds, so references use exact weights. */
static void *to_dtype(float *v, int64_t n, ir_dtype dt) {
  void *out = malloc((size_t)(n > 0 ? n : 1) * dt_size(dt));
  for (int64_t i = 0; i < n; i++) {
    if (dt == IR_F32) {
      ((float *)out)[i] = v[i];
    } else if (dt == IR_F16) {
      ((uint16_t *)out)[i] = ir_f32_to_f16(v[i]);
      v[i] = ir_f16_to_f32(((uint16_t *)out)[i]);
    } else {
      ((uint16_t *)out)[i] = ir_f32_to_bf16(v[i]);
      v[i] = ir_bf16_to_f32(((uint16_t *)out)[i]);
    }
  }
  return out;
}

static const ir_dtype k_dtypes[3] = {IR_F32, IR_F16, IR_BF16};

/* ---- matmul ----------------------------------------------------------------------- */

/* Against a double reference, error bound relative to sum |x_i w_i| (tests/unit/tref.h). */
static int matmul_ok(const float *y, const float *x, const float *w, const float *bias, int64_t m,
                     int64_t n, int64_t k) {
  return tref_matmul_ok(y, x, w, bias, m, n, k, 1e-5);
}

static void matmul_case(kn_pool *p, ir_dtype dt, int use_bias, int64_t m, int64_t n, int64_t k) {
  float *x = rnd_vec(m * k, 1.0f), *w = rnd_vec(n * k, 1.0f);
  float *bias = use_bias ? rnd_vec(n, 1.0f) : NULL, *y = rnd_vec(m * n, 1.0f);
  void *wq = to_dtype(w, n * k, dt);
  kn_matmul(p, y, x, wq, dt, bias, m, n, k);
  CHECKF(matmul_ok(y, x, w, bias, m, n, k), "dt=%s bias=%d m=%lld n=%lld k=%lld", ir_dtype_name(dt),
         use_bias, (long long)m, (long long)n, (long long)k);
  free(x), free(w), free(bias), free(y), free(wq);
}

static void test_matmul(kn_pool *p4) {
  /* n = 2 and 10 leave 2-row edges for both kernel widths (4 and 8). */
  static const int64_t ms[] = {1, 3, 17}, ns[] = {1, 2, 7, 10, 300}, ks[] = {1, 5, 64, 172};
  for (int d = 0; d < 3; d++)
    for (int b = 0; b < 2; b++)
      for (int mi = 0; mi < 3; mi++)
        for (int ni = 0; ni < 5; ni++)
          for (int ki = 0; ki < 4; ki++)
            matmul_case(mi == 1 ? NULL : p4, k_dtypes[d], b, ms[mi], ns[ni], ks[ki]);
  for (int d = 0; d < 3; d++) { /* several m and n tiles, threaded */
    matmul_case(p4, k_dtypes[d], 1, 70, 1000, 172);
    matmul_case(p4, k_dtypes[d], 0, 133, 45, 600);
  }
}

/* Row i computed alone (serial, and on a 1-thread pool) and inside batches of 5 and 17
 * rows on 4 threads must agree bit for bit. */
static void matmul_invariance(kn_pool *p1, kn_pool *p4, ir_dtype dt, int64_t n, int64_t k) {
  enum { M = 17 };
  float *x = rnd_vec(M * k, 1.0f), *w = rnd_vec(n * k, 1.0f), *bias = rnd_vec(n, 1.0f);
  float *y17 = rnd_vec(M * n, 1.0f), *y5 = rnd_vec(5 * n, 1.0f), *y1 = rnd_vec(n, 1.0f);
  void *wq = to_dtype(w, n * k, dt);
  kn_matmul(p4, y17, x, wq, dt, bias, M, n, k);
  int ok = 1;
  for (int64_t i = 0; i < M; i++) {
    kn_matmul(i % 2 ? p1 : NULL, y1, x + i * k, wq, dt, bias, 1, n, k);
    ok &= memcmp(y1, y17 + i * n, (size_t)n * sizeof(float)) == 0;
  }
  for (int64_t i0 = 0; i0 + 5 <= M; i0 += 3) { /* the same rows at other batch offsets */
    kn_matmul(p4, y5, x + i0 * k, wq, dt, bias, 5, n, k);
    ok &= memcmp(y5, y17 + i0 * n, 5 * (size_t)n * sizeof(float)) == 0;
  }
  CHECKF(ok, "matmul batch invariance dt=%s n=%lld k=%lld", ir_dtype_name(dt), (long long)n,
         (long long)k);
  free(x), free(w), free(bias), free(y17), free(y5), free(y1), free(wq);
}

static void test_matmul_invariance(kn_pool *p1, kn_pool *p4) {
  for (int d = 0; d < 3; d++) {
    matmul_invariance(p1, p4, k_dtypes[d], 300, 172);
    matmul_invariance(p1, p4, k_dtypes[d], 1000, 64);
    matmul_invariance(p1, p4, k_dtypes[d], 7, 5);
  }
}

/* ---- attention -------------------------------------------------------------------- */

enum { A_SEQ = 2, A_BS = 4, A_MAXB = 5, A_NBLK = 12, A_MAXPOS = A_BS * A_MAXB };

/* The sliding window and the score soft cap the attention tests run with (0: none). */
static int64_t g_window;
static float g_softcap;
/* Nonzero: the attention runs in the bf16 order (io.bf16) and the references take q, k and
 * v rounded to bf16 (the products are then exact, so only the weights' rounding and the
 * f32 sums are left: a looser bound). */
static int g_bf16;
/* The best instruction set the runs take: 2 (AVX-512), or 3 where the bf16 order is the
 * tile order on a CPU with AMX-BF16 (the queries-in-lanes groups on the tile unit). */
static int g_top = 2;

static double ref_val(float x) {
  return g_bf16 ? (double)ir_bf16_to_f32(ir_f32_to_bf16(x)) : (double)x;
}
static double ref_tol(void) { return g_bf16 ? 6e-3 : 2e-5; }

/* kn_attention_paged with g_window and g_softcap. */
static void attn_call(kn_pool *p, float *out, const float *q, const float *k, const float *v,
                      const kn_kv_layer *kv, const kn_attn_batch *b, int64_t nh, float scale) {
  kn_attn_io io = {.q = q,
                   .k = k,
                   .v = v,
                   .q_stride = nh * kv->head_dim,
                   .kv_stride = kv->n_kv_heads * kv->head_dim,
                   .window = g_window,
                   .softcap = g_softcap,
                   .bf16 = g_bf16};
  kn_attention_paged_io(p, out, &io, kv, b, nh, scale);
}

/* The first position a query at pos attends, and a score as the reference takes it. */
static int64_t ref_first(int64_t pos) {
  return g_window > 0 && pos >= g_window ? pos - g_window + 1 : 0;
}
static double ref_score(double s) { return g_softcap > 0 ? g_softcap * tanh(s / g_softcap) : s; }

/* The logical K/V of both sequences, which the paged cache must reproduce. */
typedef struct attn_fix {
  int64_t n_heads, n_kv, hd;
  float *k_all, *v_all; /* (A_SEQ, A_MAXPOS, n_kv, hd) */
  int32_t tables[A_SEQ * A_MAXB];
  kn_kv_layer kv;
} attn_fix;

static void attn_fix_init(attn_fix *f, int64_t n_heads, int64_t n_kv, int64_t hd) {
  f->n_heads = n_heads, f->n_kv = n_kv, f->hd = hd;
  f->k_all = rnd_vec(A_SEQ * A_MAXPOS * n_kv * hd, 1.0f);
  f->v_all = rnd_vec(A_SEQ * A_MAXPOS * n_kv * hd, 1.0f);
  /* Shuffled, non-contiguous physical blocks; some never used. */
  static const int32_t perm[A_SEQ * A_MAXB] = {7, 2, 10, 0, 5, 3, 11, 1, 8, 4};
  memcpy(f->tables, perm, sizeof perm);
  int64_t cache = A_NBLK * n_kv * A_BS * hd;
  f->kv = (kn_kv_layer){.k = rnd_vec(cache, 100.0f),
                        .v = rnd_vec(cache, 100.0f),
                        .n_blocks = A_NBLK,
                        .block_size = A_BS,
                        .n_kv_heads = n_kv,
                        .head_dim = hd};
}

static void attn_fix_free(attn_fix *f) {
  free(f->k_all), free(f->v_all), free(f->kv.k), free(f->kv.v);
}

static const float *attn_kv_row(const attn_fix *f, const float *all, int64_t s, int64_t pos,
                                int64_t kvh) {
  return all + ((s * A_MAXPOS + pos) * f->n_kv + kvh) * f->hd;
}

/* Builds q, k_new, v_new for the tokens (seq[t], pos[t]) and runs the kernel. */
static void attn_run(kn_pool *p, attn_fix *f, const int32_t *seq, const int32_t *pos, int64_t n_tok,
                     const float *q, float *out, float scale) {
  int64_t row = f->n_kv * f->hd;
  float *kn = malloc((size_t)(n_tok * row) * sizeof *kn);
  float *vn = malloc((size_t)(n_tok * row) * sizeof *vn);
  for (int64_t t = 0; t < n_tok; t++) {
    memcpy(kn + t * row, attn_kv_row(f, f->k_all, seq[t], pos[t], 0), row * sizeof(float));
    memcpy(vn + t * row, attn_kv_row(f, f->v_all, seq[t], pos[t], 0), row * sizeof(float));
  }
  kn_attn_batch b = {.n_tok = n_tok,
                     .tok_seq = seq,
                     .tok_pos = pos,
                     .max_blocks_per_seq = A_MAXB,
                     .block_tables = f->tables};
  attn_call(p, out, q, kn, vn, &f->kv, &b, f->n_heads, scale);
  free(kn), free(vn);
}

/* Naive softmax(q k^T * scale) v in double for one (token, head). */
static int attn_head_ok(const attn_fix *f, int64_t s, int64_t pos, int64_t h, const float *q,
                        const float *out, float scale) {
  int64_t kvh = h / (f->n_heads / f->n_kv);
  double sc[A_MAXPOS], mx = -INFINITY, sum = 0;
  int64_t j0 = ref_first(pos);
  for (int64_t j = j0; j <= pos; j++) {
    const float *kr = attn_kv_row(f, f->k_all, s, j, kvh);
    double d = 0;
    for (int64_t i = 0; i < f->hd; i++) d += ref_val(q[i]) * ref_val(kr[i]);
    sc[j] = ref_score(d * scale);
    mx = sc[j] > mx ? sc[j] : mx;
  }
  for (int64_t j = j0; j <= pos; j++) sum += sc[j] = exp(sc[j] - mx);
  int ok = 1;
  for (int64_t i = 0; i < f->hd; i++) {
    double ref = 0;
    for (int64_t j = j0; j <= pos; j++)
      ref += sc[j] / sum * ref_val(attn_kv_row(f, f->v_all, s, j, kvh)[i]);
    ok &= fabs(out[i] - ref) <= ref_tol();
  }
  return ok;
}

static int attn_batch_ok(const attn_fix *f, const int32_t *seq, const int32_t *pos, int64_t n_tok,
                         const float *q, const float *out, float scale) {
  int ok = 1;
  for (int64_t t = 0; t < n_tok; t++)
    for (int64_t h = 0; h < f->n_heads; h++) {
      int64_t o = (t * f->n_heads + h) * f->hd;
      ok &= attn_head_ok(f, seq[t], pos[t], h, q + o, out + o, scale);
    }
  return ok;
}

/* The cache must hold every written position where the block table says. */
static int attn_cache_ok(const attn_fix *f, const int32_t *seq, const int32_t *pos, int64_t n) {
  int ok = 1;
  for (int64_t t = 0; t < n; t++)
    for (int64_t h = 0; h < f->n_kv; h++) {
      int64_t blk = f->tables[seq[t] * A_MAXB + pos[t] / A_BS];
      int64_t off = ((blk * f->n_kv + h) * A_BS + pos[t] % A_BS) * f->hd;
      size_t sz = (size_t)f->hd * sizeof(float);
      ok &= memcmp(f->kv.k + off, attn_kv_row(f, f->k_all, seq[t], pos[t], h), sz) == 0;
      ok &= memcmp(f->kv.v + off, attn_kv_row(f, f->v_all, seq[t], pos[t], h), sz) == 0;
    }
  return ok;
}

/* Prefill of two interleaved sequences, then a mixed decode step, then the same tokens
 * alone: references, cache placement and bitwise invariance. */
static void attn_case(kn_pool *p1, kn_pool *p4, int64_t n_heads, int64_t n_kv, int64_t hd,
                      float scale) {
  if (g_bf16 && hd > 256) return; /* (bf16: head_dim <= 256, as the IR's) */
  attn_fix f;
  attn_fix_init(&f, n_heads, n_kv, hd);
  static const int32_t pre_seq[] = {0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0};
  static const int32_t pre_pos[] = {0, 0, 1, 2, 1, 3, 2, 4, 5, 3, 4, 6};
  enum { NP = 12 };
  int64_t qrow = n_heads * hd;
  float *q = rnd_vec(NP * qrow, 1.0f), *out = rnd_vec(NP * qrow, 1.0f);
  float *one = rnd_vec(qrow, 1.0f);
  attn_run(p4, &f, pre_seq, pre_pos, NP, q, out, scale);
  CHECKF(attn_cache_ok(&f, pre_seq, pre_pos, NP), "cache h=%lld kv=%lld", (long long)n_heads,
         (long long)n_kv);
  CHECKF(attn_batch_ok(&f, pre_seq, pre_pos, NP, q, out, scale), "prefill hd=%lld kv=%lld",
         (long long)hd, (long long)n_kv);
  int inv = 1;
  for (int64_t t = 0; t < NP; t++) { /* re-run each token alone: same cache, same bits */
    attn_run(t % 2 ? p1 : NULL, &f, pre_seq + t, pre_pos + t, 1, q + t * qrow, one, scale);
    inv &= memcmp(one, out + t * qrow, (size_t)qrow * sizeof(float)) == 0;
  }
  static const int32_t dec_seq[] = {1, 0}, dec_pos[] = {5, 7};
  attn_run(p4, &f, dec_seq, dec_pos, 2, q, out, scale);
  CHECK(attn_batch_ok(&f, dec_seq, dec_pos, 2, q, out, scale));
  attn_run(p1, &f, dec_seq + 1, dec_pos + 1, 1, q + qrow, one, scale);
  inv &= memcmp(one, out + qrow, (size_t)qrow * sizeof(float)) == 0;
  CHECKF(inv, "attention batch invariance hd=%lld kv=%lld", (long long)hd, (long long)n_kv);
  free(q), free(out), free(one);
  attn_fix_free(&f);
}

static void test_attention(kn_pool *p1, kn_pool *p4) {
  attn_case(p1, p4, 4, 2, 16, 0.25f);
  attn_case(p1, p4, 4, 1, 16, 0.25f);
  attn_case(p1, p4, 4, 4, 20, 1.0f / sqrtf(20.0f));
  attn_case(p1, p4, 4, 2, 300, 1.0f / sqrtf(300.0f)); /* wider than one accumulator slice */
  attn_case(p1, p4, 4, 2, 16, 60.0f); /* score spread > 88: exp overflows without the max */
  /* sliding windows (in blocks of 4: one that ends mid-block, one of a block, one of one
   * position) and soft-capped scores (the cap bites: scores reach 60 * |q.k|) */
  static const struct {
    int64_t window;
    float softcap, scale;
  } w[] = {{3, 0, 0.25f}, {4, 0, 0.25f}, {1, 0, 0.25f}, {0, 2.0f, 60.0f}, {5, 2.0f, 60.0f}};
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
    g_window = w[i].window, g_softcap = w[i].softcap;
    attn_case(p1, p4, 4, 2, 16, w[i].scale);
    attn_case(p1, p4, 4, 1, 20, w[i].scale);
  }
  g_window = 0, g_softcap = 0;
}

/* One sequence of n_pos positions, in an f32 or f16 cache, over blocks of `bs` (so chunks
 * of 16 positions, a partial chunk and the four-row score unroll are all reached), 9 query
 * heads on 3 KV heads, against double softmax(q k^T * scale) v. With `isa` the kernels are
 * capped to that instruction set, and `chunks` off turns the full-chunk kernels off; the
 * caller compares the outputs across runs. */
static void attn_long_run(kn_pool *p, int isa, bool chunks, bool f16, int64_t hd, int64_t bs,
                          int64_t n_pos, float scale, float *out, float *pre) {
  enum { NH = 9, NKV = 3 };
  int64_t n_blk = (n_pos + bs - 1) / bs, row = NKV * hd;
  float *k = rnd_vec(n_pos * row, 1.0f), *v = rnd_vec(n_pos * row, 1.0f);
  float *q = rnd_vec(NH * hd, 1.0f);
  for (int64_t i = 0; f16 && i < n_pos * row; i++) { /* what an f16 cache can hold */
    k[i] = ir_f16_to_f32(ir_f32_to_f16(k[i]));
    v[i] = ir_f16_to_f32(ir_f32_to_f16(v[i]));
  }
  int32_t *tables = malloc((size_t)n_blk * sizeof *tables);
  for (int64_t b = 0; b < n_blk; b++) tables[b] = (int32_t)(n_blk - 1 - b); /* reversed */
  size_t cache = (size_t)(n_blk * bs * row);
  kn_kv_layer kv = {.n_blocks = n_blk, .block_size = bs, .n_kv_heads = NKV, .head_dim = hd};
  if (f16) kv.k16 = calloc(cache, 2), kv.v16 = calloc(cache, 2);
  else kv.k = calloc(cache, 4), kv.v = calloc(cache, 4);
  int32_t *seq = calloc((size_t)n_pos, sizeof *seq), *pos = malloc((size_t)n_pos * 4);
  for (int64_t t = 0; t < n_pos; t++) pos[t] = (int32_t)t;
  float *all = malloc((size_t)(n_pos * NH * hd) * sizeof *all);
  int prev = kn_matmul_set_max_isa(isa);
  bool prev_chunks = kn_attention_set_chunk_kernels(chunks);
  kn_attn_batch b = {.n_tok = n_pos - 1,
                     .tok_seq = seq,
                     .tok_pos = pos,
                     .max_blocks_per_seq = n_blk,
                     .block_tables = tables};
  float *qs = rnd_vec(n_pos * NH * hd, 1.0f);
  attn_call(p, all, qs, k, v, &kv, &b, NH, scale); /* writes positions 0..n-2 */
  memcpy(pre, all, (size_t)((n_pos - 1) * NH * hd) * sizeof *pre);
  b = (kn_attn_batch){.n_tok = 1,
                      .tok_seq = seq,
                      .tok_pos = pos + n_pos - 1,
                      .max_blocks_per_seq = n_blk,
                      .block_tables = tables};
  attn_call(p, out, q, k + (n_pos - 1) * row, v + (n_pos - 1) * row, &kv, &b, NH, scale);
  kn_attention_set_chunk_kernels(prev_chunks);
  kn_matmul_set_max_isa(prev);
  int ok = 1;
  for (int64_t h = 0; h < NH; h++) {
    int64_t kvh = h / (NH / NKV);
    double *sc = malloc((size_t)n_pos * sizeof *sc), mx = -INFINITY, sum = 0;
    int64_t j0 = ref_first(n_pos - 1);
    for (int64_t j = j0; j < n_pos; j++) {
      double d = 0;
      for (int64_t i = 0; i < hd; i++)
        d += ref_val(q[h * hd + i]) * ref_val(k[j * row + kvh * hd + i]);
      sc[j] = ref_score(d * scale), mx = sc[j] > mx ? sc[j] : mx;
    }
    for (int64_t j = j0; j < n_pos; j++) sum += sc[j] = exp(sc[j] - mx);
    for (int64_t i = 0; i < hd; i++) {
      double ref = 0;
      for (int64_t j = j0; j < n_pos; j++) ref += sc[j] / sum * ref_val(v[j * row + kvh * hd + i]);
      ok &= fabs(out[h * hd + i] - ref) <= ref_tol();
    }
    free(sc);
  }
  CHECKF(ok,
         "long attention isa %d %s hd %lld bs %lld n %lld scale %g window %lld softcap %g bf16 %d",
         isa, f16 ? "f16" : "f32", (long long)hd, (long long)bs, (long long)n_pos, scale,
         (long long)g_window, g_softcap, g_bf16);
  free(k), free(v), free(q), free(tables), free(kv.k), free(kv.v), free(seq), free(pos);
  free(kv.k16), free(kv.v16);
  free(all), free(qs);
}

/* Every instruction set against the reference, and against each other within rounding
 * (they differ only where the portable build has no native fma); AVX2 and AVX-512 with
 * the chunk kernels on and off, bit for bit. */
static void test_attention_long(kn_pool *p) {
  static const struct {
    int64_t hd, bs, n;
    float scale;
    int64_t window;
    float softcap;
  } c[] = {{64, 32, 83, 0.125f, 0, 0},
           {64, 16, 40, 0.125f, 0, 0},
           {20, 48, 70, 0.2f, 0, 0},
           {64, 32, 50, 8.0f, 0, 0},
           {48, 16, 45, 0.125f, 0, 0},
           {80, 32, 70, 0.1f, 0, 0},
           /* windows that start mid-chunk, on a chunk's edge, past whole blocks; soft caps */
           {128, 32, 70, 0.08f, 0, 0},
           {64, 15, 50, 0.125f, 0, 0}, /* blocks of 15: every chunk odd (bf16: a lone slot) */
           {64, 32, 83, 0.125f, 37, 0},
           {64, 16, 70, 0.125f, 32, 0},
           {128, 48, 90, 0.08f, 21, 0},
           {48, 16, 45, 8.0f, 20, 3.0f},
           {64, 32, 50, 8.0f, 0, 3.0f}};
  for (size_t i = 0; i < 2 * sizeof c / sizeof c[0]; i++) {
    g_window = c[i / 2].window, g_softcap = c[i / 2].softcap;
    bool f16 = i % 2;
    int64_t hd = c[i / 2].hd, bs = c[i / 2].bs, n = c[i / 2].n;
    size_t sz = (size_t)(9 * hd) * sizeof(float), psz = (size_t)(n - 1) * sz;
    /* portable; AVX2, AVX-512 with the chunk kernels; then without; bf16: AVX-512 without
     * vdpbf16ps */
    float *o[6], *pre[6];
    const int runs = g_bf16 ? 6 : 5;
    uint64_t seed = g_rng; /* the same inputs for every run */
    for (int r = 0; r < runs; r++) {
      g_rng = seed;
      o[r] = malloc(sz), pre[r] = malloc(psz);
      bool dp = kn_matmul_use_bf16dp(r < 5);
      attn_long_run(p,
                    r == 5        ? g_top
                    : r == 0      ? 0
                    : (r + 1) % 2 ? g_top
                                  : 1,
                    r < 3, f16, hd, bs, n, c[i / 2].scale, o[r], pre[r]);
      kn_matmul_use_bf16dp(dp);
    }
    if (g_bf16)
      CHECKF(!memcmp(o[2], o[5], sz) && !memcmp(pre[2], pre[5], psz),
             "bf16 attention on vdpbf16ps vs fmas differ (%s hd %lld bs %lld window %lld)",
             f16 ? "f16" : "f32", (long long)hd, (long long)bs, (long long)g_window);
    /* the prefill's tokens too (many queries a group: the AVX-512 one in the lanes) */
    CHECKF(!memcmp(pre[1], pre[2], psz), "prefill attention AVX2 vs AVX-512 differ (hd %lld)",
           (long long)hd);
    for (int r = 3; r < 5; r++)
      CHECKF(!memcmp(pre[r - 2], pre[r], psz),
             "prefill attention chunk kernels vs per-query phases differ (isa %d %s hd %lld bs "
             "%lld window %lld)",
             r - 2, f16 ? "f16" : "f32", (long long)hd, (long long)bs, (long long)g_window);
    /* AVX2 and AVX-512 both fuse every multiply-add in the same order: the same bits
     * (and on a CPU with less, both runs take the same kernels) */
    CHECKF(!memcmp(o[1], o[2], sz), "attention AVX2 vs AVX-512 differ (hd %lld)", (long long)hd);
    for (int r = 3; r < 5; r++)
      CHECKF(!memcmp(o[r - 2], o[r], sz),
             "attention chunk kernels vs per-query phases differ (isa %d %s hd %lld)", r - 2,
             f16 ? "f16" : "f32", (long long)hd);
    float worst = 0;
    for (int64_t j = 0; j < 9 * hd; j++) worst = fmaxf(worst, fabsf(o[0][j] - o[2][j]));
    CHECKF(worst <= 1e-5f, "attention portable vs SIMD differ by %g", worst);
    for (int r = 0; r < runs; r++) free(o[r]), free(pre[r]);
  }
  g_window = 0, g_softcap = 0;
}

/* Grouped queries (GQA heads, a prefill's tokens, head sub-groups on idle threads) change
 * no bit: a prompt of n tokens of one sequence (full 16-position chunks and a partial
 * one, written and attended in one call on four threads) against each token attended
 * alone on one or four threads, bit for bit; AVX2 (a full chunk two or three queries at
 * a time) against AVX-512 (four at a time) and both against their per-query phases (the
 * chunk kernels off) bit for bit; and a few rows against softmax(q k^T) v in double over
 * what the cache holds. Caches: f32, f16, int8 (rows with their scales). Head layouts: 9
 * on 3 (g 3), 32 on 2 (g 16: one token a group), 40 on 2 (g 20: two sub-groups), 4 on 4
 * (g 1: 16 tokens a group). */
enum { ATTN_F32, ATTN_F16, ATTN_I8 };

/* Element e of row j (position j of the sequence) of kv head kvh of the K (or V) cache. */
static double attn_cached(const kn_kv_layer *kv, const int32_t *tables, int64_t j, int64_t kvh,
                          int64_t e, bool v) {
  int64_t bs = kv->block_size, r = (tables[j / bs] * kv->n_kv_heads + kvh) * bs + j % bs;
  int64_t o = r * kv->head_dim + e;
  if (kv->k) return ref_val(v ? kv->v[o] : kv->k[o]);
  if (kv->k16) return ref_val(ir_f16_to_f32(v ? kv->v16[o] : kv->k16[o]));
  return v ? (double)kv->v8[o] * kv->v_scale[r] : (double)kv->k8[o] * kv->k_scale[r];
}

/* The spread of the K and V values attn_group_run draws (uniform in [-x, x)). */
static float g_kmul = 1.0f, g_vmul = 1.0f;

/* A token whose v rows hold an infinity (attn_group_run), or -1. */
static int64_t g_vinf = -1;

static void attn_group_run(kn_pool *p, int isa, bool chunks, int kind, int64_t nh, int64_t nkv,
                           int64_t n, float *out) {
  const int64_t hd = 64, bs = 16, n_blk = (n + bs - 1) / bs, row = nkv * hd;
  uint64_t seed = g_rng;
  float *k = rnd_vec(n * row, g_kmul), *v = rnd_vec(n * row, g_vmul);
  float *q = rnd_vec(n * nh * hd, 1.0f);
  g_rng = seed;
  if (g_vinf >= 0) v[g_vinf * row + 5] = INFINITY; /* one value of one token's v rows */
  int32_t *tables = malloc((size_t)n_blk * sizeof *tables);
  for (int64_t b = 0; b < n_blk; b++) tables[b] = (int32_t)((b * 5 + 3) % n_blk); /* scattered */
  size_t cache = (size_t)(n_blk * bs * row), rows = (size_t)(n_blk * bs * nkv);
  kn_kv_layer kv = {.n_blocks = n_blk, .block_size = bs, .n_kv_heads = nkv, .head_dim = hd};
  if (kind == ATTN_F16) kv.k16 = calloc(cache, 2), kv.v16 = calloc(cache, 2);
  else if (kind == ATTN_I8) {
    kv.k8 = calloc(cache, 1), kv.v8 = calloc(cache, 1);
    kv.k_scale = calloc(rows, 4), kv.v_scale = calloc(rows, 4);
  } else kv.k = calloc(cache, 4), kv.v = calloc(cache, 4);
  int32_t *seq = calloc((size_t)n, sizeof *seq), *pos = malloc((size_t)n * sizeof *pos);
  for (int64_t t = 0; t < n; t++) pos[t] = (int32_t)t;
  int prev = kn_matmul_set_max_isa(isa);
  bool prev_chunks = kn_attention_set_chunk_kernels(chunks);
  kn_attn_batch b = {.n_tok = n,
                     .tok_seq = seq,
                     .tok_pos = pos,
                     .max_blocks_per_seq = n_blk,
                     .block_tables = tables};
  attn_call(p, out, q, k, v, &kv, &b, nh, 0.125f);
  for (int64_t t = 0; t < n; t++) { /* every token again on its own, over that cache */
    b = (kn_attn_batch){.n_tok = 1,
                        .tok_seq = seq,
                        .tok_pos = pos + t,
                        .max_blocks_per_seq = n_blk,
                        .block_tables = tables};
    /* on one thread, or on four (fewer kv heads than threads: the heads split again) */
    attn_call(t % 2 ? p : NULL, out + n * nh * hd + t * nh * hd, q + t * nh * hd, k + t * row,
              v + t * row, &kv, &b, nh, 0.125f);
  }
  kn_attention_set_chunk_kernels(prev_chunks);
  kn_matmul_set_max_isa(prev);
  int ok = 1; /* tokens 0, 17 and n - 1 against the double reference */
  const int64_t last = g_vinf >= 0 ? g_vinf - 1 : n - 1; /* (not the tokens that read inf) */
  const int64_t ts[3] = {0, 17 < n ? 17 : 0, last};
  for (int i = 0; i < 3; i++)
    for (int64_t h = 0; h < nh; h++) {
      int64_t t = ts[i], kvh = h / (nh / nkv);
      double *sc = malloc((size_t)(t + 1) * sizeof *sc), mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= t; j++) {
        double d = 0;
        for (int64_t e = 0; e < hd; e++)
          d += ref_val(q[(t * nh + h) * hd + e]) * attn_cached(&kv, tables, j, kvh, e, false);
        sc[j] = d * 0.125, mx = sc[j] > mx ? sc[j] : mx;
      }
      for (int64_t j = 0; j <= t; j++) sum += sc[j] = exp(sc[j] - mx);
      for (int64_t e = 0; e < hd; e++) {
        double ref = 0;
        for (int64_t j = 0; j <= t; j++)
          ref += sc[j] / sum * attn_cached(&kv, tables, j, kvh, e, true);
        ok &= fabs(out[(t * nh + h) * hd + e] - ref) <= ref_tol();
      }
      free(sc);
    }
  CHECKF(ok, "grouped attention vs reference isa %d chunks %d kind %d heads %lld/%lld", isa, chunks,
         kind, (long long)nh, (long long)nkv);
  free(k), free(v), free(q), free(tables), free(kv.k), free(kv.v), free(kv.k16), free(kv.v16);
  free(kv.k8), free(kv.v8), free(kv.k_scale), free(kv.v_scale);
  free(seq), free(pos);
}

static void test_attention_groups(kn_pool *p4) {
  static const int64_t heads[4][2] = {{9, 3}, {32, 2}, {40, 2}, {4, 4}};
  static const char *kinds[3] = {"f32", "f16", "int8"};
  const int64_t n = 37; /* two full chunks and a partial one */
  for (int hi = 0; hi < 4; hi++)
    for (int kind = 0; kind < 3; kind++) {
      int64_t nh = heads[hi][0], nkv = heads[hi][1], sz = n * nh * 64;
      /* AVX2, AVX-512, each with the chunk kernels then without; bf16: AVX-512 without
       * vdpbf16ps (the queries-in-lanes groups off: the fmas under DAZ and FTZ) */
      float *o[5];
      const int runs = g_bf16 ? 5 : 4;
      for (int r = 0; r < runs; r++) { /* each run draws the same inputs */
        o[r] = malloc((size_t)(2 * sz) * sizeof *o[r]);
        bool dp = kn_matmul_use_bf16dp(r < 4);
        attn_group_run(p4, r == 4 || r % 2 ? g_top : 1, r < 2, kind, nh, nkv, n, o[r]);
        kn_matmul_use_bf16dp(dp);
        CHECKF(!memcmp(o[r], o[r] + sz, (size_t)sz * sizeof *o[r]),
               "grouped prefill vs each token alone differ (isa %d chunks %d heads %lld/%lld "
               "%s)",
               1 + r % 2, r < 2, (long long)nh, (long long)nkv, kinds[kind]);
      }
      CHECKF(!memcmp(o[0], o[1], (size_t)(2 * sz) * sizeof *o[0]),
             "grouped attention AVX2 vs AVX-512 differ (heads %lld/%lld %s)", (long long)nh,
             (long long)nkv, kinds[kind]);
      for (int r = 0; r < 2; r++)
        CHECKF(!memcmp(o[r], o[r + 2], (size_t)(2 * sz) * sizeof *o[r]),
               "attention chunk kernels vs per-query phases differ (isa %d heads %lld/%lld %s)",
               1 + r, (long long)nh, (long long)nkv, kinds[kind]);
      if (g_bf16)
        CHECKF(!memcmp(o[1], o[4], (size_t)(2 * sz) * sizeof *o[1]),
               "bf16 attention on vdpbf16ps vs fmas differ (heads %lld/%lld %s)", (long long)nh,
               (long long)nkv, kinds[kind]);
      for (int r = 0; r < runs; r++) free(o[r]);
    }
}

/* An infinite v in a slot that some queries of a prefill group skip (the tile order's groups
 * take such a chunk per query): the tokens before it give the bits they give alone, finite,
 * on every path. Tokens 35-39 are a group (9/3 heads: 5 tokens a group); 35 and 36 skip
 * token 37's slot of their chunk. */
static void test_attention_vinf(kn_pool *p4) {
  const int64_t n = 40, nh = 9, nkv = 3, sz = n * nh * 64;
  float *o[2];
  g_vinf = 37;
  for (int r = 0; r < 2; r++) {
    o[r] = malloc((size_t)(2 * sz) * sizeof *o[r]);
    attn_group_run(p4, r ? g_top : 1, true, ATTN_F16, nh, nkv, n, o[r]);
  }
  g_vinf = -1;
  const int64_t lo = 35 * nh * 64, m = 2 * nh * 64; /* tokens 35, 36 */
  int finite = 1;
  for (int64_t i = 0; i < 37 * nh * 64; i++) finite &= isfinite(o[1][i]) != 0;
  CHECKF(finite, "an infinite v reached tokens that do not read it");
  CHECKF(!memcmp(o[1], o[1] + sz, (size_t)(37 * nh * 64) * sizeof(float)),
         "an infinite v some queries skip: their prefill differs from each alone");
  CHECKF(!memcmp(o[0] + lo, o[1] + lo, (size_t)m * sizeof(float)),
         "an infinite v some queries skip: the paths differ");
  free(o[0]), free(o[1]);
}

/* io.bf16 reaches the kernels: the same inputs give other bits than the f32 order. */
static void test_attention_bf16_differs(kn_pool *p4) {
  const int64_t n = 37, sz = n * 9 * 64;
  float *o[2];
  for (int r = 0; r < 2; r++) { /* (each run draws the same inputs) */
    g_bf16 = r;
    o[r] = malloc((size_t)(2 * sz) * sizeof *o[r]);
    attn_group_run(p4, 2, true, ATTN_F16, 9, 3, n, o[r]);
  }
  g_bf16 = 0;
  CHECKF(memcmp(o[0], o[1], (size_t)sz * sizeof *o[0]) != 0,
         "bf16 attention gave the f32 order's bits: io.bf16 never reached the kernels");
  free(o[0]), free(o[1]);
}

/* An f16 cache holds ir_f32_to_f16 of each k and v value on every path (the AVX-512 one
 * converts 16 at a time): rounding ties, the largest finite and overflowing values,
 * subnormal edges, signed zeros, infinities and NaNs with payloads. */
static void test_attention_f16_store(void) {
  enum { HD = 80 }; /* five 16-lane steps and no tail; values past 48 random */
  static const uint32_t special[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
      0x7fa00000u, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0xc77ff000u, 0x33000000u, 0x33000001u,
      0xb3000000u, 0x32ffffffu, 0x387fe000u, 0x387ff000u, 0x38800000u, 0x3f801000u, 0x3f803000u,
      0x3f800fffu, 0x00000001u, 0x807fffffu, 0x3c000000u, 0x42280000u, 0xc2280000u, 0x3f802000u,
      0x33800000u, 0x337fffffu, 0x7f7fffffu, 0xff7fffffu};
  const int64_t ns = sizeof special / sizeof special[0];
  for (int isa = 0; isa <= 2; isa++) {
    float k[HD], v[HD], q[HD] = {0}, out[HD];
    for (int64_t i = 0; i < HD; i++) {
      uint32_t u = i < ns ? special[i] : (rnd(), (uint32_t)(g_rng >> 32));
      memcpy(&k[i], &u, 4);
      u = i < ns ? special[ns - 1 - i] : (rnd(), (uint32_t)(g_rng >> 32));
      memcpy(&v[i], &u, 4);
    }
    uint16_t k16[16 * HD] = {0}, v16[16 * HD] = {0};
    int32_t table = 0, seq = 0, pos = 0;
    kn_kv_layer kv = {
        .n_blocks = 1, .block_size = 16, .n_kv_heads = 1, .head_dim = HD, .k16 = k16, .v16 = v16};
    kn_attn_batch b = {.n_tok = 1,
                       .tok_seq = &seq,
                       .tok_pos = &pos,
                       .max_blocks_per_seq = 1,
                       .block_tables = &table};
    int prev = kn_matmul_set_max_isa(isa);
    kn_attention_paged(NULL, out, q, k, v, &kv, &b, 1, 0.125f);
    kn_matmul_set_max_isa(prev);
    int bad = 0;
    for (int64_t i = 0; i < HD; i++)
      bad += k16[i] != ir_f32_to_f16(k[i]) || v16[i] != ir_f32_to_f16(v[i]);
    CHECKF(bad == 0, "f16 cache store isa %d: %d values not ir_f32_to_f16's", isa, bad);
  }
}

/* ---- rope ------------------------------------------------------------------------- */

static float *rope_table(int64_t max_pos, int64_t rot_dim) {
  int64_t half = rot_dim / 2;
  float *cs = malloc((size_t)(max_pos * half * 2) * sizeof *cs);
  for (int64_t p = 0; p < max_pos; p++)
    for (int64_t i = 0; i < half; i++) {
      double ang = p * pow(10000.0, -2.0 * i / rot_dim);
      cs[(p * half + i) * 2] = (float)cos(ang);
      cs[(p * half + i) * 2 + 1] = (float)sin(ang);
    }
  return cs;
}

/* Index pairs rotated together: (i, i + half) for neox, (2i, 2i + 1) otherwise. */
static int rope_head_ok(const float *in, const float *got, const float *cs, int64_t hd, int64_t rot,
                        int neox) {
  int64_t half = rot / 2;
  int ok = 1;
  for (int64_t i = 0; i < half; i++) {
    int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    double c = cs[2 * i], s = cs[2 * i + 1];
    double ra = in[a] * c - in[b] * s, rb = in[b] * c + in[a] * s;
    double tol = 1e-6 * (fabs(in[a]) + fabs(in[b]));
    ok &= fabs(got[a] - ra) <= tol && fabs(got[b] - rb) <= tol;
  }
  for (int64_t i = rot; i < hd; i++) ok &= got[i] == in[i];
  return ok;
}

static void rope_case(kn_pool *p, int64_t n_tok, int64_t n_heads, int64_t hd, int64_t rot,
                      int neox) {
  enum { MAXPOS = 64 };
  float *cs = rope_table(MAXPOS, rot), *x = rnd_vec(n_tok * n_heads * hd, 3.0f);
  float *in = malloc((size_t)(n_tok * n_heads * hd) * sizeof *in);
  int32_t *pos = malloc((size_t)n_tok * sizeof *pos);
  memcpy(in, x, (size_t)(n_tok * n_heads * hd) * sizeof *in);
  for (int64_t t = 0; t < n_tok; t++) pos[t] = (int32_t)((t * 7 + 3) % MAXPOS);
  kn_rope(p, x, pos, cs, n_tok, n_heads, hd, rot, neox);
  int ok = 1;
  for (int64_t t = 0; t < n_tok; t++)
    for (int64_t h = 0; h < n_heads; h++) {
      int64_t o = (t * n_heads + h) * hd;
      ok &= rope_head_ok(in + o, x + o, cs + pos[t] * rot, hd, rot, neox);
    }
  CHECKF(ok, "rope neox=%d hd=%lld rot=%lld", neox, (long long)hd, (long long)rot);
  free(cs), free(x), free(in), free(pos);
}

static void test_rope(kn_pool *p4) {
  for (int neox = 0; neox < 2; neox++) {
    rope_case(p4, 5, 3, 16, 16, neox);
    rope_case(p4, 5, 3, 16, 8, neox); /* partial rotary */
    rope_case(p4, 40, 8, 64, 64, neox);
    rope_case(NULL, 1, 1, 6, 6, neox);
  }
}

/* ---- rms_norm, add_rms_norm ------------------------------------------------------- */

static int norm_ok(const float *got, const float *x, const float *w, int64_t n, int64_t dim,
                   float eps) {
  int ok = 1;
  for (int64_t r = 0; r < n; r++) {
    double ss = 0;
    for (int64_t i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
    double inv = 1.0 / sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; i++) {
      double ref = w[i] * (x[r * dim + i] * inv);
      ok &= fabs(got[r * dim + i] - ref) <= 1e-5 * fabs(ref) + 1e-7;
    }
  }
  return ok;
}

static void norm_case(kn_pool *p, int64_t n, int64_t dim) {
  float eps = 1e-6f;
  float *x = rnd_vec(n * dim, 4.0f), *w = rnd_vec(dim, 2.0f), *out = rnd_vec(n * dim, 1.0f);
  float *b = rnd_vec(n * dim, 4.0f), *sum = rnd_vec(n * dim, 1.0f);
  kn_rms_norm(p, out, x, w, n, dim, eps);
  CHECKF(norm_ok(out, x, w, n, dim, eps), "rms_norm n=%lld dim=%lld", (long long)n, (long long)dim);
  kn_rms_norm(p, x, x, w, n, dim, eps); /* in place */
  CHECK(memcmp(x, out, (size_t)(n * dim) * sizeof(float)) == 0);
  kn_add_rms_norm(p, out, sum, x, b, w, n, dim, eps);
  int ok = 1;
  for (int64_t i = 0; i < n * dim; i++) ok &= sum[i] == x[i] + b[i];
  CHECK(ok);
  CHECKF(norm_ok(out, sum, w, n, dim, eps), "add_rms_norm n=%lld dim=%lld", (long long)n,
         (long long)dim);
  float *out2 = rnd_vec(n * dim, 1.0f);
  kn_add_rms_norm(p, out2, b, x, b, w, n, dim, eps); /* out_sum aliases b */
  CHECK(memcmp(b, sum, (size_t)(n * dim) * sizeof(float)) == 0);
  CHECK(memcmp(out2, out, (size_t)(n * dim) * sizeof(float)) == 0);
  /* the baseline build of the rows and the AVX-512 one: the same bits */
  float *o0 = rnd_vec(n * dim, 1.0f), *s0 = rnd_vec(n * dim, 1.0f);
  float *b0 = rnd_vec(n * dim, 4.0f);
  int prev = kn_matmul_set_max_isa(0);
  kn_add_rms_norm(p, o0, s0, x, b0, w, n, dim, eps);
  kn_matmul_set_max_isa(prev);
  kn_add_rms_norm(p, out, sum, x, b0, w, n, dim, eps);
  CHECKF(!memcmp(o0, out, (size_t)(n * dim) * sizeof(float)) &&
             !memcmp(s0, sum, (size_t)(n * dim) * sizeof(float)),
         "add_rms_norm baseline vs %s n=%lld dim=%lld", kn_cpu_isa() >= 2 ? "AVX-512" : "itself",
         (long long)n, (long long)dim);
  free(x), free(w), free(out), free(b), free(sum), free(out2), free(o0), free(s0), free(b0);
}

static void test_norm(kn_pool *p4) {
  norm_case(p4, 1, 1);
  norm_case(p4, 3, 17);
  norm_case(NULL, 2, 576);
  norm_case(p4, 64, 1000);
  norm_case(p4, 5, 1024); /* Qwen3-0.6B's width */
}

/* ---- embed, swiglu, add, gather_rows ---------------------------------------------- */

static void test_embed(kn_pool *p4) {
  enum { VOCAB = 50, DIM = 37, NT = 600 };
  int32_t ids[NT];
  for (int t = 0; t < NT; t++) ids[t] = (t * 13 + 5) % VOCAB;
  for (int d = 0; d < 3; d++) {
    float *table = rnd_vec(VOCAB * DIM, 2.0f), *out = rnd_vec(NT * DIM, 1.0f);
    void *tq = to_dtype(table, VOCAB * DIM, k_dtypes[d]);
    kn_embed(d == 1 ? NULL : p4, out, tq, k_dtypes[d], ids, NT, DIM);
    int ok = 1;
    for (int t = 0; t < NT; t++)
      ok &= memcmp(out + t * DIM, table + ids[t] * DIM, DIM * sizeof(float)) == 0;
    CHECKF(ok, "embed dt=%s", ir_dtype_name(k_dtypes[d]));
    kn_embed_scaled(p4, out, tq, k_dtypes[d], ids, NT, DIM, 5.656854f); /* Gemma's sqrt(32) */
    for (int t = 0; t < NT; t++)
      for (int i = 0; i < DIM; i++) ok &= out[t * DIM + i] == table[ids[t] * DIM + i] * 5.656854f;
    CHECKF(ok, "embed scaled dt=%s", ir_dtype_name(k_dtypes[d]));
    free(table), free(out), free(tq);
  }
}

static void test_swiglu(kn_pool *p4) {
  enum { N = 100003 };
  float *g = rnd_vec(N, 12.0f), *u = rnd_vec(N, 3.0f), *out = rnd_vec(N, 1.0f);
  g[0] = -200.0f, g[1] = 200.0f, g[2] = 0.0f;             /* exp overflow must not give NaN */
  g[3] = -86.0f, g[4] = -90.0f, g[5] = NAN, g[6] = -0.0f; /* kn_vexp's cut, NaN, -0 */
  float *simd = rnd_vec(N, 1.0f);
  /* every path (portable C, AVX2, AVX-512) against the formula in double: within 1e-6 of
   * it (kn_vexp is within 2 ulp, the sigmoid's division and two products round once
   * each); a value's bits the same alone as among N on a pool (padded tails); AVX2 and
   * AVX-512 the same bits (kn_vexp16 is kn_vexp8 lane for lane) */
  for (int isa = 0; isa <= 2; isa++) {
    int prev = kn_matmul_set_max_isa(isa);
    kn_swiglu(p4, out, g, u, N);
    int ok = 1, alone = 1;
    for (int64_t i = 0; i < N; i++) {
      double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
      ok &= i == 5 ? isnan(out[i]) : fabs(out[i] - ref) <= 1e-6 * fabs(ref) + 1e-30;
      if (i % 97 == 0 || i < 8) {
        float one = kn_silu_mul(g[i], u[i]);
        alone &= memcmp(&one, out + i, sizeof one) == 0;
      }
    }
    CHECKF(ok, "swiglu against the formula, isa %d", isa);
    CHECKF(alone, "swiglu: a value alone gives its bits among many, isa %d", isa);
    if (isa == 1) memcpy(simd, out, N * sizeof(float));
    if (isa == 2) CHECKF(memcmp(simd, out, N * sizeof(float)) == 0, "swiglu AVX2 vs AVX-512 bits");
    kn_matmul_set_max_isa(prev);
  }
  kn_swiglu(p4, out, g, u, N);
  kn_swiglu(p4, g, g, u, N); /* in place over gate */
  CHECK(memcmp(g, out, N * sizeof(float)) == 0);
  kn_swiglu(NULL, out, g, u, 3);
  free(g), free(u), free(out), free(simd);
}

/* gelu_tanh(g) * u and cap * tanh(x / cap) against the formulas in double; a value alone
 * the same bits as among many. */
static void test_geglu_softcap(kn_pool *p4) {
  enum { N = 50001 };
  float *g = rnd_vec(N, 12.0f), *u = rnd_vec(N, 3.0f), *out = rnd_vec(N, 1.0f);
  g[0] = -200.0f, g[1] = 200.0f, g[2] = 0.0f, g[3] = -0.0f;
  kn_geglu(p4, out, g, u, N);
  int ok = 1, alone = 1;
  for (int64_t i = 0; i < N; i++) {
    double x = g[i],
           ref = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    ok &= fabs(out[i] - ref) <= 2e-6 * fabs(x * u[i]) + 1e-30;
    if (i % 97 == 0) {
      float one = kn_gelu_tanh_mul(g[i], u[i]);
      alone &= memcmp(&one, out + i, sizeof one) == 0;
    }
  }
  CHECKF(ok && alone, "geglu against the formula (%d), alone (%d)", ok, alone);
  float *other = rnd_vec(N, 1.0f); /* AVX2 gives the AVX-512 bits, as for swiglu */
  for (int isa = 1; isa <= 1; isa++) {
    int prev = kn_matmul_set_max_isa(isa);
    kn_geglu(p4, other, g, u, N);
    kn_matmul_set_max_isa(prev);
    CHECKF(!memcmp(other, out, N * sizeof(float)), "geglu isa %d vs the best isa", isa);
  }
  free(other);
  kn_softcap(p4, out, g, N, 5.0f);
  ok = 1;
  for (int64_t i = 0; i < N; i++) ok &= fabs(out[i] - 5.0 * tanh(g[i] / 5.0)) <= 1e-6 * 5.0;
  CHECK(ok && fabsf(out[1] - 5.0f) < 1e-6f && out[2] == 0.0f);
  kn_softcap(p4, g, g, N, 5.0f); /* in place */
  CHECK(memcmp(g, out, N * sizeof(float)) == 0);
  free(g), free(u), free(out);
}

static void test_add(kn_pool *p4) {
  enum { N = 100001 };
  float *a = rnd_vec(N, 5.0f), *b = rnd_vec(N, 5.0f), *out = rnd_vec(N, 1.0f);
  kn_add(p4, out, a, b, N);
  int ok = 1;
  for (int64_t i = 0; i < N; i++) ok &= out[i] == a[i] + b[i];
  CHECK(ok);
  kn_add(NULL, a, a, b, N); /* in place */
  CHECK(memcmp(a, out, N * sizeof(float)) == 0);
  free(a), free(b), free(out);
}

static void test_gather(kn_pool *p4) {
  enum { ROWS = 40, DIM = 1500, NR = 30 };
  float *x = rnd_vec(ROWS * DIM, 1.0f), *out = rnd_vec(NR * DIM, 1.0f);
  int32_t rows[NR];
  for (int r = 0; r < NR; r++) rows[r] = (r * 11 + 7) % ROWS;
  kn_gather_rows(p4, out, x, rows, NR, DIM);
  int ok = 1;
  for (int r = 0; r < NR; r++)
    ok &= memcmp(out + r * DIM, x + rows[r] * DIM, DIM * sizeof(float)) == 0;
  CHECK(ok);
  kn_gather_rows(NULL, out, x, rows, 1, DIM);
  CHECK(memcmp(out, x + rows[0] * DIM, DIM * sizeof(float)) == 0);
  free(x), free(out);
}

/* kn_log_sum_exp against max + log(sum exp(x - max)) in double with libm's exp: lengths
 * around the 16-lane loop, a vocabulary, -inf entries (masked logits), all -inf, a NaN;
 * both the portable and (where the CPU has it) the AVX2 path. */
static void test_log_sum_exp(void) {
  const int64_t lens[] = {1, 5, 16, 17, 33, 49152, 100003};
  float *x = malloc(100003 * sizeof *x);
  for (int isa = 0; isa <= 1; isa++) {
    int prev = kn_matmul_set_max_isa(isa);
    double worst = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
      int64_t n = lens[li];
      for (int64_t i = 0; i < n; i++) x[i] = 30.0f * rnd();
      for (int64_t i = 3; i < n; i += 7) x[i] = -INFINITY;
      double mx = -INFINITY, sum = 0;
      for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
      for (int64_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
      double ref = mx + log(sum), got = kn_log_sum_exp(x, n), e = fabs(got - ref);
      worst = e > worst ? e : worst;
      CHECKF(e <= 2e-6, "isa %d n %lld: lse %.9f, reference %.9f", isa, (long long)n, got, ref);
    }
    for (int i = 0; i < 20; i++) x[i] = -INFINITY;
    CHECK(kn_log_sum_exp(x, 20) == -INFINITY);
    x[7] = NAN;
    CHECK(isnan(kn_log_sum_exp(x, 20)));
    printf("log_sum_exp isa %d: worst |error| %.2e\n", isa, worst);
    kn_matmul_set_max_isa(prev);
  }
  free(x);
}

int main(void) {
  test_log_sum_exp();
  kn_pool *p1 = kn_pool_create(1), *p4 = kn_pool_create(4);
  CHECK(p1 != NULL && p4 != NULL);
  if (!p1 || !p4) return tcheck_done("test_kernels");
  test_matmul(p4);
  test_matmul_invariance(p1, p4);
  test_attention(p1, p4);
  kn_matmul_set_max_isa(0); /* the portable and AVX2 kernels through the same cases */
  test_attention(p1, p4);
  kn_matmul_set_max_isa(1);
  test_attention(p1, p4);
  kn_matmul_set_max_isa(2);
  test_attention_long(p4);
  test_attention_groups(p4);
  test_attention_f16_store();
  g_bf16 = 1; /* the bf16 order: every path, then each against the others; in the chain
               * order, then in the tile order (AMX-BF16's; on it where the CPU has it) */
  kn_matmul_set_max_isa(3);
  const bool amx = kn_cpu_has_amx_bf16() && kn_cpu_isa() >= 3;
  printf("bf16 attention in the tile order: %s\n",
         amx ? "on AMX-BF16 and every other path" : "no AMX-BF16: the AVX-512 and portable paths");
  for (int order = 0; order < 2; order++) {
    kn_matmul_set_x16_order(order ? KN_X16_TILE : KN_X16_CHAIN);
    g_top = order && amx ? 3 : 2;
    for (int isa = 0; isa <= g_top; isa++) {
      kn_matmul_set_max_isa(isa);
      test_attention(p1, p4);
    }
    kn_matmul_set_max_isa(2);
    test_attention_long(p4);
    test_attention_groups(p4);
    /* scores far apart (rescales by factors below FLT_MIN, weights near it: subnormal sums
     * and products the order flushes), then tiny values */
    g_kmul = 300.0f;
    test_attention_groups(p4);
    g_vmul = 1e-30f;
    test_attention_groups(p4);
    g_kmul = g_vmul = 1.0f;
    test_attention_vinf(p4);
  }
  kn_matmul_set_x16_order(-1);
  g_top = 2;
  g_bf16 = 0;
  test_attention_bf16_differs(p4);
  test_rope(p4);
  test_norm(p4);
  test_embed(p4);
  test_swiglu(p4);
  test_geglu_softcap(p4);
  test_add(p4);
  test_gather(p4);
  kn_pool_destroy(p1);
  kn_pool_destroy(p4);
  return tcheck_done("test_kernels");
}
