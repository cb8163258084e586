/* test_plan: the plan file round-trips the graph exactly, the same inputs give the same
 * bytes, and every kind of damage (magic, version, checksums, truncation, a flipped byte
 * anywhere) is refused with a message, never a crash. */
#include <stddef.h>
#include <stdlib.h>
#include <xxhash.h>
#include <string.h>

#include "infc_build.h"
#include "infc_util.h"
#include "ir_plan.h"
#include "tcheck.h"

#define FIXTURE FIXTURES_DIR "/qwen2-bias-bf16"

static char *slurp(const char *path, size_t *len) {
  char *buf = NULL;
  ir_diag d = {0};
  infc_read_file(path, 64u << 20, &buf, len, &d);
  return buf;
}

static void spit(const char *path, const void *buf, size_t len) {
  FILE *f = fopen(path, "wb");
  fwrite(buf, 1, len, f);
  fclose(f);
}

static bool same_tensor(const ir_tensor *a, const ir_tensor *b) {
  bool ok = !strcmp(a->name, b->name) && a->dtype == b->dtype && a->rank == b->rank &&
            a->kind == b->kind && a->arena_offset == b->arena_offset &&
            a->producer == b->producer && a->nbytes == b->nbytes;
  for (int k = 0; ok && k < a->rank; k++)
    ok = a->dims[k].n == b->dims[k].n && a->dims[k].sym == b->dims[k].sym;
  if (ok && a->kind == IR_TENSOR_WEIGHT) ok = !memcmp(a->data, b->data, a->nbytes);
  return ok;
}

static bool same_node(const ir_node *a, const ir_node *b) {
  bool ok = a->op == b->op && !strcmp(a->name, b->name) && a->n_in == b->n_in &&
            a->n_out == b->n_out && a->n_attrs == b->n_attrs &&
            !memcmp(a->in, b->in, sizeof(int32_t) * (size_t)a->n_in) &&
            !memcmp(a->out, b->out, sizeof(int32_t) * (size_t)a->n_out);
  for (int k = 0; ok && k < a->n_attrs; k++)
    ok = a->attrs[k].name == b->attrs[k].name && a->attrs[k].type == b->attrs[k].type &&
         a->attrs[k].i == b->attrs[k].i && a->attrs[k].f == b->attrs[k].f;
  return ok;
}

/* Builds the optimised graph in memory, writes it, reads it back, compares everything. */
static void test_round_trip(void) {
  infc_options o = infc_options_default();
  infc_source *src = NULL;
  ir_graph *g = NULL;
  ir_diag d = {0};
  CHECKF(infc_source_open(FIXTURE, &o, &src, &g, &d) == IR_OK, "%s", d.msg);
  if (!g) return;
  const char *path = TEST_TMP_DIR "/roundtrip.plan";
  CHECKF(ir_plan_write(g, NULL, path, &d) == IR_OK, "%s", d.msg);
  ir_plan *p = NULL;
  CHECKF(ir_plan_open(path, IR_PLAN_VERIFY_ALL, &p, &d) == IR_OK, "%s", d.msg);
  if (p) {
    const ir_graph *r = ir_plan_graph(p);
    CHECK(r->n_tensors == g->n_tensors && r->n_nodes == g->n_nodes);
    CHECK(!memcmp(&r->config, &g->config, sizeof g->config));
    for (int32_t i = 0; i < g->n_tensors && i < r->n_tensors; i++)
      CHECKF(same_tensor(&g->tensors[i], &r->tensors[i]), "tensor %d '%s' differs", i,
             g->tensors[i].name);
    for (int32_t i = 0; i < g->n_nodes && i < r->n_nodes; i++)
      CHECKF(same_node(&g->nodes[i], &r->nodes[i]), "node %d '%s' differs", i, g->nodes[i].name);
    CHECK(r->n_outputs == g->n_outputs && r->outputs[0] == g->outputs[0]);
    CHECK(r->n_inputs == g->n_inputs && !memcmp(r->inputs, g->inputs, sizeof(int32_t) * 3));
    /* Weights are used in place: 64-byte aligned pointers into the mapping. */
    for (int32_t i = 0; i < r->n_tensors; i++)
      if (r->tensors[i].kind == IR_TENSOR_WEIGHT) CHECK((uintptr_t)r->tensors[i].data % 64 == 0);
  }
  ir_plan_close(p);
  ir_graph_destroy(g);
  infc_source_close(src);
}

static void test_deterministic(void) {
  infc_options o = infc_options_default();
  ir_diag d = {0};
  const char *a = TEST_TMP_DIR "/det-a.plan", *b = TEST_TMP_DIR "/det-b.plan";
  CHECKF(infc_build(FIXTURE, &o, a, NULL, NULL, &d) == IR_OK, "%s", d.msg);
  CHECKF(infc_build(FIXTURE, &o, b, NULL, NULL, &d) == IR_OK, "%s", d.msg);
  size_t la = 0, lb = 0;
  char *ba = slurp(a, &la), *bb = slurp(b, &lb);
  CHECK(ba && bb && la == lb && la > 0 && !memcmp(ba, bb, la));
  /* A different option must change the bytes (the check above is not vacuous). */
  o.model.max_tokens = 128;
  CHECK(infc_build(FIXTURE, &o, b, NULL, NULL, &d) == IR_OK);
  free(bb);
  bb = slurp(b, &lb);
  CHECK(bb && (la != lb || memcmp(ba, bb, la)));
  free(ba);
  free(bb);
}

