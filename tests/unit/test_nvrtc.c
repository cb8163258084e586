/* test_nvrtc: every kernels/cuda/<op>.cu compiles through NVRTC (compiler/infc_nvrtc) for
 * every supported arch with the constants real plans use, and the hot kernels (attention,
 * GEMV, RMSNorm) spill no registers. Prints registers/spills per kernel and arch.
 * Skips (exit 0) where NVRTC is absent; the ptxas-report parser is checked either way. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

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
  CHECKF(im.cubin_size > 0 && im.ptx_size > 0 && im.n_stats > 0, "%s sm_%d: empty image",
         file, arch);
  for (int i = 0; i < im.n_stats; i++) {
    const infc_kernel_stats *k = &im.stats[i];
    printf("  %-14s %-22s sm_%d %-14s regs %3d  stack %4d  spill st %4d ld %4d  smem %5d\n",
           file, k->name, arch, CONFIGS[cfg][0] + 2, k->registers, k->stack_bytes,
           k->spill_stores, k->spill_loads, k->smem_bytes);
    if (is_hot(k->name))
      CHECKF(k->spill_stores == 0 && k->spill_loads == 0, "%s sm_%d %s: spills %d/%d bytes",
             file, arch, k->name, k->spill_stores, k->spill_loads);
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
  test_kernels(nv);
  infc_nvrtc_close(nv);
  return tcheck_done("nvrtc");
}
