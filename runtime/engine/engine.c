/* engine: lifecycle, submission, cancellation, the engine thread and stats. The
 * scheduling iteration itself is in sched.c. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "engine.h"
#include "ir_alloc.h"

double eng_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static irt_status fail(irt_error *err, irt_status st, const char *msg) {
  if (err) {
    err->status = st;
    snprintf(err->msg, sizeof err->msg, "%s", msg);
  }
  return st;
}

static irt_status failf(irt_error *err, irt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static irt_status failf(irt_error *err, irt_status st, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->status = st;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return st;
}

irt_engine_opts irt_engine_opts_default(void) { return (irt_engine_opts){0}; }

/* A draft model must speak the target's vocabulary: the same size, end-of-text id and,
 * where both plans carry a tokenizer, the same token strings. */
static irt_status check_draft(irt_model *m, irt_model *dm, irt_error *err) {
  const irt_model_info *a = irt_model_get_info(m), *b = irt_model_get_info(dm);
  if (a->vocab_size != b->vocab_size)
    return failf(err, IRT_INVALID_ARG,
                 "the draft model's vocabulary (%lld tokens) is not the target's (%lld tokens): "
                 "a draft must share the target's tokenizer",
                 (long long)b->vocab_size, (long long)a->vocab_size);
  const irt_tokenizer *ta = irt_model_get_tokenizer(m), *tb = irt_model_get_tokenizer(dm);
  if (a->eos_token_id != b->eos_token_id)
    return failf(err, IRT_INVALID_ARG,
                 "the draft model's tokenizer is not the target's (end-of-text %lld vs %lld)",
                 (long long)b->eos_token_id, (long long)a->eos_token_id);
  if ((!ta) != (!tb))
    return failf(err, IRT_INVALID_ARG,
                 "the %s plan has a tokenizer and the %s has none: a draft must share the "
                 "target's tokenizer",
                 ta ? "target" : "draft", ta ? "draft" : "target");
  for (int32_t id = 0; ta && id < (int32_t)a->vocab_size; id++) {
    const char *x = tok_token(ta, id), *y = tok_token(tb, id);
    if ((x == NULL) != (y == NULL) || (x && strcmp(x, y)))
      return failf(err, IRT_INVALID_ARG,
                   "the draft model's tokenizer is not the target's (token %lld is '%.40s' there, "
                   "'%.40s' here)",
                   (long long)id, y ? y : "", x ? x : "");
  }
  return IRT_OK;
}

/* Scratch of drafting with a model: slots of sequences, their last draft rows and q rows. */
static bool alloc_draft(irt_engine *e) {
  const irt_model_info *in = irt_model_get_info(e->m), *din = irt_model_get_info(e->o.draft);
  int64_t slots = e->max_running < 32 ? e->max_running : 32;
  if (din->max_step_seqs < slots) slots = din->max_step_seqs;
  if (din->max_step_logits < slots) slots = din->max_step_logits;
  if (din->max_step_tokens < slots) slots = din->max_step_tokens; /* a round: a token a slot */
  size_t V = (size_t)in->vocab_size, S = (size_t)slots, K = (size_t)e->o.spec_tokens;
  e->dslots = (int)slots;
  e->item_dslot = ir_malloc((size_t)e->max_running * sizeof *e->item_dslot);
  e->dseq = ir_calloc(S, sizeof *e->dseq);
  e->ditems = ir_calloc(S, sizeof *e->ditems);
  e->dcap = ir_calloc(S, sizeof *e->dcap);
  e->dn = ir_calloc(S, sizeof *e->dn);
  e->dmap = ir_calloc(S, sizeof *e->dmap);
  e->dpend = ir_calloc(S, sizeof *e->dpend);
  e->dlog = ir_malloc(S * V * sizeof *e->dlog);
  e->dq = ir_malloc(S * K * V * sizeof *e->dq);
  e->adj = ir_malloc(V * sizeof *e->adj);
  e->prow = ir_malloc(V * sizeof *e->prow);
  return e->item_dslot && e->dseq && e->ditems && e->dcap && e->dn && e->dmap && e->dpend &&
         e->dlog && e->dq && e->adj && e->prow;
}

