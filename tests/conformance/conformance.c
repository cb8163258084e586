/* conformance: runs ONNX backend node tests (Debian's libonnx-testdata and the opset 23-24
 * tests in ../shared/testdata/onnx-node) through the library path of `infc build` and
 * the generic run mode, compares every output, and prints passed / failed / unsupported
 * per op. A case is unsupported when the build says IR_UNSUPPORTED (an op, dtype or
 * feature the compiler lacks, named in the table); anything else that is not an exact
 * pass within tolerance is a failure, and any failure fails the run.
 *
 * usage: conformance [-v] [--threads N] [--filter SUBSTR] [--tmp DIR] DIR...
 *        conformance --compare EXPECTED.pb ACTUAL.pb
 * Tolerances (those of the ONNX backend tests, widened for half types, which the compiler
 * computes in f32 and rounds once where numpy rounds per op): f32 |a-e| <= 1e-7 + 1e-3|e|;
 * f16 1e-3 + 1e-3|e|; bf16 1e-2 + 1e-2|e|; integers and bools exactly. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "infc_build.h"
#include "inferrt.h"
#include "ir_plan.h"
#include "onnx.pb-c.h"
#include "infc_onnx.h"
#include "pass.h"

#define MAX_CASES 4096
#define MAX_OPS 512
#define MAX_BIND 16

typedef enum verdict { V_PASS, V_FAIL, V_UNSUP } verdict;

typedef struct tcase {
  char dir[1024], name[160], op[96];
  char **ops; /* op types in the graph */
  int n_ops;
  verdict v;
  bool spec; /* built with its integer inputs bound to the data set's values */
  char why[600];
  double ms;
} tcase;

/* Integer inputs of one data set, fixed into the model when it is specialised. */
typedef struct bindings {
  fmt_onnx_tensor t[MAX_BIND];
  infc_onnx_binding b[MAX_BIND];
  int n;
} bindings;

typedef struct row {
  char op[96];
  int pass, fail, unsup, spec;
  char unsup_why[240];
} row;

static int g_threads = 2;
static bool g_verbose;
static const char *g_tmp = "/tmp";

/* --- comparison ------------------------------------------------------------------------ */

static float half_at(ir_dtype dt, const void *p, int64_t i) {
  uint16_t h = ((const uint16_t *)p)[i];
  return dt == IR_F16 ? ir_f16_to_f32(h) : ir_bf16_to_f32(h);
}

static int64_t int_at(ir_dtype dt, const void *p, int64_t i) {
  switch (dt) {
  case IR_I64: return ((const int64_t *)p)[i];
  case IR_I32: return ((const int32_t *)p)[i];
  case IR_I8: return ((const int8_t *)p)[i];
  default: return ((const uint8_t *)p)[i];
  }
}

static bool close_enough(double a, double e, double atol, double rtol) {
  if (isnan(e) || isnan(a)) return isnan(e) && isnan(a);
  if (isinf(e) || isinf(a)) return a == e;
  return fabs(a - e) <= atol + rtol * fabs(e);
}

