/* ir_plan: the model.plan file, the contract between infc and inferrt.
 *
 * Layout (all integers little-endian):
 *   [0, 128)            ir_plan_header
 *   [meta_offset, +meta_size)         protobuf-c `infc.plan.Plan` (ir/plan.proto)
 *   [weights_offset, +weights_size)   raw weights, each tensor 64-byte aligned;
 *                                     the section starts on a 4096-byte boundary
 *   [kernels_offset, +kernels_size)   compiled kernel images (empty for CPU plans)
 * Checksums are XXH3-64 of each section and of the header bytes before header_hash.
 * A reader refuses a wrong magic, a newer major version, any offset or size outside
 * the file, and any checksum mismatch. The same graph and options give the same bytes. */
#ifndef IR_PLAN_H
#define IR_PLAN_H

#include <stdint.h>

#include "ir.h"

#define IR_PLAN_MAGIC "INFCPLAN"
#define IR_PLAN_VERSION_MAJOR 2
#define IR_PLAN_VERSION_MINOR 0
#define IR_PLAN_WEIGHT_ALIGN 64
#define IR_PLAN_SECTION_ALIGN 4096

typedef struct ir_plan_header {
  char magic[8];
  uint32_t version_major;
  uint32_t version_minor;
  uint64_t file_size;
  uint64_t meta_offset;
  uint64_t meta_size;
  uint64_t weights_offset;
  uint64_t weights_size;
  uint64_t kernels_offset;
  uint64_t kernels_size;
  uint64_t meta_hash;
  uint64_t weights_hash;
  uint64_t kernels_hash;
  uint8_t reserved[24];
  uint64_t header_hash; /* XXH3-64 of the 120 bytes before it */
} ir_plan_header;
_Static_assert(sizeof(ir_plan_header) == 128, "plan header is 128 bytes on disk");

/* A compiled kernel image in the kernels section: kernels/cuda/<name>.cu for one arch. */
typedef enum ir_plan_kernel_kind {
  IR_PLAN_KERNEL_CUBIN = 1,
  IR_PLAN_KERNEL_PTX = 2, /* text, NUL included in size */
} ir_plan_kernel_kind;
#define IR_PLAN_KERNEL_ALIGN 256

typedef struct ir_plan_kernel {
  const char *name;    /* "attention" */
  uint32_t arch;       /* 90 for sm_90 */
  uint32_t kind;       /* ir_plan_kernel_kind */
  const uint8_t *data; /* written: the caller's bytes; read: borrowed from the mapping */
  uint64_t size;
} ir_plan_kernel;

/* Key/value build options recorded in the plan (shown by `infc inspect`). */
typedef struct ir_plan_info {
  const char *target;      /* "cpu" */
  const char *source_hash; /* hex */
  const char *const *option_keys;
  const char *const *option_values;
  int n_options;
  const char *const *pass_log;
  int n_pass_log;
  const uint8_t *tokenizer; /* encoded infc.tok.Tokenizer, or NULL */
  size_t tokenizer_size;
  const ir_plan_kernel *kernels; /* images for the kernels section, in table order */
  int n_kernels;
  /* tensor parallelism: the graph of each rank (ranks[0] is the graph written), whose
   * weights lie alike; n_ranks is the graph's config.tp_size. NULL / 0: one rank. */
  const ir_graph *const *ranks;
  int n_ranks;
  /* Called after each chunk of weights is written (when set): the source's pages read so
   * far may go back (the frontends' mappings, madvise DONTNEED). */
  void (*release)(void *ctx);
  void *release_ctx;
} ir_plan_info;

/* Bytes of weights the writer makes and writes at a time (lazy weights, ir_lazy.h). */
#define IR_PLAN_WRITE_CHUNK (16u << 20)

/* Writes g (verified, memory-planned) to path. Writes to "path.tmp" and renames, so a
 * failed build never leaves a half plan under the final name. */
ir_status ir_plan_write(const ir_graph *g, const ir_plan_info *info, const char *path, ir_diag *d);

/* An opened plan: the mapping plus the graph whose weights point into it. */
typedef struct ir_plan ir_plan;

typedef enum ir_plan_verify {
  IR_PLAN_VERIFY_ALL = 0,  /* header, metadata and weight checksums */
  IR_PLAN_VERIFY_META = 1, /* header and metadata only (fast load) */
} ir_plan_verify;

/* Opens and checks a plan. *out is owned by the caller (ir_plan_close). The graph's weights
 * are rank 0's (of a tensor-parallel plan); IR_PLAN_VERIFY_ALL checks every byte. */
ir_status ir_plan_open(const char *path, ir_plan_verify verify, ir_plan **out, ir_diag *d);
/* As ir_plan_open, with the weights of tensor-parallel rank `rank` (0 for a one-rank plan);
 * IR_PLAN_VERIFY_ALL checks that rank's block alone (and the kernels). */
ir_status ir_plan_open_rank(const char *path, ir_plan_verify verify, int rank, ir_plan **out,
                            ir_diag *d);
/* The number of tensor-parallel ranks the plan holds (1 for a plain plan). */
int ir_plan_tp_size(const ir_plan *p);
void ir_plan_close(ir_plan *p);

/* Borrowed; valid until ir_plan_close. */
const ir_graph *ir_plan_graph(const ir_plan *p);
const ir_plan_header *ir_plan_get_header(const ir_plan *p);
/* The opened rank's weight bytes as mapped (*out_bytes of them). */
const void *ir_plan_weights(const ir_plan *p, uint64_t *out_bytes);
/* Recorded strings (borrowed). */
const char *ir_plan_producer(const ir_plan *p);
const char *ir_plan_target(const ir_plan *p);
const char *ir_plan_source_hash(const ir_plan *p);
int ir_plan_n_options(const ir_plan *p);
void ir_plan_option(const ir_plan *p, int i, const char **out_key, const char **out_value);
int ir_plan_n_pass_log(const ir_plan *p);
/* The encoded tokenizer message stored in the plan (borrowed), or NULL if none. */
const uint8_t *ir_plan_tokenizer(const ir_plan *p, size_t *out_size);
const char *ir_plan_pass_log(const ir_plan *p, int i);
/* The kernel table (borrowed; data points into the mapping). Entries were checked at open:
 * inside the kernels section, a known kind, a non-empty name, PTX NUL-terminated. */
int ir_plan_n_kernels(const ir_plan *p);
const ir_plan_kernel *ir_plan_kernel_at(const ir_plan *p, int i);
/* The entry for (name, arch, kind), or NULL. */
const ir_plan_kernel *ir_plan_find_kernel(const ir_plan *p, const char *name, uint32_t arch,
                                          ir_plan_kernel_kind kind);

#endif