irt_status irt_engine_create(irt_model *m, const irt_engine_opts *o, irt_engine **out,
                             irt_error *err) {
  const irt_model_info *in = irt_model_get_info(m);
  irt_engine *e = ir_calloc(1, sizeof *e);
  if (!e) return fail(err, IRT_OOM, "out of memory");
  e->m = m;
  e->tok = irt_model_get_tokenizer(m);
  e->o = o ? *o : irt_engine_opts_default();
  e->budget = e->o.max_batched_tokens > 0 && e->o.max_batched_tokens < in->max_step_tokens
                  ? e->o.max_batched_tokens
                  : in->max_step_tokens;
  e->max_running = e->o.max_running > 0 && e->o.max_running < in->max_step_seqs ? e->o.max_running
                                                                                : in->max_step_seqs;
  if (e->max_running > in->max_step_logits) e->max_running = in->max_step_logits;
  if (e->o.max_waiting <= 0) e->o.max_waiting = 4096;
  if (e->o.spec_tokens < 0 || e->o.spec_tokens > IRT_MAX_SPEC_TOKENS) {
    ir_free(e);
    return fail(err, IRT_INVALID_ARG, "speculative tokens must be 0..16");
  }
  int nmin = e->o.spec_ngram_min, nmax = e->o.spec_ngram_max; /* 0: irt_prompt_lookup's */
  if (nmin < 0 || nmax < 0 || nmax > 64 || (nmax && nmax < (nmin ? nmin : IRT_SPEC_NGRAM_MIN))) {
    ir_free(e);
    return fail(err, IRT_INVALID_ARG, "speculative n-gram sizes must be 1 <= min <= max <= 64");
  }
  if (e->o.draft && e->o.spec_tokens > 0) {
    irt_status st = check_draft(m, e->o.draft, err);
    if (st != IRT_OK) {
      ir_free(e);
      return st;
    }
  } else {
    e->o.draft = NULL; /* no drafts asked for: the draft model stays idle */
  }
  e->max_rows = in->max_step_logits;
  e->next_id = 1;
  e->items = ir_calloc((size_t)e->max_running, sizeof *e->items);
  e->item_seq = ir_calloc((size_t)e->max_running, sizeof *e->item_seq);
  e->item_plp = ir_calloc((size_t)e->max_running, sizeof *e->item_plp);
  e->logits = ir_malloc((size_t)(e->max_rows * in->vocab_size) * sizeof(float));
  e->picks = ir_calloc((size_t)e->max_running, sizeof *e->picks);
  e->row_picks = ir_calloc((size_t)e->max_rows, sizeof *e->row_picks);
  e->row_top_ids = ir_calloc((size_t)e->max_rows * IRT_MAX_TOP_LOGPROBS, sizeof *e->row_top_ids);
  e->row_top_lps = ir_calloc((size_t)e->max_rows * IRT_MAX_TOP_LOGPROBS, sizeof *e->row_top_lps);
  if (e->tok) {
    e->gtrie = gram_trie_create(e->tok);
    e->gmask = ir_malloc((size_t)in->vocab_size);
    e->gpen_ids = ir_malloc((size_t)in->vocab_size * sizeof *e->gpen_ids);
    e->gpen_sub = ir_malloc((size_t)in->vocab_size * sizeof *e->gpen_sub);
  }
  e->xsub = ir_calloc((size_t)in->vocab_size, sizeof *e->xsub);
  e->xmark = ir_calloc((size_t)in->vocab_size, 1);
  e->xpen_ids = ir_malloc((size_t)in->vocab_size * sizeof *e->xpen_ids);
  e->xpen_sub = ir_malloc((size_t)in->vocab_size * sizeof *e->xpen_sub);
  e->eog_ids = ir_malloc((size_t)in->vocab_size * sizeof *e->eog_ids);
  for (int32_t id = 0; e->eog_ids && id < in->vocab_size; id++)
    if (e->tok ? tok_is_eog(e->tok, id) : id == in->eos_token_id) e->eog_ids[e->n_eog++] = id;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  if (!e->items || !e->item_seq || !e->item_plp || !e->logits || !e->picks || !e->row_picks ||
      !e->row_top_ids || !e->row_top_lps || !e->xsub || !e->xmark || !e->xpen_ids || !e->xpen_sub ||
      !e->eog_ids || (e->tok && (!e->gtrie || !e->gmask || !e->gpen_ids || !e->gpen_sub)) ||
      (e->o.draft && !alloc_draft(e))) {
    irt_engine_destroy(e);
    return fail(err, IRT_OOM, "out of memory");
  }
  e->work.kv_blocks_total = m->kv.n_blocks;
  e->stats = e->work;
  *out = e;
  return IRT_OK;
}

