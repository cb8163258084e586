/* test_kv_int8: the int8 KV cache. The attention kernel over it stays within a bound
 * derived from int8 rounding of the f32 result, a token's output never depends on what
 * else is in the step, the pool's layout and block copies, and whole-model decoding with
 * --kv-dtype int8 stays batch-invariant. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infc_build.h"
#include "inferrt.h"
#include "kn_cpu.h"
#include "kn_pool.h"
#include "kv_cache.h"
#include "tcheck.h"

enum { NH = 4, NKV = 2, HD = 64, BS = 4, NBLK = 10, MAXB = 5, MAXPOS = BS * MAXB };

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static float rnd(void) { /* uniform in [-1, 1) */
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((g_rng >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

/* The same pool geometry as f32 (k, v) and as int8 (k8, v8, scales). */
typedef struct pools {
  kn_kv_layer f, q;
} pools;

static void pools_init(pools *p) {
  size_t n = (size_t)NBLK * NKV * BS * HD, rows = (size_t)NBLK * NKV * BS;
  p->f = (kn_kv_layer){.k = calloc(n, 4),
                       .v = calloc(n, 4),
                       .n_blocks = NBLK,
                       .block_size = BS,
                       .n_kv_heads = NKV,
                       .head_dim = HD};
  p->q = p->f;
  p->q.k = p->q.v = NULL;
  p->q.k8 = calloc(n, 1), p->q.v8 = calloc(n, 1);
  p->q.k_scale = calloc(rows, 4), p->q.v_scale = calloc(rows, 4);
}

static void pools_free(pools *p) {
  free(p->f.k), free(p->f.v), free(p->q.k8), free(p->q.v8), free(p->q.k_scale);
  free(p->q.v_scale);
}

/* Two sequences; sequence 0 has 13 positions, sequence 1 has 7, in shuffled blocks. */
static const int32_t k_tables[2 * MAXB] = {7, 2, 9, 0, 5, 3, 8, 1, 4, 6};

typedef struct step {
  int64_t n;
  int32_t seq[32], pos[32];
  float q[32 * NH * HD], k[32 * NKV * HD], v[32 * NKV * HD];
} step;

/* Token values depend on (seq, pos) only, so a token is the same in every step. */
static void step_add(step *s, int32_t seq, int32_t pos) {
  int64_t t = s->n++;
  s->seq[t] = seq, s->pos[t] = pos;
  g_rng = 0x1234567ull + (uint64_t)seq * 1000003u + (uint64_t)pos * 7919u;
  for (int i = 0; i < NH * HD; i++) s->q[t * NH * HD + i] = rnd();
  for (int i = 0; i < NKV * HD; i++) s->k[t * NKV * HD + i] = rnd() * (1.0f + (float)(i % 5));
  for (int i = 0; i < NKV * HD; i++) s->v[t * NKV * HD + i] = rnd() * 3.0f;
}

static float g_cos_sin[MAXPOS * HD]; /* (MAXPOS, HD / 2, 2) */

static void run(kn_pool *p, const step *s, const kn_kv_layer *kv, bool rope, float *out) {
  kn_attn_io io = {.q = s->q, .k = s->k, .v = s->v, .q_stride = NH * HD, .kv_stride = NKV * HD};
  if (rope) io.pos = s->pos, io.cos_sin = g_cos_sin, io.rot_dim = HD, io.neox = 1;
  kn_attn_batch b = {.n_tok = s->n,
                     .tok_seq = s->seq,
                     .tok_pos = s->pos,
                     .max_blocks_per_seq = MAXB,
                     .block_tables = k_tables};
  kn_attention_paged_io(p, out, &io, kv, &b, NH, 0.125f);
}

static float amax(const float *x, int n) {
  float m = 0;
  for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
  return m;
}

/* Bound on |out_int8 - out_f32| for token t, head h. Rounding to int8 moves each cached
 * element by at most scale / 2 = max|row| / 254. A key's error moves its score by at most
 * e_j = attn_scale * sum|q| * max|k_j| / 254; scores that all move by at most E change
 * each softmax weight by a factor within e^(+-2E), so the weighted sum moves by at most
 * (e^(2E) - 1) * max|v|; the values' own rounding adds at most max_j max|v_j| / 254. With
 * RoPE, rotating pairs can grow a row's max|.| and sum|.| by sqrt(2) each (factor 2 on E).
 * 1e-5 relative covers the f32 arithmetic of both paths. */
static double err_bound(const step *s, int64_t t, int64_t h, bool rope) {
  int64_t kvh = h / (NH / NKV);
  double q1 = 0, e = 0, vmax = 0;
  for (int i = 0; i < HD; i++) q1 += fabs(s->q[(t * NH + h) * HD + i]);
  for (int64_t u = 0; u < s->n; u++) {
    if (s->seq[u] != s->seq[t] || s->pos[u] > s->pos[t]) continue;
    double ka = amax(s->k + (u * NKV + kvh) * HD, HD);
    double va = amax(s->v + (u * NKV + kvh) * HD, HD);
    e = fmax(e, 0.125 * q1 * ka / 254.0 * (rope ? 2.0 : 1.0));
    vmax = fmax(vmax, va);
  }
  return (exp(2 * e) - 1) * vmax * (1 + 1 / 127.0) + vmax / 254.0 + 1e-5 * (1 + vmax);
}

/* Both sequences prefilled in one step (every position, so all positions are causal
 * context of the step's own writes). */
static void test_bound(kn_pool *p, bool rope) {
  static step s;
  memset(&s, 0, sizeof s);
  for (int32_t i = 0; i < 13; i++) step_add(&s, 0, i);
  for (int32_t i = 0; i < 7; i++) step_add(&s, 1, i);
  pools pl;
  pools_init(&pl);
  static float of[32 * NH * HD], oq[32 * NH * HD];
  run(p, &s, &pl.f, rope, of);
  run(p, &s, &pl.q, rope, oq);
  double worst = 0, worst_ratio = 0, any_diff = 0;
  int bad = 0;
  for (int64_t t = 0; t < s.n; t++)
    for (int64_t h = 0; h < NH; h++) {
      double bound = err_bound(&s, t, h, rope);
      for (int d = 0; d < HD; d++) {
        int64_t o = (t * NH + h) * HD + d;
        double err = fabs((double)oq[o] - of[o]);
        bad += !(err <= bound);
        worst = fmax(worst, err), any_diff = fmax(any_diff, err);
        worst_ratio = fmax(worst_ratio, err / bound);
      }
    }
  CHECKF(bad == 0, "rope %d: %d outputs outside the int8 bound (worst %g, %.2f of bound)", rope,
         bad, worst, worst_ratio);
  printf("int8 KV attention, rope %d: worst |int8 - f32| %.3g, %.3f of its bound\n", rope, worst,
         worst_ratio);
  CHECKF(any_diff > 0, "rope %d: int8 output equals f32 exactly: int8 path not taken?", rope);
  /* Every written scale is max|row| / 127 of what was written. */
  CHECK(pl.q.k_scale[((k_tables[0] * NKV + 1) * BS + 2)] > 0);
  CHECK(fabsf(pl.q.v_scale[(k_tables[0] * NKV + 1) * BS + 2] -
              amax(s.v + (2 * NKV + 1) * HD, HD) / 127.0f) < 1e-6f);
  pools_free(&pl);
}

/* Sequence 0's last token decoded alone and next to sequence 1's tokens in one step:
 * bit-identical output (the int8 write of a token depends on that token only). */
static void test_batch_invariance(kn_pool *p) {
  static step pre, solo, both;
  memset(&pre, 0, sizeof pre), memset(&solo, 0, sizeof solo), memset(&both, 0, sizeof both);
  for (int32_t i = 0; i < 9; i++) step_add(&pre, 0, i);
  for (int32_t i = 0; i < 4; i++) step_add(&pre, 1, i);
  step_add(&solo, 0, 9);
  step_add(&both, 1, 4), step_add(&both, 1, 5), step_add(&both, 0, 9), step_add(&both, 1, 6);
  pools a, b;
  pools_init(&a), pools_init(&b);
  static float o1[32 * NH * HD], o2[32 * NH * HD];
  run(p, &pre, &a.q, true, o1);
  run(p, &pre, &b.q, true, o2);
  run(p, &solo, &a.q, true, o1);
  run(p, &both, &b.q, true, o2);
  CHECK(!memcmp(o1, o2 + 2 * NH * HD, NH * HD * sizeof(float)));
  pools_free(&a), pools_free(&b);
}

static void *heap_alloc(void *ctx, size_t n) {
  (void)ctx;
  return calloc(1, n);
}

static void heap_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}

static void test_cache(void) {
  kv_cache kf, kq;
  ir_diag d = {0};
  CHECK(kv_cache_init(&kf, 3, NKV, HD, BS, 40, heap_alloc, NULL, &d) == IR_OK);
  CHECK(kv_cache_init_dtype(&kq, 3, NKV, HD, BS, 40, KV_INT8, heap_alloc, NULL, &d) == IR_OK);
  CHECK(kv_cache_bytes(&kf) == 40ull * 3 * 2 * NKV * HD * 4);
  CHECK(kv_cache_bytes(&kq) == 40ull * 3 * 2 * NKV * (HD + 4));
  CHECK(kq.k[1] == NULL && kq.k8[1] && kq.v_scale[2] && kf.k8[0] == NULL);
  /* A copy carries the values and the scales of every layer. */
  size_t blk = (size_t)NKV * BS * HD, rows = (size_t)NKV * BS;
  for (size_t i = 0; i < blk; i++) kq.v8[2][3 * blk + i] = (int8_t)(i % 251 - 125);
  for (size_t i = 0; i < rows; i++) kq.k_scale[2][3 * rows + i] = 0.5f + (float)i;
  int32_t b3 = 3, b7 = 7;
  kv_block_copy(&kq, b3, b7);
  CHECK(!memcmp(kq.v8[2] + 7 * blk, kq.v8[2] + 3 * blk, blk));
  CHECK(!memcmp(kq.k_scale[2] + 7 * rows, kq.k_scale[2] + 3 * rows, rows * sizeof(float)));
  CHECK(kq.k_scale[2][7 * rows + 1] == 1.5f);
  kv_cache_release(&kf, heap_free, NULL);
  kv_cache_release(&kq, heap_free, NULL);
  CHECK(kv_cache_init_dtype(&kq, 3, NKV, HD, BS, 40, (kv_dtype_id)7, heap_alloc, NULL, &d) ==
        IR_INVALID_ARG);
  irt_kv_dtype t = IRT_KV_DTYPE_F32;
  CHECK(irt_kv_dtype_parse("int8", &t) && t == IRT_KV_DTYPE_INT8);
  CHECK(irt_kv_dtype_parse("f32", &t) && t == IRT_KV_DTYPE_F32);
  CHECK(!irt_kv_dtype_parse("fp8", &t) && !irt_kv_dtype_parse(NULL, &t));
}

/* --- whole model ---------------------------------------------------------------------- */

static irt_model *open_model(const char *plan, irt_kv_dtype dt) {
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = 2;
  mo.kv_tokens = 64;
  mo.kv_dtype = dt;
  irt_model *m = NULL;
  irt_error err = {0};
  CHECKF(irt_model_open(plan, &mo, &m, &err) == IRT_OK, "%s", err.msg);
  return m;
}

/* Logits of prompt a's continuation decoded alone, and with prompt b in the same steps. */
static void decode_pair(irt_model *m, bool with_b, float *out, int64_t V) {
  static const int32_t pa[11] = {5, 17, 99, 3, 41, 250, 7, 7, 120, 64, 2};
  static const int32_t pb[6] = {9, 8, 7, 6, 5, 4};
  irt_seq *a = NULL, *b = NULL;
  irt_error err = {0};
  CHECK(irt_seq_create(m, &a, &err) == IRT_OK && irt_seq_create(m, &b, &err) == IRT_OK);
  float *lb = malloc((size_t)V * sizeof *lb);
  irt_batch_item it[2] = {{.seq = a, .tokens = pa, .n = 8, .logits = out},
                          {.seq = b, .tokens = pb, .n = 6, .logits = lb}};
  CHECK(irt_decode_batch(m, it, with_b ? 2 : 1, &err) == IRT_OK);
  for (int i = 8; i < 11; i++) { /* decode steps, b alongside again */
    it[0] = (irt_batch_item){.seq = a, .tokens = pa + i, .n = 1, .logits = out + (i - 7) * V};
    it[1] = (irt_batch_item){.seq = b, .tokens = pb + i - 8, .n = 1, .logits = lb};
    CHECKF(irt_decode_batch(m, it, with_b ? 2 : 1, &err) == IRT_OK, "%s", err.msg);
  }
  free(lb);
  irt_seq_destroy(a), irt_seq_destroy(b);
}

static void test_model(void) {
  const char *plan = TEST_TMP_DIR "/kv-int8.plan";
  infc_options o = infc_options_default();
  o.model.max_tokens = 32, o.model.max_seqs = 4, o.model.max_logits = 4;
  o.model.kv_block_size = 4;
  ir_diag d = {0};
  CHECKF(infc_build(FIXTURES_DIR "/llama-gqa-f32", &o, plan, NULL, NULL, &d) == IR_OK, "%s", d.msg);
  irt_model *mq = open_model(plan, IRT_KV_DTYPE_INT8), *mf = open_model(plan, IRT_KV_DTYPE_F32);
  if (!mq || !mf) goto done;
  const irt_model_info *iq = irt_model_get_info(mq), *inf = irt_model_get_info(mf);
  CHECK(!strcmp(iq->kv_dtype, "int8") && !strcmp(inf->kv_dtype, "f32"));
  CHECK(iq->kv_tokens == 64 && iq->kv_bytes < inf->kv_bytes / 3);
  CHECK(irt_model_kv_token_bytes(mq, IRT_KV_DTYPE_INT8) * 64 == iq->kv_bytes);
  int64_t V = iq->vocab_size;
  float *solo = malloc((size_t)(4 * V) * sizeof *solo), *batch = malloc((size_t)(4 * V) * 4);
  float *ref = malloc((size_t)(4 * V) * sizeof *ref);
  decode_pair(mq, false, solo, V);
  decode_pair(mq, true, batch, V);
  decode_pair(mf, false, ref, V);
  CHECK(!memcmp(solo, batch, (size_t)(4 * V) * sizeof *solo));
  double diff = 0;
  for (int64_t i = 0; i < 4 * V; i++) diff = fmax(diff, fabs((double)solo[i] - ref[i]));
  printf("int8 vs f32 KV logits: max |diff| %.3g\n", diff);
  CHECKF(diff > 0 && diff < 0.5, "int8 vs f32 KV logits: max |diff| %g", diff);
  free(solo), free(batch), free(ref);
done:
  irt_model_close(mq), irt_model_close(mf);
}

int main(void) {
  for (int i = 0; i < MAXPOS; i++)
    for (int j = 0; j < HD / 2; j++) {
      double th = i * pow(10000.0, -2.0 * j / HD);
      g_cos_sin[(i * HD / 2 + j) * 2] = (float)cos(th);
      g_cos_sin[(i * HD / 2 + j) * 2 + 1] = (float)sin(th);
    }
  kn_pool *p = kn_pool_create(2);
  test_bound(p, false);
  test_bound(p, true);
  test_batch_invariance(p);
  kn_pool_destroy(p);
  test_cache();
  test_model();
  return tcheck_done("kv_int8");
}
