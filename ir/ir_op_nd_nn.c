/* ir_op_nd_nn: shape and type inference of the n-d linear-algebra and network ops.
 *
 * Contracts (all f32 unless stated; shapes static; numpy broadcasting):
 *   matmul(a, b)  numpy matmul: 1-d operands are promoted and the added dim dropped,
 *                 batch dims broadcast                          -> batch + [M, N]
 *   gemm(a [M,K] ([K,M] if trans_a), b [K,N] ([N,K] if trans_b), c? broadcasting to
 *        [M,N]; alpha, beta, trans_a, trans_b)                  -> [M,N] = alpha*a.b + beta*c
 *   layer_norm(x, scale, bias?; axis, eps, n_out 1..3)          -> y like x, mean and
 *        inv_std x[:axis] + 1s; normalises over axes >= axis; scale and bias broadcast
 *        to x[axis:]
 *   skip_layer_norm(x [.., H], skip broadcasting to x, gamma [H], beta? [H], bias? [H];
 *        eps, n_out 1..4)  (com.microsoft)   -> y like x, mean, inv_std x[:-1] + [1],
 *        sum = x + skip + bias like x; y = layer_norm(sum) over the last axis
 *   rms_norm(x, scale broadcasting to x[axis:]; axis, eps)      -> like x
 *   attention(q, k, v, mask?, past_k?, past_v?, nonpad_kv_seqlen? i64 [B];
 *        q_num_heads, kv_num_heads, scale, softcap (0: none), is_causal, qk_mode 0..3,
 *        n_out 1..4)  (ONNX Attention-23/24)
 *        q [B,Hq,S,D] or [B,S,Hq*D]; k [B,Hkv,L,D] or [B,L,Hkv*D]; v likewise with Dv;
 *        past_k [B,Hkv,P,D], past_v [B,Hkv,P,Dv]; T = P + L; Hq a multiple of Hkv;
 *        mask f32 (added) or u8 (bool: 0 masks out), rank <= 4, last dim <= T (the rest
 *        masked out), broadcasting to [B,Hq,S,T]
 *        -> y like q with Dv per head, present_k [B,Hkv,T,D], present_v [B,Hkv,T,Dv],
 *           qk [B,Hq,S,T] (qk_mode 0, 1: q.k scaled and soft-capped; 2: plus mask;
 *           3: the softmax)
 *   rotary_embedding(x [B,H,S,D] or [B,S,H*D], cos, sin, pos? i64|i32 [B,S];
 *        interleaved, num_heads (3-d x), rot_dim (0: D))
 *        cos, sin [P, rot_dim/2] indexed by pos, or [B, S, rot_dim/2] without pos -> like x */
#include <string.h>

#include "ir_op_nd_infer.h"

#define F32 IR_DT_BIT(IR_F32)

static bool same_shape(int ra, const int64_t *a, int rb, const int64_t *b) {
  if (ra != rb) return false;
  for (int i = 0; i < ra; i++)
    if (a[i] != b[i]) return false;
  return true;
}

/* t broadcasts (one-way) to the shape [rank, s]. */
static bool broadcasts_to(const nd_in *t, int rank, const int64_t *s) {
  int r;
  int64_t out[IR_MAX_RANK];
  return ir_nd_broadcast(t->rank, t->s, rank, s, &r, out) && same_shape(r, out, rank, s);
}

static ir_status infer_matmul(nd_ctx *c) {
  nd_in a, b;
  ir_status st = nd_input(c, 0, true, F32, &a);
  if (st == IR_OK) st = nd_input(c, 1, true, F32, &b);
  if (st != IR_OK) return st;
  if (a.rank < 1 || b.rank < 1) return nd_fail(c, IR_BAD_FORMAT, "matmul of a scalar");
  int64_t m = a.rank == 1 ? 1 : a.s[a.rank - 2], ka = a.s[a.rank - 1];
  int64_t kb = b.rank == 1 ? b.s[0] : b.s[b.rank - 2], n = b.rank == 1 ? 1 : b.s[b.rank - 1];
  if (ka != kb)
    return nd_fail(c, IR_BAD_FORMAT, "inner dims differ (%lld vs %lld)", (long long)ka,
                   (long long)kb);
  int rb = 0, ab = a.rank > 2 ? a.rank - 2 : 0, bb = b.rank > 2 ? b.rank - 2 : 0;
  int64_t shape[IR_MAX_RANK + 2];
  if (!ir_nd_broadcast(ab, a.s, bb, b.s, &rb, shape))
    return nd_fail(c, IR_BAD_FORMAT, "batch dims do not broadcast");
  int r = rb;
  if (a.rank > 1) shape[r++] = m;
  if (b.rank > 1) shape[r++] = n;
  if (r > IR_MAX_RANK) return nd_fail(c, IR_UNSUPPORTED, "result rank %d", r);
  nd_output(c, 0, IR_F32, r, shape);
  return IR_OK;
}

