/* ir_file: regular files only, opened without blocking, reads bounded. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ir_file.h"
#include "ir_alloc.h"

ir_status ir_file_open(const char *path, int *out_fd, uint64_t *out_size, ir_diag *d) {
  *out_fd = -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return ir_diag_set(d, IR_IO, "cannot open: %s", strerror(errno));
  struct stat st;
  ir_status bad = IR_OK;
  if (fstat(fd, &st) != 0) bad = ir_diag_set(d, IR_IO, "cannot stat: %s", strerror(errno));
  else if (S_ISDIR(st.st_mode)) bad = ir_diag_set(d, IR_IO, "is a directory, not a file");
  else if (!S_ISREG(st.st_mode) || st.st_size < 0)
    bad = ir_diag_set(d, IR_IO, "not a regular file (a FIFO, socket or device)");
  if (bad != IR_OK) {
    close(fd);
    return bad;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  *out_fd = fd;
  *out_size = (uint64_t)st.st_size;
  return IR_OK;
}

FILE *ir_file_fopen(const char *path, ir_diag *d) {
  int fd;
  uint64_t size;
  if (ir_file_open(path, &fd, &size, d) != IR_OK) return NULL;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    ir_diag_set(d, IR_IO, "cannot open: %s", strerror(errno));
    close(fd);
  }
  return f;
}

ir_status ir_file_read(const char *path, size_t max_bytes, char **out, size_t *out_len,
                       ir_diag *d) {
  *out = NULL;
  if (out_len) *out_len = 0;
  int fd;
  uint64_t size;
  ir_status st = ir_file_open(path, &fd, &size, d);
  if (st != IR_OK) return st;
  if (size > max_bytes) {
    close(fd);
    return ir_diag_set(d, IR_BAD_FORMAT, "file is larger than %zu bytes (%llu)", max_bytes,
                       (unsigned long long)size);
  }
  char *buf = ir_malloc((size_t)size + 1);
  if (!buf) {
    close(fd);
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  size_t n = 0;
  while (n < size) { /* a file that shrinks under us reads short; one that grows, to size */
    ssize_t r = read(fd, buf + n, (size_t)size - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      ir_free(buf);
      close(fd);
      return ir_diag_set(d, IR_IO, "read failed: %s", strerror(e));
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  *out = buf;
  if (out_len) *out_len = n;
  return IR_OK;
}