static void free_req(ereq *q) {
  for (int i = 0; i < q->r.n_stop; i++) ir_free(q->stops[i]);
  ir_free(q->stops);
  ir_free(q->tenant);
  ir_free(q->prompt);
  ir_free(q->bias_ids);
  ir_free(q->bias_sub);
  ir_free(q->stop_ids);
  gram_destroy(q->grammar);
  ir_free(q->seqs);
  ir_free(q);
}

typedef struct bias_pair {
  int32_t id;
  float sub;
} bias_pair;

static int by_id(const void *a, const void *b) {
  int32_t x = ((const bias_pair *)a)->id, y = ((const bias_pair *)b)->id;
  return (x > y) - (x < y);
}

/* logit_bias, sorted by id (checked in check_request). */
static irt_status copy_bias(const irt_request *r, ereq *q, irt_error *err) {
  q->r.logit_bias_ids = NULL, q->r.logit_bias = NULL;
  if (r->n_logit_bias <= 0) return IRT_OK;
  if (r->n_logit_bias > IRT_MAX_LOGIT_BIAS || !r->logit_bias_ids || !r->logit_bias)
    return fail(err, IRT_INVALID_ARG, "logit_bias: at most 1024 tokens, with ids and biases");
  int n = r->n_logit_bias;
  bias_pair *pairs = ir_malloc((size_t)n * sizeof *pairs);
  q->bias_ids = ir_malloc((size_t)n * sizeof *q->bias_ids);
  q->bias_sub = ir_malloc((size_t)n * sizeof *q->bias_sub);
  if (!pairs || !q->bias_ids || !q->bias_sub) {
    ir_free(pairs);
    return fail(err, IRT_OOM, "out of memory");
  }
  for (int i = 0; i < n; i++) pairs[i] = (bias_pair){r->logit_bias_ids[i], -r->logit_bias[i]};
  qsort(pairs, (size_t)n, sizeof *pairs, by_id);
  for (int i = 0; i < n; i++) q->bias_ids[i] = pairs[i].id, q->bias_sub[i] = pairs[i].sub;
  ir_free(pairs);
  q->n_bias = n;
  return IRT_OK;
}

/* Copies what the request points at, so the caller's buffers may go after submit. */
static irt_status copy_request(irt_engine *e, const irt_request *r, ereq *q, irt_error *err) {
  q->r = *r;
  q->n = r->n > 0 ? r->n : 1;
  q->r.n_stop = 0;
  q->stops = ir_calloc((size_t)r->n_stop + 1, sizeof *q->stops);
  q->tenant = ir_strdup(r->tenant ? r->tenant : "");
  q->seqs = ir_calloc((size_t)q->n, sizeof *q->seqs);
  if (!q->stops || !q->tenant || !q->seqs) return fail(err, IRT_OOM, "out of memory");
  for (int i = 0; i < r->n_stop; i++, q->r.n_stop++)
    if (!(q->stops[i] = ir_strdup(r->stop[i]))) return fail(err, IRT_OOM, "out of memory");
  q->r.stop = (const char *const *)q->stops;
  q->r.tenant = q->tenant;
  irt_status st = copy_bias(r, q, err);
  if (st != IRT_OK) return st;
  q->r.stop_token_ids = NULL;
  if (r->n_stop_token_ids > 0) {
    if (r->n_stop_token_ids > IRT_MAX_STOP_TOKEN_IDS || !r->stop_token_ids)
      return fail(err, IRT_INVALID_ARG, "stop_token_ids: at most 256 ids");
    if (!(q->stop_ids = ir_malloc((size_t)r->n_stop_token_ids * sizeof *q->stop_ids)))
      return fail(err, IRT_OOM, "out of memory");
    memcpy(q->stop_ids, r->stop_token_ids, (size_t)r->n_stop_token_ids * sizeof *q->stop_ids);
    q->n_stop_ids = r->n_stop_token_ids;
  }
  float rp = r->repetition_penalty;
  q->host_pick = (rp != 0 && rp != 1) || r->min_tokens > 0;
  q->r.grammar = NULL;
  if (r->grammar) {
    if (!e->tok) return fail(err, IRT_INVALID_ARG, "a grammar needs a plan with a tokenizer");
    ir_diag d = {0};
    if (gram_compile(r->grammar, &q->grammar, &d) != IR_OK) return rt_error_from_diag(err, &d);
  }
  q->tenant_hash = XXH3_64bits(q->tenant, strlen(q->tenant));
  return IRT_OK;
}

