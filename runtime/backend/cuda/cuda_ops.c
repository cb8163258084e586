/* cuda_ops: one IR node as kernel launches on the backend's stream: NVRTC kernels from
 * the plan (kernels/cuda) for everything, cuBLAS for dense matmuls of more than
 * CUDA_GEMV_MAX_M rows. Nothing here synchronises, so a step can be captured as a graph. */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#define T_(i) (&g->tensors[n->in[i]])
#define TO_(i) (&g->tensors[n->out[i]])

/* The device address of tensor t: the step buffer for the step inputs, else ptrs[t]. */
static CUdeviceptr dp(const cuda_ctx *c, void *const *ptrs, int32_t t) {
  if (t == c->t_tokens) return cuda_stage_ptr(c, c->off_tok);
  if (t == c->t_positions) return cuda_stage_ptr(c, c->off_pos);
  if (t == c->t_rows) return cuda_stage_ptr(c, c->off_rows);
  return cuda_dptr(ptrs[t]);
}
#define P_(i) dp(c, ptrs, n->in[i])
#define O_(i) dp(c, ptrs, n->out[i])

static int64_t dimv(const ir_graph *g, const ir_tensor *t, int axis, const cuda_step *s) {
  return ir_dim_value(g, t->dims[axis], s->syms);
}

/* With c->pdl, as a programmatic dependent launch: the kernel may be scheduled while its
 * predecessor ends, and waits for it in kn_pdl() (kn_cuda.cuh). */
static ir_status launch(cuda_ctx *c, cuda_fn f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        void **args, ir_diag *d) {
  if (!gx || !gy || !gz) return IR_OK; /* nothing to do (an empty step dimension) */
  CUresult r;
  const bool pdl = c->pdl && !c->after_copy;
  c->after_copy = false;
  if (pdl) {
    cu_launch_attr at = {.id = CU_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, .value.value = 1};
    cu_launch_config cfg = {gx, gy, gz, bx, 1, 1, 0, c->stream, &at, 1};
    r = c->cu.launch_ex(&cfg, c->fn[f], args, NULL);
  } else {
    r = c->cu.launch(c->fn[f], gx, gy, gz, bx, 1, 1, 0, c->stream, args, NULL);
  }
  return r ? cuda_fail(c, r, "cuLaunchKernel", d) : IR_OK;
}

/* Grid of a grid-stride elementwise kernel over n values. */
static unsigned grid_for(long long n) {
  long long g = (n + 255) / 256;
  return (unsigned)(g > 4096 ? 4096 : g);
}

static ir_status run_embed(cuda_ctx *c, const ir_graph *g, const ir_node *n, void *const *ptrs,
                           const cuda_step *s, ir_diag *d) {
  static const cuda_fn by_dtype[] = {
      [IR_F32] = CF_EMBED_F32,   [IR_F16] = CF_EMBED_F16,   [IR_BF16] = CF_EMBED_BF16,
      [IR_Q8_0] = CF_EMBED_Q8_0, [IR_Q4_0] = CF_EMBED_Q4_0, [IR_Q4_1] = CF_EMBED_Q4_1};
  CUdeviceptr out = O_(0), table = P_(1), ids = P_(0);
  long long dim = dimv(g, T_(1), 1, s);
  float scale = (float)ir_node_attr_f(n, "scale", 1.0);
  void *args[] = {&out, &table, &ids, &dim, &scale};
  return launch(c, by_dtype[T_(1)->dtype], (unsigned)dimv(g, T_(0), 0, s), 1, 1, 256, args, d);
}

static bool half_copy(cuda_ctx *c, int32_t t, int64_t m, int64_t k, cuda_fn fn, int *bf16);

static ir_status run_norm(cuda_ctx *c, const ir_graph *g, const ir_node *n, void *const *ptrs,
                          const cuda_step *s, ir_diag *d) {
  /* a plain norm's rows are its weight's length: the whole row or a slice of it */
  int dim =
      (int)(n->op == IR_OP_RMS_NORM ? dimv(g, T_(1), 0, s) : dimv(g, T_(0), T_(0)->rank - 1, s));
  unsigned rows = (unsigned)(ir_tensor_elems(g, T_(0), s->syms) / (uint64_t)dim);
  float eps = (float)ir_node_attr_f(n, "eps", 1e-6);
  CUdeviceptr o0 = O_(0), a = P_(0), b = P_(1), xh = c->xh;
  int bf16 = 0;
  if (n->op == IR_OP_RMS_NORM) {
    const bool h = half_copy(c, n->out[0], rows, dim, CF_RMS_NORM_H, &bf16);
    void *args[] = {&o0, &a, &b, &dim, &eps}, *hargs[] = {&o0, &xh, &a, &b, &dim, &eps, &bf16};
    return launch(c, h ? CF_RMS_NORM_H : CF_RMS_NORM, rows, 1, 1, CUDA_RMS_THREADS,
                  h ? hargs : args, d);
  }
  const bool h = half_copy(c, n->out[0], rows, dim, CF_ADD_RMS_NORM_H, &bf16);
  CUdeviceptr o1 = O_(1), w = P_(2);
  void *args[] = {&o0, &o1, &a, &b, &w, &dim, &eps};
  void *hargs[] = {&o0, &xh, &o1, &a, &b, &w, &dim, &eps, &bf16};
  return launch(c, h ? CF_ADD_RMS_NORM_H : CF_ADD_RMS_NORM, rows, 1, 1, CUDA_RMS_THREADS,
                h ? hargs : args, d);
}

