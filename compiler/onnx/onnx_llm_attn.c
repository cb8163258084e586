/* onnx_llm_attn: the attention operands of an exported decoder: RoPE (rotate-half as HF
 * Llama, or adjacent pairs as GPT-J / llama.cpp's permuted Llama) with its cos table, and
 * the optimum-style past-KV Concat the paged KV cache replaces. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_llm_internal.h"
#include "ir_alloc.h"

/* The frequencies behind a cos/sin table's Concat: the two inputs the same f
 * (rotate-half: [f, f]) or the same f each unsqueezed on a new last axis (pairs, stacked
 * and flattened: [f0, f0, f1, f1, ...]). LM_ROPE_UNKNOWN when neither. */
static lm_rope_kind table_layout(lm *L, node_t *cat, const char **f) {
  node_t *u0 = lm_producer(L, lm_skip(L, lm_in(cat, 0)));
  node_t *u1 = lm_producer(L, lm_skip(L, lm_in(cat, 1)));
  *f = lm_movement_src(L, lm_in(cat, 0));
  if (strcmp(*f, lm_movement_src(L, lm_in(cat, 1)))) return LM_ROPE_UNKNOWN;
  if (lm_is_op(u0, "Unsqueeze") && lm_is_op(u1, "Unsqueeze")) return LM_ROPE_PAIRS;
  return lm_same(L, lm_in(cat, 0), lm_in(cat, 1)) ? LM_ROPE_HALF : LM_ROPE_UNKNOWN;
}

/* Checks inverse frequencies inv[0..half) are theta^(-2i/d) (as torch computes them in
 * f32) and sets rope_theta. */
static bool check_inv_freq(lm *L, const double *inv, int64_t half) {
  if (half < 2) return false;
  double theta = pow(inv[1], -(double)half);
  for (int64_t i = 0; i < half; i++) {
    double want = (float)(1.0 / pow(theta, (double)(2 * i) / (double)(2 * half)));
    if (fabs(inv[i] - want) > 1e-5 * want) return false;
  }
  L->p.rope_theta = round(theta * 1e3) / 1e3;
  return true;
}

/* Layout of a precomputed [P, d] cos table: its rows [c, c] (rotate-half) or
 * [c0, c0, c1, c1, ...] (pairs). */
static lm_rope_kind cached_layout(const float *T, int64_t P, int64_t d) {
  bool half = true, pairs = true;
  for (int64_t p = 0; p < P; p++)
    for (int64_t i = 0; i < d / 2; i++) {
      half &= T[p * d + i] == T[p * d + i + d / 2];
      pairs &= T[p * d + 2 * i] == T[p * d + 2 * i + 1];
    }
  return half ? LM_ROPE_HALF : pairs ? LM_ROPE_PAIRS : LM_ROPE_UNKNOWN;
}

/* Whether c(p, i) (cos of position p, frequency i) is cos(p * theta^(-2i/d)) as torch
 * computes it in f32 (its angle rounded to f32: the tolerance grows with it). */
static bool cached_matches(const float *T, int64_t P, int64_t d, lm_rope_kind kind, double theta) {
  int64_t half = d / 2;
  for (int64_t i = 0; i < half; i++) {
    float inv = (float)(1.0 / pow(theta, (double)(2 * i) / (double)d));
    for (int64_t p = 0; p < P; p++) {
      double a = (float)((float)p * inv);
      double c = T[p * d + (kind == LM_ROPE_HALF ? i : 2 * i)];
      if (fabs(c - cos(a)) > 2e-6 + 5e-7 * a) return false;
    }
  }
  return true;
}

/* theta from a precomputed cos table: frequency 1 read where its angle is about 1 rad
 * (acos well conditioned), rounded to 3 significant digits (the bases models use), then
 * checked against the whole table. */
static bool cached_theta(const float *T, int64_t P, int64_t d, lm_rope_kind kind, double *out) {
  int64_t col = kind == LM_ROPE_HALF ? 1 : 2;
  if (P < 2 || d < 4) return false;
  double inv = acos(T[d + col]);
  int64_t p = inv > 0 ? (int64_t)fmin((double)(P - 1), fmax(1.0, round(1.0 / inv))) : 1;
  inv = acos(T[p * d + col]) / (double)p;
  if (!(inv > 0 && inv < 1)) return false;
  double theta = pow(inv, -(double)d / 2), mag = pow(10, floor(log10(theta)) - 2);
  theta = round(theta / mag) * mag;
  *out = theta;
  return cached_matches(T, P, d, kind, theta);
}

/* The cos operand as HF Llama <= 4.37 and Qwen2 export it: a precomputed constant table
 * [max_pos, d] (Sliced from row 0) gathered by position_ids. */