static irt_status tokenize_prompt(irt_engine *e, const irt_request *r, ereq *q, irt_error *err) {
  if (r->prompt_ids) {
    q->prompt = ir_malloc((r->n_prompt + 1) * sizeof *q->prompt);
    if (!q->prompt) return fail(err, IRT_OOM, "out of memory");
    if (r->n_prompt) memcpy(q->prompt, r->prompt_ids, r->n_prompt * sizeof *q->prompt);
    q->n_prompt = (int64_t)r->n_prompt;
    return IRT_OK;
  }
  if (!r->prompt_text) return fail(err, IRT_INVALID_ARG, "the request has no prompt");
  if (!e->tok) return fail(err, IRT_INVALID_ARG, "the plan has no tokenizer: send token ids");
  size_t n = 0;
  ir_diag d = {0};
  ir_status st = tok_encode_alloc(e->tok, r->prompt_text, strlen(r->prompt_text), r->add_special,
                                  true, &q->prompt, &n, &d);
  if (st != IR_OK) {
    rt_error_from_diag(err, &d);
    return st == IR_OOM ? IRT_OOM : IRT_INVALID_ARG;
  }
  q->n_prompt = (int64_t)n;
  return IRT_OK;
}

static irt_status check_request(irt_engine *e, const ereq *q, irt_error *err) {
  const irt_model_info *in = irt_model_get_info(e->m);
  char msg[256];
  if (q->n_prompt <= 0) return fail(err, IRT_INVALID_ARG, "the prompt is empty");
  if (q->n_prompt >= in->context_length) {
    snprintf(msg, sizeof msg, "the prompt has %lld tokens; the context holds %lld",
             (long long)q->n_prompt, (long long)in->context_length);
    return fail(err, IRT_INVALID_ARG, msg);
  }
  for (int64_t i = 0; i < q->n_prompt; i++)
    if (q->prompt[i] < 0 || q->prompt[i] >= in->vocab_size) {
      snprintf(msg, sizeof msg, "token id %d is outside the vocabulary of %lld", q->prompt[i],
               (long long)in->vocab_size);
      return fail(err, IRT_INVALID_ARG, msg);
    }
  if (q->n > e->max_running) {
    snprintf(msg, sizeof msg, "n=%d exceeds the %lld sequences a step can hold", q->n,
             (long long)e->max_running);
    return fail(err, IRT_INVALID_ARG, msg);
  }
  const irt_sampling *sp = &q->r.sampling;
  if (!(sp->temperature >= 0) || !(sp->top_p > 0 && sp->top_p <= 1) || sp->top_k < 0 ||
      !(sp->min_p >= 0 && sp->min_p <= 1))
    return fail(err, IRT_INVALID_ARG,
                "sampling needs temperature >= 0, 0 < top_p <= 1, top_k >= 0, 0 <= min_p <= 1");
  if (!(fabsf(q->r.presence_penalty) <= 2) || !(fabsf(q->r.frequency_penalty) <= 2))
    return fail(err, IRT_INVALID_ARG, "penalties must lie in [-2, 2]");
  if (q->r.top_logprobs < 0 || q->r.top_logprobs > IRT_MAX_TOP_LOGPROBS) {
    snprintf(msg, sizeof msg, "top_logprobs must lie in [0, %d]", IRT_MAX_TOP_LOGPROBS);
    return fail(err, IRT_INVALID_ARG, msg);
  }
  for (int i = 0; i < q->n_bias; i++) {
    float b = -q->bias_sub[i];
    if (q->bias_ids[i] < 0 || q->bias_ids[i] >= in->vocab_size) {
      snprintf(msg, sizeof msg, "logit_bias: token id %d is outside the vocabulary of %lld",
               q->bias_ids[i], (long long)in->vocab_size);
      return fail(err, IRT_INVALID_ARG, msg);
    }
    if (!(b >= -100 && b <= 100)) {
      snprintf(msg, sizeof msg, "logit_bias: the bias of token %d must lie in [-100, 100]",
               q->bias_ids[i]);
      return fail(err, IRT_INVALID_ARG, msg);
    }
    if (i > 0 && q->bias_ids[i] == q->bias_ids[i - 1]) {
      snprintf(msg, sizeof msg, "logit_bias: token %d appears twice", q->bias_ids[i]);
      return fail(err, IRT_INVALID_ARG, msg);
    }
  }
  for (int i = 0; i < q->n_stop_ids; i++)
    if (q->stop_ids[i] < 0 || q->stop_ids[i] >= in->vocab_size) {
      snprintf(msg, sizeof msg, "stop_token_ids: token id %d is outside the vocabulary of %lld",
               q->stop_ids[i], (long long)in->vocab_size);
      return fail(err, IRT_INVALID_ARG, msg);
    }
  if (!(q->r.repetition_penalty >= 0 && q->r.repetition_penalty <= 2))
    return fail(err, IRT_INVALID_ARG, "repetition_penalty must lie in (0, 2] (0: off)");
  if (q->r.min_tokens < 0 || (q->r.max_tokens > 0 && q->r.min_tokens > q->r.max_tokens))
    return fail(err, IRT_INVALID_ARG, "min_tokens must lie in [0, max_tokens]");
  if (q->r.min_tokens > 0 && q->grammar)
    return fail(err, IRT_INVALID_ARG, "min_tokens cannot be combined with a grammar");
  if (q->r.n_stop && !e->tok) return fail(err, IRT_INVALID_ARG, "stop strings need a tokenizer");
  for (int i = 0; i < q->r.n_stop; i++)
    if (!q->stops[i][0]) return fail(err, IRT_INVALID_ARG, "stop strings must not be empty");
  return IRT_OK;
}

