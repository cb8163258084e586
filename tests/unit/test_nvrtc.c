/* test_nvrtc: every kernels/cuda/<op>.cu compiles through NVRTC (compiler/infc_nvrtc) for
 * every supported arch with the constants real plans use (the compile cache off, so each
 * is compiled), and the hot kernels (attention, GEMV, RMSNorm) spill no registers. Prints
 * registers/spills per kernel and arch. Then the compile cache: hits, keys, corrupt
 * entries. Skips (exit 0) where NVRTC is absent; the ptxas-report parser is checked either
 * way. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "infc_nvrtc.h"
#include "infc_util.h"
#include "tcheck.h"

#ifndef KERNELS_DIR
#error "KERNELS_DIR must name kernels/cuda"
#endif

static const char *const LOG =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'kn_a' for 'sm_90'\n"
    "ptxas info    : Function properties for kn_a\n"
    "    8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads\n"
    "ptxas info    : Used 168 registers, used 1 barriers, 2080 bytes smem, 400 bytes cmem[0]\n"
    "ptxas info    : Function properties for helper\n"
    "    99 bytes stack frame, 99 bytes spill stores, 99 bytes spill loads\n"
    "ptxas info    : Compiling entry function 'kn_b' for 'sm_90'\n"
    "ptxas info    : Function properties for kn_b\n"
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 32 registers, used 0 barriers, 380 bytes cmem[0]\n";

static void test_parsers(void) {
  infc_kernel_stats st[4];
  CHECK(infc_nvrtc_parse_ptxas(LOG, NULL, 0) == 2);
  CHECK(infc_nvrtc_parse_ptxas(LOG, st, 4) == 2);
  CHECK(!strcmp(st[0].name, "kn_a") && st[0].registers == 168 && st[0].stack_bytes == 8);
  CHECK(st[0].spill_stores == 12 && st[0].spill_loads == 4 && st[0].smem_bytes == 2080);
  CHECK(!strcmp(st[1].name, "kn_b") && st[1].registers == 32 && st[1].spill_stores == 0);
  int archs[8], n = 0;
  ir_diag d = {0};
  CHECK(infc_nvrtc_parse_archs("sm_80,sm_90", archs, 8, &n, &d) == IR_OK && n == 2 &&
        archs[0] == 80 && archs[1] == 90);
  CHECK(infc_nvrtc_parse_archs("sm_80,", archs, 8, &n, &d) == IR_OK && n == 1);
  d = (ir_diag){0};
  CHECK(infc_nvrtc_parse_archs("sm_80,sm_80", archs, 8, &n, &d) == IR_INVALID_ARG);
  d = (ir_diag){0};
  CHECK(infc_nvrtc_parse_archs("gfx90a", archs, 8, &n, &d) == IR_INVALID_ARG);
  CHECK(strstr(d.msg, "gfx90a") != NULL);
}

/* The hot kernels must not touch local memory for spills. */
static int is_hot(const char *kernel) {
  return !strncmp(kernel, "kn_attn", 7) || !strncmp(kernel, "kn_gemv", 7) ||
         !strcmp(kernel, "kn_rms_norm") || !strcmp(kernel, "kn_add_rms_norm");
}

/* Constants of real plans: SmolLM2-135M (head_dim 64, GQA 3), Llama-8B-like (128, 4),
 * and the tiny test fixtures (16, 2). */
static const char *const CONFIGS[][3] = {
    {"-DHEAD_DIM=64", "-DBLOCK_SIZE=16", "-DGQA_GROUP=3"},
    {"-DHEAD_DIM=128", "-DBLOCK_SIZE=16", "-DGQA_GROUP=4"},
    {"-DHEAD_DIM=16", "-DBLOCK_SIZE=16", "-DGQA_GROUP=2"},
};
#define N_CONFIGS (int)(sizeof CONFIGS / sizeof CONFIGS[0])

