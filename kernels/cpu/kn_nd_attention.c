/* kn_nd_attention: ONNX Attention (opset 23/24) over dense 3-d or 4-d q, k, v with
 * optional past KV, mask, causal and padding limits, soft-capping and GQA; and ONNX
 * RotaryEmbedding. One task per (batch, head, query row) with an online softmax, so no
 * scratch is needed and a row's result does not depend on the thread count. A row whose
 * keys are all masked out yields zeros (not NaN). */
#include <math.h>

#include "kn_nd_util.h"

enum { KN_ATTN_MIN_WORK = 4096 };

/* q, k or v in either layout: rows of d contiguous values. */
typedef struct rows {
  const float *p;
  bool is3; /* [B, len, heads*d] instead of [B, heads, len, d] */
  int64_t heads, len, d;
} rows;

static const float *row_at(const rows *r, int64_t b, int64_t h, int64_t t) {
  int64_t i = r->is3 ? (b * r->len + t) * r->heads + h : (b * r->heads + h) * r->len + t;
  return r->p + i * r->d;
}

typedef struct attn_args {
  kn_attn_params prm;
  rows q, k, v, pk, pv; /* pk/pv.p NULL without past */
  int64_t b, s, t, p;   /* batch, query rows, total keys, past keys */
  float *y, *qk;
  bool y3;
  const kn_view *mask, *nonpad;
  int64_t mst[4], mcols; /* mask strides over [B, Hq, S, T] (0: broadcast), its columns */
} attn_args;

static const float *key_row(const attn_args *a, const rows *cur, const rows *past, int64_t b,
                            int64_t h, int64_t t) {
  return t < a->p ? row_at(past, b, h, t) : row_at(cur, b, h, t - a->p);
}

/* Score of query row qr against key t, soft-capped, before the mask. */
static float score(const attn_args *a, const float *qr, int64_t b, int64_t kvh, int64_t t) {
  const float *kr = key_row(a, &a->k, &a->pk, b, kvh, t);
  float s = 0.0f;
  for (int64_t j = 0; j < a->q.d; j++) s += qr[j] * kr[j];
  s *= a->prm.scale;
  if (a->prm.softcap > 0) s = a->prm.softcap * tanhf(s / a->prm.softcap);
  return s;
}

/* Additive bias of (b, h, i, t): 0, a float mask value, or -inf when masked out. */
static float bias(const attn_args *a, int64_t b, int64_t h, int64_t i, int64_t t) {
  int64_t limit = a->t;
  if (a->nonpad) limit = ((const int64_t *)a->nonpad->data)[b];
  if (t >= limit) return -INFINITY;
  if (a->prm.causal) {
    int64_t off = a->p ? a->p : a->nonpad ? limit - a->s : 0;
    if (t > i + off) return -INFINITY;
  }
  if (!a->mask) return 0.0f;
  if (t >= a->mcols) return -INFINITY;
  int64_t m = b * a->mst[0] + h * a->mst[1] + i * a->mst[2] + t * a->mst[3];
  if (a->mask->dt == IR_U8) return ((const uint8_t *)a->mask->data)[m] ? 0.0f : -INFINITY;
  return ((const float *)a->mask->data)[m];
}

static void attn_row(const attn_args *a, int64_t b, int64_t h, int64_t i) {
  int64_t kvh = h / (a->prm.q_heads / a->prm.kv_heads), dv = a->v.d;
  const float *qr = row_at(&a->q, b, h, i);
  int64_t hq = a->prm.q_heads, yrow = a->y3 ? (b * a->s + i) * hq + h : (b * hq + h) * a->s + i;
  float *y = a->y + yrow * dv;
  float *qk = a->qk ? a->qk + ((b * a->prm.q_heads + h) * a->s + i) * a->t : NULL;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < dv; j++) y[j] = 0.0f;
  for (int64_t t = 0; t < a->t; t++) {
    float s = score(a, qr, b, kvh, t), z = s + bias(a, b, h, i, t);
    if (qk && a->prm.qk_mode <= 1) qk[t] = s;
    if (qk && a->prm.qk_mode == 2) qk[t] = z;
    if (!(z > -INFINITY)) continue; /* masked out (or NaN): no weight */
    if (z > m) {                    /* new running max: rescale what has been accumulated */
      float c = expf(m - z);
      l *= c;
      for (int64_t j = 0; j < dv; j++) y[j] *= c;
      m = z;
    }
    float w = expf(z - m);
    const float *vr = key_row(a, &a->v, &a->pv, b, kvh, t);
    l += w;
    for (int64_t j = 0; j < dv; j++) y[j] += w * vr[j];
  }
  float inv = l > 0 ? 1.0f / l : 0.0f;
  for (int64_t j = 0; j < dv; j++) y[j] *= inv;
  if (qk && a->prm.qk_mode == 3)
    for (int64_t t = 0; t < a->t; t++) {
      float z = score(a, qr, b, kvh, t) + bias(a, b, h, i, t);
      qk[t] = z > -INFINITY && l > 0 ? expf(z - m) * inv : 0.0f;
    }
}

static void attn_task(void *arg, int64_t b, int64_t e, int tid) {
  const attn_args *a = arg;
  int64_t per_b = a->prm.q_heads * a->s;
  for (int64_t r = b; r < e; r++) attn_row(a, r / per_b, (r % per_b) / a->s, r % a->s);
}

static void present(const attn_args *a, const kn_view *out, const rows *cur, const rows *past) {
  if (!out || !out->data) return;
  float *dst = out->data;
  for (int64_t b = 0; b < a->b; b++)
    for (int64_t h = 0; h < a->prm.kv_heads; h++)
      for (int64_t t = 0; t < a->t; t++, dst += cur->d)
        memcpy(dst, key_row(a, cur, past, b, h, t), (size_t)cur->d * sizeof(float));
}

