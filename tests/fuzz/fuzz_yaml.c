/* fuzz_yaml: libFuzzer target for build.yaml (compiler/infc_options.c: libyaml events to
 * infc_options_set), from the defaults; the options it accepts are then described as the
 * plan records them. The input is the file. Build and run: tools/fuzz yaml. */
#include <stdint.h>

#include "fuzz_util.h"
#include "infc_options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fz_write("build.yaml", data, size);
  infc_options o = infc_options_default();
  ir_diag d = {0};
  if (infc_options_load_yaml(&o, path, &d) == IR_OK) {
    const char *keys[64], *values[64];
    char buf[8192];
    (void)infc_options_describe(&o, keys, values, 64, buf, sizeof buf);
    (void)infc_options_act_int8(&o);
  } else {
    fz_note("load", d.msg);
  }
  return 0;
}
