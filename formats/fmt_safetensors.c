/* infc_safetensors: mmap-backed reader for HF safetensors files and sharded directories.
 * Nothing in a header is trusted: every field is checked before a pointer is formed. */
#include "fmt_safetensors.h"
#include "ir_alloc.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u * 1000u * 1000u) /* bytes of header JSON (and of index.json) */
#define ST_MAX_EXACT ((uint64_t)1 << 53)     /* JSON numbers are doubles: exact below this */
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

typedef struct st_file {
  char *path;  /* as opened: the argument, or DIR/shard */
  char *shard; /* shard name from the index, NULL for a single file */
  const uint8_t *map;
  size_t size;
} st_file;

typedef struct st_entry {
  fmt_st_tensor t;     /* first member: fmt_st_get hands out &entry->t */
  size_t file;         /* index into fmt_st.files */
  uint64_t begin, end; /* data_offsets, relative to the file's data section */
} st_entry;

struct fmt_st {
  st_file *files;
  size_t nfiles;
  st_entry *entries; /* sorted by name once all files are read */
  size_t count, cap;
  char **meta; /* key, value, key, value, ... from the first file */
  size_t nmeta;
};

/* ---- small helpers ---------------------------------------------------------------- */

static ir_dtype st_dtype_from_name(const char *s) {
  static const struct {
    const char *name;
    ir_dtype t;
  } k_map[] = {
      {"F32", IR_F32}, {"F16", IR_F16}, {"BF16", IR_BF16}, {"I64", IR_I64},
      {"I32", IR_I32}, {"I8", IR_I8},   {"U8", IR_U8},
  };
  for (size_t i = 0; i < sizeof k_map / sizeof k_map[0]; i++)
    if (strcmp(s, k_map[i].name) == 0) return k_map[i].t;
  return IR_DTYPE_INVALID;
}

/* A JSON number that is a non-negative integer small enough to be exact. */
static bool st_json_u64(const cJSON *j, uint64_t *out) {
  if (!cJSON_IsNumber(j)) return false;
  double v = j->valuedouble;
  if (!isfinite(v) || v < 0 || v != floor(v) || v > (double)ST_MAX_EXACT) return false;
  *out = (uint64_t)v;
  return true;
}

static char *st_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = ir_malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

static char *st_join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = ir_malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  p[a] = '/';
  memcpy(p + a + 1, name, b + 1);
  return p;
}

static int st_cmp_name(const void *a, const void *b) {
  return strcmp(((const st_entry *)a)->t.name, ((const st_entry *)b)->t.name);
}

/* ---- one tensor entry ------------------------------------------------------------- */

static ir_status st_parse_shape(const cJSON *shape, const char *name, fmt_st_tensor *t,
                                uint64_t *out_elems, ir_diag *d) {
  if (!cJSON_IsArray(shape))
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': shape is not an array", name);
  int rank = cJSON_GetArraySize(shape);
  if (rank > FMT_ST_MAX_RANK)
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': rank %d exceeds the limit of %d", name,
                       rank, FMT_ST_MAX_RANK);
  int i = 0;
  for (const cJSON *e = shape->child; e; e = e->next, i++) {
    uint64_t dim;
    if (!st_json_u64(e, &dim))
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "tensor '%.200s': shape[%d] is not a non-negative integer", name, i);
    t->shape[i] = (int64_t)dim;
  }
  t->rank = rank;
  uint64_t elems = 1;
  for (int k = 0; k < rank; k++)
    if (t->shape[k] == 0) elems = 0;
  for (int k = 0; k < rank && elems != 0; k++) {
    uint64_t dim = (uint64_t)t->shape[k];
    if (elems > ST_MAX_EXACT / dim)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': element count overflows", name);
    elems *= dim;
  }
  *out_elems = elems;
  return IR_OK;
}

static ir_status st_parse_offsets(const cJSON *offs, const char *name, st_entry *e, ir_diag *d) {
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor '%.200s': data_offsets is not an array of two integers", name);
  if (!st_json_u64(offs->child, &e->begin) || !st_json_u64(offs->child->next, &e->end))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor '%.200s': data_offsets are not non-negative integers", name);
  if (e->begin > e->end)
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': data_offsets begin %llu > end %llu",
                       name, (unsigned long long)e->begin, (unsigned long long)e->end);
  return IR_OK;
}