/* Compares an actual tensor with the expected one; false with the first mismatch in why. */
static bool compare(const fmt_onnx_tensor *e, ir_dtype dt, int rank, const int64_t *shape,
                    const void *data, char *why, size_t len) {
  if (dt != e->dtype || rank != e->rank) {
    snprintf(why, len, "got %s rank %d, expected %s rank %d", ir_dtype_name(dt), rank,
             ir_dtype_name(e->dtype), e->rank);
    return false;
  }
  int64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] != e->shape[i]) {
      snprintf(why, len, "dim %d is %lld, expected %lld", i, (long long)shape[i],
               (long long)e->shape[i]);
      return false;
    }
    n *= shape[i];
  }
  double atol = dt == IR_F32 ? 1e-7 : dt == IR_F16 ? 1e-3 : 1e-2;
  double rtol = dt == IR_F32 ? 1e-3 : dt == IR_F16 ? 1e-3 : 1e-2;
  for (int64_t i = 0; i < n; i++) {
    bool ok;
    double a, x;
    if (dt == IR_F32) {
      a = ((const float *)data)[i];
      x = ((const float *)e->data)[i];
      ok = close_enough(a, x, atol, rtol);
    } else if (dt == IR_F16 || dt == IR_BF16) {
      a = half_at(dt, data, i);
      x = half_at(dt, e->data, i);
      ok = close_enough(a, x, atol, rtol);
    } else {
      a = (double)int_at(dt, data, i);
      x = (double)int_at(dt, e->data, i);
      ok = e->is_bool ? (a != 0) == (x != 0) : a == x;
    }
    if (!ok) {
      snprintf(why, len, "element %lld is %.9g, expected %.9g", (long long)i, a, x);
      return false;
    }
  }
  return true;
}

/* --- running one case ------------------------------------------------------------------- */

static bool file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

static bool is_bound(const bindings *bd, const char *name) {
  for (int i = 0; bd && i < bd->n; i++)
    if (!strcmp(bd->b[i].name, name)) return true;
  return false;
}

