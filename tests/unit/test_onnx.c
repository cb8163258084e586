/* test_onnx: the ONNX frontend and the generic run mode on models written at run time
 * under TEST_TMP_DIR: shape-arithmetic folding, external data (and every way its
 * location or range can be bad), the error messages for unsupported ops and missing
 * attributes, malformed models, int-list attributes through a plan, the program API,
 * runtime index checks, and thread-count invariance of the n-d kernels. */
#include "infc_onnx.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "infc_build.h"
#include "inferrt.h"
#include "ir_plan.h"
#include "kn_nd.h"
#include "onnx.pb-c.h"
#include "tcheck.h"

#define DIR_ TEST_TMP_DIR "/onnx"

/* ---- building ModelProtos ----------------------------------------------------------- */

/* Every allocation of a model under construction; freed after it is written. */
static void *g_allocs[4096];
static int g_n_allocs;

static void *alloc(size_t n) {
  void *p = calloc(1, n ? n : 1);
  if (!p || g_n_allocs == 4096) abort();
  return g_allocs[g_n_allocs++] = p;
}

static char *str(const char *s) {
  char *p = alloc(strlen(s) + 1);
  memcpy(p, s, strlen(s));
  return p;
}

static void free_allocs(void) {
  while (g_n_allocs) free(g_allocs[--g_n_allocs]);
}

/* Splits "a,b,,c" into names ("" for an absent optional input). */
static char **names(const char *csv, size_t *n) {
  char **v = alloc(16 * sizeof *v);
  *n = 0;
  if (!*csv) return v;
  for (const char *p = csv;; p++) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char *s = alloc(len + 1);
    memcpy(s, p, len);
    v[(*n)++] = s;
    if (!e) break;
    p = e;
  }
  return v;
}

static Onnx__AttributeProto *attr_i(const char *name, int64_t v) {
  Onnx__AttributeProto *a = alloc(sizeof *a);
  onnx__attribute_proto__init(a);
  a->name = str(name);
  a->has_type = 1;
  a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
  a->has_i = 1;
  a->i = v;
  return a;
}

static Onnx__AttributeProto *attr_ints(const char *name, int n, const int64_t *v) {
  Onnx__AttributeProto *a = alloc(sizeof *a);
  onnx__attribute_proto__init(a);
  a->name = str(name);
  a->has_type = 1;
  a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
  a->n_ints = (size_t)n;
  a->ints = alloc((size_t)n * sizeof(int64_t));
  memcpy(a->ints, v, (size_t)n * sizeof(int64_t));
  return a;
}

static Onnx__NodeProto *node(const char *op, const char *name, const char *in, const char *out,
                             const char *domain, Onnx__AttributeProto *a0,
                             Onnx__AttributeProto *a1) {
  Onnx__NodeProto *n = alloc(sizeof *n);
  onnx__node_proto__init(n);
  n->op_type = str(op);
  n->name = str(name);
  n->domain = str(domain ? domain : "");
  n->input = names(in, &n->n_input);
  n->output = names(out, &n->n_output);
  n->attribute = alloc(2 * sizeof *n->attribute);
  if (a0) n->attribute[n->n_attribute++] = a0;
  if (a1) n->attribute[n->n_attribute++] = a1;
  return n;
}

/* A value info; a dim of -1 is symbolic ("batch"). */
static Onnx__ValueInfoProto *vinfo(const char *name, int elem, int rank, const int64_t *dims) {
  Onnx__ValueInfoProto *v = alloc(sizeof *v);
  Onnx__TypeProto *t = alloc(sizeof *t);
  Onnx__TypeProto__Tensor *tt = alloc(sizeof *tt);
  Onnx__TensorShapeProto *s = alloc(sizeof *s);
  onnx__value_info_proto__init(v);
  onnx__type_proto__init(t);
  onnx__type_proto__tensor__init(tt);
  onnx__tensor_shape_proto__init(s);
  s->dim = alloc((size_t)(rank + 1) * sizeof *s->dim);
  for (int i = 0; i < rank; i++) {
    Onnx__TensorShapeProto__Dimension *d = alloc(sizeof *d);
    onnx__tensor_shape_proto__dimension__init(d);
    if (dims[i] >= 0) {
      d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      d->dim_value = dims[i];
    } else {
      d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
      d->dim_param = str("batch");
    }
    s->dim[s->n_dim++] = d;
  }
  tt->has_elem_type = 1;
  tt->elem_type = elem;
  tt->shape = s;
  t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
  t->tensor_type = tt;
  v->name = str(name);
  v->type = t;
  return v;
}

