/* model: opening a plan for execution, sequences and their KV blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "ir_alloc.h"

irt_model_opts irt_model_opts_default(void) {
  return (irt_model_opts){.n_threads = 0, .kv_tokens = 0, .skip_weight_checksum = true};
}

irt_status irt_plan_verify(const char *plan_path, irt_error *err) {
  ir_diag d = {0};
  ir_plan *p = NULL;
  ir_status st = ir_plan_open(plan_path, IR_PLAN_VERIFY_ALL, &p, &d);
  ir_plan_close(p);
  if (st != IR_OK) rt_error_from_diag(err, &d);
  return rt_status_from_ir(st);
}

irt_status irt_plan_tp_size(const char *plan_path, int *out, irt_error *err) {
  ir_diag d = {0};
  ir_plan *p = NULL;
  ir_status st = ir_plan_open(plan_path, IR_PLAN_VERIFY_META, &p, &d);
  *out = st == IR_OK ? ir_plan_tp_size(p) : 0;
  ir_plan_close(p);
  if (st != IR_OK) rt_error_from_diag(err, &d);
  return rt_status_from_ir(st);
}

static int32_t find_io(const ir_graph *g, const char *name, ir_diag *d) {
  int32_t t = ir_graph_find_tensor(g, name);
  if (t < 0) ir_diag_set(d, IR_BAD_FORMAT, "plan has no '%s' tensor", name);
  return t;
}

/* The backends' log calls (irt_cuda_opts.log) to the caller's irt_log_fn. */
static void model_log(void *user, int level, const char *msg) {
  irt_model *m = user;
  if (m->log) m->log(m->log_user, (irt_log_level)level, msg);
}

/* The backend for the plan's target and opts->device (NULL / "auto": the target). */
static ir_status open_backend(irt_model *m, const irt_model_opts *o, ir_diag *d) {
  const char *dev = o->device && *o->device ? o->device : "auto";
  const char *target = ir_plan_target(m->plan) ? ir_plan_target(m->plan) : "cpu";
  bool cuda_plan = !strcmp(target, "cuda") && ir_plan_n_kernels(m->plan) > 0;
  if (!strcmp(dev, "auto")) dev = cuda_plan ? "cuda" : "cpu";
  if (!strcmp(dev, "cpu")) return backend_cpu_create(o->n_threads, &m->be, d);
  if (strcmp(dev, "cuda"))
    return ir_diag_set(d, IR_INVALID_ARG, "device '%s': expected cpu, cuda or auto", dev);
  if (!cuda_plan)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "device cuda needs a CUDA plan, and this plan was built for target '%s' "
                       "(rebuild it with infc build --target cuda, or run with --device cpu)",
                       target);
  irt_cuda_opts co = {.abi = IRT_CUDA_ABI,
                      .layout = IRT_CUDA_LAYOUT,
                      .device = o->cuda_device,
                      .graphs = !o->no_cuda_graphs,
                      .pdl = !o->no_cuda_pdl,
                      .kv_dtype = (int)o->kv_dtype,
                      .kernels = ir_plan_kernel_at(m->plan, 0),
                      .n_kernels = ir_plan_n_kernels(m->plan),
                      .profile = o->cuda_profile,
                      .dequant_gemm_m = o->cuda_dequant_gemm_m < 0    ? 0
                                        : o->cuda_dequant_gemm_m == 0 ? BACKEND_CUDA_DEQUANT_GEMM_M
                                                                      : o->cuda_dequant_gemm_m,
                      .log = model_log,
                      .log_user = m,
                      .lib = o->cuda_lib};
  return irt_backend_cuda_open(&co, m->g, &m->be, d);
}

/* A weight's address for the backend: in the mapping, or uploaded once to the device. */
static ir_status bind_weight(irt_model *m, const ir_tensor *t, void **out, ir_diag *d) {
  *out = (void *)t->data;
  if (!m->be.ops->upload) return IR_OK;
  ir_status st = m->be.ops->upload(m->be.ctx, t->data, t->nbytes, out, d);
  if (st != IR_OK) ir_diag_prefix(d, "weight '%s'", t->name);
  return st;
}

