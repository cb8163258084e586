/* fmt_gguf: mmap-backed GGUF v2/v3 reader. A bounded cursor walks the header; nothing
 * read from the file becomes a pointer, a size or an allocation before it is checked
 * against the bytes that are actually there. */
#include "fmt_gguf.h"
#include "ir_alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GG_MAX_NAME 65535u /* longest key or tensor name accepted */
#define GG_MIN_KV 13u      /* key length (8) + type (4) + the smallest value (1) */
#define GG_MIN_TENSOR 24u  /* name length (8) + rank (4) + type (4) + offset (8) */
#define GG_MIN_ARRAY 12u   /* element type (4) + count (8) */

struct fmt_gguf {
  char *path;
  const uint8_t *map;
  uint64_t size;
  uint32_t version, alignment;
  uint64_t data_offset;
  fmt_gguf_kv *kvs;
  size_t n_kv;
  fmt_gguf_tensor *tensors;
  size_t n_tensors;
  const fmt_gguf_kv **kv_sorted;         /* by key, for bsearch */
  const fmt_gguf_tensor **tensor_sorted; /* by name, for bsearch */
  void **owned;                          /* decoded arrays */
  size_t n_owned, cap_owned;
};

/* ---- ggml tensor types -------------------------------------------------------------- */

typedef struct gg_ttype {
  const char *name;
  uint32_t block, size; /* values per block, bytes per block; 0: not a type */
  ir_dtype dtype;       /* what the compiler maps it to, or INVALID */
} gg_ttype;

static const gg_ttype k_ttypes[] = {
    [0] = {"F32", 1, 4, IR_F32},     [1] = {"F16", 1, 2, IR_F16},
    [2] = {"Q4_0", 32, 18, IR_Q4_0}, [3] = {"Q4_1", 32, 20, IR_Q4_1},
    [6] = {"Q5_0", 32, 22, 0},       [7] = {"Q5_1", 32, 24, 0},
    [8] = {"Q8_0", 32, 34, IR_Q8_0}, [9] = {"Q8_1", 32, 36, 0},
    [10] = {"Q2_K", 256, 84, 0},     [11] = {"Q3_K", 256, 110, 0},
    [12] = {"Q4_K", 256, 144, 0},    [13] = {"Q5_K", 256, 176, 0},
    [14] = {"Q6_K", 256, 210, 0},    [15] = {"Q8_K", 256, 292, 0},
    [16] = {"IQ2_XXS", 256, 66, 0},  [17] = {"IQ2_XS", 256, 74, 0},
    [18] = {"IQ3_XXS", 256, 98, 0},  [19] = {"IQ1_S", 256, 50, 0},
    [20] = {"IQ4_NL", 32, 18, 0},    [21] = {"IQ3_S", 256, 110, 0},
    [22] = {"IQ2_S", 256, 82, 0},    [23] = {"IQ4_XS", 256, 136, 0},
    [24] = {"I8", 1, 1, 0},          [25] = {"I16", 1, 2, 0},
    [26] = {"I32", 1, 4, 0},         [27] = {"I64", 1, 8, 0},
    [28] = {"F64", 1, 8, 0},         [29] = {"IQ1_M", 256, 56, 0},
    [30] = {"BF16", 1, 2, IR_BF16},  [34] = {"TQ1_0", 256, 54, 0},
    [35] = {"TQ2_0", 256, 66, 0},    [39] = {"MXFP4", 32, 17, 0},
    [40] = {"NVFP4", 64, 36, 0},     [41] = {"Q1_0", 128, 18, 0},
};
#define GG_N_TTYPES (sizeof k_ttypes / sizeof k_ttypes[0])

static const gg_ttype *gg_ttype_of(uint32_t t) {
  return t < GG_N_TTYPES && k_ttypes[t].size ? &k_ttypes[t] : NULL;
}

const char *fmt_gguf_ggml_type_name(uint32_t t) {
  const gg_ttype *tt = gg_ttype_of(t);
  return tt ? tt->name : "unknown";
}

ir_status fmt_gguf_type_check(const fmt_gguf_tensor *t, ir_diag *d) {
  if (t->dtype != IR_DTYPE_INVALID) return IR_OK;
  return ir_diag_set(d, IR_UNSUPPORTED,
                     "tensor '%.200s': type %u (%s) is not supported (supported: F32, F16, "
                     "BF16, Q8_0, Q4_0, Q4_1)",
                     t->name, t->ggml_type, fmt_gguf_ggml_type_name(t->ggml_type));
}

