/* test_onnx_dynamic: generic ONNX graphs with a dynamic batch dim (torch's dynamo exporter,
 * tools/gen_onnx_dynamo_fixtures.py), built once with a range and run at several batch
 * sizes against onnxruntime's outputs on the same file (batch_N/output_0.pb): |ours -
 * theirs| <= 1e-4 * (1 + |theirs|). Then the ranges: the default (1..64), a --shape that
 * narrows it (2..8), shapes outside either refused naming the dim and the range, and the
 * profile surviving the plan file. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infc_build.h"
#include "inferrt.h"
#include "ir_alloc.h"
#include "ir_profile.h"
#include "tcheck.h"

#define TOL 1e-4

static const int batches[] = {1, 5, 64};

static bool build(const char *fixture, const char *shape, const char *plan, char *shapes_out) {
  char model[1024];
  snprintf(model, sizeof model, "%s/%s/model.onnx", FIXTURES_DIR, fixture);
  infc_options o = infc_options_default();
  ir_diag d = {0};
  if (shape) CHECKF(infc_options_set(&o, "shape", shape, &d) == IR_OK, "%s", d.msg);
  infc_build_report r = {0};
  ir_status st = infc_build(model, &o, plan, NULL, &r, &d);
  CHECKF(st == IR_OK, "build %s: %s", fixture, d.msg);
  if (shapes_out) snprintf(shapes_out, 512, "%s", r.shapes);
  return st == IR_OK;
}

/* Runs batch_N's input through p; the worst relative error against batch_N's output, or -1
 * when the run itself failed (msg says why). */
static double run_batch(irt_program *p, const char *fixture, int b, char *msg, size_t len) {
  char in_path[1024], out_path[1024];
  snprintf(in_path, sizeof in_path, "%s/%s/batch_%d/input_0.pb", FIXTURES_DIR, fixture, b);
  snprintf(out_path, sizeof out_path, "%s/%s/batch_%d/output_0.pb", FIXTURES_DIR, fixture, b);
  irt_tensor_file x = {0}, y = {0};
  irt_error err = {0};
  double worst = -1;
  if (irt_tensor_file_load(in_path, &x, &err) != IRT_OK ||
      irt_tensor_file_load(out_path, &y, &err) != IRT_OK ||
      irt_program_set_input_shape(p, 0, x.info.rank, x.info.shape, &err) != IRT_OK ||
      irt_program_set_input(p, 0, x.data, x.info.nbytes, &err) != IRT_OK ||
      irt_program_run(p, &err) != IRT_OK) {
    snprintf(msg, len, "%s", err.msg);
  } else {
    irt_tensor_info oi;
    uint64_t nbytes = 0;
    const float *got = irt_program_output(p, 0, &nbytes);
    irt_program_output_info(p, 0, &oi);
    CHECKF(oi.rank == y.info.rank && !memcmp(oi.shape, y.info.shape, sizeof(int64_t) * oi.rank),
           "batch %d: output shape differs from onnxruntime's", b);
    if (got && nbytes == y.info.nbytes) {
      const float *want = y.data;
      worst = 0;
      for (uint64_t i = 0; i < nbytes / sizeof(float); i++) {
        double e = fabs((double)got[i] - want[i]) / (1 + fabs((double)want[i]));
        if (e > worst || isnan(e)) worst = isnan(e) ? 1e9 : e;
      }
    } else {
      snprintf(msg, len, "output holds %llu bytes, onnxruntime's %llu", (unsigned long long)nbytes,
               (unsigned long long)y.info.nbytes);
    }
  }
  irt_tensor_file_free(&x);
  irt_tensor_file_free(&y);
  return worst;
}

static irt_program *open_plan(const char *plan) {
  irt_program *p = NULL;
  irt_error err = {0};
  CHECKF(irt_program_open(plan, NULL, &p, &err) == IRT_OK, "open %s: %s", plan, err.msg);
  return p;
}

