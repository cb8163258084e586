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
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
  IRT_BUSY,        /* the engine's queue is full: retry later */
  IRT_STATUS_COUNT /* not a status: the number of them */
} irt_status;

/* Filled on failure with a one-line message naming the problem. */
typedef struct irt_error {
  irt_status status;
  char msg[512];
} irt_error;

/* What the library has to say outside a call's result: warnings (a decode batch that runs
 * without its CUDA Graph) and reports asked for (the CUDA profile). The library never
 * prints; a caller that wants these gives a log function in irt_model_opts. */
typedef enum irt_log_level { IRT_LOG_ERROR = 0, IRT_LOG_WARN = 1, IRT_LOG_INFO = 2 } irt_log_level;
/* msg is one line without its newline, valid during the call. Called on the thread that
 * met it (an engine's step, irt_model_close). */
typedef void (*irt_log_fn)(void *user, irt_log_level level, const char *msg);

typedef struct irt_model irt_model;
typedef struct irt_seq irt_seq;
typedef struct irt_sampler irt_sampler;

typedef enum irt_kv_dtype {
  IRT_KV_DTYPE_F32 = 0, /* the default */
  IRT_KV_DTYPE_INT8 = 1,
  IRT_KV_DTYPE_F16 = 2,
} irt_kv_dtype;

/* "f32" / "f16" / "int8" to the enum; false for anything else. */
bool irt_kv_dtype_parse(const char *s, irt_kv_dtype *out);
const char *irt_kv_dtype_name(irt_kv_dtype t);
/* KV cache bytes per token of an open model's geometry with dtype t (all layers, K and V,
 * scales included). */
uint64_t irt_model_kv_token_bytes(const irt_model *m, irt_kv_dtype t);

/* Tensor parallelism: a plan built with `infc build --tp N` runs as N processes, one per
 * rank, each opening the plan with the collectives below (the application's transport: the
 * inferrt CLI uses MPI). Rank 0 is the model the application uses (sequences, steps, the
 * engine); ranks 1.. call irt_model_follow, which runs every step rank 0 runs until rank 0
 * closes its model. Each function returns 0, or nonzero when the transport failed (the
 * step then fails with IRT_IO); they are called on the thread that steps the model, one at
 * a time, in the same order on every rank. */
typedef struct irt_comm {
  int rank, size;
  void *ctx;
  /* buf (n floats) becomes the sum over the ranks of each one's buf */
  int (*all_reduce_sum_f32)(void *ctx, float *buf, size_t n);
  /* recv (size * bytes) becomes every rank's send (bytes), in rank order */
  int (*all_gather)(void *ctx, const void *send, size_t bytes, void *recv);
  /* buf (bytes) becomes rank root's buf on every rank */
  int (*broadcast)(void *ctx, void *buf, size_t bytes, int root);
  /* Optional: ends every rank (MPI_Abort). Called when a step failed after the ranks began
   * it, so that they can no longer meet; without it the model refuses every later step. */
  void (*abort)(void *ctx, int code);
} irt_comm;

typedef enum irt_preload {
  IRT_PRELOAD_OFF = 0,
  IRT_PRELOAD_BACKGROUND = 1,
  IRT_PRELOAD_WAIT = 2,
} irt_preload;

typedef struct irt_model_opts {
  int n_threads;     /* <= 0: all online cores */
  int64_t kv_tokens; /* KV cache capacity in tokens over all sequences; <= 0: the
                          model's context length */
  /* Default true: open checks the header, the metadata checksum and every offset and size,
   * but does not hash the weights section (that would read every weight page before the
   * first token; what serving engines skip). false: hash it too and refuse a mismatch.
   * irt_plan_verify / `inferrt verify` / `infc inspect` check a plan on demand. */
  bool skip_weight_checksum;
  /* Where to run: NULL or "auto" follows the plan's target (a CUDA plan runs on the GPU),
   * "cpu" runs any plan on the CPU, "cuda" needs a CUDA plan and a GPU. The CUDA backend
   * (libinferrt_cuda.so) is loaded only then. */
  const char *device;
  int cuda_device;     /* CUDA device ordinal (default 0) */
  bool no_cuda_graphs; /* CUDA: run decode steps kernel by kernel, not as captured graphs */
  /* Element type of the KV cache. IRT_KV_DTYPE_F16 (CPU only) halves the bytes attention
   * reads per token (values rounded to f16 as written). IRT_KV_DTYPE_INT8 (CPU only) stores
   * int8 values with one f32 scale per (token, kv head): about 3.5-4x the tokens per byte
   * of f32. Either way each token's cached values depend on that token alone (batch
   * invariance holds). */
  irt_kv_dtype kv_dtype;
  irt_log_fn log; /* NULL: messages are dropped */
  void *log_user;
  /* CUDA tuning (the inferrt CLIs' --cuda-* flags; their environment variables are the
   * flags' defaults there, never read by the library). */
  bool cuda_profile;           /* time every node of every step (eagerly: no graphs) and
                                   log the table (IRT_LOG_INFO) at irt_model_close */
  int64_t cuda_dequant_gemm_m; /* rows from which block-quantized weights are dequantized
                                   for cuBLAS: 0 the default (32), < 0 never */
  const char *cuda_lib;        /* libinferrt_cuda.so to load; NULL: beside the executable
                                   (or ../lib), then the library search path */
  /* A tensor-parallel plan's collectives (NULL: one process; such a plan is refused); the
   * struct is borrowed until irt_model_close. */
  const irt_comm *comm;
  /* CPU: read the plan's weights into memory at open instead of at the first steps that
   * touch them (a cold 8B bf16 plan is seconds of page faults on the first request).
   * IRT_PRELOAD_BACKGROUND starts a thread and returns at once; IRT_PRELOAD_WAIT returns
   * once every weight page is resident (read by several threads). The CUDA backend copies
   * the weights to the device at open anyway. */
  irt_preload preload;
  /* CUDA, sm_90+: launch a step's kernels without programmatic dependent launch (each
   * kernel then starts only once its predecessor has finished; to compare). */
  bool no_cuda_pdl;
} irt_model_opts;