static ir_status infer_gemm(nd_ctx *c) {
  nd_in a, b, bias;
  ir_status st = nd_input(c, 0, true, F32, &a);
  if (st == IR_OK) st = nd_input(c, 1, true, F32, &b);
  if (st == IR_OK) st = nd_input(c, 2, false, F32, &bias);
  if (st != IR_OK) return st;
  if (a.rank != 2 || b.rank != 2) return nd_fail(c, IR_BAD_FORMAT, "gemm takes 2-d a and b");
  bool ta = nd_attr_i(c, "trans_a", 0) != 0, tb = nd_attr_i(c, "trans_b", 0) != 0;
  int64_t shape[2] = {ta ? a.s[1] : a.s[0], tb ? b.s[0] : b.s[1]};
  if ((ta ? a.s[0] : a.s[1]) != (tb ? b.s[1] : b.s[0]))
    return nd_fail(c, IR_BAD_FORMAT, "inner dims of a and b differ");
  if (bias.t && !broadcasts_to(&bias, 2, shape))
    return nd_fail(c, IR_BAD_FORMAT, "c does not broadcast to [M, N]");
  nd_output(c, 0, IR_F32, 2, shape);
  return IR_OK;
}

/* Shared by the norms: x and the axis; stats shape x[:axis] + 1s. */
static ir_status norm_common(nd_ctx *c, nd_in *x, int *axis, int64_t *stats) {
  ir_status st = nd_input(c, 0, true, F32, x);
  if (st != IR_OK) return st;
  if (x->rank == 0) return nd_fail(c, IR_BAD_FORMAT, "needs an input of rank >= 1");
  if (!nd_axis(c, nd_attr_i(c, "axis", -1), x->rank, axis)) return c->d->status;
  for (int i = 0; i < x->rank; i++) stats[i] = i < *axis ? x->s[i] : 1;
  return IR_OK;
}

static ir_status infer_layer_norm(nd_ctx *c, bool rms) {
  nd_in x, scale, bias;
  int axis, n_out = 1;
  int64_t stats[IR_MAX_RANK];
  ir_status st = norm_common(c, &x, &axis, stats);
  if (st == IR_OK) st = nd_input(c, 1, true, F32, &scale);
  if (st == IR_OK) st = nd_input(c, 2, false, F32, &bias);
  if (st != IR_OK) return st;
  if (rms && bias.t) return nd_fail(c, IR_BAD_FORMAT, "rms_norm takes no bias");
  int nr = x.rank - axis;
  if (!broadcasts_to(&scale, nr, x.s + axis) || (bias.t && !broadcasts_to(&bias, nr, x.s + axis)))
    return nd_fail(c, IR_BAD_FORMAT, "scale or bias does not broadcast to the normalised dims");
  if (!rms && !nd_n_out(c, 1, 3, &n_out)) return c->d->status;
  nd_output(c, 0, IR_F32, x.rank, x.s);
  for (int i = 1; i < n_out; i++) nd_output(c, i, IR_F32, x.rank, stats);
  return IR_OK;
}

