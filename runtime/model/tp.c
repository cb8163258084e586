/* tp: tensor parallelism at run time. A plan built with `infc build --tp N` holds N shards;
 * each of N processes opens its rank's with the application's collectives (irt_comm). Rank
 * 0 is the model the application drives: before each step it broadcasts the step (its
 * tokens, positions, block tables and logit rows, and the KV block copies the scheduler
 * made since the last step), then runs it; ranks 1.. receive it in irt_model_follow and run
 * the same step on their shards. The graph's all_reduce / all_gather nodes (the backend's)
 * meet in the middle; rank 0 alone picks tokens. The KV block ids are rank 0's: every
 * rank's cache has the same blocks, checked when the ranks join. */
#include <string.h>

#include "model.h"
#include "ir_alloc.h"

enum { TP_STOP = 0, TP_STEP = 1 };

/* A step message's header: what the payload holds. */
typedef struct tp_header {
  int64_t op, tokens, seqs, logits, copies;
} tp_header;

static int64_t payload_ints(const irt_model *m, const tp_header *h) {
  /* (with roles, each token's kind last: model_step.tok_gen) */
  return (m->roles ? 4 : 3) * h->tokens + h->logits + h->seqs * m->max_blocks + 2 * h->copies;
}

static ir_status grow_msg(irt_model *m, int64_t ints, ir_diag *d) {
  if (ints <= m->tp_msg_cap) return IR_OK;
  int32_t *p = ir_realloc(m->tp_msg, (size_t)ints * sizeof *p);
  if (!p) return ir_diag_set(d, IR_OOM, "out of memory");
  m->tp_msg = p, m->tp_msg_cap = ints;
  return IR_OK;
}

static ir_status bcast(irt_model *m, void *buf, size_t bytes, ir_diag *d) {
  if (m->comm.broadcast(m->comm.ctx, buf, bytes, 0))
    return ir_diag_set(d, IR_IO, "tensor parallelism: the broadcast from rank 0 failed (rank %d)",
                       m->comm.rank);
  return IR_OK;
}

/* Rank 0: a KV block copy the scheduler made, for the other ranks to repeat. */
static void record_copy(void *ctx, int32_t src, int32_t dst) {
  irt_model *m = ctx;
  if (m->n_tp_copies + 1 > m->tp_copies_cap) {
    int64_t cap = m->tp_copies_cap ? m->tp_copies_cap * 2 : 64;
    int32_t *p = ir_realloc(m->tp_copies, (size_t)(2 * cap) * sizeof *p);
    if (!p) {
      m->tp_copies_lost = true;
      return;
    }
    m->tp_copies = p, m->tp_copies_cap = cap;
  }
  m->tp_copies[2 * m->n_tp_copies] = src;
  m->tp_copies[2 * m->n_tp_copies + 1] = dst;
  m->n_tp_copies++;
}

ir_status tp_open(irt_model *m, const irt_model_opts *o, ir_diag *d) {
  int tp = m->g->config.tp_size > 1 ? m->g->config.tp_size : 1;
  int size = o->comm ? o->comm->size : 1;
  if (tp == 1 && size <= 1) return IR_OK;
  if (tp == 1)
    return ir_diag_set(d, IR_INVALID_ARG,
                       "the plan is built for one process and this job has %d ranks; build "
                       "it with infc build --tp %d",
                       size, size);
  if (!o->comm)
    return ir_diag_set(d, IR_INVALID_ARG,
                       "the plan is built for %d tensor-parallel ranks: run it as %d processes "
                       "(mpirun -n %d inferrt ...)",
                       tp, tp, tp);
  const irt_comm *c = o->comm;
  if (size != tp || c->rank < 0 || c->rank >= size)
    return ir_diag_set(d, IR_INVALID_ARG,
                       "the plan is built for %d tensor-parallel ranks and this job has %d "
                       "(this is rank %d)",
                       tp, size, c->rank);
  if (!c->all_reduce_sum_f32 || !c->all_gather || !c->broadcast)
    return ir_diag_set(d, IR_INVALID_ARG, "irt_comm: a collective is missing");
  if (m->be.ops->run_step)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "tensor parallelism runs on the CPU backend (--device cpu)");
  m->tp = tp;
  m->comm = *c;
  m->bcomm = (backend_comm){.rank = c->rank,
                            .size = c->size,
                            .ctx = c->ctx,
                            .all_reduce_sum_f32 = c->all_reduce_sum_f32,
                            .all_gather = c->all_gather};
  const ir_model_config *cfg = &m->g->config;
  tp_header most = {.tokens = cfg->max_tokens, .seqs = cfg->max_seqs, .logits = cfg->max_logits};
  ir_status st = grow_msg(m, payload_ints(m, &most), d);
  /* (and whether the plan has row kinds: the step message carries them then) */
  int64_t kv[3] = {m->kv.n_blocks, m->kv.block_size, m->roles}, root[3] = {kv[0], kv[1], kv[2]};
  if (st == IR_OK) st = bcast(m, root, sizeof root, d);
  if (st == IR_OK && root[2] != kv[2])
    return ir_diag_set(d, IR_INVALID_ARG,
                       "rank %d's plan %s prompt and generated rows on different kernels and "
                       "rank 0's %s: run every rank on the same plan",
                       c->rank, kv[2] ? "takes" : "does not take", root[2] ? "does" : "does not");
  if (st == IR_OK && (root[0] != kv[0] || root[1] != kv[1]))
    return ir_diag_set(d, IR_INVALID_ARG,
                       "rank %d's KV cache holds %lld blocks of %lld tokens and rank 0's %lld "
                       "of %lld: give every rank the same --kv-tokens and --kv-dtype",
                       c->rank, (long long)kv[0], (long long)kv[1], (long long)root[0],
                       (long long)root[1]);
  if (st != IR_OK) return st;
  if (c->rank == 0) m->kv.on_copy = record_copy, m->kv.on_copy_ctx = m;
  m->tp_live = true;
  return IR_OK;
}

