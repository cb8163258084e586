/* ir_alloc: every heap allocation of the libraries (ir, kernels, text, formats, passes,
 * models, the compiler, the runtime) goes through one function, as Lua's lua_Alloc: a test
 * can fail the N-th allocation and check that each out-of-memory path returns an error and
 * leaks nothing; an embedder can bring its own heap (inferrt.h: irt_set_allocator).
 *
 * Not through it: the third-party libraries' own heaps (libyaml; cJSON only where the
 * runtime installed it as cJSON's hooks), the CPU backend's arenas and KV cache (mapped
 * pages: its device memory) and the CUDA module (a binary of its own). */
#ifndef IR_ALLOC_H
#define IR_ALLOC_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

/* ptr NULL: allocate size bytes (size > 0); size 0: free ptr and return NULL; else resize
 * ptr to size bytes (the contents kept as realloc keeps them). NULL when it cannot. */
typedef void *(*ir_alloc_fn)(void *ud, void *ptr, size_t size);

/* Sets the allocator of every later call (NULL: the C library's). Set it before anything
 * is allocated, and free everything before changing it. Not thread-safe. */
void ir_alloc_set(ir_alloc_fn fn, void *ud);

void *ir_malloc(size_t n);
void *ir_calloc(size_t n, size_t size); /* zeroed; NULL when n * size overflows */
void *ir_realloc(void *p, size_t n);
void ir_free(void *p);
char *ir_strdup(const char *s);
char *ir_strndup(const char *s, size_t n);

/* How many allocations have failed so far in the process. A parser whose NULL means either
 * bad input or no memory (protobuf-c's unpack, cJSON's parse) is told apart by reading it
 * before and after: ir_alloc_failed_since(before). */
unsigned long ir_alloc_failures(void);
#define ir_alloc_failed_since(before) (ir_alloc_failures() != (before))

/* protobuf-c's allocator over the same function: for every message unpacked in library
 * code (the plan's metadata, a tokenizer blob, ONNX models and tensors). */
extern ProtobufCAllocator ir_pb_alloc;

#endif
