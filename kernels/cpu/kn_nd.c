/* kn_nd: runs one n-d IR node with the kernels of its family: builds dense views of its
 * tensors and turns its attributes into kernel parameters (contracts: ir/ir_op_nd.c). */
#include <math.h>
#include <stdio.h>

#include "kn_nd_util.h"

typedef struct nd_call {
  kn_pool *p;
  const ir_node *n;
  kn_view in[IR_MAX_IO], out[IR_MAX_IO];
  ir_diag *d;
} nd_call;

static kn_view view_of(const ir_graph *g, int32_t ti, const void *data) {
  kn_view v = {.data = (void *)data};
  if (ti < 0 || !data) return (kn_view){0};
  const ir_tensor *t = &g->tensors[ti];
  v.dt = t->dtype;
  v.rank = t->rank;
  for (int i = 0; i < t->rank; i++) v.shape[i] = t->dims[i].n;
  return v;
}

static int64_t ai(const nd_call *c, const char *name, int64_t def) {
  return ir_node_attr_i(c->n, name, def);
}

static float af(const nd_call *c, const char *name, float def) {
  return (float)ir_node_attr_f(c->n, name, def);
}

static const int64_t *aints(const nd_call *c, const char *name) {
  int n;
  const int64_t *v = ir_node_attr_ints(c->n, name, &n);
  static const int64_t none[1] = {0};
  return v ? v : none;
}

/* An int list attribute, or NULL when absent. */
static const int64_t *aints_or_null(const nd_call *c, const char *name) {
  int n;
  return ir_node_attr_ints(c->n, name, &n);
}

static int axis_of(const nd_call *c, int rank, int64_t def) {
  int64_t a = ai(c, "axis", def);
  return (int)(a < 0 ? a + rank : a);
}

static const kn_view *opt(const kn_view *v) { return v->data ? v : NULL; }

static void run_unary(nd_call *c) {
  kn_unary_params prm = {.alpha = af(c, "alpha", 0),
                         .beta = af(c, "beta", 0),
                         .gamma = af(c, "gamma", 0),
                         .lo = ir_node_attr_f(c->n, "min", -INFINITY),
                         .hi = ir_node_attr_f(c->n, "max", INFINITY),
                         .approximate = ai(c, "approximate", 0) != 0,
                         .detect_neg = ai(c, "detect_neg", 1) != 0,
                         .detect_pos = ai(c, "detect_pos", 1) != 0};
  kn_nd_unary(c->p, c->n->op, &prm, &c->out[0], &c->in[0]);
}

static uint32_t axes_mask(const nd_call *c) {
  int n;
  const int64_t *ax = ir_node_attr_ints(c->n, "axes", &n);
  uint32_t m = 0;
  for (int i = 0; i < n; i++) m |= 1u << ax[i];
  return m;
}

static ir_status run_attention(nd_call *c) {
  kn_attn_params prm = {.q_heads = ai(c, "q_num_heads", 0),
                        .kv_heads = ai(c, "kv_num_heads", 0),
                        .scale = af(c, "scale", 1.0f),
                        .softcap = af(c, "softcap", 0.0f),
                        .causal = ai(c, "is_causal", 0) != 0,
                        .qk_mode = (int)ai(c, "qk_mode", 0)};
  if (c->in[0].rank == 4) {
    prm.q_heads = c->in[0].shape[1];
    prm.kv_heads = c->in[1].shape[1];
  }
  kn_view *o = c->out, *i = c->in;
  return kn_nd_attention(c->p, &prm, &o[0], &o[1], &o[2], &o[3], &i[0], &i[1], &i[2], &i[3], &i[4],
                         &i[5], &i[6], c->d)
             ? IR_OK
             : c->d->status;
}

/* Data movement and the ops with runtime index checks. */
static ir_status run_shape(nd_call *c) {
  kn_view *x = &c->in[0], *y = &c->out[0];
  switch (c->n->op) {
  case IR_OP_ND_RESHAPE: kn_nd_copy(y, x); return IR_OK;
  case IR_OP_ND_TRANSPOSE: kn_nd_transpose(c->p, y, x, aints(c, "perm")); return IR_OK;
  case IR_OP_ND_CONCAT: kn_nd_concat(y, c->in, c->n->n_in, axis_of(c, x->rank, 0)); return IR_OK;
  case IR_OP_ND_SPLIT: kn_nd_split(c->out, c->n->n_out, x, axis_of(c, x->rank, 0)); return IR_OK;
  case IR_OP_ND_SLICE: kn_nd_slice(c->p, y, x, aints(c, "starts"), aints(c, "steps")); return IR_OK;
  case IR_OP_ND_EXPAND: kn_nd_expand(c->p, y, x); return IR_OK;
  case IR_OP_ND_TILE: kn_nd_tile(c->p, y, x); return IR_OK;
  case IR_OP_ND_PAD:
    kn_nd_pad(c->p, y, x, aints(c, "pads"), (int)ai(c, "mode", 0),
              ir_node_attr_f(c->n, "value", 0));
    return IR_OK;
  case IR_OP_ND_GATHER:
    return kn_nd_gather(y, x, &c->in[1], axis_of(c, x->rank, 0), c->d) ? IR_OK : c->d->status;
  case IR_OP_ND_GATHER_ELEMENTS:
    return kn_nd_gather_elements(y, x, &c->in[1], axis_of(c, x->rank, 0), c->d) ? IR_OK
                                                                                : c->d->status;
  case IR_OP_ND_TRILU: kn_nd_trilu(y, x, ai(c, "upper", 1) != 0, ai(c, "k", 0)); return IR_OK;
  default: return ir_diag_set(c->d, IR_UNSUPPORTED, "cpu: no kernel for %s", ir_op_name(c->n->op));
  }
}

