/* engine: internal state of the continuous-batching engine (public API in inferrt.h).
 * engine.c: lifecycle, submission, cancellation, threads, stats.
 * sched.c: one iteration: choose the step batch, run it, sample, emit events. */
#ifndef IRT_ENGINE_H
#define IRT_ENGINE_H

#include <pthread.h>

#include "grammar.h"
#include "model.h"

/* Whether drafts pay (spec.c): a step of T tokens takes about a + b T ms, fitted by least
 * squares over the recent steps of decode size (each older step weighs STEP_COST_DECAY
 * times less), so a draft row costs b ms; it is worth it while the chance it is kept, over
 * b, is at least the tokens per ms of the step so far. */
#define STEP_COST_DECAY 0.97
typedef struct step_cost {
  double w, t, tt, y, ty; /* decayed sums of 1, T, T^2, ms, T ms */
} step_cost;
void step_cost_add(step_cost *c, double tokens, double ms);
/* The fit's a (at least 0) and b; false while it cannot tell them apart (too few steps,
 * nearly one size of step) or b <= 0. */
bool step_cost_fit(const step_cost *c, double *a, double *b);
/* Drafts worth adding to a step of *tokens tokens worth *value (tokens processed, plus the
 * chance each draft added so far is kept), up to cap, for a sequence whose drafts are each
 * kept (given the ones before are) with probability alpha, when a draft costs c ms more
 * than its row (a draft model's own step; 0 for prompt lookup), *extra ms of which the
 * step's drafts so far have added: draft j while alpha^j (a + b tokens + extra) >=
 * (b + c) value. Updates *tokens, *extra and *value by the drafts taken. */
int spec_worth(double alpha, double a, double b, double c, double *tokens, double *extra,
               double *value, int cap);
/* Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): a token x drawn from the
 * draft's distribution q is kept with probability min(1, p[x] / q[x]), p the target's
 * (u uniform in [0, 1); greedy: u = 0, so x is kept iff p[x] > 0); after a rejection the
 * token is drawn from norm(max(0, p - q)) with u, ids in ascending order. The tokens
 * that come out are distributed as p, whatever q is. */
bool spec_keep(double p_x, double q_x, double u);
int32_t spec_residual(const float *p, const float *q, int64_t vocab, double u);

/* FORKING: a completion of an n > 1 request created for its first token's pick, its
 * blocks shared once the prompt's last step has run (sched.c's fork_completions). */
typedef enum eseq_state {
  ESEQ_WAITING = 0,
  ESEQ_RUNNING = 1,
  ESEQ_DONE = 2,
  ESEQ_FORKING = 3,
} eseq_state;

typedef struct ereq ereq;

/* One completion stream: its tokens, KV blocks (through an irt_seq) and sampler. */
typedef struct eseq {
  ereq *req;
  int index;
  eseq_state state;
  irt_seq *kv;      /* blocks and the count of positions already computed */
  int32_t *tokens;  /* (context) prompt then generated tokens */
  int64_t n_tokens; /* known tokens */
  int64_t n_generated;
  int64_t n_registered; /* leading full blocks registered in the prefix cache */
  uint64_t last_hash;   /* chain hash of block n_registered - 1 (0 if none) */
  irt_sampler *sampler;
  tok_stream stream; /* when the plan has a tokenizer */
  char *held;        /* text not yet emitted (a possible stop-string prefix) */
  size_t held_len, held_cap;
  uint64_t admit_order; /* when it last entered the running set */
  irt_finish finish;
  double first_token_ms;
  int spec_len;                /* drafts to propose next: all kept doubles it (up to spec_tokens),
                             a rejection sets it to the kept count + 1 */
  float spec_hits, spec_tries; /* its drafts kept and checked, older ones decayed */
  int spec_idle;               /* steps in a row its drafts were weighed out */
  /* with a draft model (irt_engine_opts.draft): the draft's KV of this completion (the
   * positions it has computed, a prefix of tokens) and its own generator for drafts */
  irt_seq *dkv;
  irt_sampler *dsampler;
  int64_t d_registered; /* leading full blocks of dkv registered in the draft's prefix cache */
  uint64_t d_last_hash; /* chain hash of block d_registered - 1 (0 if none) */
  /* with presence/frequency penalties (allocated at init, so sampling stays allocation-free) */
  int32_t *counts;  /* (vocab) occurrences of each token this completion generated */
  int32_t *seen;    /* (vocab) the distinct generated tokens, first seen first */
  float *pen_sub;   /* (vocab) a pick's penalty for each of them (and biased ones) */
  int32_t *pen_ids; /* (vocab) with logit_bias too: seen, then the biased unseen */
  int64_t n_seen;
  gram_state *gram; /* with a grammar: where its text is in it */
  int64_t plp_next; /* prompt_logprobs: the next prompt position to score */
  /* with top_logprobs: the alternatives of the current event */
  int32_t top_ids[IRT_MAX_TOP_LOGPROBS];
  float top_lps[IRT_MAX_TOP_LOGPROBS];
} eseq;

