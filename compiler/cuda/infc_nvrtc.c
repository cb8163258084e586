/* infc_nvrtc: NVRTC through dlopen; see infc_nvrtc.h. The few NVRTC entry points used
 * are declared here, so no CUDA header is needed to build infc. */
#include "infc_nvrtc.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "infc_cuda_sources.h"
#include "ir_alloc.h"

typedef int nvrtc_result; /* nvrtcResult: 0 is NVRTC_SUCCESS */
typedef void *nvrtc_program;

struct infc_nvrtc {
  void *lib;
  char cache[4096]; /* the compile cache's root ("": none) */
  int major, minor;
  const char *(*error_string)(nvrtc_result);
  nvrtc_result (*version)(int *, int *);
  nvrtc_result (*create)(nvrtc_program *, const char *, const char *, int, const char *const *,
                         const char *const *);
  nvrtc_result (*destroy)(nvrtc_program *);
  nvrtc_result (*compile)(nvrtc_program, int, const char *const *);
  nvrtc_result (*log_size)(nvrtc_program, size_t *);
  nvrtc_result (*log)(nvrtc_program, char *);
  nvrtc_result (*ptx_size)(nvrtc_program, size_t *);
  nvrtc_result (*ptx)(nvrtc_program, char *);
  nvrtc_result (*cubin_size)(nvrtc_program, size_t *);
  nvrtc_result (*cubin)(nvrtc_program, char *);
};

static void *nvrtc_dlopen(void) {
  static const char *const names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12",
                                      "/usr/local/cuda/lib64/libnvrtc.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) return lib;
  }
  return NULL;
}

/* POSIX lets a data pointer carry a function address; memcpy keeps -Wpedantic quiet. */
static int nvrtc_sym(void *lib, const char *name, void *fn_out, size_t fn_size) {
  void *p = dlsym(lib, name);
  if (!p) return 0;
  memcpy(fn_out, &p, fn_size);
  return 1;
}

void infc_nvrtc_set_cache(infc_nvrtc *n, const char *dir) {
  if (!dir || !strcmp(dir, "off") || strlen(dir) >= sizeof n->cache) dir = "";
  snprintf(n->cache, sizeof n->cache, "%s", dir);
}

ir_status infc_nvrtc_open(infc_nvrtc **out, ir_diag *d) {
  *out = NULL;
  void *lib = nvrtc_dlopen();
  if (!lib)
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "NVRTC not found: install the CUDA toolkit or build a CPU plan");
  infc_nvrtc *n = ir_calloc(1, sizeof *n);
  if (!n) return ir_diag_set(d, IR_OOM, "out of memory");
  n->lib = lib;
#define SYM(field, name) nvrtc_sym(lib, name, &n->field, sizeof n->field)
  int ok = SYM(error_string, "nvrtcGetErrorString") && SYM(version, "nvrtcVersion") &&
           SYM(create, "nvrtcCreateProgram") && SYM(destroy, "nvrtcDestroyProgram") &&
           SYM(compile, "nvrtcCompileProgram") && SYM(log_size, "nvrtcGetProgramLogSize") &&
           SYM(log, "nvrtcGetProgramLog") && SYM(ptx_size, "nvrtcGetPTXSize") &&
           SYM(ptx, "nvrtcGetPTX") && SYM(cubin_size, "nvrtcGetCUBINSize") &&
           SYM(cubin, "nvrtcGetCUBIN");
#undef SYM
  if (!ok || n->version(&n->major, &n->minor) != 0) {
    infc_nvrtc_close(n);
    return ir_diag_set(d, IR_UNSUPPORTED,
                       "NVRTC found but unusable (missing entry points; CUDA 11.2 or newer "
                       "is needed): install the CUDA toolkit or build a CPU plan");
  }
  *out = n;
  return IR_OK;
}

/* libnvrtc stays mapped once loaded: its static C++ runtime keeps heap blocks that only
 * its own data segment points to, so unmapping it would leak them (LeakSanitizer sees
 * exactly that). A second open finds it already loaded. */