/* The GEMV kernel by weight dtype: [dtype][0] plain, [dtype][1] with the swiglu epilogue. */
static const cuda_fn k_gemv[][2] = {[IR_F32] = {CF_GEMV_F32, CF_GEMV_F32_SWIGLU},
                                    [IR_F16] = {CF_GEMV_F16, CF_GEMV_F16_SWIGLU},
                                    [IR_BF16] = {CF_GEMV_BF16, CF_GEMV_BF16_SWIGLU},
                                    [IR_Q8_0] = {CF_GEMV_Q8_0, CF_GEMV_Q8_0_SWIGLU},
                                    [IR_Q4_0] = {CF_GEMV_Q4_0, CF_GEMV_Q4_0_SWIGLU},
                                    [IR_Q4_1] = {CF_GEMV_Q4_1, CF_GEMV_Q4_1_SWIGLU}};

/* y(m, nn) = x . W^T (+ bias); with swiglu, W has 2 nn rows and y = silu(gate) * up. */
static ir_status run_gemv(cuda_ctx *c, ir_dtype wt, bool swiglu, CUdeviceptr y, CUdeviceptr x,
                          CUdeviceptr w, CUdeviceptr bias, int m, int nn, int k, ir_diag *d) {
  void *args[] = {&y, &x, &w, &bias, &m, &nn, &k};
  return launch(c, k_gemv[wt][swiglu], (unsigned)((nn + CUDA_GEMV_WARPS - 1) / CUDA_GEMV_WARPS),
                (unsigned)((m + CUDA_GEMV_M - 1) / CUDA_GEMV_M), 1, CUDA_GEMV_WARPS * 32, args, d);
}

static bool dense(ir_dtype t) { return t == IR_F32 || t == IR_F16 || t == IR_BF16; }
static bool block(ir_dtype t) { return t == IR_Q8_0 || t == IR_Q4_0 || t == IR_Q4_1; }

static bool wq_type(ir_dtype t) { return t == IR_I8 || t == IR_I4 || t == IR_F8_E4M3; }

static cuda_fn dequant_wq_fn(ir_dtype t) {
  return t == IR_I4 ? CF_DEQUANT_WQ_I4 : t == IR_F8_E4M3 ? CF_DEQUANT_WQ_F8 : CF_DEQUANT_WQ_I8;
}

/* Weight-only int8/int4/FP8 weights can take cuBLAS: their f16 copy (kn_dequant_wq_*) from
 * c->dequant_gemm_m rows, as block weights (plans built before it: GEMV only). */
static bool wq_dequant_ok(const cuda_ctx *c, ir_dtype wt, int64_t k) {
  return wq_type(wt) && c->dequant_gemm_m > 0 && c->blas_h && c->fn[CF_CAST_F16] &&
         c->fn[dequant_wq_fn(wt)] && k % 16 == 0;
}

static cuda_fn dequant_fn(ir_dtype t) {
  return t == IR_Q8_0 ? CF_DEQUANT_Q8_0 : t == IR_Q4_0 ? CF_DEQUANT_Q4_0 : CF_DEQUANT_Q4_1;
}

/* Row-major y(m, n) = x(m, k) . W(n, k)^T is column-major y^T = W^T(k, n)^T . x^T: cuBLAS
 * computes C(n x m) = op(A) B with A = W (k x n, ld k) transposed, B = x^T (k x m, ld k).
 * Block weights go through their f16 copy (c->wh), f16/bf16 weights take x in their type. */
static ir_status run_gemm(cuda_ctx *c, ir_dtype wt, CUdeviceptr y, int32_t xt, CUdeviceptr x,
                          CUdeviceptr w, CUdeviceptr bias, int m, int nn, int k, ir_diag *d) {
  int type = CUB_R_32F;
  CUdeviceptr xb = x;
  if (block(wt)) { /* the f16 copy of W in the weight scratch */
    long long blocks = (long long)nn * k / 32;
    void *args[] = {&c->wh, &w, &blocks};
    ir_status st = launch(c, dequant_fn(wt), grid_for(blocks * 4), 1, 1, 256, args, d);
    if (st != IR_OK) return st;
    w = c->wh, wt = IR_F16;
  }
  if (wt != IR_F32) { /* both operands in the weights' type: x's copy in xh, or made now */
    const bool bf16 = wt == IR_BF16;
    xb = c->xh;
    if (c->xh_tensor != xt || c->xh_bf16 != bf16) {
      long long cnt = (long long)m * k;
      void *args[] = {&xb, &x, &cnt};
      ir_status st =
          launch(c, bf16 ? CF_CAST_BF16 : CF_CAST_F16, grid_for(cnt), 1, 1, 256, args, d);
      if (st != IR_OK) return st;
      c->xh_tensor = xt, c->xh_bf16 = bf16;
    }
    type = bf16 ? CUB_R_16BF : CUB_R_16F;
  }
  const float one = 1.0f, zero = 0.0f;
  cublas_status bs =
      c->blas.gemm_ex(c->blas_h, CUB_OP_T, CUB_OP_N, nn, m, k, &one, (const void *)(uintptr_t)w,
                      type, k, (const void *)(uintptr_t)xb, type, k, &zero, (void *)(uintptr_t)y,
                      CUB_R_32F, nn, CUB_COMPUTE_32F, CUB_GEMM_DEFAULT);
  if (bs != 0)
    return ir_diag_set(d, IR_DEVICE, "cuBLAS GEMM (%d x %d x %d) failed with status %d", m, nn, k,
                       bs);
  if (!bias) return IR_OK;
  long long mm = m, n64 = nn;
  void *args[] = {&y, &bias, &mm, &n64};
  return launch(c, CF_ADD_BIAS, grid_for(mm * n64), 1, 1, 256, args, d);
}