static irt_status eseq_make(irt_engine *e, ereq *q, int i, irt_error *err) {
  eseq *s = &q->seqs[i];
  const irt_model_info *in = irt_model_get_info(e->m);
  size_t max_stop = 0;
  for (int k = 0; k < q->r.n_stop; k++)
    if (strlen(q->stops[k]) > max_stop) max_stop = strlen(q->stops[k]);
  irt_sampling sp = q->r.sampling;
  sp.seed += (uint64_t)i;
  s->req = q;
  s->index = i;
  s->held_cap = max_stop + 1024;
  s->spec_len = e->o.spec_tokens;
  s->tokens = ir_malloc((size_t)in->context_length * sizeof *s->tokens);
  s->held = ir_malloc(s->held_cap);
  if (!s->tokens || !s->held) return fail(err, IRT_OOM, "out of memory");
  if (q->r.presence_penalty != 0 || q->r.frequency_penalty != 0) {
    s->counts = ir_calloc((size_t)in->vocab_size, sizeof *s->counts);
    s->seen = ir_malloc((size_t)in->vocab_size * sizeof *s->seen);
    s->pen_sub = ir_malloc((size_t)in->vocab_size * sizeof *s->pen_sub);
    if (q->n_bias) s->pen_ids = ir_malloc((size_t)in->vocab_size * sizeof *s->pen_ids);
    if (!s->counts || !s->seen || !s->pen_sub || (q->n_bias && !s->pen_ids))
      return fail(err, IRT_OOM, "out of memory");
  }
  ir_diag gd = {0};
  if (q->grammar && gram_state_create(q->grammar, &s->gram, &gd) != IR_OK)
    return rt_error_from_diag(err, &gd);
  if (irt_seq_create(e->m, &s->kv, err) != IRT_OK) return IRT_OOM;
  irt_seq_set_prompt_len(s->kv, q->n_prompt);
  if (irt_sampler_create(&sp, in->vocab_size, &s->sampler, err) != IRT_OK) return IRT_OOM;
  if (e->o.draft) { /* the draft's KV, and a generator of its own for drafting */
    irt_sampling dp = sp;
    dp.seed ^= 0xd1b54a32d192ed03ull;
    if (irt_seq_create(e->o.draft, &s->dkv, err) != IRT_OK) return IRT_OOM;
    irt_seq_set_prompt_len(s->dkv, q->n_prompt);
    if (irt_sampler_create(&dp, in->vocab_size, &s->dsampler, err) != IRT_OK) return IRT_OOM;
  }
  if (e->tok) tok_stream_init(&s->stream, e->tok, true);
  return IRT_OK;
}

