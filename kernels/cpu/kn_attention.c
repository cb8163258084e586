/* kn_attention: causal attention over a paged KV cache, with grouped-query heads.
 * Each (token, head) is one online-softmax pass, so its result never depends on the
 * other tokens of the step. */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kn_bf16.h"
#include "kn_cpu.h"
#include "kn_transpose.h"
#include "kn_vexp.h"
#include "ir_alloc.h"

/* The accumulator lives on the stack in slices of this many dims; wider heads take one
 * pass per slice (recomputing the scores) rather than allocating. */
enum { KN_ATTN_DSLICE = 256, KN_ATTN_LANES = 16, KN_ATTN_MIN_WORK = 32768 };

/* Queries (token, head pairs) attended together over one read of the cache (see
 * attn_group_slice). */
enum { KN_ATTN_GROUP = 16 };

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define KN_ATTN_X86 1
#include <immintrin.h>
#else
#define KN_ATTN_X86 0
#endif

/* An f16 / int8 cache's rows of the sequences a prefill reads in queries-in-lanes groups,
 * widened to f32 once a call (attn_wide_make): each group had widened every chunk it read,
 * so a chunk as many times as the groups after it. Sequence s, kv head h, position j at
 * row base[s] + h * ctx[s] + j of k and v (hd floats a row); ctx[s] 0: not widened. */
typedef struct attn_wide {
  float *k, *v;
  uint16_t *kb; /* bf16 order (io->bf16): K rows as bf16 and V as slot pairs (attn_qlb_group), */
  uint32_t *vp; /* each head's rows attn_wide_stride(ctx[s]) apart, k and v NULL */
  int64_t *base, *ctx;
  int64_t n_seq;
} attn_wide;

/* Rows between the kv heads of a sequence in bf16 wide rows: even, so slot pairs align
 * (the tile order's: whole chunks, each chunk's V transposed by pairs in its place). */
static int64_t attn_wide_stride(int64_t ctx) { return (ctx + 1) / 2 * 2; }
static int64_t attn_wide_stride16(int64_t ctx) { return (ctx + 15) / 16 * 16; }

typedef struct attn_args {
  float *out;
  const kn_attn_io *io;
  const kn_kv_layer *kv;
  const kn_attn_batch *b;
  int64_t n_heads;
  float scale;
  const int32_t *groups; /* token groups (attn_plan_groups), or NULL: one token each */
  int64_t head_splits;   /* sub-groups a kv head's query heads are split into */
  const attn_wide *wide; /* or NULL */
  bool bf16;             /* io->bf16: the bf16 order */
  bool tile;             /* ... in the tile order (kn_matmul_x16_order) */
} attn_args;

/* Offset of (physical block, kv head, slot) in a (n_blocks, n_kv_heads, block_size,
 * head_dim) cache. */
static int64_t attn_cache_off(const kn_kv_layer *kv, int64_t blk, int64_t kvh, int64_t slot) {
  return ((blk * kv->n_kv_heads + kvh) * kv->block_size + slot) * kv->head_dim;
}

static int64_t attn_block(const kn_attn_batch *b, int64_t seq, int64_t logical) {
  return b->block_tables[seq * b->max_blocks_per_seq + logical];
}

/* int8 cache, symmetric: scale = max|x| / 127, q = round(x / scale); the scale is
 * returned. */
static float attn_quant_row(int8_t *restrict q, const float *restrict x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
  float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t i = 0; i < n; i++) {
    float r = x[i] * inv;
    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
    q[i] = (int8_t)lrintf(r);
  }
  return amax / 127.0f;
}

#if KN_ATTN_X86
/* ir_f32_to_f16 on 16 lanes: vcvtps2ph rounding to nearest even (the same rounding,
 * overflow to infinity and subnormals), NaN made ir_f32_to_f16's quiet NaN (the sign
 * kept; the instruction would keep payload bits). */
static __attribute__((target("avx512f"))) void attn_to_f16_avx512(uint16_t *dst, const float *x,
                                                                  int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (nan) {
      uint16_t t[16];
      _mm256_storeu_si256((__m256i *)t, h);
      for (int l = 0; l < 16; l++)
        if (nan >> l & 1) t[l] = ir_f32_to_f16(x[i + l]);
      h = _mm256_loadu_si256((const __m256i *)t);
    }
    _mm256_storeu_si256((__m256i *)(dst + i), h);
  }
  for (; i < n; i++) dst[i] = ir_f32_to_f16(x[i]);
}
#endif

/* dst[i] = ir_f32_to_f16(x[i]), i < n. */
static void attn_to_f16(uint16_t *dst, const float *x, int64_t n) {
#if KN_ATTN_X86
  if (kn_cpu_isa() >= 2) {
    attn_to_f16_avx512(dst, x, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; i++) dst[i] = ir_f32_to_f16(x[i]);
}

/* Stores one (position, kv head) row of k (already roped) and v at cache offset dst in
 * the cache's dtype: f32 as is, f16 rounded to nearest, int8 with a scale per row. */
static void attn_store_row(const kn_kv_layer *kv, int64_t dst, const float *k, const float *v) {
  int64_t hd = kv->head_dim;
  if (kv->k8) {
    kv->k_scale[dst / hd] = attn_quant_row(kv->k8 + dst, k, hd);
    kv->v_scale[dst / hd] = attn_quant_row(kv->v8 + dst, v, hd);
  } else if (kv->k16) {
    attn_to_f16(kv->k16 + dst, k, hd);
    attn_to_f16(kv->v16 + dst, v, hd);
  } else {
    memcpy(kv->k + dst, k, (size_t)hd * sizeof *k);
    memcpy(kv->v + dst, v, (size_t)hd * sizeof *v);
  }
}

/* A q or k head as attention uses it: x itself, or normalized (kn_rms_norm_row) and/or
 * roped (kn_rope's operations) into buf. */
static const float *attn_head_in(float *buf, const float *x, const float *norm,
                                 const kn_attn_io *io, int64_t t, int64_t hd) {
  if (!norm && !io->cos_sin) return x;
  if (norm) kn_rms_norm_row(buf, x, norm, hd, io->qk_eps);
  else memcpy(buf, x, (size_t)hd * sizeof *buf);
  if (io->cos_sin)
    kn_rope_head(buf, io->cos_sin + (int64_t)io->pos[t] * io->rot_dim, io->rot_dim, io->neox);
  return buf;
}

/* k is normalized and/or roped (attn_head_in) into a copy, then stored. */
static void attn_write_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const attn_args *a = arg;
  const kn_kv_layer *kv = a->kv;
  const kn_attn_io *io = a->io;
  int64_t hd = kv->head_dim;
  float kr[KN_ATTN_DSLICE]; /* head_dim <= 256 (the IR checks it) */
  for (int64_t t = begin; t < end; t++) {
    int64_t pos = a->b->tok_pos[t];
    int64_t blk = attn_block(a->b, a->b->tok_seq[t], pos / kv->block_size);
    for (int64_t h = 0; h < kv->n_kv_heads; h++) {
      int64_t src = t * io->kv_stride + h * hd;
      const float *k = attn_head_in(kr, io->k + src, io->k_norm, io, t, hd);
      attn_store_row(kv, attn_cache_off(kv, blk, h, pos % kv->block_size), k, io->v + src);
    }
  }
}

/* --- reading the cache -------------------------------------------------------------------
 * Each (token, head) is one online-softmax pass over its positions in order, up to
 * KN_ATTN_CHUNK positions (never across a cache block) at a time: the chunk's scores, one
 * rescale of the running state when the chunk raises the max, the chunk's weights, then
 * its values added in position order. Every step runs in a fixed order that depends only
 * on the token's context length and the block size, so a result never depends on the
 * rest of the batch or on the thread count:
 *  - score = dot(q, k) * k_scale (int8 cache) * scale, the dot summed in 16 lanes strided
 *    over d, folded (l, l+8), (l, l+4), (l, l+2), (0, 1), then the head_dim % 16 tail;
 *  - weights by attn_exp below;
 *  - acc[d] = p * v[d] + acc[d] for each position in order (p times v_scale for int8).
 * The AVX-512 kernels fuse every multiply-add; the portable ones fuse where the target
 * has a native fma (FP_FAST_FMAF), so the two give the same bits on such targets. */
enum { KN_ATTN_CHUNK = 16 };

#ifdef FP_FAST_FMAF
#define ATTN_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define ATTN_MADD(a, b, c) ((a) * (b) + (c))
#endif

/* exp(x) for the softmax, where x <= 0: kn_vexp (kn_vexp.h). */
static float attn_exp(float x) { return kn_vexp(x); }

/* The n (<= KN_ATTN_CHUNK) consecutive cache rows of one (block, kv head) a chunk reads. */
typedef struct attn_rows {
  const float *k, *v;        /* f32 cache rows, or NULL */
  const uint16_t *k16, *v16; /* f16 cache rows, or NULL */
  const int8_t *k8, *v8;     /* int8 cache rows */
  const float *ks;           /* int8: the k scale of each row */
  int64_t hd;
  int n;
  int odd; /* row 0 is an odd slot of its chunk (the bf16 order pairs slots) */
} attn_rows;

/* Online-softmax state for one (token, head) and one slice of value dims. */
typedef struct attn_state {
  float max;
  float sum;
  float acc[KN_ATTN_DSLICE];
} attn_state;

typedef struct attn_query {
  const float *q;
  int64_t lo, n_pos; /* the positions it attends: [lo, n_pos) */
  float *out;
} attn_query;

/* The rows [*off, *n) of the chunk at slot s0 of the block at position j0 that query q
 * reads (none: both 0): its slots of the block, then of the chunk, as when it is alone; a
 * sliding window skips the rows before its first position. */
static void attn_query_rows(const attn_query *q, int64_t j0, int64_t bs, int64_t s0, int *n,
                            int *off) {
  int64_t q_slot = q->n_pos - j0 < bs ? q->n_pos - j0 : bs;
  *n = q_slot <= s0 ? 0 : (int)(q_slot - s0 < KN_ATTN_CHUNK ? q_slot - s0 : KN_ATTN_CHUNK);
  int64_t skip = q->lo - (j0 + s0);
  *off = skip <= 0 ? 0 : skip >= *n ? *n : (int)skip;
  if (*off == *n) *n = *off = 0;
}

/* The kernels of one instruction set. */
typedef struct attn_kernels attn_kernels;
struct attn_kernels {
  /* s[j] = score of row j, j < r->n */
  void (*scores)(const float *q, const attn_rows *r, float scale, float *s);
  /* x[j] = attn_exp(x[j]), j < n */
  void (*exp)(float *x, int n);
  /* acc[d] += p[j] * v_j[d0 + d], d < dn, for j < r->n in order */
  void (*accum)(float *acc, const float *p, const attn_rows *r, int64_t d0, int64_t dn);
  /* k[j * hd + d], v[j * hd + d] = the rows of an f16 or int8 chunk as f32 (exact) */
  void (*widen)(const attn_rows *r, float *k, float *v);
  /* a full chunk folded into st[i] for queries q[i], i < nq <= KN_ATTN_MQ, at once
   * (head_dim a multiple of 16), or NULL */
  void (*chunk16)(attn_state *const *st, const float *const *q, int nq, const attn_rows *r,
                  const float *v_scale, float scale, int64_t d0, int64_t dn);
  /* a whole group of nq (KN_ATTN_QL_MIN .. 16) queries of kv head kvh over positions
   * [min_lo, max_pos) of sequence seq, outputs written (attn_ql_group), or NULL */
  void (*qgroup)(const attn_args *a, const attn_kernels *kk, const attn_query *qs, int64_t nq,
                 int64_t kvh, int64_t seq, int64_t min_lo, int64_t max_pos);
  /* qgroup takes any number of queries (not KN_ATTN_QL_MIN or more only) */
  bool qgroup_any;
};

static void attn_rest(const attn_args *a, const attn_kernels *kk, attn_state *st,
                      const attn_query *qs, int64_t nq, int64_t kvh, int64_t seq, int64_t from,
                      int64_t max_pos, int64_t d0, int64_t dn);

static float attn_kval(const attn_rows *r, int64_t j, int64_t d) {
  if (r->k) return r->k[j * r->hd + d];
  if (r->k16) return ir_f16_to_f32(r->k16[j * r->hd + d]);
  return (float)r->k8[j * r->hd + d];
}

/* Row j of K (or V) as f32: the f32 cache in place, others widened into buf. */
static const float *attn_row_f32(const float *f, const uint16_t *h, const int8_t *q, int64_t off,
                                 int64_t n, float *buf) {
  if (f) return f + off;
  for (int64_t i = 0; i < n; i++) buf[i] = h ? ir_f16_to_f32(h[off + i]) : (float)q[off + i];
  return buf;
}

static void attn_scores_c(const float *q, const attn_rows *r, float scale, float *s) {
  int64_t hd = r->hd;
  float buf[KN_ATTN_DSLICE]; /* head_dim <= 256 */
  for (int j = 0; j < r->n; j++) {
    const float *k = attn_row_f32(r->k, r->k16, r->k8, j * hd, hd, buf);
    float acc[KN_ATTN_LANES] = {0};
    int64_t i = 0;
    for (; i + KN_ATTN_LANES <= hd; i += KN_ATTN_LANES)
      for (int l = 0; l < KN_ATTN_LANES; l++) acc[l] = ATTN_MADD(q[i + l], k[i + l], acc[l]);
    for (int w = KN_ATTN_LANES / 2; w > 0; w /= 2)
      for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    float d = acc[0];
    for (; i < hd; i++) d = ATTN_MADD(q[i], k[i], d);
    s[j] = (r->ks ? d * r->ks[j] : d) * scale;
  }
}

static void attn_exp_c(float *x, int n) {
  for (int j = 0; j < n; j++) x[j] = attn_exp(x[j]);
}

static void attn_accum_c(float *acc, const float *p, const attn_rows *r, int64_t d0, int64_t dn) {
  float buf[KN_ATTN_DSLICE];
  for (int j = 0; j < r->n; j++) {
    const float *v = attn_row_f32(r->v, r->v16, r->v8, j * r->hd + d0, dn, buf);
    for (int64_t d = 0; d < dn; d++) acc[d] = ATTN_MADD(p[j], v[d], acc[d]);
  }
}

/* Values [i0, n * hd) of the chunk widened one by one (the SIMD sets' tail too). */
static void attn_widen_from(const attn_rows *r, int64_t i0, float *k, float *v) {
  for (int64_t i = i0; i < r->n * r->hd; i++) {
    k[i] = r->k16 ? ir_f16_to_f32(r->k16[i]) : (float)r->k8[i];
    v[i] = r->v16 ? ir_f16_to_f32(r->v16[i]) : (float)r->v8[i];
  }
}

static void attn_widen_c(const attn_rows *r, float *k, float *v) { attn_widen_from(r, 0, k, v); }

static const attn_kernels k_attn_c = {attn_scores_c, attn_exp_c, attn_accum_c, attn_widen_c,
                                      NULL,          NULL,       false};

/* --- bf16 attention (io->bf16: plans whose matmuls take bf16 activations) ---------------
 * The f32 order with bf16 values in its products, vdpbf16ps's steps (kn_bf16.h): q, k and
 * v rounded to bf16 as vcvtneps2bf16 rounds (an int8 cache's values are exact), each
 * product added by one fma whose result is flushed to zero when subnormal:
 *  - score: 16 lanes, lane l taking the pairs p = l mod 16 of dims (2p, 2p+1) (zero past
 *    head_dim): acc = fma(q[2p+1], k[2p+1], acc), then fma(q[2p], k[2p], acc); then the
 *    fold (l, l+8), (l, l+4), (l, l+2), (0, 1), k_scale and scale as in f32, unflushed;
 *  - max, rescale, weights and sums as in f32; a weight (times v_scale for int8) is
 *    rounded to bf16 for p . v;
 *  - p . v: a chunk's slots in pairs (2m, 2m+1) in order, the odd slot first, a slot the
 *    query does not read skipped: acc[d] = fma(p_j, v_j[d], acc[d]), flushed.
 * The portable path takes these steps with kn_fma_ftz, AVX-512 with fmas under MXCSR's DAZ
 * and FTZ, a prefill's queries-in-lanes groups on vdpbf16ps where the CPU has it (the
 * pairs all its queries read whole) and masked fmas under DAZ and FTZ (the others), so
 * every path gives the same bits (test_kernels). */
enum { KN_ATTN_BF16_PAIRS = 16 }; /* pairs of dims a lane step of the scores */

/* Pairs of dims the scores step over: head_dim padded to 32. */
static int64_t attn_bf16_pairs(int64_t hd) {
  return (hd + 2 * KN_ATTN_BF16_PAIRS - 1) / (2 * KN_ATTN_BF16_PAIRS) * KN_ATTN_BF16_PAIRS;
}

/* The rows of r in the order p . v adds them: slot pairs, the odd slot first. */
static int attn_pair_order(const attn_rows *r, int *ord) {
  int n = 0, o = r->odd;
  for (int b = 0; b < r->n + o; b += 2) { /* slots b, b + 1 of the chunk: rows b - o, b + 1 - o */
    if (b + 1 - o < r->n) ord[n++] = b + 1 - o;
    if (b - o >= 0) ord[n++] = b - o;
  }
  return n;
}

static void attn_scores_bf16_c(const float *q, const attn_rows *r, float scale, float *s) {
  const int64_t hd = r->hd, np = attn_bf16_pairs(hd);
  float qb[KN_ATTN_DSLICE], kb[KN_ATTN_DSLICE], buf[KN_ATTN_DSLICE]; /* head_dim <= 256 */
  for (int64_t i = 0; i < 2 * np; i++) qb[i] = i < hd ? kn_bf16_value(q[i]) : 0.0f;
  for (int j = 0; j < r->n; j++) {
    const float *k = attn_row_f32(r->k, r->k16, r->k8, j * hd, hd, buf);
    for (int64_t i = 0; i < 2 * np; i++) kb[i] = i < hd ? kn_bf16_value(k[i]) : 0.0f;
    float acc[KN_ATTN_LANES] = {0};
    for (int64_t p = 0; p < np; p++) {
      float *a = &acc[p % KN_ATTN_LANES];
      *a = kn_fma_ftz(qb[2 * p + 1], kb[2 * p + 1], *a);
      *a = kn_fma_ftz(qb[2 * p], kb[2 * p], *a);
    }
    for (int w = KN_ATTN_LANES / 2; w > 0; w /= 2)
      for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    s[j] = (r->ks ? acc[0] * r->ks[j] : acc[0]) * scale;
  }
}

