/* fuzz_hfconfig: libFuzzer target for the HF config.json reader (compiler/hf/infc_hfconfig.c),
 * which turns the JSON text into the Llama-family template's parameters; accepted ones go
 * through the template's consistency check (model_llama_check). The input is the file's
 * text. Build and run: tools/fuzz hfconfig. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_util.h"
#include "infc_hfconfig.h"
#include "llama.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *json = fz_strndup(data, size);
  model_llama_params p;
  ir_diag d = {0};
  if (infc_hfconfig_parse(json, &p, &d) == IR_OK) {
    d = (ir_diag){0};
    if (model_llama_check(&p, &d) == IR_OK)
      for (int64_t l = 0; l < p.n_layers && l < 64; l++) (void)model_llama_layer_slides(&p, l);
    else fz_note("check", d.msg);
  } else {
    fz_note("parse", d.msg);
  }
  free(json);
  return 0;
}