static ir_status infer_skip_layer_norm(nd_ctx *c) {
  nd_in x, skip, gamma, beta, bias;
  int n_out;
  ir_status st = nd_input(c, 0, true, F32, &x);
  if (st == IR_OK) st = nd_input(c, 1, true, F32, &skip);
  if (st == IR_OK) st = nd_input(c, 2, true, F32, &gamma);
  if (st == IR_OK) st = nd_input(c, 3, false, F32, &beta);
  if (st == IR_OK) st = nd_input(c, 4, false, F32, &bias);
  if (st != IR_OK) return st;
  if (x.rank < 1) return nd_fail(c, IR_BAD_FORMAT, "needs an input of rank >= 1");
  int64_t h = x.s[x.rank - 1], stats[IR_MAX_RANK];
  int lead = 0; /* skip is x's trailing dims, after any leading 1s */
  while (lead < skip.rank && skip.s[lead] == 1) lead++;
  int tail = skip.rank - lead;
  bool skip_ok = skip.rank <= x.rank && (tail > 0 || x.s[x.rank - 1] == 1);
  for (int i = 0; skip_ok && i < tail; i++) skip_ok = skip.s[lead + i] == x.s[x.rank - tail + i];
  if (!skip_ok)
    return nd_fail(c, IR_BAD_FORMAT, "skip must have the input's shape or its trailing dims");
  const nd_in *vec[3] = {&gamma, &beta, &bias};
  for (int i = 0; i < 3; i++)
    if (vec[i]->t && (vec[i]->rank != 1 || vec[i]->s[0] != h))
      return nd_fail(c, IR_BAD_FORMAT, "'%s' must be [%lld]", vec[i]->t->name, (long long)h);
  if (!nd_n_out(c, 1, 4, &n_out)) return c->d->status;
  memcpy(stats, x.s, sizeof stats);
  stats[x.rank - 1] = 1;
  nd_output(c, 0, IR_F32, x.rank, x.s);
  for (int i = 1; i < n_out; i++) nd_output(c, i, IR_F32, x.rank, i == 3 ? x.s : stats);
  return IR_OK;
}

/* Attention geometry, resolved from the 3-d or 4-d operands. */
typedef struct attn_geom {
  int64_t b, hq, hkv, s, l, d, dv, p;
} attn_geom;

static ir_status attn_heads(nd_ctx *c, const nd_in *q, const nd_in *k, const nd_in *v,
                            attn_geom *g) {
  g->hq = nd_attr_i(c, "q_num_heads", 0);
  g->hkv = nd_attr_i(c, "kv_num_heads", 0);
  if (q->rank != k->rank || q->rank != v->rank || (q->rank != 3 && q->rank != 4))
    return nd_fail(c, IR_BAD_FORMAT, "q, k, v must all be 3-d or all 4-d");
  if (q->rank == 4) {
    if (!g->hq) g->hq = q->s[1];
    if (!g->hkv) g->hkv = k->s[1];
    if (q->s[1] != g->hq || k->s[1] != g->hkv || v->s[1] != g->hkv)
      return nd_fail(c, IR_BAD_FORMAT, "head counts disagree with the attributes");
    *g = (attn_geom){.b = q->s[0],
                     .hq = g->hq,
                     .hkv = g->hkv,
                     .s = q->s[2],
                     .l = k->s[2],
                     .d = q->s[3],
                     .dv = v->s[3]};
    if (k->s[3] != g->d || v->s[2] != g->l || k->s[0] != g->b || v->s[0] != g->b)
      return nd_fail(c, IR_BAD_FORMAT, "q, k, v shapes disagree");
    return IR_OK;
  }
  if (g->hq <= 0 || g->hkv <= 0 || q->s[2] % g->hq || k->s[2] % g->hkv || v->s[2] % g->hkv)
    return nd_fail(c, IR_BAD_FORMAT,
                   "3-d q, k, v need q_num_heads and kv_num_heads dividing "
                   "their hidden sizes");
  *g = (attn_geom){.b = q->s[0],
                   .hq = g->hq,
                   .hkv = g->hkv,
                   .s = q->s[1],
                   .l = k->s[1],
                   .d = q->s[2] / g->hq,
                   .dv = v->s[2] / g->hkv};
  if (k->s[2] / g->hkv != g->d || v->s[1] != g->l || k->s[0] != g->b || v->s[0] != g->b)
    return nd_fail(c, IR_BAD_FORMAT, "q, k, v shapes disagree");
  return IR_OK;
}