static void compile_one(infc_nvrtc *nv, const char *file, const char *src, int arch, int cfg) {
  infc_nvrtc_image im;
  ir_diag d = {0};
  ir_status st = infc_nvrtc_compile(nv, src, file, arch, CONFIGS[cfg], 3, &im, &d);
  CHECKF(st == IR_OK, "%s sm_%d: %s", file, arch, d.msg);
  if (st != IR_OK) return;
  CHECKF(im.cubin_size > 0 && im.ptx_size > 0 && im.n_stats > 0, "%s sm_%d: empty image", file,
         arch);
  /* kn_pdl (kn_cuda.cuh): on sm_90+ every entry but add.cu's marker waits on its
   * predecessor grid first (the backend launches them as programmatic dependents); below,
   * none has the instruction. */
  int entries = 0, waits = 0;
  for (const char *p = im.ptx; p && (p = strstr(p, ".entry ")); p++) entries++;
  for (const char *p = im.ptx; p && (p = strstr(p, "griddepcontrol.wait")); p++) waits++;
  int want = arch >= 90 ? entries - (strcmp(file, "add.cu") ? 0 : 1) : 0;
  CHECKF(entries > 0 && waits == want, "%s sm_%d: %d of %d entries wait on their predecessor", file,
         arch, waits, entries);
  for (int i = 0; i < im.n_stats; i++) {
    const infc_kernel_stats *k = &im.stats[i];
    printf("  %-14s %-22s sm_%d %-14s regs %3d  stack %4d  spill st %4d ld %4d  smem %5d\n", file,
           k->name, arch, CONFIGS[cfg][0] + 2, k->registers, k->stack_bytes, k->spill_stores,
           k->spill_loads, k->smem_bytes);
    if (is_hot(k->name))
      CHECKF(k->spill_stores == 0 && k->spill_loads == 0, "%s sm_%d %s: spills %d/%d bytes", file,
             arch, k->name, k->spill_stores, k->spill_loads);
  }
  infc_nvrtc_image_free(&im);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_kernels(infc_nvrtc *nv) {
  DIR *dir = opendir(KERNELS_DIR);
  CHECK(dir != NULL);
  if (!dir) return;
  char *files[64];
  int n = 0;
  for (struct dirent *e; (e = readdir(dir)) && n < 64;) {
    size_t len = strlen(e->d_name);
    if (len > 3 && !strcmp(e->d_name + len - 3, ".cu")) files[n++] = strdup(e->d_name);
  }
  closedir(dir);
  qsort(files, (size_t)n, sizeof files[0], cmp_str);
  CHECK(n >= 10);
  int archs[INFC_NVRTC_MAX_ARCHS], n_archs = 0;
  ir_diag d = {0};
  CHECK(infc_nvrtc_parse_archs(INFC_NVRTC_DEFAULT_ARCHS, archs, INFC_NVRTC_MAX_ARCHS, &n_archs,
                               &d) == IR_OK);
  for (int f = 0; f < n; f++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", KERNELS_DIR, files[f]);
    char *src = NULL;
    size_t len = 0;
    d = (ir_diag){0};
    CHECKF(infc_read_file(path, 1u << 20, &src, &len, &d) == IR_OK, "%s", d.msg);
    for (int a = 0; src && a < n_archs; a++)
      for (int c = 0; c < N_CONFIGS; c++) /* other head dims only where they matter */
        if (c == 0 || strstr(src, "HEAD_DIM")) compile_one(nv, files[f], src, archs[a], c);
    free(src);
    free(files[f]);
  }
}

/* The cache's entries under dir/nvrtc: how many; with corrupt set, each damaged first (a
 * byte flipped mid-file, or, with truncate, cut to 12 bytes). */
static int cache_entries(const char *dir, int corrupt) {
  char sub[1024], path[2048];
  snprintf(sub, sizeof sub, "%s/nvrtc", dir);
  DIR *dh = opendir(sub);
  if (!dh) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(dh));) {
    size_t len = strlen(e->d_name);
    if (len < 5 || strcmp(e->d_name + len - 4, ".bin")) continue;
    n++;
    snprintf(path, sizeof path, "%s/%s", sub, e->d_name);
    struct stat st;
    if (!corrupt || stat(path, &st) != 0) continue;
    if (corrupt == 2) {
      CHECK(truncate(path, 12) == 0);
      continue;
    }
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (!f) continue;
    fseek(f, st.st_size / 2, SEEK_SET);
    int c = fgetc(f);
    fseek(f, st.st_size / 2, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
  }
  closedir(dh);
  return n;
}