static const char *const k_vnames[FMT_GGUF_TYPE_COUNT] = {
    "U8", "I8", "U16", "I16", "U32", "I32", "F32", "BOOL", "STRING", "ARRAY", "U64", "I64", "F64",
};
static const uint8_t k_vsize[FMT_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *fmt_gguf_type_name(fmt_gguf_type t) {
  return (unsigned)t < FMT_GGUF_TYPE_COUNT ? k_vnames[t] : "unknown";
}

/* ---- the bounded cursor ------------------------------------------------------------- */

typedef struct gg_cur {
  const uint8_t *p;
  uint64_t size, pos;
} gg_cur;

static uint64_t cur_left(const gg_cur *c) { return c->size - c->pos; }

static uint64_t gg_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static bool cur_uint(gg_cur *c, int n, uint64_t *out) {
  if (cur_left(c) < (uint64_t)n) return false;
  *out = gg_le(c->p + c->pos, n);
  c->pos += (uint64_t)n;
  return true;
}

static bool cur_u32(gg_cur *c, uint32_t *out) {
  uint64_t v;
  if (!cur_uint(c, 4, &v)) return false;
  *out = (uint32_t)v;
  return true;
}

static ir_status gg_trunc(const gg_cur *c, const char *what, const char *name, ir_diag *d) {
  return ir_diag_set(d, IR_BAD_FORMAT, "truncated: %s%s%.200s%s at byte %llu (file has %llu bytes)",
                     what, name ? " '" : "", name ? name : "", name ? "'" : "",
                     (unsigned long long)c->pos, (unsigned long long)c->size);
}

/* A u64 length then that many bytes. */
static ir_status cur_str(gg_cur *c, fmt_gguf_str *out, const char *what, const char *name,
                         ir_diag *d) {
  uint64_t len;
  if (!cur_uint(c, 8, &len)) return gg_trunc(c, what, name, d);
  if (len > cur_left(c))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "%s%s%.200s%s: string length %llu at byte %llu exceeds the %llu bytes left",
                       what, name ? " '" : "", name ? name : "", name ? "'" : "",
                       (unsigned long long)len, (unsigned long long)(c->pos - 8),
                       (unsigned long long)cur_left(c));
  out->ptr = (const char *)c->p + c->pos;
  out->len = len;
  c->pos += len;
  return IR_OK;
}

/* A key or tensor name: bounded, NUL-free, copied into a C string. */
static ir_status cur_name(gg_cur *c, char **out, const char *what, ir_diag *d) {
  fmt_gguf_str s = {0};
  uint64_t at = c->pos;
  ir_status st = cur_str(c, &s, what, NULL, d);
  if (st != IR_OK) return st;
  if (s.len == 0 || s.len > GG_MAX_NAME || memchr(s.ptr, 0, s.len))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "%s at byte %llu is empty, longer than %u bytes or "
                       "holds a NUL byte",
                       what, (unsigned long long)at, GG_MAX_NAME);
  char *p = ir_malloc(s.len + 1);
  if (!p) return ir_diag_set(d, IR_OOM, "out of memory");
  memcpy(p, s.ptr, s.len);
  p[s.len] = '\0';
  *out = p;
  return IR_OK;
}

/* ---- metadata values ---------------------------------------------------------------- */

static void *gg_alloc(fmt_gguf *g, uint64_t n, size_t elem) {
  if (n == 0) return NULL;
  if (g->n_owned == g->cap_owned) {
    size_t cap = g->cap_owned ? 2 * g->cap_owned : 16;
    void **p = ir_realloc(g->owned, cap * sizeof *p);
    if (!p) return NULL;
    g->owned = p, g->cap_owned = cap;
  }
  void *p = ir_calloc((size_t)n, elem);
  if (p) g->owned[g->n_owned++] = p;
  return p;
}

typedef struct gg_val_ctx {
  fmt_gguf *g;
  gg_cur *c;
  const char *key;
  ir_diag *d;
} gg_val_ctx;

/* Decodes one fixed-size scalar at p into v. */
static ir_status gg_scalar(gg_val_ctx *x, fmt_gguf_type t, const uint8_t *p, fmt_gguf_value *v) {
  uint64_t raw = gg_le(p, k_vsize[t]);
  v->type = t;
  switch (t) {
  case FMT_GGUF_I8: v->num.i = (int8_t)raw; break;
  case FMT_GGUF_I16: v->num.i = (int16_t)raw; break;
  case FMT_GGUF_I32: v->num.i = (int32_t)raw; break;
  case FMT_GGUF_I64: v->num.i = (int64_t)raw; break;
  case FMT_GGUF_F32: {
    uint32_t u = (uint32_t)raw;
    float f;
    memcpy(&f, &u, 4);
    v->num.f = f;
    break;
  }
  case FMT_GGUF_F64: memcpy(&v->num.f, &raw, 8); break;
  case FMT_GGUF_BOOL:
    if (raw > 1)
      return ir_diag_set(x->d, IR_BAD_FORMAT,
                         "metadata key '%.200s': bool value %llu is not "
                         "0 or 1",
                         x->key, (unsigned long long)raw);
    v->num.u = raw;
    break;
  default: v->num.u = raw; break;
  }
  return IR_OK;
}