static void attn_accum_bf16_c(float *acc, const float *p, const attn_rows *r, int64_t d0,
                              int64_t dn) {
  float buf[KN_ATTN_DSLICE];
  int ord[KN_ATTN_CHUNK], no = attn_pair_order(r, ord);
  for (int o = 0; o < no; o++) {
    int j = ord[o];
    const float *v = attn_row_f32(r->v, r->v16, r->v8, j * r->hd + d0, dn, buf);
    float pj = kn_bf16_value(p[j]);
    for (int64_t d = 0; d < dn; d++) acc[d] = kn_fma_ftz(pj, kn_bf16_value(v[d]), acc[d]);
  }
}

static const attn_kernels k_attn_bf16_c = {
    attn_scores_bf16_c, attn_exp_c, attn_accum_bf16_c, attn_widen_c, NULL, NULL, false};

/* --- bf16 attention in the tile order (a CPU whose bf16 order is AMX-BF16's) -------------
 * Where the bf16 matmuls sum in the tile order (kn_matmul_x16_order), bf16 attention does
 * too, every step of the bf16 order above but the two dot products, which take the steps
 * of tdpbf16ps (two chains a block, then their sum; kn_matmul.c):
 *  - score: dims in blocks of 32 (zero past head_dim, those products taken too), per block
 *    an even chain (dims 2p) and an odd chain (dims 2p+1) of fmas from +0, then acc = acc +
 *    (even + odd) from acc +0; k_scale and scale as in f32;
 *  - p . v, a chunk at a time after its rescale: an even chain over the chunk's even slots
 *    and an odd chain over its odd slots, in slot order, from +0, a slot the query does not
 *    read skipped; then acc[d] = acc[d] + (+0 + (even + odd)).
 * Every add flushed to zero when subnormal (a subnormal acc read as zero), as the fmas. The
 * +0 makes the chunk's sum +0 whenever it is zero, so a slot the query does not read may
 * as well enter as a zero weight times a finite v: the chains then differ at most in the
 * sign of a zero, which the +0 erases. So a group of queries runs on AMX whole, the
 * weights of the slots a query skips zero (the instruction's own steps: its tile starts
 * at +0); every path gives the same bits (test_kernels). */
static void attn_scores_bt_c(const float *q, const attn_rows *r, float scale, float *s) {
  const int64_t hd = r->hd, nd = 2 * attn_bf16_pairs(hd);
  float qb[KN_ATTN_DSLICE], kb[KN_ATTN_DSLICE], buf[KN_ATTN_DSLICE]; /* head_dim <= 256 */
  for (int64_t i = 0; i < nd; i++) qb[i] = i < hd ? kn_bf16_value(q[i]) : 0.0f;
  for (int j = 0; j < r->n; j++) {
    const float *k = attn_row_f32(r->k, r->k16, r->k8, j * hd, hd, buf);
    for (int64_t i = 0; i < nd; i++) kb[i] = i < hd ? kn_bf16_value(k[i]) : 0.0f;
    float acc = 0.0f;
    for (int64_t b = 0; b < nd; b += 2 * KN_ATTN_BF16_PAIRS) {
      float e = 0.0f, o = 0.0f;
      for (int64_t i = b; i < b + 2 * KN_ATTN_BF16_PAIRS; i += 2) {
        e = kn_fma_ftz(qb[i], kb[i], e);
        o = kn_fma_ftz(qb[i + 1], kb[i + 1], o);
      }
      acc = kn_ftz(acc + kn_ftz(e + o));
    }
    s[j] = (r->ks ? acc * r->ks[j] : acc) * scale;
  }
}

static void attn_accum_bt_c(float *acc, const float *p, const attn_rows *r, int64_t d0,
                            int64_t dn) {
  float buf[KN_ATTN_DSLICE], e[KN_ATTN_DSLICE] = {0}, o[KN_ATTN_DSLICE] = {0};
  for (int j = 0; j < r->n; j++) {
    const float *v = attn_row_f32(r->v, r->v16, r->v8, j * r->hd + d0, dn, buf);
    float pj = kn_bf16_value(p[j]), *c = (j + r->odd) & 1 ? o : e;
    for (int64_t d = 0; d < dn; d++) c[d] = kn_fma_ftz(pj, kn_bf16_value(v[d]), c[d]);
  }
  /* (acc may be subnormal after an unflushed rescale: the add reads it as zero) */
  for (int64_t d = 0; d < dn; d++) acc[d] = kn_ftz(kn_ftz(acc[d]) + (0.0f + kn_ftz(e[d] + o[d])));
}

static const attn_kernels k_attn_bt_c = {
    attn_scores_bt_c, attn_exp_c, attn_accum_bt_c, attn_widen_c, NULL, NULL, false};

#if KN_ATTN_X86
#define ATTN_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ATTN_AVX2_INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* (l, l+4), (l, l+2), (0, 1): the fold of 8 lanes (the AVX2 order, and the last steps of
 * the AVX-512 one). */
ATTN_AVX2_INLINE float attn_fold8(__m256 h) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
  return _mm_cvtss_f32(a);
}

#define ATTN_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define ATTN_AVX512_INLINE                                                                         \
  static inline __attribute__((target("avx512f,avx2,fma,f16c"), always_inline))

/* 16 values of a cache row from off on as f32, the cache type known at compile time. */
enum { ATTN_KIND_F32, ATTN_KIND_F16, ATTN_KIND_I8 };

ATTN_AVX512_INLINE __m512 attn_ld16(int kind, const float *f, const uint16_t *h, const int8_t *b,
                                    int64_t off) {
  if (kind == ATTN_KIND_F32) return _mm512_loadu_ps(f + off);
  if (kind == ATTN_KIND_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + off)));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + off))));
}

ATTN_AVX512_INLINE int attn_kind(const float *f, const uint16_t *h) {
  return f ? ATTN_KIND_F32 : h ? ATTN_KIND_F16 : ATTN_KIND_I8;
}

ATTN_AVX512_INLINE __m512 attn_k16(const attn_rows *r, int64_t j, int64_t i) {
  return attn_ld16(attn_kind(r->k, r->k16), r->k, r->k16, r->k8, j * r->hd + i);
}

/* (l, l+8), (l, l+4), (l, l+2), (0, 1): the fold of the order. */
ATTN_AVX512_INLINE float attn_fold16(__m512 v) {
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return attn_fold8(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}

/* The 16-lane dot products of rows j .. j+3 with q over the first `full` dims: four
 * independent fma chains, q loaded once for the four. */
ATTN_AVX512_INLINE void attn_dot4_avx512(const float *q, const attn_rows *r, int j, int64_t full,
                                         __m512 *a) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < full; i += KN_ATTN_LANES) {
    __m512 qv = _mm512_loadu_ps(q + i);
    a0 = _mm512_fmadd_ps(qv, attn_k16(r, j, i), a0);
    a1 = _mm512_fmadd_ps(qv, attn_k16(r, j + 1, i), a1);
    a2 = _mm512_fmadd_ps(qv, attn_k16(r, j + 2, i), a2);
    a3 = _mm512_fmadd_ps(qv, attn_k16(r, j + 3, i), a3);
  }
  a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
}

/* A full chunk (16 rows, head_dim a multiple of 16): the 16 dot products side by side
 * (sixteen fma chains), then the sixteen folds together by transposition:
 * every step adds the same pairs as attn_fold16 does for one row, (l, l+8), (l, l+4),
 * (l, l+2), (0, 1), two or four rows a register, and a last permute puts row j in lane
 * j: 46 instructions for the 16 rows where one row at a time takes 8 each. */
/* Its first two steps, for rows 4g .. 4g+3 (a[0..3]). */
ATTN_AVX512_INLINE __m512 attn_fold4rows(const __m512 *a) {
  __m512 p0 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_f32x4(a[0], a[1], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 p1 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_f32x4(a[2], a[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(p0, p1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(p0, p1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The last steps from t[0..3] (rows 4j .. 4j+3 each): row j in lane j. */
ATTN_AVX512_INLINE __m512 attn_fold_rows(const __m512 *t) {
  __m512 u[2];
  for (int j = 0; j < 2; j++) /* lane c: rows 8j + c, 8j + 4 + c: l and l+2 */
    u[j] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), w);
}

static ATTN_AVX512 void attn_scores_avx512(const float *q, const attn_rows *r, float scale,
                                           float *s) {
  /* (a full chunk with head_dim a multiple of 16 goes to chunk16 instead) */
  int64_t hd = r->hd, full = hd / KN_ATTN_LANES * KN_ATTN_LANES;
  int j = 0;
  for (; j + 4 <= r->n; j += 4) {
    __m512 a[4];
    attn_dot4_avx512(q, r, j, full, a);
    s[j] = attn_fold16(a[0]), s[j + 1] = attn_fold16(a[1]);
    s[j + 2] = attn_fold16(a[2]), s[j + 3] = attn_fold16(a[3]);
  }
  for (; j < r->n; j++) {
    __m512 a0 = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += KN_ATTN_LANES)
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), attn_k16(r, j, i), a0);
    s[j] = attn_fold16(a0);
  }
  for (j = 0; j < r->n; j++) {
    float d = s[j];
    for (int64_t i = full; i < hd; i++) d = fmaf(q[i], attn_kval(r, j, i), d);
    s[j] = (r->ks ? d * r->ks[j] : d) * scale;
  }
}

/* 16 values of a V row from off on, of which the first nv (<= 16) are real. */
ATTN_AVX512_INLINE __m512 attn_v16(const attn_rows *r, int64_t off, int64_t nv) {
  __mmask16 m = nv >= KN_ATTN_LANES ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1u);
  if (r->v) return _mm512_maskz_loadu_ps(m, r->v + off);
  if (nv >= KN_ATTN_LANES) return attn_ld16(attn_kind(NULL, r->v16), NULL, r->v16, r->v8, off);
  if (r->v16) {
    uint16_t h[KN_ATTN_LANES] = {0};
    memcpy(h, r->v16 + off, (size_t)nv * sizeof *h);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
  }
  int8_t b[KN_ATTN_LANES] = {0};
  memcpy(b, r->v8 + off, (size_t)nv);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b)));
}

/* Up to 64 dims at a time in four accumulators, rows in order inside: four independent
 * fma chains instead of one per 16 dims (each chain is still row after row). */
static ATTN_AVX512 void attn_accum_avx512(float *acc, const float *p, const attn_rows *r,
                                          int64_t d0, int64_t dn) {
  enum { U = 4 };
  int64_t d = 0;
  for (; d + U * KN_ATTN_LANES <= dn; d += U * KN_ATTN_LANES) { /* in registers */
    float *o = acc + d;
    __m512 a0 = _mm512_loadu_ps(o), a1 = _mm512_loadu_ps(o + 16);
    __m512 a2 = _mm512_loadu_ps(o + 32), a3 = _mm512_loadu_ps(o + 48);
    for (int j = 0; j < r->n; j++) {
      __m512 pj = _mm512_set1_ps(p[j]);
      int64_t off = j * r->hd + d0 + d;
      a0 = _mm512_fmadd_ps(pj, attn_v16(r, off, 16), a0);
      a1 = _mm512_fmadd_ps(pj, attn_v16(r, off + 16, 16), a1);
      a2 = _mm512_fmadd_ps(pj, attn_v16(r, off + 32, 16), a2);
      a3 = _mm512_fmadd_ps(pj, attn_v16(r, off + 48, 16), a3);
    }
    _mm512_storeu_ps(o, a0), _mm512_storeu_ps(o + 16, a1);
    _mm512_storeu_ps(o + 32, a2), _mm512_storeu_ps(o + 48, a3);
  }
  for (; d < dn; d += U * KN_ATTN_LANES) { /* the last dims: masked */
    __m512 a[U];
    int64_t left = dn - d, nu = (left + KN_ATTN_LANES - 1) / KN_ATTN_LANES;
    if (nu > U) nu = U;
    for (int u = 0; u < nu; u++) {
      int64_t nv = left - u * KN_ATTN_LANES;
      __mmask16 m = nv >= KN_ATTN_LANES ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1u);
      a[u] = _mm512_maskz_loadu_ps(m, acc + d + u * KN_ATTN_LANES);
    }
    for (int j = 0; j < r->n; j++) {
      __m512 pj = _mm512_set1_ps(p[j]);
      int64_t off = j * r->hd + d0 + d;
      for (int u = 0; u < nu; u++)
        a[u] = _mm512_fmadd_ps(pj, attn_v16(r, off + u * KN_ATTN_LANES, left - u * KN_ATTN_LANES),
                               a[u]);
    }
    for (int u = 0; u < nu; u++) {
      int64_t nv = left - u * KN_ATTN_LANES;
      __mmask16 m = nv >= KN_ATTN_LANES ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1u);
      _mm512_mask_storeu_ps(acc + d + u * KN_ATTN_LANES, m, a[u]);
    }
  }
}

/* AVX2 + FMA: lanes 0-7 of the order in one ymm, 8-15 in another; lo + hi is the first
 * fold, so these give the AVX-512 kernels' bits. */

/* 8 values of a cache row from off on as f32, the cache type known at compile time. */
ATTN_AVX2_INLINE __m256 attn_ld8(int kind, const float *f, const uint16_t *h, const int8_t *b,
                                 int64_t off) {
  if (kind == ATTN_KIND_F32) return _mm256_loadu_ps(f + off);
  if (kind == ATTN_KIND_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + off)));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + off))));
}

/* The same, the cache type that of the row pointer that is set (all 8 values are real). */
ATTN_AVX2_INLINE __m256 attn_row8(const float *f, const uint16_t *h, const int8_t *q, int64_t off) {
  return attn_ld8(f ? ATTN_KIND_F32 : h ? ATTN_KIND_F16 : ATTN_KIND_I8, f, h, q, off);
}

/* One row's 16-lane dot product, folded as attn_fold8(lo + hi) (+ the tail, scaled). */
ATTN_AVX2_INLINE float attn_score_tail(const float *q, const attn_rows *r, int j, float d,
                                       float scale) {
  for (int64_t i = r->hd / KN_ATTN_LANES * KN_ATTN_LANES; i < r->hd; i++)
    d = fmaf(q[i], attn_kval(r, j, i), d);
  return (r->ks ? d * r->ks[j] : d) * scale;
}

/* attn_fold8 of four rows' lo + hi side by side, on the same pairs: (l, l+4) across the
 * two 128-bit halves, then (l, l+2), then (0, 1); f[c] is row c's. */
ATTN_AVX2_INLINE void attn_fold4_avx2(__m256 v0, __m256 v1, __m256 v2, __m256 v3, float *f) {
  /* (l, l+4): [v0 | v1] and [v2 | v3], four lanes each */
  __m256 t01 =
      _mm256_add_ps(_mm256_permute2f128_ps(v0, v1, 0x20), _mm256_permute2f128_ps(v0, v1, 0x31));
  __m256 t23 =
      _mm256_add_ps(_mm256_permute2f128_ps(v2, v3, 0x20), _mm256_permute2f128_ps(v2, v3, 0x31));
  /* (l, l+2): [v0 v0 v2 v2 | v1 v1 v3 v3] */
  __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 2, 3, 2)));
  /* (0, 1): [v0 v2 . . | v1 v3 . .] */
  __m256 w = _mm256_add_ps(_mm256_shuffle_ps(u, u, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm256_shuffle_ps(u, u, _MM_SHUFFLE(3, 1, 3, 1)));
  float g[8];
  _mm256_storeu_ps(g, w);
  f[0] = g[0], f[1] = g[4], f[2] = g[1], f[3] = g[5];
}

/* Four rows at a time (eight independent fma chains, q loaded once), folded together by
 * attn_fold4_avx2. */
static ATTN_AVX2 void attn_scores_avx2(const float *q, const attn_rows *r, float scale, float *s) {
  int64_t hd = r->hd, full = hd / KN_ATTN_LANES * KN_ATTN_LANES;
  int j = 0;
  for (; j + 4 <= r->n; j += 4) {
    __m256 l0 = _mm256_setzero_ps(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
    const int64_t r0 = j * hd, r1 = r0 + hd, r2 = r1 + hd, r3 = r2 + hd;
    for (int64_t i = 0; i < full; i += KN_ATTN_LANES) {
      __m256 ql = _mm256_loadu_ps(q + i), qh = _mm256_loadu_ps(q + i + 8);
      l0 = _mm256_fmadd_ps(ql, attn_row8(r->k, r->k16, r->k8, r0 + i), l0);
      h0 = _mm256_fmadd_ps(qh, attn_row8(r->k, r->k16, r->k8, r0 + i + 8), h0);
      l1 = _mm256_fmadd_ps(ql, attn_row8(r->k, r->k16, r->k8, r1 + i), l1);
      h1 = _mm256_fmadd_ps(qh, attn_row8(r->k, r->k16, r->k8, r1 + i + 8), h1);
      l2 = _mm256_fmadd_ps(ql, attn_row8(r->k, r->k16, r->k8, r2 + i), l2);
      h2 = _mm256_fmadd_ps(qh, attn_row8(r->k, r->k16, r->k8, r2 + i + 8), h2);
      l3 = _mm256_fmadd_ps(ql, attn_row8(r->k, r->k16, r->k8, r3 + i), l3);
      h3 = _mm256_fmadd_ps(qh, attn_row8(r->k, r->k16, r->k8, r3 + i + 8), h3);
    }
    float f[4];
    attn_fold4_avx2(_mm256_add_ps(l0, h0), _mm256_add_ps(l1, h1), _mm256_add_ps(l2, h2),
                    _mm256_add_ps(l3, h3), f);
    for (int c = 0; c < 4; c++) s[j + c] = attn_score_tail(q, r, j + c, f[c], scale);
  }
  for (; j < r->n; j++) {
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    int64_t row = j * hd;
    for (int64_t i = 0; i < full; i += KN_ATTN_LANES) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), attn_row8(r->k, r->k16, r->k8, row + i), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), attn_row8(r->k, r->k16, r->k8, row + i + 8),
                           hi);
    }
    s[j] = attn_score_tail(q, r, j, attn_fold8(_mm256_add_ps(lo, hi)), scale);
  }
}

/* attn_exp on 8 lanes at a time, operation for operation (the AVX-512 set uses it too:
 * a chunk has at most 16 weights). */