/* Feeds data set `set` to p (skipping inputs bound at build), runs it and compares. */
static verdict run_set(irt_program *p, const char *set, const bindings *bd, char *why, size_t len) {
  char path[1800];
  irt_error err = {0};
  ir_diag d = {0};
  for (int k = 0, pos = 0;; k++) {
    snprintf(path, sizeof path, "%s/input_%d.pb", set, k);
    if (!file_exists(path)) break;
    fmt_onnx_tensor t;
    if (fmt_onnx_tensor_load(path, &t, &d) != IR_OK) return snprintf(why, len, "%s", d.msg), V_FAIL;
    if (t.name[0] && is_bound(bd, t.name)) {
      fmt_onnx_tensor_free(&t);
      continue;
    }
    int i = t.name[0] ? irt_program_find_input(p, t.name) : -1;
    if (i < 0) i = pos;
    pos++;
    irt_tensor_info in;
    bool declared = irt_program_input_info(p, i, &in) == IRT_OK && in.nbytes != t.nbytes;
    irt_status st = irt_program_set_input(p, i, t.data, t.nbytes, &err);
    fmt_onnx_tensor_free(&t);
    if (st != IRT_OK && declared) /* static shapes are the model's declared ones */
      return snprintf(why, len,
                      "input %d: the data differs from the model's declared input "
                      "shape: %s",
                      k, err.msg),
             V_UNSUP;
    if (st != IRT_OK) return snprintf(why, len, "input %d: %s", k, err.msg), V_FAIL;
  }
  if (irt_program_run(p, &err) != IRT_OK) return snprintf(why, len, "run: %s", err.msg), V_FAIL;
  for (int k = 0;; k++) {
    snprintf(path, sizeof path, "%s/output_%d.pb", set, k);
    if (!file_exists(path)) break;
    fmt_onnx_tensor e;
    irt_tensor_info o;
    if (fmt_onnx_tensor_load(path, &e, &d) != IR_OK) return snprintf(why, len, "%s", d.msg), V_FAIL;
    int i = e.name[0] ? irt_program_find_output(p, e.name) : -1;
    if (i < 0) i = k;
    char w[300] = "";
    bool ok = irt_program_output_info(p, i, &o) == IRT_OK &&
              compare(&e, (ir_dtype)o.dtype, o.rank, o.shape, irt_program_output(p, i, NULL), w,
                      sizeof w);
    if (!ok) snprintf(why, len, "output %d ('%s'): %s", k, e.name, w[0] ? w : "missing");
    fmt_onnx_tensor_free(&e);
    if (!ok) return V_FAIL;
  }
  return V_PASS;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the entries of dir starting with prefix (malloc'd array of strdup'd). */
static int list_dir(const char *dir, const char *prefix, char ***out) {
  DIR *dp = opendir(dir);
  int n = 0, cap = 64;
  char **v = malloc((size_t)cap * sizeof *v);
  struct dirent *e;
  while (dp && v && (e = readdir(dp))) {
    if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
    if (n == cap) {
      char **g = realloc(v, (size_t)(cap *= 2) * sizeof *v);
      if (!g) break;
      v = g;
    }
    v[n++] = strdup(e->d_name);
  }
  if (dp) closedir(dp);
  if (v) qsort(v, (size_t)n, sizeof *v, cmp_str);
  *out = v;
  return v ? n : 0;
}

static void free_list(char **v, int n) {
  for (int i = 0; i < n; i++) free(v[i]);
  free(v);
}

static void free_bindings(bindings *bd) {
  for (int i = 0; i < bd->n; i++) fmt_onnx_tensor_free(&bd->t[i]);
  bd->n = 0;
}

/* Adds the input of data set `set` named `name` to the bindings; false if there is none. */
static bool add_binding(const char *set, const char *name, bindings *bd) {
  char path[1800];
  ir_diag d = {0};
  for (int k = 0; bd->n < MAX_BIND; k++) {
    snprintf(path, sizeof path, "%s/input_%d.pb", set, k);
    if (!file_exists(path)) return false;
    fmt_onnx_tensor *t = &bd->t[bd->n];
    if (fmt_onnx_tensor_load(path, t, &d) != IR_OK) continue;
    if (!strcmp(t->name, name)) {
      bd->b[bd->n] = (infc_onnx_binding){.name = t->name, .value = t};
      bd->n++;
      return true;
    }
    fmt_onnx_tensor_free(t);
  }
  return false;
}

/* Binds every integer input of data set `set` not bound yet; false if none was added. */
static bool add_int_bindings(const char *set, bindings *bd) {
  char path[1800];
  ir_diag d = {0};
  int before = bd->n;
  for (int k = 0; bd->n < MAX_BIND; k++) {
    snprintf(path, sizeof path, "%s/input_%d.pb", set, k);
    if (!file_exists(path)) break;
    fmt_onnx_tensor *t = &bd->t[bd->n];
    if (fmt_onnx_tensor_load(path, t, &d) != IR_OK) continue;
    if (t->name[0] && !t->is_bool && (t->dtype == IR_I64 || t->dtype == IR_I32) &&
        !is_bound(bd, t->name)) {
      bd->b[bd->n] = (infc_onnx_binding){.name = t->name, .value = t};
      bd->n++;
    } else {
      fmt_onnx_tensor_free(t);
    }
  }
  return bd->n > before;
}

/* The tensor a "... ('name') must be a constant" build error names, into buf. */
static bool constant_wanted(const char *why, char *buf, size_t len) {
  const char *e = strstr(why, "') must be a constant");
  const char *b = e;
  while (b && b > why && !(b[-1] == '(' && b[0] == '\'')) b--;
  if (!e || !b || b == why) return false;
  snprintf(buf, len, "%.*s", (int)(e - b - 1), b + 1);
  return true;
}

/* infc_build for a model with bound inputs: the same frontend, passes and plan writer. */
static ir_status build_bound(const char *model, const bindings *bd, const char *plan, ir_diag *d) {
  infc_options o = infc_options_default();
  ir_model_config lim = {.max_tokens = o.model.max_tokens,
                         .max_seqs = o.model.max_seqs,
                         .max_logits = o.model.max_logits,
                         .kv_block_size = o.model.kv_block_size};
  infc_onnx *m = NULL;
  ir_graph *g = NULL;
  char hash[17] = "";
  pass_log log = {0};
  pass_opts po = {.fold = o.fold, .fuse = o.fuse};
  ir_status st = infc_onnx_import_bound(model, &lim, bd->b, bd->n, &m, &g, hash, d);
  if (st == IR_OK) st = pass_pipeline_run(g, &po, &log, d);
  if (st == IR_OK) {
    ir_plan_info info = {.target = "cpu",
                         .source_hash = hash,
                         .pass_log = (const char *const *)log.lines,
                         .n_pass_log = log.n};
    st = ir_plan_write(g, &info, plan, d);
  }
  pass_log_free(&log);
  ir_graph_destroy(g);
  infc_onnx_close(m);
  return st;
}

/* Builds with every input the build wants constant bound to data set `set`'s value. */
static ir_status build_specialised(const char *model, const char *set, const char *plan,
                                   bindings *bd, ir_diag *d) {
  bool ints_bound = false;
  for (;;) {
    char name[256];
    *d = (ir_diag){0};
    ir_status st = build_bound(model, bd, plan, d);
    if (st != IR_UNSUPPORTED || !constant_wanted(d->msg, name, sizeof name)) return st;
    if (!is_bound(bd, name) && add_binding(set, name, bd)) continue;
    /* A value computed from inputs: bind every integer input (sizes, counts). */
    if (ints_bound || !add_int_bindings(set, bd)) return st;
    ints_bound = true;
  }
}

/* Shape operands fed as graph inputs: build once per data set with them fixed. */
static void run_specialised(tcase *c, const char *model, const char *plan, char **sets,
                            int n_sets) {
  char set[1600];
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = g_threads;
  c->spec = true;
  c->v = V_PASS;
  for (int i = 0; c->v == V_PASS && i < n_sets; i++) {
    bindings bd = {.n = 0};
    ir_diag d = {0};
    irt_error err = {0};
    irt_program *p = NULL;
    snprintf(set, sizeof set, "%s/%s/%s", c->dir, c->name, sets[i]);
    ir_status st = build_specialised(model, set, plan, &bd, &d);
    if (st != IR_OK) {
      c->v = st == IR_UNSUPPORTED ? V_UNSUP : V_FAIL;
      snprintf(c->why, sizeof c->why, "build (specialised): %s", d.msg);
    } else if (irt_program_open(plan, &mo, &p, &err) != IRT_OK) {
      c->v = V_FAIL;
      snprintf(c->why, sizeof c->why, "open: %s", err.msg);
    } else {
      c->v = run_set(p, set, &bd, c->why, sizeof c->why);
    }
    irt_program_close(p);
    free_bindings(&bd);
  }
}

static void run_case(tcase *c) {
  char model[1300], plan[1200], set[1600];
  ir_diag d = {0};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  snprintf(model, sizeof model, "%s/%s/model.onnx", c->dir, c->name);
  snprintf(plan, sizeof plan, "%s/conformance_%d.plan", g_tmp, (int)getpid());
  infc_options o = infc_options_default();
  ir_status st = infc_build(model, &o, plan, NULL, NULL, &d);
  c->v = st == IR_OK ? V_PASS : st == IR_UNSUPPORTED ? V_UNSUP : V_FAIL;
  if (st != IR_OK) snprintf(c->why, sizeof c->why, "build: %s", d.msg);
  irt_program *p = NULL;
  irt_error err = {0};
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = g_threads;
  if (c->v == V_PASS && irt_program_open(plan, &mo, &p, &err) != IRT_OK) {
    c->v = V_FAIL;
    snprintf(c->why, sizeof c->why, "open: %s", err.msg);
  }
  char **sets = NULL;
  snprintf(set, sizeof set, "%s/%s", c->dir, c->name);
  int n_sets = list_dir(set, "test_data_set_", &sets);
  if (c->v == V_UNSUP && strstr(c->why, "must be a constant"))
    run_specialised(c, model, plan, sets, n_sets);
  for (int i = 0; !c->spec && c->v == V_PASS && i < n_sets; i++) {
    snprintf(set, sizeof set, "%s/%s/%s", c->dir, c->name, sets[i]);
    c->v = run_set(p, set, NULL, c->why, sizeof c->why);
  }
  free_list(sets, n_sets);
  irt_program_close(p);
  remove(plan);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  c->ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
}

/* --- naming the op a case tests --------------------------------------------------------- */

static void read_ops(tcase *c) {
  char path[1300];
  snprintf(path, sizeof path, "%s/%s/model.onnx", c->dir, c->name);
  FILE *f = fopen(path, "rb");
  uint8_t *buf = NULL;
  long size = 0;
  if (f && fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
      (buf = malloc((size_t)size)) && fread(buf, 1, (size_t)size, f) == (size_t)size) {
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, (size_t)size, buf);
    if (m && m->graph) {
      c->ops = calloc(m->graph->n_node + 1, sizeof *c->ops);
      for (size_t i = 0; c->ops && i < m->graph->n_node; i++) {
        const Onnx__NodeProto *n = m->graph->node[i];
        char nm[128];
        bool ms = n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx");
        snprintf(nm, sizeof nm, "%s%s%s", ms ? n->domain : "", ms ? "." : "", n->op_type);
        c->ops[c->n_ops++] = strdup(nm);
      }
    }
    if (m) onnx__model_proto__free_unpacked(m, NULL);
  }
  free(buf);
  if (f) fclose(f);
}

