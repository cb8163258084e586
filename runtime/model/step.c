/* step: one run of the program over a flat batch of tokens from several sequences.
 * Validates the batch, reserves KV blocks (all or none), fills the step descriptor and
 * the input tensors, runs every node, and hands back the requested logit rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_cpu.h"
#include "model.h"
#include "ir_alloc.h"

static irt_status fail(irt_error *err, irt_status st, const char *fmt, long long a, long long b) {
  if (err) {
    err->status = st;
    snprintf(err->msg, sizeof err->msg, fmt, a, b);
  }
  return st;
}

/* Rows of the step's logits an item takes: its logits, or the rows its picks read. */
static int64_t logit_rows_of(const irt_batch_item *it) {
  return it->logits || it->pick ? (it->all_logits ? it->n : 1) : 0;
}

/* Picks of an item: one per row, or n_picks of its one row. */
static int64_t picks_of(const irt_batch_item *it) {
  if (!it->pick) return 0;
  return it->all_logits ? it->n : it->n_picks > 1 ? it->n_picks : 1;
}

/* The step's logits row (counted from the item's first) that pick k of an item reads. */
static int64_t item_row(const irt_batch_item *it, int64_t k) { return it->all_logits ? k : 0; }

static irt_status check_batch(irt_model *m, const irt_batch_item *items, int n_items,
                              irt_error *err) {
  const irt_model_info *in = &m->info;
  int64_t T = 0, L = 0, P = 0;
  if (n_items <= 0 || n_items > in->max_step_seqs)
    return fail(err, IRT_INVALID_ARG, "a step takes 1 to %lld sequences, got %lld",
                in->max_step_seqs, n_items);
  for (int i = 0; i < n_items; i++) {
    const irt_batch_item *it = &items[i];
    if (!it->seq || it->seq->m != m || it->n <= 0 || !it->tokens)
      return fail(err, IRT_INVALID_ARG, "batch item %lld is empty or belongs to another model",
                  (long long)i, 0LL);
    for (int64_t k = 0; k < picks_of(it); k++) {
      const irt_pick *p = &it->pick[k];
      if (it->logits || !p->sampler || p->draw < 0)
        return fail(err, IRT_INVALID_ARG,
                    "batch item %lld: a pick needs a sampler, a draw >= 0 and no logits",
                    (long long)i, 0LL);
      for (int j = 0; j < p->n_pen; j++)
        if (p->pen_ids[j] < 0 || p->pen_ids[j] >= in->vocab_size)
          return fail(err, IRT_INVALID_ARG,
                      "batch item %lld: penalty on token %lld, outside the vocabulary",
                      (long long)i, p->pen_ids[j]);
    }
    for (int j = 0; j < i; j++)
      if (items[j].seq == it->seq)
        return fail(err, IRT_INVALID_ARG, "sequence appears twice in one step (items %lld, %lld)",
                    j, i);
    if (it->seq->len + it->n > in->context_length)
      return fail(err, IRT_INVALID_ARG, "sequence would reach %lld tokens; the context is %lld",
                  it->seq->len + it->n, in->context_length);
    for (int64_t k = 0; k < it->n; k++)
      if (it->tokens[k] < 0 || it->tokens[k] >= in->vocab_size)
        return fail(err, IRT_INVALID_ARG, "token id %lld is outside the vocabulary of %lld",
                    it->tokens[k], in->vocab_size);
    T += it->n;
    L += logit_rows_of(it);
    P += picks_of(it);
  }
  if (P > in->max_step_logits)
    return fail(err, IRT_INVALID_ARG, "step wants %lld picks; the plan allows %lld", P,
                in->max_step_logits);
  if (T > in->max_step_tokens)
    return fail(err, IRT_INVALID_ARG, "step of %lld tokens exceeds the plan's limit of %lld", T,
                in->max_step_tokens);
  if (L > in->max_step_logits)
    return fail(err, IRT_INVALID_ARG, "step wants %lld logit rows; the plan allows %lld", L,
                in->max_step_logits);
  return IRT_OK;
}

