/* sched: one iteration of the continuous-batching engine.
 *   1. take new requests and cancellations;
 *   2. choose the step: running sequences first (decodes and unfinished prompt chunks) in
 *      priority order, then waiting ones (prefix-cache lookup on first admission), within
 *      the token budget and the step's sequence limit; give each the KV blocks it will
 *      write (copy-on-write for a shared partial block), preempting the lowest-priority,
 *      most recently admitted sequence when blocks run out; with speculative decoding,
 *      append prompt-lookup drafts to decoding sequences from what is left over;
 *   3. run the model once over the flat batch;
 *   4. register newly full blocks in the prefix cache, sample where logits came back
 *      (forking the n completions after the prompt; keeping the drafts the sampler picks
 *      itself), emit events, finish sequences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kn_cpu.h"
#include "ir_alloc.h"

static int64_t bsz(const irt_engine *e) { return e->m->kv.block_size; }

/* Scheduling order: higher priority first, then earlier admission (running) or arrival. */
static int cmp_seq(const void *pa, const void *pb) {
  const eseq *a = *(eseq *const *)pa, *b = *(eseq *const *)pb;
  if (a->req->r.priority != b->req->r.priority)
    return a->req->r.priority > b->req->r.priority ? -1 : 1;
  uint64_t ka = a->state == ESEQ_RUNNING ? a->admit_order : a->req->arrival;
  uint64_t kb = b->state == ESEQ_RUNNING ? b->admit_order : b->req->arrival;
  if (ka != kb) return ka < kb ? -1 : 1;
  return a->index - b->index;
}

/* Every live sequence in `state`, sorted. */
static int collect(irt_engine *e, eseq_state state, eseq **out, int cap) {
  int n = 0;
  for (ereq *q = e->reqs; q; q = q->next)
    for (int i = 0; i < q->n_live && n < cap; i++)
      if (q->seqs[i].state == state && q->seqs[i].finish == IRT_FINISH_NONE) out[n++] = &q->seqs[i];
  qsort(out, (size_t)n, sizeof *out, cmp_seq);
  return n;
}

static void drop_blocks(eseq *s) {
  irt_seq_truncate(s->kv, 0);
  if (s->dkv) irt_seq_truncate(s->dkv, 0); /* the draft's KV goes with the target's */
  s->d_registered = 0;
  s->d_last_hash = 0;
  s->n_registered = 0;
  s->last_hash = 0;
}

/* Sends a running sequence back to the queue; it will recompute everything it knows. */
static void preempt(irt_engine *e, eseq *s) {
  drop_blocks(s);
  s->state = ESEQ_WAITING;
  e->work.preemptions++;
}

/* Blocks for positions [len, len + take): a private copy of a shared partial block, then
 * fresh ones. False (nothing changed) if the pool cannot supply them. */
static bool ensure_blocks(irt_engine *e, eseq *s, int64_t take, int64_t reserve) {
  kv_cache *kv = &e->m->kv;
  irt_seq *k = s->kv;
  int64_t bs = bsz(e), first = k->len / bs;
  bool cow = k->len % bs && first < k->n_blocks && kv->meta[k->blocks[first]].ref > 1;
  int64_t need = (k->len + take + bs - 1) / bs - k->n_blocks + (cow ? 1 : 0);
  if (need > kv_available(kv) - reserve) return false;
  if (cow) {
    int32_t b = kv_block_alloc(kv);
    kv_block_copy(kv, k->blocks[first], b);
    kv_block_unref(kv, k->blocks[first]);
    k->blocks[first] = b;
  }
  while (k->n_blocks < (k->len + take + bs - 1) / bs) k->blocks[k->n_blocks++] = kv_block_alloc(kv);
  return true;
}

/* The lowest-priority, latest-admitted running sequence other than `keep` (and not
 * already in this step), or NULL. With `below` set, only strictly lower priorities. */
static eseq *pick_victim(irt_engine *e, eseq **run, int n_run, const eseq *keep, bool below) {
  for (int i = n_run - 1; i >= 0; i--) {
    eseq *v = run[i];
    if (v == keep || v->state != ESEQ_RUNNING) continue;
    bool in_step = false;
    for (int k = 0; k < e->n_items_now && !in_step; k++) in_step = e->item_seq[k] == v;
    if (in_step) continue;
    if (below && v->req->r.priority >= keep->req->r.priority) return NULL;
    return v;
  }
  return NULL;
}

/* First admission: reuse every cached full block of the known tokens (same tenant),
 * keeping at least one token to compute so that logits come back. */
/* Does s still have prompt positions to score (prompt_logprobs)? Its prompt chunks then
 * bring every row to the host. */
static bool scoring(const eseq *s) {
  return s->req->r.prompt_logprobs && s->index == 0 && s->plp_next < s->req->n_prompt;
}

/* The prefix cache of one model's KV (the target's, or a draft's: the same keys) for s,
 * whose sequence there is k, its registered-block count and chain hash *reg, *hash.
 * cache_lookup: k (empty) takes every cached full block of s's known tokens but the last
 * token's; cache_register: k's full blocks of known tokens past *reg are registered. */
static void cache_lookup(kv_cache *kv, const eseq *s, irt_seq *k, int64_t *reg, uint64_t *hash) {
  int64_t bs = kv->block_size, limit = (s->n_tokens - 1) / bs;
  uint64_t parent = 0;
  for (int64_t j = 0; j < limit; j++) {
    const int32_t *t = s->tokens + j * bs;
    uint64_t tenant = kv_role_tenant(kv, s->req->tenant_hash, j, s->req->n_prompt);
    int32_t b = kv_prefix_lookup(kv, parent, t, tenant);
    if (b < 0) break;
    k->blocks[k->n_blocks++] = b;
    k->len += bs;
    parent = kv_chain_hash(parent, t, bs, tenant);
  }
  *reg = k->n_blocks;
  *hash = parent;
}

static void cache_register(kv_cache *kv, const eseq *s, const irt_seq *k, int64_t *reg,
                           uint64_t *hash) {
  int64_t bs = kv->block_size;
  while ((*reg + 1) * bs <= k->len) {
    const int32_t *t = s->tokens + *reg * bs;
    uint64_t tenant = kv_role_tenant(kv, s->req->tenant_hash, *reg, s->req->n_prompt);
    kv_block_register(kv, k->blocks[*reg], *hash, t, tenant);
    *hash = kv_chain_hash(*hash, t, bs, tenant);
    (*reg)++;
  }
}

static void prefix_lookup(irt_engine *e, eseq *s) {
  if (e->o.disable_prefix_cache || s->kv->n_blocks || scoring(s)) return;
  cache_lookup(&e->m->kv, s, s->kv, &s->n_registered, &s->last_hash);
}

/* Is this the first token of a request with n > 1, which every completion picks from
 * the prompt's last row? (Any other next token is one pick, irt_pick: on a GPU the logits
 * then stay there.) */
static bool fork_point(const eseq *s) {
  const ereq *q = s->req;
  return q->n > 1 && !q->forked && s->n_generated == 0;
}

