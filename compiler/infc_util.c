/* infc_util: file helpers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "infc_util.h"

ir_status infc_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len,
                         ir_diag *d) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return ir_diag_set(d, IR_IO, "cannot open: %s", strerror(errno));
  char *buf = malloc(max_bytes + 1);
  if (!buf) {
    fclose(f);
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  size_t n = fread(buf, 1, max_bytes + 1, f);
  bool err = ferror(f);
  fclose(f);
  if (err || n > max_bytes) {
    free(buf);
    return err ? ir_diag_set(d, IR_IO, "read failed")
               : ir_diag_set(d, IR_BAD_FORMAT, "file is larger than %zu bytes", max_bytes);
  }
  buf[n] = '\0';
  *out = buf;
  if (out_len) *out_len = n;
  return IR_OK;
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