/* Gives every sequence the blocks its new tokens need, or rolls back and fails. */
static irt_status reserve_blocks(irt_model *m, const irt_batch_item *items, int n_items,
                                 irt_error *err) {
  int64_t bs = m->kv.block_size;
  int64_t need = 0;
  for (int i = 0; i < n_items; i++) {
    int64_t want = (items[i].seq->len + items[i].n + bs - 1) / bs;
    need += want - items[i].seq->n_blocks;
  }
  if (need > kv_available(&m->kv))
    return fail(err, IRT_OOM, "KV cache full: step needs %lld blocks, %lld are free", need,
                kv_available(&m->kv));
  for (int i = 0; i < n_items; i++) {
    irt_seq *s = items[i].seq;
    int64_t want = (s->len + items[i].n + bs - 1) / bs;
    while (s->n_blocks < want) s->blocks[s->n_blocks++] = kv_block_alloc(&m->kv);
  }
  return IRT_OK;
}

/* Fills the step descriptor and the tokens / positions / logit_rows inputs (in host
 * copies that the backend uploads, when its memory is a device's). */
static void fill_step(irt_model *m, const irt_batch_item *items, int n_items, model_step *st) {
  bool dev = m->be.ops->run_step != NULL;
  int32_t *tok = dev ? m->h_tokens : m->ptrs[m->in_tokens];
  int32_t *pos = dev ? m->tok_pos : m->ptrs[m->in_positions];
  int32_t *rows = dev ? m->h_rows : m->ptrs[m->in_logit_rows];
  int64_t t = 0, l = 0;
  for (int i = 0; i < n_items; i++) {
    const irt_batch_item *it = &items[i];
    int64_t r = logit_rows_of(it);
    memcpy(&m->block_tables[i * m->max_blocks], it->seq->blocks,
           (size_t)it->seq->n_blocks * sizeof(int32_t));
    for (int64_t k = 0; k < it->n; k++, t++) {
      tok[t] = it->tokens[k];
      pos[t] = (int32_t)(it->seq->len + k);
      m->tok_seq[t] = i;
      m->tok_pos[t] = pos[t];
      m->tok_gen[t] = pos[t] >= it->seq->prompt_len;
      if (k >= it->n - r) rows[l++] = (int32_t)t;
    }
  }
  *st = (model_step){.syms = {[IR_SYM_TOKENS] = t, [IR_SYM_SEQS] = n_items, [IR_SYM_LOGITS] = l},
                     .tok_seq = m->tok_seq,
                     .tok_pos = m->tok_pos,
                     .tok_gen = m->roles ? m->tok_gen : NULL,
                     .block_tables = m->block_tables,
                     .max_blocks = m->max_blocks,
                     .kv = &m->kv,
                     .tokens = tok,
                     .logit_rows = rows,
                     .pad_block = m->pad_block,
                     .comm = m->tp > 1 ? &m->bcomm : NULL};
}

_Static_assert(PICK_TOP == IRT_MAX_TOP_LOGPROBS, "a pick reports every alternative asked");

void pick_row(irt_model *m, irt_pick *p, const float *row) {
  double lse = kn_log_sum_exp(row, m->info.vocab_size);
  const float *seen = row;
  if (p->n_pen > 0) { /* the sampler's row, with the penalties */
    memcpy(m->h_pen, row, (size_t)m->info.vocab_size * sizeof *row);
    for (int j = 0; j < p->n_pen; j++) m->h_pen[p->pen_ids[j]] -= p->pen_sub[j];
    seen = m->h_pen;
  }
  p->token = sampler_sample_u(p->sampler, seen, pick_draw(p));
  p->logprob = (float)((double)row[p->token] - lse);
  if (p->n_top > 0)
    sampler_top_logprobs(row, m->info.vocab_size, lse, p->n_top, p->top_ids, p->top_logprobs);
}

static void copy_logits(irt_model *m, const irt_batch_item *items, int n_items) {
  const float *lg = m->ptrs[m->out_logits];
  size_t V = (size_t)m->info.vocab_size;
  for (int i = 0; i < n_items; i++) {
    int64_t r = logit_rows_of(&items[i]);
    for (int64_t k = 0; k < picks_of(&items[i]); k++)
      pick_row(m, &items[i].pick[k], lg + item_row(&items[i], k) * V);
    if (items[i].logits) memcpy(items[i].logits, lg, (size_t)r * V * sizeof(float));
    lg += (size_t)r * V;
  }
}

