/* kn_attention: causal attention over a paged KV cache, with grouped-query heads.
 * Each (token, head) is one online-softmax pass, so its result never depends on the
 * other tokens of the step. */
#include <math.h>
#include <string.h>

#include "kn_cpu.h"

/* The accumulator lives on the stack in slices of this many dims; wider heads take one
 * pass per slice (recomputing the scores) rather than allocating. */
enum { KN_ATTN_DSLICE = 256, KN_ATTN_LANES = 8, KN_ATTN_MIN_WORK = 32768 };

typedef struct attn_args {
  float *out;
  const kn_attn_io *io;
  const kn_kv_layer *kv;
  const kn_attn_batch *b;
  int64_t n_heads;
  float scale;
} attn_args;

/* Offset of (physical block, kv head, slot) in a (n_blocks, n_kv_heads, block_size,
 * head_dim) cache. */
static int64_t attn_cache_off(const kn_kv_layer *kv, int64_t blk, int64_t kvh, int64_t slot) {
  return ((blk * kv->n_kv_heads + kvh) * kv->block_size + slot) * kv->head_dim;
}

static int64_t attn_block(const kn_attn_batch *b, int64_t seq, int64_t logical) {
  return b->block_tables[seq * b->max_blocks_per_seq + logical];
}

static void attn_write_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const attn_args *a = arg;
  const kn_kv_layer *kv = a->kv;
  size_t row = (size_t)kv->head_dim * sizeof(float);
  const kn_attn_io *io = a->io;
  for (int64_t t = begin; t < end; t++) {
    int64_t pos = a->b->tok_pos[t];
    int64_t blk = attn_block(a->b, a->b->tok_seq[t], pos / kv->block_size);
    for (int64_t h = 0; h < kv->n_kv_heads; h++) {
      int64_t dst = attn_cache_off(kv, blk, h, pos % kv->block_size);
      int64_t src = t * io->kv_stride + h * kv->head_dim;
      memcpy(kv->k + dst, io->k + src, row);
      memcpy(kv->v + dst, io->v + src, row);
      /* rotated in the cache: the same operations as kn_rope on the input, then a copy */
      if (io->cos_sin)
        kn_rope_head(kv->k + dst, io->cos_sin + (int64_t)io->pos[t] * io->rot_dim, io->rot_dim,
                     io->neox);
    }
  }
}

/* Fixed lanes and fold order: vectorisable, and the same for every call. */
static float attn_dot(const float *restrict x, const float *restrict y, int64_t n) {
  float acc[KN_ATTN_LANES] = {0};
  int64_t i = 0;
  for (; i + KN_ATTN_LANES <= n; i += KN_ATTN_LANES)
    for (int l = 0; l < KN_ATTN_LANES; l++) acc[l] += x[i + l] * y[i + l];
  for (int w = KN_ATTN_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) acc[l] += acc[l + w];
  float s = acc[0];
  for (; i < n; i++) s += x[i] * y[i];
  return s;
}

/* Online-softmax state for one (token, head) and one slice of value dims. */
typedef struct attn_state {
  float max;
  float sum;
  float acc[KN_ATTN_DSLICE];
} attn_state;

/* Folds one position in: rescale only when the running max grows (a factor of
 * exactly 1 otherwise), then add its weight. */
static void attn_state_add(attn_state *restrict st, float score, const float *restrict v,
                           int64_t dn) {
  if (score > st->max) {
    float corr = expf(st->max - score);
    st->sum *= corr;
    for (int64_t d = 0; d < dn; d++) st->acc[d] *= corr;
    st->max = score;
  }
  float w = expf(score - st->max);
  st->sum += w;
  for (int64_t d = 0; d < dn; d++) st->acc[d] += w * v[d];
}

/* Attends token t's head h over positions 0..pos of its sequence, for dims
 * [d0, d0 + dn) of the output. */