static ATTN_AVX2 void attn_exp_avx2(float *x, int n) {
  int j0 = 0;
  for (; j0 + 8 <= n; j0 += 8) _mm256_storeu_ps(x + j0, kn_vexp8(_mm256_loadu_ps(x + j0)));
  if (j0 < n) {
    float buf[8] = {0};
    int m = n - j0;
    memcpy(buf, x + j0, (size_t)m * sizeof *buf);
    _mm256_storeu_ps(buf, kn_vexp8(_mm256_loadu_ps(buf)));
    memcpy(x + j0, buf, (size_t)m * sizeof *buf);
  }
}

/* acc[d] += p_j v_j[d], rows in order for each dim: 64 dims in eight registers (eight
 * independent fma chains), then 32 in four, then the last dims one by one. */
#define ATTN_ACC8(a, u, off)                                                                       \
  a = _mm256_fmadd_ps(pj, attn_row8(r->v, r->v16, r->v8, (off) + 8 * (u)), a)
static ATTN_AVX2 void attn_accum_avx2(float *acc, const float *p, const attn_rows *r, int64_t d0,
                                      int64_t dn) {
  int64_t d = 0;
  for (; d + 64 <= dn; d += 64) {
    float *o = acc + d;
    __m256 a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + 8);
    __m256 a2 = _mm256_loadu_ps(o + 16), a3 = _mm256_loadu_ps(o + 24);
    __m256 a4 = _mm256_loadu_ps(o + 32), a5 = _mm256_loadu_ps(o + 40);
    __m256 a6 = _mm256_loadu_ps(o + 48), a7 = _mm256_loadu_ps(o + 56);
    for (int j = 0; j < r->n; j++) {
      __m256 pj = _mm256_set1_ps(p[j]);
      int64_t off = j * r->hd + d0 + d;
      ATTN_ACC8(a0, 0, off), ATTN_ACC8(a1, 1, off), ATTN_ACC8(a2, 2, off);
      ATTN_ACC8(a3, 3, off), ATTN_ACC8(a4, 4, off), ATTN_ACC8(a5, 5, off);
      ATTN_ACC8(a6, 6, off), ATTN_ACC8(a7, 7, off);
    }
    _mm256_storeu_ps(o, a0), _mm256_storeu_ps(o + 8, a1);
    _mm256_storeu_ps(o + 16, a2), _mm256_storeu_ps(o + 24, a3);
    _mm256_storeu_ps(o + 32, a4), _mm256_storeu_ps(o + 40, a5);
    _mm256_storeu_ps(o + 48, a6), _mm256_storeu_ps(o + 56, a7);
  }
  for (; d + 32 <= dn; d += 32) {
    float *o = acc + d;
    __m256 a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + 8);
    __m256 a2 = _mm256_loadu_ps(o + 16), a3 = _mm256_loadu_ps(o + 24);
    for (int j = 0; j < r->n; j++) {
      __m256 pj = _mm256_set1_ps(p[j]);
      int64_t off = j * r->hd + d0 + d;
      ATTN_ACC8(a0, 0, off), ATTN_ACC8(a1, 1, off), ATTN_ACC8(a2, 2, off);
      ATTN_ACC8(a3, 3, off);
    }
    _mm256_storeu_ps(o, a0), _mm256_storeu_ps(o + 8, a1);
    _mm256_storeu_ps(o + 16, a2), _mm256_storeu_ps(o + 24, a3);
  }
  for (; d < dn; d++) { /* the last dims one by one, rows in order */
    float a = acc[d];
    for (int j = 0; j < r->n; j++) {
      int64_t off = j * r->hd + d0 + d;
      float v = r->v ? r->v[off] : r->v16 ? ir_f16_to_f32(r->v16[off]) : (float)r->v8[off];
      a = fmaf(p[j], v, a);
    }
    acc[d] = a;
  }
}
#undef ATTN_ACC8

/* The chunk's n * hd values, 16 at a time (the rest one by one). */
static ATTN_AVX512 void attn_widen_avx512(const attn_rows *r, float *k, float *v) {
  int64_t n = r->n * r->hd, i = 0;
  if (r->k16)
    for (; i + KN_ATTN_LANES <= n; i += KN_ATTN_LANES) {
      _mm512_storeu_ps(k + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r->k16 + i))));
      _mm512_storeu_ps(v + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r->v16 + i))));
    }
  else
    for (; i + KN_ATTN_LANES <= n; i += KN_ATTN_LANES) {
      __m128i kb = _mm_loadu_si128((const __m128i *)(r->k8 + i));
      __m128i vb = _mm_loadu_si128((const __m128i *)(r->v8 + i));
      _mm512_storeu_ps(k + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(kb)));
      _mm512_storeu_ps(v + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(vb)));
    }
  attn_widen_from(r, i, k, v);
}

/* A full chunk (16 rows, head_dim a multiple of 16) for nq (<= KN_ATTN_MQ) queries of one
 * kv head at once, each query's scores and weights kept in a register: the operations of
 * attn_chunk_group's phases for each query, in their order (the max of the 16 scores is
 * the same value taken in any order; kn_vexp16 is kn_vexp8 lane for lane). Each K and V
 * vector is loaded and widened once for all the queries, whose fma chains, independent,
 * run side by side: a query's own chains are those it has alone. */
enum { KN_ATTN_MQ = 4 };
ATTN_AVX512_INLINE void attn_chunk16_body(attn_state *const *st, const float *const *q, int nq,
                                          const attn_rows *r, const float *v_scale, float scale,
                                          int64_t d0, int64_t dn, int kind) {
  const int64_t hd = r->hd;
  __m512 t[KN_ATTN_MQ][4];
  for (int g = 0; g < 4; g++) { /* rows 4g .. 4g+3: q . k, as attn_dot4_avx512 */
    __m512 a[KN_ATTN_MQ][4];
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < 4; c++) a[i][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
      __m512 kr[4];
      for (int c = 0; c < 4; c++)
        kr[c] = attn_ld16(kind, r->k, r->k16, r->k8, (4 * g + c) * hd + d);
      for (int i = 0; i < nq; i++) {
        __m512 qv = _mm512_loadu_ps(q[i] + d);
        for (int c = 0; c < 4; c++) a[i][c] = _mm512_fmadd_ps(qv, kr[c], a[i][c]);
      }
    }
    for (int i = 0; i < nq; i++) t[i][g] = attn_fold4rows(a[i]);
  }
  float p[KN_ATTN_MQ][KN_ATTN_CHUNK];
  for (int i = 0; i < nq; i++) {
    __m512 w = attn_fold_rows(t[i]);
    if (r->ks) w = _mm512_mul_ps(w, _mm512_loadu_ps(r->ks));
    w = _mm512_mul_ps(w, _mm512_set1_ps(scale));
    attn_state *s = st[i];
    float cm = _mm512_reduce_max_ps(w);
    if (cm > s->max) {
      float corr = _mm512_cvtss_f32(kn_vexp16(_mm512_set1_ps(s->max - cm)));
      s->sum *= corr;
      for (int64_t d = 0; d < dn; d++) s->acc[d] *= corr;
      s->max = cm;
    }
    __m512 e = kn_vexp16(_mm512_sub_ps(w, _mm512_set1_ps(s->max)));
    _mm512_storeu_ps(p[i], e);
    float sum = s->sum;
    for (int j = 0; j < KN_ATTN_CHUNK; j++) sum += p[i][j];
    s->sum = sum;
    if (v_scale) _mm512_storeu_ps(p[i], _mm512_mul_ps(e, _mm512_loadu_ps(v_scale)));
  }
  int64_t d = 0;
  for (; d + 4 * KN_ATTN_LANES <= dn; d += 4 * KN_ATTN_LANES) { /* p . v, as attn_accum_avx512 */
    __m512 acc[KN_ATTN_MQ][4];
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < 4; c++) acc[i][c] = _mm512_loadu_ps(st[i]->acc + d + 16 * c);
    for (int j = 0; j < KN_ATTN_CHUNK; j++) {
      __m512 vr[4];
      for (int c = 0; c < 4; c++)
        vr[c] = attn_ld16(kind, r->v, r->v16, r->v8, j * hd + d0 + d + 16 * c);
      for (int i = 0; i < nq; i++) {
        __m512 pj = _mm512_set1_ps(p[i][j]);
        for (int c = 0; c < 4; c++) acc[i][c] = _mm512_fmadd_ps(pj, vr[c], acc[i][c]);
      }
    }
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < 4; c++) _mm512_storeu_ps(st[i]->acc + d + 16 * c, acc[i][c]);
  }
  if (d < dn) /* the last dims (each dim's chain is its own) */
    for (int i = 0; i < nq; i++) attn_accum_avx512(st[i]->acc + d, p[i], r, d0 + d, dn - d);
}

#define ATTN_CHUNK16_INST(name, kind)                                                              \
  static ATTN_AVX512 void name(attn_state *const *st, const float *const *q, int nq,               \
                               const attn_rows *r, const float *v_scale, float scale, int64_t d0,  \
                               int64_t dn) {                                                       \
    switch (nq) {                                                                                  \
    case 4: attn_chunk16_body(st, q, 4, r, v_scale, scale, d0, dn, kind); break;                   \
    case 3: attn_chunk16_body(st, q, 3, r, v_scale, scale, d0, dn, kind); break;                   \
    case 2: attn_chunk16_body(st, q, 2, r, v_scale, scale, d0, dn, kind); break;                   \
    default: attn_chunk16_body(st, q, 1, r, v_scale, scale, d0, dn, kind); break;                  \
    }                                                                                              \
  }
ATTN_CHUNK16_INST(attn_chunk16_f32, ATTN_KIND_F32)
ATTN_CHUNK16_INST(attn_chunk16_f16, ATTN_KIND_F16)
ATTN_CHUNK16_INST(attn_chunk16_i8, ATTN_KIND_I8)

static ATTN_AVX512 void attn_chunk16_avx512(attn_state *const *st, const float *const *q, int nq,
                                            const attn_rows *r, const float *v_scale, float scale,
                                            int64_t d0, int64_t dn) {
  if (r->k) attn_chunk16_f32(st, q, nq, r, v_scale, scale, d0, dn);
  else if (r->k16) attn_chunk16_f16(st, q, nq, r, v_scale, scale, d0, dn);
  else attn_chunk16_i8(st, q, nq, r, v_scale, scale, d0, dn);
}

/* The same 8 at a time (F16C's vcvtph2ps, vpmovsxbd: the exact widening). */
static ATTN_AVX2 void attn_widen_avx2(const attn_rows *r, float *k, float *v) {
  int64_t n = r->n * r->hd, i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(k + i, attn_row8(NULL, r->k16, r->k8, i));
    _mm256_storeu_ps(v + i, attn_row8(NULL, r->v16, r->v8, i));
  }
  attn_widen_from(r, i, k, v);
}

/* attn_chunk16_body on AVX2, two or three queries at a time (the sixteen ymm registers
 * hold two queries' chains over two rows, or three queries' over one row and 16 value
 * dims): each query's steps are those of attn_chunk_group's phases with attn_scores_avx2,
 * attn_exp_avx2 and attn_accum_avx2 (a row's chains do not depend on the rows beside it,
 * nor a value dim's on the other dims), so the same bits as alone and as the AVX-512
 * kernel; each K and V vector is loaded and widened once for all of them. */
ATTN_AVX2_INLINE void attn_chunk2_body(attn_state *const *st, const float *const *q, int nq,
                                       const attn_rows *r, const float *v_scale, float scale,
                                       int64_t d0, int64_t dn, int kind) {
  const int64_t hd = r->hd;
  const int rs = nq == 3 ? 1 : 2, dw = nq == 3 ? 16 : 32; /* rows, value dims a step */
  float p[3][KN_ATTN_CHUNK];
  for (int j = 0; j < KN_ATTN_CHUNK; j += 4) {
    __m256 v[3][4];
    for (int c = 0; c < 4; c += rs) { /* rows j+c (and j+c+1): lo and hi chains */
      __m256 a[3][4];
      for (int i = 0; i < nq; i++)
        for (int e = 0; e < 2 * rs; e++) a[i][e] = _mm256_setzero_ps();
      const int64_t r0 = (j + c) * hd, r1 = r0 + hd;
      for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
        __m256 k[4];
        k[0] = attn_ld8(kind, r->k, r->k16, r->k8, r0 + d);
        k[1] = attn_ld8(kind, r->k, r->k16, r->k8, r0 + d + 8);
        if (rs == 2) {
          k[2] = attn_ld8(kind, r->k, r->k16, r->k8, r1 + d);
          k[3] = attn_ld8(kind, r->k, r->k16, r->k8, r1 + d + 8);
        }
        for (int i = 0; i < nq; i++) {
          __m256 ql = _mm256_loadu_ps(q[i] + d), qh = _mm256_loadu_ps(q[i] + d + 8);
          for (int e = 0; e < 2 * rs; e += 2) {
            a[i][e] = _mm256_fmadd_ps(ql, k[e], a[i][e]);
            a[i][e + 1] = _mm256_fmadd_ps(qh, k[e + 1], a[i][e + 1]);
          }
        }
      }
      for (int i = 0; i < nq; i++)
        for (int e = 0; e < rs; e++) v[i][c + e] = _mm256_add_ps(a[i][2 * e], a[i][2 * e + 1]);
    }
    for (int i = 0; i < nq; i++) {
      float f[4];
      attn_fold4_avx2(v[i][0], v[i][1], v[i][2], v[i][3], f);
      for (int c = 0; c < 4; c++) p[i][j + c] = (r->ks ? f[c] * r->ks[j + c] : f[c]) * scale;
    }
  }
  for (int i = 0; i < nq; i++) { /* max, rescale, weights, sum: attn_chunk_group's phases */
    attn_state *s = st[i];
    float cm = p[i][0];
    for (int j = 1; j < KN_ATTN_CHUNK; j++) cm = p[i][j] > cm ? p[i][j] : cm;
    if (cm > s->max) {
      float corr = s->max - cm;
      attn_exp_avx2(&corr, 1);
      s->sum *= corr;
      for (int64_t d = 0; d < dn; d++) s->acc[d] *= corr;
      s->max = cm;
    }
    for (int j = 0; j < KN_ATTN_CHUNK; j++) p[i][j] -= s->max;
    attn_exp_avx2(p[i], KN_ATTN_CHUNK);
    float sum = s->sum;
    for (int j = 0; j < KN_ATTN_CHUNK; j++) sum += p[i][j];
    s->sum = sum;
    if (v_scale)
      for (int j = 0; j < KN_ATTN_CHUNK; j++) p[i][j] *= v_scale[j];
  }
  int64_t d = 0;
  for (; d + dw <= dn; d += dw) { /* p . v: each dim's fma chain over the rows in order */
    __m256 acc[3][4];
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < dw / 8; c++) acc[i][c] = _mm256_loadu_ps(st[i]->acc + d + 8 * c);
    for (int j = 0; j < KN_ATTN_CHUNK; j++) {
      __m256 vr[4];
      for (int c = 0; c < dw / 8; c++)
        vr[c] = attn_ld8(kind, r->v, r->v16, r->v8, j * hd + d0 + d + 8 * c);
      for (int i = 0; i < nq; i++) {
        __m256 pj = _mm256_set1_ps(p[i][j]);
        for (int c = 0; c < dw / 8; c++) acc[i][c] = _mm256_fmadd_ps(pj, vr[c], acc[i][c]);
      }
    }
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < dw / 8; c++) _mm256_storeu_ps(st[i]->acc + d + 8 * c, acc[i][c]);
  }
  if (d < dn) /* the last dims */
    for (int i = 0; i < nq; i++) attn_accum_avx2(st[i]->acc + d, p[i], r, d0 + d, dn - d);
}

/* Three queries (a kv head's group in GQA 3:1) in one pass; otherwise two at a time. */
#define ATTN_CHUNK2_INST(name, kind)                                                               \
  static ATTN_AVX2 void name(attn_state *const *st, const float *const *q, int nq,                 \
                             const attn_rows *r, const float *v_scale, float scale, int64_t d0,    \
                             int64_t dn) {                                                         \
    for (int i = 0; i < nq;) {                                                                     \
      int n = nq - i == 3 ? 3 : nq - i >= 2 ? 2 : 1;                                               \
      if (n == 3) attn_chunk2_body(st + i, q + i, 3, r, v_scale, scale, d0, dn, kind);             \
      else if (n == 2) attn_chunk2_body(st + i, q + i, 2, r, v_scale, scale, d0, dn, kind);        \
      else attn_chunk2_body(st + i, q + i, 1, r, v_scale, scale, d0, dn, kind);                    \
      i += n;                                                                                      \
    }                                                                                              \
  }
ATTN_CHUNK2_INST(attn_chunk2_f32, ATTN_KIND_F32)
ATTN_CHUNK2_INST(attn_chunk2_f16, ATTN_KIND_F16)
ATTN_CHUNK2_INST(attn_chunk2_i8, ATTN_KIND_I8)

static ATTN_AVX2 void attn_chunk16_avx2(attn_state *const *st, const float *const *q, int nq,
                                        const attn_rows *r, const float *v_scale, float scale,
                                        int64_t d0, int64_t dn) {
  if (r->k) attn_chunk2_f32(st, q, nq, r, v_scale, scale, d0, dn);
  else if (r->k16) attn_chunk2_f16(st, q, nq, r, v_scale, scale, d0, dn);
  else attn_chunk2_i8(st, q, nq, r, v_scale, scale, d0, dn);
}

/* --- a prefill's group, the queries in the lanes ------------------------------------------
 * A group of 8 to 16 queries of one kv head (a prefill's tokens times the head's query
 * heads) goes through every chunk together, query i in lane i of every register, so the
 * work of a chunk is whole-register work for all of them at once:
 *  - scores: lane sum l of row j (attn_dot4_avx512's lane l: the fma chain over d = l,
 *    l + 16, ... of q[d] k_j[d]) is a chain of fmas of the transposed queries qt[d] by
 *    k_j[d] broadcast, and the fold (l, l+8), (l, l+4), (l, l+2), (0, 1) adds whole
 *    registers: row j's scores for the 16 queries in one register;
 *  - max, rescale, weights, sums: attn_chunk16_body's steps lane by lane (the max of a
 *    query's rows is one value in any order; kn_vexp16 is lanewise; the sum runs over the
 *    rows in order, a masked add a row), rows outside a query's [off, n) masked out;
 *  - p . v: acc (transposed: acc[d * 16 + i]) = fma(p_j, v_j[d], acc) over the rows in
 *    order, the weights of row j a register, v_j[d] broadcast, masked the same way.
 * Every query's numbers are thus those of its own pass (attn_chunk_group), bit for bit. */