static ir_status attn_extras(nd_ctx *c, attn_geom *g) {
  nd_in mask, pk, pv, nonpad;
  ir_status st = nd_input(c, 3, false, F32 | IR_DT_BIT(IR_U8), &mask);
  if (st == IR_OK) st = nd_input(c, 4, false, F32, &pk);
  if (st == IR_OK) st = nd_input(c, 5, false, F32, &pv);
  if (st == IR_OK) st = nd_input(c, 6, false, IR_DT_BIT(IR_I64), &nonpad);
  if (st != IR_OK) return st;
  if (!pk.t != !pv.t) return nd_fail(c, IR_BAD_FORMAT, "past_key and past_value come together");
  if (pk.t) {
    g->p = pk.rank == 4 ? pk.s[2] : -1;
    int64_t wk[4] = {g->b, g->hkv, g->p, g->d}, wv[4] = {g->b, g->hkv, g->p, g->dv};
    if (!same_shape(pk.rank, pk.s, 4, wk) || !same_shape(pv.rank, pv.s, 4, wv))
      return nd_fail(c, IR_BAD_FORMAT, "past_key / past_value must be [B, Hkv, P, D]");
  }
  int64_t t = g->p + g->l;
  if (mask.t) {
    int64_t full[4] = {g->b, g->hq, g->s, t}, m[IR_MAX_RANK];
    memcpy(m, mask.s, sizeof m);
    if (mask.rank < 1 || mask.rank > 4 || m[mask.rank - 1] > t)
      return nd_fail(c, IR_BAD_FORMAT, "mask must have rank 1..4 and at most %lld columns",
                     (long long)t);
    m[mask.rank - 1] = t;
    nd_in padded = mask;
    memcpy(padded.s, m, sizeof m);
    if (!broadcasts_to(&padded, 4, full))
      return nd_fail(c, IR_BAD_FORMAT, "mask does not broadcast to [B, Hq, S, T]");
  }
  if (nonpad.t && (nonpad.rank != 1 || nonpad.s[0] != g->b))
    return nd_fail(c, IR_BAD_FORMAT, "nonpad_kv_seqlen must be [B]");
  return IR_OK;
}

static ir_status infer_attention(nd_ctx *c) {
  nd_in q, k, v;
  attn_geom g = {0};
  int n_out;
  ir_status st = nd_input(c, 0, true, F32, &q);
  if (st == IR_OK) st = nd_input(c, 1, true, F32, &k);
  if (st == IR_OK) st = nd_input(c, 2, true, F32, &v);
  if (st == IR_OK) st = attn_heads(c, &q, &k, &v, &g);
  if (st == IR_OK) st = attn_extras(c, &g);
  if (st != IR_OK) return st;
  if (g.hq % g.hkv) return nd_fail(c, IR_BAD_FORMAT, "q heads must be a multiple of kv heads");
  int64_t mode = nd_attr_i(c, "qk_mode", 0);
  if (mode < 0 || mode > 3)
    return nd_fail(c, IR_UNSUPPORTED, "qk_matmul_output_mode %lld", (long long)mode);
  if (!nd_n_out(c, 1, 4, &n_out)) return c->d->status;
  int64_t t = g.p + g.l;
  int64_t y4[4] = {g.b, g.hq, g.s, g.dv}, y3[3] = {g.b, g.s, g.hq * g.dv};
  int64_t pk[4] = {g.b, g.hkv, t, g.d}, pv[4] = {g.b, g.hkv, t, g.dv}, qk[4] = {g.b, g.hq, g.s, t};
  nd_output(c, 0, IR_F32, q.rank, q.rank == 4 ? y4 : y3);
  if (n_out > 1) nd_output(c, 1, IR_F32, 4, pk);
  if (n_out > 2) nd_output(c, 2, IR_F32, 4, pv);
  if (n_out > 3) nd_output(c, 3, IR_F32, 4, qk);
  return IR_OK;
}