/* The bias subtracted from token tok's logit (logit_bias), 0 if none. */
static float bias_sub(const ereq *q, int32_t tok) {
  int lo = 0, hi = q->n_bias;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (q->bias_ids[mid] < tok) lo = mid + 1;
    else hi = mid;
  }
  return lo < q->n_bias && q->bias_ids[lo] == tok ? q->bias_sub[lo] : 0.0f;
}

/* The pick of s's next token: its sampler, top_logprobs, and what is subtracted from the
 * logits: the presence/frequency penalties of the tokens it generated so far and minus
 * the request's logit_bias (a list that never changes without penalties). */
static irt_pick make_pick(eseq *s) {
  const ereq *q = s->req;
  const irt_request *r = &q->r;
  irt_pick p = {.sampler = s->sampler,
                .n_top = r->top_logprobs,
                .top_ids = s->top_ids,
                .top_logprobs = s->top_lps};
  if (!s->counts) {
    p.pen_ids = q->bias_ids, p.pen_sub = q->bias_sub, p.n_pen = q->n_bias;
    return p;
  }
  int64_t n = s->n_seen;
  for (int64_t j = 0; j < n; j++)
    s->pen_sub[j] = r->presence_penalty + r->frequency_penalty * (float)s->counts[s->seen[j]] +
                    (q->n_bias ? bias_sub(q, s->seen[j]) : 0.0f);
  p.pen_ids = s->seen;
  if (q->n_bias) { /* the seen ids, then the biased ones not seen (ids stay distinct) */
    memcpy(s->pen_ids, s->seen, (size_t)n * sizeof *s->pen_ids);
    for (int b = 0; b < q->n_bias; b++)
      if (!s->counts[q->bias_ids[b]])
        s->pen_ids[n] = q->bias_ids[b], s->pen_sub[n++] = q->bias_sub[b];
    p.pen_ids = s->pen_ids;
  }
  p.pen_sub = s->pen_sub, p.n_pen = (int)n;
  return p;
}

/* The first token of a request with n > 1: one pick per completion from the prompt's
 * last row, each with the completion's own sampler, so the completions are created now
 * (FORKING: their blocks come once the step has run, fork_completions). NULL when the
 * step has no room for n picks or a completion cannot be created: then the row comes to
 * the host and is sampled there for each. */
static irt_pick *fork_picks(irt_engine *e, eseq *s) {
  ereq *q = s->req;
  if (e->rows_now + q->n > e->max_rows || e->row_picks_now + q->n > e->max_rows) return NULL;
  for (int i = q->n_live; i < q->n; i++) {
    irt_error err;
    if (eseq_init(e, q, i, &err) != IRT_OK) return NULL; /* fork_completions retries */
    q->seqs[i].state = ESEQ_FORKING;
  }
  irt_pick *p = e->row_picks + e->row_picks_now;
  for (int i = 0; i < q->n; i++) p[i] = make_pick(&q->seqs[i]);
  e->row_picks_now += q->n;
  return p;
}

/* Appends s's next `take` tokens to the step. Its logits row (if it needs one) gets its
 * place in e->logits once the step is complete (place_rows). */
static void add_item(irt_engine *e, eseq *s, int64_t take) {
  int k = e->n_items_now++;
  /* with a grammar the row comes to the host, where the mask is, and so does one that
   * repetition_penalty or min_tokens adjust; a scored prompt chunk brings all its rows */
  bool plp = scoring(s), last = s->kv->len + take == s->n_tokens;
  bool host = s->req->grammar != NULL || s->req->host_pick || plp;
  bool pick = last && !fork_point(s) && !host;
  irt_pick *forks = last && fork_point(s) && !host ? fork_picks(e, s) : NULL;
  if (pick) e->picks[k] = make_pick(s);
  e->items[k] = (irt_batch_item){.seq = s->kv,
                                 .tokens = s->tokens + s->kv->len,
                                 .n = take,
                                 .logits = (last || plp) && !pick && !forks ? e->logits : NULL,
                                 .all_logits = plp,
                                 .pick = pick ? &e->picks[k] : forks,
                                 .n_picks = forks ? s->req->n : 0};
  e->item_seq[k] = s;
  e->item_plp[k] = plp;
  e->rows_now += plp ? take : !last ? 0 : forks ? s->req->n : 1; /* a pick holds a row's place */
}

/* The tokens s may take now as far as the step's logit rows go: a scored prompt chunk
 * takes a row per token, leaving one for each of the `others` still to come if it can
 * (at least one row for itself); the last chunk of any other needs one row. 0: none. */
static int64_t row_cap(const irt_engine *e, const eseq *s, int64_t need, int64_t budget,
                       int64_t others) {
  int64_t left = e->max_rows - e->rows_now;
  if (!scoring(s)) return need <= budget && left < 1 ? 0 : need;
  int64_t rows = left - others < 1 ? (left < 1 ? 0 : 1) : left - others;
  return need < rows ? need : rows;
}

/* Gives s blocks for `take` tokens (halving take until it fits), preempting victims as
 * allowed. Returns the tokens granted, 0 if none. */
static int64_t grant(irt_engine *e, eseq *s, int64_t take, int64_t reserve, bool below, int n_run) {
  for (;;) {
    if (ensure_blocks(e, s, take, reserve)) return take;
    eseq *v = pick_victim(e, e->run, n_run, s, below);
    if (v) {
      preempt(e, v);
      continue;
    }
    if (take == 1) return 0;
    take = (take + 1) / 2;
  }
}

static bool grow_cand(irt_engine *e) {
  int need = 0;
  for (ereq *q = e->reqs; q; q = q->next) need += q->n_live;
  if (need <= e->cap_cand) return true;
  eseq **r = ir_realloc(e->run, (size_t)need * sizeof *r);
  if (r) e->run = r;
  eseq **w = ir_realloc(e->wait, (size_t)need * sizeof *w);
  if (w) e->wait = w;
  if (!r || !w) return false;
  e->cap_cand = need;
  return true;
}

static void schedule_running(irt_engine *e, int n_run, int64_t *budget) {
  bool prefilling = false;
  if (e->o.static_batching)
    for (int i = 0; i < n_run; i++) prefilling |= e->run[i]->kv->len < e->run[i]->req->n_prompt;
  for (int i = 0; *budget > 0 && i < n_run && e->n_items_now < e->max_running; i++) {
    eseq *s = e->run[i];
    if (s->state != ESEQ_RUNNING) continue; /* preempted in this iteration */
    int64_t need = row_cap(e, s, s->n_tokens - s->kv->len, *budget, n_run - i - 1);
    if (prefilling && s->kv->len >= s->req->n_prompt) continue; /* static: prefill first */
    if (need == 0) continue; /* no logit row left for it in this step */
    int64_t take = grant(e, s, need < *budget ? need : *budget, 0, false, n_run);
    if (take == 0) {
      preempt(e, s); /* wait for others to free blocks */
      continue;
    }
    add_item(e, s, take);
    *budget -= take;
  }
}

