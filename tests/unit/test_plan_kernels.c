/* test_plan_kernels: the plan's kernel table and kernels section round-trip (names,
 * archs, kinds, bytes, 256-byte alignment), damage to the section is refused, and where
 * NVRTC exists `infc build --target cuda` stores a CUBIN and a PTX per source and arch. */
#include <stdlib.h>
#include <string.h>

#include "infc_build.h"
#include "infc_cuda_sources.h"
#include "infc_nvrtc.h"
#include "infc_util.h"
#include "ir_plan.h"
#include "pass.h"
#include "tcheck.h"

#define FIXTURE FIXTURES_DIR "/llama-gqa-f32"

/* The fixture's graph as the frontend gives it (NULL, with a failed CHECK, on error). */
static ir_graph *open_fixture(infc_source **src, ir_diag *d) {
  infc_options o = infc_options_default();
  ir_graph *g = NULL;
  CHECKF(infc_source_open(FIXTURE, &o, src, &g, d) == IR_OK, "%s", d->msg);
  return g;
}

static void test_round_trip(void) {
  infc_source *src = NULL;
  ir_diag d = {0};
  ir_graph *g = open_fixture(&src, &d);
  if (!g) return;
  static const uint8_t cubin[300] = {0x7f, 'E', 'L', 'F'};
  static const char ptx[] = ".version 9.0\n.target sm_90\n";
  ir_plan_kernel ks[3] = {
      {.name = "attention",
       .arch = 90,
       .kind = IR_PLAN_KERNEL_CUBIN,
       .data = cubin,
       .size = sizeof cubin},
      {.name = "attention",
       .arch = 90,
       .kind = IR_PLAN_KERNEL_PTX,
       .data = (const uint8_t *)ptx,
       .size = sizeof ptx},
      {.name = "gemv", .arch = 80, .kind = IR_PLAN_KERNEL_CUBIN, .data = cubin, .size = 7},
  };
  ir_plan_info info = {.target = "cuda", .kernels = ks, .n_kernels = 3};
  const char *path = TEST_TMP_DIR "/kernels.plan";
  CHECKF(ir_plan_write(g, &info, path, &d) == IR_OK, "%s", d.msg);
  ir_plan *p = NULL;
  CHECKF(ir_plan_open(path, IR_PLAN_VERIFY_ALL, &p, &d) == IR_OK, "%s", d.msg);
  if (p) {
    CHECK(ir_plan_n_kernels(p) == 3);
    for (int i = 0; i < 3 && i < ir_plan_n_kernels(p); i++) {
      const ir_plan_kernel *k = ir_plan_kernel_at(p, i);
      CHECK(!strcmp(k->name, ks[i].name) && k->arch == ks[i].arch && k->kind == ks[i].kind);
      CHECK(k->size == ks[i].size && !memcmp(k->data, ks[i].data, k->size));
      CHECK((uintptr_t)k->data % IR_PLAN_KERNEL_ALIGN == 0);
    }
    CHECK(ir_plan_find_kernel(p, "attention", 90, IR_PLAN_KERNEL_PTX) != NULL);
    CHECK(ir_plan_find_kernel(p, "attention", 80, IR_PLAN_KERNEL_PTX) == NULL);
    CHECK(ir_plan_get_header(p)->kernels_size == 3 * 256 + 7); /* 300 B, then 29 B, then 7 B */
    ir_plan_close(p);
  }
  /* A flipped byte in the kernels section fails the checksum. */
  char *buf = NULL;
  size_t len = 0;
  CHECK(infc_read_file(path, 64u << 20, &buf, &len, &d) == IR_OK);
  if (buf) {
    buf[len - 3] ^= 1;
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    d = (ir_diag){0};
    CHECK(ir_plan_open(path, IR_PLAN_VERIFY_ALL, &p, &d) == IR_BAD_FORMAT);
    CHECKF(strstr(d.msg, "kernels checksum") != NULL, "%s", d.msg);
    free(buf);
  }
  /* An empty image is refused at write time. */
  ks[2].size = 0;
  d = (ir_diag){0};
  CHECK(ir_plan_write(g, &info, path, &d) != IR_OK);
  ir_graph_destroy(g);
  infc_source_close(src);
}