/* Every batch size against onnxruntime, on one plan. */
static void check_fixture(const char *fixture) {
  char plan[1024], shapes[512] = "";
  snprintf(plan, sizeof plan, "%s/%s.plan", TEST_TMP_DIR, fixture);
  if (!build(fixture, NULL, plan, shapes)) return;
  CHECKF(!strcmp(shapes, "batch=1..64"), "%s: dynamic shapes '%s'", fixture, shapes);
  irt_program *p = open_plan(plan);
  if (!p) return;
  int64_t lo[IRT_MAX_RANK], hi[IRT_MAX_RANK];
  CHECK(irt_program_input_range(p, 0, lo, hi) == IRT_OK && lo[0] == 1 && hi[0] == 64);
  for (size_t i = 0; i < sizeof batches / sizeof *batches; i++) {
    char msg[512] = "";
    double w = run_batch(p, fixture, batches[i], msg, sizeof msg);
    CHECKF(w >= 0 && w <= TOL, "%s: batch %d: error %.3g %s", fixture, batches[i], w, msg);
    printf("%s: batch %d: max relative error vs onnxruntime %.3g\n", fixture, batches[i], w);
  }
  /* and back down: a smaller batch after the largest */
  char msg[512] = "";
  double w = run_batch(p, fixture, 5, msg, sizeof msg);
  CHECKF(w >= 0 && w <= TOL, "%s: batch 5 again: %.3g %s", fixture, w, msg);
  irt_program_close(p);
}

/* Shapes outside the range are refused, naming the dim and the range. */
static void check_ranges(void) {
  char plan[1024], shapes[512] = "";
  snprintf(plan, sizeof plan, "%s/mlp-2-8.plan", TEST_TMP_DIR);
  if (!build("onnx-dynamo-mlp", "x=2..8x16", plan, shapes)) return;
  CHECKF(!strcmp(shapes, "batch=2..8"), "--shape x=2..8x16: dynamic shapes '%s'", shapes);
  irt_program *p = open_plan(plan);
  if (!p) return;
  char msg[512] = "";
  double w = run_batch(p, "onnx-dynamo-mlp", 5, msg, sizeof msg);
  CHECKF(w >= 0 && w <= TOL, "batch 5 in 2..8: %.3g %s", w, msg);
  for (int b = 0; b < 2; b++) {
    msg[0] = 0;
    w = run_batch(p, "onnx-dynamo-mlp", b ? 64 : 1, msg, sizeof msg);
    printf("batch %d on a 2..8 plan: %s\n", b ? 64 : 1, msg);
    CHECKF(w < 0 && strstr(msg, "dim 0 ('batch')") && strstr(msg, "outside the plan's range 2..8"),
           "batch %d on a 2..8 plan: %s", b ? 64 : 1, msg);
  }
  irt_error err = {0};
  int64_t bad[2] = {5, 17};
  CHECK(irt_program_set_input_shape(p, 0, 2, bad, &err) != IRT_OK && strstr(err.msg, "dim 1"));
  irt_program_close(p);
  /* options that cannot apply */
  infc_options o = infc_options_default();
  ir_diag d = {0};
  CHECK(infc_options_set(&o, "shape", "x=0..8x16", &d) != IR_OK && strstr(d.msg, "shape"));
  d = (ir_diag){0};
  CHECK(infc_options_set(&o, "shape", "x=8..2x16", &d) != IR_OK);
  d = (ir_diag){0};
  CHECK(infc_options_set(&o, "shape", "x16", &d) != IR_OK);
  char model[1024];
  snprintf(model, sizeof model, "%s/onnx-dynamo-mlp/model.onnx", FIXTURES_DIR);
  o = infc_options_default();
  d = (ir_diag){0};
  CHECK(infc_options_set(&o, "shape", "x=1..4x32", &d) == IR_OK);
  CHECKF(infc_build(model, &o, plan, NULL, NULL, &d) != IR_OK && strstr(d.msg, "fixed at 16"),
         "--shape on a fixed dim: %s", d.msg);
  /* build.yaml's form */
  char yaml[1024];
  snprintf(yaml, sizeof yaml, "%s/shapes.yaml", TEST_TMP_DIR);
  FILE *f = fopen(yaml, "w");
  if (f) fputs("shapes:\n  x: 3..6x16\n", f), fclose(f);
  o = infc_options_default();
  d = (ir_diag){0};
  CHECKF(f && infc_options_load_yaml(&o, yaml, &d) == IR_OK && o.n_shapes == 1 &&
             o.shapes[0].min[0] == 3 && o.shapes[0].max[0] == 6 && o.shapes[0].max[1] == 16,
         "shapes from build.yaml: %s", d.msg);
  o = infc_options_default();
  d = (ir_diag){0};
  CHECK(infc_options_set(&o, "shape", "y=1..4", &d) == IR_OK);
  CHECKF(infc_build(model, &o, plan, NULL, NULL, &d) != IR_OK && strstr(d.msg, "no such input"),
         "--shape on no input: %s", d.msg);
}

