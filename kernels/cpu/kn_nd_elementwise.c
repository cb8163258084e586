/* kn_nd_elementwise: unary and binary elementwise ops with numpy broadcasting, where and
 * cast. f32 runs straight over the data in loops the compiler vectorises; integer dtypes
 * go through int64 in chunks (wrapping like numpy); bool is u8 0/1. */
#include <math.h>

#include "kn_nd_util.h"

enum { KN_EW_MIN_WORK = 16384 };

/* --- unary ----------------------------------------------------------------------------- */

static float sigmoidf(float v) {
  return v >= 0 ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
}
static float softplusf(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

#define UN_LOOP(expr)                                                                              \
  for (int64_t i = 0; i < n; i++) {                                                                \
    float v = x[i];                                                                                \
    y[i] = (expr);                                                                                 \
  }                                                                                                \
  break

static void un_f32(ir_op op, const kn_unary_params *p, float *restrict y, const float *restrict x,
                   int64_t n) {
  const float al = p->alpha, be = p->beta, ga = p->gamma;
  const float lo = (float)p->lo, hi = (float)p->hi;
  const float k0 = 0.7978845608028654f; /* sqrt(2/pi) */
  switch (op) {
  case IR_OP_ND_NEG: UN_LOOP(-v);
  case IR_OP_ND_ABS: UN_LOOP(fabsf(v));
  case IR_OP_ND_SQRT: UN_LOOP(sqrtf(v));
  case IR_OP_ND_RECIPROCAL: UN_LOOP(1.0f / v);
  case IR_OP_ND_EXP: UN_LOOP(expf(v));
  case IR_OP_ND_LOG: UN_LOOP(logf(v));
  case IR_OP_ND_TANH: UN_LOOP(tanhf(v));
  case IR_OP_ND_SIGMOID: UN_LOOP(sigmoidf(v));
  case IR_OP_ND_ERF: UN_LOOP(erff(v));
  case IR_OP_ND_RELU: UN_LOOP(v < 0 ? 0.0f : v);
  case IR_OP_ND_SIN: UN_LOOP(sinf(v));
  case IR_OP_ND_COS: UN_LOOP(cosf(v));
  case IR_OP_ND_TAN: UN_LOOP(tanf(v));
  case IR_OP_ND_ASIN: UN_LOOP(asinf(v));
  case IR_OP_ND_ACOS: UN_LOOP(acosf(v));
  case IR_OP_ND_ATAN: UN_LOOP(atanf(v));
  case IR_OP_ND_SINH: UN_LOOP(sinhf(v));
  case IR_OP_ND_COSH: UN_LOOP(coshf(v));
  case IR_OP_ND_ASINH: UN_LOOP(asinhf(v));
  case IR_OP_ND_ACOSH: UN_LOOP(acoshf(v));
  case IR_OP_ND_ATANH: UN_LOOP(atanhf(v));
  case IR_OP_ND_FLOOR: UN_LOOP(floorf(v));
  case IR_OP_ND_CEIL: UN_LOOP(ceilf(v));
  case IR_OP_ND_ROUND: UN_LOOP(nearbyintf(v)); /* half to even */
  case IR_OP_ND_SIGN: UN_LOOP(v > 0 ? 1.0f : v < 0 ? -1.0f : v);
  case IR_OP_ND_SOFTPLUS: UN_LOOP(softplusf(v));
  case IR_OP_ND_SOFTSIGN: UN_LOOP(v / (1.0f + fabsf(v)));
  case IR_OP_ND_GELU:
    if (p->approximate) {
      UN_LOOP(0.5f * v * (1.0f + tanhf(k0 * (v + 0.044715f * v * v * v))));
    } else {
      UN_LOOP(0.5f * v * (1.0f + erff(v * 0.7071067811865476f)));
    }
  case IR_OP_ND_ELU: UN_LOOP(v < 0 ? al * (expf(v) - 1.0f) : v);
  case IR_OP_ND_SELU: UN_LOOP(v <= 0 ? ga * (al * expf(v) - al) : ga * v);
  case IR_OP_ND_LEAKY_RELU: UN_LOOP(v < 0 ? al * v : v);
  case IR_OP_ND_HARD_SIGMOID: UN_LOOP(fmaxf(0.0f, fminf(1.0f, al * v + be)));
  case IR_OP_ND_HARD_SWISH: UN_LOOP(v * fmaxf(0.0f, fminf(1.0f, v / 6.0f + 0.5f)));
  case IR_OP_ND_THRESHOLDED_RELU: UN_LOOP(v > al ? v : 0.0f);
  case IR_OP_ND_CELU: UN_LOOP(fmaxf(0.0f, v) + fminf(0.0f, al * (expf(v / al) - 1.0f)));
  case IR_OP_ND_MISH: UN_LOOP(v * tanhf(softplusf(v)));
  case IR_OP_ND_CLIP: UN_LOOP(v < lo ? lo : v > hi ? hi : v);
  default: break;
  }
}
#undef UN_LOOP

static int64_t un_i64(ir_op op, const kn_unary_params *p, int64_t v) {
  switch (op) {
  case IR_OP_ND_NEG: return (int64_t)(0 - (uint64_t)v);
  case IR_OP_ND_ABS: return v < 0 ? (int64_t)(0 - (uint64_t)v) : v;
  case IR_OP_ND_RELU: return v > 0 ? v : 0;
  case IR_OP_ND_SIGN: return (v > 0) - (v < 0);
  case IR_OP_ND_CLIP:
    return (double)v < p->lo ? kn_f2i(p->lo) : (double)v > p->hi ? kn_f2i(p->hi) : v;
  case IR_OP_ND_NOT: return v == 0;
  default: return v;
  }
}

typedef struct un_args {
  ir_op op;
  const kn_unary_params *prm;
  const kn_view *y, *x;
} un_args;

static void un_task(void *arg, int64_t b, int64_t e, int tid) {
  const un_args *a = arg;
  ir_dtype xt = a->x->dt;
  if (a->op == IR_OP_ND_ISNAN || a->op == IR_OP_ND_ISINF) {
    const float *x = a->x->data;
    uint8_t *y = a->y->data;
    for (int64_t i = b; i < e; i++)
      y[i] = a->op == IR_OP_ND_ISNAN ? x[i] != x[i]
                                     : (isinf(x[i]) && ((x[i] > 0 && a->prm->detect_pos) ||
                                                        (x[i] < 0 && a->prm->detect_neg)));
    return;
  }
  if (xt == IR_F32) {
    un_f32(a->op, a->prm, (float *)a->y->data + b, (const float *)a->x->data + b, e - b);
    return;
  }
  int64_t buf[KN_ND_CHUNK];
  for (int64_t c = b; c < e; c += KN_ND_CHUNK) {
    int64_t n = e - c < KN_ND_CHUNK ? e - c : KN_ND_CHUNK;
    kn_load_i64(buf, a->x->data, xt, c, 1, n);
    for (int64_t i = 0; i < n; i++) buf[i] = un_i64(a->op, a->prm, buf[i]);
    kn_store_i64(a->y->data, a->y->dt, c, buf, n);
  }
}

void kn_nd_unary(kn_pool *p, ir_op op, const kn_unary_params *prm, const kn_view *y,
                 const kn_view *x) {
  un_args a = {op, prm, y, x};
  kn_parallel_for(p, kn_numel(y), KN_EW_MIN_WORK, un_task, &a);
}

/* --- binary ---------------------------------------------------------------------------- */

/* Runs `expr` over one row with a, b each contiguous (stride 1) or one repeated value. */
#define BIN_LOOP(expr)                                                                             \
  do {                                                                                             \
    if (sa && sb) {                                                                                \
      for (int64_t i = 0; i < n; i++) {                                                            \
        float u = a[i], w = b[i];                                                                  \
        y[i] = (expr);                                                                             \
      }                                                                                            \
    } else if (sa) {                                                                               \
      const float w = b[0];                                                                        \
      for (int64_t i = 0; i < n; i++) {                                                            \
        float u = a[i];                                                                            \
        y[i] = (expr);                                                                             \
      }                                                                                            \
    } else if (sb) {                                                                               \
      const float u = a[0];                                                                        \
      for (int64_t i = 0; i < n; i++) {                                                            \
        float w = b[i];                                                                            \
        y[i] = (expr);                                                                             \
      }                                                                                            \
    } else {                                                                                       \
      const float u = a[0], w = b[0];                                                              \
      for (int64_t i = 0; i < n; i++) y[i] = (expr);                                               \
    }                                                                                              \
  } while (0)

static float pymodf(float u, float w) {
  float r = fmodf(u, w);
  return r != 0 && ((r < 0) != (w < 0)) ? r + w : r;
}

static void bin_f32(ir_op op, bool fm, float *restrict y, const float *restrict a, int sa,
                    const float *restrict b, int sb, int64_t n) {
  switch (op) {
  case IR_OP_ND_ADD: BIN_LOOP(u + w); break;
  case IR_OP_ND_SUB: BIN_LOOP(u - w); break;
  case IR_OP_ND_MUL: BIN_LOOP(u * w); break;
  case IR_OP_ND_DIV: BIN_LOOP(u / w); break;
  case IR_OP_ND_POW: BIN_LOOP(powf(u, w)); break;
  case IR_OP_ND_MOD:
    if (fm) BIN_LOOP(fmodf(u, w));
    else BIN_LOOP(pymodf(u, w));
    break;
  case IR_OP_ND_MIN: BIN_LOOP(u != u || u < w ? u : w); break;
  case IR_OP_ND_MAX: BIN_LOOP(u != u || u > w ? u : w); break;
  case IR_OP_ND_PRELU: BIN_LOOP(u < 0 ? u * w : u); break;
  default: break;
  }
}

static void cmp_f32(ir_op op, uint8_t *restrict y, const float *restrict a, int sa,
                    const float *restrict b, int sb, int64_t n) {
  switch (op) {
  case IR_OP_ND_EQUAL: BIN_LOOP(u == w); break;
  case IR_OP_ND_LESS: BIN_LOOP(u < w); break;
  case IR_OP_ND_LESS_EQUAL: BIN_LOOP(u <= w); break;
  case IR_OP_ND_GREATER: BIN_LOOP(u > w); break;
  case IR_OP_ND_GREATER_EQUAL: BIN_LOOP(u >= w); break;
  default: break;
  }
}
#undef BIN_LOOP

static int64_t ipow(int64_t base, int64_t e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)base;
  while (e) {
    if (e & 1) r *= b;
    b *= b;
    e >>= 1;
  }
  return (int64_t)r;
}

