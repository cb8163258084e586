/* infc_safetensors: read-only view of HF safetensors checkpoints through mmap.
 * Accepts one .safetensors file, or a directory holding model.safetensors or a sharded
 * model.safetensors.index.json. Every header field is validated before use: header
 * length, JSON syntax, dtype names, shapes, data_offsets inside the file and matching
 * shape x dtype size, no overlapping tensors, duplicate names across shards. */
#ifndef INFC_SAFETENSORS_H
#define INFC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ir_dtype.h"
#include "ir_status.h"

#define INFC_ST_MAX_RANK 8

typedef struct infc_st_tensor {
  const char *name; /* borrowed from the checkpoint object */
  ir_dtype dtype;   /* F32, F16, BF16, I64, I32, I8, U8 (others: IR_UNSUPPORTED error) */
  int rank;
  int64_t shape[INFC_ST_MAX_RANK];
  const void *data; /* points into the mapping; valid until infc_st_close */
  uint64_t nbytes;
} infc_st_tensor;

typedef struct infc_st infc_st;

/* Opens `path` (file or directory). On error returns NULL-out and a status; the message
 * in d names the file and the problem ("model.safetensors: tensor 'x': data_offsets
 * [0, 40) do not match shape [4, 4] of F32 (64 bytes)").
 * *out is owned by the caller: release it with infc_st_close. */
ir_status infc_st_open(const char *path, infc_st **out, ir_diag *d);
void infc_st_close(infc_st *st);

size_t infc_st_count(const infc_st *st);
const infc_st_tensor *infc_st_get(const infc_st *st, size_t i); /* borrowed */
/* NULL if no tensor has that name. */
const infc_st_tensor *infc_st_find(const infc_st *st, const char *name);

/* Raw bytes of the `__metadata__` entry "key" of the first file, or NULL. Borrowed. */
const char *infc_st_metadata(const infc_st *st, const char *key);

#endif