static Onnx__TensorProto *tensor(const char *name, int elem, int rank, const int64_t *dims,
                                 const void *raw, size_t nbytes) {
  Onnx__TensorProto *t = alloc(sizeof *t);
  onnx__tensor_proto__init(t);
  t->name = str(name);
  t->has_data_type = 1;
  t->data_type = elem;
  t->n_dims = (size_t)rank;
  t->dims = alloc((size_t)(rank + 1) * sizeof(int64_t));
  if (rank) memcpy(t->dims, dims, (size_t)rank * sizeof(int64_t));
  if (raw) {
    t->has_raw_data = 1;
    t->raw_data.len = nbytes;
    t->raw_data.data = alloc(nbytes);
    memcpy(t->raw_data.data, raw, nbytes);
  }
  return t;
}

/* Marks t as external: location, offset, length (length < 0: omitted). */
static void external(Onnx__TensorProto *t, const char *loc, const char *off, const char *len) {
  const char *kv[3][2] = {{"location", loc}, {"offset", off}, {"length", len}};
  t->has_data_location = 1;
  t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
  t->external_data = alloc(3 * sizeof *t->external_data);
  for (int i = 0; i < 3; i++) {
    if (!kv[i][1]) continue;
    Onnx__StringStringEntryProto *e = alloc(sizeof *e);
    onnx__string_string_entry_proto__init(e);
    e->key = str(kv[i][0]);
    e->value = str(kv[i][1]);
    t->external_data[t->n_external_data++] = e;
  }
}

typedef struct graph_spec {
  Onnx__NodeProto *nodes[16];
  int n_nodes;
  Onnx__TensorProto *inits[8];
  int n_inits;
  Onnx__ValueInfoProto *ins[8], *outs[8];
  int n_ins, n_outs;
  int64_t opset, ms_opset;
} graph_spec;

static void write_model(const char *path, graph_spec *s) {
  Onnx__ModelProto m;
  Onnx__GraphProto g;
  Onnx__OperatorSetIdProto op[2], *opp[2] = {&op[0], &op[1]};
  onnx__model_proto__init(&m);
  onnx__graph_proto__init(&g);
  for (int i = 0; i < 2; i++) onnx__operator_set_id_proto__init(&op[i]);
  op[0].domain = str("");
  op[0].has_version = 1;
  op[0].version = s->opset ? s->opset : 17;
  op[1].domain = str("com.microsoft");
  op[1].has_version = 1;
  op[1].version = s->ms_opset ? s->ms_opset : 1;
  m.has_ir_version = 1;
  m.ir_version = 8;
  m.n_opset_import = 2;
  m.opset_import = opp;
  g.name = str("g");
  g.n_node = (size_t)s->n_nodes;
  g.node = s->nodes;
  g.n_initializer = (size_t)s->n_inits;
  g.initializer = s->inits;
  g.n_input = (size_t)s->n_ins;
  g.input = s->ins;
  g.n_output = (size_t)s->n_outs;
  g.output = s->outs;
  m.graph = &g;
  size_t n = onnx__model_proto__get_packed_size(&m);
  uint8_t *buf = malloc(n);
  onnx__model_proto__pack(&m, buf);
  FILE *f = fopen(path, "wb");
  CHECKF(f && fwrite(buf, 1, n, f) == n, "cannot write %s", path);
  if (f) fclose(f);
  free(buf);
  free_allocs();
}

static char g_path[2][1024];

static const char *p0(const char *name) {
  snprintf(g_path[0], sizeof g_path[0], "%s/%s", DIR_, name);
  return g_path[0];
}