static void cache_clear(const char *dir) {
  char sub[1024], path[2048];
  snprintf(sub, sizeof sub, "%s/nvrtc", dir);
  DIR *dh = opendir(sub);
  for (struct dirent *e; dh && (e = readdir(dh));) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", sub, e->d_name);
    remove(path);
  }
  if (dh) closedir(dh);
  rmdir(sub);
  rmdir(dir);
}

/* Compiles the test source with -DX=<x>; returns whether it came from the cache (-1: failed).
 * The image goes to *im (freed by the caller). */
static int compile_x(infc_nvrtc *nv, const char *x, infc_nvrtc_image *im) {
  static const char *src = "extern \"C\" __global__ void kn_t(float *p) { p[threadIdx.x] *= X; }";
  char def[32];
  snprintf(def, sizeof def, "-DX=%s", x);
  const char *opts[] = {def};
  ir_diag d = {0};
  ir_status st = infc_nvrtc_compile(nv, src, "cache_test.cu", 90, opts, 1, im, &d);
  CHECKF(st == IR_OK, "%s", d.msg);
  return st == IR_OK ? im->from_cache : -1;
}

/* The same PTX, CUBIN and kernel resources (the logs differ in ptxas's compile time). */
static bool same_image(const infc_nvrtc_image *a, const infc_nvrtc_image *b) {
  return a->ptx_size == b->ptx_size && !memcmp(a->ptx, b->ptx, a->ptx_size) &&
         a->cubin_size == b->cubin_size && !memcmp(a->cubin, b->cubin, a->cubin_size) &&
         a->n_stats == b->n_stats && a->n_stats == 1 &&
         a->stats[0].registers == b->stats[0].registers &&
         !strcmp(a->stats[0].name, b->stats[0].name);
}

static void test_cache(infc_nvrtc *nv) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/nvrtc-cache-%ld", TEST_TMP_DIR, (long)getpid());
  cache_clear(dir);
  infc_nvrtc_set_cache(nv, dir);
  infc_nvrtc_image a, b, c, e;
  CHECK(compile_x(nv, "2.0f", &a) == 0); /* a miss, written */
  CHECK(cache_entries(dir, 0) == 1);
  CHECK(compile_x(nv, "2.0f", &b) == 1); /* a hit: the same outputs, the log too */
  CHECK(same_image(&a, &b) && !strcmp(a.log, b.log));
  infc_nvrtc_image_free(&b);
  CHECK(compile_x(nv, "3.0f", &c) == 0); /* another define, another key */
  CHECK(cache_entries(dir, 0) == 2);
  CHECK(c.ptx && a.ptx && strcmp(c.ptx, a.ptx) != 0);
  infc_nvrtc_image_free(&c);
  for (int how = 1; how <= 2; how++) { /* a flipped byte, then a cut entry: misses */
    CHECK(cache_entries(dir, how) == 2);
    CHECK(compile_x(nv, "2.0f", &e) == 0);
    CHECK(e.ptx && !strcmp(e.ptx, a.ptx) && e.n_stats == 1);
    infc_nvrtc_image_free(&e);
    CHECK(compile_x(nv, "2.0f", &e) == 1); /* written again */
    CHECK(same_image(&a, &e));
    infc_nvrtc_image_free(&e);
  }
  infc_nvrtc_set_cache(nv, NULL);
  CHECK(compile_x(nv, "2.0f", &e) == 0);
  infc_nvrtc_image_free(&e);
  infc_nvrtc_image_free(&a);
  cache_clear(dir);
}

int main(void) {
  test_parsers();
  infc_nvrtc *nv = NULL;
  ir_diag d = {0};
  if (infc_nvrtc_open(&nv, &d) != IR_OK) {
    CHECK(strstr(d.msg, "NVRTC not found") != NULL || strstr(d.msg, "NVRTC found") != NULL);
    printf("skipped: no NVRTC (%s)\n", d.msg);
    return tcheck_done("nvrtc");
  }
  int major, minor;
  infc_nvrtc_version(nv, &major, &minor);
  printf("NVRTC %d.%d\n", major, minor);
  infc_nvrtc_set_cache(nv, NULL); /* every kernel compiled here, none from a cache */
  test_kernels(nv);
  test_cache(nv);
  infc_nvrtc_close(nv);
  return tcheck_done("nvrtc");
}
