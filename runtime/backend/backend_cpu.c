/* backend_cpu: runs IR nodes with the kernels in kernels/cpu on a thread pool. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend.h"
#include "backend_cpu_nd.h"
#include "kn_cpu.h"
#include "kn_matmul_wq.h"
#include "kn_quant.h"
#include "ir_alloc.h"

typedef struct cpu_ctx {
  kn_pool *pool;
  float *gather; /* all_gather's receive buffer (gather_cap floats), grown on demand */
  size_t gather_cap;
} cpu_ctx;

static int64_t dimv(const ir_graph *g, const ir_tensor *t, int axis, const model_step *s) {
  return ir_dim_value(g, t->dims[axis], s->syms);
}

#define T_(i) (&g->tensors[n->in[i]])
#define P_(i) (ptrs[n->in[i]])
#define O_(i) (ptrs[n->out[i]])

/* Unfolded casts (--no-fold): element by element, block-quantized sources included. */
static void run_cast(const ir_graph *g, const ir_node *n, void *const *ptrs, const model_step *s) {
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
                       const model_step *s) {
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

/* One kind's rows: kn_matmul_q8 (generated) or kn_matmul_bf16q (prompt). */
static void matmul_kind(kn_pool *p, bool g, float *y, const float *x, const void *w, ir_dtype wt,
                        const float *bias, int64_t m, int64_t n, int64_t k, bool swiglu) {
  if (g) kn_matmul_q8(p, y, x, w, wt, bias, m, n, k, swiglu);
  else kn_matmul_bf16q(p, y, x, w, wt, bias, m, n, k, swiglu);
}

/* A block matmul with act_bf16 over rows of two kinds (gen: 1 for a generated row, or NULL:
 * all prompt rows). Steps interleave decoding and prefilling sequences, so the rows of a
 * kind are gathered into one call each (one conversion, one pass over W); without memory
 * for that, each run of one kind is a call (the same bits). */
static void run_matmul_kinds(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt,
                             const float *bias, const uint8_t *gen, int64_t m, int64_t n, int64_t k,
                             bool swiglu) {
  int64_t n_gen = 0, runs = 0;
  for (int64_t i = 0; gen && i < m; i++) {
    n_gen += gen[i] != 0;
    runs += i == 0 || (gen[i] != 0) != (gen[i - 1] != 0);
  }
  if (n_gen == 0 || n_gen == m) {
    matmul_kind(p, n_gen > 0, y, x, w, wt, bias, m, n, k, swiglu);
    return;
  }
  float *xs = runs > 2 ? ir_malloc((size_t)(m * (k + n)) * sizeof *xs) : NULL;
  if (!xs) { /* two runs (or no memory): a call a run */
    for (int64_t i = 0, e; i < m; i = e) {
      bool g = gen[i] != 0;
      for (e = i + 1; e < m && (gen[e] != 0) == g;) e++;
      matmul_kind(p, g, y + i * n, x + i * k, w, wt, bias, e - i, n, k, swiglu);
    }
    return;
  }
  float *ys = xs + m * k;
  int64_t np = m - n_gen, at[2] = {0, np}; /* prompt rows first, then generated, in order */
  for (int64_t i = 0; i < m; i++)
    memcpy(xs + at[gen[i] != 0]++ * k, x + i * k, (size_t)k * sizeof *xs);
  matmul_kind(p, false, ys, xs, w, wt, bias, np, n, k, swiglu);
  matmul_kind(p, true, ys + np * n, xs + np * k, w, wt, bias, n_gen, n, k, swiglu);
  at[0] = 0, at[1] = np;
  for (int64_t i = 0; i < m; i++)
    memcpy(y + i * n, ys + at[gen[i] != 0]++ * n, (size_t)n * sizeof *ys);
  ir_free(xs);
}

/* matmul: float / block-quantized W (with act_int8: int8 activations, kn_matmul_q8; with
 * act_bf16: bf16 activations, kn_matmul_bf16q; bf16 W with act_bf16: kn_matmul_bf16x, or
 * kn_matmul_bf16x16 repacked), or
 * i8/i4 W with scales and zero points (inputs 3, 4), optionally with int8 activations
 * (act_int8, W8A8). */
static void run_matmul(kn_pool *p, const ir_graph *g, const ir_node *n, void *const *ptrs,
                       const model_step *s) {
  const ir_tensor *w = T_(1);
  const float *bias = n->n_in > 2 && n->in[2] >= 0 ? P_(2) : NULL;
  int64_t m = dimv(g, T_(0), 0, s), rows = dimv(g, w, 0, s), k = dimv(g, w, 1, s);
  if (ir_dtype_is_blocks(w->dtype) && ir_node_attr_i(n, "act_bf16", 0)) {
    /* prompt rows with bf16 activations, generated rows (s->tok_gen) with int8 ones: a
     * row's kind picks its kernel, whose result for it never depends on the other rows */
    bool swiglu = ir_node_attr_i(n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU;
    int64_t cols = swiglu ? rows / 2 : rows;
    const uint8_t *gen = s->tok_gen && m == s->syms[IR_SYM_TOKENS] ? s->tok_gen : NULL;
    run_matmul_kinds(p, O_(0), P_(0), P_(1), w->dtype, bias, gen, m, cols, k, swiglu);
    return;
  }
  if (ir_dtype_is_blocks(w->dtype) && ir_node_attr_i(n, "act_int8", 0)) {
    bool swiglu = ir_node_attr_i(n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU;
    kn_matmul_q8(p, O_(0), P_(0), P_(1), w->dtype, bias, m, swiglu ? rows / 2 : rows, k, swiglu);
    return;
  }
  if ((w->dtype == IR_BF16 || w->dtype == IR_BF16_X16) && ir_node_attr_i(n, "act_bf16", 0)) {
    bool swiglu = ir_node_attr_i(n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU;
    if (w->dtype == IR_BF16_X16)
      kn_matmul_bf16x16(p, O_(0), P_(0), P_(1), bias, m, swiglu ? rows / 2 : rows, k, swiglu);
    else kn_matmul_bf16x(p, O_(0), P_(0), P_(1), bias, m, swiglu ? rows / 2 : rows, k, swiglu);
    return;
  }
  if (w->dtype != IR_I8 && w->dtype != IR_I4 && w->dtype != IR_F8_E4M3) {
    if (ir_node_attr_i(n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU) /* W: gate rows, up rows */
      kn_matmul_swiglu(p, O_(0), P_(0), P_(1), w->dtype, bias, m, rows / 2, k);
    else kn_matmul(p, O_(0), P_(0), P_(1), w->dtype, bias, m, rows, k);
    return;
  }
  bool zp = n->n_in > 4 && n->in[4] >= 0;
  kn_wq q = {.q = P_(1),
             .qt = w->dtype,
             .scales = P_(3),
             .st = T_(3)->dtype,
             .zp = zp ? P_(4) : NULL,
             .zt = zp ? T_(4)->dtype : IR_U8,
             .group = k / T_(3)->dims[1].n};
  int act =
      ir_node_attr_i(n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU ? KN_WQ_ACT_SWIGLU : KN_WQ_ACT_NONE;
  if (ir_node_attr_i(n, "act_int8", 0)) kn_matmul_w8a8(p, O_(0), P_(0), &q, bias, m, rows, k, act);
  else kn_matmul_wq(p, O_(0), P_(0), &q, bias, m, rows, k, act);
}

/* q, k, v as separate tensors or one packed qkv (k, v absent), with the rope folded in
 * when positions and the cos/sin table are inputs 3 and 4, the per-head q/k norm when its
 * weights are inputs 5 and 6. */
static kn_attn_io attention_io(const ir_node *n, void *const *ptrs, int64_t nh, int64_t nkv,
                               int64_t hd) {
  kn_attn_io io = {.q = P_(0), .q_stride = nh * hd, .kv_stride = nkv * hd};
  if (n->n_in > 2 && n->in[1] >= 0) {
    io.k = P_(1), io.v = P_(2);
  } else { /* packed: one row is the q heads, then the k heads, then the v heads */
    io.q_stride = io.kv_stride = (nh + 2 * nkv) * hd;
    io.k = io.q + nh * hd, io.v = io.k + nkv * hd;
  }
  if (n->n_in > 4 && n->in[3] >= 0) {
    io.pos = P_(3), io.cos_sin = P_(4);
    io.rot_dim = ir_node_attr_i(n, "rot_dim", hd), io.neox = (int)ir_node_attr_i(n, "neox", 1);
  }
  if (n->n_in > 6 && n->in[5] >= 0) {
    io.q_norm = P_(5), io.k_norm = P_(6);
    io.qk_eps = (float)ir_node_attr_f(n, "qk_eps", 1e-6);
  }
  io.window = ir_node_attr_i(n, "window", 0);
  io.softcap = (float)ir_node_attr_f(n, "softcap", 0.0);
  io.bf16 = (int)ir_node_attr_i(n, "act_bf16", 0);
  return io;
}

static void run_attention(kn_pool *p, const ir_graph *g, const ir_node *n, void *const *ptrs,
                          const model_step *s) {
  int64_t layer = ir_node_attr_i(n, "layer", 0);
  const kv_cache *kv = s->kv;
  kn_kv_layer kl = {.k = kv->k[layer],
                    .v = kv->v[layer],
                    .n_blocks = kv->n_blocks,
                    .block_size = kv->block_size,
                    .n_kv_heads = kv->n_kv_heads,
                    .head_dim = kv->head_dim,
                    .k8 = kv->k8[layer],
                    .v8 = kv->v8[layer],
                    .k16 = kv->k16[layer],
                    .v16 = kv->v16[layer],
                    .k_scale = kv->k_scale[layer],
                    .v_scale = kv->v_scale[layer]};
  kn_attn_batch b = {.n_tok = s->syms[IR_SYM_TOKENS],
                     .tok_seq = s->tok_seq,
                     .tok_pos = s->tok_pos,
                     .max_blocks_per_seq = s->max_blocks,
                     .block_tables = s->block_tables};
  int64_t nh = ir_node_attr_i(n, "n_heads", 0);
  kn_attn_io io = attention_io(n, ptrs, nh, kv->n_kv_heads, kv->head_dim);
  kn_attention_paged_io(p, O_(0), &io, &kl, &b, nh, (float)ir_node_attr_f(n, "scale", 1.0));
}

/* all_gather's receive buffer grown to hold total floats. */
static ir_status gather_room(cpu_ctx *c, size_t total, ir_diag *d) {
  if (total <= c->gather_cap) return IR_OK;
  float *b = ir_realloc(c->gather, total * sizeof *b);
  if (!b) return ir_diag_set(d, IR_OOM, "out of memory");
  c->gather = b, c->gather_cap = total;
  return IR_OK;
}

/* all_reduce: the ranks' x summed into y on each; all_gather: x[R,C] of every rank side by
 * side into y[R,C*ranks] (received rank after rank, then interleaved by row). */
static ir_status run_collective(cpu_ctx *c, const ir_graph *g, const ir_node *n, void *const *ptrs,
                                const model_step *s, ir_diag *d) {
  const backend_comm *cm = s->comm;
  int64_t ranks = ir_node_attr_i(n, "ranks", 0);
  if (!cm || cm->size != ranks)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "node '%s' (%s): a collective over %lld ranks, and this model runs on %d",
                       n->name, ir_op_name(n->op), (long long)ranks, cm ? cm->size : 1);
  uint64_t cnt = ir_tensor_elems(g, T_(0), s->syms);
  if (n->op == IR_OP_ALL_REDUCE) {
    if (O_(0) != P_(0)) memcpy(O_(0), P_(0), cnt * sizeof(float));
    if (cm->all_reduce_sum_f32(cm->ctx, O_(0), (size_t)cnt))
      return ir_diag_set(d, IR_IO, "node '%s': the all-reduce over %d ranks failed", n->name,
                         cm->size);
    return IR_OK;
  }
  ir_status st = gather_room(c, (size_t)cnt * (size_t)ranks, d); /* sized at check */
  if (st != IR_OK) return st;
  if (cm->all_gather(cm->ctx, P_(0), (size_t)cnt * sizeof(float), c->gather))
    return ir_diag_set(d, IR_IO, "node '%s': the all-gather over %d ranks failed", n->name,
                       cm->size);
  int64_t rows = dimv(g, T_(0), 0, s), cols = dimv(g, T_(0), 1, s);
  float *y = O_(0);
  for (int64_t k = 0; k < ranks; k++)
    for (int64_t r = 0; r < rows; r++)
      memcpy(y + (r * ranks + k) * cols, c->gather + (k * rows + r) * cols,
             (size_t)cols * sizeof *y);
  return IR_OK;
}

static ir_status cpu_run_node(void *vctx, const ir_graph *g, int32_t ni, void *const *ptrs,
                              const model_step *s, ir_diag *d) {
  kn_pool *p = ((cpu_ctx *)vctx)->pool;
  const ir_node *n = &g->nodes[ni];
  float eps = (float)ir_node_attr_f(n, "eps", 1e-6);
  switch (n->op) {
  case IR_OP_EMBED: { /* vocab_part: the table is rows [rank R, (rank + 1) R) of the vocab */
    int64_t rows = dimv(g, T_(1), 0, s);
    int64_t row0 = ir_node_attr_i(n, "vocab_part", 0) && s->comm ? s->comm->rank * rows : 0;
    kn_embed_part(p, O_(0), P_(1), T_(1)->dtype, P_(0), dimv(g, T_(0), 0, s), dimv(g, T_(1), 1, s),
                  (float)ir_node_attr_f(n, "scale", 1.0), row0, rows);
    break;
  }
  case IR_OP_RMS_NORM: { /* rows of the weight's length: a slice of the row, or all of it */
    int64_t dim = dimv(g, T_(1), 0, s);
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
  case IR_OP_MATMUL: run_matmul(p, g, n, ptrs, s); break;
  case IR_OP_ROPE: {
    if (O_(0) != P_(0)) memcpy(O_(0), P_(0), ir_tensor_bytes(g, T_(0), s->syms));
    kn_rope(p, O_(0), P_(1), P_(2), dimv(g, T_(0), 0, s), ir_node_attr_i(n, "n_heads", 0),
            ir_node_attr_i(n, "head_dim", 0), ir_node_attr_i(n, "rot_dim", 0),
            (int)ir_node_attr_i(n, "neox", 1));
    break;
  }
  case IR_OP_ATTENTION: run_attention(p, g, n, ptrs, s); break;
  case IR_OP_SWIGLU:
    (ir_node_attr_i(n, "act", IR_ACT_SWIGLU) == IR_ACT_GEGLU ? kn_geglu : kn_swiglu)(
        p, O_(0), P_(0), P_(1), (int64_t)ir_tensor_elems(g, T_(0), s->syms));
    break;
  case IR_OP_SOFTCAP:
    kn_softcap(p, O_(0), P_(0), (int64_t)ir_tensor_elems(g, T_(0), s->syms),
               (float)ir_node_attr_f(n, "cap", 1.0));
    break;
  case IR_OP_ADD:
  case IR_OP_MUL: run_binary(p, g, n, ptrs, s); break;
  case IR_OP_GATHER_ROWS:
    kn_gather_rows(p, O_(0), P_(0), P_(1), dimv(g, T_(1), 0, s), dimv(g, T_(0), 1, s));
    break;
  case IR_OP_CAST: run_cast(g, n, ptrs, s); break;
  case IR_OP_ALL_REDUCE:
  case IR_OP_ALL_GATHER: return run_collective(vctx, g, n, ptrs, s, d);
  default:
    if (ir_op_is_nd(n->op)) return cpu_nd_run(p, g, ni, ptrs, d);
    return ir_diag_set(d, IR_UNSUPPORTED, "cpu backend: op '%s' (node '%s') is not supported",
                       ir_op_name(n->op), n->name);
  }
  return IR_OK;
}

static ir_status cpu_check(void *vctx, const ir_graph *g, ir_diag *d) {
  cpu_ctx *c = vctx;
  const ir_model_config *cf = &g->config;
  int64_t most[IR_SYM_COUNT] = {[IR_SYM_TOKENS] = cf->max_tokens,
                                [IR_SYM_SEQS] = cf->max_seqs,
                                [IR_SYM_LOGITS] = cf->max_logits};
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op <= IR_OP_INVALID || n->op >= IR_OP_COUNT)
      return ir_diag_set(d, IR_UNSUPPORTED, "cpu backend: node '%s' has an unknown op", n->name);
    ir_status st = ir_op_is_nd(n->op) ? cpu_nd_check(g, n, d) : IR_OK;
    if (st == IR_OK && n->op == IR_OP_ALL_GATHER) /* its buffer now, not mid-step */
      st = gather_room(c, (size_t)ir_tensor_elems(g, &g->tensors[n->out[0]], most), d);
    if (st != IR_OK) return st;
    if ((n->op == IR_OP_ADD || n->op == IR_OP_MUL) && g->tensors[n->out[0]].dtype != IR_F32)
      return ir_diag_set(d, IR_UNSUPPORTED, "cpu backend: node '%s': %s on %s", n->name,
                         ir_op_name(n->op), ir_dtype_name(g->tensors[n->out[0]].dtype));
  }
  return IR_OK;
}

/* The arena and the KV pool come from anonymous mmap: pages the kernel zero-fills on
 * first touch, so opening a model costs no memset and RSS grows only with the pages a
 * workload uses. A 64-byte header before the returned (64-aligned) pointer keeps the
 * mapping's length for munmap. */
enum { CPU_ALLOC_HEADER = 64 };

#if defined(__SANITIZE_ADDRESS__)
/* Under ASan the heap, so that overruns of the arena or the pool are caught. */
static void *cpu_alloc(void *vctx, size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
  memset(p, 0, bytes);
  return p;
}

static void cpu_free(void *vctx, void *p) { free(p); }
#else
static void *cpu_alloc(void *vctx, size_t bytes) {
  size_t len = bytes + CPU_ALLOC_HEADER;
  if (len < bytes) return NULL;
  void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return NULL;
  memcpy(base, &len, sizeof len);
  return (char *)base + CPU_ALLOC_HEADER;
}

static void cpu_free(void *vctx, void *p) {
  if (!p) return;
  char *base = (char *)p - CPU_ALLOC_HEADER;
  size_t len;
  memcpy(&len, base, sizeof len);
  munmap(base, len);
}
#endif

static void cpu_destroy(void *vctx) {
  cpu_ctx *c = vctx;
  kn_pool_destroy(c->pool);
  ir_free(c->gather);
  ir_free(c);
}

static const backend_ops k_cpu_ops = {
    .name = "cpu",
    .check = cpu_check,
    .run_node = cpu_run_node,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .destroy = cpu_destroy,
};

ir_status backend_cpu_create(int n_threads, rt_backend *out, ir_diag *d) {
  cpu_ctx *c = ir_calloc(1, sizeof *c);
  if (!c || !(c->pool = kn_pool_create(n_threads))) {
    ir_free(c);
    return ir_diag_set(d, IR_OOM, "cannot start %d CPU threads", n_threads);
  }
  *out = (rt_backend){.ops = &k_cpu_ops, .ctx = c};
  return IR_OK;
}

void backend_destroy(rt_backend *b) {
  if (b->ops) b->ops->destroy(b->ctx);
  *b = (rt_backend){0};
}
