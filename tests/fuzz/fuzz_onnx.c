/* fuzz_onnx: libFuzzer target for the ONNX frontend (compiler/onnx): the ModelProto loader
 * (onnx_load.c, protobuf-c over the mapping), then what `infc build` does with a .onnx file:
 * infc_onnx_llm_import (a causal LM recognised and rebuilt by the Llama template, or the
 * GenAI builder's graphs) and, for any other graph, infc_onnx_import (the generic lowering to
 * n-d IR ops with shape folding; with symbolic input dims, the dynamic-shape profile built
 * over ranges 1..3: infc_onnx_profile.h). The same bytes are also read as a TensorProto file
 * (fmt_onnx_tensor_load, `inferrt run`'s inputs). The input is the whole model.onnx, in a
 * private directory: no config.json beside it, and the external data files it can name are
 * itself, its copy tensor.pb and model.onnx.data, a copy of tests/fixtures/onnx-genai-int4's
 * (so that seed, and mutations of it, reach the GenAI decoder's weights). Build and run:
 * tools/fuzz onnx. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "infc_onnx.h"
#include "infc_onnx_llm.h"
#include "infc_onnx_profile.h"
#include "model_template.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  FILE *f = fopen(FUZZ_FIXTURES "/onnx-genai-int4/model.onnx.data", "rb");
  static uint8_t buf[1 << 20];
  size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
  if (!f || n == sizeof buf) {
    fprintf(stderr, "fuzz_onnx: cannot read onnx-genai-int4/model.onnx.data\n");
    abort();
  }
  fclose(f);
  fz_write("model.onnx.data", buf, n);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* both files first: a model may name either as its external data */
  const char *path = fz_write("model.onnx", data, size);
  const char *tpath = fz_write("tensor.pb", data, size);
  model_build_opts bo = model_build_opts_default();
  bo.max_tokens = 16, bo.max_seqs = 4, bo.max_logits = 4, bo.max_context = 64;
  infc_onnx *m = NULL;
  ir_graph *g = NULL;
  char hash[17], recognised[INFC_ONNX_LLM_RECOGNISED];
  bool is_lm = false;
  ir_diag d = {0};
  ir_status st = infc_onnx_llm_import(path, &bo, &is_lm, &m, &g, hash, recognised, &d);
  if (st == IR_OK && !is_lm) {
    ir_model_config lim = {.max_tokens = 16, .max_seqs = 4, .max_logits = 4, .kv_block_size = 16};
    static infc_onnx_dims dims;
    infc_options o = infc_options_default();
    d = (ir_diag){0};
    st = infc_onnx_load(path, &m, &d);
    if (st == IR_OK) st = infc_onnx_dims_read(m, &o, &dims, &d);
    int64_t max[IR_MAX_PROFILE_SYMS];
    for (int k = 0; st == IR_OK && k < dims.n_syms; k++) dims.syms[k].max = 3, max[k] = 3;
    if (st == IR_OK && !dims.n_syms) st = infc_onnx_import_loaded(m, &lim, NULL, 0, &g, &d);
    else if (st == IR_OK) st = infc_onnx_import_at(m, &lim, &dims, max, &g, &d);
    pass_opts po = {.fold = true};
    pass_log log = {0};
    if (st == IR_OK && dims.n_syms) {
      st = pass_pipeline_run(g, &po, &log, &d);
      if (st == IR_OK) st = infc_onnx_profile_build(m, &lim, &dims, &po, g, &d);
    }
    pass_log_free(&log);
  }
  if (st != IR_OK) fz_note("import", d.msg);
  ir_graph_destroy(g);
  infc_onnx_close(m);
  fmt_onnx_tensor t = {0};
  d = (ir_diag){0};
  if (fmt_onnx_tensor_load(tpath, &t, &d) == IR_OK) fmt_onnx_tensor_free(&t);
  return 0;
}
