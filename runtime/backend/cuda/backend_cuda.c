/* backend_cuda: the CUDA backend (libinferrt_cuda.so). Weights, activation arena and the
 * paged KV pool live in device memory; a step uploads its descriptor in one copy, queues
 * the plan's NVRTC kernels (and cuBLAS) on one stream, and decode steps are captured once
 * per batch-size bucket as CUDA Graphs and replayed. See runtime/backend/backend.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_internal.h"

/* Grouped by source. */
static const struct {
  cuda_fn fn;
  const char *src, *entry;
} k_fns[CF_COUNT] = {
    {CF_ADD, "add", "kn_add"},
    {CF_PDL_READY, "add", "kn_pdl_ready"},
    {CF_ATTN_DECODE, "attention", "kn_attn_decode"},
    {CF_ATTN_REDUCE, "attention", "kn_attn_decode_reduce"},
    {CF_ATTN_PREFILL, "attention", "kn_attn_prefill"},
    {CF_ATTN_PREFILL_TC, "attention", "kn_attn_prefill_tc"},
    {CF_ATTN_DECODE_F16, "attention", "kn_attn_decode_f16"},
    {CF_ATTN_PREFILL_F16, "attention", "kn_attn_prefill_f16"},
    {CF_ATTN_PREFILL_TC_F16, "attention", "kn_attn_prefill_tc_f16"},
    {CF_CAST_F16, "cast", "kn_cast_f16"},
    {CF_CAST_BF16, "cast", "kn_cast_bf16"},
    {CF_ADD_BIAS, "cast", "kn_add_bias"},
    {CF_DEQUANT_Q8_0, "cast", "kn_dequant_q8_0"},
    {CF_DEQUANT_Q4_0, "cast", "kn_dequant_q4_0"},
    {CF_DEQUANT_Q4_1, "cast", "kn_dequant_q4_1"},
    {CF_EMBED_F32, "embed", "kn_embed_f32"},
    {CF_EMBED_F16, "embed", "kn_embed_f16"},
    {CF_EMBED_BF16, "embed", "kn_embed_bf16"},
    {CF_EMBED_Q8_0, "embed", "kn_embed_q8_0"},
    {CF_EMBED_Q4_0, "embed", "kn_embed_q4_0"},
    {CF_EMBED_Q4_1, "embed", "kn_embed_q4_1"},
    {CF_GATHER_ROWS, "gather_rows", "kn_gather_rows"},
    {CF_GEMV_F32, "gemv", "kn_gemv_f32"},
    {CF_GEMV_F16, "gemv", "kn_gemv_f16"},
    {CF_GEMV_BF16, "gemv", "kn_gemv_bf16"},
    {CF_GEMV_Q8_0, "gemv", "kn_gemv_q8_0"},
    {CF_GEMV_Q4_0, "gemv", "kn_gemv_q4_0"},
    {CF_GEMV_Q4_1, "gemv", "kn_gemv_q4_1"},
    {CF_GEMV_F32_SWIGLU, "gemv", "kn_gemv_f32_swiglu"},
    {CF_GEMV_F16_SWIGLU, "gemv", "kn_gemv_f16_swiglu"},
    {CF_GEMV_BF16_SWIGLU, "gemv", "kn_gemv_bf16_swiglu"},
    {CF_GEMV_Q8_0_SWIGLU, "gemv", "kn_gemv_q8_0_swiglu"},
    {CF_GEMV_Q4_0_SWIGLU, "gemv", "kn_gemv_q4_0_swiglu"},
    {CF_GEMV_Q4_1_SWIGLU, "gemv", "kn_gemv_q4_1_swiglu"},
    {CF_GEMV_WQ_I4, "gemv_wq", "kn_gemv_wq_i4"},
    {CF_GEMV_WQ_I8, "gemv_wq", "kn_gemv_wq_i8"},
    {CF_GEMV_WQ_F8, "gemv_wq", "kn_gemv_wq_f8"},
    {CF_DEQUANT_WQ_I4, "gemv_wq", "kn_dequant_wq_i4"},
    {CF_DEQUANT_WQ_I8, "gemv_wq", "kn_dequant_wq_i8"},
    {CF_DEQUANT_WQ_F8, "gemv_wq", "kn_dequant_wq_f8"},
    {CF_KV_WRITE, "kv_write", "kn_kv_write"},
    {CF_ROPE_KV_WRITE, "kv_write", "kn_rope_kv_write"},
    {CF_KV_WRITE_F16, "kv_write", "kn_kv_write_f16"},
    {CF_ROPE_KV_WRITE_F16, "kv_write", "kn_rope_kv_write_f16"},
    {CF_RMS_NORM, "rms_norm", "kn_rms_norm"},
    {CF_ADD_RMS_NORM, "rms_norm", "kn_add_rms_norm"},
    {CF_RMS_NORM_H, "rms_norm", "kn_rms_norm_h"},
    {CF_ADD_RMS_NORM_H, "rms_norm", "kn_add_rms_norm_h"},
    {CF_ROPE_NEOX, "rope", "kn_rope_neox"},
    {CF_ROPE_INTERLEAVED, "rope", "kn_rope_interleaved"},
    {CF_PICK, "sampling", "kn_pick"},
    {CF_SWIGLU, "swiglu", "kn_swiglu"},
    {CF_SWIGLU_PACKED, "swiglu", "kn_swiglu_packed"},
    {CF_SWIGLU_PACKED_H, "swiglu", "kn_swiglu_packed_h"},
    {CF_GEGLU, "swiglu", "kn_geglu"},
    {CF_SOFTCAP, "swiglu", "kn_softcap"},
};

ir_status cuda_fail(cuda_ctx *c, CUresult r, const char *what, ir_diag *d) {
  return ir_diag_set(d, r == CU_ERR_OUT_OF_MEMORY ? IR_OOM : IR_DEVICE, "CUDA: %s: %s", what,
                     cu_api_error(&c->cu, r));
}