static bool match_cached_table(lm *L, node_t *g) {
  if (!lm_is_op(g, "Gather") || lm_attr_int(g, "axis", 0) != 0 ||
      strcmp(lm_skip(L, lm_in(g, 1)), "position_ids") || !lm_is_graph_input(L, "position_ids"))
    return false;
  const char *t = lm_movement_src(L, lm_in(g, 0));
  node_t *sl = lm_producer(L, t);
  double start, axis;
  if (lm_is_op(sl, "Slice")) {
    if (!lm_const_scalar(L, lm_in(sl, 1), &start) || start != 0 ||
        (sl->n_input > 3 && (!lm_const_scalar(L, lm_in(sl, 3), &axis) || axis != 0)))
      return false;
    t = lm_in(sl, 0);
  }
  onnx_dense T;
  if (!lm_const_tensor(L, t, &T)) return false;
  int64_t P = T.shape[0], d = T.shape[1];
  lm_rope_kind kind =
      T.rank == 2 && T.dt == IR_F32 && d % 2 == 0 ? cached_layout(T.data, P, d) : LM_ROPE_UNKNOWN;
  double theta = 0;
  bool ok = kind != LM_ROPE_UNKNOWN && cached_theta(T.data, P, d, kind, &theta);
  ir_free(T.owned);
  if (!ok) return false;
  L->p.rope_theta = theta;
  L->rope_cached = true;
  L->half = d / 2;
  L->rope = kind;
  L->p.rope_interleaved = kind == LM_ROPE_PAIRS;
  return true;
}

/* The table operand of a rope Mul: cos(pos * inv_freq) (times a scaling of 1), with
 * pos * inv_freq a MatMul or Mul by the constant inverse frequencies, or a precomputed
 * table gathered by position. Sets L->rope to the table's layout, L->half and
 * rope_theta. */
static bool match_rope_table(lm *L, const char *t) {
  node_t *n = lm_producer(L, lm_movement_src(L, t));
  if (lm_is_op(n, "Gather")) return match_cached_table(L, n);
  double s;
  while (lm_is_op(n, "Mul")) {
    size_t k = lm_const_scalar(L, lm_in(n, 1), &s)   ? 0
               : lm_const_scalar(L, lm_in(n, 0), &s) ? 1
                                                     : 2;
    if (k == 2 || s != 1.0) return false;
    n = lm_producer(L, lm_movement_src(L, lm_in(n, k)));
  }
  if (!lm_is_op(n, "Cos") && !lm_is_op(n, "Sin")) return false;
  node_t *cat = lm_producer(L, lm_movement_src(L, lm_in(n, 0)));
  const char *f = NULL;
  if (!lm_is_op(cat, "Concat") || cat->n_input != 2) return false;
  lm_rope_kind kind = table_layout(L, cat, &f);
  node_t *mm = lm_producer(L, f);
  if (kind == LM_ROPE_UNKNOWN || (!lm_is_op(mm, "MatMul") && !lm_is_op(mm, "Mul"))) return false;
  double inv[512];
  int cnt = 0;
  for (size_t k = 0; k < 2 && !cnt; k++)
    if (!lm_const_values(L, lm_in(mm, k), inv, 512, &cnt)) cnt = 0;
  if (!check_inv_freq(L, inv, cnt)) return false;
  L->half = cnt;
  L->rope = kind;
  L->p.rope_interleaved = kind == LM_ROPE_PAIRS;
  return true;
}

/* rotate_half(x) = Concat(-x[..., d/2:], x[..., :d/2]): the source x. (The
 * split point is usually computed from the shape at run time; d comes from the
 * rope table.) */
static bool match_rotate_half(lm *L, const char *v, const char **x) {
  node_t *cat = lm_producer(L, lm_skip(L, v));
  if (!lm_is_op(cat, "Concat") || cat->n_input != 2) return false;
  node_t *neg = lm_producer(L, lm_skip(L, lm_in(cat, 0))), *s1, *s2;
  if (!lm_is_op(neg, "Neg")) return false;
  s2 = lm_producer(L, lm_skip(L, lm_in(neg, 0)));
  s1 = lm_producer(L, lm_skip(L, lm_in(cat, 1)));
  if (!lm_is_op(s1, "Slice") || !lm_is_op(s2, "Slice") || !lm_same(L, lm_in(s1, 0), lm_in(s2, 0)))
    return false;
  *x = lm_in(s1, 0);
  return true;
}

/* s is x[..., start::2] on the last (head_dim) axis of a [batch, heads, seq, head_dim]
 * tensor. */
