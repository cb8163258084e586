/* test_cuda_backend: the parts of the CUDA backend that run without a GPU.
 * libinferrt_cuda.so loads with RTLD_NOW (every symbol it needs is resolved; libcuda and
 * cuBLAS are opened at run time, not linked), exports its entry point and nothing else
 * callable by name that we use, refuses a mismatched ABI and, on a machine without a
 * driver, says "no CUDA device found; run with --device cpu or build a CPU plan".
 * Device selection in irt_model_open: a CUDA plan without a GPU fails with that message;
 * with device "cpu" it runs and its logits equal the CPU plan's bit for bit; a CPU plan
 * refuses device "cuda"; an unknown device is refused. Parts whose prerequisites are
 * absent (the library: a CUDA toolkit at build time; NVRTC: for CUDA plans) are skipped;
 * on a machine with a driver the no-GPU checks are skipped (tests/gpu runs there). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "infc_build.h"
#include "infc_nvrtc.h"
#include "inferrt.h"
#include "tcheck.h"
#include "tmodel.h"

#define FIXTURE FIXTURES_DIR "/llama-gqa-f32"
#define NO_GPU_MSG "no CUDA device found; run with --device cpu or build a CPU plan"

static bool have_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) dlclose(lib);
  return lib != NULL;
}

static void test_library(void) {
#ifndef CUDA_LIB
  printf("skipped the library checks: built without the CUDA toolkit (no libinferrt_cuda.so)\n");
#else
  void *lib = dlopen(CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
  CHECKF(lib != NULL, "dlopen %s: %s", CUDA_LIB, dlerror());
  if (!lib) return;
  void *sym = dlsym(lib, IRT_CUDA_ENTRY);
  CHECK(sym != NULL);
  CHECK(dlsym(lib, "cuda_ops_run") == NULL); /* internals stay hidden */
  CHECK(dlsym(lib, "ir_diag_set") == NULL);  /* its private copy of ir/ too */
  irt_cuda_create_fn create;
  memcpy(&create, &sym, sizeof create);
  rt_backend be = {0};
  ir_diag d = {0};
  irt_cuda_opts o = {.abi = IRT_CUDA_ABI + 1};
  CHECK(create(&o, NULL, &be, &d) == IR_VERSION && be.ops == NULL);
  CHECKF(strstr(d.msg, "does not match") != NULL, "%s", d.msg);
  if (!have_driver()) {
    ir_graph *g = ir_graph_create();
    o = (irt_cuda_opts){.abi = IRT_CUDA_ABI, .layout = IRT_CUDA_LAYOUT};
    d = (ir_diag){0};
    CHECK(create(&o, g, &be, &d) == IR_DEVICE && be.ops == NULL);
    CHECKF(strstr(d.msg, NO_GPU_MSG) != NULL, "%s", d.msg);
    ir_graph_destroy(g);
  }
  /* The library stays loaded, as irt_backend_cuda_open keeps it. */
#endif
}

static irt_status open_with(const char *plan, const char *device, irt_model **m, irt_error *err) {
  irt_model_opts o = irt_model_opts_default();
  o.n_threads = 2;
  o.device = device;
  *err = (irt_error){0};
  return irt_model_open(plan, &o, m, err);
}

/* max_tokens NULL: the target's default step size. */
static bool build_t(const char *target, const char *max_tokens, const char *path) {
  infc_options o = infc_options_default();
  ir_diag d = {0};
  bool ok = infc_options_set(&o, "target", target, &d) == IR_OK &&
            (!max_tokens || infc_options_set(&o, "max_tokens", max_tokens, &d) == IR_OK) &&
            infc_build(FIXTURE, &o, path, NULL, NULL, &d) == IR_OK;
  CHECKF(ok, "build %s: %s", target, d.msg);
  return ok;
}
static bool build(const char *target, const char *path) { return build_t(target, NULL, path); }

static void test_select(void) {
  const char *cpu_plan = TEST_TMP_DIR "/cuda_backend_cpu.plan";
  const char *cuda_plan = TEST_TMP_DIR "/cuda_backend_cuda.plan";
  irt_model *m = NULL;
  irt_error err;
  if (!build("cpu", cpu_plan)) return;
  CHECK(open_with(cpu_plan, "cuda", &m, &err) == IRT_UNSUPPORTED && !m);
  CHECKF(strstr(err.msg, "needs a CUDA plan") && strstr(err.msg, "'cpu'"), "%s", err.msg);
  CHECK(open_with(cpu_plan, "tpu", &m, &err) == IRT_INVALID_ARG && !m);
  CHECKF(strstr(err.msg, "'tpu'") != NULL, "%s", err.msg);
  CHECK(open_with(cpu_plan, "auto", &m, &err) == IRT_OK);
  CHECK(m && !strcmp(irt_model_get_info(m)->device, "cpu"));
  irt_model_close(m);

  infc_nvrtc *nv = NULL;
  ir_diag d = {0};
  if (infc_nvrtc_open(&nv, &d) != IR_OK) {
    printf("skipped CUDA plans: no NVRTC\n");
    return;
  }
  infc_nvrtc_close(nv);
  if (!build("cuda", cuda_plan)) return;
  if (!have_driver()) {
    m = NULL;
    irt_status st = open_with(cuda_plan, NULL, &m, &err);
    CHECKF(st == IRT_DEVICE || st == IRT_UNSUPPORTED, "status %d: %s", st, err.msg);
    CHECK(m == NULL);
#ifdef CUDA_LIB
    CHECKF(st == IRT_DEVICE && strstr(err.msg, NO_GPU_MSG), "%s", err.msg);
#else
    CHECKF(strstr(err.msg, "--device cpu") != NULL, "%s", err.msg);
#endif
    CHECK(open_with(cuda_plan, "cuda", &m, &err) != IRT_OK && !m);
  }
  /* device cpu: the CUDA plan's weights are the CPU plan's, so its logits are too. */
  irt_model *a = NULL, *b = NULL;
  CHECKF(open_with(cuda_plan, "cpu", &a, &err) == IRT_OK, "%s", err.msg);
  CHECKF(open_with(cpu_plan, NULL, &b, &err) == IRT_OK, "%s", err.msg);
  if (a && b) {
    CHECK(!strcmp(irt_model_get_info(a)->device, "cpu"));
    const int32_t ids[] = {1, 5, 9, 2, 7, 3};
    int64_t V = irt_model_get_info(a)->vocab_size, n = 6;
    float *la = tmodel_prompt_logits(a, ids, n), *lb = tmodel_prompt_logits(b, ids, n);
    CHECK(!memcmp(la, lb, (size_t)(n * V) * sizeof(float)));
    free(la), free(lb);
    /* the step: 512 tokens on the CPU, INFC_CUDA_MAX_TOKENS in a CUDA plan unless set */
    CHECK(irt_model_get_info(b)->max_step_tokens == 512);
    CHECK(irt_model_get_info(a)->max_step_tokens == INFC_CUDA_MAX_TOKENS);
  }
  irt_model_close(a);
  irt_model_close(b);
  const char *set_plan = TEST_TMP_DIR "/cuda_backend_t300.plan";
  if (build_t("cuda", "300", set_plan)) {
    CHECKF(open_with(set_plan, "cpu", &a, &err) == IRT_OK, "%s", err.msg);
    CHECK(a && irt_model_get_info(a)->max_step_tokens == 300);
    irt_model_close(a);
  }
}

int main(void) {
  test_library();
  test_select();
  return tcheck_done("cuda_backend");
}