/* The step's penalty lists for the device, grown to hold `need` entries. */
static ir_status grow_pen(irt_model *m, int need, ir_diag *d) {
  int cap = m->pen_cap ? m->pen_cap : 1024;
  while (cap < need) cap *= 2;
  int32_t *ids = ir_realloc(m->h_pen_ids, (size_t)cap * sizeof *ids);
  if (ids) m->h_pen_ids = ids;
  float *sub = ir_realloc(m->h_pen_sub, (size_t)cap * sizeof *sub);
  if (sub) m->h_pen_sub = sub;
  if (!ids || !sub) return ir_diag_set(d, IR_OOM, "out of memory");
  m->pen_cap = cap;
  return IR_OK;
}

/* One pick's request for the device kernel: row `row`, penalties from n_pen on. */
static pick_req make_pick_req(irt_pick *p, int64_t row, int n_pen) {
  const irt_sampling *sp = sampler_params(p->sampler);
  int n_top = p->n_top < 0 ? 0 : p->n_top > PICK_TOP ? PICK_TOP : p->n_top;
  return (pick_req){.temperature = sp->temperature,
                    .top_p = sp->top_p,
                    .top_k = sp->top_k,
                    .min_p = sp->min_p,
                    .row = (int32_t)row,
                    .u = pick_draw(p),
                    .n_top = n_top,
                    .n_pen = p->n_pen > 0 ? p->n_pen : 0,
                    .pen_off = n_pen};
}

/* Device backends: the picks, on the device when it can (one launch, and only tokens and
 * logprobs come down), else each row read and picked here. *waited: the step is done. */
static ir_status pick_device(irt_model *m, const irt_batch_item *items, int n_items, bool *waited,
                             ir_diag *d) {
  const char *lg = m->ptrs[m->out_logits];
  size_t row = (size_t)m->info.vocab_size * sizeof(float);
  int n = 0, n_pen = 0;
  int64_t at = 0;
  ir_status st = IR_OK;
  for (int i = 0; i < n_items && st == IR_OK; at += logit_rows_of(&items[i]), i++)
    for (int64_t j = 0; j < picks_of(&items[i]) && st == IR_OK; j++) {
      irt_pick *p = &items[i].pick[j];
      if (!m->dev_pick) { /* a plan built before the device kernel */
        st = m->be.ops->read(m->be.ctx, m->h_row, lg + (size_t)(at + item_row(&items[i], j)) * row,
                             row, d);
        if (st == IR_OK) pick_row(m, p, m->h_row);
        *waited = true;
        continue;
      }
      int np = p->n_pen > 0 ? p->n_pen : 0;
      if (n_pen + np > m->pen_cap && (st = grow_pen(m, n_pen + np, d)) != IR_OK) break;
      if (np) {
        memcpy(m->h_pen_ids + n_pen, p->pen_ids, (size_t)np * sizeof *p->pen_ids);
        memcpy(m->h_pen_sub + n_pen, p->pen_sub, (size_t)np * sizeof *p->pen_sub);
      }
      m->h_pick[n++] = make_pick_req(p, at + item_row(&items[i], j), n_pen);
      n_pen += np;
    }
  if (st != IR_OK || n == 0) return st;
  st = m->be.ops->pick(m->be.ctx, lg, m->info.vocab_size, n, m->h_pick, m->h_pen_ids, m->h_pen_sub,
                       m->h_pick_res, m->h_pick_top, d);
  *waited = true;
  for (int i = 0, k = 0; i < n_items && st == IR_OK; i++)
    for (int64_t j = 0; j < picks_of(&items[i]); j++, k++) {
      irt_pick *p = &items[i].pick[j];
      p->token = m->h_pick_res[k].token;
      p->logprob = m->h_pick_res[k].logprob;
      for (int t = 0; t < m->h_pick[k].n_top; t++) {
        p->top_ids[t] = m->h_pick_top[k * PICK_TOP + t].token;
        p->top_logprobs[t] = m->h_pick_top[k * PICK_TOP + t].logprob;
      }
    }
  return st;
}