/* A plan's profile that lies is refused: ir_profile_verify on a graph x[B,4] -> relu. */
static void check_verify(void) {
  ir_graph *g = ir_graph_create();
  ir_dim dims[2] = {{.n = 8}, {.n = 4}};
  int32_t x = ir_graph_add_input(g, "x", IR_F32, 2, dims), y = -1;
  ir_diag d = {0};
  CHECK(ir_graph_add_node(g, IR_OP_ND_RELU, "relu", &x, 1, NULL, 0, &y, &d) >= 0);
  ir_profile *p = ir_calloc(1, sizeof *p);
  p->n_syms = 1;
  snprintf(p->syms[0].name, sizeof p->syms[0].name, "batch");
  p->syms[0].min = 1, p->syms[0].max = 8;
  p->dims = ir_calloc(2, sizeof *p->dims);
  p->n_dims = 2;
  p->dims[0] = (ir_affine){.at = x, .index = 0, .coef = {1}};
  p->dims[1] = (ir_affine){.at = y, .index = 0, .coef = {1}};
  g->profile = p;
  CHECKF(ir_profile_verify(g, &d) == IR_OK, "%s", d.msg);
  struct {
    const char *what;
    ir_affine bad;
  } cases[] = {
      {"negative coefficient", {.at = y, .index = 0, .coef = {-1}, .off = 16}},
      {"wrong value at the max", {.at = y, .index = 0, .coef = {1}, .off = 1}},
      {"no such dim", {.at = y, .index = 5, .coef = {1}}},
      {"no such tensor", {.at = 99, .index = 0, .coef = {1}}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ir_affine keep = p->dims[1];
    p->dims[1] = cases[i].bad;
    d = (ir_diag){0};
    CHECKF(ir_profile_verify(g, &d) == IR_BAD_FORMAT, "%s accepted", cases[i].what);
    p->dims[1] = keep;
  }
  p->syms[0].min = 9; /* min above max */
  d = (ir_diag){0};
  CHECK(ir_profile_verify(g, &d) == IR_BAD_FORMAT);
  p->syms[0].min = 1;
  /* a working copy at batch 3: every dim follows, and the node still holds */
  ir_graph *w = ir_profile_instance(g);
  int64_t three = 3;
  d = (ir_diag){0};
  CHECKF(w && ir_profile_instance_set(g, w, &three, &d) == IR_OK, "%s", d.msg);
  CHECK(w && w->tensors[x].dims[0].n == 3 && w->tensors[y].dims[0].n == 3 &&
        g->tensors[y].dims[0].n == 8);
  int64_t nine = 9;
  d = (ir_diag){0};
  CHECK(w && ir_profile_instance_set(g, w, &nine, &d) == IR_INVALID_ARG &&
        strstr(d.msg, "outside the plan's range 1..8"));
  ir_profile_instance_free(w);
  ir_graph_destroy(g);
}

int main(void) {
  check_verify();
  check_fixture("onnx-dynamo-mlp");
  check_fixture("onnx-dynamo-cnn"); /* Conv, MaxPool, a BatchNorm folded by the exporter */
  check_ranges();
  return tcheck_done("onnx_dynamic");
}