static ir_status infer_rotary(nd_ctx *c) {
  nd_in x, cs, sn, pos;
  ir_status st = nd_input(c, 0, true, F32, &x);
  if (st == IR_OK) st = nd_input(c, 1, true, F32, &cs);
  if (st == IR_OK) st = nd_input(c, 2, true, F32, &sn);
  if (st == IR_OK) st = nd_input(c, 3, false, IR_DT_BIT(IR_I64) | IR_DT_BIT(IR_I32), &pos);
  if (st != IR_OK) return st;
  if (x.rank != 3 && x.rank != 4) return nd_fail(c, IR_BAD_FORMAT, "x must be 3-d or 4-d");
  int64_t nh = x.rank == 4 ? x.s[1] : nd_attr_i(c, "num_heads", 0);
  if (nh <= 0 || (x.rank == 3 && x.s[2] % nh))
    return nd_fail(c, IR_BAD_FORMAT, "3-d x needs num_heads dividing its hidden size");
  int64_t b = x.s[0], s = x.s[x.rank == 4 ? 2 : 1], d = x.rank == 4 ? x.s[3] : x.s[2] / nh;
  int64_t rot = nd_attr_i(c, "rot_dim", 0);
  if (rot == 0) rot = d;
  if (rot < 0 || rot > d || rot % 2) return nd_fail(c, IR_BAD_FORMAT, "bad rotary_embedding_dim");
  if (!same_shape(cs.rank, cs.s, sn.rank, sn.s) || cs.s[cs.rank - 1] != rot / 2)
    return nd_fail(c, IR_BAD_FORMAT, "cos and sin caches must match, with %lld columns",
                   (long long)(rot / 2));
  int64_t want_pos[2] = {b, s}, want_cache[3] = {b, s, rot / 2};
  if (pos.t ? (cs.rank != 2 || !same_shape(pos.rank, pos.s, 2, want_pos))
            : !same_shape(cs.rank, cs.s, 3, want_cache))
    return nd_fail(c, IR_BAD_FORMAT,
                   "caches must be [P, k/2] with position ids [B, S], or "
                   "[B, S, k/2] without");
  nd_output(c, 0, IR_F32, x.rank, x.s);
  return IR_OK;
}

/* strides, pads (begins then ends), dilations of k spatial dims, defaults 1, 0, 1. */
static bool window_attrs(nd_ctx *c, int k, int64_t *st, int64_t *pads, int64_t *dil) {
  int ns = 0, np = 0, nd = 0;
  const int64_t *s = ir_node_attr_ints(c->n, "strides", &ns);
  const int64_t *p = ir_node_attr_ints(c->n, "pads", &np);
  const int64_t *dl = ir_node_attr_ints(c->n, "dilations", &nd);
  if ((s && ns != k) || (p && np != 2 * k) || (dl && nd != k)) {
    nd_fail(c, IR_BAD_FORMAT, "strides, pads or dilations do not match %d spatial dims", k);
    return false;
  }
  for (int i = 0; i < k; i++) {
    st[i] = s ? s[i] : 1;
    dil[i] = dl ? dl[i] : 1;
    pads[i] = p ? p[i] : 0;
    pads[k + i] = p ? p[k + i] : 0;
    if (st[i] < 1 || dil[i] < 1 || pads[i] < 0 || pads[k + i] < 0 || st[i] > (1 << 20) ||
        dil[i] > (1 << 20) || pads[i] > (1 << 20) || pads[k + i] > (1 << 20)) {
      nd_fail(c, IR_BAD_FORMAT, "bad stride, pad or dilation");
      return false;
    }
  }
  return true;
}

/* Output extent of a window of `ks` taps over `in` (ceil: a last partial window counts when
 * it starts inside the input or its begin pad). */
static int64_t window_out(int64_t in, int64_t ks, int64_t st, int64_t pb, int64_t pe, int64_t dil,
                          bool ceil_mode) {
  int64_t span = (ks - 1) * dil + 1, room = in + pb + pe - span;
  if (room < 0) return 0;
  int64_t o = (ceil_mode ? (room + st - 1) / st : room / st) + 1;
  if (ceil_mode && (o - 1) * st >= in + pb) o--;
  return o;
}