static void st_format_shape(const fmt_st_tensor *t, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < t->rank && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Picks the three fields out of an entry object, refusing unknown or repeated keys. */
static ir_status st_entry_fields(const cJSON *item, const char *name, const cJSON *f[3],
                                 ir_diag *d) {
  static const char *const k_keys[3] = {"dtype", "shape", "data_offsets"};
  if (!cJSON_IsObject(item))
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': entry is not an object", name);
  for (const cJSON *c = item->child; c; c = c->next) {
    int k = 0;
    while (k < 3 && strcmp(c->string, k_keys[k]) != 0) k++;
    if (k == 3 || f[k])
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': %s key '%.100s'", name,
                         k == 3 ? "unexpected" : "repeated", c->string);
    f[k] = c;
  }
  for (int k = 0; k < 3; k++)
    if (!f[k])
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': missing '%s'", name, k_keys[k]);
  return IR_OK;
}

static ir_status st_parse_entry(const cJSON *item, st_entry *e, ir_diag *d) {
  const char *name = item->string;
  const cJSON *f[3] = {NULL, NULL, NULL};
  ir_status s = st_entry_fields(item, name, f, d);
  if (s != IR_OK) return s;
  if (!cJSON_IsString(f[0]))
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s': dtype is not a string", name);
  e->t.dtype = st_dtype_from_name(f[0]->valuestring);
  if (e->t.dtype == IR_DTYPE_INVALID)
    return ir_diag_set(d, IR_UNSUPPORTED, "tensor '%.200s': dtype '%.40s' is not supported", name,
                       f[0]->valuestring);
  uint64_t elems = 0;
  if ((s = st_parse_shape(f[1], name, &e->t, &elems, d)) != IR_OK) return s;
  if ((s = st_parse_offsets(f[2], name, e, d)) != IR_OK) return s;
  uint64_t want = ir_dtype_bytes(e->t.dtype, elems); /* elems < 2^53, size <= 8: no wrap */
  if (e->end - e->begin != want) {
    char shp[160];
    st_format_shape(&e->t, shp, sizeof shp);
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor '%.200s': data_offsets [%llu, %llu) do not match shape %s of "
                       "%s (%llu bytes)",
                       name, (unsigned long long)e->begin, (unsigned long long)e->end, shp,
                       f[0]->valuestring, (unsigned long long)want);
  }
  e->t.nbytes = want;
  return IR_OK;
}

/* ---- one file --------------------------------------------------------------------- */

static ir_status st_map_file(st_file *f, ir_diag *d) {
  int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ir_diag_set(d, IR_IO, "cannot open: %s", strerror(errno));
  struct stat sb;
  ir_status s = IR_OK;
  if (fstat(fd, &sb) != 0) s = ir_diag_set(d, IR_IO, "cannot stat: %s", strerror(errno));
  else if (!S_ISREG(sb.st_mode)) s = ir_diag_set(d, IR_IO, "not a regular file");
  else if (sb.st_size < 8)
    s = ir_diag_set(d, IR_BAD_FORMAT, "file is %lld bytes, too short for a header length",
                    (long long)sb.st_size);
  if (s == IR_OK) {
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) s = ir_diag_set(d, IR_IO, "cannot mmap: %s", strerror(errno));
    else f->map = p, f->size = (size_t)sb.st_size;
  }
  close(fd);
  return s;
}

/* The JSON values in buf[0..n) (commas and openers outside strings, + 1): what a cJSON tree
 * of it costs, about 64 bytes a value plus strings. */
static size_t st_json_values(const uint8_t *buf, size_t n) {
  size_t v = 1;
  bool in_str = false;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = buf[i];
    if (in_str) {
      if (c == '\\') i++;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else {
      v += c == ',' || c == '[' || c == '{';
    }
  }
  return v;
}

/* Parses a JSON object held in buf[0..n); buf need not be NUL-terminated. A header or index
 * whose values are denser than one per 6 bytes is refused before cJSON builds its tree: real
 * ones hold one per 10-12 (tensor names, dtypes, shapes), and a dense array of small numbers
 * would cost 30-40x its bytes (an 8 MB header: 340 MB); the bound keeps it under ~12x. */
