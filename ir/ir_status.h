/* ir_status: the status enum and the diagnostic buffer shared by every module.
 * Library code never prints or exits; it fills an ir_diag and returns a status. */
#ifndef IR_STATUS_H
#define IR_STATUS_H

#include <stdarg.h>

typedef enum ir_status {
  IR_OK = 0,
  IR_INVALID_ARG,
  IR_IO,
  IR_BAD_FORMAT,
  IR_VERSION,
  IR_OOM,
  IR_UNSUPPORTED,
  IR_DEVICE,
  IR_BUSY,
  IR_STATUS_COUNT /* not a status: the number of them */
} ir_status;

/* A caller-owned message buffer. The first error set wins; later calls do not
 * overwrite it, so the innermost cause is what the user sees. */
typedef struct ir_diag {
  ir_status status;
  char msg[512];
} ir_diag;

/* Records status and a printf-style message in d (if d is non-NULL and empty).
 * Returns status so callers can write `return ir_diag_set(d, IR_IO, ...)`. */
ir_status ir_diag_set(ir_diag *d, ir_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message with "prefix: " (e.g. a file name). */
void ir_diag_prefix(ir_diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *ir_status_name(ir_status s);

#endif