static void make_current(cuda_ctx *c) { c->cu.ctx_set(c->ctx); }

/* --- device and kernel images ------------------------------------------------------------ */

static ir_status open_device(cuda_ctx *c, int ordinal, ir_diag *d) {
  int count = 0, major = 0, minor = 0;
  CUresult r = c->cu.init(0);
  if (r == 0) r = c->cu.device_count(&count);
  if (r || count == 0)
    return ir_diag_set(d, IR_DEVICE,
                       "no CUDA device found; run with --device cpu or build a CPU plan (%s)",
                       r ? cu_api_error(&c->cu, r) : "the driver sees no GPU");
  if (ordinal < 0 || ordinal >= count)
    return ir_diag_set(d, IR_INVALID_ARG, "CUDA device %d does not exist (%d found)", ordinal,
                       count);
  if ((r = c->cu.device_get(&c->dev, ordinal)) ||
      (r = c->cu.device_name(c->name, (int)sizeof c->name, c->dev)) ||
      (r = c->cu.device_attr(&major, CU_ATTR_CC_MAJOR, c->dev)) ||
      (r = c->cu.device_attr(&minor, CU_ATTR_CC_MINOR, c->dev)))
    return cuda_fail(c, r, "device query", d);
  c->arch = major * 10 + minor;
  if (c->cu.device_attr(&c->n_sm, CU_ATTR_MULTIPROCESSOR_COUNT, c->dev) || c->n_sm < 1) c->n_sm = 1;
  if ((r = c->cu.ctx_retain(&c->ctx, c->dev))) return cuda_fail(c, r, "primary context", d);
  make_current(c);
  if ((r = c->cu.stream_create(&c->stream, CU_STREAM_NON_BLOCKING)) ||
      (r = c->cu.event_create(&c->stage_ev, CU_EVENT_DISABLE_TIMING)))
    return cuda_fail(c, r, "stream", d);
  return IR_OK;
}

/* The image of `src` this GPU runs best: its own CUBIN, a CUBIN of the same major arch
 * and a lower minor, else the newest PTX not above it (JIT-compiled by the driver). */
static const ir_plan_kernel *pick_image(const irt_cuda_opts *o, const char *src, int arch) {
  const ir_plan_kernel *best = NULL;
  int best_rank = 0;
  for (int i = 0; i < o->n_kernels; i++) {
    const ir_plan_kernel *k = &o->kernels[i];
    int a = (int)k->arch, rank = 0;
    if (strcmp(k->name, src) || a > arch) continue;
    if (k->kind == IR_PLAN_KERNEL_CUBIN && a == arch) rank = 3000;
    else if (k->kind == IR_PLAN_KERNEL_CUBIN && a / 10 == arch / 10) rank = 2000 + a;
    else if (k->kind == IR_PLAN_KERNEL_PTX) rank = 1000 + a;
    if (rank > best_rank) best = k, best_rank = rank;
  }
  return best;
}

/* "sm_80,sm_90": the archs the plan has images for. */
static void plan_archs(const irt_cuda_opts *o, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < o->n_kernels; i++) {
    bool seen = false;
    for (int j = 0; j < i; j++) seen |= o->kernels[j].arch == o->kernels[i].arch;
    if (!seen && len < cap)
      len += (size_t)snprintf(buf + len, cap - len, "%ssm_%u", len ? "," : "", o->kernels[i].arch);
  }
  if (!len) snprintf(buf, cap, "none");
}

static ir_status load_source(cuda_ctx *c, const irt_cuda_opts *o, const char *src, CUmodule *out,
                             ir_diag *d) {
  const ir_plan_kernel *k = pick_image(o, src, c->arch);
  *out = NULL;
  if (!k) {
    /* plans from before cast.cu (GEMV only), gemv_wq.cu (no int8/int4 weights) or
     * sampling.cu (logits come down) */
    if (!strcmp(src, "cast") || !strcmp(src, "gemv_wq") || !strcmp(src, "sampling")) return IR_OK;
    char archs[96];
    plan_archs(o, archs, sizeof archs);
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "the plan's CUDA kernels are for %s but the GPU (%s) is sm_%d: rebuild "
                       "with infc build --target cuda --arch sm_%d, or run with --device cpu",
                       archs, c->name, c->arch, c->arch);
  }
  CUresult r = c->cu.module_load(out, k->data);
  if (r == 0 && (!c->min_image_arch || (int)k->arch < c->min_image_arch))
    c->min_image_arch = (int)k->arch;
  if (r == 0) return IR_OK;
  return ir_diag_set(d, IR_DEVICE, "CUDA: loading kernels '%s' (%s for sm_%u) on %s (sm_%d): %s",
                     src, k->kind == IR_PLAN_KERNEL_PTX ? "PTX" : "CUBIN", k->arch, c->name,
                     c->arch, cu_api_error(&c->cu, r));
}

/* The fused forms' kernels, missing from plans built before them (which have no fused
 * nodes): their fn stays NULL, and cuda_ops_check refuses a node that would need one
 * (likewise kn_geglu and kn_softcap, for Gemma's ops). Without kn_pick the engine reads
 * logit rows and samples on the host; without the _f16 attention kernels the KV cache can
 * only be f32. */
static bool optional_fn(cuda_fn f) {
  return (f >= CF_GEMV_F32_SWIGLU && f <= CF_GEMV_Q4_1_SWIGLU) || f == CF_ROPE_KV_WRITE ||
         f == CF_SWIGLU_PACKED || f == CF_ATTN_PREFILL_TC || f == CF_PICK || f == CF_GEGLU ||
         f == CF_SOFTCAP || f == CF_RMS_NORM_H || f == CF_ADD_RMS_NORM_H ||
         (f >= CF_GEMV_WQ_F8 && f <= CF_DEQUANT_WQ_F8) || f == CF_SWIGLU_PACKED_H ||
         (f >= CF_DEQUANT_Q8_0 && f <= CF_DEQUANT_Q4_1) ||
         (f >= CF_KV_WRITE_F16 && f <= CF_ATTN_PREFILL_TC_F16) || f == CF_PDL_READY;
}

