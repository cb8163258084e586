/* fuzz_safetensors: libFuzzer target for the safetensors reader (formats/fmt_safetensors.c):
 * the 8-byte header length, the header JSON (dtypes, shapes, data_offsets, __metadata__) and
 * the tensor table built from it. The input is one whole .safetensors file; every tensor's
 * data is then touched at both ends and looked up by name. Build and run: tools/fuzz
 * safetensors. */
#include <stdint.h>
#include <string.h>

#include "fuzz_util.h"
#include "fmt_safetensors.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fz_write("model.safetensors", data, size);
  fmt_st *st = NULL;
  ir_diag d = {0};
  if (fmt_st_open(path, &st, &d) != IR_OK) {
    fz_note("open", d.msg);
    return 0;
  }
  for (size_t i = 0; i < fmt_st_count(st); i++) {
    const fmt_st_tensor *t = fmt_st_get(st, i);
    sink += strlen(t->name) + (fmt_st_find(st, t->name) == t) + (uint64_t)t->rank;
    for (int k = 0; k < t->rank && k < FMT_ST_MAX_RANK; k++) sink += (uint64_t)t->shape[k];
    if (t->nbytes)
      sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
  }
  const char *m = fmt_st_metadata(st, "format");
  if (m) sink += strlen(m);
  fmt_st_close(st);
  return 0;
}
