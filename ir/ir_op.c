/* ir_op: op names, shape and type inference, and the graph verifier.
 *
 * Op contracts (T, L: symbolic; activations f32 unless stated):
 *   embed(ids[T] i32, table[V,H] f32|f16|bf16|q8_0|q4_0|q4_1; scale?)  -> [T,H]
 *       scale (default 1): each row times scale in f32 (Gemma's sqrt(H) normalizer)
 *       vocab_part (tensor parallelism): table[V/ranks,H] is rows [rank V/ranks, ...) of the
 *       vocabulary; other ids give zero rows (an all_reduce after sums the ranks')
 *   rms_norm(x[..,H], w[H] f32; eps)                        -> like x
 *       w[G] with G dividing a static H: each G-slice of a row normalized on its own
 *       (the per-head q/k norm of Qwen3: x[T,nh*hd], w[hd])
 *   add_rms_norm(a[..,H], b like a, w[H]; eps)              -> (norm like a, sum like a)
 *   matmul(x[M,K], w[N,K] f32|f16|bf16|q8_0|q4_0|q4_1, bias[N] f32?; act?) -> [M,N]
 *       (block-quantized tables and weights: H and K multiples of the 32-value block)
 *       act_int8 = 1 with a q8_0|q4_0|q4_1 w: x is quantized to int8 per 32-value block
 *       at run time and summed in integers (kn_matmul_q8); K <= IR_Q8_ACT_MAX_K.
 *       act_bf16 = 1 with a bf16 w: x is rounded to bf16 at run time, bf16 products summed
 *       in f32 (kn_matmul_bf16x). With a q8_0|q4_0|q4_1 w (N a multiple of 16, of 32 with
 *       swiglu, K <= IR_Q8_ACT_MAX_K): w's values rounded to bf16, then the same
 *       (kn_matmul_bf16q), for the step's prompt rows; its generated rows as act_int8
 *       (model_step.tok_gen: a row's kind, never the batch, picks its kernel; x must be
 *       the step's token rows, whose kinds are known).
 *       act = IR_ACT_SWIGLU (ir.h): w holds gate rows then up rows, output [M,N/2]
 *   matmul(x[M,K], w[N,K] i8|i4, bias[N] f32?, scales[N,G] f32|f16, zero_points[N,G] u8|i8|f16|f32?;
 *          act_int8?)                                      -> [M,N]
 *       weight-only quantization with separate parameters (ONNX MatMulNBits, TRT-LLM):
 *       G divides K, group = K/G columns share a scale (G = 1: per output channel);
 *       w[n,k] = (q[n,k] - zp[n,k/group]) * scale[n,k/group] in f32 (zp may be fractional:
 *       f16/f32 zero points, as Q4_1's min or TRT-LLM's float zeros). i4 packs two a byte,
 *       element 2j in the low nibble of byte j (unsigned 0..15), K even; without
 *       zero_points zp is 8 (i4) or 0 (i8). act_int8 = 1 (W8A8): x is quantized per row
 *       at run time (int8, scale max|x|/127); needs i8, no zero points, G = 1, K <= 32768.
 *   rope(x[T,n_heads*head_dim], pos[T] i32, cs[P,rot/2,2]; n_heads, head_dim, rot_dim, neox)
 *                                                           -> like x
 *   attention(q[T,nh*hd], k[T,nkv*hd], v[T,nkv*hd], pos[T] i32?, cs[P,rot/2,2]?,
 *             q_norm[hd] f32?, k_norm[hd] f32?; layer, n_heads, n_kv_heads, head_dim,
 *             scale; rot_dim, neox with pos; qk_eps with the norms)
 *                                                           -> [T,nh*hd] (reads/writes KV)
 *       packed (k, v absent: -1): q is qkv[T,(nh+2*nkv)*hd], the q heads, then k, then v.
 *       pos and cs present: rope (as the rope op, same attrs) applied to q and to k before
 *       k enters the cache. q_norm and k_norm present (both): each q and k head is first
 *       rms-normalized (as rms_norm with w[hd], eps = qk_eps), then roped.
 *       window > 0 (default 0): a token at position p attends positions p - window < j <= p
 *       only (sliding-window attention); softcap > 0 (default 0): each scaled score s
 *       becomes softcap * tanh(s / softcap) before the softmax (Gemma 2). act_bf16 = 1:
 *       q . k and p . v take bf16 values, f32 sums (the CPU's bf16 order, kn_attention.c;
 *       the GPU keeps its own kernels' precision, as for act_bf16 matmuls).
 *   swiglu(gate, up same shape; act?)                       -> like gate
 *       act = IR_ACT_SWIGLU (default): silu(gate) * up; IR_ACT_GEGLU: gelu_tanh(gate) * up
 *   softcap(x f32; cap > 0)                                 -> like x: cap * tanh(x / cap)
 *   add, mul(a, b same shape | b[last dim of a] | b scalar) -> like a (any float dtype)
 *   gather_rows(x[T,H], rows[L] i32)                        -> [L,H]
 *   cast(x f32|f16|bf16|q*; to f32|f16|bf16)               -> like x, dtype `to`
 *   all_reduce(x f32; ranks)                                -> like x: the sum over the
 *       tensor-parallel ranks of each one's x (after a row-split matmul)
 *   all_gather(x[R,C] f32; ranks)                           -> [R,C*ranks]: row r is rank
 *       0's row r, then rank 1's, ... (the vocabulary-split logits)
 */
