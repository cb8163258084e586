/* onnx_load: maps a model file, decodes its ModelProto, and maps external data files on
 * demand. External locations are relative to the model's directory and must stay inside
 * it (no absolute paths, no "..", no symlink leading out); every offset and length is
 * checked against the file before a pointer is formed. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "infc_util.h"
#include "ir_file.h"
#include "onnx_internal.h"
#include "ir_alloc.h"

/* Maps a whole regular file read-only. An empty file maps to NULL with size 0. */
static ir_status map_file(const char *path, const uint8_t **out, size_t *out_size, ir_diag *d) {
  int fd;
  uint64_t size;
  ir_status st = ir_file_open(path, &fd, &size, d);
  if (st != IR_OK) {
    ir_diag_prefix(d, "%s", path);
    return st;
  }
  *out = NULL;
  *out_size = (size_t)size;
  if (size > 0) {
    void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return ir_diag_set(d, IR_IO, "%s: mmap failed: %s", path, strerror(errno));
    }
    *out = p;
  }
  close(fd);
  return IR_OK;
}

ir_status onnx_model_load(const char *path, infc_onnx **out, ir_diag *d) {
  *out = NULL;
  infc_onnx *m = ir_calloc(1, sizeof *m);
  char dir[4096];
  if (!m || !(m->path = ir_strdup(path))) {
    ir_free(m);
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  ir_status st = map_file(path, &m->map, &m->map_size, d);
  infc_path_dir(dir, sizeof dir, path);
  if (st == IR_OK && !realpath(dir, m->dir))
    st = ir_diag_set(d, IR_IO, "cannot resolve the directory of %s: %s", path, strerror(errno));
  if (st == IR_OK && m->map_size == 0) st = ir_diag_set(d, IR_BAD_FORMAT, "empty file");
  unsigned long fails = ir_alloc_failures();
  if (st == IR_OK && !(m->model = onnx__model_proto__unpack(&ir_pb_alloc, m->map_size, m->map)))
    st = ir_alloc_failed_since(fails)
             ? ir_diag_set(d, IR_OOM, "out of memory")
             : ir_diag_set(d, IR_BAD_FORMAT, "not an ONNX model (the ModelProto does not decode)");
  if (st == IR_OK && !m->model->graph) st = ir_diag_set(d, IR_BAD_FORMAT, "the model has no graph");
  if (st != IR_OK) {
    infc_onnx_close(m);
    return st;
  }
  *out = m;
  return IR_OK;
}

void infc_onnx_close(infc_onnx *m) {
  if (!m) return;
  for (int i = 0; i < m->n_ext; i++) {
    if (m->ext[i].map) munmap((void *)m->ext[i].map, m->ext[i].size);
    ir_free(m->ext[i].location);
  }
  ir_free(m->ext);
  if (m->model) onnx__model_proto__free_unpacked(m->model, &ir_pb_alloc);
  if (m->map) munmap((void *)m->map, m->map_size);
  ir_free(m->path);
  ir_free(m);
}

/* A relative path of plain components: no absolute path, no "..", no empty name. */
static bool safe_location(const char *loc) {
  if (!loc[0] || loc[0] == '/') return false;
  for (const char *p = loc; *p;) {
    const char *e = strchr(p, '/');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n == 2 && p[0] == '.' && p[1] == '.') return false;
    p += n;
    if (*p == '/') p++;
  }
  return true;
}

static ir_status open_ext(infc_onnx *m, const char *loc, onnx_ext_file *f, ir_diag *d) {
  char joined[4096], real[PATH_MAX];
  size_t dl = strlen(m->dir);
  if (!safe_location(loc))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "external data location '%s' leaves the model's "
                       "directory",
                       loc);
  if (!infc_path_join(joined, sizeof joined, m->dir, loc))
    return ir_diag_set(d, IR_BAD_FORMAT, "external data location '%s' is too long", loc);
  if (!realpath(joined, real))
    return ir_diag_set(d, IR_IO, "external data '%s': %s", loc, strerror(errno));
  if (strncmp(real, m->dir, dl) != 0 || (real[dl] != '/' && strcmp(m->dir, "/") != 0))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "external data location '%s' resolves outside the "
                       "model's directory",
                       loc);
  if (!(f->location = ir_strdup(loc))) return ir_diag_set(d, IR_OOM, "out of memory");
  return map_file(real, &f->map, &f->size, d);
}

ir_status onnx_ext_resolve(infc_onnx *m, const char *location, uint64_t offset, uint64_t length,
                           const uint8_t **out, ir_diag *d) {
  onnx_ext_file *f = NULL;
  for (int i = 0; i < m->n_ext && !f; i++)
    if (!strcmp(m->ext[i].location, location)) f = &m->ext[i];
  if (!f) {
    if (m->n_ext >= ONNX_MAX_EXT_FILES)
      return ir_diag_set(d, IR_UNSUPPORTED, "more than %d external data files", ONNX_MAX_EXT_FILES);
    onnx_ext_file *grown = ir_realloc(m->ext, (size_t)(m->n_ext + 1) * sizeof *grown);
    if (!grown) return ir_diag_set(d, IR_OOM, "out of memory");
    m->ext = grown;
    f = &m->ext[m->n_ext];
    memset(f, 0, sizeof *f);
    ir_status st = open_ext(m, location, f, d);
    if (st != IR_OK) {
      ir_free(f->location);
      return st;
    }
    m->n_ext++;
  }
  if (offset > f->size || length > f->size - offset)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "external data '%s': bytes [%" PRIu64 ", +%" PRIu64
                       ") lie outside its %zu bytes",
                       location, offset, length, f->size);
  *out = f->map + offset;
  return IR_OK;
}

static ir_status resolve(void *ctx, const char *location, uint64_t offset, uint64_t length,
                         const uint8_t **out, ir_diag *d) {
  return onnx_ext_resolve(ctx, location, offset, length, out, d);
}

ir_status onnx_tensor_decode(const Onnx__TensorProto *tp, infc_onnx *m, onnx_dense *out,
                             ir_diag *d) {
  return fmt_onnx_tensor_decode(tp, m ? resolve : NULL, m, out, d);
}