enum { KN_ATTN_QL_MIN = 8 };

typedef struct attn_ql {
  float qt[KN_ATTN_DSLICE * KN_ATTN_LANES];  /* qt[d * 16 + i] = q_i[d] */
  float acc[KN_ATTN_DSLICE * KN_ATTN_LANES]; /* acc[d * 16 + i] */
  float pt[KN_ATTN_CHUNK * KN_ATTN_LANES];   /* row j's weights at j * 16 */
  float kw[KN_ATTN_CHUNK * KN_ATTN_DSLICE];  /* f16 / int8 rows widened */
  float vw[KN_ATTN_CHUNK * KN_ATTN_DSLICE];
} attn_ql;

static const float k_attn_zero_row[KN_ATTN_DSLICE];
static const uint32_t k_attn_zero_pairs[KN_ATTN_DSLICE / 2];

/* vm[j] = the queries of qs (nq) that read row j of the chunk at slot s0 of the block at
 * j0, as each would alone; returns the rows any reads (0: none). A chunk every query reads
 * whole (its slots past max_lo, before min_pos, inside the block) skips the per-query test. */
static inline int attn_chunk_masks(const attn_query *qs, int64_t nq, int64_t j0, int64_t bs,
                                   int64_t s0, int64_t max_lo, int64_t min_pos, __mmask16 *vm) {
  if (s0 + KN_ATTN_CHUNK <= bs && j0 + s0 >= max_lo && j0 + s0 + KN_ATTN_CHUNK <= min_pos) {
    for (int j = 0; j < KN_ATTN_CHUNK; j++) vm[j] = (__mmask16)((1u << nq) - 1u);
    return KN_ATTN_CHUNK;
  }
  int n_max = 0;
  memset(vm, 0, KN_ATTN_CHUNK * sizeof *vm);
  for (int64_t i = 0; i < nq; i++) {
    int n, off;
    attn_query_rows(&qs[i], j0, bs, s0, &n, &off);
    for (int j = off; j < n; j++) vm[j] |= (__mmask16)(1u << i);
    n_max = n > n_max ? n : n_max;
  }
  return n_max;
}

/* qt[d * 16 + i] = q_i[d] (queries nq .. 15 zero), 16 dims at a time. */
static ATTN_AVX512 void attn_ql_load_q(float *qt, const attn_query *qs, int64_t nq, int64_t hd) {
  for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = i < nq ? _mm512_loadu_ps(qs[i].q + d) : _mm512_setzero_ps();
    kn_transpose16x16(r);
    for (int u = 0; u < 16; u++) _mm512_store_ps(qt + (d + u) * KN_ATTN_LANES, r[u]);
  }
}

/* out_i[d] = acc[d * 16 + i] * (1 / sum_i) for i < nq, 16 dims at a time. */
static ATTN_AVX512 void attn_ql_store(const attn_query *qs, int64_t nq, const float *acc,
                                      __m512 sumv, int64_t hd) {
  _Alignas(64) float inv[KN_ATTN_LANES];
  _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), sumv));
  for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
    __m512 r[16];
    for (int u = 0; u < 16; u++) r[u] = _mm512_load_ps(acc + (d + u) * KN_ATTN_LANES);
    kn_transpose16x16(r);
    for (int64_t i = 0; i < nq; i++)
      _mm512_storeu_ps(qs[i].out + d, _mm512_mul_ps(r[i], _mm512_set1_ps(inv[i])));
  }
}

/* s[r] = the scores (unscaled) of rows kr[r], r < 4, against the queries of qt: lane sums
 * l = b, b+8, b+4, b+12 make R_b = (P_b + P_b+8) + (P_b+4 + P_b+12), then T_h = R_h +
 * R_h+2 and s = T_0 + T_1, the fold's pairs. */
ATTN_AVX512_INLINE void attn_ql_scores4(const float *qt, const float *const *kr, int64_t hd,
                                        __m512 *s) {
  __m512 t[2][4];
  for (int h = 0; h < 2; h++) {
    __m512 rb[4];
    for (int e = 0; e < 2; e++) {
      const int b = h + 2 * e, l[4] = {b, b + 8, b + 4, b + 12};
      __m512 a[4][4];
      for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_ps();
      for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
        __m512 qv[4];
        for (int c = 0; c < 4; c++) qv[c] = _mm512_load_ps(qt + (d + l[c]) * KN_ATTN_LANES);
        for (int r = 0; r < 4; r++)
          for (int c = 0; c < 4; c++)
            a[r][c] = _mm512_fmadd_ps(qv[c], _mm512_set1_ps(kr[r][d + l[c]]), a[r][c]);
      }
      for (int r = 0; r < 4; r++) {
        __m512 rr = _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]), _mm512_add_ps(a[r][2], a[r][3]));
        if (e == 0) rb[r] = rr;
        else t[h][r] = _mm512_add_ps(rb[r], rr);
      }
    }
  }
  for (int r = 0; r < 4; r++) s[r] = _mm512_add_ps(t[0][r], t[1][r]);
}

/* sc[j] = the scores of rows j < n of k (stride hd) against the queries of qt. */
static ATTN_AVX512 __attribute__((noinline)) void attn_ql_scores(const float *qt, const float *k,
                                                                 int n, int64_t hd, __m512 *sc) {
  for (int j = 0; j < n; j += 4) {
    const float *kr[4];
    for (int r = 0; r < 4; r++) kr[r] = j + r < n ? k + (j + r) * hd : k_attn_zero_row;
    attn_ql_scores4(qt, kr, hd, sc + j);
  }
}

/* acc[d * 16 + i] = acc * corr(i) for the lanes of resc (the chunk's rescale), then
 * += p_j(i) v_j[d] for the rows j < n in order (lanes of vm[j]; with `all`, every lane of
 * every row: a masked fma costs a fifth more), 16 dims a pass in registers. */
ATTN_AVX512_INLINE void attn_ql_pv_body(float *acc, __mmask16 resc, __m512 corr, const float *pt,
                                        const __mmask16 *vm, const float *v, int n, int64_t hd,
                                        bool all) {
  for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
    __m512 a[KN_ATTN_LANES];
    for (int u = 0; u < KN_ATTN_LANES; u++) a[u] = _mm512_load_ps(acc + (d + u) * KN_ATTN_LANES);
    if (resc)
      for (int u = 0; u < KN_ATTN_LANES; u++) a[u] = _mm512_mask_mul_ps(a[u], resc, a[u], corr);
    for (int j = 0; j < n; j++) {
      __m512 pj = _mm512_load_ps(pt + j * KN_ATTN_LANES);
      const float *vj = v + j * hd + d;
      for (int u = 0; u < KN_ATTN_LANES; u++)
        a[u] = all ? _mm512_fmadd_ps(pj, _mm512_set1_ps(vj[u]), a[u])
                   : _mm512_mask3_fmadd_ps(pj, _mm512_set1_ps(vj[u]), a[u], vm[j]);
    }
    for (int u = 0; u < KN_ATTN_LANES; u++) _mm512_store_ps(acc + (d + u) * KN_ATTN_LANES, a[u]);
  }
}

/* (Kept out of line, as attn_ql_scores: inlined into attn_ql_group, their registers were
 * allocated worse.) */
static ATTN_AVX512 __attribute__((noinline)) void attn_ql_pv(float *acc, __mmask16 resc,
                                                             __m512 corr, const float *pt,
                                                             const __mmask16 *vm, const float *v,
                                                             int n, int64_t hd, bool all) {
  if (all) attn_ql_pv_body(acc, resc, corr, pt, vm, v, n, hd, true);
  else attn_ql_pv_body(acc, resc, corr, pt, vm, v, n, hd, false);
}

static ATTN_AVX512 void attn_ql_group(const attn_args *a, const attn_kernels *kk,
                                      const attn_query *qs, int64_t nq, int64_t kvh, int64_t seq,
                                      int64_t min_lo, int64_t max_pos) {
  const kn_kv_layer *kv = a->kv;
  const int64_t hd = kv->head_dim, bs = kv->block_size;
  const attn_wide *wd = a->wide;
  const bool wide = wd && seq < wd->n_seq && wd->ctx[seq] >= max_pos;
  _Alignas(64) attn_ql w;
  memset(w.acc, 0, (size_t)(hd * KN_ATTN_LANES) * sizeof(float));
  attn_ql_load_q(w.qt, qs, nq, hd);
  const __mmask16 live = (__mmask16)((1u << nq) - 1u);
  int64_t min_pos = INT64_MAX, max_lo = 0; /* a chunk within both: every query reads it all */
  for (int64_t i = 0; i < nq; i++) {
    min_pos = qs[i].n_pos < min_pos ? qs[i].n_pos : min_pos;
    max_lo = qs[i].lo > max_lo ? qs[i].lo : max_lo;
  }
  __m512 maxv = _mm512_set1_ps(-INFINITY), sumv = _mm512_setzero_ps();
  for (int64_t j0 = min_lo / bs * bs; j0 < max_pos; j0 += bs) {
    int64_t row = attn_cache_off(kv, attn_block(a->b, seq, j0 / bs), kvh, 0) / hd;
    int64_t n_slot = max_pos - j0 < bs ? max_pos - j0 : bs;
    for (int64_t s0 = 0; s0 < n_slot; s0 += KN_ATTN_CHUNK) {
      __mmask16 vm[KN_ATTN_CHUNK]; /* the queries that read row j */
      const int n_max = attn_chunk_masks(qs, nq, j0, bs, s0, max_lo, min_pos, vm);
      if (!n_max) continue;
      int64_t r0 = row + s0;
      const float *kb, *vb, *ks = NULL, *v_scale = NULL;
      if (kv->k8) ks = kv->k_scale + r0, v_scale = kv->v_scale + r0;
      if (kv->k) {
        kb = kv->k + r0 * hd, vb = kv->v + r0 * hd;
      } else if (wide) {
        int64_t o = (wd->base[seq] + kvh * wd->ctx[seq] + j0 + s0) * hd;
        kb = wd->k + o, vb = wd->v + o;
      } else {
        attn_rows rr = {.hd = hd, .n = n_max};
        if (kv->k8) rr.k8 = kv->k8 + r0 * hd, rr.v8 = kv->v8 + r0 * hd;
        else rr.k16 = kv->k16 + r0 * hd, rr.v16 = kv->v16 + r0 * hd;
        kk->widen(&rr, w.kw, w.vw);
        kb = w.kw, vb = w.vw;
      }
      __m512 sc[KN_ATTN_CHUNK];
      attn_ql_scores(w.qt, kb, n_max, hd, sc);
      __m512 cm = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(a->scale);
      for (int j = 0; j < n_max; j++) {
        __m512 x = ks ? _mm512_mul_ps(sc[j], _mm512_set1_ps(ks[j])) : sc[j];
        sc[j] = x = _mm512_mul_ps(x, scale);
        cm = _mm512_mask_max_ps(cm, vm[j], cm, x);
      }
      __mmask16 resc = _mm512_mask_cmp_ps_mask(live, cm, maxv, _CMP_GT_OQ);
      __m512 corr = _mm512_set1_ps(1.0f);
      if (resc) { /* a rescale of the queries whose max the chunk raises (acc: in p . v) */
        corr = kn_vexp16(_mm512_sub_ps(maxv, cm));
        sumv = _mm512_mask_mul_ps(sumv, resc, sumv, corr);
        maxv = _mm512_mask_mov_ps(maxv, resc, cm);
      }
      bool all = true; /* every query reads every row: no masks in p . v */
      for (int j = 0; j < n_max; j++) {
        __m512 p = kn_vexp16(_mm512_sub_ps(sc[j], maxv));
        sumv = _mm512_mask_add_ps(sumv, vm[j], sumv, p);
        if (v_scale) p = _mm512_mul_ps(p, _mm512_set1_ps(v_scale[j]));
        _mm512_store_ps(w.pt + j * KN_ATTN_LANES, _mm512_maskz_mov_ps(live, p));
        all &= vm[j] == live;
      }
      attn_ql_pv(w.acc, resc, corr, w.pt, vm, vb, n_max, hd, all);
    }
  }
  attn_ql_store(qs, nq, w.acc, sumv, hd);
}

/* --- bf16 attention on AVX-512 (the bf16 order above) -------------------------------- */
#define ATTN_PIN(v) __asm__ volatile("" : "+v"(v))
#define ATTN_CSR_FLUSH(csr) (((csr) & ~0x6000u) | 0x8040u) /* DAZ, FTZ, nearest even */

/* The first n (may be <= 0 or > 16) of 16 lanes. */
ATTN_AVX512_INLINE __mmask16 attn_lanes(int64_t n) {
  return n >= KN_ATTN_LANES ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1u);
}

/* kn_bf16_value lane by lane. */
ATTN_AVX512_INLINE __m512 attn_bf16v16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  __m512i r = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                          _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                            _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  r = _mm512_mask_mov_epi32(r, _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)),
                            _mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u)));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* 16 values of a row from off on as f32, nv of them real (zero past; nv may be <= 0). */
ATTN_AVX512_INLINE __m512 attn_ld16n(const float *f, const uint16_t *h, const int8_t *b,
                                     int64_t off, int64_t nv) {
  if (nv >= KN_ATTN_LANES) return attn_ld16(attn_kind(f, h), f, h, b, off);
  if (nv <= 0) return _mm512_setzero_ps();
  if (f) return _mm512_maskz_loadu_ps(attn_lanes(nv), f + off);
  if (h) {
    uint16_t t[KN_ATTN_LANES] = {0};
    memcpy(t, h + off, (size_t)nv * sizeof *t);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)t));
  }
  int8_t t[KN_ATTN_LANES] = {0};
  memcpy(t, b + off, (size_t)nv);
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)t)));
}

/* Lane l of odd / even: dim 2l+1 / 2l of the 32 values lo (dims 0-15), hi (16-31). */
ATTN_AVX512_INLINE void attn_bf16_split(__m512 lo, __m512 hi, __m512 *odd, __m512 *even) {
  *odd = _mm512_permutex2var_ps(
      lo, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), hi);
  *even = _mm512_permutex2var_ps(
      lo, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), hi);
}

/* The bf16 dims 32t .. 32t+31 of row j of K, split. */
ATTN_AVX512_INLINE void attn_bf16_krow(const attn_rows *r, int64_t j, int64_t t, __m512 *odd,
                                       __m512 *even) {
  int64_t off = j * r->hd + 32 * t, left = r->hd - 32 * t;
  attn_bf16_split(attn_bf16v16(attn_ld16n(r->k, r->k16, r->k8, off, left)),
                  attn_bf16v16(attn_ld16n(r->k, r->k16, r->k8, off + 16, left - 16)), odd, even);
}

/* The scores' lane steps of rows j .. j+nr-1 into lanes[j..] (under DAZ and FTZ). */
ATTN_AVX512_INLINE void attn_bf16_dots(const __m512 *qo, const __m512 *qe, int64_t ns,
                                       const attn_rows *r, int j, int nr, __m512 *lanes) {
  __m512 a[4];
  for (int c = 0; c < 4; c++) a[c] = _mm512_setzero_ps();
  for (int c = 0; c < 4; c++) ATTN_PIN(a[c]);
  for (int64_t t = 0; t < ns; t++)
    for (int c = 0; c < nr; c++) {
      __m512 ko, ke;
      attn_bf16_krow(r, j + c, t, &ko, &ke);
      a[c] = _mm512_fmadd_ps(qo[t], ko, a[c]);
      a[c] = _mm512_fmadd_ps(qe[t], ke, a[c]);
    }
  for (int c = 0; c < 4; c++) ATTN_PIN(a[c]);
  for (int c = 0; c < nr; c++) lanes[j + c] = a[c];
}

static ATTN_AVX512 void attn_scores_bf16_avx512(const float *q, const attn_rows *r, float scale,
                                                float *s) {
  const int64_t hd = r->hd, ns = attn_bf16_pairs(hd) / KN_ATTN_BF16_PAIRS;
  __m512 qo[KN_ATTN_DSLICE / 32], qe[KN_ATTN_DSLICE / 32], lanes[KN_ATTN_CHUNK];
  for (int64_t t = 0; t < ns; t++)
    attn_bf16_split(attn_bf16v16(attn_ld16n(q, NULL, NULL, 32 * t, hd - 32 * t)),
                    attn_bf16v16(attn_ld16n(q, NULL, NULL, 32 * t + 16, hd - 32 * t - 16)), &qo[t],
                    &qe[t]);
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(ATTN_CSR_FLUSH(csr));
  int j = 0;
  for (; j + 4 <= r->n; j += 4) attn_bf16_dots(qo, qe, ns, r, j, 4, lanes);
  for (; j < r->n; j++) attn_bf16_dots(qo, qe, ns, r, j, 1, lanes);
  _mm_setcsr(csr);
  for (j = 0; j < r->n; j++) {
    float d = attn_fold16(lanes[j]);
    s[j] = (r->ks ? d * r->ks[j] : d) * scale;
  }
}

static ATTN_AVX512 void attn_accum_bf16_avx512(float *acc, const float *p, const attn_rows *r,
                                               int64_t d0, int64_t dn) {
  int ord[KN_ATTN_CHUNK], no = attn_pair_order(r, ord);
  float pb[KN_ATTN_CHUNK];
  for (int j = 0; j < r->n; j++) pb[j] = kn_bf16_value(p[j]);
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(ATTN_CSR_FLUSH(csr));
  for (int64_t d = 0; d < dn; d += 4 * KN_ATTN_LANES) {
    __m512 a[4];
    for (int u = 0; u < 4; u++)
      a[u] = _mm512_maskz_loadu_ps(attn_lanes(dn - d - 16 * u), acc + d + 16 * u);
    for (int u = 0; u < 4; u++) ATTN_PIN(a[u]);
    for (int o = 0; o < no; o++) {
      const int j = ord[o];
      const __m512 pj = _mm512_set1_ps(pb[j]);
      const int64_t off = j * r->hd + d0 + d;
      for (int u = 0; u < 4; u++)
        a[u] = _mm512_fmadd_ps(
            pj, attn_bf16v16(attn_ld16n(r->v, r->v16, r->v8, off + 16 * u, dn - d - 16 * u)), a[u]);
    }
    for (int u = 0; u < 4; u++) ATTN_PIN(a[u]);
    for (int u = 0; u < 4; u++)
      _mm512_mask_storeu_ps(acc + d + 16 * u, attn_lanes(dn - d - 16 * u), a[u]);
  }
  _mm_setcsr(csr);
}