/* The GEMV kernels load 16 bytes of a weight row at a time (gemv.cu). */
static bool gemv_ok(ir_dtype wt, int64_t k) {
  return wt == IR_F32 ? k % 4 == 0 : dense(wt) ? k % 8 == 0 : k % 32 == 0;
}

static bool blas_ok(const cuda_ctx *c, ir_dtype wt) {
  return dense(wt) && c->blas_h && (wt == IR_F32 || c->fn[CF_CAST_F16]);
}

/* Block weights can take cuBLAS (f16 copies from kn_dequant_*, plans built before it: no). */
static bool dequant_ok(const cuda_ctx *c, ir_dtype wt) {
  return block(wt) && c->dequant_gemm_m > 0 && c->blas_h && c->fn[CF_CAST_F16] &&
         c->fn[dequant_fn(wt)];
}

/* This matmul of m rows of x runs on cuBLAS: dense weights past the GEMV's rows (or a k it
 * cannot take), block weights from c->dequant_gemm_m rows. */
static bool gemm_of(const cuda_ctx *c, ir_dtype wt, int64_t m, int64_t k) {
  if (block(wt)) return dequant_ok(c, wt) && m >= c->dequant_gemm_m;
  if (wq_type(wt)) return wq_dequant_ok(c, wt, k) && m >= c->dequant_gemm_m;
  return blas_ok(c, wt) && (m > CUDA_GEMV_MAX_M || !gemv_ok(wt, k));
}

/* Whether the producer of tensor t (m rows of k; fn its _h kernel) writes t's f16/bf16 copy
 * into xh itself: a GEMM on half weights reads t (xh_wt) and runs on cuBLAS at these m, k
 * (gemm_of, as run_matmul decides). Then xh holds t from the producer's launch on. */
static bool half_copy(cuda_ctx *c, int32_t t, int64_t m, int64_t k, cuda_fn fn, int *bf16) {
  ir_dtype wt = c->xh_wt ? (ir_dtype)c->xh_wt[t] : (ir_dtype)0;
  if (!wt || !c->fn[fn] || !gemm_of(c, wt, m, k)) return false;
  *bf16 = wt == IR_BF16;
  c->xh_tensor = t, c->xh_bf16 = wt == IR_BF16;
  return true;
}

/* gemv_wq.cu's zero-point code (0 none, 1 u8, 2 i8, 3 f16, 4 f32), or -1: not readable. */
static int wq_zt(const ir_graph *g, const ir_node *n) {
  if (n->n_in < 5 || n->in[4] < 0) return 0;
  switch (T_(4)->dtype) {
  case IR_U8: return 1;
  case IR_I8: return 2;
  case IR_F16: return 3;
  case IR_F32: return 4;
  default: return -1;
  }
}

/* Weight-only int8/int4/FP8 (inputs 3, 4: scales, zero points) for every m into y (m, all
 * of W's rows): gemv_wq.cu, whose CTAs loop over the row tiles past the grid's 65535 in y;
 * or, for many rows (blas), W's f16 copy into the weight scratch (c->wh), then cuBLAS on it
 * as on f16 weights. */
static ir_status run_wq(cuda_ctx *c, const ir_graph *g, const ir_node *n, void *const *ptrs,
                        const cuda_step *s, CUdeviceptr y, bool blas, ir_diag *d) {
  int m = (int)dimv(g, T_(0), 0, s), nn = (int)dimv(g, T_(1), 0, s), k = (int)dimv(g, T_(1), 1, s);
  int group = k / (int)dimv(g, T_(3), 1, s), st = T_(3)->dtype == IR_F16, zt = wq_zt(g, n);
  CUdeviceptr x = P_(0), w = P_(1), sc = P_(3), zp = zt ? P_(4) : 0;
  CUdeviceptr bias = n->in[2] >= 0 ? P_(2) : 0;
  ir_dtype qt = T_(1)->dtype;
  if (blas) {
    long long rows = nn;
    void *args[] = {&c->wh, &w, &sc, &zp, &rows, &k, &group, &st, &zt};
    ir_status r = launch(c, dequant_wq_fn(qt), grid_for(rows * k / 8), 1, 1, 256, args, d);
    return r == IR_OK ? run_gemm(c, IR_F16, y, n->in[0], x, c->wh, bias, m, nn, k, d) : r;
  }
  long long tiles = ((long long)m + CUDA_GEMV_M - 1) / CUDA_GEMV_M;
  void *args[] = {&y, &x, &w, &bias, &sc, &zp, &m, &nn, &k, &group, &st, &zt};
  return launch(c,
                qt == IR_I4        ? CF_GEMV_WQ_I4
                : qt == IR_F8_E4M3 ? CF_GEMV_WQ_F8
                                   : CF_GEMV_WQ_I8,
                (unsigned)((nn + CUDA_GEMV_WARPS - 1) / CUDA_GEMV_WARPS),
                (unsigned)(tiles > 65535 ? 65535 : tiles), 1, CUDA_GEMV_WARPS * 32, args, d);
}