static int64_t bin_i64(ir_op op, bool fm, int64_t u, int64_t w) {
  switch (op) {
  case IR_OP_ND_ADD: return (int64_t)((uint64_t)u + (uint64_t)w);
  case IR_OP_ND_SUB: return (int64_t)((uint64_t)u - (uint64_t)w);
  case IR_OP_ND_MUL: return (int64_t)((uint64_t)u * (uint64_t)w);
  case IR_OP_ND_DIV: return w == 0 ? 0 : (w == -1 ? (int64_t)(0 - (uint64_t)u) : u / w);
  case IR_OP_ND_POW: return ipow(u, w);
  case IR_OP_ND_MOD: {
    if (w == 0 || w == -1) return 0;
    int64_t r = u % w;
    return !fm && r != 0 && ((r < 0) != (w < 0)) ? r + w : r;
  }
  case IR_OP_ND_MIN: return u < w ? u : w;
  case IR_OP_ND_MAX: return u > w ? u : w;
  case IR_OP_ND_AND: return (u != 0) & (w != 0);
  case IR_OP_ND_OR: return (u != 0) | (w != 0);
  case IR_OP_ND_XOR: return (u != 0) ^ (w != 0);
  case IR_OP_ND_EQUAL: return u == w;
  case IR_OP_ND_LESS: return u < w;
  case IR_OP_ND_LESS_EQUAL: return u <= w;
  case IR_OP_ND_GREATER: return u > w;
  case IR_OP_ND_GREATER_EQUAL: return u >= w;
  default: return 0;
  }
}

