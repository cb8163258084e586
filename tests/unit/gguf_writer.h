/* gguf_writer: a minimal GGUF (v2/v3, little-endian) writer for the tests: header,
 * metadata entries, tensor infos with offsets assigned in order, padding and data.
 * It writes whatever it is told, so tests can also build broken files. */
#ifndef GGUF_WRITER_H
#define GGUF_WRITER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_gguf.h"

typedef struct gw {
  uint8_t *b;
  size_t n, cap;
} gw;

static inline void gw_put(gw *w, const void *p, size_t n) {
  if (w->n + n > w->cap) {
    w->cap = (w->n + n) * 2 + 256;
    w->b = realloc(w->b, w->cap);
    if (!w->b) abort();
  }
  if (n) memcpy(w->b + w->n, p, n);
  w->n += n;
}

static inline void gw_le(gw *w, uint64_t v, int n) {
  uint8_t b[8];
  for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
  gw_put(w, b, (size_t)n);
}

static inline void gw_u32(gw *w, uint32_t v) { gw_le(w, v, 4); }
static inline void gw_u64(gw *w, uint64_t v) { gw_le(w, v, 8); }

static inline void gw_f32(gw *w, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  gw_u32(w, u);
}

static inline void gw_str(gw *w, const char *s) {
  gw_u64(w, strlen(s));
  gw_put(w, s, strlen(s));
}

static inline void gw_header(gw *w, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  gw_put(w, "GGUF", 4);
  gw_u32(w, version);
  gw_u64(w, n_tensors);
  gw_u64(w, n_kv);
}

static inline void gw_key(gw *w, const char *k, uint32_t type) {
  gw_str(w, k);
  gw_u32(w, type);
}

static inline void kv_u32(gw *w, const char *k, uint32_t v) {
  gw_key(w, k, FMT_GGUF_U32);
  gw_u32(w, v);
}

static inline void kv_f32(gw *w, const char *k, float v) {
  gw_key(w, k, FMT_GGUF_F32);
  gw_f32(w, v);
}

static inline void kv_str(gw *w, const char *k, const char *v) {
  gw_key(w, k, FMT_GGUF_STRING);
  gw_str(w, v);
}

typedef struct gw_tensor {
  const char *name;
  uint32_t type;
  int rank;
  uint64_t ne[4]; /* GGUF order: ne[0] is the row length */
  const void *data;
  size_t nbytes;
} gw_tensor;

static inline void gw_pad(gw *w, size_t align) {
  static const uint8_t z[256] = {0};
  gw_put(w, z, (align - w->n % align) % align);
}

/* Tensor infos with offsets assigned in order, padding, then the data. */
static inline void gw_tensors(gw *w, const gw_tensor *ts, int nt, size_t align) {
  uint64_t off = 0;
  for (int i = 0; i < nt; i++) {
    gw_str(w, ts[i].name);
    gw_u32(w, (uint32_t)ts[i].rank);
    for (int k = 0; k < ts[i].rank && k < 4; k++) gw_u64(w, ts[i].ne[k]);
    gw_u32(w, ts[i].type);
    gw_u64(w, off);
    off += (ts[i].nbytes + align - 1) / align * align;
  }
  for (int i = 0; i < nt; i++) {
    gw_pad(w, align);
    gw_put(w, ts[i].data, ts[i].nbytes);
  }
}

#endif