static void schedule_waiting(irt_engine *e, int n_run, int n_wait, int64_t *budget) {
  int64_t watermark = e->m->kv.n_blocks / 100;
  for (int i = 0; *budget > 0 && i < n_wait && e->n_items_now < e->max_running; i++) {
    eseq *s = e->wait[i];
    prefix_lookup(e, s);
    int64_t need = row_cap(e, s, s->n_tokens - s->kv->len, *budget, n_wait - i - 1);
    int64_t take = need == 0 ? 0
                             : grant(e, s, need < *budget ? need : *budget,
                                     e->n_items_now ? watermark : 0, true, n_run);
    if (take == 0) {
      drop_blocks(s); /* let go of prefix hits: waiting sequences hold nothing */
      break;          /* keep arrival order: nobody overtakes the head of the queue */
    }
    s->state = ESEQ_RUNNING;
    s->admit_order = e->next_admit++;
    if (!s->req->counted) { /* a request's prompt counts once, at its first admission */
      s->req->counted = true;
      s->req->cached_tokens = s->kv->len;
      e->work.prompt_tokens += s->req->n_prompt;
      e->work.cached_prompt_tokens += s->kv->len;
    }
    add_item(e, s, take);
    *budget -= take;
  }
}

/* --- speculative decoding by prompt lookup ----------------------------------------------- */

/* The picks of a drafted item of n rows: row j takes draw j of s's generator without
 * moving it (irt_pick.draw), so each row is picked as plain decoding would pick it if the
 * drafts before it are kept; verify() moves the generator past the rows it used. */
static irt_pick *row_picks(irt_engine *e, eseq *s, int64_t n) {
  irt_pick *p = e->row_picks + e->row_picks_now;
  irt_pick base = make_pick(s); /* no penalties here: only the fixed logit_bias, if any */
  for (int64_t j = 0; j < n; j++) {
    int64_t r = e->row_picks_now + j;
    p[j] = base;
    p[j].draw = (int)j + 1;
    p[j].top_ids = e->row_top_ids + r * IRT_MAX_TOP_LOGPROBS;
    p[j].top_logprobs = e->row_top_lps + r * IRT_MAX_TOP_LOGPROBS;
  }
  e->row_picks_now += n;
  return p;
}

/* Whether item k can take drafts (a decoding sequence's last token, no fork, no scored
 * prompt), and how many at most: its next draft length within the step's token budget and
 * logit rows, the request's max_tokens and the context (context: the smaller one where a
 * draft model's counts too). */
static bool spec_item(const irt_engine *e, int k) {
  const eseq *s = e->item_seq[k];
  return e->items[k].n == 1 && s->kv->len + 1 == s->n_tokens && !fork_point(s) && !e->item_plp[k];
}

static int64_t spec_cap(const irt_engine *e, const eseq *s, int64_t budget, int64_t context) {
  int64_t cap = s->spec_len;
  int64_t lim[4] = {budget, e->max_rows - e->rows_now, s->req->r.max_tokens - s->n_generated - 1,
                    context - s->n_tokens};
  for (int j = 0; j < 4; j++) cap = lim[j] < cap ? lim[j] : cap;
  return cap;
}

/* The chance that a draft of s is kept, given the ones before it were: its own record,
 * started at (and decaying back to) an optimistic prior so that every sequence tries. */
#define SPEC_PRIOR 0.9
#define SPEC_EXPLORE 32 /* a weighed-out sequence still drafts one token every this many steps */
static double spec_alpha(const eseq *s) {
  return (s->spec_hits + SPEC_PRIOR) / (s->spec_tries + 1.0);
}

/* After the step is chosen: a decoding sequence whose context proposes drafts gets them
 * appended to its item, within the token budget, the plan's logit rows and the blocks
 * free now (drafts never preempt anyone nor displace a waiting request). Its rows are
 * picked in the step (on a GPU they stay there), or with penalties or a grammar -- which
 * change from row to row with the drafts taken -- come back as logits; verify() takes them
 * in order, each row picked after the tokens before it (so under the grammar's state).
 * Unless spec_always, only the drafts that pay for their rows by the timed cost model
 * (spec_worth), one a step until it has a fit. */
static void add_drafts(irt_engine *e, int64_t budget) {
  const irt_model_info *in = irt_model_get_info(e->m);
  bool weigh = !e->o.spec_always && e->cost_ok;
  double tokens = (double)(e->budget - budget), value = tokens; /* of the step so far */
  for (int k = 0; k < e->n_items_now && budget > 0 && e->rows_now < e->max_rows; k++) {
    eseq *s = e->item_seq[k];
    irt_batch_item *it = &e->items[k];
    if (!spec_item(e, k)) continue;
    int64_t cap = spec_cap(e, s, budget, in->context_length);
    if (!e->o.spec_always && !e->cost_ok && cap > 1) cap = 1; /* one at a time until timed */
    if (weigh && cap > 0) {
      double t = tokens, v = value, x = 0.0;
      int w = spec_worth(spec_alpha(s), e->cost_a, e->cost_b, 0.0, &t, &x, &v, (int)cap);
      /* weighed out: back toward the prior, and one draft now and then, which keeps the
       * fit and the sequence's record from going stale (a noisy fit cannot lock it out) */
      if (w == 0) s->spec_hits *= 0.95f, s->spec_tries *= 0.95f;
      s->spec_idle = w ? 0 : s->spec_idle + 1;
      cap = w ? w : s->spec_idle >= SPEC_EXPLORE ? 1 : 0;
      if (s->spec_idle >= SPEC_EXPLORE) s->spec_idle = 0;
    }
    int d = cap > 0 ? irt_prompt_lookup(s->tokens, s->n_tokens, e->o.spec_ngram_min,
                                        e->o.spec_ngram_max, (int)cap)
                    : 0;
    if (d == 0 || !ensure_blocks(e, s, 1 + d, 0)) continue;
    if (weigh) { /* the step as it now is: d more tokens, draft j kept with p^j */
      double a = spec_alpha(s), pj = a;
      for (int j = 0; j < d; j++, pj *= a) tokens += 1, value += pj;
    }
    /* penalties, a grammar, repetition_penalty or min_tokens: picked on the host */
    bool host = s->counts || s->gram || s->req->host_pick;
    *it = (irt_batch_item){.seq = s->kv,
                           .tokens = it->tokens,
                           .n = 1 + d,
                           .all_logits = true,
                           .logits = host ? e->logits : NULL,
                           .pick = host ? NULL : row_picks(e, s, 1 + d)};
    budget -= d;
    e->rows_now += d;
  }
}

/* --- speculative decoding with a draft model ---------------------------------------------- */

/* The row the sampler of s sees for lg: less its logit_bias and presence/frequency
 * penalties (as make_pick lists them, subtracted as pick_row does), counting the tokens
 * so far and extra[0, n_extra) after them (drafts not yet taken). */