/* The op a case tests: its only op, else the op its name spells (test_layer_normalization_
 * 2d_expanded -> LayerNormalization) among the ops single-op cases test, else its first. */
static void name_op(tcase *c, tcase *all, int n_all) {
  if (c->n_ops == 1) {
    snprintf(c->op, sizeof c->op, "%s", c->ops[0]);
    return;
  }
  static const char *const alias[][2] = {{"test_sce_", "SoftmaxCrossEntropyLoss"},
                                         {"test_nllloss_", "NegativeLogLikelihoodLoss"}};
  for (size_t i = 0; i < sizeof alias / sizeof *alias; i++)
    if (!strncmp(c->name, alias[i][0], strlen(alias[i][0]))) {
      snprintf(c->op, sizeof c->op, "%s", alias[i][1]);
      return;
    }
  char words[160], joined[160] = "";
  snprintf(words, sizeof words, "%s", c->name + 5);
  const char *best = NULL;
  char *save = NULL;
  for (char *w = strtok_r(words, "_", &save); w; w = strtok_r(NULL, "_", &save)) {
    strncat(joined, w, sizeof joined - strlen(joined) - 1);
    for (int i = 0; i < n_all; i++)
      if (all[i].n_ops == 1 && !strcasecmp(all[i].ops[0], joined)) best = all[i].ops[0];
  }
  snprintf(c->op, sizeof c->op, "%s", best ? best : c->n_ops ? c->ops[0] : "(empty)");
}