static bool swiglu_of(const ir_node *n) {
  return ir_node_attr_i(n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU;
}

/* Matmuls: the GEMV kernels for few rows (a fused gate_up's swiglu in their epilogue),
 * cuBLAS for more (gemm_of), gemv_wq for int8/int4 weights. A fused gate_up that is not on the GEMV
 * kernels writes its (m, 2n) sums to the swiglu scratch, then kn_swiglu_packed. */
static ir_status run_matmul(cuda_ctx *c, const ir_graph *g, const ir_node *n, void *const *ptrs,
                            const cuda_step *s, ir_diag *d) {
  int m = (int)dimv(g, T_(0), 0, s), nn = (int)dimv(g, T_(1), 0, s), k = (int)dimv(g, T_(1), 1, s);
  ir_dtype wt = T_(1)->dtype;
  CUdeviceptr bias = n->n_in > 2 && n->in[2] >= 0 ? P_(2) : 0, y = O_(0);
  bool swiglu = swiglu_of(n), wq = wq_type(wt);
  bool blas = gemm_of(c, wt, m, k);
  if (m == 0) return IR_OK;
  if (swiglu && !wq && !blas) return run_gemv(c, wt, true, y, P_(0), P_(1), bias, m, nn / 2, k, d);
  CUdeviceptr z = swiglu ? c->zh : y;
  ir_status st = wq     ? run_wq(c, g, n, ptrs, s, z, blas, d)
                 : blas ? run_gemm(c, wt, z, n->in[0], P_(0), P_(1), bias, m, nn, k, d)
                        : run_gemv(c, wt, false, z, P_(0), P_(1), bias, m, nn, k, d);
  if (st != IR_OK || !swiglu) return st;
  long long mm = m, half = nn / 2;
  CUdeviceptr xh = c->xh;
  int bf16 = 0;
  const bool h = half_copy(c, n->out[0], m, half, CF_SWIGLU_PACKED_H, &bf16);
  void *args[] = {&y, &z, &mm, &half}, *hargs[] = {&y, &xh, &z, &mm, &half, &bf16};
  return launch(c, h ? CF_SWIGLU_PACKED_H : CF_SWIGLU_PACKED, grid_for(mm * half), 1, 1, 256,
                h ? hargs : args, d);
}

static ir_status run_rope(cuda_ctx *c, const ir_graph *g, const ir_node *n, void *const *ptrs,
                          const cuda_step *s, ir_diag *d) {
  CUdeviceptr x = O_(0), src = P_(0), pos = P_(1), cs = P_(2);
  if (x != src) {
    CUresult r = c->cu.dtod(x, src, ir_tensor_bytes(g, T_(0), s->syms), c->stream);
    if (r) return cuda_fail(c, r, "cuMemcpyDtoDAsync", d);
    c->after_copy = true;
  }
  int heads = (int)ir_node_attr_i(n, "n_heads", 0), hd = (int)ir_node_attr_i(n, "head_dim", 0);
  int rot = (int)ir_node_attr_i(n, "rot_dim", 0);
  int threads = (heads * rot / 2 + 31) / 32 * 32;
  void *args[] = {&x, &pos, &cs, &heads, &hd, &rot};
  return launch(c, ir_node_attr_i(n, "neox", 1) ? CF_ROPE_NEOX : CF_ROPE_INTERLEAVED,
                (unsigned)dimv(g, T_(0), 0, s), 1, 1,
                (unsigned)(threads > 1024 ? 1024
                           : threads < 32 ? 32
                                          : threads),
                args, d);
}

/* The KV blocks one decode token's attention reads, at most: all maxb, or under a sliding
 * window of `window` positions the blocks those can span. */
static int window_blocks(int maxb, int64_t window, int64_t bs) {
  if (window <= 0 || bs <= 0) return maxb;
  int64_t nb = (window + bs - 2) / bs + 1;
  return nb < maxb ? (int)nb : maxb;
}

/* Decode splits for n_tok tokens reading up to nb blocks each: enough CTAs (tokens x heads
 * x splits) to fill the GPU about twice, within c->n_splits and about 8 blocks (2 per warp)
 * a split (alloc_scratch's rule, which a window's fewer blocks tighten). A function of
 * n_tok and the node alone, so a captured graph's bucket always gets the same, whatever the
 * contexts; a split past a short context exits at once, and a big batch needs no split (and
 * no reduce launch) at all. */
static int decode_splits(const cuda_ctx *c, int n_tok, int heads, int nb) {
  long long ctas = (long long)n_tok * heads, most = (nb + 7) / 8;
  long long want = ctas > 0 ? (2LL * c->n_sm + ctas - 1) / ctas : 1;
  if (most > c->n_splits) most = c->n_splits;
  if (most < 1) most = 1;
  return want < 1 ? 1 : want > most ? (int)most : (int)want;
}

/* The KV write (kn_kv_write; or kn_rope_kv_write for the fused forms: rope and/or the
 * per-head q/k norm folded in, packed qkv), then split-K decode attention (+ reduce) or
 * tiled prefill attention, with the node's sliding window and score soft cap (0: none).
 * The fused forms' rotated q goes to the output buffer, which the attention kernels then
 * read as q: each (token, head) row is read before the same CTA writes it. */
static ir_status run_attention(cuda_ctx *c, const ir_graph *g, const ir_node *n, void *const *ptrs,
                               const cuda_step *s, ir_diag *d) {
  int layer = (int)ir_node_attr_i(n, "layer", 0), heads = (int)ir_node_attr_i(n, "n_heads", 0);
  int kvh = (int)s->kv->n_kv_heads, maxb = (int)s->max_blocks;
  float scale = (float)ir_node_attr_f(n, "scale", 1.0);
  int window = (int)ir_node_attr_i(n, "window", 0);
  float softcap = (float)ir_node_attr_f(n, "softcap", 0.0);
  unsigned n_tok = (unsigned)s->syms[IR_SYM_TOKENS];
  CUdeviceptr out = O_(0), q = P_(0);
  const bool f16 = c->kv_f16;
  CUdeviceptr kc = cuda_dptr(f16 ? (void *)s->kv->k16[layer] : (void *)s->kv->k[layer]);
  CUdeviceptr vc = cuda_dptr(f16 ? (void *)s->kv->v16[layer] : (void *)s->kv->v[layer]);
  CUdeviceptr seq = cuda_stage_ptr(c, c->off_seq), pos = cuda_stage_ptr(c, c->off_pos);
  CUdeviceptr bt = cuda_stage_ptr(c, c->off_bt);
  bool packed = n->in[1]<0, roped = n->n_in> 3 && n->in[3] >= 0;
  bool normed = n->n_in > 6 && n->in[5] >= 0;
  ir_status st;
  if (packed || roped || normed) {
    long long hd = c->head_dim, q_stride = heads * hd, kv_stride = kvh * hd;
    CUdeviceptr kn = packed ? q + (CUdeviceptr)(heads * hd * 4) : P_(1);
    CUdeviceptr vn = packed ? kn + (CUdeviceptr)(kv_stride * 4) : P_(2);
    if (packed) q_stride = kv_stride = (heads + 2LL * kvh) * hd;
    CUdeviceptr cs = roped ? P_(4) : 0;
    int rot = roped ? (int)ir_node_attr_i(n, "rot_dim", 0) : 0;
    int neox = (int)ir_node_attr_i(n, "neox", 1);
    CUdeviceptr qn = normed ? P_(5) : 0, kn_w = normed ? P_(6) : 0;
    float qk_eps = (float)ir_node_attr_f(n, "qk_eps", 1e-6);
    void *wargs[] = {&out, &kc,   &vc,    &q,   &kn, &vn,  &q_stride, &kv_stride, &seq,  &pos,
                     &bt,  &maxb, &heads, &kvh, &cs, &rot, &neox,     &qn,        &kn_w, &qk_eps};
    st = launch(c, f16 ? CF_ROPE_KV_WRITE_F16 : CF_ROPE_KV_WRITE, n_tok, 1, 1, 256, wargs, d);
    q = out;
  } else {
    CUdeviceptr kn = P_(1), vn = P_(2);
    void *wargs[] = {&kc, &vc, &kn, &vn, &seq, &pos, &bt, &maxb, &kvh};
    st = launch(c, f16 ? CF_KV_WRITE_F16 : CF_KV_WRITE, n_tok, 1, 1, 256, wargs, d);
  }
  if (st != IR_OK) return st;
  if (!s->decode) {
    CUdeviceptr t0 = cuda_stage_ptr(c, c->off_tile0), tn = cuda_stage_ptr(c, c->off_tilen);
    void *args[] = {&out,   &q,   &kc,    &vc, &seq, &pos,    &bt,     &maxb,
                    &heads, &kvh, &scale, &t0, &tn,  &window, &softcap};
    cuda_fn fn = c->tc_prefill ? (f16 ? CF_ATTN_PREFILL_TC_F16 : CF_ATTN_PREFILL_TC)
                               : (f16 ? CF_ATTN_PREFILL_F16 : CF_ATTN_PREFILL);
    return launch(c, fn, (unsigned)s->n_tiles, (unsigned)heads, 1, CUDA_ATTN_WARPS * 32, args, d);
  }
  /* under a window, the splits share out its blocks alone (attention.cu starts them at the
   * token's first visible block) */
  int nb = window_blocks(maxb, window, s->kv->block_size);
  int splits = decode_splits(c, (int)n_tok, heads, nb), bps = (nb + splits - 1) / splits;
  CUdeviceptr pa = c->part_acc, pm = c->part_ml;
  void *args[] = {&out, &pa,   &pm,    &q,   &kc,    &vc,  &seq,    &pos,
                  &bt,  &maxb, &heads, &kvh, &scale, &bps, &window, &softcap};
  st = launch(c, f16 ? CF_ATTN_DECODE_F16 : CF_ATTN_DECODE, n_tok, (unsigned)heads,
              (unsigned)splits, CUDA_ATTN_WARPS * 32, args, d);
  if (st != IR_OK || splits == 1) return st;
  void *rargs[] = {&out, &pa, &pm, &heads, &splits};
  return launch(c, CF_ATTN_REDUCE, n_tok, (unsigned)heads, 1, (unsigned)c->head_dim, rargs, d);
}

/* add, and swiglu with its gate activation (silu, or gelu_tanh: kn_geglu). */
static ir_status run_elementwise(cuda_ctx *c, const ir_graph *g, const ir_node *n,
                                 void *const *ptrs, const cuda_step *s, ir_diag *d) {
  CUdeviceptr o = O_(0), a = P_(0), b = P_(1);
  long long cnt = (long long)ir_tensor_elems(g, T_(0), s->syms);
  void *args[] = {&o, &a, &b, &cnt};
  cuda_fn f = CF_ADD;
  if (n->op == IR_OP_SWIGLU)
    f = ir_node_attr_i(n, "act", IR_ACT_SWIGLU) == IR_ACT_GEGLU ? CF_GEGLU : CF_SWIGLU;
  return launch(c, f, grid_for(cnt), 1, 1, 256, args, d);
}

/* y = cap * tanh(x / cap) (Gemma 2's final logits, before any pick reads them). */
static ir_status run_softcap(cuda_ctx *c, const ir_graph *g, const ir_node *n, void *const *ptrs,
                             const cuda_step *s, ir_diag *d) {
  CUdeviceptr o = O_(0), x = P_(0);
  long long cnt = (long long)ir_tensor_elems(g, T_(0), s->syms);
  float cap = (float)ir_node_attr_f(n, "cap", 1.0);
  void *args[] = {&o, &x, &cnt, &cap};
  return launch(c, CF_SOFTCAP, grid_for(cnt), 1, 1, 256, args, d);
}

static ir_status run_gather(cuda_ctx *c, const ir_graph *g, const ir_node *n, void *const *ptrs,
                            const cuda_step *s, ir_diag *d) {
  CUdeviceptr o = O_(0), x = P_(0), rows = P_(1);
  long long dim = dimv(g, T_(0), 1, s);
  void *args[] = {&o, &x, &rows, &dim};
  return launch(c, CF_GATHER_ROWS, (unsigned)dimv(g, T_(1), 0, s), 1, 1, 256, args, d);
}

ir_status cuda_ops_run(cuda_ctx *c, const ir_graph *g, int32_t ni, void *const *ptrs,
                       const cuda_step *s, ir_diag *d) {
  const ir_node *n = &g->nodes[ni];
  switch (n->op) {
  case IR_OP_EMBED: return run_embed(c, g, n, ptrs, s, d);
  case IR_OP_RMS_NORM:
  case IR_OP_ADD_RMS_NORM: return run_norm(c, g, n, ptrs, s, d);
  case IR_OP_MATMUL: return run_matmul(c, g, n, ptrs, s, d);
  case IR_OP_ROPE: return run_rope(c, g, n, ptrs, s, d);
  case IR_OP_ATTENTION: return run_attention(c, g, n, ptrs, s, d);
  case IR_OP_ADD:
  case IR_OP_SWIGLU: return run_elementwise(c, g, n, ptrs, s, d);
  case IR_OP_SOFTCAP: return run_softcap(c, g, n, ptrs, s, d);
  case IR_OP_GATHER_ROWS: return run_gather(c, g, n, ptrs, s, d);
  default:
    return ir_diag_set(d, IR_UNSUPPORTED, "cuda backend: op '%s' (node '%s') is not supported",
                       ir_op_name(n->op), n->name);
  }
}

/* --- load-time checks ---------------------------------------------------------------------- */

static bool same_shape(const ir_graph *g, const ir_tensor *a, const ir_tensor *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i].sym != b->dims[i].sym || (!a->dims[i].sym && a->dims[i].n != b->dims[i].n))
      return false;
  return true;
}