typedef struct irt_model_info {
  const char *arch;
  int64_t vocab_size;
  int64_t context_length; /* positions the plan supports */
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
  int64_t kv_tokens;                     /* KV pool capacity in tokens (whole blocks) */
  const char *kv_dtype;                  /* "f32" or "int8" */
  const char *device;                    /* the backend running the model: "cpu" or "cuda" */
  int64_t n_heads, n_kv_heads, head_dim; /* attention geometry (0 for generic graphs); a
                                            tensor-parallel plan's are one rank's */
  int tp_size;                           /* tensor-parallel ranks (1: one process) */
} irt_model_info;

irt_model_opts irt_model_opts_default(void);
irt_status irt_model_open(const char *plan_path, const irt_model_opts *opts, irt_model **out,
                          irt_error *err);
/* Closes the model; rank 0 of a tensor-parallel plan first ends the other ranks'
 * irt_model_follow. */
void irt_model_close(irt_model *m);
/* Ranks 1.. of a tensor-parallel plan: runs each step rank 0 runs, on this rank's shard,
 * until rank 0 closes its model (IRT_OK) or a step or the transport fails. */
irt_status irt_model_follow(irt_model *m, irt_error *err);
/* Prefix-cache events, for KV-aware routers (`inferrt serve --kv-events` publishes them in
 * vLLM's KV-events format): a full block entering the cache under its chain hash (its
 * parent's hash, 0 for a sequence's first block, and its tokens), or leaving it (evicted to
 * make room). */
typedef enum irt_kv_event_kind {
  IRT_KV_BLOCK_STORED = 1,
  IRT_KV_BLOCK_REMOVED = 2,
} irt_kv_event_kind;

typedef struct irt_kv_event {
  irt_kv_event_kind kind;
  uint64_t block_hash;
  uint64_t parent_hash;  /* stored: the previous block's hash, 0 for a first block */
  const int32_t *tokens; /* stored: the block's block_size tokens (borrowed for the call) */
  int64_t block_size;
} irt_kv_event;

typedef void (*irt_kv_event_fn)(void *user, const irt_kv_event *ev);
/* fn is called, on the thread that steps the model (it must not block), for every block the
 * prefix cache stores or evicts; NULL stops it. Set it before steps run. */
void irt_model_set_kv_events(irt_model *m, irt_kv_event_fn fn, void *user);

/* Checks every checksum of a plan (header, metadata, weights, kernels) and its offsets,
 * without building a model: IRT_OK, or IRT_BAD_FORMAT / IRT_VERSION_MISMATCH / IRT_IO
 * with a message naming the problem. */
irt_status irt_plan_verify(const char *plan_path, irt_error *err);
/* The tensor-parallel ranks a plan is built for (1: one process), from its metadata. */
irt_status irt_plan_tp_size(const char *plan_path, int *out, irt_error *err);
/* Borrowed; valid while the model is open. */
const irt_model_info *irt_model_get_info(const irt_model *m);

/* A sequence starts empty; its KV blocks return to the pool on destroy. */
irt_status irt_seq_create(irt_model *m, irt_seq **out, irt_error *err);
void irt_seq_destroy(irt_seq *s);
int64_t irt_seq_length(const irt_seq *s);
/* Positions [0, n) of s hold its prompt, the positions from n on tokens the model generated
 * (a new sequence: all prompt). A plan may run the two kinds of row on different kernels:
 * one built with --act-dtype bf16 multiplies a prompt's rows by block weights converted to
 * bf16 a tile at a time (prefill's speed) and generated rows with int8 activations (decode's
 * speed). A row's logits then depend on its kind, never on what else shares the step; the
 * engine marks every sequence, so recomputing one after preemption, or finding it in the
 * prefix cache, gives the same bits. */
void irt_seq_set_prompt_len(irt_seq *s, int64_t n);
/* Forgets every position from len on (no-op if len > the length) and gives back the
 * blocks past it: after a step that checked draft tokens, the rejected ones. The next
 * step writes from len on. */
void irt_seq_truncate(irt_seq *s, int64_t len);
/* Drafts by prompt lookup: finds the latest earlier occurrence of the last g tokens of
 * tokens[0, n), g from ngram_max down to ngram_min (0: IRT_SPEC_NGRAM_MIN, and the larger
 * of that and IRT_SPEC_NGRAM_MAX), and copies the up to `cap` tokens that followed it to
 * tokens[n, n + cap) (room the caller provides). Returns how many; 0 when none recurs. */
