/* infc_codegen_cuda: the CUDA half of `infc build --target cuda`: compiles every embedded
 * kernels/cuda/<op>.cu through NVRTC for each arch of the options, specialised on the
 * graph's constants (-DHEAD_DIM, -DBLOCK_SIZE, -DGQA_GROUP), into a kernel table for
 * ir_plan_info (CUBIN then PTX per source and arch, in source-name order). */
#ifndef INFC_CODEGEN_CUDA_H
#define INFC_CODEGEN_CUDA_H

#include "infc_nvrtc.h"
#include "ir.h"
#include "ir_plan.h"

typedef struct infc_cuda_kernels {
  ir_plan_kernel *table; /* (n): pass as ir_plan_info.kernels */
  int n;
  infc_nvrtc_image *images; /* owners of the table's bytes */
  int n_images;
} infc_cuda_kernels;

/* Fills *out (zeroed first; free with infc_cuda_kernels_free even on failure). archs is a
 * list such as "sm_80,sm_90" ("" or NULL: INFC_NVRTC_DEFAULT_ARCHS). Errors: NVRTC absent
 * (IR_UNSUPPORTED, "NVRTC not found: ..."), a model constant the kernels cannot take
 * (IR_UNSUPPORTED naming it), a compile error (IR_BAD_FORMAT with the log). */
/* cache_dir: NVRTC's compile cache (infc_nvrtc_set_cache; NULL or "": none). */
ir_status infc_cuda_kernels_build(const ir_graph *g, const char *archs, const char *cache_dir,
                                  infc_cuda_kernels *out, ir_diag *d);
void infc_cuda_kernels_free(infc_cuda_kernels *k);

#endif