/* --- the table -------------------------------------------------------------------------- */

static row *row_for(row *rows, int *n, const char *op) {
  for (int i = 0; i < *n; i++)
    if (!strcmp(rows[i].op, op)) return &rows[i];
  if (*n == MAX_OPS) return &rows[MAX_OPS - 1];
  row *r = &rows[(*n)++];
  memset(r, 0, sizeof *r);
  snprintf(r->op, sizeof r->op, "%s", op);
  return r;
}

static int cmp_row(const void *a, const void *b) {
  return strcmp(((const row *)a)->op, ((const row *)b)->op);
}

/* What an unsupported reason says is missing: from "op '...'" or "dtype ...", else the
 * text after the last ": ". */
static const char *short_reason(const char *why) {
  const char *p = strstr(why, "op '");
  if (!p) p = strstr(why, "dtype ");
  if (p) return p;
  p = strrchr(why, ':');
  return p && p[1] ? p + 2 : why;
}

static int report(tcase *cs, int n) {
  static row rows[MAX_OPS];
  int nr = 0, tp = 0, tf = 0, tu = 0;
  for (int i = 0; i < n; i++) {
    row *r = row_for(rows, &nr, cs[i].op);
    r->spec += cs[i].v == V_PASS && cs[i].spec;
    if (cs[i].v == V_PASS) r->pass++, tp++;
    else if (cs[i].v == V_FAIL) r->fail++, tf++;
    else {
      r->unsup++, tu++;
      if (!r->unsup_why[0])
        snprintf(r->unsup_why, sizeof r->unsup_why, "%s", short_reason(cs[i].why));
    }
  }
  qsort(rows, (size_t)nr, sizeof *rows, cmp_row);
  printf("\n%-34s %6s %6s %6s  %s\n", "op", "passed", "failed", "unsup",
         "(* of the passes: specialised on shape inputs) first unsupported reason");
  for (int i = 0; i < nr; i++) {
    char sp[16] = "";
    if (rows[i].spec) snprintf(sp, sizeof sp, "(%d*) ", rows[i].spec);
    printf("%-34s %6d %6d %6d  %s%.100s\n", rows[i].op, rows[i].pass, rows[i].fail, rows[i].unsup,
           sp, rows[i].unsup_why);
  }
  int ops_ok = 0, ops_part = 0;
  for (int i = 0; i < nr; i++) {
    if (rows[i].pass && !rows[i].fail && !rows[i].unsup) ops_ok++;
    else if (rows[i].pass) ops_part++;
  }
  printf("\n%d cases: %d passed, %d failed, %d unsupported; %d ops fully supported, %d "
         "partly, %d not at all\n",
         n, tp, tf, tu, ops_ok, ops_part, nr - ops_ok - ops_part);
  if (tf) {
    printf("\nfailures:\n");
    for (int i = 0; i < n; i++)
      if (cs[i].v == V_FAIL) printf("  %s (%s): %s\n", cs[i].name, cs[i].op, cs[i].why);
  }
  return tf ? 1 : 0;
}