static ir_status load_kernels(cuda_ctx *c, const irt_cuda_opts *o, ir_diag *d) {
  for (int i = 0; i < CF_COUNT; i++) {
    int first = i;
    while (first > 0 && strcmp(k_fns[first - 1].src, k_fns[i].src) == 0) first--;
    if (first == i) { /* a new source: load its module */
      if (c->n_mods == (int)(sizeof c->mods / sizeof c->mods[0]))
        return ir_diag_set(d, IR_UNSUPPORTED, "cuda backend: too many kernel sources");
      ir_status st = load_source(c, o, k_fns[i].src, &c->mods[c->n_mods++], d);
      if (st != IR_OK) return st;
    }
    CUmodule mod = c->mods[c->n_mods - 1];
    if (!mod) continue;
    CUresult r = c->cu.module_fn(&c->fn[k_fns[i].fn], mod, k_fns[i].entry);
    if (r && optional_fn(k_fns[i].fn)) {
      c->fn[k_fns[i].fn] = NULL;
      continue;
    }
    if (r)
      return ir_diag_set(d, IR_BAD_FORMAT, "CUDA: the plan's '%s' kernels lack %s (%s)",
                         k_fns[i].src, k_fns[i].entry, cu_api_error(&c->cu, r));
  }
  return IR_OK;
}

/* --- scratch: step buffer, attention splits, GEMM ---------------------------------------- */

static ir_status dev_alloc(cuda_ctx *c, size_t bytes, CUdeviceptr *out, const char *what,
                           ir_diag *d) {
  CUresult r = c->cu.mem_alloc(out, bytes ? bytes : 1);
  if (!r) return IR_OK;
  *out = 0;
  return cuda_fail(c, r, what, d);
}

static ir_status alloc_scratch(cuda_ctx *c, const ir_graph *g, ir_diag *d) {
  const ir_model_config *k = &g->config;
  size_t T = (size_t)c->max_tokens, off = 0;
  c->off_tok = off, off += T;
  c->off_pos = off, off += T;
  c->off_seq = off, off += T;
  c->off_rows = off, off += T > (size_t)c->max_logits ? T : (size_t)c->max_logits;
  c->off_tile0 = off, off += T;
  c->off_tilen = off, off += T;
  c->off_bt = off, off += (size_t)(c->max_seqs * c->max_blocks);
  c->stage_elems = off;
  CUresult r = c->cu.host_alloc((void **)&c->stage, off * sizeof(int32_t));
  if (r) return cuda_fail(c, r, "pinned step buffer", d);
  memset(c->stage, 0, off * sizeof(int32_t));
  /* Split-K decode: at most 32 splits, and at least about 8 KV blocks (2 per warp) per
   * split of the longest context; a step takes fewer (cuda_ops.c decode_splits). */
  c->n_splits = (int)((c->max_blocks + 7) / 8);
  if (c->n_splits > 32) c->n_splits = 32;
  if (c->n_splits < 1) c->n_splits = 1;
  size_t rows = (size_t)(c->max_seqs * k->n_heads * c->n_splits);
  ir_status st = dev_alloc(c, off * sizeof(int32_t), &c->d_stage, "step buffer", d);
  if (st == IR_OK)
    st = dev_alloc(c, rows * (size_t)c->head_dim * 4, &c->part_acc, "attention scratch", d);
  if (st == IR_OK) st = dev_alloc(c, rows * 2 * 4, &c->part_ml, "attention scratch", d);
  if (st == IR_OK && c->xh_bytes) st = dev_alloc(c, c->xh_bytes, &c->xh, "GEMM scratch", d);
  if (st == IR_OK && c->zh_bytes) st = dev_alloc(c, c->zh_bytes, &c->zh, "swiglu scratch", d);
  if (st == IR_OK && c->wh_bytes)
    st = dev_alloc(c, c->wh_bytes, &c->wh, "dequantized weight scratch", d);
  size_t pick = (size_t)c->max_logits * (sizeof(pick_req) + sizeof(pick_res) * (1 + PICK_TOP));
  if (st == IR_OK && c->fn[CF_PICK]) st = dev_alloc(c, pick, &c->d_pick, "pick buffer", d);
  if (st == IR_OK && c->fn[CF_PICK] && (r = c->cu.host_alloc(&c->pick_stage, pick)))
    st = cuda_fail(c, r, "pinned pick buffer", d);
  return st;
}

/* An f32 cache, or f16 with its kernels (plans built before them: f32 only). */
static ir_status check_kv_dtype(cuda_ctx *c, int kv_dtype, ir_diag *d) {
  c->kv_f16 = kv_dtype == KV_F16;
  if (kv_dtype != KV_F32 && kv_dtype != KV_F16)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "KV cache dtype int8 is CPU-only; the cuda backend keeps f32 or f16 "
                       "(use --kv-dtype f16, or --device cpu)");
  for (int f = CF_KV_WRITE_F16; c->kv_f16 && f <= CF_ATTN_PREFILL_F16; f++) /* tc: optional */
    if (!c->fn[f])
      return ir_diag_set(d, IR_UNSUPPORTED,
                         "the plan's CUDA kernels have no f16 KV cache: rebuild the plan with "
                         "this infc, or use --kv-dtype f32");
  return IR_OK;
}