void infc_nvrtc_close(infc_nvrtc *n) { ir_free(n); }

void infc_nvrtc_version(const infc_nvrtc *n, int *out_major, int *out_minor) {
  *out_major = n->major;
  *out_minor = n->minor;
}

ir_status infc_nvrtc_parse_archs(const char *list, int *out, int cap, int *out_n, ir_diag *d) {
  *out_n = 0;
  const char *p = list;
  while (*p) {
    if (!strncmp(p, "sm_", 3)) p += 3;
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 50 || v > 199 || (*end && *end != ','))
      return ir_diag_set(d, IR_INVALID_ARG, "arch: '%s': expected a list like sm_80,sm_90", list);
    for (int i = 0; i < *out_n; i++)
      if (out[i] == v) return ir_diag_set(d, IR_INVALID_ARG, "arch: sm_%ld given twice", v);
    if (*out_n == cap)
      return ir_diag_set(d, IR_INVALID_ARG, "arch: more than %d archs in '%s'", cap, list);
    out[(*out_n)++] = (int)v;
    p = *end ? end + 1 : end;
  }
  if (*out_n == 0) return ir_diag_set(d, IR_INVALID_ARG, "arch: empty list");
  return IR_OK;
}

/* Reads one of the program's outputs (log, PTX or CUBIN) into a fresh buffer. */
static ir_status nvrtc_fetch(nvrtc_result (*size_fn)(nvrtc_program, size_t *),
                             nvrtc_result (*get_fn)(nvrtc_program, char *), nvrtc_program prog,
                             char **out, size_t *out_size, ir_diag *d) {
  size_t size = 0;
  *out = NULL;
  if (size_fn(prog, &size) != 0) return ir_diag_set(d, IR_UNSUPPORTED, "NVRTC gave no output");
  char *buf = ir_malloc(size + 1);
  if (!buf) return ir_diag_set(d, IR_OOM, "out of memory");
  if (size && get_fn(prog, buf) != 0) {
    ir_free(buf);
    return ir_diag_set(d, IR_UNSUPPORTED, "NVRTC gave no output");
  }
  buf[size] = '\0';
  *out = buf;
  if (out_size) *out_size = size;
  return IR_OK;
}

/* The options every compile gets after the arch (they are part of the cache key). */
static const char *const FIXED_OPTS[] = {"-std=c++17", "--ptxas-options=-v"};
#define N_FIXED_OPTS (int)(sizeof FIXED_OPTS / sizeof FIXED_OPTS[0])

/* One NVRTC compile of src for target ("sm_80" gives CUBIN, "compute_80" PTX). */
static ir_status nvrtc_run(infc_nvrtc *n, const char *src, const char *name, const char *target,
                           const char *const *opts, int n_opts, nvrtc_program *out_prog,
                           char **out_log, ir_diag *d) {
  char arch_opt[64];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", target);
  const char *argv[64];
  int argc = 0;
  argv[argc++] = arch_opt;
  for (int i = 0; i < N_FIXED_OPTS; i++) argv[argc++] = FIXED_OPTS[i];
  if (n_opts > (int)(sizeof argv / sizeof argv[0]) - argc)
    return ir_diag_set(d, IR_INVALID_ARG, "%s: too many NVRTC options", name);
  for (int i = 0; i < n_opts; i++) argv[argc++] = opts[i];
  /* every kernels/cuda header, so a source's #include "kn_cuda.cuh" resolves */
  const char *hdr_text[16], *hdr_name[16];
  int n_hdr = infc_cuda_n_headers;
  if (n_hdr > (int)(sizeof hdr_text / sizeof hdr_text[0]))
    return ir_diag_set(d, IR_UNSUPPORTED, "%s: more kernel headers than NVRTC is given", name);
  for (int i = 0; i < n_hdr; i++)
    hdr_text[i] = infc_cuda_headers[i].text, hdr_name[i] = infc_cuda_headers[i].name;
  nvrtc_program prog = NULL;
  nvrtc_result r = n->create(&prog, src, name, n_hdr, hdr_text, hdr_name);
  if (r != 0) return ir_diag_set(d, IR_UNSUPPORTED, "%s: NVRTC: %s", name, n->error_string(r));
  r = n->compile(prog, argc, argv);
  ir_status st = nvrtc_fetch(n->log_size, n->log, prog, out_log, NULL, d);
  if (st == IR_OK && r != 0) {
    st = ir_diag_set(d, IR_BAD_FORMAT, "%s: %s for %s:\n%.400s", name, n->error_string(r), target,
                     *out_log);
    ir_free(*out_log);
    *out_log = NULL;
  }
  if (st != IR_OK) {
    n->destroy(&prog);
    return st;
  }
  *out_prog = prog;
  return IR_OK;
}