/* Creates completion i's sequence state (tokens, KV handle, sampler, text buffers); on
 * failure frees what it made. */
irt_status eseq_init(irt_engine *e, ereq *q, int i, irt_error *err) {
  irt_status st = eseq_make(e, q, i, err);
  if (st != IRT_OK) {
    eseq_release(e, &q->seqs[i]);
    return st;
  }
  q->n_live = i + 1 > q->n_live ? i + 1 : q->n_live;
  return IRT_OK;
}

void eseq_release(irt_engine *e, eseq *s) {
  irt_seq_destroy(s->kv);
  irt_seq_destroy(s->dkv);
  irt_sampler_destroy(s->dsampler);
  s->dkv = NULL;
  s->dsampler = NULL;
  irt_sampler_destroy(s->sampler);
  ir_free(s->tokens);
  ir_free(s->held);
  ir_free(s->counts);
  ir_free(s->seen);
  ir_free(s->pen_sub);
  ir_free(s->pen_ids);
  gram_state_destroy(s->gram);
  s->gram = NULL;
  s->pen_ids = NULL;
  s->counts = NULL;
  s->seen = NULL;
  s->pen_sub = NULL;
  s->kv = NULL;
  s->sampler = NULL;
  s->tokens = NULL;
  s->held = NULL;
}

irt_status irt_engine_submit(irt_engine *e, const irt_request *r, irt_request_id *out_id,
                             irt_error *err) {
  ereq *q = ir_calloc(1, sizeof *q);
  if (!q) return fail(err, IRT_OOM, "out of memory");
  irt_status st = copy_request(e, r, q, err);
  if (st == IRT_OK) st = tokenize_prompt(e, r, q, err);
  if (st == IRT_OK) st = check_request(e, q, err);
  if (st == IRT_OK) st = eseq_init(e, q, 0, err);
  if (st == IRT_OK) {
    const irt_model_info *in = irt_model_get_info(e->m);
    /* The context and the KV pool bound the tokens: a sequence the whole pool cannot hold
     * would be preempted by itself forever. */
    const kv_cache *kv = &e->m->kv;
    int64_t pool = (kv->n_blocks - (e->m->pad_block >= 0)) * kv->block_size;
    int64_t room = in->context_length - q->n_prompt;
    if (room > pool - q->n_prompt) room = pool - q->n_prompt;
    if (q->r.max_tokens <= 0 || q->r.max_tokens > room) q->r.max_tokens = room;
    if (room <= 0) {
      char msg[160];
      snprintf(msg, sizeof msg,
               "prompt of %lld tokens leaves no room in the KV cache of %lld "
               "tokens (raise --kv-tokens)",
               (long long)q->n_prompt, (long long)pool);
      st = fail(err, IRT_INVALID_ARG, msg);
    }
    memcpy(q->seqs[0].tokens, q->prompt, (size_t)q->n_prompt * sizeof *q->prompt);
    q->seqs[0].n_tokens = q->n_prompt;
  }
  pthread_mutex_lock(&e->mu);
  if (st == IRT_OK && e->n_queued >= e->o.max_waiting)
    st = fail(err, IRT_BUSY, "the engine's queue is full; retry later");
  if (st == IRT_OK) {
    q->id = e->next_id++;
    q->arrival = e->next_arrival++;
    if (e->inbox_tail) e->inbox_tail->next = q;
    else e->inbox_head = q;
    e->inbox_tail = q;
    e->n_queued++;
    if (out_id) *out_id = q->id;
    pthread_cond_signal(&e->cv);
  }
  pthread_mutex_unlock(&e->mu);
  if (st != IRT_OK) {
    if (q->seqs) eseq_release(e, &q->seqs[0]);
    free_req(q);
  }
  return st;
}

