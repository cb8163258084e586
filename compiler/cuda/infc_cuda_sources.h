/* infc_cuda_sources: the kernels/cuda/<op>.cu sources, and the .cuh headers they include,
 * embedded into infc at build time (kernels/cuda/embed_sources.cmake), sorted by name. */
#ifndef INFC_CUDA_SOURCES_H
#define INFC_CUDA_SOURCES_H

#include <stddef.h>

typedef struct infc_cuda_source {
  const char *name; /* "attention" for attention.cu; "kn_cuda.cuh" for a header */
  const char *text; /* NUL-terminated CUDA C */
  size_t len;
} infc_cuda_source;

extern const infc_cuda_source infc_cuda_sources[]; /* (infc_cuda_n_sources) */
extern const int infc_cuda_n_sources;
extern const infc_cuda_source infc_cuda_headers[]; /* (infc_cuda_n_headers): NVRTC gets all */
extern const int infc_cuda_n_headers;

#endif
