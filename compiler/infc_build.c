/* infc_build: the build driver: picks the frontend (safetensors + config.json, or GGUF),
 * lowers through the Llama template, runs the passes and writes the plan. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "infc_build.h"
#include "infc_codegen_cuda.h"
#include "fmt_gguf.h"
#include "infc_gguf_llama.h"
#include "fmt_gguf_tok.h"
#include "infc_hfconfig.h"
#include "infc_onnx.h"
#include "infc_onnx_llm.h"
#include "infc_onnx_profile.h"
#include "fmt_safetensors.h"
#include "infc_tokenizer.h"
#include "infc_util.h"
#include "ir_plan.h"
#include "kn_pool.h"
#include "llama.h"
#include "pass.h"
#include "ir_alloc.h"

struct infc_source {
  fmt_st *st;      /* a safetensors checkpoint, or */
  fmt_gguf *gguf;  /* a GGUF file, or */
  infc_onnx *onnx; /* an ONNX model (lowered to n-d ops; weights borrowed from it) */
  char kind[16];
  char hash[17];
  char recognised[INFC_ONNX_LLM_RECOGNISED]; /* what the ONNX LLM path matched */
  infc_onnx_dims *dims; /* a generic ONNX graph with symbolic input dims: their ranges */
  ir_model_config limits;
  model_llama_params params; /* the template's, kept to build other tensor-parallel ranks */
  model_tensor_src tensors;
  bool templated;
};

/* A tensor by its HF name; a multimodal checkpoint's text model (Gemma 3's
 * Gemma3ForConditionalGeneration) holds model.X as language_model.model.X (as saved) or
 * model.language_model.X (transformers' in-memory names). */
static bool st_find(void *ctx, const char *name, model_tensor *out) {
  const fmt_st_tensor *t = fmt_st_find(ctx, name);
  char alt[512];
  bool inner = !strncmp(name, "model.", 6);
  if (!t && inner && snprintf(alt, sizeof alt, "language_model.%s", name) < (int)sizeof alt)
    t = fmt_st_find(ctx, alt);
  if (!t && inner &&
      snprintf(alt, sizeof alt, "model.language_model.%s", name + 6) < (int)sizeof alt)
    t = fmt_st_find(ctx, alt);
  if (!t && !strcmp(name, "lm_head.weight")) t = fmt_st_find(ctx, "language_model.lm_head.weight");
  if (!t) return false;
  *out = (model_tensor){.dtype = t->dtype, .rank = t->rank, .data = t->data, .nbytes = t->nbytes};
  for (int i = 0; i < t->rank; i++) out->shape[i] = t->shape[i];
  return true;
}

static void hash_finish(infc_source *s, XXH3_state_t *h) {
  snprintf(s->hash, sizeof s->hash, "%016llx", (unsigned long long)XXH3_64bits_digest(h));
  XXH3_freeState(h);
}

/* The source's pages read so far go back (after each chunk hashed or written). */
static void source_release(void *ctx) {
  const infc_source *s = ctx;
  fmt_st_release(s->st);
  fmt_gguf_release(s->gguf);
}

/* Bytes hashed between two releases of the source's pages. */
#define HASH_CHUNK (64u << 20)

static void hash_bytes(infc_source *s, XXH3_state_t *h, const void *p, uint64_t n) {
  for (uint64_t at = 0; at < n; at += HASH_CHUNK) {
    uint64_t c = n - at < HASH_CHUNK ? n - at : HASH_CHUNK;
    XXH3_64bits_update(h, (const uint8_t *)p + at, c);
    source_release(s);
  }
}