static const char *p1(const char *name) {
  snprintf(g_path[1], sizeof g_path[1], "%s/%s", DIR_, name);
  return g_path[1];
}

/* Imports a model; returns the status with the message in d. */
static ir_status import(const char *path, ir_graph **g, infc_onnx **m, ir_diag *d) {
  *d = (ir_diag){0};
  return infc_onnx_import(path, NULL, m, g, NULL, d);
}

static ir_status build(const char *model, const char *plan, ir_diag *d) {
  infc_options o = infc_options_default();
  *d = (ir_diag){0};
  return infc_build(model, &o, plan, NULL, NULL, d);
}

/* Builds and runs a one-input, one-output f32 model; false on any error. */
static bool run1(const char *model, const float *x, uint64_t xbytes, float *y, uint64_t ybytes,
                 int threads) {
  ir_diag d;
  irt_error err = {0};
  irt_program *p = NULL;
  irt_model_opts o = irt_model_opts_default();
  o.n_threads = threads;
  if (build(model, p1("run.plan"), &d) != IR_OK) {
    fprintf(stderr, "build: %s\n", d.msg);
    return false;
  }
  bool ok = irt_program_open(p1("run.plan"), &o, &p, &err) == IRT_OK &&
            irt_program_set_input(p, 0, x, xbytes, &err) == IRT_OK &&
            irt_program_run(p, &err) == IRT_OK;
  uint64_t n = 0;
  const void *out = ok ? irt_program_output(p, 0, &n) : NULL;
  ok = ok && out && n == ybytes;
  if (ok) memcpy(y, out, ybytes);
  if (!ok) fprintf(stderr, "run: %s\n", err.msg);
  irt_program_close(p);
  return ok;
}

/* ---- tests -------------------------------------------------------------------------- */

/* Shape -> Gather -> Unsqueeze -> Concat -> Reshape folds to one reshape node. */
static void test_shape_chain(void) {
  graph_spec s = {.opset = 13};
  int64_t xd[3] = {2, 3, 4}, one = 1, zero = 0, yd[2] = {2, 12}, idx = 0, minus1 = -1;
  s.ins[s.n_ins++] = vinfo("x", 1, 3, xd);
  s.outs[s.n_outs++] = vinfo("y", 1, 2, yd);
  s.inits[s.n_inits++] = tensor("i0", 7, 0, NULL, &idx, 8);
  s.inits[s.n_inits++] = tensor("m1", 7, 1, &one, &minus1, 8);
  s.inits[s.n_inits++] = tensor("ax", 7, 1, &one, &zero, 8);
  s.nodes[s.n_nodes++] = node("Shape", "shape", "x", "s", NULL, NULL, NULL);
  s.nodes[s.n_nodes++] = node("Gather", "gather", "s,i0", "b", NULL, attr_i("axis", 0), NULL);
  s.nodes[s.n_nodes++] = node("Unsqueeze", "unsq", "b,ax", "b1", NULL, NULL, NULL);
  s.nodes[s.n_nodes++] = node("Concat", "cat", "b1,m1", "shp", NULL, attr_i("axis", 0), NULL);
  s.nodes[s.n_nodes++] = node("Reshape", "reshape", "x,shp", "y", NULL, NULL, NULL);
  write_model(p0("chain.onnx"), &s);
  ir_graph *g = NULL;
  infc_onnx *m = NULL;
  ir_diag d;
  CHECKF(import(p0("chain.onnx"), &g, &m, &d) == IR_OK, "%s", d.msg);
  if (g) {
    CHECKF(g->n_nodes == 1 && g->nodes[0].op == IR_OP_ND_RESHAPE, "%d nodes", g->n_nodes);
    int32_t y = g->outputs[0];
    CHECK(g->tensors[y].rank == 2 && g->tensors[y].dims[0].n == 2 && g->tensors[y].dims[1].n == 12);
    CHECK(!strcmp(g->tensors[y].name, "y"));
    CHECK(ir_graph_verify(g, &d) == IR_OK);
  }
  ir_graph_destroy(g);
  infc_onnx_close(m);
  float x[24], out[24];
  for (int i = 0; i < 24; i++) x[i] = (float)i;
  CHECK(run1(p0("chain.onnx"), x, sizeof x, out, sizeof out, 2));
  CHECK(!memcmp(x, out, sizeof x));
}