/* --- a prefill's group in bf16, on vdpbf16ps (AVX512-BF16) -------------------------------
 * attn_ql_group's work with the bf16 order: the queries' pairs transposed (qt[p * 16 + i]:
 * q_i's dims 2p, 2p+1 as a bf16 pair), K rows as bf16 and V rows as slot pairs (vp[m *
 * head_dim + d]: slots 2m, 2m+1 of dim d), made once a call (attn_wide_make) or a chunk.
 * Score lane l is a chain of vdpbf16ps over the pairs p = l mod 16, folded as in f32; a
 * slot pair every query reads is one vdpbf16ps a dim, the others masked fmas under DAZ and
 * FTZ, the odd slot first. head_dim a multiple of 32, the block size even. */
#define ATTN_BF16 __attribute__((target("avx512f,avx512bf16,avx2,fma,f16c")))
#define ATTN_BF16_INLINE                                                                           \
  static inline __attribute__((target("avx512f,avx512bf16,avx2,fma,f16c"), always_inline))

typedef struct attn_qlb {
  uint32_t qt[KN_ATTN_DSLICE / 2 * KN_ATTN_LANES];
  float acc[KN_ATTN_DSLICE * KN_ATTN_LANES]; /* acc[d * 16 + i] */
  float pt[KN_ATTN_CHUNK * KN_ATTN_LANES];   /* row j's weights at j * 16 */
  uint16_t kb[KN_ATTN_CHUNK * KN_ATTN_DSLICE];
  uint32_t vp[KN_ATTN_CHUNK / 2 * KN_ATTN_DSLICE];
} attn_qlb;

/* Pair words (e_i low, o_i high) of two registers, lane by lane. */
ATTN_BF16_INLINE __m512i attn_bf16_pairs16(__m512 e, __m512 o) {
  __m512 lo = _mm512_permutex2var_ps(
      e, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), o);
  __m512 hi = _mm512_permutex2var_ps(
      e, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), o);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* Rows [0, n) of a chunk (cache rows at f / h / b, n <= 16) as bf16 K rows and V slot
 * pairs (an odd n's last pair with a zero slot). */
static ATTN_BF16 void attn_bf16_rows(const float *kf, const uint16_t *kh, const int8_t *k8,
                                     const float *vf, const uint16_t *vh, const int8_t *v8,
                                     int64_t n, int64_t hd, uint16_t *kb, uint32_t *vp) {
  const int kind = attn_kind(kf, kh);
  for (int64_t j = 0; j < n; j++)
    for (int64_t d = 0; d < hd; d += 32)
      _mm512_storeu_si512(kb + j * hd + d,
                          (__m512i)_mm512_cvtne2ps_pbh(attn_ld16(kind, kf, kh, k8, j * hd + d + 16),
                                                       attn_ld16(kind, kf, kh, k8, j * hd + d)));
  for (int64_t m = 0; 2 * m < n; m++)
    for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
      __m512 e = attn_ld16(kind, vf, vh, v8, 2 * m * hd + d);
      __m512 o =
          2 * m + 1 < n ? attn_ld16(kind, vf, vh, v8, (2 * m + 1) * hd + d) : _mm512_setzero_ps();
      _mm512_storeu_si512(vp + m * hd + d, attn_bf16_pairs16(e, o));
    }
}

/* qt from the queries (queries nq .. 15 zero), 16 pairs at a time. */
static ATTN_BF16 void attn_qlb_load_q(uint32_t *qt, const attn_query *qs, int64_t nq, int64_t hd) {
  for (int64_t d = 0; d < hd; d += 32) {
    __m512 r[16];
    for (int i = 0; i < 16; i++)
      r[i] = i < nq ? (__m512)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qs[i].q + d + 16),
                                                  _mm512_loadu_ps(qs[i].q + d))
                    : _mm512_setzero_ps();
    kn_transpose16x16(r);
    for (int u = 0; u < 16; u++) _mm512_store_ps((float *)qt + (d / 2 + u) * KN_ATTN_LANES, r[u]);
  }
}

/* attn_ql_scores4 on pairs: lane l's chain over the pairs p = l mod 16 of np. */
ATTN_BF16_INLINE void attn_qlb_scores4(const uint32_t *qt, const uint32_t *const *kr, int64_t np,
                                       __m512 *s) {
  __m512 t[2][4];
  for (int h = 0; h < 2; h++) {
    __m512 rb[4];
    for (int e = 0; e < 2; e++) {
      const int b = h + 2 * e, l[4] = {b, b + 8, b + 4, b + 12};
      __m512 a[4][4];
      for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_ps();
      for (int64_t p = 0; p < np; p += KN_ATTN_LANES) {
        __m512i qv[4];
        for (int c = 0; c < 4; c++) qv[c] = _mm512_load_si512(qt + (p + l[c]) * KN_ATTN_LANES);
        for (int r = 0; r < 4; r++)
          for (int c = 0; c < 4; c++)
            a[r][c] = _mm512_dpbf16_ps(a[r][c], (__m512bh)qv[c],
                                       (__m512bh)_mm512_set1_epi32((int)kr[r][p + l[c]]));
      }
      for (int r = 0; r < 4; r++) {
        __m512 rr = _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]), _mm512_add_ps(a[r][2], a[r][3]));
        if (e == 0) rb[r] = rr;
        else t[h][r] = _mm512_add_ps(rb[r], rr);
      }
    }
  }
  for (int r = 0; r < 4; r++) s[r] = _mm512_add_ps(t[0][r], t[1][r]);
}

static ATTN_BF16 __attribute__((noinline)) void
attn_qlb_scores(const uint32_t *qt, const uint16_t *kb, int n, int64_t hd, __m512 *sc) {
  for (int j = 0; j < n; j += 4) {
    const uint32_t *kr[4];
    for (int r = 0; r < 4; r++)
      kr[r] = j + r < n ? (const uint32_t *)(kb + (j + r) * hd) : k_attn_zero_pairs;
    attn_qlb_scores4(qt, kr, hd / 2, sc + j);
  }
}

/* The rescale, then p . v over the slot pairs of rows [0, n) (vm[j]: the queries that read
 * row j), 16 dims a pass in registers. */
static ATTN_BF16 __attribute__((noinline)) void attn_qlb_pv(float *acc, __mmask16 resc, __m512 corr,
                                                            const float *pt, const __mmask16 *vm,
                                                            const uint32_t *vp, int n, int64_t hd,
                                                            __mmask16 live) {
  const int np = (n + 1) / 2;
  __m512i pw[KN_ATTN_CHUNK / 2];
  __m512 po[KN_ATTN_CHUNK / 2], pe[KN_ATTN_CHUNK / 2];
  __mmask16 mo[KN_ATTN_CHUNK / 2], me[KN_ATTN_CHUNK / 2];
  unsigned full = 0, part = 0;
  for (int m = 0; m < np; m++) {
    __m512 e = _mm512_load_ps(pt + 2 * m * KN_ATTN_LANES);
    __m512 o =
        2 * m + 1 < n ? _mm512_load_ps(pt + (2 * m + 1) * KN_ATTN_LANES) : _mm512_setzero_ps();
    pw[m] = attn_bf16_pairs16(e, o);
    me[m] = vm[2 * m], mo[m] = 2 * m + 1 < n ? vm[2 * m + 1] : 0;
    if (me[m] == live && mo[m] == live) full |= 1u << m;
    else if (me[m] | mo[m]) part |= 1u << m;
    po[m] = _mm512_castsi512_ps(_mm512_and_si512(pw[m], _mm512_set1_epi32((int)0xffff0000u)));
    pe[m] = _mm512_castsi512_ps(_mm512_slli_epi32(pw[m], 16));
  }
  const unsigned csr = _mm_getcsr();
  for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
    __m512 a[KN_ATTN_LANES];
    for (int u = 0; u < KN_ATTN_LANES; u++) a[u] = _mm512_load_ps(acc + (d + u) * KN_ATTN_LANES);
    if (resc)
      for (int u = 0; u < KN_ATTN_LANES; u++) a[u] = _mm512_mask_mul_ps(a[u], resc, a[u], corr);
    if (part) {
      for (int u = 0; u < KN_ATTN_LANES; u++) ATTN_PIN(a[u]);
      _mm_setcsr(ATTN_CSR_FLUSH(csr));
      for (int u = 0; u < KN_ATTN_LANES; u++) ATTN_PIN(a[u]);
    }
    for (int m = 0; m < np; m++) {
      const uint32_t *v = vp + m * hd + d;
      if (full >> m & 1) {
        for (int u = 0; u < KN_ATTN_LANES; u++)
          a[u] = _mm512_dpbf16_ps(a[u], (__m512bh)pw[m], (__m512bh)_mm512_set1_epi32((int)v[u]));
      } else if (part >> m & 1) {
        for (int u = 0; u < KN_ATTN_LANES; u++) {
          __m512i w = _mm512_set1_epi32((int)v[u]);
          __m512 vo = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u)));
          a[u] = _mm512_mask3_fmadd_ps(po[m], vo, a[u], mo[m]);
          a[u] = _mm512_mask3_fmadd_ps(pe[m], _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), a[u],
                                       me[m]);
        }
      }
    }
    if (part) {
      for (int u = 0; u < KN_ATTN_LANES; u++) ATTN_PIN(a[u]);
      _mm_setcsr(csr);
      for (int u = 0; u < KN_ATTN_LANES; u++) ATTN_PIN(a[u]);
    }
    for (int u = 0; u < KN_ATTN_LANES; u++) _mm512_store_ps(acc + (d + u) * KN_ATTN_LANES, a[u]);
  }
}

/* The per-query kernels on vdpbf16ps: a score's lane steps are one instruction a 32 dims
 * of a row; a slot pair of p . v one a 16 dims, a slot without its pair (a chunk's edge)
 * one fma under DAZ and FTZ. */
static ATTN_BF16 void attn_scores_bf16_dp(const float *q, const attn_rows *r, float scale,
                                          float *s) {
  const int64_t hd = r->hd, ns = attn_bf16_pairs(hd) / KN_ATTN_BF16_PAIRS;
  __m512i qp[KN_ATTN_DSLICE / 32];
  for (int64_t t = 0; t < ns; t++)
    qp[t] = (__m512i)_mm512_cvtne2ps_pbh(attn_ld16n(q, NULL, NULL, 32 * t + 16, hd - 32 * t - 16),
                                         attn_ld16n(q, NULL, NULL, 32 * t, hd - 32 * t));
  for (int j = 0; j < r->n; j += 4) {
    const int nr = r->n - j < 4 ? r->n - j : 4;
    __m512 a[4];
    for (int c = 0; c < 4; c++) a[c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < ns; t++)
      for (int c = 0; c < nr; c++) {
        int64_t off = (j + c) * hd + 32 * t, left = hd - 32 * t;
        __m512bh kp = _mm512_cvtne2ps_pbh(attn_ld16n(r->k, r->k16, r->k8, off + 16, left - 16),
                                          attn_ld16n(r->k, r->k16, r->k8, off, left));
        a[c] = _mm512_dpbf16_ps(a[c], (__m512bh)qp[t], kp);
      }
    for (int c = 0; c < nr; c++) {
      float d = attn_fold16(a[c]);
      s[j + c] = (r->ks ? d * r->ks[j + c] : d) * scale;
    }
  }
}

static ATTN_BF16 void attn_accum_bf16_dp(float *acc, const float *p, const attn_rows *r, int64_t d0,
                                         int64_t dn) {
  const int o = r->odd, n = r->n;
  uint32_t pb[KN_ATTN_CHUNK];
  for (int j = 0; j < n; j++) pb[j] = kn_bf16_round(p[j]);
  const bool edge = o || (n + o) % 2;
  const unsigned csr = _mm_getcsr();
  if (edge) _mm_setcsr(ATTN_CSR_FLUSH(csr));
  for (int64_t d = 0; d < dn; d += 4 * KN_ATTN_LANES) {
    __m512 a[4];
    for (int u = 0; u < 4; u++)
      a[u] = _mm512_maskz_loadu_ps(attn_lanes(dn - d - 16 * u), acc + d + 16 * u);
    for (int u = 0; u < 4; u++) ATTN_PIN(a[u]);
    for (int b = 0; b < n + o; b += 2) { /* slots b, b + 1: rows e, od */
      const int e = b - o, od = b + 1 - o;
      const int64_t oe = (int64_t)e * r->hd + d0 + d, oo = (int64_t)od * r->hd + d0 + d;
      if (e >= 0 && od < n) {
        __m512bh pw = (__m512bh)_mm512_set1_epi32((int)(pb[e] | pb[od] << 16));
        for (int u = 0; u < 4; u++) {
          int64_t nv = dn - d - 16 * u;
          a[u] = _mm512_dpbf16_ps(
              a[u], pw,
              (__m512bh)attn_bf16_pairs16(attn_ld16n(r->v, r->v16, r->v8, oe + 16 * u, nv),
                                          attn_ld16n(r->v, r->v16, r->v8, oo + 16 * u, nv)));
        }
      } else {
        const int j = e >= 0 ? e : od;
        const __m512 pj = _mm512_set1_ps(kn_bf16_f32(pb[j]));
        const int64_t oj = e >= 0 ? oe : oo;
        for (int u = 0; u < 4; u++)
          a[u] = _mm512_fmadd_ps(
              pj, attn_bf16v16(attn_ld16n(r->v, r->v16, r->v8, oj + 16 * u, dn - d - 16 * u)),
              a[u]);
      }
    }
    for (int u = 0; u < 4; u++) ATTN_PIN(a[u]);
    for (int u = 0; u < 4; u++)
      _mm512_mask_storeu_ps(acc + d + 16 * u, attn_lanes(dn - d - 16 * u), a[u]);
  }
  if (edge) _mm_setcsr(csr);
}

/* attn_chunk16_body in the bf16 order: a full chunk for nq (<= KN_ATTN_MQ) queries, each
 * K pair vector and V slot-pair vector made once for all of them (every pair is whole). */
ATTN_BF16_INLINE void attn_chunk16_bf16_body(attn_state *const *st, const float *const *q, int nq,
                                             const attn_rows *r, const float *v_scale, float scale,
                                             int64_t d0, int64_t dn) {
  const int64_t hd = r->hd, ns = attn_bf16_pairs(hd) / KN_ATTN_BF16_PAIRS;
  __m512i qp[KN_ATTN_MQ][KN_ATTN_DSLICE / 32];
  for (int i = 0; i < nq; i++)
    for (int64_t t = 0; t < ns; t++)
      qp[i][t] =
          (__m512i)_mm512_cvtne2ps_pbh(attn_ld16n(q[i], NULL, NULL, 32 * t + 16, hd - 32 * t - 16),
                                       attn_ld16n(q[i], NULL, NULL, 32 * t, hd - 32 * t));
  __m512 t4[KN_ATTN_MQ][4];
  for (int g = 0; g < 4; g++) { /* rows 4g .. 4g+3 */
    __m512 a[KN_ATTN_MQ][4];
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < 4; c++) a[i][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < ns; t++) {
      __m512bh kp[4];
      for (int c = 0; c < 4; c++) {
        int64_t off = (4 * g + c) * hd + 32 * t, left = hd - 32 * t;
        kp[c] = _mm512_cvtne2ps_pbh(attn_ld16n(r->k, r->k16, r->k8, off + 16, left - 16),
                                    attn_ld16n(r->k, r->k16, r->k8, off, left));
      }
      for (int i = 0; i < nq; i++)
        for (int c = 0; c < 4; c++) a[i][c] = _mm512_dpbf16_ps(a[i][c], (__m512bh)qp[i][t], kp[c]);
    }
    for (int i = 0; i < nq; i++) t4[i][g] = attn_fold4rows(a[i]);
  }
  uint32_t pb[KN_ATTN_MQ][KN_ATTN_CHUNK];
  for (int i = 0; i < nq; i++) { /* max, rescale, weights, sum: as attn_chunk16_body */
    __m512 w = attn_fold_rows(t4[i]);
    if (r->ks) w = _mm512_mul_ps(w, _mm512_loadu_ps(r->ks));
    w = _mm512_mul_ps(w, _mm512_set1_ps(scale));
    attn_state *s = st[i];
    float cm = _mm512_reduce_max_ps(w);
    if (cm > s->max) {
      float corr = _mm512_cvtss_f32(kn_vexp16(_mm512_set1_ps(s->max - cm)));
      s->sum *= corr;
      for (int64_t d = 0; d < dn; d++) s->acc[d] *= corr;
      s->max = cm;
    }
    __m512 e = kn_vexp16(_mm512_sub_ps(w, _mm512_set1_ps(s->max)));
    float p[KN_ATTN_CHUNK];
    _mm512_storeu_ps(p, e);
    float sum = s->sum;
    for (int j = 0; j < KN_ATTN_CHUNK; j++) sum += p[j];
    s->sum = sum;
    if (v_scale) _mm512_storeu_ps(p, _mm512_mul_ps(e, _mm512_loadu_ps(v_scale)));
    for (int j = 0; j < KN_ATTN_CHUNK; j++) pb[i][j] = kn_bf16_round(p[j]);
  }
  for (int64_t d = 0; d < dn; d += 4 * KN_ATTN_LANES) { /* p . v: a slot pair an instruction */
    __m512 acc[KN_ATTN_MQ][4];
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < 4; c++)
        acc[i][c] = _mm512_maskz_loadu_ps(attn_lanes(dn - d - 16 * c), st[i]->acc + d + 16 * c);
    for (int m = 0; m < KN_ATTN_CHUNK / 2; m++) {
      __m512bh vp[4];
      for (int c = 0; c < 4; c++) {
        int64_t o = 2 * m * hd + d0 + d + 16 * c, nv = dn - d - 16 * c;
        vp[c] = (__m512bh)attn_bf16_pairs16(attn_ld16n(r->v, r->v16, r->v8, o, nv),
                                            attn_ld16n(r->v, r->v16, r->v8, o + hd, nv));
      }
      for (int i = 0; i < nq; i++) {
        __m512bh pw = (__m512bh)_mm512_set1_epi32((int)(pb[i][2 * m] | pb[i][2 * m + 1] << 16));
        for (int c = 0; c < 4; c++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], pw, vp[c]);
      }
    }
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < 4; c++)
        _mm512_mask_storeu_ps(st[i]->acc + d + 16 * c, attn_lanes(dn - d - 16 * c), acc[i][c]);
  }
}

