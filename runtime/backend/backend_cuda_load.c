/* backend_cuda_load: finds and loads libinferrt_cuda.so with dlopen when a model is to run
 * on CUDA, so inferrt itself links against nothing CUDA and runs on CPU-only machines. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"

/* The path given (irt_model_opts.cuda_lib), else beside the file this code was loaded from
 * (the inferrt executable, or libinferrt.so inside a Python package) and in ../, ../lib,
 * then the search path. The library stays loaded: the backend's vtable lives in it. */
static void *load_lib(const char *given, char *tried, size_t cap) {
  static void *lib;
  if (lib) return lib;
  char dir[PATH_MAX] = "", path[PATH_MAX + 64];
  if (given && *given) {
    snprintf(tried, cap, "at %s", given);
    return lib = dlopen(given, RTLD_NOW | RTLD_LOCAL);
  }
  Dl_info self;
  ssize_t n = 0;
  if (dladdr((void *)irt_backend_cuda_open, &self) && self.dli_fname &&
      strchr(self.dli_fname, '/') && realpath(self.dli_fname, dir))
    n = (ssize_t)strlen(dir);
  else n = readlink("/proc/self/exe", dir, sizeof dir - 1);
  if (n > 0) {
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
  }
  static const char *const rel[] = {"/", "/../", "/../lib/"};
  for (size_t i = 0; n > 0 && i < sizeof rel / sizeof rel[0] && !lib; i++) {
    snprintf(path, sizeof path, "%s%s" IRT_CUDA_LIB, dir, rel[i]);
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  }
  if (!lib) lib = dlopen(IRT_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
  snprintf(tried, cap, "beside %s or on the library path", n > 0 ? dir : "inferrt");
  return lib;
}

ir_status irt_backend_cuda_open(const irt_cuda_opts *o, const ir_graph *g, rt_backend *out,
                                ir_diag *d) {
  char tried[PATH_MAX + 64];
  void *lib = load_lib(o->lib, tried, sizeof tried);
  if (!lib) {
    const char *why = dlerror();
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "the CUDA backend is not installed (" IRT_CUDA_LIB " not found %s%s%s); "
                       "run with --device cpu or build a CPU plan",
                       tried, why ? ": " : "", why ? why : "");
  }
  void *sym = dlsym(lib, IRT_CUDA_ENTRY);
  irt_cuda_create_fn create;
  if (!sym) return ir_diag_set(d, IR_BAD_FORMAT, IRT_CUDA_LIB " has no " IRT_CUDA_ENTRY);
  memcpy(&create, &sym, sizeof create);
  return create(o, g, out, d);
}