static void attn_head_slice(const attn_args *a, int64_t t, int64_t h, int64_t d0, int64_t dn) {
  const kn_kv_layer *kv = a->kv;
  int64_t hd = kv->head_dim, bs = kv->block_size;
  int64_t kvh = h / (a->n_heads / kv->n_kv_heads);
  int64_t seq = a->b->tok_seq[t], n_pos = (int64_t)a->b->tok_pos[t] + 1;
  const kn_attn_io *io = a->io;
  const float *q = io->q + t * io->q_stride + h * hd;
  float qr[KN_ATTN_DSLICE]; /* head_dim <= 256 (the IR checks it) */
  if (io->cos_sin) {
    memcpy(qr, q, (size_t)hd * sizeof *qr);
    kn_rope_head(qr, io->cos_sin + (int64_t)io->pos[t] * io->rot_dim, io->rot_dim, io->neox);
    q = qr;
  }
  attn_state st = {.max = -INFINITY, .sum = 0.0f};
  for (int64_t j0 = 0; j0 < n_pos; j0 += bs) {
    int64_t base = attn_cache_off(kv, attn_block(a->b, seq, j0 / bs), kvh, 0);
    int64_t n_slot = n_pos - j0 < bs ? n_pos - j0 : bs;
    for (int64_t s = 0; s < n_slot; s++) {
      int64_t off = base + s * hd;
      float score = attn_dot(q, kv->k + off, hd) * a->scale;
      attn_state_add(&st, score, kv->v + off + d0, dn);
    }
  }
  float *out = a->out + (t * a->n_heads + h) * hd + d0;
  float inv = 1.0f / st.sum;
  for (int64_t d = 0; d < dn; d++) out[d] = st.acc[d] * inv;
}

/* One index is one (token, head) pair. */
static void attn_head_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const attn_args *a = arg;
  int64_t hd = a->kv->head_dim;
  for (int64_t th = begin; th < end; th++)
    for (int64_t d0 = 0; d0 < hd; d0 += KN_ATTN_DSLICE)
      attn_head_slice(a, th / a->n_heads, th % a->n_heads, d0,
                      hd - d0 < KN_ATTN_DSLICE ? hd - d0 : KN_ATTN_DSLICE);
}

/* --- int8 cache: quantised on write, dequantised on the fly on read --------------------- */

/* Symmetric: scale = max|x| / 127, q = round(x / scale); the scale is returned. */
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

static void attn_write_task_i8(void *arg, int64_t begin, int64_t end, int tid) {
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
      int64_t dst = attn_cache_off(kv, blk, h, pos % kv->block_size);
      int64_t src = t * io->kv_stride + h * hd;
      memcpy(kr, io->k + src, (size_t)hd * sizeof *kr);
      if (io->cos_sin)
        kn_rope_head(kr, io->cos_sin + (int64_t)io->pos[t] * io->rot_dim, io->rot_dim, io->neox);
      kv->k_scale[dst / hd] = attn_quant_row(kv->k8 + dst, kr, hd);
      kv->v_scale[dst / hd] = attn_quant_row(kv->v8 + dst, io->v + src, hd);
    }
  }
}

/* attn_dot with y dequantised (times its scale, applied by the caller). */
static float attn_dot_i8(const float *restrict x, const int8_t *restrict y, int64_t n) {
  float acc[KN_ATTN_LANES] = {0};
  int64_t i = 0;
  for (; i + KN_ATTN_LANES <= n; i += KN_ATTN_LANES)
    for (int l = 0; l < KN_ATTN_LANES; l++) acc[l] += x[i + l] * (float)y[i + l];
  for (int w = KN_ATTN_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) acc[l] += acc[l + w];
  float s = acc[0];
  for (; i < n; i++) s += x[i] * (float)y[i];
  return s;
}

static void attn_state_add_i8(attn_state *restrict st, float score, const int8_t *restrict v,
                              float v_scale, int64_t dn) {
  if (score > st->max) {
    float corr = expf(st->max - score);
    st->sum *= corr;
    for (int64_t d = 0; d < dn; d++) st->acc[d] *= corr;
    st->max = score;
  }
  float w = expf(score - st->max);
  st->sum += w;
  float wv = w * v_scale;
  for (int64_t d = 0; d < dn; d++) st->acc[d] += wv * (float)v[d];
}