static ir_status open_bytes(const void *buf, size_t len, ir_plan_verify v, ir_diag *d) {
  const char *path = TEST_TMP_DIR "/damaged.plan";
  spit(path, buf, len);
  ir_plan *p = NULL;
  *d = (ir_diag){0};
  ir_status st = ir_plan_open(path, v, &p, d);
  CHECK((st == IR_OK) == (p != NULL));
  ir_plan_close(p);
  return st;
}

static void expect_refused(const void *buf, size_t len, ir_status want, const char *needle) {
  ir_diag d;
  ir_status st = open_bytes(buf, len, IR_PLAN_VERIFY_ALL, &d);
  CHECKF(st == want && strstr(d.msg, needle), "want %s '%s', got %s '%s'", ir_status_name(want),
         needle, ir_status_name(st), d.msg);
}

static void rehash_header(ir_plan_header *h) {
  h->header_hash = XXH3_64bits(h, offsetof(ir_plan_header, header_hash));
}

static void test_damage(void) {
  const char *path = TEST_TMP_DIR "/det-a.plan";
  size_t len = 0;
  char *good = slurp(path, &len), *bad = malloc(len + 16);
  if (!good || !bad) {
    CHECK(!"cannot read the plan built by test_deterministic");
    free(good), free(bad);
    return;
  }
  ir_plan_header h;
  memcpy(&h, good, sizeof h);
  ir_diag d;
  CHECK(open_bytes(good, len, IR_PLAN_VERIFY_ALL, &d) == IR_OK);

  memcpy(bad, good, len);
  memcpy(bad, "GGUF\0\0\0\0", 8);
  expect_refused(bad, len, IR_BAD_FORMAT, "bad magic");

  memcpy(bad, good, len);
  ((ir_plan_header *)bad)->version_major = IR_PLAN_VERSION_MAJOR + 1;
  rehash_header((ir_plan_header *)bad);
  expect_refused(bad, len, IR_VERSION, "is not supported");

  memcpy(bad, good, len); /* 1.x: the interleaved weights had another order */
  ((ir_plan_header *)bad)->version_major = 1;
  rehash_header((ir_plan_header *)bad);
  expect_refused(bad, len, IR_VERSION, "plan format version 1.0 is not supported");

  memcpy(bad, good, len);
  bad[offsetof(ir_plan_header, reserved)] ^= 1;
  expect_refused(bad, len, IR_BAD_FORMAT, "header checksum");

  memcpy(bad, good, len);
  bad[h.meta_offset + h.meta_size / 2] ^= 0x40;
  expect_refused(bad, len, IR_BAD_FORMAT, "metadata checksum");

  memcpy(bad, good, len);
  bad[h.weights_offset + h.weights_size / 3] ^= 0x01;
  expect_refused(bad, len, IR_BAD_FORMAT, "weights checksum");
  CHECK(open_bytes(bad, len, IR_PLAN_VERIFY_META, &d) == IR_OK); /* the fast path skips it */

  expect_refused(good, len - 1, IR_BAD_FORMAT, "truncated");
  expect_refused(good, len / 2, IR_BAD_FORMAT, "truncated");
  expect_refused(good, 100, IR_BAD_FORMAT, "shorter than a plan header");
  expect_refused(good, 0, IR_BAD_FORMAT, "shorter than a plan header");
  memcpy(bad, good, len);
  memset(bad + len, 0, 16);
  expect_refused(bad, len + 16, IR_BAD_FORMAT, "trailing data");

  /* Well-formed checksums around metadata that is not a valid plan. */
  memcpy(bad, good, len);
  memset(bad + h.meta_offset, 0xff, h.meta_size);
  ir_plan_header *bh = (ir_plan_header *)bad;
  bh->meta_hash = XXH3_64bits(bad + h.meta_offset, h.meta_size);
  rehash_header(bh);
  CHECK(open_bytes(bad, len, IR_PLAN_VERIFY_ALL, &d) == IR_BAD_FORMAT);

  /* Section offsets pointing past the end, with a valid header checksum. */
  memcpy(bad, good, len);
  bh->weights_offset = (uint64_t)len + 4096;
  rehash_header(bh);
  expect_refused(bad, len, IR_BAD_FORMAT, "outside the file");

  /* Any flipped byte of the header or metadata is caught. */
  int caught = 0, tried = 0;
  for (uint64_t i = 0; i < h.meta_offset + h.meta_size; i += 7, tried++) {
    memcpy(bad, good, len);
    bad[i] ^= 0x10;
    if (open_bytes(bad, len, IR_PLAN_VERIFY_ALL, &d) != IR_OK && d.msg[0]) caught++;
  }
  CHECKF(caught == tried, "%d of %d flipped bytes were caught", caught, tried);
  free(good);
  free(bad);
}

