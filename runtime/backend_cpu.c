/* backend_cpu: runs IR nodes with the kernels in kernels/cpu on a thread pool. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cpu_nd.h"
#include "kn_cpu.h"
#include "kn_quant.h"

typedef struct cpu_ctx {
  kn_pool *pool;
} cpu_ctx;

static int64_t dimv(const ir_graph *g, const ir_tensor *t, int axis, const irt_step *s) {
  return ir_dim_value(g, t->dims[axis], s->syms);
}

#define T_(i) (&g->tensors[n->in[i]])
#define P_(i) (ptrs[n->in[i]])
#define O_(i) (ptrs[n->out[i]])

/* Unfolded casts (--no-fold): element by element, block-quantized sources included. */
static void run_cast(const ir_graph *g, const ir_node *n, void *const *ptrs, const irt_step *s) {
  const ir_tensor *x = T_(0), *y = &g->tensors[n->out[0]];
  uint64_t cnt = ir_tensor_elems(g, x, s->syms);
  for (uint64_t i = 0; i < cnt; i++) {
    float v = kn_dequant_one(P_(0), x->dtype, i);
    if (y->dtype == IR_F32) ((float *)O_(0))[i] = v;
    else if (y->dtype == IR_F16) ((uint16_t *)O_(0))[i] = ir_f32_to_f16(v);
    else ((uint16_t *)O_(0))[i] = ir_f32_to_bf16(v);
  }
}

/* add/mul with the broadcasts the verifier allows (same shape, row, scalar). */
static void run_binary(kn_pool *p, const ir_graph *g, const ir_node *n, void *const *ptrs,
                       const irt_step *s) {
  uint64_t na = ir_tensor_elems(g, T_(0), s->syms), nb = ir_tensor_elems(g, T_(1), s->syms);
  const float *a = P_(0), *b = P_(1);
  float *o = O_(0);
  if (n->op == IR_OP_ADD && na == nb) {
    kn_add(p, o, a, b, (int64_t)na);
    return;
  }
  for (uint64_t i = 0; i < na; i++) {
    float y = b[nb == na ? i : i % nb];
    o[i] = n->op == IR_OP_ADD ? a[i] + y : a[i] * y;
  }
}

static void run_attention(kn_pool *p, const ir_graph *g, const ir_node *n, void *const *ptrs,
                          const irt_step *s) {
  int64_t layer = ir_node_attr_i(n, "layer", 0);
  const irt_kv_cache *kv = s->kv;
  kn_kv_layer kl = {.k = kv->k[layer], .v = kv->v[layer], .n_blocks = kv->n_blocks,
                    .block_size = kv->block_size, .n_kv_heads = kv->n_kv_heads,
                    .head_dim = kv->head_dim};
  kn_attn_batch b = {.n_tok = s->syms[IR_SYM_TOKENS], .tok_seq = s->tok_seq,
                     .tok_pos = s->tok_pos, .max_blocks_per_seq = s->max_blocks,
                     .block_tables = s->block_tables};
  kn_attention_paged(p, O_(0), P_(0), P_(1), P_(2), &kl, &b, ir_node_attr_i(n, "n_heads", 0),
                     (float)ir_node_attr_f(n, "scale", 1.0));
}