static ir_status st_parse_json(const uint8_t *buf, size_t n, const char *what, cJSON **out,
                               ir_diag *d) {
  if (n && memchr(buf, 0, n)) return ir_diag_set(d, IR_BAD_FORMAT, "%s contains a NUL byte", what);
  size_t values = st_json_values(buf, n);
  if (values > n / 6 + 4096)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "%s holds %zu JSON values in %zu bytes: denser than "
                       "any tensor table (refused before parsing)",
                       what, values, n);
  char *copy = ir_malloc(n + 1); /* cJSON gets a terminated copy, never the mapping itself */
  if (!copy) return ir_diag_set(d, IR_OOM, "out of memory reading %s", what);
  if (n) memcpy(copy, buf, n);
  copy[n] = '\0';
  const char *end = NULL;
  unsigned long fails = ir_alloc_failures();
  cJSON *root = cJSON_ParseWithLengthOpts(copy, n, &end, 0);
  ir_status s = IR_OK;
  if (!root && ir_alloc_failed_since(fails)) {
    s = ir_diag_set(d, IR_OOM, "out of memory reading %s", what);
  } else if (!root) {
    s = ir_diag_set(d, IR_BAD_FORMAT, "%s is not valid JSON (near byte %lld)", what,
                    end ? (long long)(end - copy) : -1LL);
  } else {
    while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r') end++;
    if (*end) s = ir_diag_set(d, IR_BAD_FORMAT, "%s has trailing bytes after the JSON", what);
    else if (!cJSON_IsObject(root))
      s = ir_diag_set(d, IR_BAD_FORMAT, "%s is not a JSON object", what);
  }
  ir_free(copy);
  if (s != IR_OK) cJSON_Delete(root), root = NULL;
  *out = root;
  return s;
}

static ir_status st_read_header(const st_file *f, cJSON **out, uint64_t *out_data_size,
                                ir_diag *d) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | f->map[i];
  uint64_t avail = f->size - 8;
  if (n > avail)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "truncated: header length %llu exceeds the %llu bytes after it",
                       (unsigned long long)n, (unsigned long long)avail);
  if (n > ST_MAX_HEADER)
    return ir_diag_set(d, IR_BAD_FORMAT, "header length %llu exceeds the limit of %u bytes",
                       (unsigned long long)n, ST_MAX_HEADER);
  *out_data_size = avail - n;
  return st_parse_json(f->map + 8, (size_t)n, "header", out, d);
}

static ir_status st_parse_metadata(fmt_st *st, const cJSON *m, bool keep, ir_diag *d) {
  if (!cJSON_IsObject(m)) return ir_diag_set(d, IR_BAD_FORMAT, "__metadata__ is not an object");
  size_t n = 0;
  for (const cJSON *c = m->child; c; c = c->next, n++)
    if (!cJSON_IsString(c))
      return ir_diag_set(d, IR_BAD_FORMAT, "__metadata__ '%.200s' is not a string", c->string);
  if (!keep || n == 0) return IR_OK;
  st->meta = ir_calloc(2 * n, sizeof *st->meta);
  if (!st->meta) return ir_diag_set(d, IR_OOM, "out of memory");
  st->nmeta = n;
  size_t i = 0;
  for (const cJSON *c = m->child; c; c = c->next, i += 2) {
    st->meta[i] = st_strdup(c->string);
    st->meta[i + 1] = st_strdup(c->valuestring);
    if (!st->meta[i] || !st->meta[i + 1]) return ir_diag_set(d, IR_OOM, "out of memory");
  }
  return IR_OK;
}

static ir_status st_push_entry(fmt_st *st, st_entry *e, const char *name, ir_diag *d) {
  if (st->count == st->cap) {
    size_t cap = st->cap ? 2 * st->cap : 64;
    st_entry *p = ir_realloc(st->entries, cap * sizeof *p);
    if (!p) return ir_diag_set(d, IR_OOM, "out of memory");
    st->entries = p, st->cap = cap;
  }
  e->t.name = st_strdup(name);
  if (!e->t.name) return ir_diag_set(d, IR_OOM, "out of memory");
  st->entries[st->count++] = *e;
  return IR_OK;
}