static bool is_compare(ir_op op) {
  return op == IR_OP_ND_EQUAL || op == IR_OP_ND_LESS || op == IR_OP_ND_LESS_EQUAL ||
         op == IR_OP_ND_GREATER || op == IR_OP_ND_GREATER_EQUAL;
}

typedef struct bin_args {
  ir_op op;
  bool fmod;
  const kn_view *y, *a, *b;
  kn_bcast bc;
} bin_args;

static void bin_row_i64(const bin_args *x, int64_t oy, int64_t oa, int64_t ob) {
  int64_t ua[KN_ND_CHUNK], ub[KN_ND_CHUNK];
  int64_t sa = x->bc.stride[0][x->bc.rank - 1], sb = x->bc.stride[1][x->bc.rank - 1];
  for (int64_t c = 0; c < x->bc.inner; c += KN_ND_CHUNK) {
    int64_t n = x->bc.inner - c < KN_ND_CHUNK ? x->bc.inner - c : KN_ND_CHUNK;
    kn_load_i64(ua, x->a->data, x->a->dt, oa + c * sa, sa, n);
    kn_load_i64(ub, x->b->data, x->b->dt, ob + c * sb, sb, n);
    for (int64_t i = 0; i < n; i++) ua[i] = bin_i64(x->op, x->fmod, ua[i], ub[i]);
    kn_store_i64(x->y->data, x->y->dt, oy + c, ua, n);
  }
}