/* y = x + w with w in an external file; then every bad location and range. */
static void write_ext_model(const char *name, const char *loc, const char *off, const char *len) {
  graph_spec s = {0};
  int64_t four = 4;
  s.ins[s.n_ins++] = vinfo("x", 1, 1, &four);
  s.outs[s.n_outs++] = vinfo("y", 1, 1, &four);
  Onnx__TensorProto *w = tensor("w", 1, 1, &four, NULL, 0);
  external(w, loc, off, len);
  s.inits[s.n_inits++] = w;
  s.nodes[s.n_nodes++] = node("Add", "add", "x,w", "y", NULL, NULL, NULL);
  write_model(p0(name), &s);
}

static void expect_import_error(const char *model, ir_status want, const char *fragment) {
  ir_graph *g = NULL;
  infc_onnx *m = NULL;
  ir_diag d;
  ir_status st = import(p0(model), &g, &m, &d);
  CHECKF(st == want && strstr(d.msg, fragment), "%s: status %d, message: %s", model, st, d.msg);
  CHECK(!g && !m);
}

static void test_external_data(void) {
  float data[6] = {99, 10, 20, 30, 40, 99}; /* w = data[1..5) at byte offset 4 */
  FILE *f = fopen(p0("w.bin"), "wb");
  CHECK(f && fwrite(data, sizeof data, 1, f) == 1);
  if (f) fclose(f);
  write_ext_model("ext.onnx", "w.bin", "4", "16");
  float x[4] = {1, 2, 3, 4}, y[4];
  CHECK(run1(p0("ext.onnx"), x, sizeof x, y, sizeof y, 1));
  CHECK(y[0] == 11 && y[1] == 22 && y[2] == 33 && y[3] == 44);
  write_ext_model("ext_nolen.onnx", "w.bin", "4", NULL);
  CHECK(run1(p0("ext_nolen.onnx"), x, sizeof x, y, sizeof y, 1) && y[3] == 44);

  write_ext_model("ext_up.onnx", "../onnx/w.bin", "4", "16");
  expect_import_error("ext_up.onnx", IR_BAD_FORMAT, "leaves the model's directory");
  write_ext_model("ext_abs.onnx", "/etc/passwd", "0", "16");
  expect_import_error("ext_abs.onnx", IR_BAD_FORMAT, "leaves the model's directory");
  unlink(p0("link.bin"));
  CHECK(symlink("/etc/passwd", p0("link.bin")) == 0);
  write_ext_model("ext_link.onnx", "link.bin", "0", "16");
  expect_import_error("ext_link.onnx", IR_BAD_FORMAT, "resolves outside");
  write_ext_model("ext_far.onnx", "w.bin", "16", "16");
  expect_import_error("ext_far.onnx", IR_BAD_FORMAT, "lie outside");
  write_ext_model("ext_huge.onnx", "w.bin", "18446744073709551615", "16");
  expect_import_error("ext_huge.onnx", IR_BAD_FORMAT, "lie outside");
  write_ext_model("ext_len.onnx", "w.bin", "0", "12");
  expect_import_error("ext_len.onnx", IR_BAD_FORMAT, "external length 12");
  write_ext_model("ext_neg.onnx", "w.bin", "-4", "16");
  expect_import_error("ext_neg.onnx", IR_BAD_FORMAT, "bad external_data entry 'offset'");
  write_ext_model("ext_missing.onnx", "nope.bin", "0", "16");
  expect_import_error("ext_missing.onnx", IR_IO, "external data 'nope.bin'");
}