static ir_status run_nn(nd_call *c) {
  kn_view *i = c->in, *o = c->out;
  switch (c->n->op) {
  case IR_OP_ND_MATMUL: kn_nd_matmul(c->p, &o[0], &i[0], &i[1]); return IR_OK;
  case IR_OP_ND_GEMM:
    kn_nd_gemm(c->p, &o[0], &i[0], &i[1], opt(&i[2]), af(c, "alpha", 1), af(c, "beta", 1),
               ai(c, "trans_a", 0) != 0, ai(c, "trans_b", 0) != 0);
    return IR_OK;
  case IR_OP_ND_LAYER_NORM:
  case IR_OP_ND_RMS_NORM:
    kn_nd_layer_norm(c->p, &o[0], &o[1], &o[2], &i[0], &i[1], &i[2], axis_of(c, i[0].rank, -1),
                     af(c, "eps", 1e-5f), c->n->op == IR_OP_ND_RMS_NORM);
    return IR_OK;
  case IR_OP_ND_SKIP_LAYER_NORM:
    kn_nd_skip_layer_norm(c->p, &o[0], &o[1], &o[2], &o[3], &i[0], &i[1], &i[2], &i[3], &i[4],
                          af(c, "eps", 1e-12f));
    return IR_OK;
  case IR_OP_ND_ATTENTION: return run_attention(c);
  case IR_OP_ND_CONV:
    kn_nd_conv(c->p, &o[0], &i[0], &i[1], opt(&i[2]), aints_or_null(c, "strides"),
               aints_or_null(c, "pads"), aints_or_null(c, "dilations"), ai(c, "group", 1));
    return IR_OK;
  case IR_OP_ND_POOL:
    kn_nd_pool(c->p, &o[0], &i[0], aints(c, "kernel"), aints_or_null(c, "strides"),
               aints_or_null(c, "pads"), aints_or_null(c, "dilations"), ai(c, "mode", 0) == 1,
               ai(c, "count_include_pad", 0) != 0);
    return IR_OK;
  case IR_OP_ND_ROTARY_EMBEDDING:
    return kn_nd_rotary(c->p, &o[0], &i[0], &i[1], &i[2], &i[3], ai(c, "num_heads", 0),
                        ai(c, "rot_dim", 0), ai(c, "interleaved", 0) != 0, c->d)
               ? IR_OK
               : c->d->status;
  default: return run_shape(c);
  }
}

static ir_status dispatch(nd_call *c) {
  ir_op op = c->n->op;
  kn_view *x = &c->in[0], *y = &c->out[0];
  if (op == IR_OP_ND_CAST) {
    kn_nd_cast(c->p, y, x, ai(c, "bool", 0) != 0);
  } else if (op >= IR_OP_ND_NEG && op <= IR_OP_ND_ISINF) {
    run_unary(c);
  } else if (op >= IR_OP_ND_ADD && op <= IR_OP_ND_PRELU) {
    kn_nd_binary(c->p, op, ai(c, "fmod", 0) != 0, y, x, &c->in[1]);
  } else if (op == IR_OP_ND_WHERE) {
    kn_nd_where(c->p, y, x, &c->in[1], &c->in[2]);
  } else if (op >= IR_OP_ND_REDUCE_SUM && op <= IR_OP_ND_REDUCE_SUM_SQUARE) {
    kn_nd_reduce(c->p, op, axes_mask(c), y, x);
  } else if (op == IR_OP_ND_ARGMAX || op == IR_OP_ND_ARGMIN) {
    kn_nd_arg(c->p, op == IR_OP_ND_ARGMAX, axis_of(c, x->rank, 0), ai(c, "select_last", 0) != 0, y,
              x);
  } else if (op >= IR_OP_ND_SOFTMAX && op <= IR_OP_ND_HARDMAX) {
    kn_nd_softmax(c->p, op, axis_of(c, x->rank, -1), ai(c, "flat", 0) != 0, y, x);
  } else if (op == IR_OP_ND_CUMSUM) {
    kn_nd_cumsum(c->p, axis_of(c, x->rank, 0), ai(c, "exclusive", 0) != 0, ai(c, "reverse", 0) != 0,
                 y, x);
  } else {
    return run_nn(c);
  }
  return IR_OK;
}

ir_status kn_nd_exec(kn_pool *p, const ir_graph *g, const ir_node *n, const void *const *in,
                     void *const *out, ir_diag *d) {
  nd_call c = {.p = p, .n = n, .d = d};
  ir_diag local = {0};
  if (!d) c.d = &local;
  if (!ir_op_is_nd(n->op))
    return ir_diag_set(c.d, IR_UNSUPPORTED, "cpu: node '%s' is not an n-d op", n->name);
  for (int i = 0; i < n->n_in && i < IR_MAX_IO; i++) c.in[i] = view_of(g, n->in[i], in[i]);
  for (int i = 0; i < n->n_out && i < IR_MAX_IO; i++) c.out[i] = view_of(g, n->out[i], out[i]);
  ir_status st = dispatch(&c);
  if (st != IR_OK) ir_diag_prefix(c.d, "node '%s' (%s)", n->name, ir_op_name(n->op));
  return st;
}