/* Resolves every tensor to an address: weights in the mapping (or on the device), the
 * rest in the arena. */
static ir_status bind_tensors(irt_model *m, ir_diag *d) {
  const ir_graph *g = m->g;
  m->arena = m->be.ops->alloc(m->be.ctx, g->arena_size);
  m->ptrs = ir_calloc((size_t)g->n_tensors + 1, sizeof *m->ptrs);
  if (!m->arena || !m->ptrs) return ir_diag_set(d, IR_OOM, "cannot allocate the activation arena");
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const ir_tensor *t = &g->tensors[i];
    if (t->kind == IR_TENSOR_WEIGHT) {
      ir_status st = bind_weight(m, t, &m->ptrs[i], d);
      if (st != IR_OK) return st;
      continue;
    }
    uint64_t need = ir_tensor_bytes(g, t, NULL);
    if (t->arena_offset < 0 || need > g->arena_size ||
        (uint64_t)t->arena_offset > g->arena_size - need)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s' lies outside the arena", t->name);
    m->ptrs[i] = (char *)m->arena + t->arena_offset;
  }
  return IR_OK;
}

static ir_status setup_io(irt_model *m, ir_diag *d) {
  const ir_graph *g = m->g;
  m->in_tokens = find_io(g, "tokens", d);
  m->in_positions = find_io(g, "positions", d);
  m->in_logit_rows = find_io(g, "logit_rows", d);
  if (g->n_outputs != 1) return ir_diag_set(d, IR_BAD_FORMAT, "plan must have one output (logits)");
  m->out_logits = g->outputs[0];
  if (m->in_tokens < 0 || m->in_positions < 0 || m->in_logit_rows < 0) return d->status;
  const ir_tensor *lo = &g->tensors[m->out_logits];
  if (lo->rank != 2 || lo->dtype != IR_F32 || lo->dims[0].sym != IR_SYM_LOGITS ||
      lo->dims[1].n != g->config.vocab_size)
    return ir_diag_set(d, IR_BAD_FORMAT, "plan output is not logits[L, vocab] f32");
  return IR_OK;
}

/* A device backend's KV pool gets one block more, held for good: decode steps padded to
 * a graph's batch bucket write their padding tokens there. */
static ir_status setup_device_kv(irt_model *m, int64_t tokens, kv_dtype_id dtype, ir_diag *d) {
  const ir_model_config *c = &m->g->config;
  m->h_tokens = ir_calloc((size_t)c->max_tokens, sizeof(int32_t));
  m->h_rows = ir_calloc((size_t)c->max_logits, sizeof(int32_t));
  m->h_pick = ir_calloc((size_t)c->max_logits, sizeof *m->h_pick);
  m->h_pick_res = ir_calloc((size_t)c->max_logits, sizeof *m->h_pick_res);
  m->h_pick_top = ir_calloc((size_t)c->max_logits * PICK_TOP, sizeof *m->h_pick_top);
  m->h_row = ir_calloc((size_t)c->vocab_size, sizeof(float));
  if (!m->h_tokens || !m->h_rows || !m->h_pick || !m->h_pick_res || !m->h_pick_top || !m->h_row)
    return ir_diag_set(d, IR_OOM, "out of memory");
  ir_diag probe = {0};
  m->dev_pick = m->be.ops->pick && m->be.ops->pick(m->be.ctx, NULL, c->vocab_size, 0, NULL, NULL,
                                                   NULL, NULL, NULL, &probe) == IR_OK;
  ir_status st =
      kv_cache_init_dtype(&m->kv, c->n_layers, c->n_kv_heads, c->head_dim, c->kv_block_size,
                          tokens + c->kv_block_size, dtype, m->be.ops->alloc, m->be.ctx, d);
  if (st == IR_OOM && m->be.ops->mem_info) {
    uint64_t fr = 0, tot = 0,
             want = (uint64_t)(tokens + c->kv_block_size) *
                    kv_token_bytes(c->n_layers, c->n_kv_heads, c->head_dim, dtype);
    m->be.ops->mem_info(m->be.ctx, &fr, &tot);
    *d = (ir_diag){0};
    return ir_diag_set(d, IR_OOM,
                       "out of device memory for the KV pool: %lld tokens need %.1f MiB, %.1f "
                       "MiB of %.1f MiB are free (lower --kv-tokens)",
                       (long long)tokens, (double)want / 1048576.0, (double)fr / 1048576.0,
                       (double)tot / 1048576.0);
  }
  if (st != IR_OK) return st;
  m->pad_block = kv_block_alloc(&m->kv);
  m->kv.copy = m->be.ops->copy;
  m->kv.copy_ctx = m->be.ctx;
  return IR_OK;
}