/* XXH3 over config.json and every tensor's name, dtype, shape and bytes. */
static void hash_safetensors(infc_source *s, const char *config_text) {
  XXH3_state_t *h = XXH3_createState();
  if (!h) return;
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, config_text, strlen(config_text));
  for (size_t i = 0; i < fmt_st_count(s->st); i++) {
    const fmt_st_tensor *t = fmt_st_get(s->st, i);
    XXH3_64bits_update(h, t->name, strlen(t->name) + 1);
    XXH3_64bits_update(h, &t->dtype, sizeof t->dtype);
    XXH3_64bits_update(h, t->shape, sizeof t->shape[0] * (size_t)t->rank);
    hash_bytes(s, h, t->data, t->nbytes);
  }
  hash_finish(s, h);
}

/* XXH3 over the GGUF header (metadata and tensor infos) and every tensor's bytes. */
static void hash_gguf(infc_source *s) {
  XXH3_state_t *h = XXH3_createState();
  if (!h) return;
  uint64_t size;
  const void *bytes = fmt_gguf_bytes(s->gguf, &size);
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, bytes, fmt_gguf_data_offset(s->gguf));
  for (size_t i = 0; i < fmt_gguf_tensor_count(s->gguf); i++) {
    const fmt_gguf_tensor *t = fmt_gguf_tensor_get(s->gguf, i);
    hash_bytes(s, h, t->data, t->nbytes);
  }
  hash_finish(s, h);
}

static ir_status find_config(const char *src, char *cfg, size_t len, ir_diag *d) {
  char dir[4096];
  if (infc_is_dir(src)) snprintf(dir, sizeof dir, "%s", src);
  else infc_path_dir(dir, sizeof dir, src);
  struct stat sb;
  if (!infc_path_join(cfg, len, dir, "config.json") || stat(cfg, &sb) != 0)
    return ir_diag_set(d, IR_IO, "%s: no config.json beside the checkpoint", src);
  if (!S_ISREG(sb.st_mode)) return ir_diag_set(d, IR_IO, "%s: not a regular file", cfg);
  return IR_OK;
}

static bool has_ext(const char *src, const char *ext) {
  const char *dot = strrchr(src, '.');
  return dot && !strcmp(dot, ext);
}

static ir_status check_format(const char *src, ir_diag *d) {
  struct stat sb;
  if (stat(src, &sb) != 0)
    return ir_diag_set(d, IR_IO, "%s: %s", src,
                       errno == ENOENT ? "no such file or directory" : strerror(errno));
  if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode))
    return ir_diag_set(d, IR_IO,
                       "%s: not a regular file or directory (a FIFO, socket or "
                       "device)",
                       src);
  return IR_OK;
}

/* An HF checkpoint: config.json drives the template, safetensors hold the weights. */
static ir_status open_safetensors(const char *src, const infc_options *o, infc_source *s,
                                  ir_graph **out_graph, ir_diag *d) {
  char cfg[4096], *text = NULL;
  model_llama_params p;
  ir_status st = find_config(src, cfg, sizeof cfg, d);
  if (st == IR_OK) st = infc_hfconfig_load(cfg, &p, d);
  if (st == IR_OK && (st = infc_read_file(cfg, 16u << 20, &text, NULL, d)) != IR_OK)
    ir_diag_prefix(d, "%s", cfg);
  if (st == IR_OK) st = fmt_st_open(src, &s->st, d);
  if (st == IR_OK) {
    snprintf(s->kind, sizeof s->kind, "safetensors");
    hash_safetensors(s, text);
    model_tensor_src ts = {.ctx = s->st, .find = st_find};
    s->params = p, s->tensors = ts, s->templated = true;
    st = model_llama_build(&p, &ts, &o->model, out_graph, d);
    if (st != IR_OK) ir_diag_prefix(d, "%s", src);
  }
  ir_free(text);
  return st;
}

