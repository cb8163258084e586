/* model: internal layout of an open model (plan + backend + arena + KV pool) and of a
 * sequence. The public face is runtime/include/inferrt.h. */
#ifndef IRT_MODEL_H
#define IRT_MODEL_H

#include "backend.h"
#include "inferrt.h"
#include "ir_plan.h"
#include "kv_cache.h"
#include "tokenizer.h"

typedef struct model_preload model_preload;

struct irt_model {
  irt_log_fn log; /* irt_model_opts.log / log_user */
  void *log_user;
  ir_plan *plan;
  const ir_graph *g;
  rt_backend be;
  void *arena;
  void **ptrs; /* (n_tensors) address of every tensor */
  kv_cache kv;
  irt_model_info info;
  int32_t in_tokens, in_positions, in_logit_rows, out_logits; /* tensor indices */
  int64_t max_blocks; /* blocks one sequence may hold: ceil(context / block_size) */
  /* step scratch, sized for the step limits at open */
  int32_t *tok_seq, *tok_pos, *block_tables;
  /* roles: the plan has matmuls whose prompt rows and generated rows take different kernels
   * (act_bf16 over block weights, model_step.tok_gen); tok_gen (max_tokens) per step row */
  bool roles;
  uint8_t *tok_gen;
  /* device backends (be.ops->run_step set): host copies of the tokens and logit_rows
   * inputs, and a KV block held by no sequence that padding tokens write to */
  int32_t *h_tokens, *h_rows;
  int32_t pad_block;
  /* picks: on the device (dev_pick: the backend has the kernel), else through h_row */
  bool dev_pick;
  pick_req *h_pick;     /* (max_logits) */
  pick_res *h_pick_res; /* (max_logits) */
  pick_res *h_pick_top; /* (max_logits, PICK_TOP) */
  float *h_row;         /* (vocab) */
  float *h_pen;         /* (vocab) a host pick's row with its penalties */
  int32_t *h_pen_ids;   /* (pen_cap) the step's penalties for the device */
  float *h_pen_sub;
  int pen_cap;
  irt_tokenizer *tok; /* from the plan, or NULL */
  /* tensor parallelism (tp > 1): this rank's collectives; rank 0 sends each step (and the
   * KV block copies made since the last one) to the others before running it */
  int tp;
  irt_comm comm;
  backend_comm bcomm;
  bool tp_live;    /* the ranks are in step: rank 0's close tells them to stop */
  int32_t *tp_msg; /* a step message (tp_msg_cap int32) */
  int64_t tp_msg_cap;
  int32_t *tp_copies; /* (src, dst) pairs of KV block copies not yet sent */
  int64_t n_tp_copies, tp_copies_cap;
  bool tp_copies_lost;      /* a copy could not be recorded: the ranks' caches differ */
  bool tp_broken;           /* a step failed midway: the ranks are out of step for good */
  irt_kv_event_fn kv_event; /* irt_model_set_kv_events */
  void *kv_event_user;
  model_preload *preload; /* a background preload still running, or NULL */
};

struct irt_seq {
  irt_model *m;
  int64_t len;        /* tokens whose KV is cached */
  int64_t prompt_len; /* positions from here on hold generated tokens (irt_seq_set_prompt_len) */
  int32_t *blocks;    /* (max_blocks) physical block ids; first ceil(len/bs) valid */
  int64_t n_blocks;
};

/* The internal status as the public one (status.c: the only conversion). */
irt_status rt_status_from_ir(ir_status s);
/* Fills err (if non-NULL) from d; returns d's status as the public one. */
irt_status rt_error_from_diag(irt_error *err, const ir_diag *d);
/* A pick on the host (step.c): the sampler's own function on the row less the penalties,
 * the logprob and alternatives of the row itself. The engine's rows go through it too. */
void pick_row(irt_model *m, irt_pick *p, const float *row);
/* Tensor parallelism (tp.c): checks the plan's ranks against opts->comm and, for a
 * tensor-parallel plan, joins the ranks (their KV caches must agree); rank 0 sends a step
 * before running it; rank 0's close stops the others. */
ir_status tp_open(irt_model *m, const irt_model_opts *o, ir_diag *d);
ir_status tp_send_step(irt_model *m, const model_step *st, ir_diag *d);
/* Rank 0: a step failed after it was sent (the comm's abort, or no later step). */
void tp_step_failed(irt_model *m);
void tp_close(irt_model *m);
/* preload.c: the weights read in (irt_model_opts.preload; nothing for a device backend).
 * WAIT reads them before returning NULL; BACKGROUND returns the running reader, which
 * model_preload_stop ends (at close). */
model_preload *model_preload_start(irt_model *m, irt_preload mode);
void model_preload_stop(model_preload *pl);
/* The tokenizer stored in a plan (*out NULL if none). */
ir_status model_plan_tokenizer(const ir_plan *p, irt_tokenizer **out, ir_diag *d);

#endif