int irt_prompt_lookup(int32_t *tokens, int64_t n, int ngram_min, int ngram_max, int cap);

/* A token the step chooses itself (irt_batch_item.pick). Zero it, then set the sampler
 * (and what else is wanted). */
typedef struct irt_pick {
  irt_sampler *sampler; /* its settings, and one draw of its generator if temperature > 0 */
  int32_t token;        /* out: irt_sampler_sample's token for the row */
  float logprob;        /* out: the token's log-softmax under the row's logits */
  int n_top;            /* alternatives wanted, 0..20 (IRT_MAX_TOP_LOGPROBS): */
  int32_t *top_ids;     /* out (n_top): the most likely tokens, most likely first (lower */
  float *top_logprobs;  /* id first among equals), and their log-softmax */
  /* Penalties: the sampler sees logit pen_ids[j] less pen_sub[j] (distinct ids), the
   * logprobs stay those of the row as it is. */
  const int32_t *pen_ids;
  const float *pen_sub;
  int n_pen;
  /* 0: the pick takes the generator's next draw and moves it on (irt_sampler_sample).
   * d > 0: it takes draw d - 1 counted from the next one and leaves the generator where
   * it is -- the rows of drafted tokens, one pick each, before it is known how many
   * count; irt_sampler_skip then moves the generator past the draws that did. */
  int draw;
} irt_pick;

/* One entry of a flat step batch: append `n` tokens to `seq`, and write the logits of
 * its last token (all_logits=false: logits is (vocab)) or of every appended token
 * (all_logits=true: logits is (n, vocab)) unless logits is NULL, or pick the next token
 * (pick; with all_logits, one pick per appended token: pick[j] from token j's row). A
 * sequence appears at most once per batch. */
typedef struct irt_batch_item {
  irt_seq *seq;
  const int32_t *tokens;
  int64_t n;
  float *logits;
  bool all_logits;
  /* Instead of logits (which must then be NULL): the step chooses the token after the
   * last one itself. On a device backend the row never leaves the device. With
   * all_logits, pick holds n picks, one per appended token's row; without, n_picks picks
   * (0 counts as 1) of the last token's row -- the completions of one prompt, each with
   * its own sampler. A step holds at most max_step_logits picks. */
  irt_pick *pick;
  int n_picks;
} irt_batch_item;

/* Runs one step over all items. The batch must fit the step limits (sum of n <=
 * max_step_tokens, items <= max_step_seqs, logit rows <= max_step_logits) and every
 * sequence must stay within the context length; the KV pool must have room. On error
 * no sequence changes. */
irt_status irt_decode_batch(irt_model *m, const irt_batch_item *items, int n_items, irt_error *err);

/* Convenience: appends any number of tokens to one sequence, splitting them into steps
 * as the limits require. logits as in irt_batch_item. */
irt_status irt_seq_decode(irt_model *m, irt_seq *s, const int32_t *tokens, int64_t n, float *logits,
                          bool all_logits, irt_error *err);

typedef struct irt_sampling {
  float temperature; /* <= 0: greedy (argmax, lowest id on ties) */
  int top_k;         /* <= 0: no limit */
  float top_p;       /* >= 1: no limit */
  uint64_t seed;
  float min_p; /* in [0, 1]; 0: off. Drops candidates whose probability (after the
                        temperature) is under min_p times the likeliest one's, after top_k
                        and before top_p */
} irt_sampling;

irt_sampling irt_sampling_default(void); /* greedy */
irt_status irt_sampler_create(const irt_sampling *p, int64_t vocab_size, irt_sampler **out,
                              irt_error *err);
void irt_sampler_destroy(irt_sampler *s);
/* Picks the next token from logits (vocab_size values). Allocation-free. */
int32_t irt_sampler_sample(irt_sampler *s, const float *logits);
/* Moves the generator past n draws, as n samples would (none when temperature <= 0: a
 * greedy sampler draws nothing). */
void irt_sampler_skip(irt_sampler *s, int64_t n);

/* --- text ------------------------------------------------------------------------------- */

typedef struct irt_tokenizer irt_tokenizer;
typedef struct irt_text_stream irt_text_stream;

/* The plan's tokenizer (borrowed; valid while the model is open), or NULL if the plan was
 * built without one. */
const irt_tokenizer *irt_model_get_tokenizer(const irt_model *m);

/* A tokenizer read from an HF tokenizer.json (+ tokenizer_config.json if not NULL), or
 * from a plan file. Owned by the caller (irt_tokenizer_destroy). */
irt_status irt_tokenizer_open_json(const char *tokenizer_json, const char *tokenizer_config,
                                   irt_tokenizer **out, irt_error *err);
irt_status irt_tokenizer_open_plan(const char *plan_path, irt_tokenizer **out, irt_error *err);
/* The tokenizer a .gguf file carries (tokenizer.ggml.* metadata). */
irt_status irt_tokenizer_open_gguf(const char *gguf_path, irt_tokenizer **out, irt_error *err);
void irt_tokenizer_destroy(irt_tokenizer *t);