static void penalized_row(irt_engine *e, eseq *s, const float *lg, const int32_t *extra,
                          int n_extra, float *out) {
  size_t V = (size_t)irt_model_get_info(e->m)->vocab_size;
  memcpy(out, lg, V * sizeof *out);
  int64_t seen0 = s->n_seen;
  for (int j = 0; s->counts && j < n_extra; j++)
    if (s->counts[extra[j]]++ == 0) s->seen[s->n_seen++] = extra[j];
  irt_pick p = make_pick(s);
  for (int j = 0; j < p.n_pen; j++) out[p.pen_ids[j]] -= p.pen_sub[j];
  for (int j = 0; s->counts && j < n_extra; j++) s->counts[extra[j]]--;
  s->n_seen = seen0;
}

/* The draft's KV in its own prefix cache, keyed as the target's (chain hashes of the same
 * tokens, per tenant): before its first catching up a sequence takes the cached full
 * blocks of its known tokens but the last; its full blocks of known tokens (caught up, or
 * kept after a check) are registered. */
static void draft_prefix_lookup(irt_engine *e, eseq *s) {
  if (e->o.disable_prefix_cache || s->dkv->n_blocks) return;
  cache_lookup(&e->o.draft->kv, s, s->dkv, &s->d_registered, &s->d_last_hash);
}

static void draft_register(irt_engine *e, eseq *s) {
  if (!e->o.disable_prefix_cache)
    cache_register(&e->o.draft->kv, s, s->dkv, &s->d_registered, &s->d_last_hash);
}

/* The blocks of s past the one its next token needs, back to the pool (taken for drafts
 * that did not come). */
static void give_back(irt_engine *e, eseq *s) {
  irt_seq *k = s->kv;
  int64_t bs = bsz(e), keep = (k->len + 1 + bs - 1) / bs;
  for (int64_t i = keep; i < k->n_blocks; i++) kv_block_unref(&e->m->kv, k->blocks[i]);
  if (k->n_blocks > keep) k->n_blocks = keep;
}

/* Whether slot i waits this pass for a sibling (a completion of the same request, n > 1 or
 * best_of) with an empty draft KV that comes before it: the first one's blocks, once
 * registered, serve the rest from the draft's prefix cache. */
static bool sibling_first(const irt_engine *e, int i) {
  const eseq *s = e->dseq[i];
  if (s->dkv->len > 0) return false;
  for (int k = 0; k < i; k++)
    if (e->dseq[k]->req == s->req && e->dpend[k] > 0 && e->dcap[k] > 0 && e->dseq[k]->dkv->len == 0)
      return true;
  return false;
}

/* Runs the draft model for the slots 0..n of this step. Catching up: each slot's draft KV
 * takes what the draft's prefix cache has of its known tokens, then the rest of them goes
 * through the draft in passes within its step limits, the last one keeping its logits; at
 * most one draft step's worth of tokens (max_step_tokens) an iteration, so a long prompt
 * cannot stall the batch: a slot not caught up by then keeps its progress and drafts
 * nothing this step, as do the slots of a pass that fails. Then up to dcap[i] rounds of one
 * token each, all slots batched: round j draws draft j from q_j (the draft's row under the
 * request's settings, into e->dq) and writes it after the sequence's tokens; a row that is
 * not a distribution (NaN or infinite logits) ends the slot's drafting. e->dn[i]: the
 * drafts slot i got (a failed round ends its slots' drafting: they keep what they have). */
static void run_draft(irt_engine *e, int n) {
  irt_model *dm = e->o.draft;
  const irt_model_info *din = irt_model_get_info(dm);
  size_t V = (size_t)din->vocab_size, K = (size_t)e->o.spec_tokens;
  irt_error err;
  for (int i = 0; i < n; i++) e->dn[i] = 0, e->dpend[i] = 1; /* set at the first pass */
  int64_t allowed = din->max_step_tokens;                    /* catching up, this iteration */
  for (bool first = true;; first = false) {
    int m = 0;
    int64_t left = din->max_step_tokens < allowed ? din->max_step_tokens : allowed;
    for (int i = 0; i < n && m < din->max_step_seqs && m < din->max_step_logits && left > 0; i++) {
      eseq *s = e->dseq[i];
      if (e->dpend[i] <= 0 || e->dcap[i] == 0) continue;
      if (first || s->dkv->len == 0) { /* what the cache has (siblings: after the first) */
        if (sibling_first(e, i)) continue;
        draft_prefix_lookup(e, s);
      }
      e->dpend[i] = s->n_tokens - s->dkv->len; /* >= 1: the last token */
      int64_t take = e->dpend[i] < left ? e->dpend[i] : left;
      e->ditems[m] = (irt_batch_item){.seq = s->dkv,
                                      .tokens = s->tokens + s->dkv->len,
                                      .n = take,
                                      .logits = take == e->dpend[i] ? e->dlog + i * V : NULL};
      e->dmap[m++] = i;
      left -= take;
    }
    if (m == 0) break;
    if (irt_decode_batch(dm, e->ditems, m, &err) != IRT_OK) {
      for (int j = 0; j < m; j++) e->dcap[e->dmap[j]] = 0; /* these draft nothing this step */
      continue;
    }
    for (int j = 0; j < m; j++) {
      e->dpend[e->dmap[j]] -= e->ditems[j].n;
      allowed -= e->ditems[j].n;
      draft_register(e, e->dseq[e->dmap[j]]); /* known tokens only, so far */
    }
  }
  int most = 0;
  for (int i = 0; i < n; i++) {
    if (e->dpend[i] > 0) e->dcap[i] = 0; /* not caught up this iteration */
    most = e->dcap[i] > most ? e->dcap[i] : most;
  }
  for (int j = 0; j < most; j++) {
    int m = 0;
    for (int i = 0; i < n; i++) {
      eseq *s = e->dseq[i];
      if (e->dn[i] != j || j >= e->dcap[i]) continue;
      float *q = e->dq + ((size_t)i * K + (size_t)j) * V;
      penalized_row(e, s, e->dlog + i * V, s->tokens + s->n_tokens, j, e->adj);
      sampler_probs(s->dsampler, e->adj, q);
      const bool greedy = sampler_params(s->dsampler)->temperature <= 0.0f;
      int32_t x = sampler_sample_u(s->dsampler, e->adj, greedy ? 0.0 : sampler_draw(s->dsampler));
      if (!(q[x] > 0.0f && q[x] <= 1.0f)) { /* NaN or inf: no distribution to draw from */
        e->dcap[i] = j;
        continue;
      }
      s->tokens[s->n_tokens + j] = x;
      e->dn[i] = j + 1;
      if (j + 1 < e->dcap[i]) { /* the draft's row after it, for the next round */
        e->ditems[m] = (irt_batch_item){.seq = s->dkv,
                                        .tokens = s->tokens + s->n_tokens + j,
                                        .n = 1,
                                        .logits = e->dlog + i * V};
        e->dmap[m++] = i;
      }
    }
    if (m == 0) break;
    if (irt_decode_batch(dm, e->ditems, m, &err) != IRT_OK)
      for (int k = 0; k < m; k++) e->dcap[e->dmap[k]] = e->dn[e->dmap[k]]; /* keep what it has */
  }
}