/* A GGUF file: its metadata drives the template, its tensors are the weights. */
static ir_status open_gguf(const char *src, const infc_options *o, infc_source *s,
                           ir_graph **out_graph, ir_diag *d) {
  model_llama_params p;
  ir_status st = fmt_gguf_open(src, &s->gguf, d);
  if (st == IR_OK) st = infc_gguf_llama_params(s->gguf, &p, d);
  if (st == IR_OK) {
    snprintf(s->kind, sizeof s->kind, "gguf");
    hash_gguf(s);
    model_tensor_src ts = infc_gguf_llama_src(s->gguf);
    s->params = p, s->tensors = ts, s->templated = true;
    st = model_llama_build(&p, &ts, &o->model, out_graph, d);
    if (st != IR_OK) ir_diag_prefix(d, "%s", src);
  }
  return st;
}

/* An ONNX model: a causal LM (input_ids -> logits) is recognised and built as an LLM
 * plan; any other graph is lowered to the n-d generic ops with static shapes. */
static ir_status open_onnx(const char *src, const infc_options *o, infc_source *s,
                           ir_graph **out_graph, ir_diag *d) {
  bool is_lm = false;
  snprintf(s->kind, sizeof s->kind, "onnx");
  if (o->model.layers > 0)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "--layers: an ONNX graph is built as exported; keep the first layers of "
                       "a safetensors or GGUF checkpoint instead");
  ir_status st =
      infc_onnx_llm_import(src, &o->model, &is_lm, &s->onnx, out_graph, s->hash, s->recognised, d);
  if (st != IR_OK || is_lm) return st;
  ir_model_config lim = {.max_tokens = o->model.max_tokens,
                         .max_seqs = o->model.max_seqs,
                         .max_logits = o->model.max_logits,
                         .kv_block_size = o->model.kv_block_size};
  s->limits = lim;
  if (!(s->dims = ir_calloc(1, sizeof *s->dims))) return ir_diag_set(d, IR_OOM, "out of memory");
  if ((st = infc_onnx_load(src, &s->onnx, d)) != IR_OK) return st;
  infc_onnx_hash(s->onnx, s->hash);
  st = infc_onnx_dims_read(s->onnx, o, s->dims, d);
  if (st != IR_OK) {
    ir_diag_prefix(d, "%s", src);
    return st;
  }
  if (!s->dims->n_syms) return infc_onnx_import_loaded(s->onnx, &lim, NULL, 0, out_graph, d);
  int64_t max[IR_MAX_PROFILE_SYMS]; /* imported at the maxima: the memory plan's sizes */
  for (int k = 0; k < s->dims->n_syms; k++) max[k] = s->dims->syms[k].max;
  return infc_onnx_import_at(s->onnx, &lim, s->dims, max, out_graph, d);
}

ir_status infc_source_open(const char *src, const infc_options *o, infc_source **out,
                           ir_graph **out_graph, ir_diag *d) {
  *out = NULL;
  *out_graph = NULL;
  ir_status st = check_format(src, d);
  infc_source *s = st == IR_OK ? ir_calloc(1, sizeof *s) : NULL;
  if (st == IR_OK && !s) st = ir_diag_set(d, IR_OOM, "out of memory");
  if (st == IR_OK && !infc_is_dir(src) && infc_onnx_is_source(src))
    st = open_onnx(src, o, s, out_graph, d);
  else if (st == IR_OK)
    st = !infc_is_dir(src) && has_ext(src, ".gguf") ? open_gguf(src, o, s, out_graph, d)
                                                    : open_safetensors(src, o, s, out_graph, d);
  if (st != IR_OK) {
    infc_source_close(s);
    return st;
  }
  *out = s;
  return IR_OK;
}

void infc_source_close(infc_source *s) {
  if (!s) return;
  fmt_st_close(s->st);
  fmt_gguf_close(s->gguf);
  infc_onnx_close(s->onnx);
  ir_free(s->dims);
  ir_free(s);
}

const char *infc_source_hash(const infc_source *s) { return s->hash; }