/* cuBLAS for the dense GEMMs; without it every matmul runs on the GEMV kernels. */
static void open_blas(cuda_ctx *c) {
  ir_diag quiet = {0};
  const size_t ws = (size_t)32 << 20; /* workspace, so graph capture never allocates */
  if (cublas_api_load(&c->blas, &quiet) != IR_OK) return;
  if (c->blas.create(&c->blas_h)) {
    c->blas_h = NULL;
    return;
  }
  if (c->cu.mem_alloc(&c->blas_ws, ws)) c->blas_ws = 0;
  if (c->blas.set_stream(c->blas_h, c->stream) ||
      (c->blas_ws && c->blas.set_workspace(c->blas_h, (void *)(uintptr_t)c->blas_ws, ws))) {
    c->blas.destroy(c->blas_h);
    c->blas_h = NULL;
  }
}

/* Decode buckets: the plan's capture plan (pass_capture_plan; checked at load), or for a
 * plan without one 1, 2, 4, ... up to the step limits (the limit itself last). */
static void make_buckets(cuda_ctx *c, const ir_model_config *k) {
  if (k->n_decode_buckets > 0) {
    c->n_buckets = k->n_decode_buckets;
    for (int32_t i = 0; i < c->n_buckets; i++) c->bucket[i] = k->decode_buckets[i];
  } else {
    c->n_buckets = ir_default_decode_buckets(k, c->bucket);
  }
}

/* --- one step ------------------------------------------------------------------------------ */

/* The smallest decode bucket holding t tokens, or -1. */
static int bucket_of(const cuda_ctx *c, int64_t t) {
  for (int i = 0; i < c->n_buckets; i++)
    if (c->bucket[i] >= t) return i;
  return -1;
}

/* Prefill attention tiles: runs of at most c->tile_tokens consecutive tokens of one
 * sequence. Returns the tile count. With `grid` (> 0: a captured step's fixed grid, at least
 * n_tok) the tiles past the last are empty and the count is grid: their CTAs exit at once. */
static int make_tiles(cuda_ctx *c, const int32_t *tok_seq, int64_t n_tok, int64_t grid) {
  int32_t *t0 = c->stage + c->off_tile0, *tn = c->stage + c->off_tilen;
  int n = 0;
  for (int64_t t = 0; t < n_tok; t++) {
    if (n && tok_seq[t] == tok_seq[t0[n - 1]] && tn[n - 1] < c->tile_tokens) {
      tn[n - 1]++;
      continue;
    }
    t0[n] = (int32_t)t;
    tn[n++] = 1;
  }
  for (; n < grid; n++) t0[n] = 0, tn[n] = 0;
  return n;
}

/* Fills the pinned step buffer for n >= T tokens (tokens past T pad a bucket: each its own
 * sequence at position 0 of the pad block) and uploads it in one copy. A drafted step for a
 * graph (graph, not decode) tiles its pads too, over a grid of n tiles. */
static ir_status upload_step(cuda_ctx *c, const model_step *s, int64_t n, bool graph, cuda_step *cs,
                             ir_diag *d) {
  int64_t T = s->syms[IR_SYM_TOKENS], S = s->syms[IR_SYM_SEQS], L = s->syms[IR_SYM_LOGITS];
  CUresult r;
  if (c->stage_busy && (r = c->cu.event_sync(c->stage_ev)))
    return cuda_fail(c, r, "step upload", d);
  int32_t *st = c->stage;
  memcpy(st + c->off_tok, s->tokens, (size_t)T * 4);
  memcpy(st + c->off_pos, s->tok_pos, (size_t)T * 4);
  memcpy(st + c->off_seq, s->tok_seq, (size_t)T * 4);
  memcpy(st + c->off_rows, s->logit_rows, (size_t)L * 4);
  memcpy(st + c->off_bt, s->block_tables, (size_t)(S * s->max_blocks) * 4);
  int64_t rows = S;
  for (int64_t t = T; t < n; t++, rows++) {
    st[c->off_tok + t] = 0, st[c->off_pos + t] = 0, st[c->off_seq + t] = (int32_t)rows;
    st[c->off_rows + t] = (int32_t)t;
    st[c->off_bt + rows * s->max_blocks] = s->pad_block;
  }
  cs->n_tiles = cs->decode ? 0
                : graph    ? make_tiles(c, st + c->off_seq, n, n)
                           : make_tiles(c, s->tok_seq, T, 0);
  size_t bytes = (c->off_bt + (size_t)(rows * s->max_blocks)) * sizeof(int32_t);
  if ((r = c->cu.htod(c->d_stage, st, bytes, c->stream)) ||
      (r = c->cu.event_record(c->stage_ev, c->stream)))
    return cuda_fail(c, r, "step upload", d);
  c->stage_busy = true;
  return IR_OK;
}

/* --- profile (irt_model_opts.cuda_profile) ------------------------------------------------------ */

/* The profile row of node n in a prefill or decode step: its op, and a matmul's weight type
 * and shape (k -> n); the last row takes what does not fit. */
static int prof_row(cuda_prof *p, const ir_graph *g, const ir_node *n, bool decode) {
  char what[48];
  if (n->op == IR_OP_MATMUL) {
    const ir_tensor *w = &g->tensors[n->in[1]];
    snprintf(what, sizeof what, "matmul %s %lld->%lld", ir_dtype_name(w->dtype),
             (long long)w->dims[1].n, (long long)w->dims[0].n);
  } else {
    snprintf(what, sizeof what, "%s", ir_op_name(n->op));
  }
  for (int r = 0; r < p->n_rows; r++)
    if (p->rows[r].decode == decode && !strcmp(p->rows[r].what, what)) return r;
  if (p->n_rows == CUDA_PROF_ROWS) return CUDA_PROF_ROWS - 1;
  int r = p->n_rows++;
  const bool last = p->n_rows == CUDA_PROF_ROWS;
  snprintf(p->rows[r].what, sizeof p->rows[r].what, "%s", last ? "(other)" : what);
  p->rows[r].decode = decode;
  return r;
}