static int compare_files(const char *expected, const char *actual) {
  fmt_onnx_tensor e, a;
  ir_diag d = {0};
  char why[300];
  if (fmt_onnx_tensor_load(expected, &e, &d) != IR_OK ||
      fmt_onnx_tensor_load(actual, &a, &d) != IR_OK) {
    fprintf(stderr, "conformance: %s\n", d.msg);
    return 2;
  }
  bool ok = compare(&e, a.dtype, a.rank, a.shape, a.data, why, sizeof why);
  if (!ok) fprintf(stderr, "conformance: %s differs from %s: %s\n", actual, expected, why);
  fmt_onnx_tensor_free(&e);
  fmt_onnx_tensor_free(&a);
  return ok ? 0 : 1;
}

static int collect(const char *dir, const char *filter, tcase *cs, int n) {
  char **names = NULL;
  int m = list_dir(dir, "test_", &names);
  for (int i = 0; i < m && n < MAX_CASES; i++) {
    if (filter && !strstr(names[i], filter)) continue;
    tcase *c = &cs[n++];
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    snprintf(c->name, sizeof c->name, "%s", names[i]);
    read_ops(c);
  }
  free_list(names, m);
  return n;
}

static const char *set_of(const tcase *c) {
  const char *slash = strrchr(c->dir, '/');
  return slash ? slash + 1 : c->dir;
}

/* Passes of op in set (the basename of a case directory). */
static int passes(const tcase *cs, int n, const char *set, const char *op) {
  int k = 0;
  for (int i = 0; i < n; i++)
    k += cs[i].v == V_PASS && !strcmp(set_of(&cs[i]), set) && !strcmp(cs[i].op, op);
  return k;
}

/* The committed table of passes per (set, op): any op of a present set that passes fewer
 * cases than the table says is a regression (pass -> fail or pass -> unsupported). Sets whose
 * directory is absent are not compared. Returns the number of regressions. */