static ir_status gg_value(gg_val_ctx *x, fmt_gguf_type t, int depth, fmt_gguf_value *v);

/* Elements of fixed size: one bounds check for the whole run, then decode. */
static ir_status gg_fixed_array(gg_val_ctx *x, fmt_gguf_value *v) {
  uint64_t es = k_vsize[v->elem_type];
  if (v->count > cur_left(x->c) / es)
    return ir_diag_set(x->d, IR_BAD_FORMAT,
                       "metadata key '%.200s': array of %llu %s needs "
                       "more than the %llu bytes left",
                       x->key, (unsigned long long)v->count, k_vnames[v->elem_type],
                       (unsigned long long)cur_left(x->c));
  const uint8_t *p = x->c->p + x->c->pos;
  x->c->pos += v->count * es;
  bool fl = v->elem_type == FMT_GGUF_F32 || v->elem_type == FMT_GGUF_F64;
  int64_t *ints = fl ? NULL : gg_alloc(x->g, v->count, sizeof *ints);
  float *floats = fl ? gg_alloc(x->g, v->count, sizeof *floats) : NULL;
  if (v->count && !ints && !floats) return ir_diag_set(x->d, IR_OOM, "out of memory");
  for (uint64_t i = 0; i < v->count; i++) {
    fmt_gguf_value e;
    ir_status st = gg_scalar(x, v->elem_type, p + i * es, &e);
    if (st != IR_OK) return st;
    if (fl) {
      floats[i] = (float)e.num.f;
    } else if (v->elem_type == FMT_GGUF_U64 && e.num.u > INT64_MAX) {
      return ir_diag_set(x->d, IR_UNSUPPORTED,
                         "metadata key '%.200s': element %llu is %llu, "
                         "above INT64_MAX",
                         x->key, (unsigned long long)i, (unsigned long long)e.num.u);
    } else {
      ints[i] = (v->elem_type == FMT_GGUF_I8 || v->elem_type == FMT_GGUF_I16 ||
                 v->elem_type == FMT_GGUF_I32 || v->elem_type == FMT_GGUF_I64)
                    ? e.num.i
                    : (int64_t)e.num.u;
    }
  }
  v->ints = ints;
  v->floats = floats;
  return IR_OK;
}

static ir_status gg_array(gg_val_ctx *x, int depth, fmt_gguf_value *v) {
  uint32_t et;
  if (!cur_u32(x->c, &et) || !cur_uint(x->c, 8, &v->count))
    return gg_trunc(x->c, "array header of metadata key", x->key, x->d);
  if (et >= FMT_GGUF_TYPE_COUNT)
    return ir_diag_set(x->d, IR_BAD_FORMAT,
                       "metadata key '%.200s': unknown array element "
                       "type %u",
                       x->key, et);
  v->elem_type = (fmt_gguf_type)et;
  if (k_vsize[et]) return gg_fixed_array(x, v);
  bool nested = et == FMT_GGUF_ARRAY;
  if (nested && depth + 1 >= FMT_GGUF_MAX_DEPTH)
    return ir_diag_set(x->d, IR_BAD_FORMAT,
                       "metadata key '%.200s': arrays nested deeper "
                       "than %d",
                       x->key, FMT_GGUF_MAX_DEPTH);
  uint64_t min = nested ? GG_MIN_ARRAY : 8;
  if (v->count > cur_left(x->c) / min)
    return ir_diag_set(x->d, IR_BAD_FORMAT,
                       "metadata key '%.200s': array of %llu %s needs "
                       "more than the %llu bytes left",
                       x->key, (unsigned long long)v->count, k_vnames[et],
                       (unsigned long long)cur_left(x->c));
  fmt_gguf_str *strs = nested ? NULL : gg_alloc(x->g, v->count, sizeof *strs);
  fmt_gguf_value *items = nested ? gg_alloc(x->g, v->count, sizeof *items) : NULL;
  if (v->count && !strs && !items) return ir_diag_set(x->d, IR_OOM, "out of memory");
  ir_status st = IR_OK;
  for (uint64_t i = 0; i < v->count && st == IR_OK; i++)
    st = nested ? gg_value(x, FMT_GGUF_ARRAY, depth + 1, &items[i])
                : cur_str(x->c, &strs[i], "string in metadata key", x->key, x->d);
  v->strs = strs;
  v->items = items;
  return st;
}

