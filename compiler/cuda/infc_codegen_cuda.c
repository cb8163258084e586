/* infc_codegen_cuda: NVRTC over the embedded kernel sources into a plan kernel table. */
#include "infc_codegen_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infc_cuda_sources.h"
#include "ir_alloc.h"

/* The -D constants every source is compiled with; checked against attention.cu's limits. */
static ir_status cuda_defines(const ir_graph *g, char (*defs)[48], ir_diag *d) {
  const ir_model_config *c = &g->config;
  if (c->head_dim <= 0 || c->head_dim > 256 || (c->head_dim > 32 && c->head_dim % 32))
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "target cuda: head_dim %lld is not supported (at most 32, or a multiple "
                       "of 32 up to 256); build a CPU plan",
                       (long long)c->head_dim);
  if (c->kv_block_size < 1 || c->kv_block_size > 32)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "target cuda: kv_block_size %lld is not supported (1 to 32)",
                       (long long)c->kv_block_size);
  if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
    return ir_diag_set(d, IR_UNSUPPORTED, "target cuda: %lld heads over %lld kv heads",
                       (long long)c->n_heads, (long long)c->n_kv_heads);
  snprintf(defs[0], 48, "-DHEAD_DIM=%lld", (long long)c->head_dim);
  snprintf(defs[1], 48, "-DBLOCK_SIZE=%lld", (long long)c->kv_block_size);
  snprintf(defs[2], 48, "-DGQA_GROUP=%lld", (long long)(c->n_heads / c->n_kv_heads));
  return IR_OK;
}

/* Why kernels/cuda/gemv_wq.cu cannot run a weight-only int8/int4 matmul, or NULL: W8A8,
 * a scale or zero-point type it does not read, or groups not whole 16-byte weight loads. */
static const char *wq_refusal(const ir_graph *g, const ir_node *n) {
  const ir_tensor *w = &g->tensors[n->in[1]];
  if (ir_node_attr_i(n, "act_int8", 0))
    return "int8 activations (W8A8, --quant w8a8) have no GPU kernel; build with --quant int8";
  if (n->n_in < 4 || n->in[3] < 0 || w->rank != 2) return "int weights without scales";
  const ir_tensor *sc = &g->tensors[n->in[3]];
  ir_dtype zt = n->n_in > 4 && n->in[4] >= 0 ? g->tensors[n->in[4]].dtype : IR_U8;
  if ((sc->dtype != IR_F32 && sc->dtype != IR_F16) ||
      (zt != IR_U8 && zt != IR_I8 && zt != IR_F16 && zt != IR_F32))
    return "the GPU reads f32/f16 scales and u8/i8/f16/f32 zero points only";
  int64_t k = w->dims[1].n, ng = sc->rank == 2 ? sc->dims[1].n : 0;
  if (ng <= 0 || k % ng || (k / ng) % (w->dtype == IR_I4 ? 32 : 16))
    return "the GPU needs quantization groups of a multiple of 32 (int4) or 16 (int8, fp8) columns";
  return NULL;
}

/* The ops and forms the CUDA backend has kernels for; anything else is refused at build time
 * rather than when the plan is opened on a GPU. */