/* --- the compile cache -------------------------------------------------------------------
 * A compile's outputs (log, CUBIN, PTX) kept on disk under a key that hashes all that decides
 * them: NVRTC's version, the arch, the fixed and the caller's options, the source, its name
 * and every kernel header. Where: the folder infc_nvrtc_set_cache gave (none by default;
 * the infc CLI gives ~/.cache/infc); an entry is nvrtc/<key>.bin there. Entries
 * are written under a temporary name and renamed, so builds running side by side never read
 * half of one; a short, corrupt or unreadable entry is a miss and is written again. The
 * cache never fails a build: where it cannot be read or written, infc compiles. */
#define CACHE_MAGIC "INFCNVC1"

/* The cache's folder (nvrtc/ made if missing) into out; false: no cache. */
static bool cache_dir(const infc_nvrtc *n, char *out, size_t len) {
  if (!n->cache[0]) return false;
  int w = snprintf(out, len, "%s/nvrtc", n->cache);
  if (w < 0 || (size_t)w >= len) return false;
  for (char *p = out + 1;; p++) { /* mkdir -p */
    const bool end = *p == '\0';
    if (*p != '/' && !end) continue;
    *p = '\0';
    const bool ok = mkdir(out, 0755) == 0 || errno == EEXIST;
    if (!end) *p = '/';
    if (!ok) return false;
    if (end) return true;
  }
}

static void hash_text(XXH3_state_t *h, const char *text) {
  const uint64_t len = text ? strlen(text) : 0;
  XXH3_128bits_update(h, &len, sizeof len); /* length first: no two lists hash alike */
  if (len) XXH3_128bits_update(h, text, len);
}

/* The entry's path for this compile into out; false where the key cannot be made. */
static bool cache_path(const infc_nvrtc *n, const char *dir, const char *src, const char *name,
                       int arch, const char *const *opts, int n_opts, char *out, size_t len) {
  XXH3_state_t *h = XXH3_createState();
  if (!h) return false;
  XXH3_128bits_reset(h);
  const int32_t head[4] = {n->major, n->minor, arch, n_opts};
  hash_text(h, CACHE_MAGIC);
  XXH3_128bits_update(h, head, sizeof head);
  for (int i = 0; i < N_FIXED_OPTS; i++) hash_text(h, FIXED_OPTS[i]);
  for (int i = 0; i < n_opts; i++) hash_text(h, opts[i]);
  hash_text(h, name);
  hash_text(h, src);
  for (int i = 0; i < infc_cuda_n_headers; i++) {
    hash_text(h, infc_cuda_headers[i].name);
    hash_text(h, infc_cuda_headers[i].text);
  }
  XXH128_hash_t k = XXH3_128bits_digest(h);
  XXH3_freeState(h);
  int w = snprintf(out, len, "%s/%016llx%016llx.bin", dir, (unsigned long long)k.high64,
                   (unsigned long long)k.low64);
  return w > 0 && (size_t)w < len;
}

/* An entry: CACHE_MAGIC, the sizes of log, CUBIN and PTX (u64 each), their bytes, then the
 * XXH3-64 of sizes and bytes (entry_sum). */