/* After the step is chosen, as add_drafts: each decoding sequence gets up to spec_tokens
 * drafts from the draft model (within the token budget, the logit rows, the target's free
 * blocks, the draft's context; by the cost model unless spec_always, each draft costing
 * its row plus the draft's measured time per drafted token). Its rows come back as logits:
 * verify_drafted checks them. */
static void add_model_drafts(irt_engine *e, int64_t budget) {
  const irt_model_info *in = irt_model_get_info(e->m);
  const irt_model_info *din = irt_model_get_info(e->o.draft);
  bool weigh = !e->o.spec_always && e->cost_ok;
  double tokens = (double)(e->budget - budget), value = tokens, extra = 0.0;
  double c = e->dcost_tokens > 0 ? e->dcost_ms / e->dcost_tokens : 0.0;
  int n = 0;
  for (int k = 0; k < e->n_items_now; k++) e->item_dslot[k] = -1;
  for (int k = 0; k < e->n_items_now && budget > 0 && e->rows_now < e->max_rows && n < e->dslots;
       k++) {
    eseq *s = e->item_seq[k];
    if (!spec_item(e, k) || s->gram || s->req->host_pick || !s->dkv) continue;
    int64_t ctx =
        din->context_length < in->context_length ? din->context_length : in->context_length;
    int64_t cap = spec_cap(e, s, budget, ctx);
    if (weigh && cap > 0) {
      double t = tokens, v = value, x = extra;
      /* weighed out: back toward the prior, without the exploring draft of prompt lookup
       * (here it would cost the draft's catching up on every token since its last draft;
       * the fit stays fresh from the plain steps, and the prior brings drafts back once the
       * steps are small enough for them to pay) */
      int w = spec_worth(spec_alpha(s), e->cost_a, e->cost_b, c, &t, &x, &v, (int)cap);
      if (w == 0) s->spec_hits *= 0.95f, s->spec_tries *= 0.95f;
      cap = w;
    }
    if (cap <= 0 || !ensure_blocks(e, s, 1 + cap, 0)) continue;
    e->dseq[n] = s, e->dcap[n] = (int)cap, e->item_dslot[k] = n++;
    budget -= cap;
    e->rows_now += cap;
    if (weigh) {
      double a = spec_alpha(s), pj = a;
      for (int j = 0; j < cap; j++, pj *= a) tokens += 1, extra += c, value += pj;
    }
  }
  if (n == 0) return;
  double t0 = eng_now_ms();
  run_draft(e, n);
  int drafted = 0;
  for (int k = 0; k < e->n_items_now; k++) {
    int i = e->item_dslot[k];
    if (i < 0) continue;
    if (e->dn[i] == 0) { /* a plain item after all: the blocks taken for the cap go back */
      give_back(e, e->dseq[i]);
      e->item_dslot[k] = -1;
      continue;
    }
    drafted += e->dn[i];
    irt_batch_item *it = &e->items[k];
    *it = (irt_batch_item){.seq = e->dseq[i]->kv,
                           .tokens = it->tokens,
                           .n = 1 + e->dn[i],
                           .all_logits = true,
                           .logits = e->logits};
  }
  /* the draft's time per drafted token, older steps weighing less (as the step fit) */
  e->dcost_ms = e->dcost_ms * STEP_COST_DECAY + (eng_now_ms() - t0);
  e->dcost_tokens = e->dcost_tokens * STEP_COST_DECAY + drafted;
}

/* Gives every item that asks for logits its rows of e->logits, in item order. */
static void place_rows(irt_engine *e) {
  size_t V = (size_t)irt_model_get_info(e->m)->vocab_size, row = 0;
  for (int k = 0; k < e->n_items_now; k++) {
    irt_batch_item *it = &e->items[k];
    if (!it->logits) continue;
    it->logits = e->logits + row * V;
    row += it->all_logits ? (size_t)it->n : 1;
  }
}

/* Chooses this step's items. */
static bool schedule(irt_engine *e) {
  if (!grow_cand(e)) return false;
  e->n_items_now = 0;
  e->rows_now = 0;
  e->row_picks_now = 0; /* before any add_item: fork_picks takes them too */
  int64_t budget = e->budget;
  int n_run = collect(e, ESEQ_RUNNING, e->run, e->cap_cand);
  schedule_running(e, n_run, &budget);
  int still_running = 0;
  for (int i = 0; i < n_run; i++) still_running += e->run[i]->state == ESEQ_RUNNING;
  if (!e->o.static_batching || !still_running) {
    int n_wait = collect(e, ESEQ_WAITING, e->wait, e->cap_cand);
    schedule_waiting(e, n_run, n_wait, &budget);
  }
  if (e->o.spec_tokens && !e->o.static_batching && e->o.draft) add_model_drafts(e, budget);
  else if (e->o.spec_tokens && !e->o.static_batching) add_drafts(e, budget);
  place_rows(e);
  return true;
}

/* --- after the step ----------------------------------------------------------------------- */

static void register_blocks(irt_engine *e, eseq *s) {
  if (!e->o.disable_prefix_cache)
    cache_register(&e->m->kv, s, s->kv, &s->n_registered, &s->last_hash);
}

static void emit(irt_engine *e, eseq *s, int32_t tok, float lp, const char *text, size_t len) {
  ereq *q = s->req;
  irt_event ev = {.id = q->id,
                  .index = s->index,
                  .token = tok,
                  .logprob = lp,
                  .text = e->tok ? (text ? text : "") : NULL,
                  .text_len = len,
                  .finish = s->finish,
                  .request_done = s->finish && q->n_done == q->n,
                  .prompt_tokens = q->n_prompt,
                  .cached_tokens = q->cached_tokens};
  if (tok >= 0 && q->r.top_logprobs > 0) {
    int64_t V = irt_model_get_info(e->m)->vocab_size;
    ev.n_top = q->r.top_logprobs < V ? q->r.top_logprobs : (int)V;
    ev.top_tokens = s->top_ids;
    ev.top_logprobs = s->top_lps;
  }
  if (ev.request_done && !q->unqueued) { /* free its queue slot before its caller hears: a
                                           client that answers at once must find room */
    pthread_mutex_lock(&e->mu);
    e->n_queued--;
    pthread_mutex_unlock(&e->mu);
    q->unqueued = true;
  }
  if (q->r.on_event) q->r.on_event(q->r.user, &ev);
}

/* Marks a completion finished and gives its blocks back (cached ones stay cached). */
static void finish(irt_engine *e, eseq *s, irt_finish why) {
  s->finish = why;
  s->state = ESEQ_DONE;
  s->req->n_done++;
  if (s->kv) drop_blocks(s);
}

/* Longest suffix of held text that begins some stop string. */
static size_t stop_overlap(const ereq *q, const char *t, size_t len) {
  size_t best = 0;
  for (int i = 0; i < q->r.n_stop; i++)
    for (size_t k = strlen(q->stops[i]) - 1; k > best; k--)
      if (k <= len && !memcmp(t + len - k, q->stops[i], k)) {
        best = k;
        break;
      }
  return best;
}