/* Text to ids (see text/tokenizer.h for add_special / parse_special). Writes at most
 * cap ids; *out_n is the full count. Invalid UTF-8 is IRT_INVALID_ARG. */
irt_status irt_tokenize(const irt_tokenizer *t, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *ids, size_t cap, size_t *out_n,
                        irt_error *err);
/* irt_tokenize into *ids, allocated to the full count (free it). */
irt_status irt_tokenize_alloc(const irt_tokenizer *t, const char *text, size_t len,
                              bool add_special, bool parse_special, int32_t **ids, size_t *out_n,
                              irt_error *err);
/* Ids to text; writes at most cap bytes (no NUL); *out_len is the full length. */
irt_status irt_detokenize(const irt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                          char *buf, size_t cap, size_t *out_len, irt_error *err);
/* irt_detokenize into *out, allocated (free it) and NUL-terminated; *out_len its length. */
irt_status irt_detokenize_alloc(const irt_tokenizer *t, const int32_t *ids, size_t n,
                                bool skip_special, char **out, size_t *out_len, irt_error *err);
/* True for the end-of-generation tokens (EOS and e.g. <|im_end|>, <|eot_id|>). */
bool irt_token_is_eog(const irt_tokenizer *t, int32_t id);
int32_t irt_tokenizer_vocab_size(const irt_tokenizer *t);

/* Streaming detokenizer: text comes out in whole UTF-8 characters only. */
irt_status irt_text_stream_create(const irt_tokenizer *t, bool skip_special, irt_text_stream **out,
                                  irt_error *err);
void irt_text_stream_destroy(irt_text_stream *s);
/* Appends the text completed by `id` to buf (at most cap bytes); returns its length. */
size_t irt_text_stream_push(irt_text_stream *s, int32_t id, char *buf, size_t cap);
size_t irt_text_stream_finish(irt_text_stream *s, char *buf, size_t cap);

typedef struct irt_chat_message {
  const char *role; /* "system", "user", "assistant" */
  const char *content;
  const char *reasoning; /* an assistant turn's thoughts apart from content (the API's
                            reasoning_content), or NULL; only thinking templates (qwen3)
                            write them */
} irt_chat_message;

/* Renders a conversation with the tokenizer's chat template, or with the named family
 * (template_name: chatml, qwen3, deepseek-r1, llama3, llama3.1, mistral, llama2, gemma,
 * phi3) when not NULL. Writes at most cap bytes plus a NUL; *out_len is the full length. */
irt_status irt_chat_format(const irt_tokenizer *t, const char *template_name,
                           const irt_chat_message *msgs, size_t n, bool add_generation_prompt,
                           char *buf, size_t cap, size_t *out_len, irt_error *err);

/* What else a rendering may be asked for: tools offered (see irt_chat_format_tools), and a
 * thinking template's enable_thinking false (the new turn opens with an empty thought). */
typedef struct irt_chat_opts {
  bool tools;
  bool no_thinking;
} irt_chat_opts;
irt_status irt_chat_format_opts(const irt_tokenizer *t, const char *template_name,
                                const irt_chat_message *msgs, size_t n, bool add_generation_prompt,
                                const irt_chat_opts *opts, char *buf, size_t cap, size_t *out_len,
                                irt_error *err);

/* The ids of a conversation as irt_chat_format_opts renders it, tokenized so that special
 * tokens come from the template alone: inside the messages' own text (content, thoughts) a
 * special token's spelling is text, as OpenAI's API treats it, so no client can forge a
 * system turn or a tool result with "<|im_end|>\n<|im_start|>system". Non-special added
 * tokens (Hermes' <tool_call>) match everywhere, as in HF. allow_special_in_content restores
 * the parse-everything behaviour (vLLM's and llama.cpp's). *ids is allocated (free it);
 * *text, when text is not NULL, the rendered prompt (free it). */
irt_status irt_chat_tokenize(const irt_tokenizer *t, const char *template_name,
                             const irt_chat_message *msgs, size_t n, bool add_generation_prompt,
                             const irt_chat_opts *opts, bool allow_special_in_content,
                             int32_t **ids, size_t *n_ids, char **text, irt_error *err);

/* What a conversation's rendering depends on: the template family, the system prompt the
 * template writes when a conversation has none ("" if it writes none), and whether the
 * model thinks first (its answers open with a <think>...</think> block). */
typedef struct irt_chat_info {
  char family[16]; /* chatml, qwen3, deepseek-r1, llama3, llama3.1, mistral, llama2,
                               gemma, phi3 */
  char default_system[512];
  bool thinks;
} irt_chat_info;
irt_status irt_chat_get_info(const irt_tokenizer *t, const char *template_name, irt_chat_info *out,
                             irt_error *err);
/* irt_chat_format of a conversation that offers tools, which llama3.1 says in its system
 * turn ("Environment: ipython"); the tools, calls and results themselves are the caller's
 * to write into the messages in the family's own form (the server's srv_tools.c). Roles
 * may then also be "ipython" (a tool's result, llama3.1). */
irt_status irt_chat_format_tools(const irt_tokenizer *t, const char *template_name,
                                 const irt_chat_message *msgs, size_t n, bool add_generation_prompt,
                                 char *buf, size_t cap, size_t *out_len, irt_error *err);