static int compare_table(const char *path, const tcase *cs, int n) {
  FILE *f = fopen(path, "r");
  if (!f) return printf("conformance: cannot read the table %s\n", path), 1;
  char set[128], op[96];
  int want, bad = 0, rows = 0;
  while (fscanf(f, "%127s %95s %d", set, op, &want) == 3) {
    bool present = false;
    for (int i = 0; i < n && !present; i++) present = !strcmp(set_of(&cs[i]), set);
    if (!present) continue;
    rows++;
    int got = passes(cs, n, set, op);
    if (got < want)
      printf("REGRESSION %s %s: %d cases pass, the table says %d\n", set, op, got, want), bad++;
    else if (got > want)
      printf("note: %s %s passes %d, the table says %d (raise it)\n", set, op, got, want);
  }
  fclose(f);
  printf("table %s: %d rows compared, %d regressions\n", path, rows, bad);
  return bad + (rows == 0);
}

static void write_table(const char *path, const tcase *cs, int n) {
  FILE *f = fopen(path, "w");
  if (!f) return;
  for (int i = 0; i < n; i++) { /* one row per (set, op), in the order first met */
    bool seen = false;
    for (int j = 0; j < i && !seen; j++)
      seen = !strcmp(set_of(&cs[j]), set_of(&cs[i])) && !strcmp(cs[j].op, cs[i].op);
    int k = passes(cs, n, set_of(&cs[i]), cs[i].op);
    if (!seen && k) fprintf(f, "%s %s %d\n", set_of(&cs[i]), cs[i].op, k);
  }
  fclose(f);
}

int main(int argc, char **argv) {
  static tcase cs[MAX_CASES];
  const char *expect = NULL, *write_expect = NULL;
  const char *filter = NULL;
  int n = 0, a = 1;
  if (argc == 4 && !strcmp(argv[1], "--compare")) return compare_files(argv[2], argv[3]);
  for (; a < argc && argv[a][0] == '-'; a++) {
    if (!strcmp(argv[a], "-v")) g_verbose = true;
    else if (!strcmp(argv[a], "--threads") && a + 1 < argc) g_threads = atoi(argv[++a]);
    else if (!strcmp(argv[a], "--filter") && a + 1 < argc) filter = argv[++a];
    else if (!strcmp(argv[a], "--tmp") && a + 1 < argc) g_tmp = argv[++a];
    else if (!strcmp(argv[a], "--expect") && a + 1 < argc) expect = argv[++a];
    else if (!strcmp(argv[a], "--write-expect") && a + 1 < argc) write_expect = argv[++a];
    else return fprintf(stderr, "conformance: unknown option %s\n", argv[a]), 2;
  }
  for (; a < argc; a++) {
    struct stat st;
    if (stat(argv[a], &st) != 0 || !S_ISDIR(st.st_mode)) {
      printf("note: %s is absent; its cases are skipped\n", argv[a]);
      continue;
    }
    n = collect(argv[a], filter, cs, n);
  }
  if (n == 0) return printf("FAIL: no test cases found\n"), 1;
  for (int i = 0; i < n; i++) name_op(&cs[i], cs, n);
  double total = 0;
  for (int i = 0; i < n; i++) {
    run_case(&cs[i]);
    total += cs[i].ms;
    if (g_verbose)
      printf("%-6s %7.1f ms  %s (%s)%s%s\n",
             cs[i].v == V_PASS   ? "pass"
             : cs[i].v == V_FAIL ? "FAIL"
                                 : "unsup",
             cs[i].ms, cs[i].name, cs[i].op, cs[i].v != V_PASS ? ": " : "",
             cs[i].v != V_PASS ? cs[i].why : "");
  }
  int rc = report(cs, n);
  printf("time: %.1f s over %d cases\n", total / 1e3, n);
  if (write_expect) write_table(write_expect, cs, n);
  if (expect && compare_table(expect, cs, n)) rc = 1;
  for (int i = 0; i < n; i++) free_list(cs[i].ops, cs[i].n_ops);
  return rc;
}