static void bin_task(void *arg, int64_t b, int64_t e, int tid) {
  const bin_args *x = arg;
  int64_t offs[2], n = x->bc.inner;
  int sa = x->bc.stride[0][x->bc.rank - 1] != 0, sb = x->bc.stride[1][x->bc.rank - 1] != 0;
  for (int64_t r = b; r < e; r++) {
    kn_bcast_row(&x->bc, r, offs);
    int64_t oy = r * n;
    if (x->a->dt != IR_F32) {
      bin_row_i64(x, oy, offs[0], offs[1]);
    } else if (is_compare(x->op)) {
      cmp_f32(x->op, (uint8_t *)x->y->data + oy, (const float *)x->a->data + offs[0], sa,
              (const float *)x->b->data + offs[1], sb, n);
    } else {
      bin_f32(x->op, x->fmod, (float *)x->y->data + oy, (const float *)x->a->data + offs[0], sa,
              (const float *)x->b->data + offs[1], sb, n);
    }
  }
}

void kn_nd_binary(kn_pool *p, ir_op op, bool fmod, const kn_view *y, const kn_view *a,
                  const kn_view *b) {
  bin_args x = {.op = op, .fmod = fmod, .y = y, .a = a, .b = b};
  const kn_view *ops[2] = {a, b};
  kn_bcast_init(&x.bc, y, ops, 2);
  kn_parallel_for(p, x.bc.rows, kn_grain(x.bc.inner, KN_EW_MIN_WORK), bin_task, &x);
}

/* --- where ----------------------------------------------------------------------------- */

typedef struct where_args {
  const kn_view *y, *c, *a, *b;
  kn_bcast bc;
} where_args;

static void where_task(void *arg, int64_t b, int64_t e, int tid) {
  const where_args *x = arg;
  size_t es = kn_esize(x->y->dt);
  int last = x->bc.rank - 1;
  int64_t sc = x->bc.stride[0][last], sa = x->bc.stride[1][last], sb = x->bc.stride[2][last];
  const uint8_t *cond = x->c->data;
  const char *pa = x->a->data, *pb = x->b->data;
  char *py = x->y->data;
  int64_t offs[3];
  for (int64_t r = b; r < e; r++) {
    kn_bcast_row(&x->bc, r, offs);
    char *dst = py + (size_t)(r * x->bc.inner) * es;
    for (int64_t i = 0; i < x->bc.inner; i++) {
      const char *src = cond[offs[0] + i * sc] ? pa + (size_t)(offs[1] + i * sa) * es
                                               : pb + (size_t)(offs[2] + i * sb) * es;
      kn_copy_elem(dst + (size_t)i * es, src, es);
    }
  }
}

void kn_nd_where(kn_pool *p, const kn_view *y, const kn_view *cond, const kn_view *a,
                 const kn_view *b) {
  where_args x = {.y = y, .c = cond, .a = a, .b = b};
  const kn_view *ops[3] = {cond, a, b};
  kn_bcast_init(&x.bc, y, ops, 3);
  kn_parallel_for(p, x.bc.rows, kn_grain(x.bc.inner, KN_EW_MIN_WORK), where_task, &x);
}

/* --- cast ------------------------------------------------------------------------------ */

typedef struct cast_args {
  const kn_view *y, *x;
  bool to_bool;
} cast_args;

static bool is_int(ir_dtype t) { return t == IR_I64 || t == IR_I32 || t == IR_I8 || t == IR_U8; }

static void cast_task(void *arg, int64_t b, int64_t e, int tid) {
  const cast_args *c = arg;
  const void *x = c->x->data;
  void *y = c->y->data;
  ir_dtype xt = c->x->dt, yt = c->y->dt;
  if (c->to_bool) {
    for (int64_t i = b; i < e; i++) kn_set_i64(y, yt, i, kn_get_f64(x, xt, i) != 0);
  } else if (xt == IR_F32 && yt == IR_F16) {
    for (int64_t i = b; i < e; i++) ((uint16_t *)y)[i] = ir_f32_to_f16(((const float *)x)[i]);
  } else if (is_int(xt)) {
    for (int64_t i = b; i < e; i++) kn_set_i64(y, yt, i, kn_get_i64(x, xt, i));
  } else {
    for (int64_t i = b; i < e; i++) kn_set_f64(y, yt, i, kn_get_f64(x, xt, i));
  }
}

void kn_nd_cast(kn_pool *p, const kn_view *y, const kn_view *x, bool to_bool) {
  if (x->dt == y->dt && !to_bool) {
    kn_nd_copy(y, x);
    return;
  }
  cast_args c = {y, x, to_bool};
  kn_parallel_for(p, kn_numel(y), KN_EW_MIN_WORK, cast_task, &c);
}