/* Whether a matmul of g takes prompt rows and generated rows on different kernels: act_bf16
 * over a block weight (ir_op.c), whose generated rows take int8 activations instead. */
static bool model_has_roles(const ir_graph *g) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op == IR_OP_MATMUL && n->n_in > 1 && n->in[1] >= 0 &&
        ir_dtype_is_blocks(g->tensors[n->in[1]].dtype) && ir_node_attr_i(n, "act_bf16", 0))
      return true;
  }
  return false;
}

static ir_status setup_kv(irt_model *m, const irt_model_opts *o, ir_diag *d) {
  const ir_model_config *c = &m->g->config;
  int64_t tokens = o->kv_tokens > 0 ? o->kv_tokens : c->max_position;
  m->max_blocks = (c->max_position + c->kv_block_size - 1) / c->kv_block_size;
  m->tok_seq = ir_calloc((size_t)c->max_tokens, sizeof(int32_t));
  m->tok_pos = ir_calloc((size_t)c->max_tokens, sizeof(int32_t));
  m->tok_gen = ir_calloc((size_t)c->max_tokens, sizeof(uint8_t));
  m->roles = model_has_roles(m->g);
  m->block_tables = ir_calloc((size_t)(c->max_seqs * m->max_blocks), sizeof(int32_t));
  m->pad_block = -1;
  if (!m->tok_seq || !m->tok_pos || !m->tok_gen || !m->block_tables)
    return ir_diag_set(d, IR_OOM, "out of memory");
  /* a device backend has refused a KV dtype it cannot keep when it was created */
  ir_status st =
      m->be.ops->run_step
          ? setup_device_kv(m, tokens, (kv_dtype_id)o->kv_dtype, d)
          : kv_cache_init_dtype(&m->kv, c->n_layers, c->n_kv_heads, c->head_dim, c->kv_block_size,
                                tokens, (kv_dtype_id)o->kv_dtype, m->be.ops->alloc, m->be.ctx, d);
  m->kv.row_roles = m->roles;
  return st;
}

_Static_assert((int)IRT_KV_DTYPE_F32 == (int)KV_F32 && (int)IRT_KV_DTYPE_INT8 == (int)KV_INT8 &&
                   (int)IRT_KV_DTYPE_F16 == (int)KV_F16,
               "public and internal KV dtype values agree");

bool irt_kv_dtype_parse(const char *s, irt_kv_dtype *out) {
  if (!s) return false;
  if (!strcmp(s, "f32")) *out = IRT_KV_DTYPE_F32;
  else if (!strcmp(s, "int8")) *out = IRT_KV_DTYPE_INT8;
  else if (!strcmp(s, "f16")) *out = IRT_KV_DTYPE_F16;
  else return false;
  return true;
}

const char *irt_kv_dtype_name(irt_kv_dtype t) {
  return t == IRT_KV_DTYPE_F32    ? "f32"
         : t == IRT_KV_DTYPE_F16  ? "f16"
         : t == IRT_KV_DTYPE_INT8 ? "int8"
                                  : "?";
}

