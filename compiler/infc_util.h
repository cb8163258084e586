/* infc_util: small file helpers for the compiler. */
#ifndef INFC_UTIL_H
#define INFC_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "ir_status.h"

/* Reads a whole file (at most max_bytes) into a NUL-terminated malloc'd buffer owned by
 * the caller. out_len may be NULL. Messages do not include the path. */
ir_status infc_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
                         ir_diag *d);
bool infc_is_dir(const char *path);
bool infc_file_exists(const char *path);
/* dir + "/" + name into buf; false if it does not fit. */
bool infc_path_join(char *buf, size_t len, const char *dir, const char *name);
/* The directory part of path ("." if none) into buf. */
void infc_path_dir(char *buf, size_t len, const char *path);

#endif
