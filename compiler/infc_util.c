/* infc_util: file helpers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "infc_util.h"
#include "ir_file.h"

ir_status infc_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
                         ir_diag *d) {
  return ir_file_read(path, max_bytes, out, out_len, d);
}

bool infc_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool infc_file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool infc_path_join(char *buf, size_t len, const char *dir, const char *name) {
  int n = snprintf(buf, len, "%s/%s", dir, name);
  return n > 0 && (size_t)n < len;
}

void infc_path_dir(char *buf, size_t len, const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) {
    snprintf(buf, len, ".");
    return;
  }
  size_t n = (size_t)(slash - path);
  snprintf(buf, len, "%.*s", (int)(n ? n : 1), path);
}
