/* infc_safetensors: read-only view of HF safetensors checkpoints through mmap.
 * Accepts one .safetensors file, or a directory holding model.safetensors or a sharded
 * model.safetensors.index.json. Every header field is validated before use: header
 * length, JSON syntax, dtype names, shapes, data_offsets inside the file and matching
 * shape x dtype size, no overlapping tensors, duplicate names across shards. */
#ifndef FMT_SAFETENSORS_H
#define FMT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ir_dtype.h"
#include "ir_status.h"

#define FMT_ST_MAX_RANK 8

typedef struct fmt_st_tensor {
  const char *name; /* borrowed from the checkpoint object */
  ir_dtype dtype;   /* F32, F16, BF16, I64, I32, I8, U8 (others: IR_UNSUPPORTED error) */
  int rank;
  int64_t shape[FMT_ST_MAX_RANK];
  const void *data; /* points into the mapping; valid until fmt_st_close */
  uint64_t nbytes;
} fmt_st_tensor;

typedef struct fmt_st fmt_st;

/* Opens `path` (file or directory). On error returns NULL-out and a status; the message
 * in d names the file and the problem ("model.safetensors: tensor 'x': data_offsets
 * [0, 40) do not match shape [4, 4] of F32 (64 bytes)").
 * *out is owned by the caller: release it with fmt_st_close. */
ir_status fmt_st_open(const char *path, fmt_st **out, ir_diag *d);
void fmt_st_close(fmt_st *st);
/* Gives back the pages of the files' mappings read so far (they are read again from the
 * files when touched): a build that streams a checkpoint keeps its resident set small. */
void fmt_st_release(const fmt_st *st);

size_t fmt_st_count(const fmt_st *st);
const fmt_st_tensor *fmt_st_get(const fmt_st *st, size_t i); /* borrowed */
/* NULL if no tensor has that name. */
const fmt_st_tensor *fmt_st_find(const fmt_st *st, const char *name);

/* Raw bytes of the `__metadata__` entry "key" of the first file, or NULL. Borrowed. */
const char *fmt_st_metadata(const fmt_st *st, const char *key);

#endif