/* attn_head_slice over the int8 cache. */
static void attn_head_slice_i8(const attn_args *a, int64_t t, int64_t h, int64_t d0,
                               int64_t dn) {
  const kn_kv_layer *kv = a->kv;
  int64_t hd = kv->head_dim, bs = kv->block_size;
  int64_t kvh = h / (a->n_heads / kv->n_kv_heads);
  int64_t seq = a->b->tok_seq[t], n_pos = (int64_t)a->b->tok_pos[t] + 1;
  const kn_attn_io *io = a->io;
  const float *q = io->q + t * io->q_stride + h * hd;
  float qr[KN_ATTN_DSLICE];
  if (io->cos_sin) {
    memcpy(qr, q, (size_t)hd * sizeof *qr);
    kn_rope_head(qr, io->cos_sin + (int64_t)io->pos[t] * io->rot_dim, io->rot_dim, io->neox);
    q = qr;
  }
  attn_state st = {.max = -INFINITY, .sum = 0.0f};
  for (int64_t j0 = 0; j0 < n_pos; j0 += bs) {
    int64_t row = attn_cache_off(kv, attn_block(a->b, seq, j0 / bs), kvh, 0) / hd;
    int64_t n_slot = n_pos - j0 < bs ? n_pos - j0 : bs;
    for (int64_t s = 0; s < n_slot; s++) {
      int64_t off = (row + s) * hd;
      float score = attn_dot_i8(q, kv->k8 + off, hd) * kv->k_scale[row + s] * a->scale;
      attn_state_add_i8(&st, score, kv->v8 + off + d0, kv->v_scale[row + s], dn);
    }
  }
  float *out = a->out + (t * a->n_heads + h) * hd + d0;
  float inv = 1.0f / st.sum;
  for (int64_t d = 0; d < dn; d++) out[d] = st.acc[d] * inv;
}

static void attn_head_task_i8(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const attn_args *a = arg;
  int64_t hd = a->kv->head_dim;
  for (int64_t th = begin; th < end; th++)
    for (int64_t d0 = 0; d0 < hd; d0 += KN_ATTN_DSLICE)
      attn_head_slice_i8(a, th / a->n_heads, th % a->n_heads, d0,
                         hd - d0 < KN_ATTN_DSLICE ? hd - d0 : KN_ATTN_DSLICE);
}

/* Sizes chunks by the actual context lengths: a decode step over long contexts splits
 * down to single heads, a short prefill batches many. */
static int64_t attn_head_grain(const kn_attn_batch *b, int64_t n_heads, int64_t hd) {
  int64_t ctx = 0;
  for (int64_t t = 0; t < b->n_tok; t++) ctx += (int64_t)b->tok_pos[t] + 1;
  int64_t work = ctx * n_heads * hd; /* ~ multiply-adds for q.k, and as many for p.v */
  int64_t units = b->n_tok * n_heads;
  if (work <= 0) return 1;
  return 1 + units * KN_ATTN_MIN_WORK / work;
}

void kn_attention_paged(kn_pool *p, float *out, const float *q, const float *k_new,
                        const float *v_new, const kn_kv_layer *kv, const kn_attn_batch *b,
                        int64_t n_heads, float scale) {
  kn_attn_io io = {.q = q, .k = k_new, .v = v_new, .q_stride = n_heads * kv->head_dim,
                   .kv_stride = kv->n_kv_heads * kv->head_dim};
  kn_attention_paged_io(p, out, &io, kv, b, n_heads, scale);
}

void kn_attention_paged_io(kn_pool *p, float *out, const kn_attn_io *io, const kn_kv_layer *kv,
                           const kn_attn_batch *b, int64_t n_heads, float scale) {
  attn_args a = {.out = out, .io = io, .kv = kv, .b = b, .n_heads = n_heads, .scale = scale};
  int64_t row = kv->n_kv_heads * kv->head_dim;
  /* Every write lands before any read: a token may attend to positions written by
   * other tokens of the same step (prefill chunks). */
  kn_parallel_for(p, b->n_tok, row > 0 ? 1 + KN_ATTN_MIN_WORK / row : 1,
                  kv->k8 ? attn_write_task_i8 : attn_write_task, &a);
  kn_parallel_for(p, b->n_tok * n_heads, attn_head_grain(b, n_heads, kv->head_dim),
                  kv->k8 ? attn_head_task_i8 : attn_head_task, &a);
}