static ir_status gg_value(gg_val_ctx *x, fmt_gguf_type t, int depth, fmt_gguf_value *v) {
  memset(v, 0, sizeof *v);
  v->type = t;
  if (t == FMT_GGUF_STRING) return cur_str(x->c, &v->str, "metadata key", x->key, x->d);
  if (t == FMT_GGUF_ARRAY) return gg_array(x, depth, v);
  if (cur_left(x->c) < k_vsize[t]) return gg_trunc(x->c, "value of metadata key", x->key, x->d);
  ir_status st = gg_scalar(x, t, x->c->p + x->c->pos, v);
  x->c->pos += k_vsize[t];
  return st;
}

static ir_status gg_read_kv(fmt_gguf *g, gg_cur *c, fmt_gguf_kv *kv, ir_diag *d) {
  char *key = NULL;
  ir_status st = cur_name(c, &key, "metadata key", d);
  if (st != IR_OK) return st;
  kv->key = key;
  uint32_t t;
  if (!cur_u32(c, &t)) return gg_trunc(c, "type of metadata key", key, d);
  if (t >= FMT_GGUF_TYPE_COUNT)
    return ir_diag_set(d, IR_BAD_FORMAT, "metadata key '%.200s': unknown value type %u", key, t);
  gg_val_ctx x = {g, c, key, d};
  return gg_value(&x, (fmt_gguf_type)t, 0, &kv->value);
}

/* ---- tensor infos ------------------------------------------------------------------- */

static ir_status gg_tensor_shape(gg_cur *c, fmt_gguf_tensor *t, uint64_t *out_elems, ir_diag *d) {
  uint32_t rank;
  if (!cur_u32(c, &rank)) return gg_trunc(c, "rank of tensor", t->name, d);
  if (rank < 1 || rank > FMT_GGUF_MAX_RANK)
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': rank %u is not in 1..%d", t->name, rank,
                       FMT_GGUF_MAX_RANK);
  t->rank = (int)rank;
  uint64_t elems = 1;
  bool zero = false;
  for (uint32_t i = 0; i < rank; i++) {
    uint64_t ne;
    if (!cur_uint(c, 8, &ne)) return gg_trunc(c, "dims of tensor", t->name, d);
    if (ne > (uint64_t)INT64_MAX || (ne && elems > (uint64_t)INT64_MAX / ne))
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': element count overflows", t->name);
    t->shape[rank - 1 - i] = (int64_t)ne; /* ne0 is the innermost dim */
    if (ne == 0) zero = true;
    else elems *= ne;
  }
  *out_elems = zero ? 0 : elems;
  return IR_OK;
}

static ir_status gg_read_tensor(gg_cur *c, fmt_gguf_tensor *t, ir_diag *d) {
  char *name = NULL;
  ir_status st = cur_name(c, &name, "tensor name", d);
  if (st != IR_OK) return st;
  t->name = name;
  uint64_t elems = 0;
  if ((st = gg_tensor_shape(c, t, &elems, d)) != IR_OK) return st;
  if (!cur_u32(c, &t->ggml_type) || !cur_uint(c, 8, &t->offset))
    return gg_trunc(c, "type and offset of tensor", name, d);
  const gg_ttype *tt = gg_ttype_of(t->ggml_type);
  if (!tt)
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': unknown type %u", name, t->ggml_type);
  uint64_t ne0 = (uint64_t)t->shape[t->rank - 1];
  if (ne0 % tt->block)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor '%.200s': row length %llu is not a multiple "
                       "of the %s block of %u",
                       name, (unsigned long long)ne0, tt->name, tt->block);
  uint64_t blocks = elems / tt->block;
  if (blocks > UINT64_MAX / tt->size)
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': byte size overflows", name);
  t->nbytes = blocks * tt->size;
  t->dtype = tt->dtype;
  return IR_OK;
}

/* ---- layout checks ------------------------------------------------------------------ */

static ir_status gg_alignment(fmt_gguf *g, ir_diag *d) {
  g->alignment = FMT_GGUF_DEFAULT_ALIGN;
  const fmt_gguf_kv *kv = fmt_gguf_kv_find(g, "general.alignment");
  if (!kv) return IR_OK;
  if (kv->value.type != FMT_GGUF_U32)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "metadata key 'general.alignment' has type %s, "
                       "expected U32",
                       fmt_gguf_type_name(kv->value.type));
  uint64_t a = kv->value.num.u;
  if (a == 0 || (a & (a - 1)))
    return ir_diag_set(d, IR_BAD_FORMAT, "general.alignment %llu is not a power of two",
                       (unsigned long long)a);
  g->alignment = (uint32_t)a;
  return IR_OK;
}

