/* infc_gguf: read-only view of a GGUF file (versions 2 and 3) through mmap.
 * Nothing in the file is trusted: the header, every metadata key and value (arrays and
 * nested arrays included), every tensor info and the data section are validated before
 * a pointer is formed: counts against the bytes left, string and array lengths without
 * overflow, tensor ranks <= 4, element counts, a tensor's byte size from its type,
 * offsets aligned (general.alignment, default 32) and inside the file, no overlaps.
 * Messages name the file and the key or tensor at fault. */
#ifndef INFC_GGUF_H
#define INFC_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir_dtype.h"
#include "ir_status.h"

#define INFC_GGUF_MAX_RANK 4     /* GGML_MAX_DIMS */
#define INFC_GGUF_MAX_DEPTH 8    /* nesting of arrays of arrays */
#define INFC_GGUF_DEFAULT_ALIGN 32

/* Metadata value types, as stored. */
typedef enum infc_gguf_type {
  INFC_GGUF_U8 = 0,
  INFC_GGUF_I8 = 1,
  INFC_GGUF_U16 = 2,
  INFC_GGUF_I16 = 3,
  INFC_GGUF_U32 = 4,
  INFC_GGUF_I32 = 5,
  INFC_GGUF_F32 = 6,
  INFC_GGUF_BOOL = 7,
  INFC_GGUF_STRING = 8,
  INFC_GGUF_ARRAY = 9,
  INFC_GGUF_U64 = 10,
  INFC_GGUF_I64 = 11,
  INFC_GGUF_F64 = 12,
  INFC_GGUF_TYPE_COUNT
} infc_gguf_type;

/* A string in the mapping: `len` bytes at `ptr`, not NUL-terminated, may hold any
 * bytes (GGUF promises UTF-8 but the reader does not check). */
typedef struct infc_gguf_str {
  const char *ptr;
  uint64_t len;
} infc_gguf_str;

/* A metadata value. Scalars are decoded; arrays keep a view of their elements plus a
 * decoded copy owned by the reader:
 *   integer and bool elements -> ints (u64 values above INT64_MAX are refused at open),
 *   F32 and F64 elements      -> floats (F64 rounded to float),
 *   STRING elements           -> strs,
 *   ARRAY elements            -> items (nested arrays, depth <= INFC_GGUF_MAX_DEPTH). */
typedef struct infc_gguf_value {
  infc_gguf_type type;
  union {
    uint64_t u; /* U8, U16, U32, U64, BOOL (0 or 1) */
    int64_t i;  /* I8, I16, I32, I64 */
    double f;   /* F32, F64 */
  } num;
  infc_gguf_str str;        /* STRING */
  infc_gguf_type elem_type; /* ARRAY: type of every element */
  uint64_t count;           /* ARRAY: number of elements */
  const int64_t *ints;
  const float *floats;
  const infc_gguf_str *strs;
  const struct infc_gguf_value *items;
} infc_gguf_value;

typedef struct infc_gguf_kv {
  const char *key; /* NUL-terminated copy (keys holding a NUL byte are refused) */
  infc_gguf_value value;
} infc_gguf_kv;

typedef struct infc_gguf_tensor {
  const char *name;  /* NUL-terminated copy */
  uint32_t ggml_type; /* as stored */
  ir_dtype dtype;    /* F32, F16, BF16, Q8_0, Q4_0, Q4_1; IR_DTYPE_INVALID for a known ggml
                        type the compiler cannot use (Q4_K, ...): see infc_gguf_type_check */
  int rank;          /* 1..4 */
  int64_t shape[INFC_GGUF_MAX_RANK]; /* row-major: shape[rank - 1] is GGUF's ne0 */
  uint64_t offset;   /* from the start of the data section */
  const void *data;  /* points into the mapping; valid until infc_gguf_close */
  uint64_t nbytes;
} infc_gguf_tensor;

typedef struct infc_gguf infc_gguf;

/* Opens and validates `path`. A tensor type number ggml does not define is an error;
 * a defined one the compiler cannot use opens fine (dtype IR_DTYPE_INVALID), so that
 * metadata stays readable. *out is owned by the caller: release it with
 * infc_gguf_close (NULL is a no-op). Messages start with the path. */
ir_status infc_gguf_open(const char *path, infc_gguf **out, ir_diag *d);
void infc_gguf_close(infc_gguf *g);

const char *infc_gguf_path(const infc_gguf *g);
uint32_t infc_gguf_version(const infc_gguf *g);
uint32_t infc_gguf_alignment(const infc_gguf *g);
/* The whole mapping (for hashing). */
const void *infc_gguf_bytes(const infc_gguf *g, uint64_t *out_size);
/* Bytes before the data section: header, metadata and tensor infos. */
uint64_t infc_gguf_data_offset(const infc_gguf *g);

/* ---- metadata --------------------------------------------------------------------- */

size_t infc_gguf_kv_count(const infc_gguf *g);
const infc_gguf_kv *infc_gguf_kv_get(const infc_gguf *g, size_t i); /* file order; borrowed */
const infc_gguf_kv *infc_gguf_kv_find(const infc_gguf *g, const char *key); /* or NULL */
const char *infc_gguf_type_name(infc_gguf_type t);

/* Typed getters. A missing key or a value of the wrong type is IR_BAD_FORMAT with a
 * message naming the file and key. Integer getters accept any integer type whose value
 * fits the result; f32 accepts F32 and F64. */
ir_status infc_gguf_get_u32(const infc_gguf *g, const char *key, uint32_t *out, ir_diag *d);
ir_status infc_gguf_get_i32(const infc_gguf *g, const char *key, int32_t *out, ir_diag *d);
ir_status infc_gguf_get_u64(const infc_gguf *g, const char *key, uint64_t *out, ir_diag *d);
ir_status infc_gguf_get_f32(const infc_gguf *g, const char *key, float *out, ir_diag *d);
ir_status infc_gguf_get_bool(const infc_gguf *g, const char *key, bool *out, ir_diag *d);
ir_status infc_gguf_get_str(const infc_gguf *g, const char *key, infc_gguf_str *out,
                            ir_diag *d);
/* Arrays: *out points at `*out_n` decoded elements owned by the reader (borrowed). */
ir_status infc_gguf_get_strs(const infc_gguf *g, const char *key, const infc_gguf_str **out,
                             uint64_t *out_n, ir_diag *d);
ir_status infc_gguf_get_ints(const infc_gguf *g, const char *key, const int64_t **out,
                             uint64_t *out_n, ir_diag *d);
ir_status infc_gguf_get_floats(const infc_gguf *g, const char *key, const float **out,
                               uint64_t *out_n, ir_diag *d);
/* True if s holds exactly the text `lit`. */
bool infc_gguf_str_eq(infc_gguf_str s, const char *lit);

/* ---- tensors ---------------------------------------------------------------------- */

size_t infc_gguf_tensor_count(const infc_gguf *g);
const infc_gguf_tensor *infc_gguf_tensor_get(const infc_gguf *g, size_t i); /* file order */
const infc_gguf_tensor *infc_gguf_tensor_find(const infc_gguf *g, const char *name);
/* "Q4_K" for ggml type 12, "type 99" style text for unknown ones (static or into buf). */
const char *infc_gguf_ggml_type_name(uint32_t ggml_type);
/* IR_OK if the compiler can use t's type, else IR_UNSUPPORTED: "tensor 'x': type 12
 * (Q4_K) is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)". */
ir_status infc_gguf_type_check(const infc_gguf_tensor *t, ir_diag *d);

#endif