static void fill_report(const ir_graph *g, const infc_source *s, int before, infc_build_report *r) {
  if (!r) return;
  r->nodes_before = before;
  r->nodes_after = g->n_nodes;
  r->weight_bytes = 0;
  for (int32_t i = 0; i < g->n_tensors; i++)
    if (g->tensors[i].kind == IR_TENSOR_WEIGHT) r->weight_bytes += g->tensors[i].nbytes;
  r->arena_bytes = g->arena_size;
  snprintf(r->source_kind, sizeof r->source_kind, "%s", s->kind);
  snprintf(r->recognised, sizeof r->recognised, "%s", s->recognised);
  infc_onnx_profile_describe(g->profile, r->shapes, sizeof r->shapes);
}

/* Tensor parallelism: what --tp does not take yet, refused by name. */
static ir_status tp_supported(const infc_options *o, const infc_source *s, ir_diag *d) {
  if (o->model.tp_size <= 1) return IR_OK;
  if (!strcmp(o->target, "cuda"))
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "--tp %d with --target cuda: the NCCL path is not built yet; tensor "
                       "parallelism runs CPU plans (MPI)",
                       o->model.tp_size);
  if (!s->templated)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "--tp %d: an ONNX source is not sharded; build from safetensors or GGUF",
                       o->model.tp_size);
  if (o->quant_calib[0])
    return ir_diag_set(d, IR_UNSUPPORTED, "--tp %d with --quant-calib is not supported",
                       o->model.tp_size);
  return IR_OK;
}

/* Ranks 1.. of a tensor-parallel build: each rank's graph from the template, through the
 * same passes as rank 0's. */
static ir_status build_ranks(infc_source *s, const infc_options *o, const pass_opts *po,
                             ir_graph **ranks, ir_diag *d) {
  ir_status st = IR_OK;
  for (int r = 1; r < o->model.tp_size && st == IR_OK; r++) {
    model_build_opts mo = o->model;
    mo.tp_rank = r;
    pass_log log = {0};
    st = model_llama_build(&s->params, &s->tensors, &mo, &ranks[r], d);
    if (st == IR_OK) st = pass_pipeline_run(ranks[r], po, &log, d);
    pass_log_free(&log);
    if (st != IR_OK) ir_diag_prefix(d, "tensor-parallel rank %d", r);
  }
  return st;
}