uint64_t irt_model_kv_token_bytes(const irt_model *m, irt_kv_dtype t) {
  const ir_model_config *c = &m->g->config;
  return kv_token_bytes(c->n_layers, c->n_kv_heads, c->head_dim, (kv_dtype_id)t);
}

static void fill_info(irt_model *m) {
  const ir_model_config *c = &m->g->config;
  uint64_t wb = 0;
  for (int32_t i = 0; i < m->g->n_tensors; i++)
    if (m->g->tensors[i].kind == IR_TENSOR_WEIGHT) wb += m->g->tensors[i].nbytes;
  m->info = (irt_model_info){.arch = c->arch,
                             .vocab_size = c->vocab_size,
                             .context_length = c->max_position,
                             .n_layers = c->n_layers,
                             .hidden_size = c->hidden_size,
                             .bos_token_id = c->bos_token_id,
                             .eos_token_id = c->eos_token_id,
                             .max_step_tokens = c->max_tokens,
                             .max_step_seqs = c->max_seqs,
                             .max_step_logits = c->max_logits,
                             .weight_bytes = wb,
                             .arena_bytes = m->g->arena_size,
                             .kv_bytes = kv_cache_bytes(&m->kv),
                             .kv_tokens = m->kv.n_blocks * m->kv.block_size,
                             .kv_dtype = irt_kv_dtype_name((irt_kv_dtype)m->kv.dtype),
                             .device = m->be.ops->name,
                             .n_heads = c->n_heads,
                             .n_kv_heads = c->n_kv_heads,
                             .head_dim = c->head_dim,
                             .tp_size = c->tp_size > 1 ? c->tp_size : 1};
}

/* A device backend's first steps pay one-time costs: cuBLAS loading its kernels and choosing
 * algorithms, the driver loading each kernel at its first launch, a CUDA Graph captured per
 * decode bucket. They are paid here, at open, not by the first requests (nor counted in
 * their prefill and decode times): a prompt of max_tokens tokens, then two decode steps of
 * each bucket (the first eager, the second captured), with fresh sequences that are dropped
 * after. A bucket whose sequences the KV pool cannot hold is left for later. */
static irt_status warm_up(irt_model *m, irt_error *err) {
  const ir_model_config *c = &m->g->config;
  int64_t bucket[IR_MAX_DECODE_BUCKETS], n_b = c->n_decode_buckets;
  if (n_b > 0) memcpy(bucket, c->decode_buckets, (size_t)n_b * sizeof *bucket);
  else n_b = ir_default_decode_buckets(c, bucket);
  int64_t most = m->info.max_step_tokens, nseq = n_b ? bucket[n_b - 1] : 1;
  int64_t room = kv_available(&m->kv) * m->kv.block_size;
  if (most > room) most = room;
  if (most > m->info.context_length - 1) most = m->info.context_length - 1;
  irt_sampling greedy = irt_sampling_default();
  irt_sampler *smp = NULL;
  int32_t *ids = ir_calloc((size_t)(most > nseq ? most : nseq), sizeof *ids);
  irt_seq **s = ir_calloc((size_t)nseq, sizeof *s);
  irt_batch_item *it = ir_calloc((size_t)nseq, sizeof *it);
  irt_pick *pk = ir_calloc((size_t)nseq, sizeof *pk);
  irt_status st = ids && s && it && pk ? IRT_OK : IRT_OOM;
  if (st == IRT_OOM) snprintf(err->msg, sizeof err->msg, "out of memory");
  if (st == IRT_OK) st = irt_sampler_create(&greedy, m->info.vocab_size, &smp, err);
  if (st == IRT_OK && most > 0 && (st = irt_seq_create(m, &s[0], err)) == IRT_OK) {
    it[0] = (irt_batch_item){.seq = s[0], .tokens = ids, .n = most, .pick = &pk[0]};
    pk[0].sampler = smp;
    st = irt_decode_batch(m, it, 1, err);
    irt_seq_destroy(s[0]);
    s[0] = NULL;
  }
  for (int64_t b = 0; st == IRT_OK && b < n_b; b++) {
    int64_t n = bucket[b];
    if (n * ((2 + m->kv.block_size - 1) / m->kv.block_size) > kv_available(&m->kv)) continue;
    for (int64_t i = 0; st == IRT_OK && i < n; i++) {
      st = irt_seq_create(m, &s[i], err);
      pk[i].sampler = smp;
      it[i] = (irt_batch_item){.seq = s[i], .tokens = ids, .n = 1, .pick = &pk[i]};
    }
    for (int step = 0; st == IRT_OK && step < 2; step++) st = irt_decode_batch(m, it, (int)n, err);
    for (int64_t i = 0; i < n; i++) irt_seq_destroy(s[i]), s[i] = NULL;
  }
  irt_sampler_destroy(smp);
  ir_free(ids), ir_free(s), ir_free(it), ir_free(pk);
  if (st == IRT_OK && m->be.ops->ready) m->be.ops->ready(m->be.ctx);
  return st;
}