static bool entry_sum(const uint64_t size[3], const void *const buf[3], uint64_t *out) {
  XXH3_state_t *h = XXH3_createState();
  if (!h) return false;
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, size, 3 * sizeof size[0]);
  for (int i = 0; i < 3; i++) XXH3_64bits_update(h, buf[i], size[i]);
  *out = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return true;
}

static bool cache_load(const char *path, infc_nvrtc_image *im) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char magic[8];
  uint64_t size[3], sum = 0;
  bool ok = fread(magic, 1, 8, f) == 8 && !memcmp(magic, CACHE_MAGIC, 8) &&
            fread(size, sizeof size[0], 3, f) == 3 && size[0] < (1u << 30) &&
            size[1] < (1u << 30) && size[2] >= 1 && size[2] < (1u << 30);
  char *buf[3] = {NULL, NULL, NULL};
  for (int i = 0; ok && i < 3; i++) {
    buf[i] = ir_malloc(size[i] + 1);
    ok = buf[i] && fread(buf[i], 1, size[i], f) == size[i];
    if (ok) buf[i][size[i]] = '\0';
  }
  ok = ok && fread(&sum, sizeof sum, 1, f) == 1 && fgetc(f) == EOF;
  fclose(f);
  uint64_t want = 0;
  const void *const bytes[3] = {buf[0], buf[1], buf[2]};
  ok = ok && entry_sum(size, bytes, &want) && want == sum && buf[2][size[2] - 1] == '\0';
  if (!ok) {
    for (int i = 0; i < 3; i++) ir_free(buf[i]);
    return false;
  }
  im->log = buf[0];
  im->cubin = (uint8_t *)buf[1], im->cubin_size = size[1];
  im->ptx = buf[2], im->ptx_size = size[2];
  return true;
}

static void cache_store(const char *path, const infc_nvrtc_image *im) {
  char tmp[4200];
  int w = snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  if (w < 0 || (size_t)w >= sizeof tmp) return;
  FILE *f = fopen(tmp, "wb");
  if (!f) return;
  const uint64_t size[3] = {strlen(im->log), im->cubin_size, im->ptx_size};
  const void *const buf[3] = {im->log, im->cubin, im->ptx};
  uint64_t sum = 0;
  bool ok = entry_sum(size, buf, &sum) && fwrite(CACHE_MAGIC, 1, 8, f) == 8 &&
            fwrite(size, sizeof size[0], 3, f) == 3;
  for (int i = 0; ok && i < 3; i++) ok = fwrite(buf[i], 1, size[i], f) == size[i];
  ok = ok && fwrite(&sum, sizeof sum, 1, f) == 1;
  ok = fclose(f) == 0 && ok && rename(tmp, path) == 0;
  if (!ok) remove(tmp);
}

/* The per-kernel resources from the image's log. */
static ir_status image_stats(infc_nvrtc_image *im, ir_diag *d) {
  int cap = infc_nvrtc_parse_ptxas(im->log, NULL, 0);
  im->stats = ir_calloc(cap > 0 ? (size_t)cap : 1, sizeof *im->stats);
  if (!im->stats) return ir_diag_set(d, IR_OOM, "out of memory");
  im->n_stats = infc_nvrtc_parse_ptxas(im->log, im->stats, cap);
  return IR_OK;
}