static int gg_cmp_offset(const void *a, const void *b) {
  const fmt_gguf_tensor *x = *(const fmt_gguf_tensor *const *)a;
  const fmt_gguf_tensor *y = *(const fmt_gguf_tensor *const *)b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static ir_status gg_no_overlap(fmt_gguf *g, ir_diag *d) {
  const fmt_gguf_tensor **v = ir_malloc((g->n_tensors + 1) * sizeof *v);
  if (!v) return ir_diag_set(d, IR_OOM, "out of memory");
  for (size_t i = 0; i < g->n_tensors; i++) v[i] = &g->tensors[i];
  qsort(v, g->n_tensors, sizeof *v, gg_cmp_offset);
  ir_status st = IR_OK;
  const fmt_gguf_tensor *prev = NULL;
  for (size_t i = 0; i < g->n_tensors && st == IR_OK; i++) {
    if (v[i]->nbytes == 0) continue;
    if (prev && v[i]->offset < prev->offset + prev->nbytes)
      st = ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor '%.200s' [%llu, %llu) overlaps tensor '%.200s' "
                       "[%llu, %llu)",
                       v[i]->name, (unsigned long long)v[i]->offset,
                       (unsigned long long)(v[i]->offset + v[i]->nbytes), prev->name,
                       (unsigned long long)prev->offset,
                       (unsigned long long)(prev->offset + prev->nbytes));
    if (!prev || v[i]->offset + v[i]->nbytes > prev->offset + prev->nbytes) prev = v[i];
  }
  ir_free(v);
  return st;
}

/* Places the data section after the infos and every tensor inside it. */
static ir_status gg_layout(fmt_gguf *g, uint64_t infos_end, ir_diag *d) {
  uint64_t a = g->alignment;
  uint64_t start = infos_end + (a - infos_end % a) % a;
  if (start < infos_end || (start > g->size && g->n_tensors > 0))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "truncated: the data section starts at byte %llu, "
                       "past the end of the file (%llu bytes)",
                       (unsigned long long)start, (unsigned long long)g->size);
  g->data_offset = start > g->size ? g->size : start;
  uint64_t avail = g->size - g->data_offset;
  for (size_t i = 0; i < g->n_tensors; i++) {
    fmt_gguf_tensor *t = &g->tensors[i];
    if (t->offset % a)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "tensor '%.200s': offset %llu is not a multiple of "
                         "the alignment %llu",
                         t->name, (unsigned long long)t->offset, (unsigned long long)a);
    if (t->offset > avail || t->nbytes > avail - t->offset)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "truncated: tensor '%.200s' [%llu, +%llu bytes) "
                         "ends past the data section of %llu bytes",
                         t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                         (unsigned long long)avail);
    t->data = g->map + g->data_offset + t->offset;
  }
  return gg_no_overlap(g, d);
}

static int gg_cmp_kv(const void *a, const void *b) {
  return strcmp((*(const fmt_gguf_kv *const *)a)->key, (*(const fmt_gguf_kv *const *)b)->key);
}

static int gg_cmp_tensor(const void *a, const void *b) {
  return strcmp((*(const fmt_gguf_tensor *const *)a)->name,
                (*(const fmt_gguf_tensor *const *)b)->name);
}

/* Sorted indexes for lookup; a repeated key or tensor name is an error. */
static ir_status gg_index(fmt_gguf *g, ir_diag *d) {
  g->kv_sorted = ir_malloc((g->n_kv + 1) * sizeof *g->kv_sorted);
  g->tensor_sorted = ir_malloc((g->n_tensors + 1) * sizeof *g->tensor_sorted);
  if (!g->kv_sorted || !g->tensor_sorted) return ir_diag_set(d, IR_OOM, "out of memory");
  for (size_t i = 0; i < g->n_kv; i++) g->kv_sorted[i] = &g->kvs[i];
  for (size_t i = 0; i < g->n_tensors; i++) g->tensor_sorted[i] = &g->tensors[i];
  qsort(g->kv_sorted, g->n_kv, sizeof *g->kv_sorted, gg_cmp_kv);
  qsort(g->tensor_sorted, g->n_tensors, sizeof *g->tensor_sorted, gg_cmp_tensor);
  for (size_t i = 1; i < g->n_kv; i++)
    if (!strcmp(g->kv_sorted[i]->key, g->kv_sorted[i - 1]->key))
      return ir_diag_set(d, IR_BAD_FORMAT, "metadata key '%.200s' appears twice",
                         g->kv_sorted[i]->key);
  for (size_t i = 1; i < g->n_tensors; i++)
    if (!strcmp(g->tensor_sorted[i]->name, g->tensor_sorted[i - 1]->name))
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s' appears twice",
                         g->tensor_sorted[i]->name);
  return IR_OK;
}

/* ---- header and file ---------------------------------------------------------------- */