irt_status irt_model_open(const char *path, const irt_model_opts *opts, irt_model **out,
                          irt_error *err) {
  ir_diag d = {0};
  irt_model_opts o = opts ? *opts : irt_model_opts_default();
  *out = NULL;
  irt_model *m = ir_calloc(1, sizeof *m);
  if (!m) ir_diag_set(&d, IR_OOM, "out of memory");
  else m->log = o.log, m->log_user = o.log_user;
  int rank = o.comm && o.comm->rank > 0 ? o.comm->rank : 0; /* its shard of a --tp plan */
  if (m && (o.preload < IRT_PRELOAD_OFF || o.preload > IRT_PRELOAD_WAIT))
    ir_diag_set(&d, IR_INVALID_ARG, "preload: unknown mode %d (0 off, 1 background, 2 wait)",
                (int)o.preload);
  ir_status st = d.status ? d.status
                 : m      ? ir_plan_open_rank(
                                path, o.skip_weight_checksum ? IR_PLAN_VERIFY_META : IR_PLAN_VERIFY_ALL,
                                rank, &m->plan, &d)
                     : IR_OOM;
  if (st == IR_OK) {
    m->g = ir_plan_graph(m->plan);
    st = open_backend(m, &o, &d);
  }
  if (st == IR_OK) m->preload = model_preload_start(m, o.preload);
  if (st == IR_OK) st = m->be.ops->check(m->be.ctx, m->g, &d);
  if (st == IR_OK) st = setup_io(m, &d);
  if (st == IR_OK) st = bind_tensors(m, &d);
  if (st == IR_OK) st = setup_kv(m, &o, &d);
  if (st == IR_OK) st = tp_open(m, &o, &d);
  if (st == IR_OK) st = model_plan_tokenizer(m->plan, &m->tok, &d);
  if (st == IR_OK && !(m->h_pen = ir_malloc((size_t)m->g->config.vocab_size * sizeof(float))))
    st = ir_diag_set(&d, IR_OOM, "out of memory");
  if (st != IR_OK) {
    rt_error_from_diag(err, &d);
    irt_model_close(m);
    return rt_status_from_ir(st);
  }
  fill_info(m);
  irt_status ws = m->be.ops->run_step ? warm_up(m, err) : IRT_OK;
  if (ws != IRT_OK) {
    irt_model_close(m);
    return ws;
  }
  *out = m;
  return IRT_OK;
}