static ir_status cpu_run_node(void *vctx, const ir_graph *g, int32_t ni, void *const *ptrs,
                              const irt_step *s, ir_diag *d) {
  kn_pool *p = ((cpu_ctx *)vctx)->pool;
  const ir_node *n = &g->nodes[ni];
  float eps = (float)ir_node_attr_f(n, "eps", 1e-6);
  switch (n->op) {
  case IR_OP_EMBED:
    kn_embed(p, O_(0), P_(1), T_(1)->dtype, P_(0), dimv(g, T_(0), 0, s), dimv(g, T_(1), 1, s));
    break;
  case IR_OP_RMS_NORM: {
    int64_t dim = dimv(g, T_(0), T_(0)->rank - 1, s);
    kn_rms_norm(p, O_(0), P_(0), P_(1), (int64_t)ir_tensor_elems(g, T_(0), s->syms) / dim, dim,
                eps);
    break;
  }
  case IR_OP_ADD_RMS_NORM: {
    int64_t dim = dimv(g, T_(0), T_(0)->rank - 1, s);
    kn_add_rms_norm(p, O_(0), O_(1), P_(0), P_(1), P_(2),
                    (int64_t)ir_tensor_elems(g, T_(0), s->syms) / dim, dim, eps);
    break;
  }
  case IR_OP_MATMUL:
    kn_matmul(p, O_(0), P_(0), P_(1), T_(1)->dtype, n->n_in > 2 && n->in[2] >= 0 ? P_(2) : NULL,
              dimv(g, T_(0), 0, s), dimv(g, T_(1), 0, s), dimv(g, T_(1), 1, s));
    break;
  case IR_OP_ROPE: {
    if (O_(0) != P_(0)) memcpy(O_(0), P_(0), ir_tensor_bytes(g, T_(0), s->syms));
    kn_rope(p, O_(0), P_(1), P_(2), dimv(g, T_(0), 0, s), ir_node_attr_i(n, "n_heads", 0),
            ir_node_attr_i(n, "head_dim", 0), ir_node_attr_i(n, "rot_dim", 0),
            (int)ir_node_attr_i(n, "neox", 1));
    break;
  }
  case IR_OP_ATTENTION: run_attention(p, g, n, ptrs, s); break;
  case IR_OP_SWIGLU:
    kn_swiglu(p, O_(0), P_(0), P_(1), (int64_t)ir_tensor_elems(g, T_(0), s->syms));
    break;
  case IR_OP_ADD:
  case IR_OP_MUL: run_binary(p, g, n, ptrs, s); break;
  case IR_OP_GATHER_ROWS:
    kn_gather_rows(p, O_(0), P_(0), P_(1), dimv(g, T_(1), 0, s), dimv(g, T_(0), 1, s));
    break;
  case IR_OP_CAST: run_cast(g, n, ptrs, s); break;
  default:
    if (ir_op_is_nd(n->op)) return irt_cpu_nd_run(p, g, ni, ptrs, d);
    return ir_diag_set(d, IR_UNSUPPORTED, "cpu backend: op '%s' (node '%s') is not supported",
                       ir_op_name(n->op), n->name);
  }
  return IR_OK;
}

static ir_status cpu_check(void *vctx, const ir_graph *g, ir_diag *d) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op <= IR_OP_INVALID || n->op >= IR_OP_COUNT)
      return ir_diag_set(d, IR_UNSUPPORTED, "cpu backend: node '%s' has an unknown op", n->name);
    ir_status st = ir_op_is_nd(n->op) ? irt_cpu_nd_check(g, n, d) : IR_OK;
    if (st != IR_OK) return st;
    if ((n->op == IR_OP_ADD || n->op == IR_OP_MUL) && g->tensors[n->out[0]].dtype != IR_F32)
      return ir_diag_set(d, IR_UNSUPPORTED, "cpu backend: node '%s': %s on %s", n->name,
                         ir_op_name(n->op), ir_dtype_name(g->tensors[n->out[0]].dtype));
  }
  return IR_OK;
}

static void *cpu_alloc(void *vctx, size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
  memset(p, 0, bytes);
  return p;
}

static void cpu_free(void *vctx, void *p) { free(p); }

static void cpu_destroy(void *vctx) {
  cpu_ctx *c = vctx;
  kn_pool_destroy(c->pool);
  free(c);
}

static const irt_backend_ops k_cpu_ops = {
    .name = "cpu",
    .check = cpu_check,
    .run_node = cpu_run_node,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .destroy = cpu_destroy,
};

ir_status irt_backend_cpu_create(int n_threads, irt_backend *out, ir_diag *d) {
  cpu_ctx *c = calloc(1, sizeof *c);
  if (!c || !(c->pool = kn_pool_create(n_threads))) {
    free(c);
    return ir_diag_set(d, IR_OOM, "cannot start %d CPU threads", n_threads);
  }
  *out = (irt_backend){.ops = &k_cpu_ops, .ctx = c};
  return IR_OK;
}

void irt_backend_destroy(irt_backend *b) {
  if (b->ops) b->ops->destroy(b->ctx);
  *b = (irt_backend){0};
}