#include <stdio.h>
#include <string.h>

#include "ir.h"
#include "ir_op_nd.h"

static const char *const k_op_names[IR_OP_COUNT] = {
    [IR_OP_INVALID] = "invalid",
    [IR_OP_EMBED] = "embed",
    [IR_OP_RMS_NORM] = "rms_norm",
    [IR_OP_ADD_RMS_NORM] = "add_rms_norm",
    [IR_OP_MATMUL] = "matmul",
    [IR_OP_ROPE] = "rope",
    [IR_OP_ATTENTION] = "attention",
    [IR_OP_SWIGLU] = "swiglu",
    [IR_OP_ADD] = "add",
    [IR_OP_MUL] = "mul",
    [IR_OP_GATHER_ROWS] = "gather_rows",
    [IR_OP_CAST] = "cast",
    [IR_OP_SOFTCAP] = "softcap",
    [IR_OP_ALL_REDUCE] = "all_reduce",
    [IR_OP_ALL_GATHER] = "all_gather",
};

const char *ir_op_name(ir_op op) {
  if (ir_op_is_nd(op)) return ir_op_nd_name(op);
  return (op > IR_OP_INVALID && op < IR_OP_COUNT && k_op_names[op]) ? k_op_names[op] : "invalid";
}

ir_op ir_op_from_name(const char *name) {
  for (int i = 1; i < IR_OP_COUNT; i++)
    if (strcmp(ir_op_name((ir_op)i), name) == 0) return (ir_op)i;
  return IR_OP_INVALID;
}

/* --- inference helpers ---------------------------------------------------------------- */

typedef struct infer_ctx {
  const ir_graph *g;
  const ir_node *n;
  ir_diag *d;
} infer_ctx;

static bool dim_eq(ir_dim a, ir_dim b) {
  return a.sym == b.sym && (a.sym != IR_SYM_NONE || a.n == b.n);
}

static void fmt_dim(ir_dim d, char *buf, size_t len) {
  if (d.sym != IR_SYM_NONE) snprintf(buf, len, "%s", ir_sym_name(d.sym));
  else snprintf(buf, len, "%lld", (long long)d.n);
}

void ir_tensor_format_shape(const ir_tensor *t, char *buf, size_t len) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, len - o, "[");
  for (int i = 0; i < t->rank && o < len; i++) {
    char db[24];
    fmt_dim(t->dims[i], db, sizeof db);
    o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? "," : "", db);
  }
  if (o < len) snprintf(buf + o, len - o, "]");
}

static ir_status fail(infer_ctx *c, const char *fmt, const char *a, const char *b) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, a, b);
  return ir_diag_set(c->d, IR_BAD_FORMAT, "node '%s' (%s): %s", c->n->name, ir_op_name(c->n->op),
                     msg);
}

/* Fetches input i; NULL (with an error) if absent and required or out of range. */
static const ir_tensor *in_t(infer_ctx *c, int i, bool required) {
  if (i >= c->n->n_in || c->n->in[i] < 0) {
    char idx[16];
    snprintf(idx, sizeof idx, "%d", i);
    if (required) fail(c, "missing input %s%s", idx, "");
    return NULL;
  }
  if (c->n->in[i] >= c->g->n_tensors) {
    fail(c, "input index out of range%s%s", "", "");
    return NULL;
  }
  return &c->g->tensors[c->n->in[i]];
}

