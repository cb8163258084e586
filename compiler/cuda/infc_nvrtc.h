/* infc_nvrtc: the NVRTC driver. libnvrtc is loaded at run time (dlopen), so infc builds
 * and runs where no CUDA toolkit is installed and only a CUDA build needs it. Compiles
 * one CUDA C source (kernels/cuda/<op>.cu) for one GPU arch to PTX and CUBIN, and parses
 * ptxas's resource report (registers, stack, spills, shared memory) per kernel.
 * Not thread-safe: one infc_nvrtc per thread. */
#ifndef INFC_NVRTC_H
#define INFC_NVRTC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir_status.h"

typedef struct infc_nvrtc infc_nvrtc;

/* Loads libnvrtc (libnvrtc.so, .so.13, .so.12, then /usr/local/cuda/lib64). *out is owned
 * by the caller (infc_nvrtc_close). Absent: IR_UNSUPPORTED with the message
 * "NVRTC not found: install the CUDA toolkit or build a CPU plan". */
ir_status infc_nvrtc_open(infc_nvrtc **out, ir_diag *d);
/* Frees n; the library itself stays loaded for the life of the process. */
void infc_nvrtc_close(infc_nvrtc *n);
void infc_nvrtc_version(const infc_nvrtc *n, int *out_major, int *out_minor);
/* Keeps compile outputs under dir/nvrtc (made if missing); NULL, "" or "off": no cache (the
 * default). A cache never fails a compile: where it cannot be read or written, it compiles. */
void infc_nvrtc_set_cache(infc_nvrtc *n, const char *dir);

#define INFC_NVRTC_MAX_ARCHS 8
#define INFC_NVRTC_DEFAULT_ARCHS "sm_80,sm_90"

/* Parses an arch list such as "sm_80,sm_90" into compute capabilities {80, 90}
 * (at most cap, each 50..199, no duplicates). */
ir_status infc_nvrtc_parse_archs(const char *list, int *out, int cap, int *out_n, ir_diag *d);

/* Resources of one kernel as ptxas reports them for one arch. */
typedef struct infc_kernel_stats {
  char name[96];
  int registers;
  int stack_bytes;
  int spill_stores; /* bytes */
  int spill_loads;  /* bytes */
  int smem_bytes;   /* static shared memory */
} infc_kernel_stats;

/* One compiled source for one arch. Every pointer is owned by the image. */
typedef struct infc_nvrtc_image {
  int arch;  /* 80 for sm_80 */
  char *ptx; /* NUL-terminated; ptx_size counts the NUL */
  size_t ptx_size;
  uint8_t *cubin;
  size_t cubin_size;
  char *log; /* NVRTC's log: warnings and ptxas's report ("" if none) */
  infc_kernel_stats *stats;
  int n_stats;
  bool from_cache; /* read from the compile cache (infc_nvrtc_compile), not compiled */
} infc_nvrtc_image;

/* Compiles src (named `name` in messages) for sm_<arch>, adding the caller's options
 * (e.g. "-DHEAD_DIM=128") to the fixed ones (arch, -std=c++17, ptxas -v). Fills *out on
 * success (free with infc_nvrtc_image_free); a compile error is IR_BAD_FORMAT with the
 * first lines of the log. Outputs come from, and go to, the compile cache (if one was set:
 * infc_nvrtc_set_cache). */
ir_status infc_nvrtc_compile(infc_nvrtc *n, const char *src, const char *name, int arch,
                             const char *const *opts, int n_opts, infc_nvrtc_image *out,
                             ir_diag *d);
void infc_nvrtc_image_free(infc_nvrtc_image *im);

/* Parses ptxas -v output into at most cap entries; returns the number of kernels found. */
int infc_nvrtc_parse_ptxas(const char *log, infc_kernel_stats *out, int cap);

#endif
