/* cu_api: libcuda and cuBLAS through dlopen (see cu_api.h). Versioned driver symbols
 * (_v2) are the ones cuda.h maps the plain names to. */
#include "cu_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* POSIX lets a data pointer carry a function address; memcpy keeps -Wpedantic quiet. */
static int sym(void *lib, const char *name, void *fn_out, size_t fn_size) {
  void *p = dlsym(lib, name);
  if (!p) return 0;
  memcpy(fn_out, &p, fn_size);
  return 1;
}

#define SYM(lib, api, field, name) sym(lib, name, &(api)->field, sizeof(api)->field)

static int cu_syms(void *lib, cu_api *cu) {
  return SYM(lib, cu, init, "cuInit") && SYM(lib, cu, driver_version, "cuDriverGetVersion") &&
         SYM(lib, cu, device_count, "cuDeviceGetCount") &&
         SYM(lib, cu, device_get, "cuDeviceGet") && SYM(lib, cu, device_name, "cuDeviceGetName") &&
         SYM(lib, cu, device_attr, "cuDeviceGetAttribute") &&
         SYM(lib, cu, ctx_retain, "cuDevicePrimaryCtxRetain") &&
         SYM(lib, cu, ctx_release, "cuDevicePrimaryCtxRelease_v2") &&
         SYM(lib, cu, ctx_set, "cuCtxSetCurrent") &&
         SYM(lib, cu, module_load, "cuModuleLoadData") &&
         SYM(lib, cu, module_unload, "cuModuleUnload") &&
         SYM(lib, cu, module_fn, "cuModuleGetFunction") &&
         SYM(lib, cu, mem_alloc, "cuMemAlloc_v2") && SYM(lib, cu, mem_free, "cuMemFree_v2") &&
         SYM(lib, cu, host_alloc, "cuMemAllocHost_v2") &&
         SYM(lib, cu, host_free, "cuMemFreeHost") && SYM(lib, cu, mem_info, "cuMemGetInfo_v2") &&
         SYM(lib, cu, htod, "cuMemcpyHtoDAsync_v2") && SYM(lib, cu, dtoh, "cuMemcpyDtoHAsync_v2") &&
         SYM(lib, cu, dtod, "cuMemcpyDtoDAsync_v2") && SYM(lib, cu, memset8, "cuMemsetD8Async") &&
         SYM(lib, cu, launch, "cuLaunchKernel") && SYM(lib, cu, stream_create, "cuStreamCreate") &&
         SYM(lib, cu, stream_destroy, "cuStreamDestroy_v2") &&
         SYM(lib, cu, stream_sync, "cuStreamSynchronize") &&
         SYM(lib, cu, capture_begin, "cuStreamBeginCapture_v2") &&
         SYM(lib, cu, capture_end, "cuStreamEndCapture") &&
         SYM(lib, cu, graph_instantiate, "cuGraphInstantiateWithFlags") &&
         SYM(lib, cu, graph_launch, "cuGraphLaunch") &&
         SYM(lib, cu, graph_exec_destroy, "cuGraphExecDestroy") &&
         SYM(lib, cu, graph_destroy, "cuGraphDestroy") &&
         SYM(lib, cu, event_create, "cuEventCreate") &&
         SYM(lib, cu, event_record, "cuEventRecord") &&
         SYM(lib, cu, event_sync, "cuEventSynchronize") &&
         SYM(lib, cu, event_destroy, "cuEventDestroy_v2") &&
         SYM(lib, cu, event_elapsed, "cuEventElapsedTime") &&
         SYM(lib, cu, error_string, "cuGetErrorString");
}

ir_status cu_api_load(cu_api *cu, ir_diag *d) {
  memset(cu, 0, sizeof *cu);
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return ir_diag_set(d, IR_DEVICE,
                       "no CUDA device found; run with --device cpu or build a CPU plan "
                       "(no NVIDIA driver: libcuda.so.1 is not installed)");
  if (!cu_syms(lib, cu)) {
    memset(cu, 0, sizeof *cu);
    return ir_diag_set(d, IR_DEVICE,
                       "the NVIDIA driver is too old (libcuda.so.1 lacks CUDA 12 entry "
                       "points); update it, or run with --device cpu");
  }
  if (!SYM(lib, cu, launch_ex, "cuLaunchKernelEx")) cu->launch_ex = NULL;
  return IR_OK;
}

ir_status cublas_api_load(cublas_api *b, ir_diag *d) {
  static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                                      "/usr/local/cuda/lib64/libcublas.so.13",
                                      "/usr/local/cuda/lib64/libcublas.so.12"};
  memset(b, 0, sizeof *b);
  void *lib = NULL;
  for (size_t i = 0; !lib && i < sizeof names / sizeof names[0]; i++)
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "cuBLAS not found (libcublas.so.13 or .12): install the CUDA toolkit's "
                       "libraries, or run with --device cpu");
  if (!(SYM(lib, b, create, "cublasCreate_v2") && SYM(lib, b, destroy, "cublasDestroy_v2") &&
        SYM(lib, b, set_stream, "cublasSetStream_v2") &&
        SYM(lib, b, set_workspace, "cublasSetWorkspace_v2") &&
        SYM(lib, b, gemm_ex, "cublasGemmEx"))) {
    memset(b, 0, sizeof *b);
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "cuBLAS lacks cublasGemmEx/cublasSetWorkspace "
                       "(CUDA 11.4 or newer is needed)");
  }
  return IR_OK;
}

const char *cu_api_error(const cu_api *cu, CUresult r) {
  const char *s = NULL;
  if (!cu->error_string || cu->error_string(r, &s) != 0 || !s) return "unknown CUDA error";
  return s;
}