/* The weight-only matmul n of this plan can take cuBLAS (a step can have enough rows). */
static bool wq_dequant_plan(const cuda_ctx *c, const ir_graph *g, const ir_node *n) {
  return T_(1)->rank == 2 &&
         wq_dequant_ok(c, T_(1)->dtype, ir_dim_value(g, T_(1)->dims[1], NULL)) &&
         g->config.max_tokens >= c->dequant_gemm_m;
}

/* The scratch the matmuls need (bytes): f16/bf16 activations, swiglu sums, f16 weights. */
typedef struct scratch {
  size_t xh, zh, wh;
} scratch;

static void need(size_t *have, size_t bytes) {
  if (bytes > *have) *have = bytes;
}

/* What gemv_wq.cu runs (infc's cuda_supported refuses the rest at build time): no W8A8,
 * f32/f16 scales (n, G), groups of whole 16-byte weight loads. */
static ir_status check_wq(cuda_ctx *c, const ir_graph *g, const ir_node *n, scratch *sc,
                          ir_diag *d) {
  const ir_tensor *w = T_(1);
  const char *why = NULL;
  if (ir_node_attr_i(n, "act_int8", 0))
    why = "int8 activations (W8A8) have no GPU kernel; build with --quant int8";
  else if (!c->fn[CF_GEMV_WQ_I4] || !c->fn[CF_GEMV_WQ_I8] ||
           (w->dtype == IR_F8_E4M3 && !c->fn[CF_GEMV_WQ_F8]))
    why = "the plan has no gemv_wq kernels for it (an older infc built it); rebuild it";
  else if (n->n_in < 4 || n->in[3] < 0 || w->rank != 2 || T_(3)->rank != 2 ||
           T_(0)->dtype != IR_F32 || (T_(3)->dtype != IR_F32 && T_(3)->dtype != IR_F16) ||
           wq_zt(g, n) < 0)
    why = "the GPU reads f32 x, f32/f16 scales and u8/i8/f16/f32 zero points only";
  if (why)
    return ir_diag_set(d, IR_UNSUPPORTED, "cuda backend: matmul '%s' (%s weights): %s", n->name,
                       ir_dtype_name(w->dtype), why);
  int64_t k = ir_dim_value(g, w->dims[1], NULL), ng = ir_dim_value(g, T_(3)->dims[1], NULL);
  int chunk = w->dtype == IR_I4 ? 32 : 16;
  if (ng <= 0 || k % ng || (k / ng) % chunk)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "cuda backend: matmul '%s': groups of %lld columns (k = %lld) are not a "
                       "multiple of %d",
                       n->name, (long long)(ng > 0 ? k / ng : 0), (long long)k, chunk);
  if (wq_dequant_plan(c, g, n)) {
    need(&sc->xh, (size_t)g->config.max_tokens * (size_t)k * 2); /* the f16 copies cuBLAS reads */
    need(&sc->wh, (size_t)ir_dim_value(g, w->dims[0], NULL) * (size_t)k * 2);
  }
  return IR_OK;
}