/* --- engine: continuous batching over many requests ----------------------------------------
 *
 * The engine schedules requests iteration by iteration over the flat step batch: every
 * step carries the running sequences' next tokens plus prompt chunks of others (chunked
 * prefill) within a token budget. KV blocks are paged and shared: prompts that start with
 * a cached prefix (same tokens, same tenant) skip that prefill, and the n completions of
 * one request share their prompt's blocks (copy-on-write). When blocks run out, the
 * lowest-priority, most recently admitted sequence is preempted and later recomputed;
 * no request is lost. Higher priority classes are scheduled first; within a class,
 * requests run in arrival order.
 *
 * Threading: submit, cancel and stats may be called from any thread. Steps run either on
 * the caller's thread (irt_engine_step / irt_engine_run) or on the engine's own thread
 * (irt_engine_start); callbacks run on the stepping thread and must not block. */

typedef struct irt_engine irt_engine;
typedef uint64_t irt_request_id;

typedef struct irt_engine_opts {
  int64_t max_batched_tokens; /* token budget per step; <= 0: the plan's step limit */
  int64_t max_running;        /* sequences per step; <= 0: the plan's step limit */
  int64_t max_waiting;        /* queued requests before submit says IRT_BUSY; <= 0: 4096 */
  bool disable_prefix_cache;
  bool static_batching; /* baseline: admit a new batch only when the last one is done,
                                 and prefill it whole before decoding */
  /* Speculative decoding by prompt lookup: a decoding sequence whose last spec_ngram_max
   * .. spec_ngram_min tokens occurred earlier in its context proposes the spec_tokens that
   * followed them; one step checks them all (each row picked as a plain step would, so
   * the tokens and their distribution are those of decoding without it) and keeps the
   * matching prefix plus one token. A sequence's next draft is the kept count + 1 after a
   * rejection, twice the last (up to spec_tokens) after none. 0: off; at most
   * IRT_MAX_SPEC_TOKENS. */
  int spec_tokens;
  int spec_ngram_min, spec_ngram_max; /* n-gram sizes tried, longest first; 0: defaults */
  /* By default a sequence drafts only as many tokens as pay for their rows: the engine
   * fits its decode steps' times to a + b x tokens ms and keeps track of how often each
   * sequence's drafts are kept; a draft kept with probability p joins a step while p / b
   * is at least the step's tokens per ms. So drafts fade out where a row costs nearly a
   * token (large batches on a CPU) and stay where rows are almost free. true: draft by
   * the rule above alone, the same drafts on every machine. */
  bool spec_always;
  /* A draft model instead of prompt lookup (borrowed; open until the engine is destroyed):
   * a plan with the target's vocabulary (refused otherwise), its own KV cache. For each
   * decoding sequence it proposes up to spec_tokens tokens, batched across sequences, from
   * its distribution q after the request's own sampling settings (temperature, top-k/p,
   * min-p, presence/frequency penalties, logit_bias); the target checks them in one step
   * and keeps draft x with probability min(1, p(x) / q(x)), p its distribution under the
   * same settings, drawing from norm(max(0, p - q)) after a rejection and from p after K
   * kept: the output is distributed exactly as without drafts (greedy: the same tokens).
   * Requests with a grammar, repetition_penalty or min_tokens decode without drafts. */
  irt_model *draft;
} irt_engine_opts;

#define IRT_MAX_SPEC_TOKENS 16
#define IRT_SPEC_NGRAM_MIN 2 /* the default n-gram sizes of prompt lookup */
#define IRT_SPEC_NGRAM_MAX 4

typedef enum irt_finish {
  IRT_FINISH_NONE = 0,
  IRT_FINISH_LENGTH = 1, /* max_tokens, the context length or the KV pool reached */
  IRT_FINISH_STOP = 2,   /* end-of-generation token or a stop string */
  IRT_FINISH_CANCELLED = 3,
} irt_finish;

/* One generated token of one completion (or its end). Pointers are valid during the
 * callback only. */
typedef struct irt_event {
  irt_request_id id;
  int index;        /* completion index in [0, n) */
  int32_t token;    /* -1 on a final event that carries no token */
  float logprob;    /* log-probability of token under the model's distribution (its
                             raw logits: before penalties, temperature, top-k and top-p) */
  const char *text; /* text this token completed (plan has a tokenizer), else NULL */
  size_t text_len;
  irt_finish finish;     /* != NONE on the last event of this completion */
  bool request_done;     /* every completion of the request has finished */
  int64_t prompt_tokens; /* tokens in the prompt */
  int64_t cached_tokens; /* of which came from the prefix cache */
  /* With irt_request.top_logprobs > 0, on events that carry a token: the n_top most likely
   * tokens at this position (most likely first, lower id first on ties) and their
   * log-probabilities, under the same distribution as logprob. NULL / 0 otherwise. */
  int n_top;
  const int32_t *top_tokens;
  const float *top_logprobs;
  /* With irt_request.prompt_logprobs: an event of a prompt token (positions 1 .. n - 1 of
   * the prompt, in order, all before the first generated token; index 0, no text, no
   * finish): token, logprob and the alternatives as above, under the model's distribution
   * after the tokens before it. */
  bool prompt;
} irt_event;