static ir_status cuda_supported(const ir_graph *g, ir_diag *d) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    const char *why = NULL;
    switch (n->op) {
    case IR_OP_MATMUL: {
      ir_dtype wt = g->tensors[n->in[1]].dtype;
      int64_t act = ir_node_attr_i(n, "act", IR_ACT_NONE);
      if (act != IR_ACT_NONE && act != IR_ACT_SWIGLU) why = "the fused epilogue has no GPU kernel";
      else if (wt == IR_I8 || wt == IR_I4 || wt == IR_F8_E4M3) why = wq_refusal(g, n);
      else if (n->n_in > 3)
        why = "separate quantization parameters on float weights have no GPU kernel";
      break;
    }
    case IR_OP_ATTENTION:
      if (n->n_in < 3 || (n->in[1] < 0) != (n->in[2] < 0))
        why = "attention needs q, k and v, or one packed qkv";
      else if (n->n_in > 5 && n->in[5] >= 0 &&
               ir_node_attr_i(n, "n_heads", 0) + ir_node_attr_i(n, "n_kv_heads", 0) > 256)
        why = "the q/k norm kernel takes at most 256 q + kv heads (kv_write.cu)";
      break;
    case IR_OP_EMBED:
    case IR_OP_RMS_NORM:
    case IR_OP_ADD_RMS_NORM:
    case IR_OP_ROPE:
    case IR_OP_SWIGLU:
    case IR_OP_ADD:
    case IR_OP_GATHER_ROWS:
    case IR_OP_SOFTCAP: break;
    default: why = "the op has no GPU kernel"; break;
    }
    if (why)
      return ir_diag_set(d, IR_UNSUPPORTED, "target cuda: node '%s' (%s): %s", n->name,
                         ir_op_name(n->op), why);
  }
  return IR_OK;
}

static ir_status cuda_compile_all(infc_nvrtc *nv, const int *archs, int n_archs,
                                  const char *const *opts, infc_cuda_kernels *out, ir_diag *d) {
  int n_img = infc_cuda_n_sources * n_archs;
  out->images = ir_calloc((size_t)n_img + 1, sizeof *out->images);
  out->table = ir_calloc(2 * (size_t)n_img + 1, sizeof *out->table);
  if (!out->images || !out->table) return ir_diag_set(d, IR_OOM, "out of memory");
  for (int s = 0; s < infc_cuda_n_sources; s++) {
    const infc_cuda_source *src = &infc_cuda_sources[s];
    for (int a = 0; a < n_archs; a++) {
      infc_nvrtc_image *im = &out->images[out->n_images];
      ir_status st = infc_nvrtc_compile(nv, src->text, src->name, archs[a], opts, 3, im, d);
      if (st != IR_OK) return st;
      out->n_images++;
      out->table[out->n++] = (ir_plan_kernel){.name = src->name,
                                              .arch = (uint32_t)archs[a],
                                              .kind = IR_PLAN_KERNEL_CUBIN,
                                              .data = im->cubin,
                                              .size = im->cubin_size};
      out->table[out->n++] = (ir_plan_kernel){.name = src->name,
                                              .arch = (uint32_t)archs[a],
                                              .kind = IR_PLAN_KERNEL_PTX,
                                              .data = (const uint8_t *)im->ptx,
                                              .size = im->ptx_size};
    }
  }
  return IR_OK;
}

ir_status infc_cuda_kernels_build(const ir_graph *g, const char *arch_list, const char *cache_dir,
                                  infc_cuda_kernels *out, ir_diag *d) {
  memset(out, 0, sizeof *out);
  int archs[INFC_NVRTC_MAX_ARCHS], n_archs = 0;
  char defs[3][48];
  const char *opts[3] = {defs[0], defs[1], defs[2]};
  if (!arch_list || !*arch_list) arch_list = INFC_NVRTC_DEFAULT_ARCHS;
  ir_status st = infc_nvrtc_parse_archs(arch_list, archs, INFC_NVRTC_MAX_ARCHS, &n_archs, d);
  if (st == IR_OK) st = cuda_defines(g, defs, d);
  if (st == IR_OK) st = cuda_supported(g, d);
  infc_nvrtc *nv = NULL;
  if (st == IR_OK) st = infc_nvrtc_open(&nv, d);
  if (st == IR_OK) infc_nvrtc_set_cache(nv, cache_dir);
  if (st == IR_OK) st = cuda_compile_all(nv, archs, n_archs, opts, out, d);
  infc_nvrtc_close(nv);
  return st;
}

void infc_cuda_kernels_free(infc_cuda_kernels *k) {
  if (!k) return;
  for (int i = 0; i < k->n_images; i++) infc_nvrtc_image_free(&k->images[i]);
  ir_free(k->images);
  ir_free(k->table);
  memset(k, 0, sizeof *k);
}