/* Block weights of this plan's matmuls can take cuBLAS (a step can have enough rows). */
static bool dequant_plan(const cuda_ctx *c, const ir_graph *g, ir_dtype wt) {
  return dequant_ok(c, wt) && g->config.max_tokens >= c->dequant_gemm_m;
}

/* Matmul n reads its x in f16 on cuBLAS at some step: f16/bf16 weights (x in their type),
 * block or weight-only quantized weights that a step can have enough rows to dequantize. */
static bool half_gemm(const cuda_ctx *c, const ir_graph *g, const ir_node *n) {
  ir_dtype wt = T_(1)->dtype;
  if (wq_type(wt)) return wq_dequant_plan(c, g, n);
  return wt == IR_F16 || wt == IR_BF16 || dequant_plan(c, g, wt);
}

static ir_status check_matmul(cuda_ctx *c, const ir_graph *g, const ir_node *n, scratch *sc,
                              ir_diag *d) {
  ir_dtype wt = T_(1)->dtype;
  if (wq_type(wt)) return check_wq(c, g, n, sc, d);
  if (n->n_in > 3)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "cuda backend: matmul '%s': separate quantization parameters on %s "
                       "weights",
                       n->name, ir_dtype_name(wt));
  int64_t k = T_(1)->rank == 2 ? ir_dim_value(g, T_(1)->dims[1], NULL) : 0;
  if (!(dense(wt) || wt == IR_Q8_0 || wt == IR_Q4_0 || wt == IR_Q4_1) || T_(1)->rank != 2 ||
      T_(0)->dtype != IR_F32)
    return ir_diag_set(d, IR_UNSUPPORTED, "cuda backend: matmul '%s': %s weights", n->name,
                       ir_dtype_name(wt));
  if (!gemv_ok(wt, k) && !blas_ok(c, wt))
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "cuda backend: matmul '%s': k = %lld needs cuBLAS (libcublas), which "
                       "is not available",
                       n->name, (long long)k);
  bool dq = dequant_plan(c, g, wt);
  if (wt == IR_F16 || wt == IR_BF16 || dq)
    need(&sc->xh, (size_t)g->config.max_tokens * (size_t)k * 2);
  if (dq) need(&sc->wh, (size_t)ir_dim_value(g, T_(1)->dims[0], NULL) * (size_t)k * 2);
  return IR_OK;
}