void tp_step_failed(irt_model *m) {
  m->tp_broken = true;
  if (m->comm.abort) m->comm.abort(m->comm.ctx, 1);
}

ir_status tp_send_step(irt_model *m, const model_step *s, ir_diag *d) {
  if (m->tp_broken)
    return ir_diag_set(d, IR_IO,
                       "tensor parallelism: an earlier step failed midway and the ranks are "
                       "out of step; restart the job");
  if (m->tp_copies_lost)
    return ir_diag_set(d, IR_OOM, "tensor parallelism: a KV block copy was lost (out of memory)");
  tp_header h = {.op = TP_STEP,
                 .tokens = s->syms[IR_SYM_TOKENS],
                 .seqs = s->syms[IR_SYM_SEQS],
                 .logits = s->syms[IR_SYM_LOGITS],
                 .copies = m->n_tp_copies};
  int64_t ints = payload_ints(m, &h);
  ir_status st = grow_msg(m, ints, d);
  if (st != IR_OK) return st;
  int32_t *p = m->tp_msg;
  size_t t = (size_t)h.tokens * sizeof *p;
  memcpy(p, s->tokens, t), p += h.tokens;
  memcpy(p, s->tok_pos, t), p += h.tokens;
  memcpy(p, s->tok_seq, t), p += h.tokens;
  memcpy(p, s->logit_rows, (size_t)h.logits * sizeof *p), p += h.logits;
  memcpy(p, s->block_tables, (size_t)(h.seqs * m->max_blocks) * sizeof *p);
  p += h.seqs * m->max_blocks;
  if (h.copies) memcpy(p, m->tp_copies, (size_t)(2 * h.copies) * sizeof *p);
  p += 2 * h.copies;
  for (int64_t i = 0; m->roles && i < h.tokens; i++) p[i] = s->tok_gen[i];
  st = bcast(m, &h, sizeof h, d);
  if (st == IR_OK) st = bcast(m, m->tp_msg, (size_t)ints * sizeof *p, d);
  if (st == IR_OK) m->n_tp_copies = 0;
  return st;
}

void tp_close(irt_model *m) {
  if (m->tp_live && m->comm.rank == 0) {
    tp_header h = {.op = TP_STOP};
    ir_diag d = {0};
    bcast(m, &h, sizeof h, &d); /* nothing more to do if the others are gone */
  }
  m->tp_live = false;
  ir_free(m->tp_msg);
  ir_free(m->tp_copies);
  m->tp_msg = NULL, m->tp_copies = NULL;
}

/* A follower's step message: sizes within the plan's limits, block ids within the cache. */
static ir_status check_step(const irt_model *m, const tp_header *h, ir_diag *d) {
  const ir_model_config *c = &m->g->config;
  if (h->tokens < 1 || h->tokens > c->max_tokens || h->seqs < 1 || h->seqs > c->max_seqs ||
      h->logits < 0 || h->logits > c->max_logits || h->copies < 0 || h->copies > m->kv.n_blocks * 4)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor parallelism: rank 0 sent a step outside the plan's limits");
  return IR_OK;
}