void irt_model_close(irt_model *m) {
  if (!m) return;
  model_preload_stop(m->preload);
  tp_close(m);
  if (m->be.ops) {
    kv_cache_release(&m->kv, m->be.ops->free, m->be.ctx);
    if (m->arena) m->be.ops->free(m->be.ctx, m->arena);
    for (int32_t i = 0; m->be.ops->upload && m->ptrs && i < m->g->n_tensors; i++)
      if (m->g->tensors[i].kind == IR_TENSOR_WEIGHT && m->ptrs[i])
        m->be.ops->free(m->be.ctx, m->ptrs[i]);
  }
  backend_destroy(&m->be);
  ir_free(m->ptrs);
  ir_free(m->tok_seq);
  ir_free(m->tok_pos);
  ir_free(m->tok_gen);
  ir_free(m->block_tables);
  ir_free(m->h_tokens);
  ir_free(m->h_rows);
  ir_free(m->h_pick);
  ir_free(m->h_pick_res);
  ir_free(m->h_pick_top);
  ir_free(m->h_row);
  ir_free(m->h_pen);
  ir_free(m->h_pen_ids);
  ir_free(m->h_pen_sub);
  tok_destroy(m->tok);
  ir_plan_close(m->plan);
  ir_free(m);
}

/* The KV cache's prefix-cache hook, as the public event. */
static void kv_cache_event(void *ctx, const kv_cache *kv, int32_t b, bool stored) {
  irt_model *m = ctx;
  const kv_meta *meta = &kv->meta[b];
  irt_kv_event ev = {.kind = stored ? IRT_KV_BLOCK_STORED : IRT_KV_BLOCK_REMOVED,
                     .block_hash = meta->hash,
                     .parent_hash = stored ? meta->parent : 0,
                     .tokens = stored ? &kv->tokens[(size_t)b * (size_t)kv->block_size] : NULL,
                     .block_size = kv->block_size};
  m->kv_event(m->kv_event_user, &ev);
}

void irt_model_set_kv_events(irt_model *m, irt_kv_event_fn fn, void *user) {
  m->kv_event = fn, m->kv_event_user = user;
  m->kv.on_cache = fn ? kv_cache_event : NULL;
  m->kv.on_cache_ctx = m;
}

const irt_model_info *irt_model_get_info(const irt_model *m) { return &m->info; }

const irt_tokenizer *irt_model_get_tokenizer(const irt_model *m) { return m->tok; }

ir_status model_plan_tokenizer(const ir_plan *p, irt_tokenizer **out, ir_diag *d) {
  size_t n = 0;
  const uint8_t *buf = ir_plan_tokenizer(p, &n);
  *out = NULL;
  if (!buf) return IR_OK;
  ir_status st = tok_deserialize(buf, n, out, d);
  /* grammar masks and logit rows are sized by the model's vocabulary: a tokenizer with more
   * tokens than the logits have rows would index past them (the compiler refuses one; a plan
   * from elsewhere is checked again) */
  int64_t vocab = ir_plan_graph(p)->config.vocab_size;
  if (st == IR_OK && vocab > 0 && tok_vocab_size(*out) > vocab) {
    st = ir_diag_set(d, IR_BAD_FORMAT,
                     "it has %d tokens but the model's vocabulary has %lld "
                     "rows",
                     tok_vocab_size(*out), (long long)vocab);
    tok_destroy(*out);
    *out = NULL;
  }
  if (st != IR_OK) ir_diag_prefix(d, "plan tokenizer");
  return st;
}

irt_status irt_seq_create(irt_model *m, irt_seq **out, irt_error *err) {
  irt_seq *s = ir_calloc(1, sizeof *s);
  int32_t *blocks = ir_calloc((size_t)m->max_blocks, sizeof *blocks);
  if (!s || !blocks) {
    ir_free(s), ir_free(blocks);
    if (err) *err = (irt_error){.status = IRT_OOM, .msg = "out of memory"};
    return IRT_OOM;
  }
  s->m = m;
  s->blocks = blocks;
  s->prompt_len = INT64_MAX;
  *out = s;
  return IRT_OK;
}

void irt_seq_set_prompt_len(irt_seq *s, int64_t n) { s->prompt_len = n < 0 ? 0 : n; }

void irt_seq_destroy(irt_seq *s) {
  if (!s) return;
  irt_seq_truncate(s, 0);
  ir_free(s->blocks);
  ir_free(s);
}

int64_t irt_seq_length(const irt_seq *s) { return s->len; }