typedef void (*irt_event_fn)(void *user, const irt_event *ev);

typedef struct irt_request {
  const int32_t *prompt_ids; /* the prompt as ids, or NULL to use prompt_text */
  size_t n_prompt;
  const char *prompt_text; /* tokenized with the plan's tokenizer (special tokens parsed) */
  bool add_special;        /* with prompt_text: add BOS/EOS as the tokenizer says */
  irt_sampling sampling;   /* completion i uses seed + i */
  int64_t max_tokens;      /* <= 0: up to the context length; at most what the context
                                and the whole KV pool leave after the prompt (a prompt
                                the pool cannot hold with one more token is refused) */
  const char *const *stop; /* stop strings (need a tokenizer), copied at submit */
  int n_stop;
  bool include_stop_str; /* the text keeps the stop string that ended it (vLLM's
                                include_stop_str_in_output); else it is cut before it */
  bool ignore_eos;
  int n;              /* completions sharing the prompt; <= 0 means 1 */
  int priority;       /* higher is scheduled first */
  const char *tenant; /* prefix-cache isolation domain; NULL is the shared one */
  irt_event_fn on_event;
  void *user;
  /* OpenAI-style penalties in [-2, 2], applied by the engine to the logits before sampling
   * (the sampler itself never sees them): every token already generated by this completion
   * loses presence_penalty once plus frequency_penalty per occurrence. 0: off. The prompt
   * is not counted. irt_event.logprob stays the model's own distribution. */
  float presence_penalty;
  float frequency_penalty;
  int top_logprobs; /* alternatives per event, 0..IRT_MAX_TOP_LOGPROBS */
  /* OpenAI's logit_bias: logit_bias[j], in [-100, 100], is added to the logit of token
   * logit_bias_ids[j] (distinct ids, at most IRT_MAX_LOGIT_BIAS of them) before sampling,
   * at every position of every completion, with the penalties; -100 all but bans a token
   * and 100 all but forces it. irt_event.logprob stays the model's own distribution.
   * Copied at submit. */
  const int32_t *logit_bias_ids;
  const float *logit_bias;
  int n_logit_bias;
  /* Constrained decoding: a grammar in llama.cpp's GBNF notation (start rule `root`; see
   * runtime/grammar/grammar.h, and irt_grammar_json for JSON and JSON Schemas) that every
   * completion's text must follow. Each token is sampled as without it and kept if the
   * grammar allows it; otherwise the tokens it does not allow are masked out (-inf) and
   * the row is sampled again -- for greedy and plain temperature sampling exactly the
   * distribution restricted to the allowed tokens. End-of-generation tokens are allowed
   * only where the grammar's text may end, and a completion stops (IRT_FINISH_STOP) as
   * soon as its text is a sentence no character can extend. Needs a tokenizer. With
   * speculative decoding each drafted row is picked under the grammar as it stands after
   * the tokens before it (the same tokens as without drafts). Compiled (and refused with
   * the line and the problem) at submit. NULL: none. */
  const char *grammar;
  /* vLLM's repetition_penalty (HF transformers'): every token of the prompt or of the
   * completion so far has its logit (logit_bias included) divided by it where positive and
   * multiplied by it otherwise, before the presence/frequency penalties. In (0, 2]; 0 and
   * 1 are off. Such rows are picked on the host. */
  float repetition_penalty;
  /* vLLM's min_tokens: until this many tokens are generated, end-of-generation tokens and
   * stop_token_ids are banned and stop strings are not looked for. At most max_tokens;
   * not with a grammar (whose text may have to end sooner). Rows picked on the host. */
  int64_t min_tokens;
  /* vLLM's stop_token_ids: generating one of them ends the completion (IRT_FINISH_STOP),
   * ignore_eos or not; its text is kept (a special token has none). At most
   * IRT_MAX_STOP_TOKEN_IDS ids, copied at submit. */
  const int32_t *stop_token_ids;
  int n_stop_token_ids;
  /* Also score the prompt: one irt_event (prompt = true) per prompt token after the first
   * (what `echo` with `logprobs` returns, and lm-eval's loglikelihood tasks read). The
   * prompt is then computed whole (no prefix-cache hits) in chunks of at most the plan's
   * logit rows per step. */
  bool prompt_logprobs;
} irt_request;

#define IRT_MAX_TOP_LOGPROBS 20
#define IRT_MAX_STOP_TOKEN_IDS 256

/* GBNF for JSON: the JSON values a JSON Schema (text) describes, or any JSON object when
 * schema_json is NULL (OpenAI's response_format json_object). See runtime/grammar/grammar.h for
 * what of JSON Schema is supported; the rest is refused (IRT_UNSUPPORTED) naming the
 * keyword. *out is malloc'd (free it). */
irt_status irt_grammar_json(const char *schema_json, char **out, irt_error *err);
/* Compiles GBNF text only to check it: IRT_OK, or IRT_INVALID_ARG naming the line and the
 * problem (what irt_engine_submit would say of irt_request.grammar). */