/* A plan whose config or graph lies, written with valid checksums (the writer does not
 * verify): opening it must refuse with a message, not index past the KV cache's layers or
 * run with a head geometry the kernels do not lay out. Each case edits a fresh graph. */
typedef void (*lie_fn)(ir_graph *g);
static void lie_layers(ir_graph *g) { g->config.n_layers = 1; } /* nodes of layer 1 remain */
static void lie_head_dim(ir_graph *g) { g->config.head_dim *= 2; }
static void lie_kv_heads(ir_graph *g) { g->config.n_kv_heads = g->config.n_heads; }
static void lie_vocab(ir_graph *g) { g->config.vocab_size = 0; }
static void lie_vocab_big(ir_graph *g) { g->config.vocab_size *= 2; }
static void lie_position(ir_graph *g) { g->config.max_position *= 64; }
static void lie_huge_layers(ir_graph *g) { g->config.n_layers = (int64_t)1 << 40; }
static ir_node *first_op(ir_graph *g, ir_op op) {
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == op) return &g->nodes[i];
  abort();
}
static ir_attr *attr(ir_node *n, const char *name) {
  for (int k = 0; k < n->n_attrs; k++)
    if (!strcmp(n->attrs[k].name, name)) return &n->attrs[k];
  abort();
}
static void lie_layer_attr(ir_graph *g) { attr(first_op(g, IR_OP_ATTENTION), "layer")->i = 7; }
static void lie_layer_neg(ir_graph *g) { attr(first_op(g, IR_OP_ATTENTION), "layer")->i = -1; }
static void lie_layer_float(ir_graph *g) {
  ir_attr *a = attr(first_op(g, IR_OP_ATTENTION), "layer");
  a->type = IR_ATTR_FLOAT, a->f = 0.0 / 0.0;
}
static void lie_dims_overflow(ir_graph *g) { /* a weight whose shape product wraps to 0 */
  for (int32_t i = 0; i < g->n_tensors; i++)
    if (g->tensors[i].kind == IR_TENSOR_WEIGHT && g->tensors[i].rank == 2) {
      g->tensors[i].dims[0].n = (int64_t)1 << 33, g->tensors[i].dims[1].n = (int64_t)1 << 31;
      return;
    }
}

static void test_lies(void) {
  static const struct {
    const char *what;
    lie_fn fn;
    const char *needle;
  } k_cases[] = {
      {"n_layers 1", lie_layers, "outside the config's 1 layers"},
      {"head_dim doubled", lie_head_dim, "where the config says"},
      {"kv heads = heads", lie_kv_heads, "where the config says"},
      {"vocab_size 0", lie_vocab, "vocab_size 0"},
      {"vocab_size doubled", lie_vocab_big, "vocab_size"},
      {"max_position x64", lie_position, "rope table"},
      {"n_layers 2^40", lie_huge_layers, "n_layers"},
      {"layer 7", lie_layer_attr, "layer 7 is outside"},
      {"layer -1", lie_layer_neg, "layer -1 is outside"},
      {"layer NaN", lie_layer_float, "must be an integer"},
      {"dims overflow", lie_dims_overflow, "2^48 bytes"},
  };
  const char *path = TEST_TMP_DIR "/lie.plan";
  infc_options o = infc_options_default();
  for (size_t c = 0; c < sizeof k_cases / sizeof *k_cases; c++) {
    infc_source *src = NULL;
    ir_graph *g = NULL;
    ir_diag d = {0};
    CHECKF(infc_source_open(FIXTURE, &o, &src, &g, &d) == IR_OK, "%s", d.msg);
    if (!g) continue;
    k_cases[c].fn(g);
    CHECKF(ir_plan_write(g, NULL, path, &d) == IR_OK, "%s: %s", k_cases[c].what, d.msg);
    ir_plan *p = NULL;
    d = (ir_diag){0};
    ir_status st = ir_plan_open(path, IR_PLAN_VERIFY_ALL, &p, &d);
    CHECKF(st == IR_BAD_FORMAT && !p && strstr(d.msg, k_cases[c].needle),
           "%s: got %s '%s', want '%s'", k_cases[c].what, ir_status_name(st), d.msg,
           k_cases[c].needle);
    ir_plan_close(p);
    ir_graph_destroy(g);
    infc_source_close(src);
  }
}

static void test_missing(void) {
  ir_plan *p = NULL;
  ir_diag d = {0};
  CHECK(ir_plan_open(TEST_TMP_DIR "/no-such.plan", IR_PLAN_VERIFY_ALL, &p, &d) == IR_IO);
  CHECK(p == NULL && strstr(d.msg, "no-such.plan"));
}

int main(void) {
  test_round_trip();
  test_deterministic();
  test_damage();
  test_lies();
  test_missing();
  return tcheck_done("plan");
}