static void test_errors(void) {
  int64_t d3[3] = {1, 4, 8}, d2[2] = {4, 8}, sym[2] = {-1, 8};
  graph_spec s = {0};
  s.ins[s.n_ins++] = vinfo("q", 1, 3, d3);
  s.outs[s.n_outs++] = vinfo("y", 1, 3, d3);
  s.nodes[s.n_nodes++] = node("GroupQueryAttention", "Attn_3", "q,q,q", "y", "com.microsoft",
                              attr_i("num_heads", 2), NULL);
  write_model(p0("gqa.onnx"), &s);
  expect_import_error("gqa.onnx", IR_UNSUPPORTED,
                      "gqa.onnx: node 'Attn_3': op 'GroupQueryAttention' (domain com.microsoft, "
                      "opset 1) is not supported");
  ir_diag d;
  CHECK(build(p0("gqa.onnx"), p1("gqa.plan"), &d) == IR_UNSUPPORTED && strstr(d.msg, "Attn_3"));

  s = (graph_spec){.opset = 23};
  s.ins[s.n_ins++] = vinfo("q", 1, 3, d3);
  s.outs[s.n_outs++] = vinfo("y", 1, 3, d3);
  s.nodes[s.n_nodes++] = node("Attention", "attn", "q,q,q", "y", NULL, NULL, NULL);
  write_model(p0("attn3d.onnx"), &s);
  expect_import_error("attn3d.onnx", IR_BAD_FORMAT,
                      "node 'attn': op 'Attention' needs attribute 'q_num_heads'");

  s = (graph_spec){0};
  s.ins[s.n_ins++] = vinfo("x", 1, 2, sym);
  s.outs[s.n_outs++] = vinfo("y", 1, 2, sym);
  s.nodes[s.n_nodes++] = node("Relu", "relu", "x", "y", NULL, NULL, NULL);
  write_model(p0("sym.onnx"), &s);
  expect_import_error("sym.onnx", IR_UNSUPPORTED, "dim 0 is symbolic ('batch')");

  s = (graph_spec){0};
  s.ins[s.n_ins++] = vinfo("x", 1, 2, d2);
  s.outs[s.n_outs++] = vinfo("y", 1, 2, d2);
  s.nodes[s.n_nodes++] = node("Add", "add", "x,nowhere", "y", NULL, NULL, NULL);
  write_model(p0("undef.onnx"), &s);
  expect_import_error("undef.onnx", IR_BAD_FORMAT, "input 'nowhere' is not produced");

  s = (graph_spec){0};
  float w[3] = {1, 2, 3};
  s.ins[s.n_ins++] = vinfo("x", 1, 2, d2);
  s.outs[s.n_outs++] = vinfo("y", 1, 2, d2);
  s.inits[s.n_inits++] = tensor("w", 1, 2, d2, w, sizeof w);
  s.nodes[s.n_nodes++] = node("Add", "add", "x,w", "y", NULL, NULL, NULL);
  write_model(p0("short.onnx"), &s);
  expect_import_error("short.onnx", IR_BAD_FORMAT, "tensor 'w': 12 bytes of raw_data");

  s = (graph_spec){.opset = 25};
  s.ins[s.n_ins++] = vinfo("x", 1, 2, d2);
  s.outs[s.n_outs++] = vinfo("y", 1, 2, d2);
  s.nodes[s.n_nodes++] = node("Relu", "relu", "x", "y", NULL, NULL, NULL);
  write_model(p0("opset25.onnx"), &s);
  expect_import_error("opset25.onnx", IR_UNSUPPORTED, "opset 25 is newer");

  FILE *f = fopen(p0("junk.onnx"), "wb");
  CHECK(f && fwrite("\x0a\xff\xff\xff\xff\x0f junk", 11, 1, f) == 1);
  if (f) fclose(f);
  expect_import_error("junk.onnx", IR_BAD_FORMAT, "does not decode");
}

