/* fmt_gguf: read-only view of a GGUF file (versions 2 and 3) through mmap.
 * Nothing in the file is trusted: the header, every metadata key and value (arrays and
 * nested arrays included), every tensor info and the data section are validated before
 * a pointer is formed: counts against the bytes left, string and array lengths without
 * overflow, tensor ranks <= 4, element counts, a tensor's byte size from its type,
 * offsets aligned (general.alignment, default 32) and inside the file, no overlaps.
 * Messages name the file and the key or tensor at fault. */
#ifndef FMT_GGUF_H
#define FMT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir_dtype.h"
#include "ir_status.h"

#define FMT_GGUF_MAX_RANK 4  /* GGML_MAX_DIMS */
#define FMT_GGUF_MAX_DEPTH 8 /* nesting of arrays of arrays */
#define FMT_GGUF_DEFAULT_ALIGN 32

/* Metadata value types, as stored. */
typedef enum fmt_gguf_type {
  FMT_GGUF_U8 = 0,
  FMT_GGUF_I8 = 1,
  FMT_GGUF_U16 = 2,
  FMT_GGUF_I16 = 3,
  FMT_GGUF_U32 = 4,
  FMT_GGUF_I32 = 5,
  FMT_GGUF_F32 = 6,
  FMT_GGUF_BOOL = 7,
  FMT_GGUF_STRING = 8,
  FMT_GGUF_ARRAY = 9,
  FMT_GGUF_U64 = 10,
  FMT_GGUF_I64 = 11,
  FMT_GGUF_F64 = 12,
  FMT_GGUF_TYPE_COUNT
} fmt_gguf_type;

/* A string in the mapping: `len` bytes at `ptr`, not NUL-terminated, may hold any
 * bytes (GGUF promises UTF-8 but the reader does not check). */
typedef struct fmt_gguf_str {
  const char *ptr;
  uint64_t len;
} fmt_gguf_str;

/* A metadata value. Scalars are decoded; arrays keep a view of their elements plus a
 * decoded copy owned by the reader:
 *   integer and bool elements -> ints (u64 values above INT64_MAX are refused at open),
 *   F32 and F64 elements      -> floats (F64 rounded to float),
 *   STRING elements           -> strs,
 *   ARRAY elements            -> items (nested arrays, depth <= FMT_GGUF_MAX_DEPTH). */
typedef struct fmt_gguf_value {
  fmt_gguf_type type;
  union {
    uint64_t u; /* U8, U16, U32, U64, BOOL (0 or 1) */
    int64_t i;  /* I8, I16, I32, I64 */
    double f;   /* F32, F64 */
  } num;
  fmt_gguf_str str;        /* STRING */
  fmt_gguf_type elem_type; /* ARRAY: type of every element */
  uint64_t count;          /* ARRAY: number of elements */
  const int64_t *ints;
  const float *floats;
  const fmt_gguf_str *strs;
  const struct fmt_gguf_value *items;
} fmt_gguf_value;

typedef struct fmt_gguf_kv {
  const char *key; /* NUL-terminated copy (keys holding a NUL byte are refused) */
  fmt_gguf_value value;
} fmt_gguf_kv;

typedef struct fmt_gguf_tensor {
  const char *name;   /* NUL-terminated copy */
  uint32_t ggml_type; /* as stored */
  ir_dtype dtype;     /* F32, F16, BF16, Q8_0, Q4_0, Q4_1; IR_DTYPE_INVALID for a known ggml
                        type the compiler cannot use (Q4_K, ...): see fmt_gguf_type_check */
  int rank;           /* 1..4 */
  int64_t shape[FMT_GGUF_MAX_RANK]; /* row-major: shape[rank - 1] is GGUF's ne0 */
  uint64_t offset;                  /* from the start of the data section */
  const void *data;                 /* points into the mapping; valid until fmt_gguf_close */
  uint64_t nbytes;
} fmt_gguf_tensor;

typedef struct fmt_gguf fmt_gguf;