/* Events before node 0 and after every node, created at the first profiled step. */
static ir_status prof_events(cuda_ctx *c, const ir_graph *g, ir_diag *d) {
  cuda_prof *p = &c->prof;
  if (p->ev) return IR_OK;
  p->ev = calloc((size_t)g->n_nodes + 1, sizeof *p->ev);
  p->row_of = calloc((size_t)g->n_nodes, sizeof *p->row_of);
  p->host_of = calloc((size_t)g->n_nodes, sizeof *p->host_of);
  if (!p->ev || !p->row_of || !p->host_of) return ir_diag_set(d, IR_OOM, "out of memory");
  for (; p->n_ev <= g->n_nodes; p->n_ev++) {
    CUresult r = c->cu.event_create(&p->ev[p->n_ev], 0);
    if (r) return cuda_fail(c, r, "profile events", d);
  }
  return IR_OK;
}

/* Waits for the profiled step and adds its nodes' times. */
static ir_status prof_harvest(cuda_ctx *c, const ir_graph *g, bool decode, ir_diag *d) {
  cuda_prof *p = &c->prof;
  CUresult r = c->cu.event_sync(p->ev[g->n_nodes]);
  float ms = 0.0f;
  for (int32_t i = 0; !r && i < g->n_nodes; i++)
    if (!(r = c->cu.event_elapsed(&ms, p->ev[i], p->ev[i + 1]))) {
      p->rows[p->row_of[i]].ms += ms;
      p->rows[p->row_of[i]].host_ms += p->host_of[i];
      p->rows[p->row_of[i]].launches++;
    }
  if (!r) r = c->cu.event_elapsed(&ms, p->ev[0], p->ev[g->n_nodes]);
  if (r) return cuda_fail(c, r, "profile events", d);
  p->step_ms[decode] += ms;
  p->steps[decode]++;
  return IR_OK;
}

/* The warm-up at open is not profiled: its first launches load the kernels (cuBLAS's lazily,
 * tens of ms for the first GEMM of a shape), so its rows go too, not only the step totals. */
static void cuda_ready(void *vctx) {
  cuda_prof *p = &((cuda_ctx *)vctx)->prof;
  memset(p->rows, 0, sizeof p->rows);
  p->n_rows = 0;
  p->step_ms[0] = p->step_ms[1] = 0.0;
  p->steps[0] = p->steps[1] = 0;
}