static int st_cmp_begin(const void *a, const void *b) {
  const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

/* Entries [first, st->count) all come from one file; empty tensors overlap nothing. */
static ir_status st_check_overlap(const fmt_st *st, size_t first, ir_diag *d) {
  size_t n = st->count - first;
  if (n < 2) return IR_OK;
  const st_entry **v = ir_malloc(n * sizeof *v);
  if (!v) return ir_diag_set(d, IR_OOM, "out of memory");
  for (size_t i = 0; i < n; i++) v[i] = &st->entries[first + i];
  qsort(v, n, sizeof *v, st_cmp_begin);
  ir_status s = IR_OK;
  const st_entry *prev = NULL;
  for (size_t i = 0; i < n && s == IR_OK; i++) {
    if (v[i]->begin == v[i]->end) continue;
    if (prev && v[i]->begin < prev->end)
      s = ir_diag_set(d, IR_BAD_FORMAT,
                      "tensor '%.200s' [%llu, %llu) overlaps tensor '%.200s' [%llu, %llu)",
                      v[i]->t.name, (unsigned long long)v[i]->begin, (unsigned long long)v[i]->end,
                      prev->t.name, (unsigned long long)prev->begin, (unsigned long long)prev->end);
    if (!prev || v[i]->end > prev->end) prev = v[i];
  }
  ir_free(v);
  return s;
}

static ir_status st_add_entries(fmt_st *st, const cJSON *root, size_t file, uint64_t data_size,
                                ir_diag *d) {
  const st_file *f = &st->files[file];
  const uint8_t *data = f->map + (f->size - data_size);
  ir_status s = IR_OK;
  bool seen_meta = false;
  for (const cJSON *c = root->child; c && s == IR_OK; c = c->next) {
    if (strcmp(c->string, "__metadata__") == 0) {
      if (seen_meta) return ir_diag_set(d, IR_BAD_FORMAT, "__metadata__ appears twice");
      seen_meta = true;
      s = st_parse_metadata(st, c, file == 0, d);
      continue;
    }
    st_entry e;
    memset(&e, 0, sizeof e);
    e.file = file;
    if ((s = st_parse_entry(c, &e, d)) != IR_OK) break;
    if (e.end > data_size)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "truncated: tensor '%.200s' ends at byte %llu of the data section, "
                         "which holds %llu bytes",
                         c->string, (unsigned long long)e.end, (unsigned long long)data_size);
    e.t.data = data + e.begin;
    s = st_push_entry(st, &e, c->string, d);
  }
  return s;
}

/* Maps st->files[file], validates its header and appends its tensors. */
static ir_status st_load_file(fmt_st *st, size_t file, ir_diag *d) {
  st_file *f = &st->files[file];
  cJSON *root = NULL;
  uint64_t data_size = 0;
  size_t first = st->count;
  ir_status s = st_map_file(f, d);
  if (s == IR_OK) s = st_read_header(f, &root, &data_size, d);
  if (s == IR_OK) s = st_add_entries(st, root, file, data_size, d);
  if (s == IR_OK) s = st_check_overlap(st, first, d);
  cJSON_Delete(root);
  if (s != IR_OK) ir_diag_prefix(d, "%s", f->path);
  return s;
}

/* ---- the whole checkpoint --------------------------------------------------------- */

static ir_status st_add_file(fmt_st *st, char *path, char *shard, ir_diag *d) {
  st_file *p = ir_realloc(st->files, (st->nfiles + 1) * sizeof *p);
  if (!p) {
    ir_free(path), ir_free(shard);
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  st->files = p;
  st->files[st->nfiles++] = (st_file){.path = path, .shard = shard};
  if (!path) return ir_diag_set(d, IR_OOM, "out of memory");
  return st_load_file(st, st->nfiles - 1, d);
}

static ir_status st_sort_unique(fmt_st *st, ir_diag *d) {
  if (st->count > 1) qsort(st->entries, st->count, sizeof *st->entries, st_cmp_name);
  for (size_t i = 1; i < st->count; i++) {
    const st_entry *a = &st->entries[i - 1], *b = &st->entries[i];
    if (strcmp(a->t.name, b->t.name) != 0) continue;
    const char *fa = st->files[a->file].path, *fb = st->files[b->file].path;
    if (a->file == b->file)
      return ir_diag_set(d, IR_BAD_FORMAT, "%s: tensor '%.200s' appears twice", fa, a->t.name);
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%.200s' appears in both %s and %s", a->t.name, fa,
                       fb);
  }
  return IR_OK;
}

