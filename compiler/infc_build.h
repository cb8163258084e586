/* infc_build: from a source model to a plan file: frontend -> template -> passes ->
 * serialisation. Used by `infc build` and by tests. */
#ifndef INFC_BUILD_H
#define INFC_BUILD_H

#include <stdio.h>

#include "infc_options.h"
#include "pass.h"
#include "ir.h"

typedef struct infc_build_report {
  int nodes_before; /* after lowering, before passes */
  int nodes_after;
  uint64_t weight_bytes;
  uint64_t arena_bytes;
  char source_kind[16]; /* "safetensors" or "gguf" */
  char tokenizer[256];  /* where the plan's tokenizer came from ("" if it has none) */
  char shapes[512];     /* a generic graph's dynamic dims: "batch=1..64" ("" when static) */
  char recognised[512]; /* an ONNX LLM: what was recognised ("2 attention blocks -> ...") */
  pass_results passes;  /* what the passes did: the node counts each took, what was
                           quantized, int8 activations, repacked weights (pass.h; its
                           pass_results_line gives each as the pass log's line) */
} infc_build_report;

/* Lowers `src` (an HF checkpoint directory with config.json, a .safetensors file with
 * config.json beside it, or a .gguf file) to an optimised graph. *out owned by the caller. The source
 * files stay mapped until infc_source_close. dump_ir may be NULL. */
typedef struct infc_source infc_source;
ir_status infc_source_open(const char *src, const infc_options *o, infc_source **out,
                           ir_graph **out_graph, ir_diag *d);
void infc_source_close(infc_source *s);
const char *infc_source_hash(const infc_source *s);

/* The whole build: writes the plan to out_path. report may be NULL. */
ir_status infc_build(const char *src, const infc_options *o, const char *out_path, FILE *dump_ir,
                     infc_build_report *report, ir_diag *d);

#endif