/* One line to the caller's log (levels as irt_log_level: 1 warning, 2 info). */
static void cuda_log(const cuda_ctx *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cuda_log(const cuda_ctx *c, int level, const char *fmt, ...) {
  if (!c->log) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  c->log(c->log_user, level, line);
}

/* The profile table, a line at a time to the log (info). */
static void prof_report(const cuda_ctx *c) {
  const cuda_prof *p = &c->prof;
  if (!p->steps[0] && !p->steps[1]) return;
  cuda_log(c, 2,
           "cuda profile: %lld prefill steps %.1f ms, %lld decode steps %.1f ms (eager, an "
           "event around each node)",
           p->steps[0], p->step_ms[0], p->steps[1], p->step_ms[1]);
  cuda_log(c, 2, "  %-8s %-34s %9s %10s %6s %9s %9s", "step", "node", "runs", "total ms", "share",
           "mean us", "host us");
  bool done[CUDA_PROF_ROWS] = {false};
  for (int k = 0; k < p->n_rows; k++) { /* largest first */
    int b = -1;
    for (int r = 0; r < p->n_rows; r++)
      if (!done[r] && (b < 0 || p->rows[r].ms > p->rows[b].ms)) b = r;
    done[b] = true;
    double all = p->step_ms[p->rows[b].decode];
    const double runs = p->rows[b].launches ? (double)p->rows[b].launches : 1.0;
    cuda_log(c, 2, "  %-8s %-34s %9lld %10.2f %5.1f%% %9.1f %9.1f",
             p->rows[b].decode ? "decode" : "prefill", p->rows[b].what, p->rows[b].launches,
             p->rows[b].ms, all > 0 ? 100.0 * p->rows[b].ms / all : 0.0, 1e3 * p->rows[b].ms / runs,
             1e3 * p->rows[b].host_ms / runs);
  }
}

static ir_status run_nodes(cuda_ctx *c, const ir_graph *g, void *const *ptrs, const cuda_step *s,
                           ir_diag *d) {
  cuda_prof *p = &c->prof;
  ir_status st = p->on ? prof_events(c, g, d) : IR_OK;
  c->xh_tensor = -1;    /* the tensors of the last step are gone */
  c->after_copy = true; /* the step's first kernel follows its upload: a plain launch */
  if (st == IR_OK && p->on) c->cu.event_record(p->ev[0], c->stream);
  for (int32_t i = 0; st == IR_OK && i < g->n_nodes; i++) {
    struct timespec t0, t1;
    if (p->on) clock_gettime(CLOCK_MONOTONIC, &t0);
    st = cuda_ops_run(c, g, i, ptrs, s, d);
    if (st == IR_OK && p->on) {
      clock_gettime(CLOCK_MONOTONIC, &t1);
      p->host_of[i] =
          (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
      p->row_of[i] = prof_row(p, g, &g->nodes[i], s->decode);
      c->cu.event_record(p->ev[i + 1], c->stream);
    }
  }
  if (st == IR_OK && p->on) st = prof_harvest(c, g, s->decode, d);
  return st;
}

/* Records the step's kernels into graph exec (nothing runs until launched). */
static ir_status capture(cuda_ctx *c, CUgraphExec *exec, const ir_graph *g, void *const *ptrs,
                         const cuda_step *s, ir_diag *d) {
  CUresult r = c->cu.capture_begin(c->stream, CU_CAPTURE_MODE_THREAD_LOCAL);
  if (r) return cuda_fail(c, r, "cuStreamBeginCapture", d);
  ir_status st = run_nodes(c, g, ptrs, s, d);
  CUgraph graph = NULL;
  r = c->cu.capture_end(c->stream, &graph);
  if (st == IR_OK && r) st = cuda_fail(c, r, "cuStreamEndCapture", d);
  if (st == IR_OK && (r = c->cu.graph_instantiate(exec, graph, 0))) {
    *exec = NULL;
    st = cuda_fail(c, r, "cuGraphInstantiate", d);
  }
  if (graph) c->cu.graph_destroy(graph);
  return st;
}

/* The bucket of a step that can replay a graph, or -1: every row wants its logits (a decode
 * step, or a drafted one: all its rows are verified), at most the largest bucket's tokens,
 * and the pads leave the sequence count within the plan's (a bucket is at most max_seqs). */
static int graph_bucket(const cuda_ctx *c, const model_step *s) {
  int64_t T = s->syms[IR_SYM_TOKENS], S = s->syms[IR_SYM_SEQS], L = s->syms[IR_SYM_LOGITS];
  if (L != T || !c->want_graphs || c->prof.on || s->pad_block < 0) return -1;
  int b = bucket_of(c, T);
  return b >= 0 && S + (c->bucket[b] - T) <= c->max_seqs ? b : -1;
}

static ir_status cuda_run_step(void *vctx, const ir_graph *g, void *const *ptrs,
                               const model_step *s, ir_diag *d) {
  cuda_ctx *c = vctx;
  int64_t T = s->syms[IR_SYM_TOKENS], S = s->syms[IR_SYM_SEQS], L = s->syms[IR_SYM_LOGITS];
  cuda_step cs = {.decode = T == S, .kv = s->kv, .max_blocks = s->max_blocks};
  if (s->max_blocks != c->max_blocks || T > c->max_tokens || S > c->max_seqs)
    return ir_diag_set(d, IR_INVALID_ARG, "cuda backend: step exceeds the plan's limits");
  /* Decode and drafted steps replay a graph of their bucket and kind. */
  const int b = graph_bucket(c, s), kind = cs.decode ? 0 : 1;
  const int64_t n = b >= 0 ? c->bucket[b] : T;
  cs.syms[IR_SYM_TOKENS] = n;
  cs.syms[IR_SYM_SEQS] = b >= 0 ? S + (n - T) : S;
  cs.syms[IR_SYM_LOGITS] = b >= 0 ? n : L;
  make_current(c);
  ir_status st = upload_step(c, s, n, b >= 0, &cs, d);
  if (st != IR_OK || b < 0) return st != IR_OK ? st : run_nodes(c, g, ptrs, &cs, d);
  /* A bucket's first step runs eagerly, so lazy initialisation (cuBLAS, module loading)
   * happens outside a capture; the second is captured; later ones replay. */
  if (!c->warm[kind][b]) {
    c->warm[kind][b] = true;
    return run_nodes(c, g, ptrs, &cs, d);
  }
  CUgraphExec *exec = &c->exec[kind][b];
  if (!*exec && !c->no_graph[kind][b]) {
    /* A capture that fails (a driver without graph support for a kernel, a capture
     * invalidated by another thread) costs speed, not the step: the bucket runs eagerly,
     * where a real error in the step shows again and fails it. */
    ir_diag cd = {0};
    ir_status cst = capture(c, exec, g, ptrs, &cs, &cd);
    if (cst != IR_OK && c->pdl) { /* a driver that cannot capture programmatic launches? */
      ir_diag first = cd;
      c->pdl = false;
      cd = (ir_diag){0};
      cst = capture(c, exec, g, ptrs, &cs, &cd);
      if (cst == IR_OK)
        cuda_log(c, 1,
                 "cuda: capturing with programmatic dependent launch failed (%s); "
                 "launching without it",
                 first.msg);
      else c->pdl = true; /* not what failed */
    }
    if (cst != IR_OK) {
      c->no_graph[kind][b] = true;
      cuda_log(c, 1, "cuda: %s steps of %lld tokens run without a CUDA Graph: %s",
               kind ? "drafted" : "decode", (long long)n, cd.msg);
    }
  }
  if (!*exec) return run_nodes(c, g, ptrs, &cs, d);
  CUresult r = c->cu.graph_launch(*exec, c->stream);
  return r ? cuda_fail(c, r, "cuGraphLaunch", d) : IR_OK;
}

/* --- memory -------------------------------------------------------------------------------- */

static void *cuda_alloc(void *vctx, size_t bytes) {
  cuda_ctx *c = vctx;
  CUdeviceptr p = 0;
  make_current(c);
  if (c->cu.mem_alloc(&p, bytes ? bytes : 64)) return NULL;
  if (c->cu.memset8(p, 0, bytes, c->stream) || c->cu.stream_sync(c->stream)) {
    c->cu.mem_free(p);
    return NULL;
  }
  return (void *)(uintptr_t)p;
}

static void cuda_free(void *vctx, void *p) {
  cuda_ctx *c = vctx;
  if (!p) return;
  make_current(c);
  c->cu.mem_free(cuda_dptr(p));
}

static ir_status cuda_upload(void *vctx, const void *host, size_t bytes, void **out, ir_diag *d) {
  cuda_ctx *c = vctx;
  CUdeviceptr p = 0;
  make_current(c);
  ir_status st = dev_alloc(c, bytes, &p, "weights", d);
  CUresult r = 0;
  if (st == IR_OK && bytes &&
      ((r = c->cu.htod(p, host, bytes, c->stream)) || (r = c->cu.stream_sync(c->stream)))) {
    c->cu.mem_free(p);
    st = cuda_fail(c, r, "weight upload", d);
  }
  if (st == IR_OOM) {
    size_t fr = 0, tot = 0;
    c->cu.mem_info(&fr, &tot);
    d->status = IR_OK;
    st = ir_diag_set(d, IR_OOM,
                     "out of device memory for the weights: %.1f MiB more asked, "
                     "%.1f MiB free of %.1f MiB on %s",
                     (double)bytes / 1048576.0, (double)fr / 1048576.0, (double)tot / 1048576.0,
                     c->name);
  }
  *out = st == IR_OK ? (void *)(uintptr_t)p : NULL;
  return st;
}

static ir_status cuda_read(void *vctx, void *dst, const void *src, size_t bytes, ir_diag *d) {
  cuda_ctx *c = vctx;
  make_current(c);
  CUresult r = bytes ? c->cu.dtoh(dst, cuda_dptr(src), bytes, c->stream) : 0;
  if (!r) r = c->cu.stream_sync(c->stream);
  if (!r) c->stage_busy = false; /* the upload before it is done too */
  return r ? cuda_fail(c, r, "step (reading the logits)", d) : IR_OK;
}

/* Token picks on the device: requests up, one kn_pick launch after the queued step,
 * tokens and logprobs down (8 bytes a pick instead of a row of logits). */
/* Room for the penalties of a pick call (n_pen entries) and the picks' rows. */
static ir_status pen_room(cuda_ctx *c, size_t n_pen, int64_t vocab, ir_diag *d) {
  CUresult r = 0;
  if (!c->d_pick_work &&
      (r = c->cu.mem_alloc(&c->d_pick_work, (size_t)c->max_logits * (size_t)vocab * 4)))
    return cuda_fail(c, r, "pick rows", d);
  if (n_pen <= c->pen_cap) return IR_OK;
  size_t cap = c->pen_cap ? c->pen_cap : 4096;
  while (cap < n_pen) cap *= 2;
  if (c->pen_stage) c->cu.host_free(c->pen_stage), c->pen_stage = NULL;
  if (c->d_pen) c->cu.mem_free(c->d_pen), c->d_pen = 0;
  c->pen_cap = 0;
  if ((r = c->cu.host_alloc(&c->pen_stage, cap * 8)) || (r = c->cu.mem_alloc(&c->d_pen, cap * 8)))
    return cuda_fail(c, r, "pick penalties", d);
  c->pen_cap = cap;
  return IR_OK;
}

static ir_status cuda_pick(void *vctx, const void *logits, int64_t vocab, int n,
                           const pick_req *req, const int32_t *pen_ids, const float *pen_sub,
                           pick_res *out, pick_res *top, ir_diag *d) {
  cuda_ctx *c = vctx;
  if (!c->fn[CF_PICK] || !c->d_pick)
    return ir_diag_set(d, IR_UNSUPPORTED, "cuda backend: the plan has no kn_pick kernel");
  if (n == 0) return IR_OK;
  if (n < 0 || n > c->max_logits || vocab > INT32_MAX)
    return ir_diag_set(d, IR_INVALID_ARG, "cuda backend: %d picks exceed the plan's limits", n);
  size_t rq = (size_t)n * sizeof *req, rs = (size_t)n * sizeof *out;
  size_t res_off = (size_t)c->max_logits * sizeof *req;
  size_t top_off = res_off + (size_t)c->max_logits * sizeof *out, rt = rs * PICK_TOP;
  bool tops = false;
  size_t n_pen = 0;
  for (int i = 0; i < n; i++) {
    tops |= req[i].n_top > 0;
    size_t end = (size_t)req[i].pen_off + (size_t)req[i].n_pen;
    if (req[i].n_pen > 0 && end > n_pen) n_pen = end;
  }
  make_current(c);
  ir_status st = n_pen ? pen_room(c, n_pen, vocab, d) : IR_OK;
  if (st != IR_OK) return st;
  char *stage = c->pick_stage;
  CUdeviceptr d_req = c->d_pick, d_res = c->d_pick + res_off, d_top = c->d_pick + top_off;
  CUdeviceptr lg = cuda_dptr(logits), work = c->d_pick_work, pid = c->d_pen;
  CUdeviceptr psub = c->d_pen + c->pen_cap * 4;
  int v = (int)vocab;
  void *args[] = {&d_res, &d_top, &lg, &d_req, &v, &work, &pid, &psub};
  memcpy(stage, req, rq); /* the last pick has finished: it synchronised */
  CUresult r = c->cu.htod(d_req, stage, rq, c->stream);
  if (!r && n_pen) { /* ids, then the subtrahends, c->pen_cap entries apart */
    memcpy(c->pen_stage, pen_ids, n_pen * 4);
    memcpy((char *)c->pen_stage + c->pen_cap * 4, pen_sub, n_pen * 4);
    r = c->cu.htod(pid, c->pen_stage, n_pen * 4, c->stream);
    if (!r) r = c->cu.htod(psub, (char *)c->pen_stage + c->pen_cap * 4, n_pen * 4, c->stream);
  }
  if (!r)
    r = c->cu.launch(c->fn[CF_PICK], (unsigned)n, 1, 1, CUDA_PICK_THREADS, 1, 1, 0, c->stream, args,
                     NULL);
  if (!r) r = c->cu.dtoh(stage + res_off, d_res, rs, c->stream);
  if (!r && tops) r = c->cu.dtoh(stage + top_off, d_top, rt, c->stream);
  if (!r) r = c->cu.stream_sync(c->stream);
  if (r) return cuda_fail(c, r, "step (picking tokens)", d);
  c->stage_busy = false; /* the step's upload is done too */
  memcpy(out, stage + res_off, rs);
  if (tops) memcpy(top, stage + top_off, rt);
  return IR_OK;
}

static void cuda_copy(void *vctx, void *dst, const void *src, size_t bytes) {
  cuda_ctx *c = vctx;
  make_current(c);
  c->cu.dtod(cuda_dptr(dst), cuda_dptr(src), bytes, c->stream);
}

static void cuda_mem_info(void *vctx, uint64_t *out_free, uint64_t *out_total) {
  cuda_ctx *c = vctx;
  size_t fr = 0, tot = 0;
  make_current(c);
  c->cu.mem_info(&fr, &tot);
  *out_free = fr, *out_total = tot;
}

/* --- vtable -------------------------------------------------------------------------------- */

static ir_status cuda_check(void *vctx, const ir_graph *g, ir_diag *d) {
  return cuda_ops_check(vctx, g, d);
}

static ir_status cuda_run_node(void *vctx, const ir_graph *g, int32_t ni, void *const *ptrs,
                               const model_step *step, ir_diag *d) {
  return ir_diag_set(d, IR_UNSUPPORTED, "cuda backend: nodes run only within run_step");
}

static void cuda_destroy(void *vctx) {
  cuda_ctx *c = vctx;
  if (!c) return;
  if (c->ctx) {
    make_current(c);
    if (c->stream) c->cu.stream_sync(c->stream);
    prof_report(c);
    for (int i = 0; i < c->prof.n_ev; i++) c->cu.event_destroy(c->prof.ev[i]);
    for (int k = 0; k < 2; k++)
      for (int i = 0; i < c->n_buckets; i++)
        if (c->exec[k][i]) c->cu.graph_exec_destroy(c->exec[k][i]);
    if (c->blas_h) c->blas.destroy(c->blas_h);
    CUdeviceptr bufs[] = {c->d_stage, c->part_acc, c->part_ml, c->xh,          c->zh,
                          c->wh,      c->blas_ws,  c->d_pick,  c->d_pick_work, c->d_pen};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
      if (bufs[i]) c->cu.mem_free(bufs[i]);
    for (int i = 0; i < c->n_mods; i++)
      if (c->mods[i]) c->cu.module_unload(c->mods[i]);
    if (c->stage) c->cu.host_free(c->stage);
    if (c->pick_stage) c->cu.host_free(c->pick_stage);
    if (c->pen_stage) c->cu.host_free(c->pen_stage);
    if (c->stage_ev) c->cu.event_destroy(c->stage_ev);
    if (c->stream) c->cu.stream_destroy(c->stream);
    c->cu.ctx_release(c->dev);
  }
  free(c->prof.ev);
  free(c->prof.row_of);
  free(c->prof.host_of);
  free(c->xh_wt);
  free(c);
}

static const backend_ops k_cuda_ops = {
    .name = "cuda",
    .check = cuda_check,
    .run_node = cuda_run_node,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .destroy = cuda_destroy,
    .upload = cuda_upload,
    .run_step = cuda_run_step,
    .read = cuda_read,
    .copy = cuda_copy,
    .pick = cuda_pick,
    .ready = cuda_ready,
    .mem_info = cuda_mem_info,
};

static void set_limits(cuda_ctx *c, const ir_graph *g, const irt_cuda_opts *o) {
  const ir_model_config *k = &g->config;
  c->want_graphs = o->graphs;
  c->prof.on = o->profile;
  c->log = o->log, c->log_user = o->log_user;
  c->max_tokens = k->max_tokens, c->max_seqs = k->max_seqs, c->max_logits = k->max_logits;
  int64_t bs = k->kv_block_size;
  c->max_blocks = bs > 0 ? (k->max_position + bs - 1) / bs : 0;
  c->n_heads = k->n_heads, c->n_kv_heads = k->n_kv_heads, c->head_dim = k->head_dim;
  c->t_tokens = ir_graph_find_tensor(g, "tokens");
  c->t_positions = ir_graph_find_tensor(g, "positions");
  c->t_rows = ir_graph_find_tensor(g, "logit_rows");
}

__attribute__((visibility("default"))) ir_status
irt_backend_cuda_create(const irt_cuda_opts *o, const ir_graph *g, rt_backend *out, ir_diag *d);

ir_status irt_backend_cuda_create(const irt_cuda_opts *o, const ir_graph *g, rt_backend *out,
                                  ir_diag *d) {
  if (!o || o->abi != IRT_CUDA_ABI || o->layout != IRT_CUDA_LAYOUT)
    return ir_diag_set(d, IR_VERSION,
                       "libinferrt_cuda.so (backend ABI %d) does not match this inferrt (ABI %d): "
                       "install both from one build",
                       IRT_CUDA_ABI, o ? o->abi : -1);
  cuda_ctx *c = calloc(1, sizeof *c);
  if (!c) return ir_diag_set(d, IR_OOM, "out of memory");
  set_limits(c, g, o);
  c->dequant_gemm_m = o->dequant_gemm_m;
  ir_status st = IR_OK;
  if (st == IR_OK) st = cu_api_load(&c->cu, d);
  if (st == IR_OK) st = open_device(c, o->device, d);
  if (st == IR_OK && (c->max_blocks <= 0 || c->max_tokens <= 0 || c->max_seqs <= 0 ||
                      c->max_logits <= 0 || c->head_dim <= 0 || c->n_heads <= 0))
    st = ir_diag_set(d, IR_BAD_FORMAT, "cuda backend: the plan is not an LLM step program");
  if (st == IR_OK) st = load_kernels(c, o, d);
  if (st == IR_OK) st = check_kv_dtype(c, o->kv_dtype, d);
  c->pdl = o->pdl && c->arch >= 90 && c->min_image_arch >= 90 && c->cu.launch_ex &&
           c->fn[CF_PDL_READY] && !c->prof.on;
  if (st == IR_OK) open_blas(c);
  if (st == IR_OK) st = cuda_ops_check(c, g, d);
  if (st == IR_OK && !c->fn[CF_CAST_F16]) /* no cast kernels: GEMV only */
    c->xh_bytes = c->wh_bytes = 0;
  if (st == IR_OK) st = alloc_scratch(c, g, d);
  if (st != IR_OK) {
    if (c->cu.init) cuda_destroy(c);
    else free(c);
    return st;
  }
  make_buckets(c, &g->config);
  *out = (rt_backend){.ops = &k_cuda_ops, .ctx = c};
  return IR_OK;
}