ir_status infc_nvrtc_compile(infc_nvrtc *n, const char *src, const char *name, int arch,
                             const char *const *opts, int n_opts, infc_nvrtc_image *out,
                             ir_diag *d) {
  memset(out, 0, sizeof *out);
  out->arch = arch;
  char dir[4096], path[4160];
  const bool cache = cache_dir(n, dir, sizeof dir) &&
                     cache_path(n, dir, src, name, arch, opts, n_opts, path, sizeof path);
  if (cache && cache_load(path, out)) {
    out->from_cache = true;
    ir_status st = image_stats(out, d);
    if (st != IR_OK) infc_nvrtc_image_free(out);
    return st;
  }
  char target[32];
  nvrtc_program prog;
  snprintf(target, sizeof target, "sm_%d", arch);
  ir_status st = nvrtc_run(n, src, name, target, opts, n_opts, &prog, &out->log, d);
  if (st != IR_OK) return st;
  st = nvrtc_fetch(n->cubin_size, n->cubin, prog, (char **)&out->cubin, &out->cubin_size, d);
  n->destroy(&prog);
  if (st == IR_OK) { /* a real-arch compile yields no PTX: a virtual-arch one does */
    char *log2 = NULL;
    snprintf(target, sizeof target, "compute_%d", arch);
    st = nvrtc_run(n, src, name, target, opts, n_opts, &prog, &log2, d);
    ir_free(log2);
    if (st == IR_OK) {
      st = nvrtc_fetch(n->ptx_size, n->ptx, prog, &out->ptx, &out->ptx_size, d);
      n->destroy(&prog);
    }
  }
  if (st == IR_OK) st = image_stats(out, d);
  if (st == IR_OK && cache) cache_store(path, out);
  if (st != IR_OK) infc_nvrtc_image_free(out);
  return st;
}

void infc_nvrtc_image_free(infc_nvrtc_image *im) {
  if (!im) return;
  ir_free(im->ptx);
  ir_free(im->cubin);
  ir_free(im->log);
  ir_free(im->stats);
  memset(im, 0, sizeof *im);
}

/* Reads the integer before `what` on the line starting at line (0 if absent). */
static int ptxas_num_before(const char *line, const char *eol, const char *what) {
  size_t wl = strlen(what);
  for (const char *p = line; p + wl <= eol; p++) {
    if (memcmp(p, what, wl)) continue;
    const char *q = p;
    while (q > line && q[-1] == ' ') q--;
    while (q > line && q[-1] >= '0' && q[-1] <= '9') q--;
    return atoi(q);
  }
  return 0;
}

/* ptxas -v prints, per kernel:
 *   ptxas info    : Compiling entry function 'kn_x' for 'sm_90'
 *   ptxas info    : Function properties for kn_x
 *       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 32 registers, used 1 barriers, 32 bytes smem, ...  */
int infc_nvrtc_parse_ptxas(const char *log, infc_kernel_stats *out, int cap) {
  int n = 0;
  infc_kernel_stats *cur = NULL;
  int in_entry = 0;
  for (const char *line = log; line && *line;) {
    const char *eol = strchr(line, '\n');
    if (!eol) eol = line + strlen(line);
    const char *q = strstr(line, "Compiling entry function '");
    if (q && q < eol) {
      q += strlen("Compiling entry function '");
      const char *e = memchr(q, '\'', (size_t)(eol - q));
      cur = n < cap ? &out[n] : NULL;
      in_entry = 0;
      n++;
      if (cur && e) {
        memset(cur, 0, sizeof *cur);
        size_t len =
            (size_t)(e - q) < sizeof cur->name - 1 ? (size_t)(e - q) : sizeof cur->name - 1;
        memcpy(cur->name, q, len);
      }
    } else if ((q = strstr(line, "Function properties for ")) && q < eol) {
      /* non-inlined device functions get their own report: keep only the entry's */
      q += strlen("Function properties for ");
      size_t len = strlen(cur ? cur->name : "");
      in_entry = cur && (size_t)(eol - q) >= len && !memcmp(q, cur->name, len) &&
                 (q + len == eol || q[len] == ' ' || q[len] == '\r');
    } else if (cur && in_entry && (q = strstr(line, "bytes stack frame")) && q < eol) {
      cur->stack_bytes = ptxas_num_before(line, eol, "bytes stack frame");
      cur->spill_stores = ptxas_num_before(line, eol, "bytes spill stores");
      cur->spill_loads = ptxas_num_before(line, eol, "bytes spill loads");
    } else if (cur && (q = strstr(line, "Used ")) && q < eol) {
      cur->registers = ptxas_num_before(line, eol, "registers");
      cur->smem_bytes = ptxas_num_before(line, eol, "bytes smem");
    }
    line = *eol ? eol + 1 : eol;
  }
  return n;
}