static bool want_dtype(infer_ctx *c, const ir_tensor *t, ir_dtype a, ir_dtype b, ir_dtype e) {
  if (t->dtype == a || t->dtype == b || t->dtype == e) return true;
  fail(c, "input '%s' has unexpected dtype %s", t->name, ir_dtype_name(t->dtype));
  return false;
}

static bool is_float(ir_dtype t) { return t == IR_F32 || t == IR_F16 || t == IR_BF16; }

/* A weight the matmul and embed kernels read in place: float, or block-quantized with
 * whole blocks per row (rank and shape are checked by the caller). */
static bool want_weight_dtype(infer_ctx *c, const ir_tensor *t) {
  if (is_float(t->dtype)) return true;
  if (ir_dtype_is_x16(t->dtype)) {
    if (t->rank == 2 && t->dims[0].sym == IR_SYM_NONE && t->dims[0].n % 16 == 0 &&
        t->dims[1].sym == IR_SYM_NONE && t->dims[1].n % 2 == 0)
      return true;
    fail(c, "input '%s' is %s: it needs rank 2, a multiple of 16 rows and an even K", t->name,
         ir_dtype_name(t->dtype));
    return false;
  }
  if (ir_dtype_is_x8(t->dtype) &&
      (t->rank != 2 || t->dims[0].sym != IR_SYM_NONE || t->dims[0].n % 8)) {
    fail(c, "input '%s' is %s: it needs rank 2 and a multiple of 8 rows", t->name,
         ir_dtype_name(t->dtype));
    return false;
  }
  if (!ir_dtype_is_blocks(t->dtype)) {
    fail(c, "input '%s' has unexpected dtype %s", t->name, ir_dtype_name(t->dtype));
    return false;
  }
  ir_dim last = t->rank > 0 ? t->dims[t->rank - 1] : (ir_dim){.n = 0};
  if (last.sym == IR_SYM_NONE && last.n % ir_dtype_block(t->dtype) == 0) return true;
  fail(c, "input '%s' is %s: its rows must hold whole 32-value blocks", t->name,
       ir_dtype_name(t->dtype));
  return false;
}

static bool want_rank(infer_ctx *c, const ir_tensor *t, int rank) {
  if (t->rank == rank) return true;
  char buf[128];
  ir_tensor_format_shape(t, buf, sizeof buf);
  fail(c, "input '%s' has wrong rank: %s", t->name, buf);
  return false;
}

static bool want_dim(infer_ctx *c, const ir_tensor *t, int axis, ir_dim want) {
  if (axis < t->rank && axis >= 0 && dim_eq(t->dims[axis], want)) return true;
  char buf[128], wb[24];
  ir_tensor_format_shape(t, buf, sizeof buf);
  fmt_dim(want, wb, sizeof wb);
  char msg[200];
  snprintf(msg, sizeof msg, "%s, expected %s at axis %d", buf, wb, axis);
  fail(c, "input '%s' has shape %s", t->name, msg);
  return false;
}

static bool want_attr(infer_ctx *c, const char *name) {
  if (ir_node_has_attr(c->n, name)) return true;
  fail(c, "needs attribute '%s'%s", name, "");
  return false;
}

static ir_dim D(int64_t n) { return (ir_dim){.n = n, .sym = IR_SYM_NONE}; }

typedef struct infer_out {
  ir_dtype *dt;
  int *rank;
  ir_dim (*dims)[IR_MAX_RANK];
  int *n;
} infer_out;

static void set_out(infer_out *o, int i, ir_dtype dt, int rank, const ir_dim *dims) {
  o->dt[i] = dt;
  o->rank[i] = rank;
  for (int k = 0; k < rank; k++) o->dims[i][k] = dims[k];
  if (*o->n < i + 1) *o->n = i + 1;
}

/* --- per-op rules --------------------------------------------------------------------- */