static ir_status st_slurp(const char *path, uint8_t **out_buf, size_t *out_n, ir_diag *d) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ir_diag_set(d, IR_IO, "cannot open: %s", strerror(errno));
  struct stat sb;
  ir_status s = IR_OK;
  if (fstat(fd, &sb) != 0) s = ir_diag_set(d, IR_IO, "cannot stat: %s", strerror(errno));
  else if (!S_ISREG(sb.st_mode)) s = ir_diag_set(d, IR_IO, "not a regular file");
  else if ((uint64_t)sb.st_size > ST_MAX_HEADER)
    s = ir_diag_set(d, IR_BAD_FORMAT, "file exceeds the limit of %u bytes", ST_MAX_HEADER);
  uint8_t *buf = NULL;
  if (s == IR_OK && !(buf = ir_malloc((size_t)sb.st_size + 1)))
    s = ir_diag_set(d, IR_OOM, "out of memory");
  size_t got = 0;
  while (s == IR_OK && got < (size_t)sb.st_size) {
    ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) s = ir_diag_set(d, IR_IO, "cannot read: %s", r ? strerror(errno) : "short read");
    else got += (size_t)r;
  }
  close(fd);
  if (s != IR_OK) {
    ir_free(buf);
    return s;
  }
  *out_buf = buf, *out_n = got;
  return IR_OK;
}

static ir_status st_read_small_file(const char *path, cJSON **out, ir_diag *d) {
  uint8_t *buf = NULL;
  size_t n = 0;
  ir_status s = st_slurp(path, &buf, &n, d);
  if (s == IR_OK) s = st_parse_json(buf, n, "index", out, d);
  ir_free(buf);
  if (s != IR_OK) ir_diag_prefix(d, "%s", path);
  return s;
}

static int st_cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks the weight_map values and opens each distinct shard once, in name order. */
static ir_status st_open_shards(fmt_st *st, const char *dir, const cJSON *wm, ir_diag *d) {
  size_t n = (size_t)cJSON_GetArraySize(wm), k = 0;
  const char **names = ir_malloc((n ? n : 1) * sizeof *names);
  if (!names) return ir_diag_set(d, IR_OOM, "out of memory");
  ir_status s = IR_OK;
  for (const cJSON *c = wm->child; c && s == IR_OK; c = c->next, k++) {
    const char *v = cJSON_IsString(c) ? c->valuestring : NULL;
    if (!v || !*v || strchr(v, '/') || strcmp(v, ".") == 0 || strcmp(v, "..") == 0)
      s = ir_diag_set(d, IR_BAD_FORMAT,
                      "%s/" ST_INDEX_NAME ": weight_map entry '%.200s' is not a shard file name",
                      dir, c->string);
    names[k] = v;
  }
  if (s == IR_OK && n > 1) qsort(names, n, sizeof *names, st_cmp_str);
  for (size_t i = 0; i < n && s == IR_OK; i++) {
    if (i > 0 && strcmp(names[i], names[i - 1]) == 0) continue;
    char *shard = st_strdup(names[i]);
    if (!shard) s = ir_diag_set(d, IR_OOM, "out of memory");
    else s = st_add_file(st, st_join(dir, names[i]), shard, d);
  }
  ir_free(names);
  return s;
}

/* Every tensor the index names must be in the shard the index names. */
static ir_status st_check_index(const fmt_st *st, const char *dir, const cJSON *wm, ir_diag *d) {
  for (const cJSON *c = wm->child; c; c = c->next) {
    const st_entry *e = (const st_entry *)fmt_st_find(st, c->string);
    const char *shard = e ? st->files[e->file].shard : NULL;
    if (!shard || strcmp(shard, c->valuestring) != 0)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "%s/" ST_INDEX_NAME ": tensor '%.200s' is listed in shard '%.200s' "
                         "but is not there",
                         dir, c->string, c->valuestring);
  }
  return IR_OK;
}