static ir_status follow_step(irt_model *m, const tp_header *h, ir_diag *d) {
  const int32_t *p = m->tp_msg;
  int64_t T = h->tokens, nb = m->kv.n_blocks;
  memcpy(m->ptrs[m->in_tokens], p, (size_t)T * sizeof *p), p += T;
  memcpy(m->ptrs[m->in_positions], p, (size_t)T * sizeof *p);
  memcpy(m->tok_pos, p, (size_t)T * sizeof *p), p += T;
  memcpy(m->tok_seq, p, (size_t)T * sizeof *p), p += T;
  memcpy(m->ptrs[m->in_logit_rows], p, (size_t)h->logits * sizeof *p), p += h->logits;
  memcpy(m->block_tables, p, (size_t)(h->seqs * m->max_blocks) * sizeof *p);
  p += h->seqs * m->max_blocks;
  for (int64_t i = 0; i < h->seqs * m->max_blocks; i++)
    if (m->block_tables[i] < -1 || m->block_tables[i] >= nb) m->block_tables[i] = -1;
  int64_t bs = m->kv.block_size;
  for (int64_t i = 0; i < T; i++) { /* every token's slot, and the blocks it reads, exist */
    bool ok = m->tok_seq[i] >= 0 && m->tok_seq[i] < h->seqs && m->tok_pos[i] >= 0 &&
              m->tok_pos[i] < m->info.context_length;
    for (int64_t b = 0; ok && b <= m->tok_pos[i] / bs; b++)
      ok = m->block_tables[(int64_t)m->tok_seq[i] * m->max_blocks + b] >= 0;
    if (!ok)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor parallelism: rank 0 sent a bad token slot");
  }
  const int32_t *rows = m->ptrs[m->in_logit_rows];
  for (int64_t i = 0; i < h->logits; i++)
    if (rows[i] < 0 || rows[i] >= T)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor parallelism: rank 0 sent a bad logit row");
  for (int64_t i = 0; i < h->copies; i++, p += 2) {
    if (p[0] < 0 || p[0] >= nb || p[1] < 0 || p[1] >= nb)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor parallelism: rank 0 sent a bad block copy");
    kv_block_copy(&m->kv, p[0], p[1]);
  }
  for (int64_t i = 0; m->roles && i < T; i++) m->tok_gen[i] = p[i] != 0;
  model_step st = {
      .syms = {[IR_SYM_TOKENS] = T, [IR_SYM_SEQS] = h->seqs, [IR_SYM_LOGITS] = h->logits},
      .tok_seq = m->tok_seq,
      .tok_pos = m->tok_pos,
      .tok_gen = m->roles ? m->tok_gen : NULL,
      .block_tables = m->block_tables,
      .max_blocks = m->max_blocks,
      .kv = &m->kv,
      .tokens = m->ptrs[m->in_tokens],
      .logit_rows = m->ptrs[m->in_logit_rows],
      .pad_block = m->pad_block,
      .comm = &m->bcomm};
  for (int32_t i = 0; i < m->g->n_nodes; i++) {
    ir_status s = m->be.ops->run_node(m->be.ctx, m->g, i, m->ptrs, &st, d);
    if (s != IR_OK) return s;
  }
  return IR_OK;
}

irt_status irt_model_follow(irt_model *m, irt_error *err) {
  ir_diag d = {0};
  ir_status st = IR_OK;
  if (!m || m->tp <= 1 || m->comm.rank == 0)
    st = ir_diag_set(&d, IR_INVALID_ARG,
                     "irt_model_follow runs on ranks 1.. of a tensor-parallel plan");
  while (st == IR_OK) {
    tp_header h;
    st = bcast(m, &h, sizeof h, &d);
    if (st != IR_OK || h.op == TP_STOP) break;
    if (h.op != TP_STEP) st = ir_diag_set(&d, IR_BAD_FORMAT, "tensor parallelism: unknown message");
    if (st == IR_OK) st = check_step(m, &h, &d);
    int64_t ints = st == IR_OK ? payload_ints(m, &h) : 0;
    if (st == IR_OK) st = grow_msg(m, ints, &d);
    if (st == IR_OK) st = bcast(m, m->tp_msg, (size_t)ints * sizeof(int32_t), &d);
    if (st == IR_OK) st = follow_step(m, &h, &d);
  }
  if (m) m->tp_live = false;
  if (st != IR_OK) rt_error_from_diag(err, &d);
  return rt_status_from_ir(st);
}