/* conv(x[N,C,s..], w[M,C/group,k..], b[M]?; strides, pads, dilations, group) -> [N,M,o..] */
static ir_status infer_conv(nd_ctx *c) {
  nd_in x, w, b;
  ir_status st = nd_input(c, 0, true, F32, &x);
  if (st == IR_OK) st = nd_input(c, 1, true, F32, &w);
  if (st == IR_OK) st = nd_input(c, 2, false, F32, &b);
  if (st != IR_OK) return st;
  int k = x.rank - 2;
  int64_t g = nd_attr_i(c, "group", 1), str[3], pads[6], dil[3], y[IR_MAX_RANK];
  if (k < 1 || k > 3 || w.rank != x.rank)
    return nd_fail(c, IR_UNSUPPORTED, "conv needs 1 to 3 spatial dims, x and w of one rank");
  if (g < 1 || x.s[1] % g || w.s[0] % g || w.s[1] * g != x.s[1])
    return nd_fail(c, IR_BAD_FORMAT,
                   "channels %lld, weight [%lld, %lld, ..] and group %lld disagree",
                   (long long)x.s[1], (long long)w.s[0], (long long)w.s[1], (long long)g);
  if (b.t && (b.rank != 1 || b.s[0] != w.s[0]))
    return nd_fail(c, IR_BAD_FORMAT, "bias must be [%lld]", (long long)w.s[0]);
  if (!window_attrs(c, k, str, pads, dil)) return c->d->status;
  y[0] = x.s[0];
  y[1] = w.s[0];
  for (int i = 0; i < k; i++) {
    y[2 + i] = window_out(x.s[2 + i], w.s[2 + i], str[i], pads[i], pads[k + i], dil[i], false);
    if (y[2 + i] < 1 || w.s[2 + i] < 1)
      return nd_fail(c, IR_BAD_FORMAT, "the kernel does not fit spatial dim %d", i);
  }
  nd_output(c, 0, IR_F32, x.rank, y);
  return IR_OK;
}

/* pool(x[N,C,s..]; kernel, strides, pads, dilations, ceil_mode, mode 0 max | 1 average,
 * count_include_pad) -> [N,C,o..] */
static ir_status infer_pool(nd_ctx *c) {
  nd_in x;
  ir_status st = nd_input(c, 0, true, F32, &x);
  if (st != IR_OK) return st;
  int k = x.rank - 2, nk = 0;
  const int64_t *ks = ir_node_attr_ints(c->n, "kernel", &nk);
  int64_t str[3], pads[6], dil[3], y[IR_MAX_RANK], mode = nd_attr_i(c, "mode", 0);
  if (k < 1 || k > 3 || !ks || nk != k || mode < 0 || mode > 1)
    return nd_fail(c, IR_UNSUPPORTED, "pool needs 1 to 3 spatial dims and a kernel for each");
  if (!window_attrs(c, k, str, pads, dil)) return c->d->status;
  y[0] = x.s[0];
  y[1] = x.s[1];
  for (int i = 0; i < k; i++) {
    if (ks[i] < 1 || pads[i] >= ks[i] || pads[k + i] >= ks[i])
      return nd_fail(c, IR_BAD_FORMAT, "kernel %lld with pads %lld, %lld", (long long)ks[i],
                     (long long)pads[i], (long long)pads[k + i]);
    y[2 + i] = window_out(x.s[2 + i], ks[i], str[i], pads[i], pads[k + i], dil[i],
                          nd_attr_i(c, "ceil_mode", 0) != 0);
    if (y[2 + i] < 1) return nd_fail(c, IR_BAD_FORMAT, "the kernel does not fit spatial dim %d", i);
  }
  nd_output(c, 0, IR_F32, x.rank, y);
  return IR_OK;
}

ir_status nd_infer_nn(nd_ctx *c) {
  switch (c->n->op) {
  case IR_OP_ND_MATMUL: return infer_matmul(c);
  case IR_OP_ND_GEMM: return infer_gemm(c);
  case IR_OP_ND_LAYER_NORM: return infer_layer_norm(c, false);
  case IR_OP_ND_RMS_NORM: return infer_layer_norm(c, true);
  case IR_OP_ND_SKIP_LAYER_NORM: return infer_skip_layer_norm(c);
  case IR_OP_ND_ATTENTION: return infer_attention(c);
  case IR_OP_ND_ROTARY_EMBEDDING: return infer_rotary(c);
  case IR_OP_ND_CONV: return infer_conv(c);
  case IR_OP_ND_POOL: return infer_pool(c);
  default: return nd_fail(c, IR_UNSUPPORTED, "not a network op");
  }
}