ir_status infc_build(const char *src, const infc_options *opts, const char *out_path, FILE *dump_ir,
                     infc_build_report *report, ir_diag *d) {
  infc_options o = *opts;
  model_build_opts *m = &o.model;
  if (!o.max_tokens_set && !strcmp(o.target, "cuda")) m->max_tokens = INFC_CUDA_MAX_TOKENS;
  if (m->max_seqs > m->max_tokens) m->max_seqs = m->max_tokens;
  if (m->max_logits > m->max_tokens) m->max_logits = m->max_tokens;
  infc_source *s = NULL;
  ir_graph *g = NULL;
  m->tp_rank = 0;
  ir_status st = infc_source_open(src, &o, &s, &g, d);
  if (st != IR_OK) return st;
  int before = g->n_nodes;
  ir_graph *ranks[IR_MAX_TP] = {0};
  st = tp_supported(&o, s, d);
  infc_tok_blob tok = {0};
  if (st != IR_OK) (void)0; /* a refused --tp: nothing more to read */
  else if (o.tokenizer[0])
    st = infc_tokenizer_load_json(o.tokenizer, g->config.vocab_size, &tok, d);
  else if (!strcmp(s->kind, "gguf"))
    st = infc_gguf_tokenizer_blob(s->gguf, g->config.vocab_size, &tok, d);
  else st = infc_tokenizer_beside(src, g->config.vocab_size, &tok, d);
  pass_opts po = {.fold = o.fold,
                  .fuse = o.fuse,
                  .no_fuse = o.no_fuse,
                  .dump_ir = dump_ir,
                  .quant = &o.quant,
                  .quant_calib = o.quant_calib[0] ? o.quant_calib : NULL,
                  .act_int8 = infc_options_act_int8(&o),
                  .act_bf16 = infc_options_act_bf16(&o),
                  .attn_bf16 = infc_options_attn_bf16(&o),
                  .repack = o.repack,
                  .pool = kn_pool_create(0)}; /* NULL (no threads): serial */
  if (st == IR_OK && o.act_dtype == INFC_ACT_INT8 && !strcmp(o.target, "cuda"))
    st = ir_diag_set(d, IR_UNSUPPORTED,
                     "option 'act_dtype': int8 activations of q8_0/q4_0/q4_1 "
                     "matmuls are a CPU path (the GPU kernels read f32); use auto or f32 with "
                     "--target cuda");
  if (st == IR_OK && o.act_dtype == INFC_ACT_BF16 && !strcmp(o.target, "cuda"))
    st = ir_diag_set(d, IR_UNSUPPORTED,
                     "option 'act_dtype': bf16 activations of bf16 matmuls are a CPU path (the "
                     "GPU kernels read f32); use auto or f32 with --target cuda");
  if (st == IR_OK && o.attn_dtype == INFC_ATTN_BF16 && !strcmp(o.target, "cuda"))
    st = ir_diag_set(d, IR_UNSUPPORTED,
                     "option 'attn_dtype': bf16 attention is a CPU path (the GPU kernels keep "
                     "their own); use auto or f32 with --target cuda");
  if (!strcmp(o.target, "cuda")) {
    po.capture_plan = true;
    if (o.n_decode_buckets > 0)
      po.decode_buckets = o.decode_buckets, po.n_decode_buckets = o.n_decode_buckets;
  } else if (o.n_decode_buckets > 0 && st == IR_OK) {
    st = ir_diag_set(d, IR_INVALID_ARG,
                     "option 'decode_buckets': CUDA Graph buckets need --target cuda");
  }
  pass_log log = {0};
  if (st == IR_OK) st = pass_pipeline_run(g, &po, &log, d);
  ranks[0] = g;
  if (st == IR_OK && m->tp_size > 1) st = build_ranks(s, &o, &po, ranks, d);
  if (st == IR_OK && s->dims && s->dims->n_syms) {
    st = infc_onnx_profile_build(s->onnx, &s->limits, s->dims, &po, g, d);
    if (st != IR_OK) ir_diag_prefix(d, "%s", src);
  }
  infc_cuda_kernels ck = {0}; /* target cuda: NVRTC images for the kernels section */
  if (st == IR_OK && !strcmp(o.target, "cuda"))
    st = infc_cuda_kernels_build(g, o.arch, o.cache_dir, &ck, d);
  if (st == IR_OK) {
    const char *keys[16], *vals[16];
    char buf[1024];
    int n = infc_options_describe(&o, keys, vals, 16, buf, sizeof buf);
    ir_plan_info info = {.target = o.target,
                         .source_hash = infc_source_hash(s),
                         .option_keys = keys,
                         .option_values = vals,
                         .n_options = n,
                         .pass_log = (const char *const *)log.lines,
                         .n_pass_log = log.n,
                         .tokenizer = tok.data,
                         .tokenizer_size = tok.size,
                         .kernels = ck.table,
                         .n_kernels = ck.n,
                         .ranks = (const ir_graph *const *)ranks,
                         .n_ranks = m->tp_size > 1 ? m->tp_size : 0,
                         .release = source_release,
                         .release_ctx = s};
    st = ir_plan_write(g, &info, out_path, d);
  }
  if (st == IR_OK) fill_report(g, s, before, report);
  if (st == IR_OK && report) report->passes = log.res;
  if (st == IR_OK && report)
    snprintf(report->tokenizer, sizeof report->tokenizer, "%s", tok.origin);
  infc_tok_blob_free(&tok);
  infc_cuda_kernels_free(&ck);
  kn_pool_destroy(po.pool);
  pass_log_free(&log);
  for (int r = 1; r < IR_MAX_TP; r++) ir_graph_destroy(ranks[r]);
  ir_graph_destroy(g);
  infc_source_close(s);
  return st;
}