/* The same steps for head_dim a multiple of 32 and 64 value dims a pass (dn too), the cache
 * type known at compile time: no masks, no branches in the loops (decode's common case). */
ATTN_BF16_INLINE void attn_chunk16_bf16_fast(attn_state *const *st, const float *const *q, int nq,
                                             const attn_rows *r, const float *v_scale, float scale,
                                             int64_t d0, int64_t dn, int kind) {
  const int64_t hd = r->hd, ns = hd / 32;
  const float *kf = r->k, *vf = r->v;
  const uint16_t *kh = r->k16, *vh = r->v16;
  const int8_t *k8 = r->k8, *v8 = r->v8;
  __m512bh qp[KN_ATTN_MQ][KN_ATTN_DSLICE / 32];
  for (int i = 0; i < nq; i++)
    for (int64_t t = 0; t < ns; t++)
      qp[i][t] =
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q[i] + 32 * t + 16), _mm512_loadu_ps(q[i] + 32 * t));
  __m512 t4[KN_ATTN_MQ][4];
  for (int g = 0; g < 4; g++) {
    __m512 a[KN_ATTN_MQ][4];
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < 4; c++) a[i][c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < ns; t++) {
      __m512bh kp[4];
      for (int c = 0; c < 4; c++) {
        int64_t off = (4 * g + c) * hd + 32 * t;
        kp[c] = _mm512_cvtne2ps_pbh(attn_ld16(kind, kf, kh, k8, off + 16),
                                    attn_ld16(kind, kf, kh, k8, off));
      }
      for (int i = 0; i < nq; i++)
        for (int c = 0; c < 4; c++) a[i][c] = _mm512_dpbf16_ps(a[i][c], qp[i][t], kp[c]);
    }
    for (int i = 0; i < nq; i++) t4[i][g] = attn_fold4rows(a[i]);
  }
  uint32_t pb[KN_ATTN_MQ][KN_ATTN_CHUNK];
  for (int i = 0; i < nq; i++) { /* max, rescale, weights, sum: as attn_chunk16_body */
    __m512 w = attn_fold_rows(t4[i]);
    if (r->ks) w = _mm512_mul_ps(w, _mm512_loadu_ps(r->ks));
    w = _mm512_mul_ps(w, _mm512_set1_ps(scale));
    attn_state *s = st[i];
    float cm = _mm512_reduce_max_ps(w);
    if (cm > s->max) {
      float corr = _mm512_cvtss_f32(kn_vexp16(_mm512_set1_ps(s->max - cm)));
      s->sum *= corr;
      for (int64_t d = 0; d < dn; d++) s->acc[d] *= corr;
      s->max = cm;
    }
    __m512 e = kn_vexp16(_mm512_sub_ps(w, _mm512_set1_ps(s->max)));
    float p[KN_ATTN_CHUNK];
    _mm512_storeu_ps(p, e);
    float sum = s->sum;
    for (int j = 0; j < KN_ATTN_CHUNK; j++) sum += p[j];
    s->sum = sum;
    if (v_scale) e = _mm512_mul_ps(e, _mm512_loadu_ps(v_scale));
    /* the weights' bf16 pairs: word 2m the even slot, 2m + 1 the odd */
    _mm512_storeu_si512(pb[i], (__m512i)_mm512_cvtne2ps_pbh(_mm512_setzero_ps(), e));
  }
  const uint16_t(*pw16)[2 * KN_ATTN_CHUNK] = (const uint16_t(*)[2 * KN_ATTN_CHUNK]) pb;
  for (int64_t d = 0; d < dn; d += 4 * KN_ATTN_LANES) {
    __m512 acc[KN_ATTN_MQ][4];
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < 4; c++) acc[i][c] = _mm512_loadu_ps(st[i]->acc + d + 16 * c);
    for (int m = 0; m < KN_ATTN_CHUNK / 2; m++) {
      __m512bh vp[4];
      for (int c = 0; c < 4; c++) {
        int64_t o = 2 * m * hd + d0 + d + 16 * c;
        vp[c] = (__m512bh)attn_bf16_pairs16(attn_ld16(kind, vf, vh, v8, o),
                                            attn_ld16(kind, vf, vh, v8, o + hd));
      }
      for (int i = 0; i < nq; i++) {
        uint32_t wv;
        memcpy(&wv, &pw16[i][2 * m], sizeof wv);
        __m512bh pw = (__m512bh)_mm512_set1_epi32((int)wv);
        for (int c = 0; c < 4; c++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], pw, vp[c]);
      }
    }
    for (int i = 0; i < nq; i++)
      for (int c = 0; c < 4; c++) _mm512_storeu_ps(st[i]->acc + d + 16 * c, acc[i][c]);
  }
}

#define ATTN_CHUNK16_BF16_INST(name, kind)                                                         \
  static ATTN_BF16 void name(attn_state *const *st, const float *const *q, int nq,                 \
                             const attn_rows *r, const float *v_scale, float scale, int64_t d0,    \
                             int64_t dn) {                                                         \
    switch (nq) {                                                                                  \
    case 4: attn_chunk16_bf16_fast(st, q, 4, r, v_scale, scale, d0, dn, kind); break;              \
    case 3: attn_chunk16_bf16_fast(st, q, 3, r, v_scale, scale, d0, dn, kind); break;              \
    case 2: attn_chunk16_bf16_fast(st, q, 2, r, v_scale, scale, d0, dn, kind); break;              \
    default: attn_chunk16_bf16_fast(st, q, 1, r, v_scale, scale, d0, dn, kind); break;             \
    }                                                                                              \
  }
ATTN_CHUNK16_BF16_INST(attn_chunk16_bf16_f32, ATTN_KIND_F32)
ATTN_CHUNK16_BF16_INST(attn_chunk16_bf16_f16, ATTN_KIND_F16)
ATTN_CHUNK16_BF16_INST(attn_chunk16_bf16_i8, ATTN_KIND_I8)

static ATTN_BF16 void attn_chunk16_bf16(attn_state *const *st, const float *const *q, int nq,
                                        const attn_rows *r, const float *v_scale, float scale,
                                        int64_t d0, int64_t dn) {
  if (r->hd % 32 || dn % 64) { /* (rare shapes: the masked body) */
    switch (nq) {
    case 4: attn_chunk16_bf16_body(st, q, 4, r, v_scale, scale, d0, dn); break;
    case 3: attn_chunk16_bf16_body(st, q, 3, r, v_scale, scale, d0, dn); break;
    case 2: attn_chunk16_bf16_body(st, q, 2, r, v_scale, scale, d0, dn); break;
    default: attn_chunk16_bf16_body(st, q, 1, r, v_scale, scale, d0, dn); break;
    }
  } else if (r->k) attn_chunk16_bf16_f32(st, q, nq, r, v_scale, scale, d0, dn);
  else if (r->k16) attn_chunk16_bf16_f16(st, q, nq, r, v_scale, scale, d0, dn);
  else attn_chunk16_bf16_i8(st, q, nq, r, v_scale, scale, d0, dn);
}

static ATTN_BF16 void attn_qlb_group(const attn_args *a, const attn_kernels *kk,
                                     const attn_query *qs, int64_t nq, int64_t kvh, int64_t seq,
                                     int64_t min_lo, int64_t max_pos) {
  (void)kk;
  const kn_kv_layer *kv = a->kv;
  const int64_t hd = kv->head_dim, bs = kv->block_size;
  const attn_wide *wd = a->wide;
  const bool wide = wd && seq < wd->n_seq && wd->ctx[seq] >= max_pos;
  _Alignas(64) attn_qlb w;
  memset(w.acc, 0, (size_t)(hd * KN_ATTN_LANES) * sizeof(float));
  attn_qlb_load_q(w.qt, qs, nq, hd);
  const __mmask16 live = (__mmask16)((1u << nq) - 1u);
  int64_t min_pos = INT64_MAX, max_lo = 0;
  for (int64_t i = 0; i < nq; i++) {
    min_pos = qs[i].n_pos < min_pos ? qs[i].n_pos : min_pos;
    max_lo = qs[i].lo > max_lo ? qs[i].lo : max_lo;
  }
  __m512 maxv = _mm512_set1_ps(-INFINITY), sumv = _mm512_setzero_ps();
  for (int64_t j0 = min_lo / bs * bs; j0 < max_pos; j0 += bs) {
    int64_t row = attn_cache_off(kv, attn_block(a->b, seq, j0 / bs), kvh, 0) / hd;
    int64_t n_slot = max_pos - j0 < bs ? max_pos - j0 : bs;
    for (int64_t s0 = 0; s0 < n_slot; s0 += KN_ATTN_CHUNK) {
      __mmask16 vm[KN_ATTN_CHUNK];
      const int n_max = attn_chunk_masks(qs, nq, j0, bs, s0, max_lo, min_pos, vm);
      if (!n_max) continue;
      int64_t r0 = row + s0;
      const float *ks = NULL, *v_scale = NULL;
      const uint16_t *kb;
      const uint32_t *vp;
      if (kv->k8) ks = kv->k_scale + r0, v_scale = kv->v_scale + r0;
      if (wide) {
        int64_t o = wd->base[seq] + kvh * attn_wide_stride(wd->ctx[seq]) + j0 + s0;
        kb = wd->kb + o * hd, vp = wd->vp + o / 2 * hd;
      } else {
        attn_bf16_rows(kv->k ? kv->k + r0 * hd : NULL, kv->k16 ? kv->k16 + r0 * hd : NULL,
                       kv->k8 ? kv->k8 + r0 * hd : NULL, kv->v ? kv->v + r0 * hd : NULL,
                       kv->v16 ? kv->v16 + r0 * hd : NULL, kv->v8 ? kv->v8 + r0 * hd : NULL, n_max,
                       hd, w.kb, w.vp);
        kb = w.kb, vp = w.vp;
      }
      __m512 sc[KN_ATTN_CHUNK];
      attn_qlb_scores(w.qt, kb, n_max, hd, sc);
      __m512 cm = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(a->scale);
      for (int j = 0; j < n_max; j++) {
        __m512 x = ks ? _mm512_mul_ps(sc[j], _mm512_set1_ps(ks[j])) : sc[j];
        sc[j] = x = _mm512_mul_ps(x, scale);
        cm = _mm512_mask_max_ps(cm, vm[j], cm, x);
      }
      __mmask16 resc = _mm512_mask_cmp_ps_mask(live, cm, maxv, _CMP_GT_OQ);
      __m512 corr = _mm512_set1_ps(1.0f);
      if (resc) {
        corr = kn_vexp16(_mm512_sub_ps(maxv, cm));
        sumv = _mm512_mask_mul_ps(sumv, resc, sumv, corr);
        maxv = _mm512_mask_mov_ps(maxv, resc, cm);
      }
      for (int j = 0; j < n_max; j++) {
        __m512 p = kn_vexp16(_mm512_sub_ps(sc[j], maxv));
        sumv = _mm512_mask_add_ps(sumv, vm[j], sumv, p);
        if (v_scale) p = _mm512_mul_ps(p, _mm512_set1_ps(v_scale[j]));
        _mm512_store_ps(w.pt + j * KN_ATTN_LANES, _mm512_maskz_mov_ps(live, p));
      }
      attn_qlb_pv(w.acc, resc, corr, w.pt, vm, vp, n_max, hd, live);
    }
  }
  attn_ql_store(qs, nq, w.acc, sumv, hd);
}

/* --- the tile order on AVX-512F: a query at a time -----------------------------------
 * Scores with the chunk's 16 keys in the lanes (K transposed 16 dims at a time), the two
 * chains of a block in two registers; p . v with 16 dims a register. Fmas and adds under
 * DAZ and FTZ. */
static ATTN_AVX512 void attn_scores_bt_avx512(const float *q, const attn_rows *r, float scale,
                                              float *s) {
  const int64_t hd = r->hd, nd = 2 * attn_bf16_pairs(hd);
  _Alignas(64) float qb[KN_ATTN_DSLICE], a[KN_ATTN_LANES];
  for (int64_t d = 0; d < nd; d += KN_ATTN_LANES)
    _mm512_store_ps(qb + d, attn_bf16v16(attn_ld16n(q, NULL, NULL, d, hd - d)));
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(ATTN_CSR_FLUSH(csr));
  __m512 acc = _mm512_setzero_ps();
  ATTN_PIN(acc);
  for (int64_t b = 0; b < nd; b += 2 * KN_ATTN_BF16_PAIRS) {
    __m512 e = _mm512_setzero_ps(), o = _mm512_setzero_ps();
    ATTN_PIN(e);
    ATTN_PIN(o);
    for (int64_t h = b; h < b + 2 * KN_ATTN_BF16_PAIRS; h += KN_ATTN_LANES) {
      __m512 t[KN_ATTN_LANES];
      for (int j = 0; j < KN_ATTN_LANES; j++)
        t[j] = j < r->n ? attn_bf16v16(attn_ld16n(r->k, r->k16, r->k8, j * hd + h, hd - h))
                        : _mm512_setzero_ps();
      kn_transpose16x16(t); /* t[i]: dim h + i of the 16 keys */
      for (int i = 0; i < KN_ATTN_LANES; i += 2) {
        e = _mm512_fmadd_ps(_mm512_set1_ps(qb[h + i]), t[i], e);
        o = _mm512_fmadd_ps(_mm512_set1_ps(qb[h + i + 1]), t[i + 1], o);
      }
    }
    acc = _mm512_add_ps(acc, _mm512_add_ps(e, o));
  }
  ATTN_PIN(acc);
  _mm_setcsr(csr);
  _mm512_store_ps(a, acc);
  for (int j = 0; j < r->n; j++) s[j] = (r->ks ? a[j] * r->ks[j] : a[j]) * scale;
}

static ATTN_AVX512 void attn_accum_bt_avx512(float *acc, const float *p, const attn_rows *r,
                                             int64_t d0, int64_t dn) {
  float pb[KN_ATTN_CHUNK];
  for (int j = 0; j < r->n; j++) pb[j] = kn_bf16_value(p[j]);
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(ATTN_CSR_FLUSH(csr));
  for (int64_t d = 0; d < dn; d += 2 * KN_ATTN_LANES) {
    __m512 c[2][2]; /* [even, odd][dims d, d + 16] */
    for (int u = 0; u < 2; u++) {
      c[0][u] = _mm512_setzero_ps(), c[1][u] = _mm512_setzero_ps();
      ATTN_PIN(c[0][u]);
      ATTN_PIN(c[1][u]);
    }
    for (int j = 0; j < r->n; j++) {
      const int par = (j + r->odd) & 1;
      const __m512 pj = _mm512_set1_ps(pb[j]);
      const int64_t off = j * r->hd + d0 + d;
      for (int u = 0; u < 2; u++)
        c[par][u] = _mm512_fmadd_ps(
            pj, attn_bf16v16(attn_ld16n(r->v, r->v16, r->v8, off + 16 * u, dn - d - 16 * u)),
            c[par][u]);
    }
    for (int u = 0; u < 2; u++) {
      const __mmask16 m = attn_lanes(dn - d - 16 * u);
      __m512 t = _mm512_add_ps(_mm512_setzero_ps(), _mm512_add_ps(c[0][u], c[1][u]));
      __m512 a = _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + d + 16 * u), t);
      ATTN_PIN(a);
      _mm512_mask_storeu_ps(acc + d + 16 * u, m, a);
    }
  }
  _mm_setcsr(csr);
}

/* --- a query group in the tile order, on AMX-BF16 -----------------------------------------
 * attn_qlb_group's steps with the products on the tile unit, a chunk of 16 slots at a time:
 * S^T (16 keys x 16 queries) = K (bf16 rows, 32 dims a tile) against the queries' pairs
 * transposed (qt), stored as the scores of 16 keys with the queries in the lanes; then P V
 * (16 queries x 16 dims a tile) = the weights as slot pairs a query row (pa: the queries'
 * pair words transposed) against V's slot pairs (vp[m * head_dim + d], as attn_bf16_rows
 * makes them: V is not transposed), added to the running acc[i * head_dim + d] of the
 * queries that read the chunk, under DAZ and FTZ. A slot a query skips enters with a zero
 * weight (the order's +0 makes that exact; V past the chunk's rows is zero); where such a
 * slot's v is not finite, the state goes to the queries one by one and the rest of the
 * chunks runs as for a query alone. Tiles: 0 S^T, 1 K, 2 qt, 3 pa (32 bytes a row), 4 vp
 * (8 rows), 5 P V. */
#define ATTN_AMX_TARGET "amx-tile,amx-bf16,avx512f,avx512bf16,avx512bw,avx2,fma,f16c"
#define ATTN_AMX __attribute__((target(ATTN_AMX_TARGET)))
#define ATTN_AMX_BARRIER() __asm__ volatile("" ::: "memory")

typedef struct attn_qlt {
  uint32_t qt[KN_ATTN_DSLICE / 2 * KN_ATTN_LANES];
  float acc[KN_ATTN_LANES * KN_ATTN_DSLICE]; /* acc[i * head_dim + d] */
  float sc[KN_ATTN_CHUNK * KN_ATTN_LANES];   /* S^T: key j's scores at j * 16 */
  float t[KN_ATTN_LANES * KN_ATTN_DSLICE];   /* a chunk's P V, as acc */
  uint32_t pa[KN_ATTN_LANES * KN_ATTN_CHUNK / 2];
  uint16_t kb[KN_ATTN_CHUNK * KN_ATTN_DSLICE];
  uint32_t vp[KN_ATTN_CHUNK / 2 * KN_ATTN_DSLICE];
} attn_qlt;

