/* status: the one bridge from the internal status (ir_status + ir_diag, used by every module
 * below the public API) to the public one (irt_status + irt_error). */
#include <stdio.h>
#include <string.h>

#include "model.h"
#include "ir_file.h"

/* The two enums are the same list under two names; each value is pinned here, so a value
 * added to one and not the other fails the build. */
#define SAME(a, b) _Static_assert((int)(a) == (int)(b), #a " is not " #b)
SAME(IR_OK, IRT_OK);
SAME(IR_INVALID_ARG, IRT_INVALID_ARG);
SAME(IR_IO, IRT_IO);
SAME(IR_BAD_FORMAT, IRT_BAD_FORMAT);
SAME(IR_VERSION, IRT_VERSION_MISMATCH);
SAME(IR_OOM, IRT_OOM);
SAME(IR_UNSUPPORTED, IRT_UNSUPPORTED);
SAME(IR_DEVICE, IRT_DEVICE);
SAME(IR_BUSY, IRT_BUSY);
SAME(IR_STATUS_COUNT, IRT_STATUS_COUNT);
#undef SAME

irt_status rt_status_from_ir(ir_status s) {
  return s >= IR_OK && s < IR_STATUS_COUNT ? (irt_status)s : IRT_INVALID_ARG;
}

const char *irt_status_name(irt_status s) { return ir_status_name((ir_status)s); }

irt_status rt_error_from_diag(irt_error *err, const ir_diag *d) {
  irt_status st = rt_status_from_ir(d->status);
  if (err) {
    err->status = st;
    snprintf(err->msg, sizeof err->msg, "%s", d->msg);
  }
  return st;
}

FILE *irt_file_open(const char *path, irt_error *err) {
  ir_diag d = {0};
  FILE *f = ir_file_fopen(path, &d);
  if (!f) {
    ir_diag_prefix(&d, "%s", path);
    rt_error_from_diag(err, &d);
  }
  return f;
}

const char *irt_version(void) { return IRT_VERSION; }

size_t irt_struct_size(const char *name) {
  if (!name) return 0;
#define SIZE(T)                                                                                    \
  if (strcmp(name, #T) == 0) return sizeof(T);
  SIZE(irt_request)
  SIZE(irt_event)
  SIZE(irt_sampling)
  SIZE(irt_engine_opts)
  SIZE(irt_model_opts)
  SIZE(irt_model_info)
  SIZE(irt_error)
  SIZE(irt_chat_message)
  SIZE(irt_chat_opts)
  SIZE(irt_chat_info)
  SIZE(irt_engine_stats)
  SIZE(irt_tensor_info)
#undef SIZE
  return 0;
}