static ir_status gg_header(fmt_gguf *g, gg_cur *c, uint64_t *n_tensors, uint64_t *n_kv,
                           ir_diag *d) {
  if (g->size < 4 || memcmp(g->map, "GGUF", 4) != 0)
    return ir_diag_set(d, IR_BAD_FORMAT, "not a GGUF file (bad magic)");
  c->pos = 4;
  if (!cur_u32(c, &g->version)) return gg_trunc(c, "version", NULL, d);
  if (g->version == 1)
    return ir_diag_set(d, IR_VERSION, "GGUF version 1 is not supported (supported: 2, 3)");
  if (g->version == 0x02000000u || g->version == 0x03000000u)
    return ir_diag_set(d, IR_UNSUPPORTED, "big-endian GGUF files are not supported");
  if (g->version != 2 && g->version != 3)
    return ir_diag_set(d, IR_VERSION, "unknown GGUF version %u (supported: 2, 3)", g->version);
  if (!cur_uint(c, 8, n_tensors) || !cur_uint(c, 8, n_kv))
    return gg_trunc(c, "header counts", NULL, d);
  /* Every entry takes some minimum of bytes: a count the file cannot hold is refused
   * before anything is allocated for it. */
  if (*n_kv > cur_left(c) / GG_MIN_KV)
    return ir_diag_set(d, IR_BAD_FORMAT, "metadata count %llu is more than the file can hold",
                       (unsigned long long)*n_kv);
  if (*n_tensors > cur_left(c) / GG_MIN_TENSOR)
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor count %llu is more than the file can hold",
                       (unsigned long long)*n_tensors);
  return IR_OK;
}

static ir_status gg_parse(fmt_gguf *g, ir_diag *d) {
  gg_cur c = {.p = g->map, .size = g->size, .pos = 0};
  uint64_t nt = 0, nkv = 0;
  ir_status st = gg_header(g, &c, &nt, &nkv, d);
  if (st != IR_OK) return st;
  g->kvs = ir_calloc((size_t)nkv + 1, sizeof *g->kvs);
  g->tensors = ir_calloc((size_t)nt + 1, sizeof *g->tensors);
  if (!g->kvs || !g->tensors) return ir_diag_set(d, IR_OOM, "out of memory");
  /* Counted before reading, so that close frees the name of an entry that failed. */
  for (uint64_t i = 0; i < nkv && st == IR_OK; i++) {
    g->n_kv++;
    st = gg_read_kv(g, &c, &g->kvs[i], d);
  }
  for (uint64_t i = 0; i < nt && st == IR_OK; i++) {
    g->n_tensors++;
    st = gg_read_tensor(&c, &g->tensors[i], d);
  }
  if (st == IR_OK) st = gg_index(g, d);
  if (st == IR_OK) st = gg_alignment(g, d);
  if (st == IR_OK) st = gg_layout(g, c.pos, d);
  return st;
}

static ir_status gg_map(fmt_gguf *g, ir_diag *d) {
  int fd = open(g->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ir_diag_set(d, IR_IO, "cannot open: %s", strerror(errno));
  struct stat sb;
  ir_status st = IR_OK;
  if (fstat(fd, &sb) != 0) st = ir_diag_set(d, IR_IO, "cannot stat: %s", strerror(errno));
  else if (!S_ISREG(sb.st_mode)) st = ir_diag_set(d, IR_IO, "not a regular file");
  else if (sb.st_size < 4)
    st = ir_diag_set(d, IR_BAD_FORMAT, "not a GGUF file (%lld bytes)", (long long)sb.st_size);
  if (st == IR_OK) {
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) st = ir_diag_set(d, IR_IO, "cannot mmap: %s", strerror(errno));
    else g->map = p, g->size = (uint64_t)sb.st_size;
  }
  close(fd);
  return st;
}