void irt_engine_cancel(irt_engine *e, irt_request_id id) {
  pthread_mutex_lock(&e->mu);
  if (e->n_cancels == e->cap_cancels) {
    int cap = e->cap_cancels ? e->cap_cancels * 2 : 16;
    irt_request_id *p = ir_realloc(e->cancels, (size_t)cap * sizeof *p);
    if (p) e->cancels = p, e->cap_cancels = cap;
  }
  if (e->n_cancels < e->cap_cancels) e->cancels[e->n_cancels++] = id;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

/* Moves submissions into the request list and marks cancelled requests. */
void eng_drain_inbox(irt_engine *e) {
  pthread_mutex_lock(&e->mu);
  ereq *head = e->inbox_head;
  e->inbox_head = e->inbox_tail = NULL;
  ereq **tail = &e->reqs;
  while (*tail) tail = &(*tail)->next;
  *tail = head;
  for (int i = 0; i < e->n_cancels; i++)
    for (ereq *q = e->reqs; q; q = q->next)
      if (q->id == e->cancels[i]) q->cancelled = true;
  e->n_cancels = 0;
  pthread_mutex_unlock(&e->mu);
}

/* Removes finished requests from the list and frees them. */
void eng_reap(irt_engine *e) {
  ereq **p = &e->reqs;
  int64_t reaped = 0, unqueue = 0;
  while (*p) {
    ereq *q = *p;
    if (q->n_done < q->n) {
      p = &q->next;
      continue;
    }
    *p = q->next;
    unqueue += !q->unqueued;
    for (int i = 0; i < q->n_live; i++) eseq_release(e, &q->seqs[i]);
    free_req(q);
    reaped++;
  }
  if (!reaped) return;
  pthread_mutex_lock(&e->mu);
  e->n_queued -= unqueue;
  e->work.requests_finished += reaped;
  pthread_mutex_unlock(&e->mu);
}

irt_status irt_engine_step(irt_engine *e, bool *out_busy, irt_error *err) {
  return eng_iterate(e, out_busy, err);
}

irt_status irt_engine_run(irt_engine *e, irt_error *err) {
  bool busy = true;
  irt_status st = IRT_OK;
  while (busy && st == IRT_OK) st = eng_iterate(e, &busy, err);
  return st;
}

static void *engine_thread(void *arg) {
  irt_engine *e = arg;
  for (;;) {
    pthread_mutex_lock(&e->mu);
    while (!e->stop && !e->reqs && !e->inbox_head && !e->n_cancels)
      pthread_cond_wait(&e->cv, &e->mu);
    bool stop = e->stop;
    pthread_mutex_unlock(&e->mu);
    if (stop) break;
    bool busy;
    irt_error err = {0};
    if (eng_iterate(e, &busy, &err) != IRT_OK) { /* the step's requests were ended */
      pthread_mutex_lock(&e->mu);
      e->last_err = err;
      pthread_mutex_unlock(&e->mu);
    }
  }
  return NULL;
}

irt_status irt_engine_start(irt_engine *e, irt_error *err) {
  if (e->thread_running) return IRT_OK;
  if (pthread_create(&e->thread, NULL, engine_thread, e) != 0)
    return fail(err, IRT_OOM, "cannot start the engine thread");
  e->thread_running = true;
  return IRT_OK;
}

void irt_engine_destroy(irt_engine *e) {
  if (!e) return;
  if (e->thread_running) {
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
  }
  eng_drain_inbox(e);
  for (ereq *q = e->reqs; q; q = q->next) q->cancelled = true;
  eng_cancel_all(e);
  eng_reap(e);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  ir_free(e->cancels);
  ir_free(e->run);
  ir_free(e->wait);
  ir_free(e->items);
  ir_free(e->item_dslot);
  ir_free(e->dseq);
  ir_free(e->ditems);
  ir_free(e->dcap);
  ir_free(e->dn);
  ir_free(e->dmap);
  ir_free(e->dpend);
  ir_free(e->dlog);
  ir_free(e->dq);
  ir_free(e->adj);
  ir_free(e->prow);
  ir_free(e->item_seq);
  ir_free(e->item_plp);
  ir_free(e->logits);
  ir_free(e->picks);
  ir_free(e->row_picks);
  ir_free(e->row_top_ids);
  ir_free(e->row_top_lps);
  gram_trie_destroy(e->gtrie);
  ir_free(e->gmask);
  ir_free(e->xsub);
  ir_free(e->xmark);
  ir_free(e->xpen_ids);
  ir_free(e->xpen_sub);
  ir_free(e->eog_ids);
  ir_free(e->gpen_ids);
  ir_free(e->gpen_sub);
  ir_free(e);
}

void irt_engine_get_stats(irt_engine *e, irt_engine_stats *out) {
  pthread_mutex_lock(&e->mu);
  *out = e->stats;
  pthread_mutex_unlock(&e->mu);
}