/* Device backends: only the wanted logit rows come down, one read per run of items whose
 * buffers follow each other (the engine's usually all do). The first read waits for the
 * step, so it also reports any error of its queued work (unless the picks `waited`). */
static ir_status read_logits(irt_model *m, const irt_batch_item *items, int n_items, bool waited,
                             ir_diag *d) {
  const char *lg = m->ptrs[m->out_logits];
  size_t row = (size_t)m->info.vocab_size * sizeof(float), at = 0, from = 0;
  float *dst = NULL;
  size_t run = 0; /* rows in the pending read, from row `from` */
  bool read = false;
  ir_status st = IR_OK;
  for (int i = 0; i <= n_items && st == IR_OK; i++) {
    int64_t r = i < n_items ? logit_rows_of(&items[i]) : 0;
    if (i < n_items && !r) continue;
    float *want = i < n_items ? items[i].logits : NULL;
    if (run && (!want || want != dst + run * (row / sizeof(float)))) {
      st = m->be.ops->read(m->be.ctx, dst, lg + from * row, run * row, d);
      read = true;
      run = 0;
    }
    if (want && !run) dst = want, from = at;
    if (want) run += (size_t)r;
    at += (size_t)r;
  }
  /* No logits wanted: still wait, so errors surface in this step. */
  if (st == IR_OK && !read && !waited) st = m->be.ops->read(m->be.ctx, NULL, lg, 0, d);
  return st;
}

irt_status irt_decode_batch(irt_model *m, const irt_batch_item *items, int n_items,
                            irt_error *err) {
  irt_status st = check_batch(m, items, n_items, err);
  if (st == IRT_OK) st = reserve_blocks(m, items, n_items, err);
  if (st != IRT_OK) return st;
  model_step step;
  fill_step(m, items, n_items, &step);
  ir_diag d = {0};
  if (m->be.ops->run_step) {
    bool waited = false;
    if (m->be.ops->run_step(m->be.ctx, m->g, m->ptrs, &step, &d) != IR_OK ||
        pick_device(m, items, n_items, &waited, &d) != IR_OK ||
        read_logits(m, items, n_items, waited, &d) != IR_OK) {
      rt_error_from_diag(err, &d);
      return rt_status_from_ir(d.status);
    }
  } else {
    if (m->tp > 1 && tp_send_step(m, &step, &d) != IR_OK) { /* the other ranks run it too */
      rt_error_from_diag(err, &d);
      return rt_status_from_ir(d.status);
    }
    for (int32_t i = 0; i < m->g->n_nodes; i++)
      if (m->be.ops->run_node(m->be.ctx, m->g, i, m->ptrs, &step, &d) != IR_OK) {
        if (m->tp > 1) tp_step_failed(m); /* the others wait in a collective for good */
        rt_error_from_diag(err, &d);
        return rt_status_from_ir(d.status);
      }
    copy_logits(m, items, n_items);
  }
  for (int i = 0; i < n_items; i++) items[i].seq->len += items[i].n;
  return IRT_OK;
}

irt_status irt_seq_decode(irt_model *m, irt_seq *s, const int32_t *tokens, int64_t n, float *logits,
                          bool all_logits, irt_error *err) {
  int64_t chunk = m->info.max_step_tokens;
  if (all_logits && logits && m->info.max_step_logits < chunk) chunk = m->info.max_step_logits;
  if (n <= 0)
    return fail(err, IRT_INVALID_ARG, "nothing to decode (%lld tokens)", (long long)n, 0LL);
  for (int64_t off = 0; off < n; off += chunk) {
    int64_t c = n - off < chunk ? n - off : chunk;
    bool last = off + c == n;
    irt_batch_item it = {.seq = s,
                         .tokens = tokens + off,
                         .n = c,
                         .all_logits = all_logits,
                         .logits = all_logits && logits
                                       ? logits + (size_t)off * (size_t)m->info.vocab_size
                                       : (last ? logits : NULL)};
    irt_status st = irt_decode_batch(m, &it, 1, err);
    if (st != IRT_OK) return st;
  }
  return IRT_OK;
}
