/* ir_status: diagnostic buffer helpers. */
#include "ir_status.h"

#include <stdio.h>
#include <string.h>

ir_status ir_diag_set(ir_diag *d, ir_status status, const char *fmt, ...) {
  if (!d || d->status != IR_OK) return status;
  d->status = status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->msg, sizeof d->msg, fmt, ap);
  va_end(ap);
  return status;
}

void ir_diag_prefix(ir_diag *d, const char *fmt, ...) {
  if (!d || d->status == IR_OK) return;
  char pre[256], old[sizeof d->msg];
  int room;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  memcpy(old, d->msg, sizeof old);
  /* The cause matters more than the prefix: keep as much of it as fits. */
  room = (int)(sizeof d->msg) - 3 - (int)strnlen(pre, sizeof pre);
  if (room < 0) room = 0;
  snprintf(d->msg, sizeof d->msg, "%s: %.*s", pre, room, old);
}

const char *ir_status_name(ir_status s) {
  switch (s) {
  case IR_OK: return "ok";
  case IR_INVALID_ARG: return "invalid argument";
  case IR_IO: return "i/o error";
  case IR_BAD_FORMAT: return "bad format";
  case IR_VERSION: return "unsupported version";
  case IR_OOM: return "out of memory";
  case IR_UNSUPPORTED: return "unsupported";
  case IR_DEVICE: return "device error";
  case IR_BUSY: return "busy";
  case IR_STATUS_COUNT: break;
  }
  return "unknown";
}