/* Adds a token's text to the held buffer; returns how much of it may be emitted now and
 * sets *hit when a stop string completed (the text is cut before it). */
static size_t take_text(eseq *s, int32_t tok, bool flush, bool *hit) {
  char piece[512];
  size_t n = tok >= 0 ? tok_stream_push(&s->stream, tok, piece, sizeof piece) : 0;
  if (n > sizeof piece) n = sizeof piece; /* push returns the full length; it wrote the cap */
  if (flush) n += tok_stream_finish(&s->stream, piece + n, sizeof piece - n);
  if (n > sizeof piece) n = sizeof piece;
  if (s->held_len + n > s->held_cap) n = s->held_cap - s->held_len; /* bounded by design */
  memcpy(s->held + s->held_len, piece, n);
  s->held_len += n;
  const ereq *q = s->req;
  size_t cut = s->held_len;
  *hit = false;
  int n_stop = s->n_generated >= q->r.min_tokens ? q->r.n_stop : 0; /* none before min_tokens */
  size_t stop_len = 0;
  for (int i = 0; i < n_stop; i++) {
    const char *p = memmem(s->held, s->held_len, q->stops[i], strlen(q->stops[i]));
    if (p && (size_t)(p - s->held) < cut)
      cut = (size_t)(p - s->held), *hit = true, stop_len = strlen(q->stops[i]);
  }
  if (*hit && q->r.include_stop_str) cut += stop_len; /* the stop string itself stays */
  if (!*hit && !flush) cut = s->held_len - stop_overlap(q, s->held, s->held_len);
  return cut;
}

/* The sequence's next token is tok (log-probability lp): stop checks, text, the event. */
static void take_token(irt_engine *e, eseq *s, int32_t tok, float lp) {
  const irt_model_info *in = irt_model_get_info(e->m);
  if (s->counts && s->counts[tok]++ == 0) s->seen[s->n_seen++] = tok;
  s->tokens[s->n_tokens++] = tok;
  s->n_generated++;
  e->work.generated_tokens++;
  bool eog = !s->req->r.ignore_eos && (e->tok ? tok_is_eog(e->tok, tok) : tok == in->eos_token_id);
  bool stop_id = false; /* its text stays: eog ? -1 : tok below */
  for (int i = 0; i < s->req->n_stop_ids && !stop_id; i++) stop_id = s->req->stop_ids[i] == tok;
  bool length = s->n_generated >= s->req->r.max_tokens || s->n_tokens >= in->context_length;
  /* a grammar whose text is whole and cannot go on ends the completion here */
  bool whole = s->gram && gram_state_take(s->gram, e->gtrie, tok) &&
               gram_state_accepting(s->gram) && !gram_state_can_continue(s->gram);
  bool hit = false;
  size_t cut = 0;
  if (e->tok) cut = take_text(s, eog ? -1 : tok, eog || stop_id || length || whole, &hit);
  irt_finish why = eog || stop_id || hit || whole ? IRT_FINISH_STOP
                   : length                       ? IRT_FINISH_LENGTH
                                                  : IRT_FINISH_NONE;
  if (why) finish(e, s, why);
  emit(e, s, tok, lp, s->held, cut);
  if (e->tok) {
    memmove(s->held, s->held + cut, s->held_len - cut);
    s->held_len -= cut;
  }
}

/* Takes the token a pick in the step chose; returns it. */
static int32_t take_pick(irt_engine *e, eseq *s, const irt_pick *p) {
  int n = p->n_top < IRT_MAX_TOP_LOGPROBS ? p->n_top : IRT_MAX_TOP_LOGPROBS;
  if (n > 0) {
    memcpy(s->top_ids, p->top_ids, (size_t)n * sizeof *s->top_ids);
    memcpy(s->top_lps, p->top_logprobs, (size_t)n * sizeof *s->top_lps);
  }
  take_token(e, s, p->token, p->logprob);
  return p->token;
}

/* A pick under s's grammar: the row as it is, and if the grammar does not allow that
 * token, the row again with the tokens it does not allow at -inf (added to the pick's
 * penalty list, so the logprobs stay the model's). When nothing is allowed (a grammar
 * that needs a character no token spells) the completion may only end. */
static void grammar_pick(irt_engine *e, eseq *s, irt_pick *p, const float *lg) {
  pick_row(e->m, p, lg);
  if (gram_allows(s->gram, e->gtrie, p->token)) return;
  int64_t V = irt_model_get_info(e->m)->vocab_size;
  if (gram_mask(s->gram, e->gtrie, e->gmask) == 0)
    for (int32_t id = 0; id < V; id++) e->gmask[id] = tok_is_eog(e->tok, id);
  int n = 0;
  for (int j = 0; j < p->n_pen; j++)
    if (e->gmask[p->pen_ids[j]]) e->gpen_ids[n] = p->pen_ids[j], e->gpen_sub[n++] = p->pen_sub[j];
  for (int32_t id = 0; id < V; id++)
    if (!e->gmask[id]) e->gpen_ids[n] = id, e->gpen_sub[n++] = INFINITY;
  if (n == V) return; /* no end-of-generation token either: keep the model's pick */
  irt_pick q = *p;
  q.pen_ids = e->gpen_ids, q.pen_sub = e->gpen_sub, q.n_pen = n;
  pick_row(e->m, &q, lg);
  p->token = q.token, p->logprob = q.logprob;
}

/* Adds token id to the host pick's list (e->xpen_*), once; its subtraction lives in xsub. */
static int list_add(irt_engine *e, int n, int32_t id) {
  if (e->xmark[id] & 1) return n;
  e->xmark[id] |= 1;
  e->xpen_ids[n] = id;
  return n + 1;
}

/* repetition_penalty and min_tokens, which depend on the row and on the count, folded into
 * p's penalty list as this row's exact subtractions: a token of the prompt or completion
 * goes from x = logit + bias to x / r (x > 0) or x r, then loses its presence/frequency
 * penalties; before min_tokens the stop tokens go to -inf. */
static void host_adjust(irt_engine *e, eseq *s, irt_pick *p, const float *lg) {
  const ereq *q = s->req;
  float *d = e->xsub, r = q->r.repetition_penalty;
  int n = 0;
  for (int j = 0; j < p->n_pen; j++)
    n = list_add(e, n, p->pen_ids[j]), d[p->pen_ids[j]] = p->pen_sub[j];
  if (r > 0 && r != 1)
    for (int64_t t = 0; t < s->n_tokens; t++) {
      int32_t id = s->tokens[t];
      if (e->xmark[id] & 2) continue;
      e->xmark[id] |= 2;
      n = list_add(e, n, id);
      float b = q->n_bias ? -bias_sub(q, id) : 0.0f, pf = d[id] + b, x = lg[id] + b;
      d[id] = lg[id] - ((x > 0 ? x / r : x * r) - pf);
    }
  if (s->n_generated < q->r.min_tokens) {
    for (int i = 0; i < e->n_eog; i++)
      n = list_add(e, n, e->eog_ids[i]), d[e->eog_ids[i]] = INFINITY;
    for (int i = 0; i < q->n_stop_ids; i++)
      n = list_add(e, n, q->stop_ids[i]), d[q->stop_ids[i]] = INFINITY;
  }
  for (int k = 0; k < n; k++) {
    int32_t id = e->xpen_ids[k];
    e->xpen_sub[k] = d[id];
    d[id] = 0, e->xmark[id] = 0;
  }
  p->pen_ids = e->xpen_ids, p->pen_sub = e->xpen_sub, p->n_pen = n;
}