static ATTN_AMX void attn_qlt_config(void) {
  kn_amx_cfg cfg = {.palette = 1};
  for (int t = 0; t < 6; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  cfg.colsb[3] = 4 * KN_ATTN_CHUNK / 2;
  cfg.rows[4] = KN_ATTN_CHUNK / 2;
  ATTN_AMX_BARRIER();
  _tile_loadconfig(&cfg);
}

static ATTN_AMX void attn_qlt_release(void) { _tile_release(); }

/* S^T of the chunk at kb (16 rows of hd bf16) into w->sc. */
static ATTN_AMX void attn_qlt_scores(attn_qlt *w, const uint16_t *kb, int64_t hd) {
  ATTN_AMX_BARRIER();
  _tile_zero(0);
  for (int64_t b = 0; b < hd; b += 32) {
    _tile_loadd(1, kb + b, hd * 2);
    _tile_loadd(2, w->qt + b / 2 * KN_ATTN_LANES, 64);
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, w->sc, 64);
  ATTN_AMX_BARRIER();
}

/* P V of the chunk (w->pa against vp) into w->t. */
static ATTN_AMX void attn_qlt_pv(attn_qlt *w, const uint32_t *vp, int64_t hd) {
  ATTN_AMX_BARRIER();
  _tile_loadd(3, w->pa, 4 * KN_ATTN_CHUNK / 2);
  for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
    _tile_zero(5);
    _tile_loadd(4, vp + d, hd * 4);
    _tile_dpbf16ps(5, 3, 4);
    _tile_stored(5, w->t + d, hd * 4);
  }
  ATTN_AMX_BARRIER();
}

/* Ends the tile part of a group: the queries' states. */
static ATTN_AVX512 void attn_qlt_states(const attn_qlt *w, __m512 maxv, __m512 sumv, int64_t nq,
                                        int64_t hd, attn_state *st) {
  _Alignas(64) float mx[KN_ATTN_LANES], sm[KN_ATTN_LANES];
  _mm512_store_ps(mx, maxv);
  _mm512_store_ps(sm, sumv);
  for (int64_t i = 0; i < nq; i++) {
    st[i].max = mx[i], st[i].sum = sm[i];
    memcpy(st[i].acc, w->acc + i * hd, (size_t)hd * sizeof(float));
  }
}

/* out_i[d] = acc[i * hd + d] * (1 / sum_i), as attn_ql_store. */
static ATTN_AVX512 void attn_qlt_store(const attn_query *qs, int64_t nq, const float *acc,
                                       __m512 sumv, int64_t hd) {
  _Alignas(64) float inv[KN_ATTN_LANES];
  _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), sumv));
  for (int64_t i = 0; i < nq; i++)
    for (int64_t d = 0; d < hd; d += KN_ATTN_LANES)
      _mm512_storeu_ps(qs[i].out + d,
                       _mm512_mul_ps(_mm512_load_ps(acc + i * hd + d), _mm512_set1_ps(inv[i])));
}

/* The chunk's rows [n, 16) of kb and vp zero (past the context, or the wide buffer's). */
static void attn_qlt_zero_tail(uint16_t *kb, uint32_t *vp, int64_t n, int64_t hd) {
  if (n >= KN_ATTN_CHUNK) return;
  memset(kb + n * hd, 0, (size_t)((KN_ATTN_CHUNK - n) * hd) * sizeof *kb);
  int64_t m0 = (n + 1) / 2; /* (an odd n's last pair has its zero slot already) */
  memset(vp + m0 * hd, 0, (size_t)((KN_ATTN_CHUNK / 2 - m0) * hd) * sizeof *vp);
}

static ATTN_AMX bool attn_bf16_finite(const uint32_t *v, int64_t n) {
  const __m512i e = _mm512_set1_epi32(0x7f807f80);
  __mmask16 bad = 0;
  for (int64_t i = 0; i < n; i += 16) {
    __m512i x = _mm512_and_si512(_mm512_loadu_si512(v + i), e);
    bad |= _mm512_cmpeq_epi16_mask(x, e) ? 1 : 0;
  }
  return !bad;
}

static ATTN_AMX void attn_qlt_group(const attn_args *a, const attn_kernels *kk,
                                    const attn_query *qs, int64_t nq, int64_t kvh, int64_t seq,
                                    int64_t min_lo, int64_t max_pos) {
  const kn_kv_layer *kv = a->kv;
  const int64_t hd = kv->head_dim, bs = kv->block_size;
  const attn_wide *wd = a->wide;
  const bool wide = wd && seq < wd->n_seq && wd->ctx[seq] >= max_pos;
  _Alignas(64) attn_qlt w;
  memset(w.acc, 0, (size_t)(nq * hd) * sizeof(float));
  attn_qlb_load_q(w.qt, qs, nq, hd);
  const __mmask16 live = (__mmask16)((1u << nq) - 1u);
  int64_t min_pos = INT64_MAX, max_lo = 0;
  for (int64_t i = 0; i < nq; i++) {
    min_pos = qs[i].n_pos < min_pos ? qs[i].n_pos : min_pos;
    max_lo = qs[i].lo > max_lo ? qs[i].lo : max_lo;
  }
  __m512 maxv = _mm512_set1_ps(-INFINITY), sumv = _mm512_setzero_ps();
  int64_t pos = min_lo / bs * bs; /* the first position the tile part has not done */
  bool cfg = false;
  /* chunks of 16 slots from each block's start (bs % 16 == 0: attn_ql_fits) */
  for (; pos < max_pos; pos += KN_ATTN_CHUNK) {
    const int64_t j0 = pos / bs * bs, s0 = pos - j0;
    __mmask16 vm[KN_ATTN_CHUNK];
    const int n_max = attn_chunk_masks(qs, nq, j0, bs, s0, max_lo, min_pos, vm);
    const bool full = pos >= max_lo && pos + KN_ATTN_CHUNK <= min_pos;
    if (!n_max) continue;
    const int64_t r0 = attn_cache_off(kv, attn_block(a->b, seq, j0 / bs), kvh, 0) / hd + s0;
    const float *ks = NULL, *v_scale = NULL;
    const uint16_t *kb;
    const uint32_t *vp;
    if (kv->k8) ks = kv->k_scale + r0, v_scale = kv->v_scale + r0;
    if (wide) { /* (rows past the context zero) */
      int64_t o = wd->base[seq] + kvh * attn_wide_stride16(wd->ctx[seq]) + pos;
      kb = wd->kb + o * hd, vp = wd->vp + o / 2 * hd;
    } else {
      attn_bf16_rows(kv->k ? kv->k + r0 * hd : NULL, kv->k16 ? kv->k16 + r0 * hd : NULL,
                     kv->k8 ? kv->k8 + r0 * hd : NULL, kv->v ? kv->v + r0 * hd : NULL,
                     kv->v16 ? kv->v16 + r0 * hd : NULL, kv->v8 ? kv->v8 + r0 * hd : NULL, n_max,
                     hd, w.kb, w.vp);
      attn_qlt_zero_tail(w.kb, w.vp, n_max, hd);
      kb = w.kb, vp = w.vp;
    }
    if (!full && !attn_bf16_finite(vp, hd * KN_ATTN_CHUNK / 2))
      break; /* an infinite value some query skips: the rest per query */
    if (!cfg) attn_qlt_config(), cfg = true;
    attn_qlt_scores(&w, kb, hd);
    __m512 cm = _mm512_set1_ps(-INFINITY), scale = _mm512_set1_ps(a->scale), sc[KN_ATTN_CHUNK];
    for (int j = 0; j < n_max; j++) {
      __m512 x = _mm512_load_ps(w.sc + j * KN_ATTN_LANES);
      if (ks) x = _mm512_mul_ps(x, _mm512_set1_ps(ks[j]));
      sc[j] = x = _mm512_mul_ps(x, scale);
      cm = _mm512_mask_max_ps(cm, vm[j], cm, x);
    }
    __mmask16 resc = _mm512_mask_cmp_ps_mask(live, cm, maxv, _CMP_GT_OQ);
    __m512 corr = _mm512_set1_ps(1.0f);
    if (resc) {
      corr = kn_vexp16(_mm512_sub_ps(maxv, cm));
      sumv = _mm512_mask_mul_ps(sumv, resc, sumv, corr);
      maxv = _mm512_mask_mov_ps(maxv, resc, cm);
    }
    __m512 pw[KN_ATTN_LANES]; /* slot pair m's weights, the queries in the lanes; then pa */
    for (int m = 0; m < KN_ATTN_CHUNK / 2; m++) {
      __m512 pp[2];
      for (int u = 0; u < 2; u++) {
        const int j = 2 * m + u;
        if (j >= n_max) {
          pp[u] = _mm512_setzero_ps();
          continue;
        }
        __m512 x = kn_vexp16(_mm512_sub_ps(sc[j], maxv));
        sumv = _mm512_mask_add_ps(sumv, vm[j], sumv, x);
        if (v_scale) x = _mm512_mul_ps(x, _mm512_set1_ps(v_scale[j]));
        pp[u] = _mm512_maskz_mov_ps(vm[j], x);
      }
      pw[m] = _mm512_castsi512_ps(attn_bf16_pairs16(pp[0], pp[1]));
      pw[m + KN_ATTN_CHUNK / 2] = _mm512_setzero_ps();
    }
    kn_transpose16x16(pw); /* pw[i]: query i's 8 slot pairs */
    for (int i = 0; i < KN_ATTN_LANES; i++)
      _mm256_store_si256((__m256i *)(w.pa + i * (KN_ATTN_CHUNK / 2)),
                         _mm512_castsi512_si256(_mm512_castps_si512(pw[i])));
    attn_qlt_pv(&w, vp, hd);
    __mmask16 rd = 0; /* the queries that read a slot of the chunk (the others' acc stays) */
    for (int j = 0; j < n_max; j++) rd |= vm[j];
    _Alignas(64) float cf[KN_ATTN_LANES];
    _mm512_store_ps(cf, corr);
    for (int64_t i = 0; i < nq; i++) /* (the rescale unflushed, as in f32) */
      if (resc >> i & 1)
        for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
          float *acc = w.acc + i * hd + d;
          _mm512_store_ps(acc, _mm512_mul_ps(_mm512_load_ps(acc), _mm512_set1_ps(cf[i])));
        }
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(ATTN_CSR_FLUSH(csr));
    for (int64_t i = 0; i < nq; i++) {
      if (!(rd >> i & 1)) continue;
      for (int64_t d = 0; d < hd; d += KN_ATTN_LANES) {
        __m512 x = _mm512_load_ps(w.acc + i * hd + d);
        ATTN_PIN(x);
        x = _mm512_add_ps(x, _mm512_load_ps(w.t + i * hd + d));
        ATTN_PIN(x);
        _mm512_store_ps(w.acc + i * hd + d, x);
      }
    }
    _mm_setcsr(csr);
  }
  if (cfg) attn_qlt_release();
  if (pos >= max_pos) {
    attn_qlt_store(qs, nq, w.acc, sumv, hd);
    return;
  }
  attn_state st[KN_ATTN_GROUP];
  attn_qlt_states(&w, maxv, sumv, nq, hd, st);
  attn_rest(a, kk, st, qs, nq, kvh, seq, pos, max_pos, 0, hd);
}

static const attn_kernels k_attn_bf16_avx512 = {attn_scores_bf16_avx512,
                                                attn_exp_avx2,
                                                attn_accum_bf16_avx512,
                                                attn_widen_avx512,
                                                NULL,
                                                NULL,
                                                false};
/* (the portable steps with AVX2's exp: the portable one gives other bits where the build
 * has no native fma) */
static const attn_kernels k_attn_bf16_avx2 = {
    attn_scores_bf16_c, attn_exp_avx2, attn_accum_bf16_c, attn_widen_avx2, NULL, NULL, false};
static const attn_kernels k_attn_bf16_dp = {
    attn_scores_bf16_dp, attn_exp_avx2, attn_accum_bf16_dp, attn_widen_avx512, attn_chunk16_bf16,
    attn_qlb_group,      false};

static const attn_kernels k_attn_bt_avx512 = {attn_scores_bt_avx512,
                                              attn_exp_avx2,
                                              attn_accum_bt_avx512,
                                              attn_widen_avx512,
                                              NULL,
                                              NULL,
                                              false};
static const attn_kernels k_attn_bt_amx = {
    attn_scores_bt_avx512, attn_exp_avx2, attn_accum_bt_avx512, attn_widen_avx512, NULL,
    attn_qlt_group,        true};
static const attn_kernels k_attn_bt_avx2 = {
    attn_scores_bt_c, attn_exp_avx2, attn_accum_bt_c, attn_widen_avx2, NULL, NULL, false};

static const attn_kernels k_attn_avx512 = {
    attn_scores_avx512, attn_exp_avx2, attn_accum_avx512, attn_widen_avx512, attn_chunk16_avx512,
    attn_ql_group,      false};
static const attn_kernels k_attn_avx2 = {attn_scores_avx2,
                                         attn_exp_avx2,
                                         attn_accum_avx2,
                                         attn_widen_avx2,
                                         attn_chunk16_avx2,
                                         NULL,
                                         false};
#endif

static _Atomic bool g_attn_chunk_kernels = true;

bool kn_attention_set_chunk_kernels(bool on) { return atomic_exchange(&g_attn_chunk_kernels, on); }

static const attn_kernels *attn_pick(const attn_args *a) {
  const bool bf16 = a->bf16;
#if KN_ATTN_X86
  if (a->tile && kn_cpu_isa() >= 3 && kn_cpu_has_amx_bf16() && kn_cpu_has_avx512bf16())
    return &k_attn_bt_amx;
  if (a->tile && kn_cpu_isa() >= 2) return &k_attn_bt_avx512;
  if (a->tile && kn_cpu_isa() >= 1) return &k_attn_bt_avx2;
  if (bf16 && kn_cpu_isa() >= 2) return kn_matmul_bf16dp() ? &k_attn_bf16_dp : &k_attn_bf16_avx512;
  if (bf16 && kn_cpu_isa() >= 1) return &k_attn_bf16_avx2;
  if (kn_cpu_isa() >= 2) return &k_attn_avx512;
  if (kn_cpu_isa() >= 1) return &k_attn_avx2;
#endif
  if (a->tile) return &k_attn_bt_c;
  return bf16 ? &k_attn_bf16_c : &k_attn_c;
}

/* Whether a's shapes take the queries-in-lanes kernel of kk (the bf16 one: head_dim a
 * multiple of 32, an even block size). */
static bool attn_ql_fits(const attn_args *a, const attn_kernels *kk) {
  const int64_t hd = a->kv->head_dim;
  return kk->qgroup && hd % KN_ATTN_LANES == 0 && a->io->softcap == 0.0f &&
         (!a->bf16 || (hd % 32 == 0 && a->kv->block_size % 2 == 0)) &&
         (!a->tile || a->kv->block_size % KN_ATTN_CHUNK == 0) &&
         atomic_load_explicit(&g_attn_chunk_kernels, memory_order_relaxed);
}

/* Rows [off, off + n) of a chunk. */
static attn_rows attn_rows_at(const attn_rows *c, int off, int n) {
  attn_rows r = *c;
  int64_t e = (int64_t)off * c->hd;
  if (r.k) r.k += e, r.v += e;
  if (r.k16) r.k16 += e, r.v16 += e;
  if (r.k8) r.k8 += e, r.v8 += e;
  if (r.ks) r.ks += off;
  r.n = n;
  r.odd = (c->odd + off) & 1;
  return r;
}

/* Folds one chunk of rows into each query of a group (the chunk at slot s0 of the block
 * at position j0): the chunk's scores; when they raise the query's running max, a rescale
 * of its state (a factor of exactly 1 otherwise is skipped); its weights added in order.
 * Phase by phase across the queries, whose scores, maxima, exps and sums are independent
 * chains that overlap; each query reads exactly the rows it would alone, and exp is
 * elementwise, so one call over every query's weights gives each the same bits. */
static void attn_chunk_group(const attn_kernels *kk, attn_state *st, const attn_query *qs,
                             int64_t nq, const attn_rows *chunk, int64_t j0, int64_t bs, int64_t s0,
                             const float *v_scale, float scale, float softcap, int64_t d0,
                             int64_t dn) {
  float s[KN_ATTN_GROUP][KN_ATTN_CHUNK], corr[KN_ATTN_GROUP];
  int n[KN_ATTN_GROUP], off[KN_ATTN_GROUP], rescale[KN_ATTN_GROUP], nr = 0, n_max = 0;
  int active = 0, rest = 0;
  for (int64_t i = 0; i < nq; i++) {
    attn_query_rows(&qs[i], j0, bs, s0, &n[i], &off[i]);
    n_max = n[i] > n_max ? n[i] : n_max;
    active += n[i] > 0;
  }
  /* f16 / int8 rows read by many queries (a prefill's) are widened to f32 once (exactly:
   * the kernels widen the same way when they read them) */
  float kw[KN_ATTN_CHUNK * KN_ATTN_DSLICE], vw[KN_ATTN_CHUNK * KN_ATTN_DSLICE];
  attn_rows wide = *chunk;
  if (active > 3 && !chunk->k) {
    wide.n = n_max;
    kk->widen(&wide, kw, vw);
    wide.k = kw, wide.v = vw, wide.k16 = wide.v16 = NULL, wide.k8 = wide.v8 = NULL;
    chunk = &wide;
  }
  /* the full chunks, KN_ATTN_MQ at once */
  if (kk->chunk16 && chunk->hd % KN_ATTN_LANES == 0 && softcap == 0.0f &&
      atomic_load_explicit(&g_attn_chunk_kernels, memory_order_relaxed)) {
    attn_state *fs[KN_ATTN_MQ];
    const float *fq[KN_ATTN_MQ];
    int nf = 0;
    attn_rows r = *chunk;
    r.n = KN_ATTN_CHUNK;
    for (int64_t i = 0; i < nq; i++) {
      if (n[i] != KN_ATTN_CHUNK || off[i]) continue;
      fs[nf] = &st[i], fq[nf++] = qs[i].q;
      n[i] = 0; /* done: the phases below skip it */
      memset(s[i], 0, sizeof s[i]);
      if (nf == KN_ATTN_MQ) kk->chunk16(fs, fq, nf, &r, v_scale, scale, d0, dn), nf = 0;
    }
    if (nf) kk->chunk16(fs, fq, nf, &r, v_scale, scale, d0, dn);
  }
  for (int64_t i = 0; i < nq; i++) {
    if (!n[i]) continue;
    n[i] -= off[i]; /* from here on: the rows [off, off + n) */
    attn_rows r = attn_rows_at(chunk, off[i], n[i]);
    rest++;
    kk->scores(qs[i].q, &r, scale, s[i]);
    if (softcap > 0.0f)
      for (int j = 0; j < n[i]; j++) s[i][j] = kn_softcap1(s[i][j], softcap);
    float cm = s[i][0];
    for (int j = 1; j < n[i]; j++) cm = s[i][j] > cm ? s[i][j] : cm;
    if (cm > st[i].max) {
      corr[nr] = st[i].max - cm;
      rescale[nr++] = (int)i;
      st[i].max = cm;
    }
    for (int j = 0; j < n[i]; j++) s[i][j] -= st[i].max;
    for (int j = n[i]; j < KN_ATTN_CHUNK; j++) s[i][j] = 0.0f; /* unused lanes */
  }
  if (nr) kk->exp(corr, nr);
  for (int c = 0; c < nr; c++) {
    attn_state *t = &st[rescale[c]];
    t->sum *= corr[c];
    for (int64_t d = 0; d < dn; d++) t->acc[d] *= corr[c];
  }
  if (!rest) return;
  kk->exp(&s[0][0], (int)nq * KN_ATTN_CHUNK);
  for (int64_t i = 0; i < nq; i++) {
    if (!n[i]) continue;
    for (int j = 0; j < n[i]; j++) {
      st[i].sum += s[i][j];
      if (v_scale) s[i][j] *= v_scale[off[i] + j];
    }
    attn_rows r = attn_rows_at(chunk, off[i], n[i]);
    kk->accum(st[i].acc, s[i], &r, d0, dn);
  }
}