static void test_build_cuda(void) {
  infc_nvrtc *nv = NULL;
  ir_diag d = {0};
  if (infc_nvrtc_open(&nv, &d) != IR_OK) {
    printf("skipped build --target cuda: no NVRTC\n");
    return;
  }
  infc_nvrtc_close(nv);
  infc_options o = infc_options_default();
  CHECK(infc_options_set(&o, "target", "cuda", &d) == IR_OK);
  CHECK(infc_options_set(&o, "arch", "sm_80,sm_90", &d) == IR_OK);
  if (getenv("INFC_CACHE_DIR")) /* the tests' shared compile cache (tests/CMakeLists.txt) */
    snprintf(o.cache_dir, sizeof o.cache_dir, "%s", getenv("INFC_CACHE_DIR"));
  CHECK(infc_options_set(&o, "arch", "sm_80,rdna3", &d) == IR_INVALID_ARG);
  const char *path = TEST_TMP_DIR "/cuda.plan";
  d = (ir_diag){0};
  CHECKF(infc_build(FIXTURE, &o, path, NULL, NULL, &d) == IR_OK, "%s", d.msg);
  ir_plan *p = NULL;
  CHECKF(ir_plan_open(path, IR_PLAN_VERIFY_ALL, &p, &d) == IR_OK, "%s", d.msg);
  if (!p) return;
  CHECK(!strcmp(ir_plan_target(p), "cuda"));
  CHECK(ir_plan_n_kernels(p) == infc_cuda_n_sources * 2 * 2);
  const ir_plan_kernel *c = ir_plan_find_kernel(p, "attention", 90, IR_PLAN_KERNEL_CUBIN);
  const ir_plan_kernel *x = ir_plan_find_kernel(p, "attention", 80, IR_PLAN_KERNEL_PTX);
  CHECK(c && c->size > 4 &&
        !memcmp(c->data,
                "\x7f"
                "ELF",
                4));
  CHECK(x && strstr((const char *)x->data, ".entry kn_attn_decode") != NULL);
  ir_plan_close(p);
}

/* The capture plan: pass_capture_plan's default and asked-for buckets, their trip through
 * the plan file, and lists the step limits or the order refuse. */
static void test_capture_plan(void) {
  infc_source *src = NULL;
  ir_diag d = {0};
  ir_graph *g = open_fixture(&src, &d);
  if (!g) return;
  g->config.max_tokens = 512, g->config.max_seqs = 48, g->config.max_logits = 40;
  pass_log log = {0};
  pass_opts po = {.capture_plan = true};
  CHECKF(pass_capture_plan(g, &po, &log, &d) == IR_OK, "%s", d.msg);
  static const int64_t want[] = {1, 2, 4, 8, 16, 32, 40}; /* up to min(S, L) = 40 */
  CHECK(g->config.n_decode_buckets == 7 && !memcmp(g->config.decode_buckets, want, sizeof want));
  CHECK(log.n == 1 && strstr(log.lines[0], "7 decode graphs (batch 1,2,4,8,16,32,40)"));
  static const int64_t asked[] = {1, 3, 12};
  po.decode_buckets = asked, po.n_decode_buckets = 3;
  CHECKF(pass_capture_plan(g, &po, &log, &d) == IR_OK, "%s", d.msg);
  const char *path = TEST_TMP_DIR "/buckets.plan";
  CHECKF(ir_plan_write(g, NULL, path, &d) == IR_OK, "%s", d.msg);
  ir_plan *p = NULL;
  CHECKF(ir_plan_open(path, IR_PLAN_VERIFY_ALL, &p, &d) == IR_OK, "%s", d.msg);
  if (p) {
    const ir_model_config *c = &ir_plan_graph(p)->config;
    CHECK(c->n_decode_buckets == 3 && !memcmp(c->decode_buckets, asked, sizeof asked));
    ir_plan_close(p);
  }
  static const int64_t big[] = {1, 41}, down[] = {4, 2};
  po.decode_buckets = big, po.n_decode_buckets = 2;
  CHECK(pass_capture_plan(g, &po, &log, &d) != IR_OK && strstr(d.msg, "outside 1..40"));
  po.decode_buckets = down, d = (ir_diag){0};
  CHECKF(pass_capture_plan(g, &po, &log, &d) != IR_OK && strstr(d.msg, "ascending"), "%s", d.msg);
  /* a plan whose buckets break the limits is refused when it is opened */
  g->config.n_decode_buckets = 2, g->config.decode_buckets[0] = 8, g->config.decode_buckets[1] = 8;
  CHECKF(ir_plan_write(g, NULL, path, &d) == IR_OK, "%s", d.msg);
  p = NULL, d = (ir_diag){0};
  CHECKF(ir_plan_open(path, IR_PLAN_VERIFY_ALL, &p, &d) != IR_OK && strstr(d.msg, "ascending"),
         "%s", d.msg);
  ir_plan_close(p);
  infc_options o = infc_options_default();
  CHECK(infc_options_set(&o, "decode_buckets", "1,2,8", &d) == IR_OK && o.n_decode_buckets == 3);
  CHECK(infc_options_set(&o, "decode_buckets", "2,2", &d) != IR_OK);
  CHECK(infc_options_set(&o, "decode_buckets", "0,2", &d) != IR_OK);
  CHECK(infc_options_set(&o, "decode_buckets", "", &d) != IR_OK);
  pass_log_free(&log);
  ir_graph_destroy(g);
  infc_source_close(src);
}

int main(void) {
  test_round_trip();
  test_capture_plan();
  test_build_cuda();
  return tcheck_done("plan_kernels");
}
