/* inferrt.h: the public C API of the inferrt runtime.
 *
 * A model is opened from a plan file (mmap'd; weights used in place on CPU). A sequence
 * holds one stream of tokens and its KV cache blocks. Decoding runs the model over a
 * flat batch of tokens from one or more sequences in one step and returns logits.
 * Sampling turns logits into a token.
 *
 * Ownership: objects returned through out-parameters of *_open / *_create are owned by
 * the caller and released by the matching *_close / *_destroy, which accept NULL.
 * Thread-safety: a model and its sequences are used from one thread at a time; the
 * model's own worker threads are internal.
 * Determinism: CPU kernels are batch-invariant: a token's logits are bit-identical
 * whether its sequence runs alone or with others, and however a prompt is chunked. */
#ifndef INFERRT_H
#define INFERRT_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IRT_VERSION INFC_VERSION

typedef enum irt_status {
  IRT_OK = 0,
  IRT_INVALID_ARG,
  IRT_IO,
  IRT_BAD_FORMAT,
  IRT_VERSION_MISMATCH,
  IRT_OOM,
  IRT_UNSUPPORTED,
  IRT_DEVICE,
} irt_status;

/* Filled on failure with a one-line message naming the problem. */
typedef struct irt_error {
  irt_status status;
  char msg[512];
} irt_error;

typedef struct irt_model irt_model;
typedef struct irt_seq irt_seq;
typedef struct irt_sampler irt_sampler;

typedef struct irt_model_opts {
  int n_threads;       /* <= 0: all online cores */
  int64_t kv_tokens;   /* KV cache capacity in tokens over all sequences; <= 0: the
                          model's context length */
  bool skip_weight_checksum; /* verify only header and metadata checksums (fast open) */
} irt_model_opts;

typedef struct irt_model_info {
  const char *arch;
  int64_t vocab_size;
  int64_t context_length;  /* positions the plan supports */
  int64_t n_layers;
  int64_t hidden_size;
  int64_t bos_token_id;    /* -1 if none */
  int64_t eos_token_id;    /* -1 if none */
  int64_t max_step_tokens; /* T limit of one step */
  int64_t max_step_seqs;   /* S limit of one step */
  int64_t max_step_logits; /* L limit of one step */
  uint64_t weight_bytes;
  uint64_t arena_bytes;
  uint64_t kv_bytes;
} irt_model_info;

irt_model_opts irt_model_opts_default(void);
irt_status irt_model_open(const char *plan_path, const irt_model_opts *opts, irt_model **out,
                          irt_error *err);
void irt_model_close(irt_model *m);
/* Borrowed; valid while the model is open. */
const irt_model_info *irt_model_get_info(const irt_model *m);

/* A sequence starts empty; its KV blocks return to the pool on destroy. */
irt_status irt_seq_create(irt_model *m, irt_seq **out, irt_error *err);
void irt_seq_destroy(irt_seq *s);
int64_t irt_seq_length(const irt_seq *s);

/* One entry of a flat step batch: append `n` tokens to `seq`, and write the logits of
 * its last token (all_logits=false: logits is (vocab)) or of every appended token
 * (all_logits=true: logits is (n, vocab)) unless logits is NULL. A sequence appears at
 * most once per batch. */
typedef struct irt_batch_item {
  irt_seq *seq;
  const int32_t *tokens;
  int64_t n;
  float *logits;
  bool all_logits;
} irt_batch_item;

/* Runs one step over all items. The batch must fit the step limits (sum of n <=
 * max_step_tokens, items <= max_step_seqs, logit rows <= max_step_logits) and every
 * sequence must stay within the context length; the KV pool must have room. On error
 * no sequence changes. */
irt_status irt_decode_batch(irt_model *m, const irt_batch_item *items, int n_items,
                            irt_error *err);

/* Convenience: appends any number of tokens to one sequence, splitting them into steps
 * as the limits require. logits as in irt_batch_item. */
irt_status irt_seq_decode(irt_model *m, irt_seq *s, const int32_t *tokens, int64_t n,
                          float *logits, bool all_logits, irt_error *err);

typedef struct irt_sampling {
  float temperature; /* <= 0: greedy (argmax, lowest id on ties) */
  int top_k;         /* <= 0: no limit */
  float top_p;       /* >= 1: no limit */
  uint64_t seed;
} irt_sampling;

irt_sampling irt_sampling_default(void); /* greedy */
irt_status irt_sampler_create(const irt_sampling *p, int64_t vocab_size, irt_sampler **out,
                              irt_error *err);
void irt_sampler_destroy(irt_sampler *s);
/* Picks the next token from logits (vocab_size values). Allocation-free. */
int32_t irt_sampler_sample(irt_sampler *s, const float *logits);

const char *irt_status_name(irt_status s);

#ifdef __cplusplus
}
#endif

#endif