/* Opens and validates `path`. A tensor type number ggml does not define is an error;
 * a defined one the compiler cannot use opens fine (dtype IR_DTYPE_INVALID), so that
 * metadata stays readable. *out is owned by the caller: release it with
 * fmt_gguf_close (NULL is a no-op). Messages start with the path. */
ir_status fmt_gguf_open(const char *path, fmt_gguf **out, ir_diag *d);
void fmt_gguf_close(fmt_gguf *g);
/* Gives back the pages of the file's mapping read so far (read again when touched). */
void fmt_gguf_release(const fmt_gguf *g);

const char *fmt_gguf_path(const fmt_gguf *g);
uint32_t fmt_gguf_version(const fmt_gguf *g);
uint32_t fmt_gguf_alignment(const fmt_gguf *g);
/* The whole mapping (for hashing). */
const void *fmt_gguf_bytes(const fmt_gguf *g, uint64_t *out_size);
/* Bytes before the data section: header, metadata and tensor infos. */
uint64_t fmt_gguf_data_offset(const fmt_gguf *g);

/* ---- metadata --------------------------------------------------------------------- */

size_t fmt_gguf_kv_count(const fmt_gguf *g);
const fmt_gguf_kv *fmt_gguf_kv_get(const fmt_gguf *g, size_t i);         /* file order; borrowed */
const fmt_gguf_kv *fmt_gguf_kv_find(const fmt_gguf *g, const char *key); /* or NULL */
const char *fmt_gguf_type_name(fmt_gguf_type t);

/* Typed getters. A missing key or a value of the wrong type is IR_BAD_FORMAT with a
 * message naming the file and key. Integer getters accept any integer type whose value
 * fits the result; f32 accepts F32 and F64. */
ir_status fmt_gguf_get_u32(const fmt_gguf *g, const char *key, uint32_t *out, ir_diag *d);
ir_status fmt_gguf_get_i32(const fmt_gguf *g, const char *key, int32_t *out, ir_diag *d);
ir_status fmt_gguf_get_u64(const fmt_gguf *g, const char *key, uint64_t *out, ir_diag *d);
ir_status fmt_gguf_get_f32(const fmt_gguf *g, const char *key, float *out, ir_diag *d);
ir_status fmt_gguf_get_bool(const fmt_gguf *g, const char *key, bool *out, ir_diag *d);
ir_status fmt_gguf_get_str(const fmt_gguf *g, const char *key, fmt_gguf_str *out, ir_diag *d);
/* Arrays: *out points at `*out_n` decoded elements owned by the reader (borrowed). */
ir_status fmt_gguf_get_strs(const fmt_gguf *g, const char *key, const fmt_gguf_str **out,
                            uint64_t *out_n, ir_diag *d);
ir_status fmt_gguf_get_ints(const fmt_gguf *g, const char *key, const int64_t **out,
                            uint64_t *out_n, ir_diag *d);
ir_status fmt_gguf_get_floats(const fmt_gguf *g, const char *key, const float **out,
                              uint64_t *out_n, ir_diag *d);
/* True if s holds exactly the text `lit`. */
bool fmt_gguf_str_eq(fmt_gguf_str s, const char *lit);

/* ---- tensors ---------------------------------------------------------------------- */

size_t fmt_gguf_tensor_count(const fmt_gguf *g);
const fmt_gguf_tensor *fmt_gguf_tensor_get(const fmt_gguf *g, size_t i); /* file order */
const fmt_gguf_tensor *fmt_gguf_tensor_find(const fmt_gguf *g, const char *name);
/* "Q4_K" for ggml type 12, "type 99" style text for unknown ones (static or into buf). */
const char *fmt_gguf_ggml_type_name(uint32_t ggml_type);
/* IR_OK if the compiler can use t's type, else IR_UNSUPPORTED: "tensor 'x': type 12
 * (Q4_K) is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)". */
ir_status fmt_gguf_type_check(const fmt_gguf_tensor *t, ir_diag *d);

#endif