/* Samples the next token from a row of logits brought to the host, as a pick would, and
 * takes it; returns it. */
static int32_t on_token(irt_engine *e, eseq *s, const float *lg) {
  irt_pick p = make_pick(s);
  if (s->req->host_pick) host_adjust(e, s, &p, lg);
  if (s->gram) grammar_pick(e, s, &p, lg);
  else pick_row(e->m, &p, lg);
  take_token(e, s, p.token, p.logprob);
  return p.token;
}

/* After the prompt of a request with n > 1: the other completions (created now, or
 * FORKING since the step began) share its blocks. */
static void fork_completions(irt_engine *e, eseq *s) {
  ereq *q = s->req;
  q->forked = true;
  for (int i = 1; i < q->n; i++) {
    irt_error err;
    if (q->seqs[i].state != ESEQ_FORKING && eseq_init(e, q, i, &err) != IRT_OK) {
      q->seqs[i].req = q;
      q->seqs[i].index = i;
      finish(e, &q->seqs[i], IRT_FINISH_CANCELLED);
      continue;
    }
    eseq *c = &q->seqs[i];
    memcpy(c->tokens, s->tokens, (size_t)s->n_tokens * sizeof *c->tokens);
    c->n_tokens = s->n_tokens;
    for (int64_t b = 0; b < s->kv->n_blocks; b++) {
      kv_block_ref(&e->m->kv, s->kv->blocks[b]);
      c->kv->blocks[c->kv->n_blocks++] = s->kv->blocks[b];
    }
    c->kv->len = s->kv->len;
    c->n_registered = s->n_registered;
    c->last_hash = s->last_hash;
    c->state = ESEQ_RUNNING;
    c->admit_order = e->next_admit++;
  }
}

/* After a check of nd drafts of s, i of them kept: its record (drafts 0..i were checked,
 * i + 1 of them unless all nd were kept), its next draft length (a sequence that stops
 * copying its context soon drafts one at a time), and its cache cut back to the kept
 * positions (the blocks past them held rejected drafts). */
static void spec_record(irt_engine *e, eseq *s, int i, int nd) {
  s->spec_hits = s->spec_hits * 0.8f + (float)i;
  s->spec_tries = s->spec_tries * 0.8f + (float)(i < nd ? i + 1 : nd);
  int grow = 2 * s->spec_len < e->o.spec_tokens ? 2 * s->spec_len : e->o.spec_tokens;
  s->spec_len = i == nd ? grow : i + 1;
  irt_seq_truncate(s->kv, s->kv->len);
}

/* A step ran s's last token and n - 1 drafts: row i is the distribution after draft i
 * (the last token for i = 0). Each row is picked exactly as a plain decode step would
 * pick it, so the tokens taken are those decoding without drafts would take: a draft
 * is kept while the pick equals it, and the first pick that differs (or the one after
 * the last draft) is the step's own new token. The cache keeps the kept positions. */
static void verify(irt_engine *e, int k) {
  eseq *s = e->item_seq[k];
  const irt_batch_item *it = &e->items[k];
  size_t V = (size_t)irt_model_get_info(e->m)->vocab_size;
  int nd = (int)it->n - 1;
  int32_t draft[IRT_MAX_SPEC_TOKENS];
  memcpy(draft, it->tokens + 1, (size_t)nd * sizeof *draft); /* take_token overwrites them */
  int64_t base = s->kv->len - it->n;                         /* the last token's position */
  e->work.spec_draft_tokens += nd;
  int i = 0;
  for (; i <= nd; i++) {
    s->kv->len = base + 1 + i; /* the last token and the drafts kept so far */
    register_blocks(e, s);
    int32_t tok = it->pick ? take_pick(e, s, &it->pick[i]) : on_token(e, s, it->logits + i * V);
    bool kept = i < nd && tok == draft[i];
    e->work.spec_accepted_tokens += kept;
    if (s->state != ESEQ_RUNNING) return; /* finished: its blocks are gone */
    if (!kept) break;
  }
  if (it->pick) irt_sampler_skip(s->sampler, i + 1); /* rows 0..i took their draws */
  spec_record(e, s, i, nd);
}

/* A step ran s's last token and n - 1 drafts of the draft model (slot i): row j is the
 * target's distribution after draft j - 1. Draft j is kept with probability
 * min(1, p_j(x) / q_j(x)) under the request's settings; the first rejected one is
 * replaced by a draw from norm(max(0, p_j - q_j)), and after all are kept one more token
 * is drawn from the last row: the tokens are distributed as plain decoding's. */
static void verify_drafted(irt_engine *e, int k, int slot) {
  eseq *s = e->item_seq[k];
  const irt_batch_item *it = &e->items[k];
  size_t V = (size_t)irt_model_get_info(e->m)->vocab_size, K = (size_t)e->o.spec_tokens;
  int nd = (int)it->n - 1;
  int32_t draft[IRT_MAX_SPEC_TOKENS];
  memcpy(draft, it->tokens + 1, (size_t)nd * sizeof *draft); /* take_token overwrites them */
  int64_t base = s->kv->len - it->n, base_n = s->n_tokens;
  const bool greedy = sampler_params(s->sampler)->temperature <= 0.0f;
  e->work.spec_draft_tokens += nd;
  int i = 0;
  for (; i <= nd; i++) {
    s->kv->len = base + 1 + i;
    register_blocks(e, s);
    const float *row = it->logits + (size_t)i * V;
    irt_pick p = make_pick(s);
    bool kept = false;
    if (i < nd) {
      const float *q = e->dq + ((size_t)slot * K + (size_t)i) * V;
      penalized_row(e, s, row, NULL, 0, e->adj);
      sampler_probs(s->sampler, e->adj, e->prow);
      kept = spec_keep(e->prow[draft[i]], q[draft[i]], greedy ? 0.0 : sampler_draw(s->sampler));
      p.token =
          kept ? draft[i]
               : spec_residual(e->prow, q, (int64_t)V, greedy ? 0.0 : sampler_draw(s->sampler));
      double lse = kn_log_sum_exp(row, (int64_t)V);
      p.logprob = (float)((double)row[p.token] - lse);
      if (p.n_top > 0)
        sampler_top_logprobs(row, (int64_t)V, lse, p.n_top, p.top_ids, p.top_logprobs);
    } else {
      pick_row(e->m, &p, row); /* all kept: one more from the target's own row */
    }
    take_token(e, s, p.token, p.logprob);
    e->work.spec_accepted_tokens += kept;
    if (s->state != ESEQ_RUNNING) return; /* finished: its blocks are gone */
    if (!kept) break;
  }
  spec_record(e, s, i, nd);
  irt_seq_truncate(s->dkv, base_n + i); /* the draft's positions of kept tokens stay */
  draft_register(e, s);
}