static rows rows_of(const kn_view *v, int64_t heads) {
  if (!v || !v->data) return (rows){0};
  bool is3 = v->rank == 3;
  return (rows){.p = v->data,
                .is3 = is3,
                .heads = heads,
                .len = v->shape[is3 ? 1 : 2],
                .d = is3 ? v->shape[2] / heads : v->shape[3]};
}

static void mask_strides(attn_args *a) {
  const kn_view *m = a->mask;
  int64_t st[IR_MAX_RANK];
  kn_strides(m, st);
  int off = 4 - m->rank;
  for (int i = 0; i < 4; i++)
    a->mst[i] = i < off || (i < 3 && m->shape[i - off] == 1) ? 0 : st[i - off];
  a->mcols = m->shape[m->rank - 1];
}

bool kn_nd_attention(kn_pool *p, const kn_attn_params *prm, const kn_view *y,
                     const kn_view *present_k, const kn_view *present_v, const kn_view *qk,
                     const kn_view *q, const kn_view *k, const kn_view *v, const kn_view *mask,
                     const kn_view *past_k, const kn_view *past_v, const kn_view *nonpad,
                     ir_diag *d) {
  attn_args a = {
      .prm = *prm, .y = y->data, .y3 = q->rank == 3, .qk = qk && qk->data ? qk->data : NULL};
  a.q = rows_of(q, prm->q_heads);
  a.k = rows_of(k, prm->kv_heads);
  a.v = rows_of(v, prm->kv_heads);
  a.pk = rows_of(past_k, prm->kv_heads);
  a.pv = rows_of(past_v, prm->kv_heads);
  a.b = q->shape[0];
  a.s = a.q.len;
  a.p = a.pk.p ? a.pk.len : 0;
  a.t = a.p + a.k.len;
  a.mask = mask && mask->data ? mask : NULL;
  a.nonpad = nonpad && nonpad->data ? nonpad : NULL;
  if (a.mask) mask_strides(&a);
  for (int64_t b = 0; a.nonpad && b < a.b; b++) {
    int64_t n = ((const int64_t *)a.nonpad->data)[b];
    if (n < 0 || n > a.t) {
      ir_diag_set(d, IR_INVALID_ARG, "nonpad_kv_seqlen[%lld] = %lld is outside [0, %lld]",
                  (long long)b, (long long)n, (long long)a.t);
      return false;
    }
  }
  present(&a, present_k, &a.k, &a.pk);
  present(&a, present_v, &a.v, &a.pv);
  kn_parallel_for(p, a.b * prm->q_heads * a.s, kn_grain(a.t * (a.q.d + a.v.d), KN_ATTN_MIN_WORK),
                  attn_task, &a);
  return true;
}

/* --- rotary embedding ------------------------------------------------------------------ */

typedef struct rot_args {
  const float *x, *cs, *sn;
  float *y;
  const kn_view *pos;
  bool is3, inter;
  int64_t b, h, s, d, half, n_pos;
} rot_args;

static void rot_task(void *arg, int64_t bgn, int64_t e, int tid) {
  const rot_args *a = arg;
  for (int64_t r = bgn; r < e; r++) { /* r = (b, s, h) */
    int64_t b = r / (a->s * a->h), s = (r / a->h) % a->s, h = r % a->h;
    int64_t ri = a->is3 ? (b * a->s + s) * a->h + h : (b * a->h + h) * a->s + s;
    int64_t ci = a->pos ? kn_get_i64(a->pos->data, a->pos->dt, b * a->s + s) : b * a->s + s;
    const float *x = a->x + ri * a->d, *c = a->cs + ci * a->half, *sn = a->sn + ci * a->half;
    float *y = a->y + ri * a->d;
    for (int64_t i = 0; i < a->half; i++) {
      int64_t i1 = a->inter ? 2 * i : i, i2 = a->inter ? 2 * i + 1 : i + a->half;
      float x1 = x[i1], x2 = x[i2];
      y[i1] = c[i] * x1 - sn[i] * x2;
      y[i2] = sn[i] * x1 + c[i] * x2;
    }
    for (int64_t i = 2 * a->half; i < a->d; i++) y[i] = x[i];
  }
}

bool kn_nd_rotary(kn_pool *p, const kn_view *y, const kn_view *x, const kn_view *cos_c,
                  const kn_view *sin_c, const kn_view *pos, int64_t num_heads, int64_t rot_dim,
                  bool interleaved, ir_diag *d) {
  bool is3 = x->rank == 3;
  rot_args a = {.x = x->data,
                .cs = cos_c->data,
                .sn = sin_c->data,
                .y = y->data,
                .pos = pos && pos->data ? pos : NULL,
                .is3 = is3,
                .inter = interleaved,
                .b = x->shape[0],
                .h = is3 ? num_heads : x->shape[1],
                .s = x->shape[is3 ? 1 : 2]};
  a.d = is3 ? x->shape[2] / a.h : x->shape[3];
  a.half = (rot_dim ? rot_dim : a.d) / 2;
  a.n_pos = cos_c->shape[0];
  for (int64_t i = 0; a.pos && i < a.b * a.s; i++) {
    int64_t v = kn_get_i64(a.pos->data, a.pos->dt, i);
    if (v < 0 || v >= a.n_pos) {
      ir_diag_set(d, IR_INVALID_ARG, "position id %lld is outside the cache of %lld", (long long)v,
                  (long long)a.n_pos);
      return false;
    }
  }
  kn_parallel_for(p, a.b * a.s * a.h, kn_grain(a.d, KN_ATTN_MIN_WORK), rot_task, &a);
  return true;
}