static ir_status infer_embed(infer_ctx *c, infer_out *o) {
  const ir_tensor *ids = in_t(c, 0, true), *tab = in_t(c, 1, true);
  if (!ids || !tab || !want_dtype(c, ids, IR_I32, IR_I32, IR_I32) || !want_rank(c, ids, 1) ||
      !want_weight_dtype(c, tab) || !want_rank(c, tab, 2))
    return c->d ? c->d->status : IR_BAD_FORMAT;
  if (ir_dtype_is_x16(tab->dtype))
    return fail(c, "table '%s' is %s: rows interleaved for matmuls only", tab->name,
                ir_dtype_name(tab->dtype));
  if (!(ir_node_attr_f(c->n, "scale", 1.0) > 0))
    return fail(c, "scale must be positive%s%s", "", "");
  ir_dim dims[2] = {ids->dims[0], tab->dims[1]};
  set_out(o, 0, IR_F32, 2, dims);
  return IR_OK;
}

/* rms_norm's weight w[G] of a plain norm may cover a slice of the row (G divides H). */
static bool norm_slices(const ir_tensor *x, const ir_tensor *w) {
  ir_dim h = x->dims[x->rank - 1], g = w->dims[0];
  return h.sym == IR_SYM_NONE && g.sym == IR_SYM_NONE && g.n > 0 && h.n % g.n == 0;
}

static ir_status infer_norm(infer_ctx *c, infer_out *o, bool fused) {
  const ir_tensor *x = in_t(c, 0, true);
  const ir_tensor *b = fused ? in_t(c, 1, true) : x;
  const ir_tensor *w = in_t(c, fused ? 2 : 1, true);
  if (!x || !b || !w || !want_attr(c, "eps") || !want_dtype(c, x, IR_F32, IR_F32, IR_F32) ||
      !want_dtype(c, w, IR_F32, IR_F32, IR_F32) || !want_rank(c, w, 1) || x->rank < 1 ||
      (!(!fused && norm_slices(x, w)) && !want_dim(c, w, 0, x->dims[x->rank - 1])))
    return IR_BAD_FORMAT;
  if (fused) {
    if (!want_dtype(c, b, IR_F32, IR_F32, IR_F32) || !want_rank(c, b, x->rank))
      return IR_BAD_FORMAT;
    for (int i = 0; i < x->rank; i++)
      if (!want_dim(c, b, i, x->dims[i])) return IR_BAD_FORMAT;
    set_out(o, 1, IR_F32, x->rank, x->dims);
  }
  set_out(o, 0, IR_F32, x->rank, x->dims);
  return IR_OK;
}

/* The i8/i4/f8_e4m3 weight of a matmul and its scales [N,G] and zero points [N,G]? (inputs
 * 3, 4; f8_e4m3: f32 scales per channel, G 1, no zero points). */
static bool want_wq_params(infer_ctx *c, const ir_tensor *w) {
  const ir_tensor *s = in_t(c, 3, false), *z = in_t(c, 4, false);
  int64_t k = w->dims[1].n, g = s && s->rank == 2 ? s->dims[1].n : 0;
  if (!s) {
    fail(c, "weight '%s' is %s: needs scales (input 3)", w->name, ir_dtype_name(w->dtype));
    return false;
  }
  if (!want_dtype(c, s, IR_F32, IR_F16, IR_F16) || !want_rank(c, s, 2) ||
      !want_dim(c, s, 0, w->dims[0]) ||
      (z &&
       (!(z->dtype == IR_F32 || want_dtype(c, z, IR_U8, IR_I8, IR_F16)) || !want_rank(c, z, 2) ||
        !want_dim(c, z, 0, w->dims[0]) || !want_dim(c, z, 1, s->dims[1]))))
    return false;
  if (w->dims[1].sym != IR_SYM_NONE || s->dims[1].sym != IR_SYM_NONE || g <= 0 || k % g ||
      (w->dtype == IR_I4 && k % 2)) {
    fail(c, "scales '%s' must split the K of weight '%s' into equal groups (i4: K even)", s->name,
         w->name);
    return false;
  }
  if (w->dtype == IR_F8_E4M3 && (z || g != 1 || s->dtype != IR_F32)) {
    fail(c, "an f8_e4m3 weight ('%s') takes f32 scales per channel and no zero points%s", w->name,
         "");
    return false;
  }
  if (ir_node_attr_i(c->n, "act_int8", 0) && (w->dtype != IR_I8 || z || g != 1 || k > 32768)) {
    fail(c,
         "act_int8 (W8A8) needs an i8 weight with per-channel scales, no zero points and "
         "K <= 32768 ('%s')%s",
         w->name, "");
    return false;
  }
  return true;
}