/* A fused gate_up matmul (act=swiglu): the GEMV kernels' epilogue, or kn_swiglu_packed
 * after cuBLAS / gemv_wq over the swiglu scratch (max_tokens x 2n), sized here only for
 * the matmuls that can take those paths. */
static ir_status check_swiglu(cuda_ctx *c, const ir_graph *g, const ir_node *n, scratch *sc,
                              ir_diag *d) {
  ir_dtype wt = T_(1)->dtype;
  bool wq = wq_type(wt);
  if (!c->fn[CF_SWIGLU_PACKED] || (!wq && !c->fn[k_gemv[wt][1]]))
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "cuda backend: matmul '%s': the plan's kernels have no swiglu epilogue "
                       "(an older infc built it); rebuild it",
                       n->name);
  if (!wq && !blas_ok(c, wt) && !dequant_plan(c, g, wt)) return IR_OK; /* GEMV only */
  need(&sc->zh, (size_t)g->config.max_tokens * (size_t)ir_dim_value(g, T_(1)->dims[0], NULL) * 4);
  return IR_OK;
}

/* Attention: the plain form (q, k, v), or rope (positions, cos_sin) and/or the per-head
 * q/k norm folded in and/or a packed qkv, which kn_rope_kv_write serves. */
static bool attention_ok(const cuda_ctx *c, const ir_graph *g, const ir_node *n) {
  if (g->config.head_dim != c->head_dim || n->n_in < 3) return false;
  bool packed = n->in[1]<0, roped = n->n_in> 3 && n->in[3] >= 0;
  bool normed = n->n_in > 6 && n->in[5] >= 0 && n->in[6] >= 0;
  if (packed != (n->in[2] < 0) || (n->n_in > 5 && !normed)) return false;
  if (!packed && !roped && !normed) return n->n_in == 3 || n->in[3] < 0;
  if (!c->fn[c->kv_f16 ? CF_ROPE_KV_WRITE_F16 : CF_ROPE_KV_WRITE]) return false;
  if (normed && (T_(5)->dtype != IR_F32 || T_(6)->dtype != IR_F32 ||
                 ir_node_attr_i(n, "n_heads", 0) + c->n_kv_heads > CUDA_NORM_HEADS))
    return false;
  if (!roped) return true;
  int64_t rot = ir_node_attr_i(n, "rot_dim", 0);
  return n->n_in > 4 && n->in[4] >= 0 && T_(4)->dtype == IR_F32 && rot > 0 && rot % 2 == 0 &&
         rot <= c->head_dim;
}