static void attn_group_slice(const attn_args *a, const attn_kernels *kk, int64_t t0, int64_t nt,
                             int64_t h0, int64_t nh, int64_t d0, int64_t dn) {
  const kn_kv_layer *kv = a->kv;
  const kn_attn_io *io = a->io;
  int64_t hd = kv->head_dim, bs = kv->block_size;
  int64_t kvh = h0 / (a->n_heads / kv->n_kv_heads);
  int64_t seq = a->b->tok_seq[t0], nq = nt * nh, max_pos = 0, min_lo = INT64_MAX;
  attn_query qs[KN_ATTN_GROUP];
  attn_state st[KN_ATTN_GROUP];
  float qr[KN_ATTN_GROUP][KN_ATTN_DSLICE]; /* head_dim <= 256 (the IR checks it) */
  for (int64_t i = 0; i < nq; i++) {
    int64_t t = t0 + i / nh, h = h0 + i % nh;
    const float *q = attn_head_in(qr[i], io->q + t * io->q_stride + h * hd, io->q_norm, io, t, hd);
    int64_t n_pos = (int64_t)a->b->tok_pos[t] + 1;
    int64_t lo = io->window > 0 && n_pos > io->window ? n_pos - io->window : 0;
    qs[i] = (attn_query){
        .q = q, .lo = lo, .n_pos = n_pos, .out = a->out + (t * a->n_heads + h) * hd + d0};
    if (n_pos > max_pos) max_pos = n_pos;
    if (lo < min_lo) min_lo = lo;
    st[i].max = -INFINITY, st[i].sum = 0.0f;
  }
  /* (the tile unit takes a decode's few queries too: S^T's columns are the queries) */
  if ((nq >= KN_ATTN_QL_MIN || kk->qgroup_any) && d0 == 0 && dn == hd && attn_ql_fits(a, kk)) {
    kk->qgroup(a, kk, qs, nq, kvh, seq, min_lo, max_pos);
    return;
  }
  for (int64_t i = 0; i < nq; i++) memset(st[i].acc, 0, (size_t)dn * sizeof st[i].acc[0]);
  attn_rest(a, kk, st, qs, nq, kvh, seq, min_lo / bs * bs, max_pos, d0, dn);
}

/* The chunks of positions [from, max_pos) (from a chunk's start) folded into the states of
 * the queries, then their outputs. */
static void attn_rest(const attn_args *a, const attn_kernels *kk, attn_state *st,
                      const attn_query *qs, int64_t nq, int64_t kvh, int64_t seq, int64_t from,
                      int64_t max_pos, int64_t d0, int64_t dn) {
  const kn_kv_layer *kv = a->kv;
  const kn_attn_io *io = a->io;
  int64_t hd = kv->head_dim, bs = kv->block_size;
  for (int64_t j0 = from / bs * bs; j0 < max_pos; j0 += bs) {
    int64_t row = attn_cache_off(kv, attn_block(a->b, seq, j0 / bs), kvh, 0) / hd;
    int64_t n_slot = max_pos - j0 < bs ? max_pos - j0 : bs;
    for (int64_t s0 = j0 < from ? from - j0 : 0; s0 < n_slot; s0 += KN_ATTN_CHUNK) {
      int64_t r0 = row + s0;
      attn_rows r = {.hd = hd};
      const float *v_scale = NULL;
      if (kv->k8) {
        r.k8 = kv->k8 + r0 * hd, r.v8 = kv->v8 + r0 * hd, r.ks = kv->k_scale + r0;
        v_scale = kv->v_scale + r0;
      } else if (kv->k16) {
        r.k16 = kv->k16 + r0 * hd, r.v16 = kv->v16 + r0 * hd;
      } else {
        r.k = kv->k + r0 * hd, r.v = kv->v + r0 * hd;
      }
      attn_chunk_group(kk, st, qs, nq, &r, j0, bs, s0, v_scale, a->scale, io->softcap, d0, dn);
    }
  }
  for (int64_t i = 0; i < nq; i++) {
    float inv = 1.0f / st[i].sum;
    for (int64_t d = 0; d < dn; d++) qs[i].out[d] = st[i].acc[d] * inv;
  }
}

/* One index is one group of tokens (a->groups: consecutive tokens of one sequence, at most
 * a->group_tok of them) times one kv head; a kv head's query heads go in sub-groups of
 * at most KN_ATTN_GROUP queries. */
static void attn_group_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const attn_args *a = arg;
  const attn_kernels *kk = attn_pick(a);
  int64_t hd = a->kv->head_dim, n_kv = a->kv->n_kv_heads, g = a->n_heads / n_kv;
  int64_t n_sub = a->head_splits, per = (g + n_sub - 1) / n_sub;
  for (int64_t u = begin; u < end; u++) {
    int64_t grp = u / (n_kv * n_sub), kvh = u / n_sub % n_kv, sub = u % n_sub;
    int64_t t0 = a->groups ? a->groups[grp] : grp;
    int64_t nt = a->groups ? a->groups[grp + 1] - t0 : 1;
    int64_t h1 =
        kvh * g + (sub + 1) * per < (kvh + 1) * g ? kvh * g + (sub + 1) * per : (kvh + 1) * g;
    int64_t hstep = per < KN_ATTN_GROUP ? per : KN_ATTN_GROUP;
    for (int64_t h = kvh * g + sub * per; h < h1; h += hstep) {
      int64_t nh = h1 - h < hstep ? h1 - h : hstep;
      for (int64_t d0 = 0; d0 < hd; d0 += KN_ATTN_DSLICE)
        attn_group_slice(a, kk, t0, nt, h, nh, d0,
                         hd - d0 < KN_ATTN_DSLICE ? hd - d0 : KN_ATTN_DSLICE);
    }
  }
}

/* Splits the batch into groups (a->groups[i] is group i's first token, then one past the
 * last) of consecutive tokens of one sequence, each at most group_tok tokens with a head
 * group that fits KN_ATTN_GROUP queries. Returns the group count; without memory, every
 * token is a group of its own (a->groups NULL). */
static int64_t attn_plan_groups(attn_args *a, int32_t **owned) {
  const kn_attn_batch *b = a->b;
  int64_t g = a->n_heads / a->kv->n_kv_heads;
  int64_t tq = g < KN_ATTN_GROUP ? KN_ATTN_GROUP / g : 1;
  *owned = NULL;
  a->groups = NULL;
  if (tq <= 1 || b->n_tok <= 1) return b->n_tok;
  int32_t *gs = ir_malloc((size_t)(b->n_tok + 1) * sizeof *gs);
  if (!gs) return b->n_tok;
  int64_t n = 0;
  for (int64_t t = 0; t < b->n_tok; t++)
    if (t == 0 || b->tok_seq[t] != b->tok_seq[t - 1] || t - gs[n - 1] >= tq) gs[n++] = (int32_t)t;
  gs[n] = (int32_t)b->n_tok;
  a->groups = gs;
  *owned = gs;
  return n;
}

enum { KN_ATTN_WIDE_MAX = 16 << 20 }; /* bytes of widened rows a call may take */

typedef struct attn_wide_job {
  const attn_args *a;
  attn_wide *w;
  const int64_t *first; /* (n_seq + 1): the first unit of each sequence */
} attn_wide_job;

/* Units (sequence, kv head, block): the block's widened rows. */
static void attn_wide_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const attn_wide_job *j = arg;
  const kn_kv_layer *kv = j->a->kv;
  const int64_t hd = kv->head_dim, bs = kv->block_size;
  const attn_kernels *kk = attn_pick(j->a);
  int64_t s = 0;
  for (int64_t u = begin; u < end; u++) {
    while (j->first[s + 1] <= u) s++;
    int64_t ctx = j->w->ctx[s], nb = (ctx + bs - 1) / bs, r = u - j->first[s];
    int64_t h = r / nb, blk = r % nb, n = ctx - blk * bs < bs ? ctx - blk * bs : bs;
    int64_t src = attn_cache_off(kv, attn_block(j->a->b, s, blk), h, 0);
#if KN_ATTN_X86
    if (j->w->kb && j->a->tile) { /* chunks of 16 rows (bs % 16 == 0) */
      int64_t o = j->w->base[s] + h * attn_wide_stride16(ctx) + blk * bs;
      for (int64_t c = 0; c < n; c += KN_ATTN_CHUNK) {
        int64_t sc = src + c * hd, nc = n - c < KN_ATTN_CHUNK ? n - c : KN_ATTN_CHUNK;
        uint16_t *kb = j->w->kb + (o + c) * hd;
        uint32_t *vp = j->w->vp + (o + c) / 2 * hd;
        attn_bf16_rows(kv->k ? kv->k + sc : NULL, kv->k16 ? kv->k16 + sc : NULL,
                       kv->k8 ? kv->k8 + sc : NULL, kv->v ? kv->v + sc : NULL,
                       kv->v16 ? kv->v16 + sc : NULL, kv->v8 ? kv->v8 + sc : NULL, nc, hd, kb, vp);
        attn_qlt_zero_tail(kb, vp, nc, hd);
      }
      continue;
    }
    if (j->w->kb) { /* (blocks start at even rows: bs even) */
      int64_t o = j->w->base[s] + h * attn_wide_stride(ctx) + blk * bs;
      attn_bf16_rows(kv->k ? kv->k + src : NULL, kv->k16 ? kv->k16 + src : NULL,
                     kv->k8 ? kv->k8 + src : NULL, kv->v ? kv->v + src : NULL,
                     kv->v16 ? kv->v16 + src : NULL, kv->v8 ? kv->v8 + src : NULL, n, hd,
                     j->w->kb + o * hd, j->w->vp + o / 2 * hd);
      continue;
    }
#endif
    int64_t dst = (j->w->base[s] + h * ctx + blk * bs) * hd;
    attn_rows rr = {.hd = hd, .n = (int)n};
    if (kv->k8) rr.k8 = kv->k8 + src, rr.v8 = kv->v8 + src;
    else rr.k16 = kv->k16 + src, rr.v16 = kv->v16 + src;
    kk->widen(&rr, j->w->k + dst, j->w->v + dst);
  }
}

/* Widens the rows of the sequences with two or more queries-in-lanes groups a kv head (a
 * prefill's), when the kernel runs here and the rows fit KN_ATTN_WIDE_MAX; returns the
 * block to free (NULL: none made, a->wide NULL). */
static void *attn_wide_make(kn_pool *p, attn_args *a, attn_wide *w) {
  const kn_kv_layer *kv = a->kv;
  const kn_attn_batch *b = a->b;
  a->wide = NULL;
  if (!attn_ql_fits(a, attn_pick(a)) || (kv->k && !a->bf16) || b->n_tok < 2) return NULL;
  int64_t g = a->n_heads / kv->n_kv_heads, per = (g + a->head_splits - 1) / a->head_splits;
  int64_t nh = per < KN_ATTN_GROUP ? per : KN_ATTN_GROUP, n_seq = 0;
  for (int64_t t = 0; t < b->n_tok; t++)
    n_seq = b->tok_seq[t] + 1 > n_seq ? b->tok_seq[t] + 1 : n_seq;
  int64_t *mem = ir_calloc((size_t)(3 * n_seq + 1), sizeof *mem);
  if (!mem) return NULL;
  int64_t *ctx = mem, *base = mem + n_seq, *first = mem + 2 * n_seq;
  int64_t *cnt = first; /* groups a sequence has, in first's place until first is made */
  /* groups of >= KN_ATTN_QL_MIN queries a sequence has, and the context they read */
  int64_t n_groups = a->groups ? 0 : b->n_tok;
  if (a->groups)
    while (a->groups[n_groups] < b->n_tok) n_groups++;
  for (int64_t gi = 0; gi < n_groups; gi++) {
    int64_t t0 = a->groups ? a->groups[gi] : gi, t1 = a->groups ? a->groups[gi + 1] : gi + 1;
    if ((t1 - t0) * nh < KN_ATTN_QL_MIN) continue;
    int64_t s = b->tok_seq[t0];
    cnt[s]++;
    for (int64_t t = t0; t < t1; t++)
      ctx[s] = b->tok_pos[t] + 1 > ctx[s] ? b->tok_pos[t] + 1 : ctx[s];
  }
  int64_t rows = 0;
  for (int64_t s = 0; s < n_seq; s++) {
    if (cnt[s] < 2) ctx[s] = 0; /* one group: it widens each chunk once anyway */
    base[s] = rows;
    rows += (a->tile   ? attn_wide_stride16(ctx[s])
             : a->bf16 ? attn_wide_stride(ctx[s])
                       : ctx[s]) *
            kv->n_kv_heads;
  }
  /* f32 K and V rows; bf16 K rows and V pairs (rows even) */
  size_t bytes = (size_t)(rows * kv->head_dim) * (a->bf16 ? 4 : 2 * sizeof(float));
  float *buf = rows && bytes <= KN_ATTN_WIDE_MAX ? ir_malloc(bytes) : NULL;
  if (!buf) {
    ir_free(mem);
    return NULL;
  }
  first[0] = 0; /* units: kv heads x blocks a sequence */
  for (int64_t s = 0; s < n_seq; s++)
    first[s + 1] = first[s] + kv->n_kv_heads * ((ctx[s] + kv->block_size - 1) / kv->block_size);
  if (a->bf16)
    *w = (attn_wide){.kb = (uint16_t *)buf,
                     .vp = (uint32_t *)((uint16_t *)buf + rows * kv->head_dim),
                     .base = base,
                     .ctx = ctx,
                     .n_seq = n_seq};
  else
    *w = (attn_wide){
        .k = buf, .v = buf + rows * kv->head_dim, .base = base, .ctx = ctx, .n_seq = n_seq};
  attn_wide_job job = {.a = a, .w = w, .first = first};
  kn_parallel_for(p, first[n_seq], 1, attn_wide_task, &job);
  a->wide = w;
  return mem; /* (with w->k, the two blocks to free) */
}

/* Sizes chunks by the actual context lengths: a decode step over long contexts splits
 * down to single units, a short prefill batches many. */
static int64_t attn_grain(const kn_attn_batch *b, int64_t units, int64_t n_heads, int64_t hd) {
  int64_t ctx = 0;
  for (int64_t t = 0; t < b->n_tok; t++) ctx += (int64_t)b->tok_pos[t] + 1;
  int64_t work = ctx * n_heads * hd; /* ~ multiply-adds for q.k, and as many for p.v */
  if (work <= 0) return 1;
  return 1 + units * KN_ATTN_MIN_WORK / work;
}

void kn_attention_paged(kn_pool *p, float *out, const float *q, const float *k_new,
                        const float *v_new, const kn_kv_layer *kv, const kn_attn_batch *b,
                        int64_t n_heads, float scale) {
  kn_attn_io io = {.q = q,
                   .k = k_new,
                   .v = v_new,
                   .q_stride = n_heads * kv->head_dim,
                   .kv_stride = kv->n_kv_heads * kv->head_dim};
  kn_attention_paged_io(p, out, &io, kv, b, n_heads, scale);
}

void kn_attention_paged_io(kn_pool *p, float *out, const kn_attn_io *io, const kn_kv_layer *kv,
                           const kn_attn_batch *b, int64_t n_heads, float scale) {
  attn_args a = {.out = out,
                 .io = io,
                 .kv = kv,
                 .b = b,
                 .n_heads = n_heads,
                 .scale = scale,
                 .bf16 = io->bf16 && kv->head_dim <= KN_ATTN_DSLICE};
  a.tile = a.bf16 && kn_matmul_x16_order() == KN_X16_TILE;
  int64_t row = kv->n_kv_heads * kv->head_dim;
  /* Every write lands before any read: a token may attend to positions written by
   * other tokens of the same step (prefill chunks). */
  kn_parallel_for(p, b->n_tok, row > 0 ? 1 + KN_ATTN_MIN_WORK / row : 1, attn_write_task, &a);
  int32_t *owned;
  int64_t units = attn_plan_groups(&a, &owned) * kv->n_kv_heads;
  /* Fewer units than threads (a decode step of one sequence, few kv heads): a kv head's
   * query heads split into sub-groups, each reading the cache again, so no thread idles.
   * Only then: the chunk kernels fold a group of up to 3-4 queries in one pass, so two
   * passes over a kv head's cache cost more than one thread waiting on a third unit (2
   * threads, 3 units: 5-10% faster unsplit, AVX2, ctx 512-4096). How a query is computed
   * does not depend on its group. */
  int64_t g = n_heads / kv->n_kv_heads, want = kn_pool_threads(p);
  a.head_splits = 1;
  while (units * a.head_splits < want && a.head_splits < g) a.head_splits++;
  units *= a.head_splits;
  attn_wide wide;
  void *wide_mem = attn_wide_make(p, &a, &wide);
  kn_parallel_for(p, units, attn_grain(b, units, n_heads, kv->head_dim), attn_group_task, &a);
  if (wide_mem) ir_free(wide.k ? (void *)wide.k : (void *)wide.kb), ir_free(wide_mem);
  ir_free(owned);
}
