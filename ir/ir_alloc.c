/* ir_alloc: the allocation hook (see ir_alloc.h). */
#include "ir_alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void *libc_alloc(void *ud, void *ptr, size_t size) {
  (void)ud;
  if (size == 0) {
    free(ptr);
    return NULL;
  }
  return realloc(ptr, size);
}

static ir_alloc_fn g_fn = libc_alloc;
static void *g_ud;
static atomic_ulong g_failures;

unsigned long ir_alloc_failures(void) { return atomic_load(&g_failures); }

static void *call(void *ptr, size_t size) {
  void *p = g_fn(g_ud, ptr, size);
  if (!p) atomic_fetch_add(&g_failures, 1);
  return p;
}

void ir_alloc_set(ir_alloc_fn fn, void *ud) {
  g_fn = fn ? fn : libc_alloc;
  g_ud = fn ? ud : NULL;
}

void *ir_malloc(size_t n) { return call(NULL, n ? n : 1); }

void *ir_calloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  size_t bytes = n * size;
  void *p = call(NULL, bytes ? bytes : 1);
  if (p) memset(p, 0, bytes);
  return p;
}

void *ir_realloc(void *p, size_t n) { return call(p, n ? n : 1); }

void ir_free(void *p) {
  if (p) g_fn(g_ud, p, 0);
}

char *ir_strndup(const char *s, size_t n) {
  size_t len = strnlen(s, n);
  char *d = call(NULL, len + 1);
  if (!d) return NULL;
  memcpy(d, s, len);
  d[len] = '\0';
  return d;
}

char *ir_strdup(const char *s) { return ir_strndup(s, SIZE_MAX); }

static void *pb_alloc(void *ud, size_t size) { return ir_malloc(size); }
static void pb_free(void *ud, void *p) { ir_free(p); }

ProtobufCAllocator ir_pb_alloc = {.alloc = pb_alloc, .free = pb_free, .allocator_data = NULL};