static ir_status st_open_index(fmt_st *st, const char *dir, const char *index_path, ir_diag *d) {
  cJSON *root = NULL;
  ir_status s = st_read_small_file(index_path, &root, d);
  if (s != IR_OK) return s;
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (!cJSON_IsObject(wm))
    s = ir_diag_set(d, IR_BAD_FORMAT, "%s: weight_map is missing or not an object", index_path);
  if (s == IR_OK) s = st_open_shards(st, dir, wm, d);
  if (s == IR_OK) s = st_sort_unique(st, d);
  if (s == IR_OK) s = st_check_index(st, dir, wm, d);
  cJSON_Delete(root);
  return s;
}

static ir_status st_open_dir(fmt_st *st, const char *dir, ir_diag *d) {
  char *index = st_join(dir, ST_INDEX_NAME);
  char *single = st_join(dir, ST_SINGLE_NAME);
  ir_status s = IR_OK;
  if (!index || !single) {
    s = ir_diag_set(d, IR_OOM, "out of memory");
  } else if (access(index, F_OK) == 0) {
    s = st_open_index(st, dir, index, d);
  } else if (access(single, F_OK) == 0) {
    s = st_add_file(st, single, NULL, d);
    single = NULL; /* owned by st->files now */
    if (s == IR_OK) s = st_sort_unique(st, d);
  } else {
    s = ir_diag_set(d, IR_IO, "no " ST_SINGLE_NAME " or " ST_INDEX_NAME " in %s", dir);
  }
  ir_free(index);
  ir_free(single);
  return s;
}

ir_status fmt_st_open(const char *path, fmt_st **out, ir_diag *d) {
  if (!out) return ir_diag_set(d, IR_INVALID_ARG, "fmt_st_open: out is NULL");
  *out = NULL;
  if (!path) return ir_diag_set(d, IR_INVALID_ARG, "fmt_st_open: path is NULL");
  fmt_st *st = ir_calloc(1, sizeof *st);
  if (!st) return ir_diag_set(d, IR_OOM, "out of memory");
  struct stat sb;
  ir_status s;
  if (stat(path, &sb) != 0) {
    s = ir_diag_set(d, IR_IO, "%s: cannot open: %s", path, strerror(errno));
  } else if (S_ISDIR(sb.st_mode)) {
    s = st_open_dir(st, path, d);
  } else {
    s = st_add_file(st, st_strdup(path), NULL, d);
    if (s == IR_OK) s = st_sort_unique(st, d);
  }
  if (s != IR_OK) {
    fmt_st_close(st);
    return s;
  }
  *out = st;
  return IR_OK;
}

void fmt_st_release(const fmt_st *st) {
  for (size_t i = 0; st && i < st->nfiles; i++)
    if (st->files[i].map) (void)madvise((void *)st->files[i].map, st->files[i].size, MADV_DONTNEED);
}

void fmt_st_close(fmt_st *st) {
  if (!st) return;
  for (size_t i = 0; i < st->count; i++) ir_free((char *)st->entries[i].t.name);
  ir_free(st->entries);
  for (size_t i = 0; i < st->nfiles; i++) {
    if (st->files[i].map) munmap((void *)st->files[i].map, st->files[i].size);
    ir_free(st->files[i].path);
    ir_free(st->files[i].shard);
  }
  ir_free(st->files);
  for (size_t i = 0; i < 2 * st->nmeta; i++) ir_free(st->meta[i]);
  ir_free(st->meta);
  ir_free(st);
}

size_t fmt_st_count(const fmt_st *st) { return st ? st->count : 0; }

const fmt_st_tensor *fmt_st_get(const fmt_st *st, size_t i) {
  return st && i < st->count ? &st->entries[i].t : NULL;
}

const fmt_st_tensor *fmt_st_find(const fmt_st *st, const char *name) {
  if (!st || !name || st->count == 0) return NULL;
  st_entry key;
  key.t.name = name;
  const st_entry *e = bsearch(&key, st->entries, st->count, sizeof *st->entries, st_cmp_name);
  return e ? &e->t : NULL;
}

const char *fmt_st_metadata(const fmt_st *st, const char *key) {
  if (!st || !key) return NULL;
  for (size_t i = 0; i < st->nmeta; i++)
    if (st->meta[2 * i] && strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
  return NULL;
}