ir_status fmt_gguf_open(const char *path, fmt_gguf **out, ir_diag *d) {
  if (!out || !path) return ir_diag_set(d, IR_INVALID_ARG, "fmt_gguf_open: NULL argument");
  *out = NULL;
  fmt_gguf *g = ir_calloc(1, sizeof *g);
  if (!g || !(g->path = ir_strdup(path))) {
    ir_free(g);
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  ir_status st = gg_map(g, d);
  if (st == IR_OK) st = gg_parse(g, d);
  if (st != IR_OK) {
    ir_diag_prefix(d, "%s", path);
    fmt_gguf_close(g);
    return st;
  }
  *out = g;
  return IR_OK;
}

void fmt_gguf_release(const fmt_gguf *g) {
  if (g && g->map) (void)madvise((void *)g->map, (size_t)g->size, MADV_DONTNEED);
}

void fmt_gguf_close(fmt_gguf *g) {
  if (!g) return;
  for (size_t i = 0; i < g->n_kv; i++) ir_free((char *)g->kvs[i].key);
  for (size_t i = 0; i < g->n_tensors; i++) ir_free((char *)g->tensors[i].name);
  for (size_t i = 0; i < g->n_owned; i++) ir_free(g->owned[i]);
  ir_free(g->owned);
  ir_free(g->kvs);
  ir_free(g->tensors);
  ir_free(g->kv_sorted);
  ir_free(g->tensor_sorted);
  if (g->map) munmap((void *)g->map, (size_t)g->size);
  ir_free(g->path);
  ir_free(g);
}

/* ---- queries ------------------------------------------------------------------------ */

const char *fmt_gguf_path(const fmt_gguf *g) { return g->path; }
uint32_t fmt_gguf_version(const fmt_gguf *g) { return g->version; }
uint32_t fmt_gguf_alignment(const fmt_gguf *g) { return g->alignment; }
uint64_t fmt_gguf_data_offset(const fmt_gguf *g) { return g->data_offset; }

const void *fmt_gguf_bytes(const fmt_gguf *g, uint64_t *out_size) {
  *out_size = g->size;
  return g->map;
}

size_t fmt_gguf_kv_count(const fmt_gguf *g) { return g ? g->n_kv : 0; }

const fmt_gguf_kv *fmt_gguf_kv_get(const fmt_gguf *g, size_t i) {
  return g && i < g->n_kv ? &g->kvs[i] : NULL;
}

const fmt_gguf_kv *fmt_gguf_kv_find(const fmt_gguf *g, const char *key) {
  if (!g || !key || !g->kv_sorted || g->n_kv == 0) return NULL;
  fmt_gguf_kv probe = {.key = key};
  const fmt_gguf_kv *pp = &probe;
  const fmt_gguf_kv **r = bsearch(&pp, g->kv_sorted, g->n_kv, sizeof *g->kv_sorted, gg_cmp_kv);
  return r ? *r : NULL;
}

size_t fmt_gguf_tensor_count(const fmt_gguf *g) { return g ? g->n_tensors : 0; }

const fmt_gguf_tensor *fmt_gguf_tensor_get(const fmt_gguf *g, size_t i) {
  return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const fmt_gguf_tensor *fmt_gguf_tensor_find(const fmt_gguf *g, const char *name) {
  if (!g || !name || !g->tensor_sorted || g->n_tensors == 0) return NULL;
  fmt_gguf_tensor probe = {.name = name};
  const fmt_gguf_tensor *pp = &probe;
  const fmt_gguf_tensor **r =
      bsearch(&pp, g->tensor_sorted, g->n_tensors, sizeof *g->tensor_sorted, gg_cmp_tensor);
  return r ? *r : NULL;
}

bool fmt_gguf_str_eq(fmt_gguf_str s, const char *lit) {
  size_t n = strlen(lit);
  return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

/* ---- typed getters ------------------------------------------------------------------ */

static const fmt_gguf_value *gg_want(const fmt_gguf *g, const char *key, ir_diag *d) {
  const fmt_gguf_kv *kv = fmt_gguf_kv_find(g, key);
  if (!kv) ir_diag_set(d, IR_BAD_FORMAT, "%s: metadata key '%s' is missing", g->path, key);
  return kv ? &kv->value : NULL;
}

static ir_status gg_wrong(const fmt_gguf *g, const char *key, const fmt_gguf_value *v,
                          const char *want, ir_diag *d) {
  char have[32];
  if (v->type == FMT_GGUF_ARRAY)
    snprintf(have, sizeof have, "ARRAY of %s", fmt_gguf_type_name(v->elem_type));
  else snprintf(have, sizeof have, "%s", fmt_gguf_type_name(v->type));
  return ir_diag_set(d, IR_BAD_FORMAT, "%s: metadata key '%s' has type %s, expected %s", g->path,
                     key, have, want);
}

static bool gg_is_signed(fmt_gguf_type t) {
  return t == FMT_GGUF_I8 || t == FMT_GGUF_I16 || t == FMT_GGUF_I32 || t == FMT_GGUF_I64;
}

static bool gg_is_int(fmt_gguf_type t) {
  return gg_is_signed(t) || t == FMT_GGUF_U8 || t == FMT_GGUF_U16 || t == FMT_GGUF_U32 ||
         t == FMT_GGUF_U64;
}

/* Any integer value, checked against [lo, hi]. */
static ir_status gg_int(const fmt_gguf *g, const char *key, int64_t lo, uint64_t hi,
                        const char *want, uint64_t *out_bits, ir_diag *d) {
  const fmt_gguf_value *v = gg_want(g, key, d);
  if (!v) return IR_BAD_FORMAT;
  if (!gg_is_int(v->type)) return gg_wrong(g, key, v, want, d);
  bool neg = gg_is_signed(v->type) && v->num.i < 0;
  if ((neg && v->num.i < lo) || (!neg && v->num.u > hi)) {
    if (neg)
      return ir_diag_set(d, IR_BAD_FORMAT, "%s: metadata key '%s' is %lld, outside %s", g->path,
                         key, (long long)v->num.i, want);
    return ir_diag_set(d, IR_BAD_FORMAT, "%s: metadata key '%s' is %llu, outside %s", g->path, key,
                       (unsigned long long)v->num.u, want);
  }
  *out_bits = v->num.u;
  return IR_OK;
}

ir_status fmt_gguf_get_u32(const fmt_gguf *g, const char *key, uint32_t *out, ir_diag *d) {
  uint64_t v;
  ir_status st = gg_int(g, key, 0, UINT32_MAX, "the range of u32", &v, d);
  if (st == IR_OK) *out = (uint32_t)v;
  return st;
}

ir_status fmt_gguf_get_i32(const fmt_gguf *g, const char *key, int32_t *out, ir_diag *d) {
  uint64_t v;
  ir_status st = gg_int(g, key, INT32_MIN, INT32_MAX, "the range of i32", &v, d);
  if (st == IR_OK) *out = (int32_t)(int64_t)v;
  return st;
}

ir_status fmt_gguf_get_u64(const fmt_gguf *g, const char *key, uint64_t *out, ir_diag *d) {
  return gg_int(g, key, 0, UINT64_MAX, "the range of u64", out, d);
}

ir_status fmt_gguf_get_f32(const fmt_gguf *g, const char *key, float *out, ir_diag *d) {
  const fmt_gguf_value *v = gg_want(g, key, d);
  if (!v) return IR_BAD_FORMAT;
  if (v->type != FMT_GGUF_F32 && v->type != FMT_GGUF_F64) return gg_wrong(g, key, v, "F32", d);
  *out = (float)v->num.f;
  return IR_OK;
}

ir_status fmt_gguf_get_bool(const fmt_gguf *g, const char *key, bool *out, ir_diag *d) {
  const fmt_gguf_value *v = gg_want(g, key, d);
  if (!v) return IR_BAD_FORMAT;
  if (v->type != FMT_GGUF_BOOL) return gg_wrong(g, key, v, "BOOL", d);
  *out = v->num.u != 0;
  return IR_OK;
}

ir_status fmt_gguf_get_str(const fmt_gguf *g, const char *key, fmt_gguf_str *out, ir_diag *d) {
  const fmt_gguf_value *v = gg_want(g, key, d);
  if (!v) return IR_BAD_FORMAT;
  if (v->type != FMT_GGUF_STRING) return gg_wrong(g, key, v, "STRING", d);
  *out = v->str;
  return IR_OK;
}

/* An array whose elements pass `ok`. */
static const fmt_gguf_value *gg_array_of(const fmt_gguf *g, const char *key,
                                         bool (*ok)(fmt_gguf_type), const char *want, ir_diag *d) {
  const fmt_gguf_value *v = gg_want(g, key, d);
  if (v && (v->type != FMT_GGUF_ARRAY || !ok(v->elem_type))) {
    gg_wrong(g, key, v, want, d);
    return NULL;
  }
  return v;
}

static bool gg_is_str(fmt_gguf_type t) { return t == FMT_GGUF_STRING; }
static bool gg_is_intish(fmt_gguf_type t) { return gg_is_int(t) || t == FMT_GGUF_BOOL; }
static bool gg_is_float(fmt_gguf_type t) { return t == FMT_GGUF_F32 || t == FMT_GGUF_F64; }

ir_status fmt_gguf_get_strs(const fmt_gguf *g, const char *key, const fmt_gguf_str **out,
                            uint64_t *out_n, ir_diag *d) {
  const fmt_gguf_value *v = gg_array_of(g, key, gg_is_str, "ARRAY of STRING", d);
  if (!v) return IR_BAD_FORMAT;
  *out = v->strs;
  *out_n = v->count;
  return IR_OK;
}

ir_status fmt_gguf_get_ints(const fmt_gguf *g, const char *key, const int64_t **out,
                            uint64_t *out_n, ir_diag *d) {
  const fmt_gguf_value *v = gg_array_of(g, key, gg_is_intish, "ARRAY of integers", d);
  if (!v) return IR_BAD_FORMAT;
  *out = v->ints;
  *out_n = v->count;
  return IR_OK;
}

ir_status fmt_gguf_get_floats(const fmt_gguf *g, const char *key, const float **out,
                              uint64_t *out_n, ir_diag *d) {
  const fmt_gguf_value *v = gg_array_of(g, key, gg_is_float, "ARRAY of F32", d);
  if (!v) return IR_BAD_FORMAT;
  *out = v->floats;
  *out_n = v->count;
  return IR_OK;
}
