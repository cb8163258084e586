/* alloc: the public face of the allocation hook (ir/ir_alloc.h). */
#include <cjson/cJSON.h>

#include "inferrt.h"
#include "ir_alloc.h"

static void *cjson_malloc(size_t n) { return ir_malloc(n); }
static void cjson_free(void *p) { ir_free(p); }

void irt_set_allocator(irt_alloc_fn fn, void *ud) {
  ir_alloc_set(fn, ud);
  cJSON_Hooks h = {.malloc_fn = fn ? cjson_malloc : NULL, .free_fn = fn ? cjson_free : NULL};
  cJSON_InitHooks(&h); /* NULLs: back to malloc / free */
}

void irt_free(void *p) { ir_free(p); }
