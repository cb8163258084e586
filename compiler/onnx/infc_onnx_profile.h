/* infc_onnx_profile: dynamic shapes for generic ONNX graphs, as TensorRT's optimization
 * profiles. Each symbolic input dim is a symbol (inputs sharing a dim_param share it) with a
 * range (infc_options.shapes, else INFC_DEFAULT_DIM_MIN..MAX). The graph is imported at the
 * maxima, so its memory plan covers the largest run; then, once per symbol, at that
 * symbol's maximum minus one, and once at every minimum. Every dim and int attribute that
 * differs between them is an affine function of the symbols, read off the differences and
 * checked at the minima; the plan stores these (ir_profile), and the runtime specializes the
 * graph to the shapes of each run. A graph whose structure or constants change with a
 * symbol, or whose shapes are not affine in them, is refused naming what does. */
#ifndef INFC_ONNX_PROFILE_H
#define INFC_ONNX_PROFILE_H

#include "infc_onnx.h"
#include "infc_options.h"
#include "pass.h"

typedef struct infc_onnx_input_dims {
  char name[128];
  int rank;
  int sym[IR_MAX_RANK]; /* the symbol of each dim, -1 when fixed */
  int64_t fixed[IR_MAX_RANK];
} infc_onnx_input_dims;

typedef struct infc_onnx_dims {
  int n_syms;
  ir_shape_sym syms[IR_MAX_PROFILE_SYMS];
  int n_inputs;
  infc_onnx_input_dims in[64];
} infc_onnx_dims;

/* The symbols of m's inputs with their ranges (o's shapes, else the defaults). */
ir_status infc_onnx_dims_read(const infc_onnx *m, const infc_options *o, infc_onnx_dims *out,
                              ir_diag *d);

/* m's graph imported with every symbol at its value vals[k] (m stays the caller's). */
ir_status infc_onnx_import_at(infc_onnx *m, const ir_model_config *limits,
                              const infc_onnx_dims *dims, const int64_t *vals, ir_graph **out_graph,
                              ir_diag *d);

/* g: m's graph imported at the maxima and run through the pipeline po. Imports the other
 * points from m, runs the same pipeline on them and attaches the profile to g. */
ir_status infc_onnx_profile_build(infc_onnx *m, const ir_model_config *limits,
                                  const infc_onnx_dims *dims, const pass_opts *po, ir_graph *g,
                                  ir_diag *d);

/* "batch=1..64, seq=1..128" into buf. */
void infc_onnx_profile_describe(const ir_profile *p, char *buf, size_t len);

#endif
