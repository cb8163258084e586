/* model: opening a plan for execution, sequences and their KV blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"

const char *irt_status_name(irt_status s) { return ir_status_name((ir_status)s); }

void irt_error_from_diag(irt_error *err, const ir_diag *d) {
  if (!err) return;
  err->status = (irt_status)d->status;
  snprintf(err->msg, sizeof err->msg, "%s", d->msg);
}

irt_model_opts irt_model_opts_default(void) {
  return (irt_model_opts){.n_threads = 0, .kv_tokens = 0, .skip_weight_checksum = false};
}

static int32_t find_io(const ir_graph *g, const char *name, ir_diag *d) {
  int32_t t = ir_graph_find_tensor(g, name);
  if (t < 0) ir_diag_set(d, IR_BAD_FORMAT, "plan has no '%s' tensor", name);
  return t;
}

/* Resolves every tensor to an address: weights in the mapping, the rest in the arena. */
static ir_status bind_tensors(irt_model *m, ir_diag *d) {
  const ir_graph *g = m->g;
  m->arena = m->be.ops->alloc(m->be.ctx, g->arena_size);
  m->ptrs = calloc((size_t)g->n_tensors + 1, sizeof *m->ptrs);
  if (!m->arena || !m->ptrs) return ir_diag_set(d, IR_OOM, "cannot allocate the activation arena");
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const ir_tensor *t = &g->tensors[i];
    if (t->kind == IR_TENSOR_WEIGHT) {
      m->ptrs[i] = (void *)t->data;
      continue;
    }
    uint64_t need = ir_tensor_bytes(g, t, NULL);
    if (t->arena_offset < 0 || (uint64_t)t->arena_offset + need > g->arena_size)
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

static ir_status setup_kv(irt_model *m, const irt_model_opts *o, ir_diag *d) {
  const ir_model_config *c = &m->g->config;
  int64_t tokens = o->kv_tokens > 0 ? o->kv_tokens : c->max_position;
  m->max_blocks = (c->max_position + c->kv_block_size - 1) / c->kv_block_size;
  m->tok_seq = calloc((size_t)c->max_tokens, sizeof(int32_t));
  m->tok_pos = calloc((size_t)c->max_tokens, sizeof(int32_t));
  m->block_tables = calloc((size_t)(c->max_seqs * m->max_blocks), sizeof(int32_t));
  if (!m->tok_seq || !m->tok_pos || !m->block_tables)
    return ir_diag_set(d, IR_OOM, "out of memory");
  return irt_kv_cache_init(&m->kv, c->n_layers, c->n_kv_heads, c->head_dim, c->kv_block_size,
                           tokens, m->be.ops->alloc, m->be.ctx, d);
}

static void fill_info(irt_model *m) {
  const ir_model_config *c = &m->g->config;
  uint64_t wb = 0;
  for (int32_t i = 0; i < m->g->n_tensors; i++)
    if (m->g->tensors[i].kind == IR_TENSOR_WEIGHT) wb += m->g->tensors[i].nbytes;
  m->info = (irt_model_info){
      .arch = c->arch, .vocab_size = c->vocab_size, .context_length = c->max_position,
      .n_layers = c->n_layers, .hidden_size = c->hidden_size, .bos_token_id = c->bos_token_id,
      .eos_token_id = c->eos_token_id, .max_step_tokens = c->max_tokens,
      .max_step_seqs = c->max_seqs, .max_step_logits = c->max_logits, .weight_bytes = wb,
      .arena_bytes = m->g->arena_size, .kv_bytes = irt_kv_cache_bytes(&m->kv)};
}

irt_status irt_model_open(const char *path, const irt_model_opts *opts, irt_model **out,
                          irt_error *err) {
  ir_diag d = {0};
  irt_model_opts o = opts ? *opts : irt_model_opts_default();
  *out = NULL;
  irt_model *m = calloc(1, sizeof *m);
  if (!m) ir_diag_set(&d, IR_OOM, "out of memory");
  ir_status st = m ? ir_plan_open(path, o.skip_weight_checksum ? IR_PLAN_VERIFY_META
                                                               : IR_PLAN_VERIFY_ALL,
                                  &m->plan, &d)
                   : IR_OOM;
  if (st == IR_OK) {
    m->g = ir_plan_graph(m->plan);
    st = irt_backend_cpu_create(o.n_threads, &m->be, &d);
  }
  if (st == IR_OK) st = m->be.ops->check(m->be.ctx, m->g, &d);
  if (st == IR_OK) st = setup_io(m, &d);
  if (st == IR_OK) st = bind_tensors(m, &d);
  if (st == IR_OK) st = setup_kv(m, &o, &d);
  if (st == IR_OK) st = irt_plan_tokenizer_load(m->plan, &m->tok, &d);
  if (st != IR_OK) {
    irt_error_from_diag(err, &d);
    irt_model_close(m);
    return (irt_status)st;
  }
  fill_info(m);
  *out = m;
  return IRT_OK;
}

void irt_model_close(irt_model *m) {
  if (!m) return;
  if (m->be.ops) {
    irt_kv_cache_release(&m->kv, m->be.ops->free, m->be.ctx);
    if (m->arena) m->be.ops->free(m->be.ctx, m->arena);
  }
  irt_backend_destroy(&m->be);
  free(m->ptrs);
  free(m->tok_seq);
  free(m->tok_pos);
  free(m->block_tables);
  irt_tok_destroy(m->tok);
  ir_plan_close(m->plan);
  free(m);
}

const irt_model_info *irt_model_get_info(const irt_model *m) { return &m->info; }

const irt_tokenizer *irt_model_get_tokenizer(const irt_model *m) { return m->tok; }

ir_status irt_plan_tokenizer_load(const ir_plan *p, irt_tokenizer **out, ir_diag *d) {
  size_t n = 0;
  const uint8_t *buf = ir_plan_tokenizer(p, &n);
  *out = NULL;
  if (!buf) return IR_OK;
  ir_status st = irt_tok_deserialize(buf, n, out, d);
  if (st != IR_OK) ir_diag_prefix(d, "plan tokenizer");
  return st;
}

irt_status irt_seq_create(irt_model *m, irt_seq **out, irt_error *err) {
  irt_seq *s = calloc(1, sizeof *s);
  int32_t *blocks = calloc((size_t)m->max_blocks, sizeof *blocks);
  if (!s || !blocks) {
    free(s), free(blocks);
    if (err) *err = (irt_error){.status = IRT_OOM, .msg = "out of memory"};
    return IRT_OOM;
  }
  s->m = m;
  s->blocks = blocks;
  *out = s;
  return IRT_OK;
}

void irt_seq_destroy(irt_seq *s) {
  if (!s) return;
  for (int64_t i = 0; i < s->n_blocks; i++) irt_kv_block_unref(&s->m->kv, s->blocks[i]);
  free(s->blocks);
  free(s);
}

int64_t irt_seq_length(const irt_seq *s) { return s->len; }
