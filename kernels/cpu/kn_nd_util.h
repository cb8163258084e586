/* kn_nd_util: what the n-d kernel families share: element access in any dtype, strides,
 * and a broadcast iterator that collapses dims so inner loops run long and contiguous.
 * Internal to kernels/cpu. */
#ifndef KN_ND_UTIL_H
#define KN_ND_UTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kn_nd.h"

enum { KN_ND_CHUNK = 256 }; /* values converted per step when a dtype is not f32 */

static inline int64_t kn_numel(const kn_view *v) {
  int64_t n = 1;
  for (int i = 0; i < v->rank; i++) n *= v->shape[i];
  return n;
}

static inline size_t kn_esize(ir_dtype t) { return (size_t)ir_dtype_bytes(t, 1); }

/* Contiguous element strides of v. */
static inline void kn_strides(const kn_view *v, int64_t *st) {
  int64_t s = 1;
  for (int i = v->rank - 1; i >= 0; i--) {
    st[i] = s;
    s *= v->shape[i];
  }
}

/* Float conversion clamps into int64 range; NaN becomes 0 (C leaves both undefined). */
static inline int64_t kn_f2i(double v) {
  if (!(v == v)) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

static inline double kn_get_f64(const void *p, ir_dtype t, int64_t i) {
  switch (t) {
  case IR_F32: return ((const float *)p)[i];
  case IR_F16: return ir_f16_to_f32(((const uint16_t *)p)[i]);
  case IR_BF16: return ir_bf16_to_f32(((const uint16_t *)p)[i]);
  case IR_I64: return (double)((const int64_t *)p)[i];
  case IR_I32: return ((const int32_t *)p)[i];
  case IR_I8: return ((const int8_t *)p)[i];
  case IR_U8: return ((const uint8_t *)p)[i];
  default: return 0;
  }
}

static inline int64_t kn_get_i64(const void *p, ir_dtype t, int64_t i) {
  switch (t) {
  case IR_I64: return ((const int64_t *)p)[i];
  case IR_I32: return ((const int32_t *)p)[i];
  case IR_I8: return ((const int8_t *)p)[i];
  case IR_U8: return ((const uint8_t *)p)[i];
  default: return kn_f2i(kn_get_f64(p, t, i));
  }
}

/* Integer stores wrap to the target width, as numpy does. */
static inline void kn_set_i64(void *p, ir_dtype t, int64_t i, int64_t v) {
  switch (t) {
  case IR_I64: ((int64_t *)p)[i] = v; break;
  case IR_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
  case IR_I8: ((int8_t *)p)[i] = (int8_t)(uint8_t)(uint64_t)v; break;
  case IR_U8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)v; break;
  case IR_F32: ((float *)p)[i] = (float)v; break;
  case IR_F16: ((uint16_t *)p)[i] = ir_f32_to_f16((float)v); break;
  case IR_BF16: ((uint16_t *)p)[i] = ir_f32_to_bf16((float)v); break;
  default: break;
  }
}

static inline void kn_set_f64(void *p, ir_dtype t, int64_t i, double v) {
  switch (t) {
  case IR_F32: ((float *)p)[i] = (float)v; break;
  case IR_F16: ((uint16_t *)p)[i] = ir_f32_to_f16((float)v); break;
  case IR_BF16: ((uint16_t *)p)[i] = ir_f32_to_bf16((float)v); break;
  default: kn_set_i64(p, t, i, kn_f2i(v)); break;
  }
}

/* n values from p (dtype t) starting at element off, `stride` apart (0: one value
 * repeated), into dst. */
static inline void kn_load_i64(int64_t *dst, const void *p, ir_dtype t, int64_t off, int64_t stride,
                               int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = kn_get_i64(p, t, off + i * stride);
}

static inline void kn_store_i64(void *p, ir_dtype t, int64_t off, const int64_t *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) kn_set_i64(p, t, off + i, src[i]);
}

/* Copies one element of `size` bytes; the switch lets the compiler use plain moves. */
static inline void kn_copy_elem(void *dst, const void *src, size_t size) {
  switch (size) {
  case 1: *(uint8_t *)dst = *(const uint8_t *)src; break;
  case 2: memcpy(dst, src, 2); break;
  case 4: memcpy(dst, src, 4); break;
  case 8: memcpy(dst, src, 8); break;
  default: memcpy(dst, src, size); break;
  }
}

/* Broadcast iteration over an output shape and up to 3 operands: dims collapsed where
 * every operand is contiguous across them, dims of extent 1 dropped. Operand strides
 * are in elements, 0 along broadcast dims. The innermost dim is `inner`; rows are the
 * product of the others. */
typedef struct kn_bcast {
  int rank; /* >= 1 */
  int n_ops;
  int64_t shape[IR_MAX_RANK];
  int64_t stride[3][IR_MAX_RANK];
  int64_t rows, inner;
} kn_bcast;

/* ops[i] broadcasts to y (ranks right-aligned). */
void kn_bcast_init(kn_bcast *bc, const kn_view *y, const kn_view *const *ops, int n_ops);
/* Element offsets of each operand at the start of row r. */
void kn_bcast_row(const kn_bcast *bc, int64_t r, int64_t *offs);

/* Rows of at least this many values are worth a parallel chunk of their own. */
static inline int64_t kn_grain(int64_t inner, int64_t min_work) {
  return inner > 0 ? 1 + min_work / inner : 1;
}

#endif