static bool is_every_other(lm *L, node_t *s, double start) {
  double st, step, axis;
  if (!lm_is_op(s, "Slice") || s->n_input < 5) return false;
  return lm_const_scalar(L, lm_in(s, 1), &st) && st == start &&
         lm_const_scalar(L, lm_in(s, 3), &axis) && (axis == -1 || axis == 3) &&
         lm_const_scalar(L, lm_in(s, 4), &step) && step == 2;
}

/* The pairs rotation (x[2i], x[2i+1]) -> (-x[2i+1], x[2i]) as torch exports
 * stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2):
 * Reshape(Concat(Unsqueeze(Neg(Slice 1::2)), Unsqueeze(Slice 0::2), axis -1)): the
 * source x. */
static bool match_rotate_pairs(lm *L, const char *v, const char **x) {
  node_t *r = lm_producer(L, lm_skip(L, v));
  node_t *cat = lm_is_op(r, "Reshape") ? lm_producer(L, lm_skip(L, lm_in(r, 0))) : NULL;
  if (!lm_is_op(cat, "Concat") || cat->n_input != 2 || lm_attr_int(cat, "axis", 0) != -1)
    return false;
  node_t *u0 = lm_producer(L, lm_skip(L, lm_in(cat, 0)));
  node_t *u1 = lm_producer(L, lm_skip(L, lm_in(cat, 1)));
  if (!lm_is_op(u0, "Unsqueeze") || !lm_is_op(u1, "Unsqueeze")) return false;
  node_t *neg = lm_producer(L, lm_skip(L, lm_in(u0, 0)));
  node_t *odd = lm_is_op(neg, "Neg") ? lm_producer(L, lm_skip(L, lm_in(neg, 0))) : NULL;
  node_t *even = lm_producer(L, lm_skip(L, lm_in(u1, 0)));
  if (!is_every_other(L, odd, 1) || !is_every_other(L, even, 0) ||
      !lm_same(L, lm_in(odd, 0), lm_in(even, 0)))
    return false;
  *x = lm_in(even, 0);
  return true;
}

bool lm_match_rope(lm *L, const char *v, const char *p, int64_t *half) {
  const char *src = lm_kv_new(L, v);
  node_t *add = src ? lm_producer(L, src) : NULL;
  if (!lm_is_op(add, "Add")) return false;
  const char *x = NULL, *rx = NULL, *cos = NULL;
  lm_rope_kind rot = LM_ROPE_UNKNOWN;
  for (size_t k = 0; k < 2; k++) {
    node_t *mul = lm_producer(L, lm_skip(L, lm_in(add, k)));
    if (!lm_is_op(mul, "Mul")) return false;
    for (size_t j = 0; j < 2; j++) {
      const char *h;
      if (match_rotate_half(L, lm_in(mul, j), &h)) rx = h, rot = LM_ROPE_HALF;
      else if (match_rotate_pairs(L, lm_in(mul, j), &h)) rx = h, rot = LM_ROPE_PAIRS;
      else if (!strcmp(lm_movement_src(L, lm_in(mul, j)), p))
        x = lm_in(mul, j), cos = lm_in(mul, 1 - j);
    }
  }
  if (!x || !rx || !lm_same(L, x, rx)) return false;
  if (L->rope == LM_ROPE_UNKNOWN && !match_rope_table(L, cos)) return false;
  *half = L->half;
  return rot == L->rope;
}

/* Whether `past` is recorded already. */
static bool past_known(const lm *L, const char *past) {
  for (int i = 0; i < L->n_past; i++)
    if (!strcmp(L->past[2 * i], past)) return true;
  return false;
}

const char *lm_kv_new(lm *L, const char *v) {
  v = lm_movement_src(L, v);
  node_t *cat = lm_producer(L, v);
  const char *past = cat && cat->n_input == 2 ? lm_skip(L, lm_in(cat, 0)) : NULL;
  if (!lm_is_op(cat, "Concat") || !lm_is_graph_input(L, past)) return v;
  int64_t axis = lm_attr_int(cat, "axis", 0);
  if (axis != 2 && axis != -2) {
    lm_fail(L,
            "past-KV Concat '%s' joins '%s' on axis %lld, not the sequence axis 2 of "
            "[batch, kv_heads, seq, head_dim]",
            cat->name ? cat->name : "?", past, (long long)axis);
    return NULL;
  }
  if (!past_known(L, past)) {
    L->past[2 * L->n_past] = past;
    L->past[2 * L->n_past + 1] = cat->output[0];
    L->n_past++;
  }
  return lm_movement_src(L, lm_in(cat, 1));
}