static ir_status check_node(cuda_ctx *c, const ir_graph *g, const ir_node *n, scratch *sc,
                            ir_diag *d) {
  switch (n->op) {
  case IR_OP_EMBED: {
    ir_dtype t = T_(1)->dtype;
    if (!(dense(t) || t == IR_Q8_0 || t == IR_Q4_0 || t == IR_Q4_1)) break;
    return IR_OK;
  }
  case IR_OP_MATMUL: {
    int64_t act = ir_node_attr_i(n, "act", IR_ACT_NONE);
    if (act != IR_ACT_NONE && act != IR_ACT_SWIGLU) break;
    ir_status st = check_matmul(c, g, n, sc, d);
    if (st == IR_OK && act == IR_ACT_SWIGLU) st = check_swiglu(c, g, n, sc, d);
    return st;
  }
  case IR_OP_ATTENTION:
    if (!attention_ok(c, g, n)) break;
    return IR_OK;
  case IR_OP_ADD:
    if (!same_shape(g, T_(0), T_(1)) || TO_(0)->dtype != IR_F32) break;
    return IR_OK;
  case IR_OP_SWIGLU: { /* silu, or gelu_tanh (kn_geglu: plans built before it lack it) */
    int64_t act = ir_node_attr_i(n, "act", IR_ACT_SWIGLU);
    if (act == IR_ACT_GEGLU && !c->fn[CF_GEGLU])
      return ir_diag_set(d, IR_UNSUPPORTED,
                         "cuda backend: node '%s' (swiglu, act=geglu): the plan's kernels have "
                         "no kn_geglu (an older infc built it); rebuild it",
                         n->name);
    if (act != IR_ACT_SWIGLU && act != IR_ACT_GEGLU) break;
    return IR_OK;
  }
  case IR_OP_SOFTCAP:
    if (!c->fn[CF_SOFTCAP])
      return ir_diag_set(d, IR_UNSUPPORTED,
                         "cuda backend: node '%s' (softcap): the plan's kernels have no "
                         "kn_softcap (an older infc built it); rebuild it",
                         n->name);
    if (T_(0)->dtype != IR_F32 || TO_(0)->dtype != IR_F32) break;
    return IR_OK;
  case IR_OP_RMS_NORM:
  case IR_OP_ADD_RMS_NORM:
  case IR_OP_ROPE:
  case IR_OP_GATHER_ROWS: return IR_OK;
  default: break;
  }
  return ir_diag_set(d, IR_UNSUPPORTED,
                     "cuda backend: node '%s' (%s) is not supported on the GPU; run with "
                     "--device cpu",
                     n->name, ir_op_name(n->op));
}

ir_status cuda_ops_check(cuda_ctx *c, const ir_graph *g, ir_diag *d) {
  scratch sc = {0};
  bool half = false; /* some GEMM takes f16/bf16 activations (cuBLAS on f16/bf16/block weights) */
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op <= IR_OP_INVALID || n->op >= IR_OP_COUNT)
      return ir_diag_set(d, IR_UNSUPPORTED, "cuda backend: node '%s' has an unknown op", n->name);
    ir_status st = check_node(c, g, n, &sc, d);
    if (st != IR_OK) return st;
    if (n->op == IR_OP_MATMUL) half |= half_gemm(c, g, n);
  }
  c->xh_bytes = sc.xh, c->zh_bytes = sc.zh, c->wh_bytes = sc.wh;
  free(c->xh_wt);
  if (!(c->xh_wt = calloc((size_t)g->n_tensors, 1))) return ir_diag_set(d, IR_OOM, "out of memory");
  for (int32_t i = 0; i < g->n_nodes; i++) { /* the first half-weight GEMM reading a tensor */
    const ir_node *n = &g->nodes[i];
    if (n->op == IR_OP_MATMUL && half_gemm(c, g, n) && !c->xh_wt[n->in[0]])
      c->xh_wt[n->in[0]] = (uint8_t)T_(1)->dtype;
  }
  c->xh_tensor = -1;
  /* Tensor-core prefill attention rounds q, k, v and the probabilities to f16: taken where
   * the prefill GEMMs already round activations so (f32 plans keep f32 attention). */
  c->tc_prefill =
      half && c->fn[c->kv_f16 ? CF_ATTN_PREFILL_TC_F16 : CF_ATTN_PREFILL_TC] && c->arch >= 80;
  c->tile_tokens = c->tc_prefill ? CUDA_TC_TILE_TOKENS : CUDA_TILE_TOKENS;
  return IR_OK;
}
