/* kn_nd: CPU kernels of the n-d generic ops (IR_OP_ND_*, contracts in ir/ir_op_nd.c), one
 * op family per file, and kn_nd_exec, the one place that maps an IR node onto them. The
 * CPU backend runs n-d nodes through kn_nd_exec, and build-time constant folding
 * evaluates constant nodes with the same code, so a folded value is bit-identical to
 * what the runtime would have computed.
 *
 * Tensors are dense and row-major. Kernels never allocate, never alias an output with an
 * input (the memory planner guarantees it), and read indices from runtime tensors only
 * after checking them. Reductions over one row run in a fixed order, independent of the
 * thread count. */
#ifndef KN_ND_H
#define KN_ND_H

#include <stdbool.h>
#include <stdint.h>

#include "ir.h"
#include "kn_pool.h"

/* Runs node n of g. in[i] / out[i] are the addresses of its input and output tensors
 * (in[i] is NULL for an absent optional input). Fails with IR_INVALID_ARG when runtime
 * data is out of range (a gather index, a position id) and IR_UNSUPPORTED for an op the
 * kernels lack, with d set. p may be NULL (runs on the calling thread). */
ir_status kn_nd_exec(kn_pool *p, const ir_graph *g, const ir_node *n, const void *const *in,
                     void *const *out, ir_diag *d);

/* --- the kernels, by family ---------------------------------------------------------- */

/* A dense tensor; rank 0 is a scalar. */
typedef struct kn_view {
  void *data;
  ir_dtype dt;
  int rank;
  int64_t shape[IR_MAX_RANK];
} kn_view;

/* Scalar parameters of the unary ops (unused fields ignored). */
typedef struct kn_unary_params {
  float alpha, beta, gamma;
  double lo, hi;               /* clip bounds */
  bool approximate;            /* gelu: tanh form */
  bool detect_neg, detect_pos; /* isinf */
} kn_unary_params;

/* kn_nd_elementwise.c. y has x's shape (unary) or the broadcast shape (binary, where). */
void kn_nd_unary(kn_pool *p, ir_op op, const kn_unary_params *prm, const kn_view *y,
                 const kn_view *x);
void kn_nd_binary(kn_pool *p, ir_op op, bool fmod, const kn_view *y, const kn_view *a,
                  const kn_view *b);
void kn_nd_where(kn_pool *p, const kn_view *y, const kn_view *cond, const kn_view *a,
                 const kn_view *b);
/* Converts x to y's dtype; to_bool: y = (x != 0). */
void kn_nd_cast(kn_pool *p, const kn_view *y, const kn_view *x, bool to_bool);

/* kn_nd_reduce.c. axes: bit mask of reduced dims of x. */
void kn_nd_reduce(kn_pool *p, ir_op op, uint32_t axes, const kn_view *y, const kn_view *x);
void kn_nd_arg(kn_pool *p, bool is_max, int axis, bool select_last, const kn_view *y,
               const kn_view *x);
/* softmax, log_softmax, hardmax over `axis` (flat: over all dims from axis on). */
void kn_nd_softmax(kn_pool *p, ir_op op, int axis, bool flat, const kn_view *y, const kn_view *x);
void kn_nd_cumsum(kn_pool *p, int axis, bool exclusive, bool reverse, const kn_view *y,
                  const kn_view *x);

/* kn_nd_matmul.c */
void kn_nd_matmul(kn_pool *p, const kn_view *y, const kn_view *a, const kn_view *b);
void kn_nd_gemm(kn_pool *p, const kn_view *y, const kn_view *a, const kn_view *b, const kn_view *c,
                float alpha, float beta, bool trans_a, bool trans_b);

/* kn_nd_conv.c. strides, dilations: k values (NULL: ones); pads: k begins then k ends
 * (NULL: zeros); kernel: k extents. */
void kn_nd_conv(kn_pool *p, const kn_view *y, const kn_view *x, const kn_view *w, const kn_view *b,
                const int64_t *strides, const int64_t *pads, const int64_t *dilations,
                int64_t group);
void kn_nd_pool(kn_pool *p, const kn_view *y, const kn_view *x, const int64_t *kernel,
                const int64_t *strides, const int64_t *pads, const int64_t *dilations, bool avg,
                bool count_include_pad);

/* kn_nd_shape.c: data movement, any dtype. */
void kn_nd_copy(const kn_view *y, const kn_view *x);
void kn_nd_transpose(kn_pool *p, const kn_view *y, const kn_view *x, const int64_t *perm);
void kn_nd_concat(const kn_view *y, const kn_view *xs, int n, int axis);
void kn_nd_split(const kn_view *ys, int n, const kn_view *x, int axis);
void kn_nd_slice(kn_pool *p, const kn_view *y, const kn_view *x, const int64_t *starts,
                 const int64_t *steps);
void kn_nd_expand(kn_pool *p, const kn_view *y, const kn_view *x);
void kn_nd_tile(kn_pool *p, const kn_view *y, const kn_view *x);
void kn_nd_pad(kn_pool *p, const kn_view *y, const kn_view *x, const int64_t *pads, int mode,
               double value);
/* Fail (returning false, with d set) on an index outside [-n, n). */
bool kn_nd_gather(const kn_view *y, const kn_view *x, const kn_view *idx, int axis, ir_diag *d);
bool kn_nd_gather_elements(const kn_view *y, const kn_view *x, const kn_view *idx, int axis,
                           ir_diag *d);
void kn_nd_trilu(const kn_view *y, const kn_view *x, bool upper, int64_t k);

/* kn_nd_norm.c. Optional outputs (mean, inv_std, sum) may be NULL. */
void kn_nd_layer_norm(kn_pool *p, const kn_view *y, const kn_view *mean, const kn_view *inv_std,
                      const kn_view *x, const kn_view *scale, const kn_view *bias, int axis,
                      float eps, bool rms);
void kn_nd_skip_layer_norm(kn_pool *p, const kn_view *y, const kn_view *mean,
                           const kn_view *inv_std, const kn_view *sum, const kn_view *x,
                           const kn_view *skip, const kn_view *gamma, const kn_view *beta,
                           const kn_view *bias, float eps);

/* kn_nd_attention.c (ONNX Attention-23/24 and RotaryEmbedding-23 semantics). */
typedef struct kn_attn_params {
  int64_t q_heads, kv_heads;
  float scale, softcap; /* softcap 0: none */
  bool causal;
  int qk_mode; /* what `qk` receives: 0, 1 scores; 2 scores + mask; 3 softmax */
} kn_attn_params;
/* mask, past_k, past_v, nonpad and every output but y may be NULL (data == NULL). */
bool kn_nd_attention(kn_pool *p, const kn_attn_params *prm, const kn_view *y,
                     const kn_view *present_k, const kn_view *present_v, const kn_view *qk,
                     const kn_view *q, const kn_view *k, const kn_view *v, const kn_view *mask,
                     const kn_view *past_k, const kn_view *past_v, const kn_view *nonpad,
                     ir_diag *d);
bool kn_nd_rotary(kn_pool *p, const kn_view *y, const kn_view *x, const kn_view *cos_c,
                  const kn_view *sin_c, const kn_view *pos, int64_t num_heads, int64_t rot_dim,
                  bool interleaved, ir_diag *d);

#endif
