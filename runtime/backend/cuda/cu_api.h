/* cu_api: the CUDA driver API and cuBLAS entry points libinferrt_cuda.so uses, loaded at
 * run time with dlopen (libcuda.so.1 from the driver, libcublas from the toolkit), so the
 * library builds without CUDA headers and links against nothing CUDA. The types mirror
 * cuda.h / cublas_api.h; only the values used are named. */
#ifndef IRT_CU_API_H
#define IRT_CU_API_H

#include <stddef.h>
#include <stdint.h>

#include "ir_status.h"

typedef int CUresult; /* 0: CUDA_SUCCESS */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

enum {
  CU_ERR_OUT_OF_MEMORY = 2,
  CU_ERR_NO_DEVICE = 100,
  CU_ERR_NO_BINARY_FOR_GPU = 209,
  CU_ATTR_MULTIPROCESSOR_COUNT = 16,
  CU_ATTR_CC_MAJOR = 75,
  CU_ATTR_CC_MINOR = 76,
  CU_STREAM_NON_BLOCKING = 1,
  CU_EVENT_DISABLE_TIMING = 2,
  CU_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};

/* cuLaunchKernelEx's CUlaunchAttribute and CUlaunchConfig (cuda.h's layout). */
typedef struct cu_launch_attr {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int value; /* programmaticStreamSerializationAllowed, ... */
    void *align;
  } value;
} cu_launch_attr;
typedef struct cu_launch_config {
  unsigned gx, gy, gz, bx, by, bz, smem;
  CUstream stream;
  cu_launch_attr *attrs;
  unsigned n_attrs;
} cu_launch_config;
_Static_assert(sizeof(cu_launch_attr) == 72 && sizeof(cu_launch_config) == 56,
               "cuda.h's CUlaunchAttribute and CUlaunchConfig (64-bit)");

typedef struct cu_api {
  CUresult (*init)(unsigned flags);
  CUresult (*driver_version)(int *);
  CUresult (*device_count)(int *);
  CUresult (*device_get)(CUdevice *, int ordinal);
  CUresult (*device_name)(char *, int len, CUdevice);
  CUresult (*device_attr)(int *, int attr, CUdevice);
  CUresult (*ctx_retain)(CUcontext *, CUdevice);
  CUresult (*ctx_release)(CUdevice);
  CUresult (*ctx_set)(CUcontext);
  CUresult (*module_load)(CUmodule *, const void *image);
  CUresult (*module_unload)(CUmodule);
  CUresult (*module_fn)(CUfunction *, CUmodule, const char *name);
  CUresult (*mem_alloc)(CUdeviceptr *, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*host_alloc)(void **, size_t);
  CUresult (*host_free)(void *);
  CUresult (*mem_info)(size_t *free_bytes, size_t *total_bytes);
  CUresult (*htod)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*dtod)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*memset8)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*launch)(CUfunction, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                     unsigned bz, unsigned smem, CUstream, void **params, void **extra);
  CUresult (*stream_create)(CUstream *, unsigned flags);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*stream_sync)(CUstream);
  CUresult (*capture_begin)(CUstream, int mode);
  CUresult (*capture_end)(CUstream, CUgraph *);
  CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long flags);
  CUresult (*graph_launch)(CUgraphExec, CUstream);
  CUresult (*graph_exec_destroy)(CUgraphExec);
  CUresult (*graph_destroy)(CUgraph);
  CUresult (*event_create)(CUevent *, unsigned flags);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_sync)(CUevent);
  CUresult (*event_destroy)(CUevent);
  CUresult (*event_elapsed)(float *ms, CUevent start, CUevent end);
  CUresult (*error_string)(CUresult, const char **);
  /* optional (CUDA 12.0+ drivers): NULL where absent */
  CUresult (*launch_ex)(const cu_launch_config *, CUfunction, void **params, void **extra);
} cu_api;

/* cuBLAS (cublas_api.h): status 0 is CUBLAS_STATUS_SUCCESS. */
typedef int cublas_status;
typedef struct cublasContext *cublas_handle;
enum {
  CUB_OP_N = 0,
  CUB_OP_T = 1,
  CUB_R_32F = 0,
  CUB_R_16F = 2,
  CUB_R_16BF = 14,
  CUB_COMPUTE_32F = 68,
  CUB_GEMM_DEFAULT = -1,
};

typedef struct cublas_api {
  cublas_status (*create)(cublas_handle *);
  cublas_status (*destroy)(cublas_handle);
  cublas_status (*set_stream)(cublas_handle, CUstream);
  cublas_status (*set_workspace)(cublas_handle, void *, size_t);
  cublas_status (*gemm_ex)(cublas_handle, int transa, int transb, int m, int n, int k,
                           const void *alpha, const void *a, int atype, int lda, const void *b,
                           int btype, int ldb, const void *beta, void *c, int ctype, int ldc,
                           int compute, int algo);
} cublas_api;

/* Loads libcuda.so.1 into *cu. IR_DEVICE "no CUDA device found; run with --device cpu or
 * build a CPU plan" when the driver is absent. The library stays loaded. */
ir_status cu_api_load(cu_api *cu, ir_diag *d);
/* Loads cuBLAS (libcublas.so.13, .12, libcublas.so) into *b; IR_UNSUPPORTED if absent. */
ir_status cublas_api_load(cublas_api *b, ir_diag *d);
/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory"-style text for r (never NULL). */
const char *cu_api_error(const cu_api *cu, CUresult r);

#endif