struct ereq {
  irt_request_id id;
  irt_request r; /* stop strings and tenant point into owned copies */
  char **stops;
  char *tenant;
  uint64_t tenant_hash;
  int32_t *prompt;
  int64_t n_prompt;
  int32_t *bias_ids; /* logit_bias: (n_bias) ids, ascending */
  float *bias_sub;   /* (n_bias) minus each bias: subtracted, as penalties are */
  int n_bias;
  gram *grammar;     /* compiled irt_request.grammar, or NULL */
  int32_t *stop_ids; /* stop_token_ids: (n_stop_ids) */
  int n_stop_ids;
  bool host_pick; /* repetition_penalty or min_tokens: rows picked on the host */
  int64_t cached_tokens;
  int n;
  eseq *seqs;  /* (n); only seqs[0] exists until the prompt is prefilled */
  int n_live;  /* seqs created so far */
  bool forked; /* n > 1: the completions share the prompt's blocks */
  int n_done;
  bool unqueued; /* its last event went out: no longer counted against max_waiting */
  bool cancelled;
  bool counted; /* prompt tokens entered the stats */
  uint64_t arrival;
  ereq *next; /* engine list links */
};

struct irt_engine {
  irt_model *m;
  const irt_tokenizer *tok;
  irt_engine_opts o;
  int64_t budget, max_running;
  ereq *reqs; /* every unfinished request, in arrival order */
  /* the inbox: submissions and cancellations from other threads */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ereq *inbox_head, *inbox_tail;
  irt_request_id *cancels;
  int n_cancels, cap_cancels;
  int64_t n_queued; /* requests in the inbox or waiting */
  irt_request_id next_id;
  uint64_t next_arrival, next_admit;
  bool thread_running, stop;
  pthread_t thread;
  irt_engine_stats stats; /* published under mu at the end of each iteration */
  irt_engine_stats work;  /* updated by the stepping thread */
  irt_error last_err;     /* the last failed step on the engine thread */
  /* step scratch, sized at create */
  irt_batch_item *items;
  eseq **item_seq;
  bool *item_plp;   /* (max_running) the item is a prompt chunk scored row by row */
  float *logits;    /* (max_rows, vocab): the step's rows, as items ask for them */
  int64_t max_rows; /* the plan's logit rows per step */
  int64_t rows_now; /* rows taken so far in this iteration */
  irt_pick *picks;  /* (max_running) */
  /* drafted rows picked in the step (sequences without penalties): (max_rows) picks and
   * their alternatives, IRT_MAX_TOP_LOGPROBS each */
  irt_pick *row_picks;
  int32_t *row_top_ids;
  float *row_top_lps;
  int64_t row_picks_now; /* taken so far in this iteration */
  /* constrained decoding (the plan has a tokenizer): the vocabulary's bytes, and scratch
   * for one masked pick: the allowed tokens, the pick's penalty list with the rest */
  gram_trie *gtrie;
  uint8_t *gmask;    /* (vocab) */
  int32_t *gpen_ids; /* (vocab) */
  float *gpen_sub;   /* (vocab) */
  /* repetition_penalty and min_tokens on the host: one pick's subtractions by token (zero
   * between picks), which tokens it lists, the list; end-of-generation ids */
  float *xsub;       /* (vocab) */
  uint8_t *xmark;    /* (vocab) */
  int32_t *xpen_ids; /* (vocab) */
  float *xpen_sub;   /* (vocab) */
  int32_t *eog_ids;
  int n_eog;
  /* speculative decoding: the step cost model over decode-only steps, its last fit */
  step_cost cost;
  double cost_a, cost_b;
  bool cost_ok;
  /* a draft model: the step's drafting sequences (slots), their items, each slot's last
   * draft row and distributions (dslots x spec_tokens rows of q), a row's penalized copy
   * and the target's distribution of it; the draft's cost per drafted token (ms, decayed) */
  int dslots;
  int *item_dslot; /* (max_running) the item's slot, -1 if none */
  eseq **dseq;
  irt_batch_item *ditems;
  int *dcap, *dn, *dmap;
  int64_t *dpend;
  float *dlog, *dq, *adj, *prow;
  double dcost_ms, dcost_tokens;
  eseq **run, **wait; /* sorted candidates of one iteration (grown as needed) */
  int cap_cand;
  int n_items_now; /* items chosen so far in this iteration */
};

irt_status eseq_init(irt_engine *e, ereq *q, int i, irt_error *err);
void eng_drain_inbox(irt_engine *e);
void eng_reap(irt_engine *e);
/* Ends every unfinished completion of cancelled requests (sched.c). */
void eng_cancel_all(irt_engine *e);
/* One scheduling iteration (sched.c). */
irt_status eng_iterate(irt_engine *e, bool *out_busy, irt_error *err);
/* Releases a sequence's KV blocks and sampler (engine.c). */
void eseq_release(irt_engine *e, eseq *s);
/* Emits the final event of a completion and retires the request when all are done. */
void eseq_finish(irt_engine *e, eseq *s, irt_finish why);
double eng_now_ms(void);

#endif
