/* cli: helpers shared by the inferrt subcommands. */
#ifndef IRT_CLI_H
#define IRT_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "inferrt.h"

/* Prints "inferrt: error: msg" and returns 1. */
/* mpirun (cli_dist.c): cli_dist_init joins the job when inferrt runs under mpirun (only
 * generate, batch, bench and serve do); cli_model_open opens a plan with the job's
 * collectives, and on ranks 1.. never returns (they follow rank 0's steps, then exit);
 * cli_model_close closes what cli_model_open opened. */
int cli_dist_init(const char *cmd);
int cli_dist_rank(void);
/* batch under mpirun with a one-rank plan: data parallelism, each rank a model of its own
 * running every N-th line; returns N (1 when not under mpirun or for a tensor-parallel
 * plan) and this rank. */
int cli_dist_data_parallel(const char *plan, int *rank);
/* All ranks meet (0), or nonzero on a transport failure; 0 at once without mpirun. */
int cli_dist_barrier(void);
/* Ends every rank of the job (under mpirun; nothing otherwise). */
void cli_dist_abort(int code);
irt_status cli_model_open(const char *path, irt_model_opts *o, irt_model **out, irt_error *err);
void cli_model_close(irt_model *m);
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double cli_now_ms(void);
/* Parses "1,2,3" into a malloc'd array; false on any malformed entry. */
bool cli_parse_ids(const char *s, int32_t **out, int64_t *out_n);
/* Reads all of standard input into a malloc'd NUL-terminated buffer. */
char *cli_read_stdin(size_t *out_len);
/* Reads a whole file the same way; NULL if it cannot be opened (errno says why). */
char *cli_read_file(const char *path, size_t *out_len);
/* Opens a tokenizer from a plan, a tokenizer.json (with tokenizer_config.json beside it
 * if present) or a GGUF file, by extension. */
irt_status cli_open_tokenizer(const char *path, irt_tokenizer **out, irt_error *err);
/* Parses a non-negative integer flag value; false if malformed. */
bool cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* Parses a --kv-dtype value (f32 | int8): 0, or 1 after printing the error. */
int cli_parse_kv_dtype(const char *s, irt_kv_dtype *out);
/* The --kv-dtype line of the usage texts. */
#define CLI_KV_DTYPE_USAGE                                                                         \
  "KV cache: f32 (default), f16 (2x the tokens per MiB) or int8 (CPU only; ~3.8x)"

/* Parses "MIN:MAX" (or "N" for N:N) within [1, hi]; false if malformed. */
bool cli_parse_range(const char *v, int64_t hi, int64_t *lo, int64_t *out_hi);
/* Speculative decoding flags (--spec-tokens K, --spec-ngram MIN:MAX, --spec-always, whose
 * v is NULL; --draft PLAN, kept for cli_open_draft) into eo: 0, or 1 after printing the
 * error. */
int cli_parse_spec(const char *flag, const char *v, irt_engine_opts *eo);
/* With --draft: opens the draft plan (its own KV cache of the target's capacity, on the
 * device its plan names, the other model options as mo) into *out and eo->draft, and
 * spec_tokens 4 unless given. *out NULL without --draft. */
irt_status cli_open_draft(irt_model *target, const irt_model_opts *mo, irt_engine_opts *eo,
                          irt_model **out, irt_error *err);
bool cli_has_draft(void);
#define CLI_SPEC_USAGE                                                                             \
  "  --spec-tokens K         speculative decoding: up to K draft tokens a step, found by\n"        \
  "                          prompt lookup in the context (0: off, the default; output\n"          \
  "                          is unchanged: drafts are checked against plain decoding)\n"           \
  "  --draft PLAN            drafts from a smaller model with the same tokenizer instead\n"        \
  "                          (K 4 by default); sampled output keeps its distribution\n"            \
  "                          exactly (speculative sampling), greedy output its tokens\n"           \
  "  --spec-ngram MIN:MAX    n-gram sizes matched, longest first (default 2:4)\n"                  \
  "  --spec-always           draft by the kept-count rule alone; by default a draft must\n"        \
  "                          also pay for its row (timed steps, each sequence's kept share)\n"

/* The model options every subcommand that opens a model shares: the log (stderr,
 * "inferrt: ..."), and the CUDA tuning flags, whose defaults come from the environment
 * (INFERRT_CUDA_PROFILE=1, INFERRT_CUDA_DEQUANT_GEMM_M=N, INFERRT_CUDA_LIB=PATH): the
 * library reads no environment variable. */
typedef struct cli_cuda {
  irt_preload preload; /* --preload (not a CUDA flag: the model flags all share this set) */
  bool profile, profile_set;
  int64_t dequant_gemm_m; /* 0: the default; < 0: never */
  bool dequant_set;
  const char *lib;
} cli_cuda;
enum {
  CLI_OPT_CUDA_PROFILE = 240,
  CLI_OPT_CUDA_DEQUANT = 241,
  CLI_OPT_CUDA_LIB = 242,
  CLI_OPT_PRELOAD = 243,
  CLI_OPT_DRAFT = 244 /* --draft PLAN (cli_cuda_flag takes it: cli_parse_spec) */
};
#define CLI_DRAFT_LONGOPT                                                                          \
  { "draft", required_argument, 0, CLI_OPT_DRAFT }
#define CLI_CUDA_LONGOPTS                                                                          \
  {"preload", optional_argument, 0, CLI_OPT_PRELOAD},                                              \
      {"cuda-profile", no_argument, 0, CLI_OPT_CUDA_PROFILE},                                      \
      {"cuda-dequant-gemm-m", required_argument, 0, CLI_OPT_CUDA_DEQUANT}, {                       \
    "cuda-lib", required_argument, 0, CLI_OPT_CUDA_LIB                                             \
  }
#define CLI_CUDA_USAGE                                                                             \
  "  --preload[=wait]        CPU: read the weights into memory at start, in the background\n"      \
  "                          (=wait: before the first request, several threads at once)\n"         \
  "  --cuda-profile          CUDA: time every node (eagerly) and print the table at exit\n"        \
  "                          (default: $INFERRT_CUDA_PROFILE)\n"                                   \
  "  --cuda-dequant-gemm-m N CUDA: dequantize GGUF block weights for cuBLAS from N rows\n"         \
  "                          (default 32, or $INFERRT_CUDA_DEQUANT_GEMM_M; 0: never)\n"            \
  "  --cuda-lib PATH         CUDA: the backend library (default: $INFERRT_CUDA_LIB, else\n"        \
  "                          libinferrt_cuda.so beside inferrt)\n"
/* c is one of CLI_OPT_CUDA_*: 0 after applying it, 1 after printing the error; -1: c is
 * another option. */
int cli_cuda_flag(int c, const char *v, cli_cuda *f);
/* Sets mo's log and CUDA tuning from the flags, else the environment: 0, or 1 after
 * printing the error (a malformed environment variable names itself). */
int cli_model_opts(irt_model_opts *mo, const cli_cuda *f);

int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_run(int argc, char **argv); /* cli_run.c */
int cmd_serve(int argc, char **argv);
int cmd_batch(int argc, char **argv);
int cmd_perplexity(int argc, char **argv); /* cli_perplexity.c */
int cmd_verify(int argc, char **argv);     /* cli_verify.c */

#endif