irt_status irt_grammar_check(const char *gbnf, irt_error *err);
/* GBNF for the texts a regular expression matches whole (vLLM's guided_regex): literals,
 * ., classes, \d \w \s (ASCII) and their negations, escapes, groups, alternation, the
 * quantifiers * + ? {m,n}; ^ and $ only at the ends. Backreferences, lookaround and \b are
 * refused (IRT_UNSUPPORTED naming them). *out is malloc'd. */
irt_status irt_grammar_regex(const char *regex, char **out, irt_error *err);
/* GBNF for exactly one of n strings (vLLM's guided_choice). *out is malloc'd. */
irt_status irt_grammar_choice(const char *const *choices, int n, char **out, irt_error *err);
#define IRT_MAX_LOGIT_BIAS 1024

typedef struct irt_engine_stats {
  int64_t running, waiting;
  int64_t kv_blocks_total, kv_blocks_used, kv_blocks_cached;
  int64_t preemptions;
  int64_t prompt_tokens, cached_prompt_tokens, generated_tokens;
  int64_t steps, requests_finished;
  int64_t spec_draft_tokens, spec_accepted_tokens; /* proposed by prompt lookup; kept */
  /* The cost model drafts are weighed by (spec_always false): a decode step of T tokens
   * takes about spec_step_ms + spec_token_ms x T; both 0 until the engine has a fit. */
  double spec_step_ms, spec_token_ms;
} irt_engine_stats;

irt_engine_opts irt_engine_opts_default(void);
/* The engine borrows the model, which must outlive it. */
irt_status irt_engine_create(irt_model *m, const irt_engine_opts *o, irt_engine **out,
                             irt_error *err);
/* Stops the engine thread if running; unfinished requests are cancelled (their callbacks
 * get a final CANCELLED event). */
void irt_engine_destroy(irt_engine *e);
/* Queues a request. Fails with IRT_INVALID_ARG (bad prompt, too long, bad params) or
 * IRT_BUSY (queue full) without side effects. */
irt_status irt_engine_submit(irt_engine *e, const irt_request *r, irt_request_id *out_id,
                             irt_error *err);
/* Cancels a request; its completions end with IRT_FINISH_CANCELLED at the next step.
 * Unknown or finished ids are ignored. */
void irt_engine_cancel(irt_engine *e, irt_request_id id);
/* Runs one scheduling iteration and model step. *out_busy is false when nothing is
 * left to do. */
irt_status irt_engine_step(irt_engine *e, bool *out_busy, irt_error *err);
/* Steps until every submitted request has finished. */
irt_status irt_engine_run(irt_engine *e, irt_error *err);
/* Runs steps on an engine thread until irt_engine_destroy. */
irt_status irt_engine_start(irt_engine *e, irt_error *err);
void irt_engine_get_stats(irt_engine *e, irt_engine_stats *out);

/* --- event queue: events for a thread that is not the engine's -----------------------------
 *
 * For callers that cannot run code on the engine's thread (a language binding whose
 * callbacks would take its interpreter's lock while the step waits): a request submitted
 * with on_event = irt_event_queue_push and user = the queue has each event copied into the
 * queue, and the caller's own thread takes them out in batches, in the order they happened.
 * One queue may serve many requests (irt_event.id tells them apart) and many engines. */

typedef struct irt_event_queue irt_event_queue;
irt_status irt_event_queue_create(irt_event_queue **out, irt_error *err);
/* Frees the queue and every event in it. No request may still push into it: destroy its
 * engine first, or wait for every request_done. */
void irt_event_queue_destroy(irt_event_queue *q);
/* The irt_event_fn to submit with (user = the queue). Never blocks on the consumer; a copy
 * that cannot be allocated marks the queue failed (irt_event_queue_pop then says IRT_OOM). */
void irt_event_queue_push(void *queue, const irt_event *ev);
/* Waits up to timeout_ms (< 0: without limit, 0: not at all) until the queue holds an event
 * or irt_event_queue_wake is called, then moves up to cap events into evs, oldest first, and
 * returns how many (0 on timeout or wake). The pointers in those events (text, top_tokens,
 * top_logprobs) stay valid until the next pop or destroy of this queue. -1 with err filled
 * (IRT_OOM) once an event was lost, IRT_INVALID_ARG for a bad argument. One consumer at a
 * time. */
int irt_event_queue_pop(irt_event_queue *q, irt_event *evs, int cap, int timeout_ms,
                        irt_error *err);
/* Makes a waiting (or the next) irt_event_queue_pop return at once: a consumer's shutdown. */
void irt_event_queue_wake(irt_event_queue *q);
/* Events waiting in the queue. */
int64_t irt_event_queue_size(irt_event_queue *q);

/* --- bindings ------------------------------------------------------------------------------ */

/* The library's version (IRT_VERSION of the build). */
const char *irt_version(void);
/* sizeof of a public struct by its name ("irt_request", "irt_event", "irt_sampling",
 * "irt_engine_opts", "irt_model_opts", "irt_model_info", "irt_error", "irt_chat_message",
 * "irt_chat_opts", "irt_chat_info", "irt_engine_stats", "irt_tensor_info"), or 0 for any
 * other name: a binding that declares these structs itself checks its layout against the
 * library it loaded before the first call. */
size_t irt_struct_size(const char *name);