/* Int-list attributes survive a plan: written, read back, verified and printed. */
static void test_int_lists(void) {
  graph_spec s = {0};
  int64_t xd[3] = {2, 3, 4}, yd[3] = {4, 2, 3}, perm[3] = {2, 0, 1};
  s.ins[s.n_ins++] = vinfo("x", 1, 3, xd);
  s.outs[s.n_outs++] = vinfo("y", 1, 3, yd);
  s.nodes[s.n_nodes++] = node("Transpose", "tr", "x", "y", NULL, attr_ints("perm", 3, perm), NULL);
  write_model(p0("perm.onnx"), &s);
  ir_diag d;
  CHECKF(build(p0("perm.onnx"), p1("perm.plan"), &d) == IR_OK, "%s", d.msg);
  ir_plan *pl = NULL;
  CHECKF(ir_plan_open(p1("perm.plan"), IR_PLAN_VERIFY_ALL, &pl, &d) == IR_OK, "%s", d.msg);
  if (pl) {
    const ir_graph *g = ir_plan_graph(pl);
    int n = 0;
    const int64_t *v = g->n_nodes == 1 ? ir_node_attr_ints(&g->nodes[0], "perm", &n) : NULL;
    CHECK(v && n == 3 && v[0] == 2 && v[1] == 0 && v[2] == 1);
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    if (f) {
      ir_graph_print(g, f);
      fclose(f);
    }
    CHECKF(strstr(buf, "nd.transpose(%x:f32[2,3,4]) {perm=[2,0,1]}"), "%s", buf);
    ir_plan_close(pl);
  }
  float x[24], y[24];
  for (int i = 0; i < 24; i++) x[i] = (float)i;
  CHECK(run1(p0("perm.onnx"), x, sizeof x, y, sizeof y, 1));
  /* y[k][i][j] = x[i][j][k] */
  bool ok = true;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 4; k++) ok = ok && y[(k * 2 + i) * 3 + j] == x[(i * 3 + j) * 4 + k];
  CHECK(ok);
}

static void test_program_api(void) {
  graph_spec s = {0};
  int64_t xd[1] = {5}, id[1] = {3};
  s.ins[s.n_ins++] = vinfo("x", 1, 1, xd);
  s.ins[s.n_ins++] = vinfo("i", 7, 1, id);
  s.outs[s.n_outs++] = vinfo("y", 1, 1, id);
  s.outs[s.n_outs++] = vinfo("x", 1, 1, xd);
  s.nodes[s.n_nodes++] = node("Gather", "gather", "x,i", "y", NULL, NULL, NULL);
  write_model(p0("gather.onnx"), &s);
  ir_diag d;
  CHECKF(build(p0("gather.onnx"), p1("gather.plan"), &d) == IR_OK, "%s", d.msg);
  irt_program *p = NULL;
  irt_error err = {0};
  CHECKF(irt_program_open(p1("gather.plan"), NULL, &p, &err) == IRT_OK, "%s", err.msg);
  if (!p) return;
  irt_tensor_info in, out;
  CHECK(irt_program_n_inputs(p) == 2 && irt_program_n_outputs(p) == 2);
  CHECK(irt_program_find_input(p, "i") == 1 && irt_program_find_output(p, "x") == 1);
  CHECK(irt_program_input_info(p, 1, &in) == IRT_OK && in.dtype == IRT_DTYPE_I64 && in.rank == 1 &&
        in.shape[0] == 3 && in.nbytes == 24);
  CHECK(irt_program_output_info(p, 2, &out) == IRT_INVALID_ARG);
  CHECK(irt_program_output(p, 0, NULL) == NULL); /* before the first run */
  float x[5] = {10, 11, 12, 13, 14};
  int64_t idx[3] = {4, -1, 0};
  CHECK(irt_program_set_input(p, 0, x, 8, &err) == IRT_INVALID_ARG &&
        strstr(err.msg, "input 'x' takes 20 bytes, got 8"));
  CHECK(irt_program_set_input(p, 0, x, sizeof x, &err) == IRT_OK);
  CHECK(irt_program_set_input(p, 1, idx, sizeof idx, &err) == IRT_OK);
  CHECKF(irt_program_run(p, &err) == IRT_OK, "%s", err.msg);
  const float *y = irt_program_output(p, 0, NULL), *xo = irt_program_output(p, 1, NULL);
  CHECK(y && y[0] == 14 && y[1] == 14 && y[2] == 10);
  CHECK(xo && xo[2] == 12); /* an input that is also an output is copied out */
  idx[1] = 5;               /* inputs persist across runs; an index out of range fails the run */
  CHECK(irt_program_set_input(p, 1, idx, sizeof idx, &err) == IRT_OK);
  CHECK(irt_program_run(p, &err) == IRT_INVALID_ARG && strstr(err.msg, "index 5 is out of range"));
  irt_program_close(p);

  /* An LLM plan is not a program. */
  char plan[1024];
  snprintf(plan, sizeof plan, "%s/llm.plan", DIR_);
  if (build(FIXTURES_DIR "/llama-gqa-f32", plan, &d) == IR_OK) {
    p = NULL;
    CHECK(irt_program_open(plan, NULL, &p, &err) == IRT_UNSUPPORTED &&
          strstr(err.msg, "LLM step program") && !p);
  }
}