static ir_status infer_matmul(infer_ctx *c, infer_out *o) {
  const ir_tensor *x = in_t(c, 0, true), *w = in_t(c, 1, true), *b = in_t(c, 2, false);
  bool wq = w && (w->dtype == IR_I8 || w->dtype == IR_I4 || w->dtype == IR_F8_E4M3);
  if (!x || !w || !want_dtype(c, x, IR_F32, IR_F32, IR_F32) || !want_rank(c, x, 2) ||
      !(wq || want_weight_dtype(c, w)) || !want_rank(c, w, 2) || !want_dim(c, x, 1, w->dims[1]) ||
      (wq && !want_wq_params(c, w)))
    return IR_BAD_FORMAT;
  if (!wq && (in_t(c, 3, false) || in_t(c, 4, false)))
    return fail(c, "scales and zero points go with an i8, i4 or f8_e4m3 weight, not %s%s",
                ir_dtype_name(w->dtype), "");
  if (!wq && ir_node_attr_i(c->n, "act_int8", 0) &&
      (!ir_dtype_is_blocks(w->dtype) || w->dims[1].n > IR_Q8_ACT_MAX_K))
    return fail(c,
                "act_int8 goes with an i8 weight (W8A8) or a q8_0/q4_0/q4_1 weight with "
                "K <= 16384, not %s",
                ir_dtype_name(w->dtype), "");
  bool bf16x = ir_node_attr_i(c->n, "act_bf16", 0) != 0;
  if (bf16x && w->dtype != IR_BF16 && w->dtype != IR_BF16_X16 && !ir_dtype_is_blocks(w->dtype))
    return fail(c, "act_bf16 goes with a bf16 or q8_0/q4_0/q4_1 weight, not %s%s",
                ir_dtype_name(w->dtype), "");
  if (bf16x && ir_dtype_is_blocks(w->dtype) && x->dims[0].sym != IR_SYM_TOKENS)
    return fail(c,
                "act_bf16 with a %s weight needs the step's token rows as x (a row's kind "
                "picks its kernel)%s",
                ir_dtype_name(w->dtype), "");
  if (bf16x && ir_dtype_is_blocks(w->dtype) && w->dims[1].n > IR_Q8_ACT_MAX_K)
    return fail(c,
                "act_bf16 with a %s weight needs K <= 16384 (its generated rows take int8 "
                "activations)%s",
                ir_dtype_name(w->dtype), "");
  if (bf16x && ir_node_attr_i(c->n, "act_int8", 0))
    return fail(c, "act_bf16 and act_int8 exclude each other%s%s", "", "");
  if (bf16x && ir_dtype_is_blocks(w->dtype) &&
      (w->dims[0].sym != IR_SYM_NONE) |
          (w->dims[0].n % (ir_node_attr_i(c->n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU ? 32 : 16) !=
           0))
    return fail(c,
                "act_bf16 with a %s weight needs rows in whole 16-row groups (of gate and of up "
                "rows with swiglu)%s",
                ir_dtype_name(w->dtype), "");
  if (ir_dtype_is_x16(w->dtype) && !ir_node_attr_i(c->n, "act_bf16", 0))
    return fail(c, "a %s weight (16 rows interleaved) needs act_bf16", ir_dtype_name(w->dtype), "");
  if (ir_dtype_is_x16(w->dtype) && ir_node_attr_i(c->n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU &&
      w->dims[0].n % 32)
    return fail(c, "a swiglu %s weight needs whole 16-row groups of gate and of up rows%s",
                ir_dtype_name(w->dtype), "");
  if (ir_dtype_is_x8(w->dtype) && !ir_node_attr_i(c->n, "act_int8", 0) && !bf16x)
    return fail(c, "a %s weight (8 rows interleaved) needs act_int8 or act_bf16",
                ir_dtype_name(w->dtype), "");
  if (b && (!want_dtype(c, b, IR_F32, IR_F32, IR_F32) || !want_rank(c, b, 1) ||
            !want_dim(c, b, 0, w->dims[0])))
    return IR_BAD_FORMAT;
  ir_dim dims[2] = {x->dims[0], w->dims[0]};
  int64_t act = ir_node_attr_i(c->n, "act", IR_ACT_NONE);
  if (act != IR_ACT_NONE && act != IR_ACT_SWIGLU) {
    char num[24];
    snprintf(num, sizeof num, "%lld", (long long)act);
    return fail(c, "unknown matmul epilogue act=%s%s", num, "");
  }
  if (act == IR_ACT_SWIGLU) {
    if (w->dims[0].sym != IR_SYM_NONE || w->dims[0].n % 2)
      return fail(c,
                  "act=swiglu needs weight '%s' with an even row count (gate rows, then up "
                  "rows)%s",
                  w->name, "");
    dims[1] = D(w->dims[0].n / 2);
  }
  set_out(o, 0, IR_F32, 2, dims);
  return IR_OK;
}

static ir_status infer_rope(infer_ctx *c, infer_out *o) {
  const ir_tensor *x = in_t(c, 0, true), *pos = in_t(c, 1, true), *cs = in_t(c, 2, true);
  if (!x || !pos || !cs || !want_attr(c, "n_heads") || !want_attr(c, "head_dim") ||
      !want_attr(c, "rot_dim") || !want_rank(c, x, 2) || !want_rank(c, pos, 1) ||
      !want_dtype(c, pos, IR_I32, IR_I32, IR_I32) || !want_rank(c, cs, 3) ||
      !want_dtype(c, cs, IR_F32, IR_F32, IR_F32) || !want_dim(c, pos, 0, x->dims[0]))
    return IR_BAD_FORMAT;
  int64_t nh = ir_node_attr_i(c->n, "n_heads", 0), hd = ir_node_attr_i(c->n, "head_dim", 0);
  int64_t rot = ir_node_attr_i(c->n, "rot_dim", 0);
  if (nh <= 0 || hd <= 0 || rot <= 0 || rot > hd || rot % 2 || !want_dim(c, x, 1, D(nh * hd)) ||
      !want_dim(c, cs, 1, D(rot / 2)) || !want_dim(c, cs, 2, D(2)))
    return fail(c, "bad rope geometry%s%s", "", "");
  set_out(o, 0, IR_F32, 2, x->dims);
  return IR_OK;
}

/* The rope folded into attention: pos[T] i32 (input 3) and cs[P,rot/2,2] f32 (input 4). */
static bool want_attn_rope(infer_ctx *c, const ir_tensor *q, int64_t hd) {
  const ir_tensor *pos = in_t(c, 3, false), *cs = in_t(c, 4, false);
  if (!pos && !cs) return true;
  if (!pos || !cs) {
    fail(c,
         "rope in attention needs both positions (input 3) and the cos/sin table (input "
         "4)%s%s",
         "", "");
    return false;
  }
  int64_t rot = ir_node_attr_i(c->n, "rot_dim", 0);
  if (!want_attr(c, "rot_dim") || !want_rank(c, pos, 1) ||
      !want_dtype(c, pos, IR_I32, IR_I32, IR_I32) || !want_dim(c, pos, 0, q->dims[0]) ||
      !want_rank(c, cs, 3) || !want_dtype(c, cs, IR_F32, IR_F32, IR_F32))
    return false;
  if (rot <= 0 || rot > hd || rot % 2 || !want_dim(c, cs, 1, D(rot / 2)) ||
      !want_dim(c, cs, 2, D(2))) {
    fail(c, "bad rope geometry%s%s", "", "");
    return false;
  }
  return true;
}

/* The per-head q/k norm folded into attention: q_norm[hd], k_norm[hd] f32 (inputs 5, 6). */
static bool want_attn_norm(infer_ctx *c, int64_t hd) {
  const ir_tensor *qn = in_t(c, 5, false), *kn = in_t(c, 6, false);
  if (!qn && !kn) return true;
  if (!qn || !kn) {
    fail(c, "a q/k norm in attention needs both weights (inputs 5 and 6)%s%s", "", "");
    return false;
  }
  return want_attr(c, "qk_eps") && want_rank(c, qn, 1) && want_rank(c, kn, 1) &&
         want_dtype(c, qn, IR_F32, IR_F32, IR_F32) && want_dtype(c, kn, IR_F32, IR_F32, IR_F32) &&
         want_dim(c, qn, 0, D(hd)) && want_dim(c, kn, 0, D(hd));
}

static ir_status infer_attention(infer_ctx *c, infer_out *o) {
  bool has_k = c->n->n_in > 1 && c->n->in[1] >= 0, has_v = c->n->n_in > 2 && c->n->in[2] >= 0;
  bool packed = !has_k && !has_v;
  const ir_tensor *q = in_t(c, 0, true), *k = packed ? NULL : in_t(c, 1, true);
  const ir_tensor *v = packed ? NULL : in_t(c, 2, true);
  const char *req[] = {"layer", "n_heads", "n_kv_heads", "head_dim", "scale"};
  if (!q || (!packed && (!k || !v))) return IR_BAD_FORMAT;
  for (int i = 0; i < 5; i++)
    if (!want_attr(c, req[i])) return IR_BAD_FORMAT;
  int64_t nh = ir_node_attr_i(c->n, "n_heads", 0), nkv = ir_node_attr_i(c->n, "n_kv_heads", 0);
  int64_t hd = ir_node_attr_i(c->n, "head_dim", 0);
  if (nh <= 0 || nkv <= 0 || hd <= 0 || nh % nkv || hd > 256)
    return fail(c,
                "bad head geometry (n_heads must be a multiple of n_kv_heads, head_dim <= 256)%s%s",
                "", "");
  if (!want_dtype(c, q, IR_F32, IR_F32, IR_F32) || !want_rank(c, q, 2) ||
      !want_dim(c, q, 1, D((packed ? nh + 2 * nkv : nh) * hd)))
    return IR_BAD_FORMAT;
  if (!packed && (!want_rank(c, k, 2) || !want_rank(c, v, 2) || !want_dim(c, k, 1, D(nkv * hd)) ||
                  !want_dim(c, v, 1, D(nkv * hd)) || !want_dim(c, k, 0, q->dims[0]) ||
                  !want_dim(c, v, 0, q->dims[0])))
    return IR_BAD_FORMAT;
  if (!want_attn_rope(c, q, hd) || !want_attn_norm(c, hd)) return IR_BAD_FORMAT;
  if (ir_node_attr_i(c->n, "window", 0) < 0 || !(ir_node_attr_f(c->n, "softcap", 0) >= 0))
    return fail(c, "window and softcap must not be negative%s%s", "", "");
  ir_dim dims[2] = {q->dims[0], D(nh * hd)};
  set_out(o, 0, IR_F32, 2, dims);
  return IR_OK;
}

static ir_status infer_binary(infer_ctx *c, infer_out *o, bool same_only) {
  const ir_tensor *a = in_t(c, 0, true), *b = in_t(c, 1, true);
  if (!a || !b) return IR_BAD_FORMAT;
  if (!is_float(a->dtype) || a->dtype != b->dtype)
    return fail(c, "inputs must share one float dtype ('%s', '%s')", a->name, b->name);
  bool same = a->rank == b->rank;
  for (int i = 0; same && i < a->rank; i++) same = dim_eq(a->dims[i], b->dims[i]);
  bool row = b->rank == 1 && a->rank >= 1 && dim_eq(b->dims[0], a->dims[a->rank - 1]);
  bool scalar =
      b->rank == 0 || (b->rank == 1 && b->dims[0].sym == IR_SYM_NONE && b->dims[0].n == 1);
  if (!same && (same_only || !(row || scalar)))
    return fail(c, "shapes of '%s' and '%s' do not match", a->name, b->name);
  set_out(o, 0, a->dtype, a->rank, a->dims);
  return IR_OK;
}

static ir_status infer_swiglu(infer_ctx *c, infer_out *o) {
  int64_t act = ir_node_attr_i(c->n, "act", IR_ACT_SWIGLU);
  if (act != IR_ACT_SWIGLU && act != IR_ACT_GEGLU) {
    char num[24];
    snprintf(num, sizeof num, "%lld", (long long)act);
    return fail(c, "unknown gate activation act=%s%s", num, "");
  }
  return infer_binary(c, o, true);
}

static ir_status infer_softcap(infer_ctx *c, infer_out *o) {
  const ir_tensor *x = in_t(c, 0, true);
  if (!x || !want_attr(c, "cap") || !want_dtype(c, x, IR_F32, IR_F32, IR_F32)) return IR_BAD_FORMAT;
  if (!(ir_node_attr_f(c->n, "cap", 0) > 0)) return fail(c, "cap must be positive%s%s", "", "");
  set_out(o, 0, IR_F32, x->rank, x->dims);
  return IR_OK;
}

/* all_reduce, all_gather: f32 on every rank; ranks in 2..IR_MAX_TP. */
static ir_status infer_collective(infer_ctx *c, infer_out *o, bool gather) {
  const ir_tensor *x = in_t(c, 0, true);
  if (!x || !want_attr(c, "ranks") || !want_dtype(c, x, IR_F32, IR_F32, IR_F32))
    return IR_BAD_FORMAT;
  int64_t ranks = ir_node_attr_i(c->n, "ranks", 0);
  if (ranks < 2 || ranks > IR_MAX_TP)
    return fail(c, "ranks must be 2 to 64 (IR_MAX_TP)%s%s", "", "");
  if (!gather) {
    set_out(o, 0, IR_F32, x->rank, x->dims);
    return IR_OK;
  }
  if (!want_rank(c, x, 2)) return IR_BAD_FORMAT;
  if (x->dims[1].sym != IR_SYM_NONE) return fail(c, "gathers static columns%s%s", "", "");
  ir_dim dims[2] = {x->dims[0], {.n = x->dims[1].n * ranks, .sym = IR_SYM_NONE}};
  set_out(o, 0, IR_F32, 2, dims);
  return IR_OK;
}

static ir_status infer_gather(infer_ctx *c, infer_out *o) {
  const ir_tensor *x = in_t(c, 0, true), *r = in_t(c, 1, true);
  if (!x || !r || !want_rank(c, x, 2) || !want_rank(c, r, 1) ||
      !want_dtype(c, r, IR_I32, IR_I32, IR_I32) || !want_dtype(c, x, IR_F32, IR_F32, IR_F32))
    return IR_BAD_FORMAT;
  ir_dim dims[2] = {r->dims[0], x->dims[1]};
  set_out(o, 0, IR_F32, 2, dims);
  return IR_OK;
}

static ir_status infer_cast(infer_ctx *c, infer_out *o) {
  const ir_tensor *x = in_t(c, 0, true);
  if (!x || !want_attr(c, "to")) return IR_BAD_FORMAT;
  ir_dtype to = (ir_dtype)ir_node_attr_i(c->n, "to", 0);
  bool from_ok = is_float(x->dtype) || (ir_dtype_is_quant(x->dtype) && x->rank > 0 &&
                                        x->dims[x->rank - 1].sym == IR_SYM_NONE &&
                                        x->dims[x->rank - 1].n % ir_dtype_block(x->dtype) == 0);
  if (!is_float(to) || !from_ok)
    return fail(c,
                "cast goes from a float or whole-block quantized dtype to a float dtype "
                "(%s -> %s)",
                ir_dtype_name(x->dtype), ir_dtype_name(to));
  set_out(o, 0, to, x->rank, x->dims);
  return IR_OK;
}

ir_status ir_op_infer(const ir_graph *g, const ir_node *n, ir_dtype *out_dt, int *out_rank,
                      ir_dim (*out_dims)[IR_MAX_RANK], int *out_n, ir_diag *d) {
  infer_ctx c = {g, n, d};
  infer_out o = {out_dt, out_rank, out_dims, out_n};
  ir_diag local = {0};
  if (!d) c.d = &local;
  *out_n = 0;
  switch (n->op) {
  case IR_OP_EMBED: return infer_embed(&c, &o);
  case IR_OP_RMS_NORM: return infer_norm(&c, &o, false);
  case IR_OP_ADD_RMS_NORM: return infer_norm(&c, &o, true);
  case IR_OP_MATMUL: return infer_matmul(&c, &o);
  case IR_OP_ROPE: return infer_rope(&c, &o);
  case IR_OP_ATTENTION: return infer_attention(&c, &o);
  case IR_OP_SWIGLU: return infer_swiglu(&c, &o);
  case IR_OP_SOFTCAP: return infer_softcap(&c, &o);
  case IR_OP_ADD:
  case IR_OP_MUL: return infer_binary(&c, &o, false);
  case IR_OP_GATHER_ROWS: return infer_gather(&c, &o);
  case IR_OP_CAST: return infer_cast(&c, &o);
  case IR_OP_ALL_REDUCE: return infer_collective(&c, &o, false);
  case IR_OP_ALL_GATHER: return infer_collective(&c, &o, true);
  default:
    if (ir_op_is_nd(n->op)) return ir_op_nd_infer(g, n, out_dt, out_rank, out_dims, out_n, c.d);
    return ir_diag_set(c.d, IR_UNSUPPORTED, "node '%s': unknown op %d", n->name, (int)n->op);
  }
}