/* --- generic programs ------------------------------------------------------------------
 *
 * A plan built from a graph that is not an LLM step program (`infc build model.onnx`)
 * runs as a program: named inputs in, named outputs out. Inputs keep their values across
 * runs until set again (they start zeroed). Outputs are borrowed and valid until the next
 * run or close. Plans with the step's symbolic dims or the paged-KV attention op are
 * refused here: open those with irt_model_open.
 *
 * Dynamic shapes: a plan built with ranges for its inputs' symbolic dims (`infc build
 * --shape x=1..64x3x224x224`) runs at any shape within them. The program starts at the
 * ranges' maxima; irt_program_set_input_shape moves it to an input's shape (the symbols
 * that input carries), after which input and output infos report the shapes of the next
 * run. A shape outside the plan's range is refused naming the dim and the range.
 * Ownership and threading as for models: one thread at a time per program. */

typedef struct irt_program irt_program;

/* Element types (the same values as in plans). bool data is IRT_DTYPE_U8 holding 0 or 1. */
typedef enum irt_dtype {
  IRT_DTYPE_F32 = 1,
  IRT_DTYPE_F16 = 2,
  IRT_DTYPE_BF16 = 3,
  IRT_DTYPE_I64 = 4,
  IRT_DTYPE_I32 = 5,
  IRT_DTYPE_I8 = 6,
  IRT_DTYPE_U8 = 7,
} irt_dtype;

#define IRT_MAX_RANK 8

typedef struct irt_tensor_info {
  const char *name; /* borrowed; valid while the program is open */
  irt_dtype dtype;
  int rank;
  int64_t shape[IRT_MAX_RANK];
  uint64_t nbytes; /* dense row-major size */
} irt_tensor_info;

/* opts: n_threads and skip_weight_checksum are honoured (NULL: defaults). */
irt_status irt_program_open(const char *plan_path, const irt_model_opts *opts, irt_program **out,
                            irt_error *err);
void irt_program_close(irt_program *p);
int irt_program_n_inputs(const irt_program *p);
int irt_program_n_outputs(const irt_program *p);
/* Describes input / output i; IRT_INVALID_ARG when i is out of range. */
irt_status irt_program_input_info(const irt_program *p, int i, irt_tensor_info *out);
irt_status irt_program_output_info(const irt_program *p, int i, irt_tensor_info *out);
/* Index of the input / output with that name, or -1. */
int irt_program_find_input(const irt_program *p, const char *name);
int irt_program_find_output(const irt_program *p, const char *name);
/* Input i's dims' ranges (rank values each; equal for a fixed dim). */
irt_status irt_program_input_range(const irt_program *p, int i, int64_t *min, int64_t *max);
/* Sets the shape of input i's next values (and so the symbols its dims carry). */
irt_status irt_program_set_input_shape(irt_program *p, int i, int rank, const int64_t *shape,
                                       irt_error *err);
/* Copies input i from data, which holds exactly the input's nbytes (at its current shape). */
irt_status irt_program_set_input(irt_program *p, int i, const void *data, uint64_t nbytes,
                                 irt_error *err);
irt_status irt_program_run(irt_program *p, irt_error *err);
/* Output i of the last run (its nbytes in *out_nbytes if non-NULL); NULL before the first
 * run or when i is out of range. */
const void *irt_program_output(const irt_program *p, int i, uint64_t *out_nbytes);
const char *irt_dtype_name(irt_dtype t);

/* A tensor in a serialized onnx.TensorProto file (the ONNX test-data format, inline data
 * only): what `inferrt run` reads its inputs from and writes its outputs to. bool reads as
 * IRT_DTYPE_U8. */
typedef struct irt_tensor_file {
  irt_tensor_info info; /* info.name owned ("" when the file has none) */
  void *data;           /* owned, info.nbytes */
} irt_tensor_file;
irt_status irt_tensor_file_load(const char *path, irt_tensor_file *out, irt_error *err);
void irt_tensor_file_free(irt_tensor_file *t);
irt_status irt_tensor_file_save(const char *path, const irt_tensor_info *info, const void *data,
                                irt_error *err);

const char *irt_status_name(irt_status s);

/* The allocator of every heap allocation the library makes (Lua's lua_Alloc): ptr NULL
 * allocates size bytes; size 0 frees ptr (returns NULL); else resizes ptr, keeping its
 * contents as realloc does. NULL when it cannot: the call that needed the memory then fails
 * with IRT_OOM and leaks nothing. */
typedef void *(*irt_alloc_fn)(void *ud, void *ptr, size_t size);
/* Installs fn (NULL: the C library's) for the whole process, cJSON's hooks included. Call it
 * before any other irt_ call, or after everything the library allocated has been freed. */
void irt_set_allocator(irt_alloc_fn fn, void *ud);
/* Frees memory the API returned to the caller (irt_tokenize_alloc's ids, a detokenized
 * string, ...). free() does the same while no allocator was installed. */
void irt_free(void *p);
/* Opens path for reading ("rb") if it is a regular file: a FIFO, a device or a directory is
 * refused at once instead of blocking. NULL with err filled ("PATH: cannot open: ...",
 * "PATH: not a regular file") otherwise. What the CLIs and the server read user files with. */
FILE *irt_file_open(const char *path, irt_error *err);

#ifdef __cplusplus
}
#endif

#endif