/* The n-d kernels give the same bits on 1 and 4 threads (the row order is fixed). */
static void test_thread_invariance(void) {
  graph_spec s = {.opset = 13};
  int64_t ad[3] = {4, 33, 70}, wd[2] = {70, 29}, yd[3] = {4, 33, 29};
  size_t nw = 70 * 29;
  float *w = malloc(nw * sizeof *w);
  for (size_t i = 0; i < nw; i++) w[i] = (float)sin((double)i) * 0.1f;
  s.ins[s.n_ins++] = vinfo("a", 1, 3, ad);
  s.outs[s.n_outs++] = vinfo("y", 1, 3, yd);
  s.inits[s.n_inits++] = tensor("w", 1, 2, wd, w, nw * sizeof *w);
  s.nodes[s.n_nodes++] = node("MatMul", "mm", "a,w", "h", NULL, NULL, NULL);
  s.nodes[s.n_nodes++] = node("Softmax", "sm", "h", "y", NULL, attr_i("axis", -1), NULL);
  write_model(p0("mm.onnx"), &s);
  free(w);
  size_t na = 4 * 33 * 70, ny = 4 * 33 * 29;
  float *a = malloc(na * sizeof *a), *y1 = malloc(ny * sizeof *y1), *y4 = malloc(ny * sizeof *y4);
  for (size_t i = 0; i < na; i++) a[i] = (float)cos((double)i * 0.37);
  CHECK(run1(p0("mm.onnx"), a, na * 4, y1, ny * 4, 1));
  CHECK(run1(p0("mm.onnx"), a, na * 4, y4, ny * 4, 4));
  CHECK(!memcmp(y1, y4, ny * sizeof *y1));
  double sum = 0;
  for (int j = 0; j < 29; j++) sum += y1[5 * 29 + j];
  CHECK(fabs(sum - 1.0) < 1e-5);
  free(a), free(y1), free(y4);
}

/* Every prefix of a valid model either imports or fails cleanly (ASan watches). */
static void test_truncations(void) {
  FILE *f = fopen(p0("chain.onnx"), "rb");
  uint8_t buf[4096];
  size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
  if (f) fclose(f);
  CHECK(n > 100);
  int ok = 0;
  for (size_t len = 0; len < n; len++) {
    FILE *o = fopen(p0("cut.onnx"), "wb");
    if (!o) break;
    if (len) fwrite(buf, 1, len, o);
    fclose(o);
    ir_graph *g = NULL;
    infc_onnx *m = NULL;
    ir_diag d;
    ir_status st = import(p0("cut.onnx"), &g, &m, &d);
    ok += st == IR_OK || (st != IR_OK && d.msg[0] && !g && !m);
    ir_graph_destroy(g);
    infc_onnx_close(m);
  }
  CHECKF(ok == (int)n, "%d of %zu prefixes handled", ok, n);
}

int main(void) {
  if (mkdir(TEST_TMP_DIR, 0755) != 0 && errno != EEXIST) return 1;
  if (mkdir(DIR_, 0755) != 0 && errno != EEXIST) return 1;
  test_shape_chain();
  test_external_data();
  test_errors();
  test_int_lists();
  test_program_api();
  test_thread_invariance();
  test_truncations();
  return tcheck_done("onnx");
}