/* The first generated token(s) from the prompt's last row (every completion's, at the
 * fork of an n > 1 request), or the next token, sampled on the host. */
static void take_row(irt_engine *e, eseq *s, const float *lg) {
  ereq *q = s->req;
  bool fork = fork_point(s);
  if (fork) fork_completions(e, s);
  for (int i = fork ? 0 : s->index; i < (fork ? q->n_live : s->index + 1); i++)
    if (q->seqs[i].state == ESEQ_RUNNING) on_token(e, &q->seqs[i], lg);
}

/* A prompt token scored: its log-probability under the row before it, as an event. */
static void emit_prompt(irt_engine *e, eseq *s, const float *row, int32_t tok) {
  ereq *q = s->req;
  int64_t V = irt_model_get_info(e->m)->vocab_size;
  double lse = kn_log_sum_exp(row, V);
  irt_event ev = {.id = q->id,
                  .index = 0,
                  .token = tok,
                  .logprob = (float)(row[tok] - lse),
                  .prompt = true,
                  .prompt_tokens = q->n_prompt,
                  .cached_tokens = q->cached_tokens};
  if (q->r.top_logprobs > 0) {
    ev.n_top = q->r.top_logprobs < V ? q->r.top_logprobs : (int)V;
    sampler_top_logprobs(row, V, lse, ev.n_top, s->top_ids, s->top_lps);
    ev.top_tokens = s->top_ids, ev.top_logprobs = s->top_lps;
  }
  if (q->r.on_event) q->r.on_event(q->r.user, &ev);
}

/* A scored prompt chunk: row j predicts the token after position start + j; the rows of
 * prompt tokens become events (once: a recomputed chunk after preemption skips them), and
 * the row after the prompt's last token picks the first generated one. */
static void score_prompt(irt_engine *e, int k) {
  eseq *s = e->item_seq[k];
  const irt_batch_item *it = &e->items[k];
  size_t V = (size_t)irt_model_get_info(e->m)->vocab_size;
  register_blocks(e, s);
  int64_t start = s->kv->len - it->n;
  for (int64_t j = 0; j < it->n && start + j + 1 < s->req->n_prompt; j++)
    if (start + j + 1 >= s->plp_next) {
      emit_prompt(e, s, it->logits + (size_t)j * V, s->req->prompt[start + j + 1]);
      s->plp_next = start + j + 2;
    }
  if (s->kv->len == s->n_tokens) take_row(e, s, it->logits + (size_t)(it->n - 1) * V);
}

static void after_item(irt_engine *e, int k) {
  eseq *s = e->item_seq[k];
  if (e->item_plp[k]) {
    score_prompt(e, k);
    return;
  }
  if (e->items[k].all_logits) {
    if (e->o.draft && e->item_dslot[k] >= 0) verify_drafted(e, k, e->item_dslot[k]);
    else verify(e, k);
    return;
  }
  register_blocks(e, s);
  const irt_pick *p = e->items[k].pick;
  ereq *q = s->req;
  if (p && e->items[k].n_picks > 1) { /* the first token of each completion */
    fork_completions(e, s);
    for (int i = 0; i < q->n; i++)
      if (q->seqs[i].state == ESEQ_RUNNING) take_token(e, &q->seqs[i], p[i].token, p[i].logprob);
    return;
  }
  if (p) {
    if (s->state == ESEQ_RUNNING) take_token(e, s, p->token, p->logprob);
    return;
  }
  if (e->items[k].logits) take_row(e, s, e->items[k].logits);
}

void eng_cancel_all(irt_engine *e) {
  for (ereq *q = e->reqs; q; q = q->next) {
    if (!q->cancelled) continue;
    for (int i = 0; i < q->n; i++) {
      eseq *s = &q->seqs[i];
      if (i < q->n_live && s->finish) continue;
      if (i >= q->n_live) s->req = q, s->index = i;
      finish(e, s, IRT_FINISH_CANCELLED);
      emit(e, s, -1, 0.0f, NULL, 0);
    }
  }
}

static void publish_stats(irt_engine *e) {
  int64_t running = 0, waiting = 0;
  for (ereq *q = e->reqs; q; q = q->next)
    for (int i = 0; i < q->n_live; i++) {
      running += q->seqs[i].state == ESEQ_RUNNING;
      waiting += q->seqs[i].state == ESEQ_WAITING;
    }
  const kv_cache *kv = &e->m->kv;
  pthread_mutex_lock(&e->mu);
  e->work.running = running;
  e->work.waiting = waiting;
  e->work.kv_blocks_used = kv_in_use(kv);
  e->work.kv_blocks_cached = kv->n_evictable;
  e->stats = e->work;
  pthread_mutex_unlock(&e->mu);
}

/* A step of decode items only (plain or drafted) feeds the cost model drafts are weighed
 * by; the last fit stands while new steps cannot tell a from b. */
static void time_step(irt_engine *e, double ms) {
  int64_t tokens = 0;
  for (int k = 0; k < e->n_items_now; k++) {
    if (e->items[k].n > 1 && (!e->items[k].all_logits || e->item_plp[k])) return; /* prefill */
    tokens += e->items[k].n;
  }
  step_cost_add(&e->cost, (double)tokens, ms);
  double a, b;
  if (!step_cost_fit(&e->cost, &a, &b)) return;
  e->cost_a = a, e->cost_b = b, e->cost_ok = true;
  e->work.spec_step_ms = a, e->work.spec_token_ms = b;
}

irt_status eng_iterate(irt_engine *e, bool *out_busy, irt_error *err) {
  eng_drain_inbox(e);
  eng_cancel_all(e);
  irt_status st = IRT_OK;
  if (!schedule(e)) {
    st = IRT_OOM;
    if (err) *err = (irt_error){.status = IRT_OOM, .msg = "out of memory scheduling a step"};
  }
  if (st == IRT_OK && e->n_items_now > 0) {
    double t0 = eng_now_ms();
    st = irt_decode_batch(e->m, e->items, e->n_items_now, err);
    if (st == IRT_OK) {
      if (e->o.spec_tokens) time_step(e, eng_now_ms() - t0);
      e->work.steps++;
      for (int k = 0; k < e->n_items_now; k++) after_item(e, k);
    } else { /* a failed step ends its requests rather than retrying forever */
      for (int k = 0; k < e->n_items_now; k++) e->item_seq[k]->req->cancelled = true;
      eng_cancel_all(e);
    }
  }
  e->n_items_now = 0;
  eng_reap(e);
  publish_stats(e);
  *out_busy = e->reqs != NULL;
  return st;
}
