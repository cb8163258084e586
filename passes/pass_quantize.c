/* pass_quantize: float matmul weights -> i8 / i4 codes with separate scales and zero
 * points (group-wise, searched scales), or W8A8. */
#include "pass_quantize.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_matmul_wq.h"
#include "kn_quant.h"

/* ---- the scheme ------------------------------------------------------------------------- */

static ir_status parse_token(const char *spec, const char *tok, pass_quant_opts *q, ir_diag *d) {
  if (!strcmp(tok, "sym")) q->asym = false;
  else if (!strcmp(tok, "asym")) q->asym = true;
  else if (!strcmp(tok, "lm_head")) q->lm_head = true;
  else if (tok[0] == 'g' && tok[1]) {
    char *end = NULL;
    long long g = strtoll(tok + 1, &end, 10);
    if (*end || g < 16 || g > 4096 || g % 16)
      return ir_diag_set(d, IR_INVALID_ARG,
                         "quant '%s': group '%s' must be g16 to g4096 in steps of 16", spec, tok);
    q->group = g;
  } else {
    return ir_diag_set(d, IR_INVALID_ARG,
                       "quant '%s': unknown part '%s' (expected gN, sym, asym or lm_head)", spec,
                       tok);
  }
  return IR_OK;
}

ir_status pass_quant_parse(const char *spec, pass_quant_opts *out, ir_diag *d) {
  char buf[128];
  if (strlen(spec) >= sizeof buf)
    return ir_diag_set(d, IR_INVALID_ARG, "quant '%s': too long", spec);
  snprintf(buf, sizeof buf, "%s", spec);
  pass_quant_opts q = {0};
  char *save = NULL, *tok = strtok_r(buf, ":", &save);
  const char *name = tok ? tok : "";
  if (!strcmp(name, "none")) q.scheme = PASS_QUANT_NONE;
  else if (!strcmp(name, "int8")) q.scheme = PASS_QUANT_INT8;
  else if (!strcmp(name, "int4")) q.scheme = PASS_QUANT_INT4, q.group = 32;
  else if (!strcmp(name, "w8a8")) q.scheme = PASS_QUANT_W8A8;
  else
    return ir_diag_set(d, IR_INVALID_ARG,
                       "quant '%s': expected none, int8[:sym|asym][:gN], "
                       "int4[:g32|g64|g128][:sym|asym] or w8a8 (each may add :lm_head)",
                       spec);
  for (tok = strtok_r(NULL, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
    ir_status st = parse_token(spec, tok, &q, d);
    if (st != IR_OK) return st;
  }
  if (q.scheme == PASS_QUANT_W8A8 && (q.asym || q.group))
    return ir_diag_set(d, IR_INVALID_ARG,
                       "quant '%s': w8a8 is symmetric and per channel (no gN, no asym)", spec);
  if (q.scheme == PASS_QUANT_NONE && (q.asym || q.group || q.lm_head))
    return ir_diag_set(d, IR_INVALID_ARG, "quant '%s': none takes no options", spec);
  *out = q;
  return IR_OK;
}

void pass_quant_format(const pass_quant_opts *q, char *buf, size_t len) {
  static const char *const names[] = {"none", "int8", "int4", "w8a8"};
  const char *name = q->scheme <= PASS_QUANT_W8A8 ? names[q->scheme] : "?";
  if (q->scheme == PASS_QUANT_NONE) {
    snprintf(buf, len, "none");
    return;
  }
  char g[24] = "";
  if (q->group) snprintf(g, sizeof g, ":g%lld", (long long)q->group);
  snprintf(buf, len, "%s%s%s%s", name, g,
           q->scheme == PASS_QUANT_W8A8 ? "" : q->asym ? ":asym" : ":sym",
           q->lm_head ? ":lm_head" : "");
}

/* ---- one group ------------------------------------------------------------------------------ */

typedef struct qrange {
  int lo, hi;    /* codes */
  int zero;      /* symmetric zero point */
  ir_dtype st;   /* scales */
  bool fraction; /* asymmetric zero points are f16 (int4), not integers */
} qrange;

static float round_scale(double s, ir_dtype st) {
  return st == IR_F16 ? ir_f16_to_f32(ir_f32_to_f16((float)s)) : (float)s;
}

static int clamp_code(double v, const qrange *r) {
  long c = lrint(v);
  return c < r->lo ? r->lo : c > r->hi ? r->hi : (int)c;
}

/* Codes of w at scale s and zero z; returns the squared error of (c - z) * s as the
 * kernels compute it. */
static double codes_at(const float *w, int64_t n, float s, float z, const qrange *r, int *c) {
  double err = 0.0;
  for (int64_t i = 0; i < n; i++) {
    c[i] = s != 0.0f ? clamp_code((double)w[i] / s + z, r) : clamp_code(z, r);
    double e = w[i] - (double)(((float)c[i] - z) * s);
    err += e * e;
  }
  return err;
}

/* The least-squares scale for fixed codes, rounded to the stored dtype. */
static float ls_scale(const float *w, int64_t n, const int *c, float z, ir_dtype st) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    num += (double)w[i] * (c[i] - z);
    den += (double)(c[i] - z) * (c[i] - z);
  }
  return den > 0.0 ? round_scale(num / den, st) : 0.0f;
}

typedef struct qbest {
  double err;
  float s;
  float z;
} qbest;

/* The least-squares line w ~ s * c + b for fixed codes, as (s, z = -b / s) rounded to
 * f16. False when the codes are all equal. */
static bool ls_affine(const float *w, int64_t n, const int *c, float *s, float *z) {
  double sc = 0, scc = 0, sw = 0, scw = 0;
  for (int64_t i = 0; i < n; i++) {
    sc += c[i], scc += (double)c[i] * c[i], sw += w[i], scw += (double)c[i] * w[i];
  }
  double den = (double)n * scc - sc * sc;
  if (den <= 0.0) return false;
  double a = ((double)n * scw - sc * sw) / den, b = (sw - a * sc) / (double)n;
  *s = round_scale(a, IR_F16);
  if (*s == 0.0f) return false;
  *z = round_scale(-b / *s, IR_F16);
  return true;
}

/* Tries scale s, zero z, then least-squares refinements (of the scale, or with fractional
 * zero points of scale and zero together); keeps the best in *b. */
static void try_scale(const float *w, int64_t n, float s, float z, const qrange *r, int *tmp,
                      qbest *b) {
  for (int pass = 0; pass < 3; pass++) {
    double e = codes_at(w, n, s, z, r, tmp);
    if (e < b->err) *b = (qbest){e, s, z};
    if (r->fraction && !ls_affine(w, n, tmp, &s, &z)) return;
    if (!r->fraction) s = ls_scale(w, n, tmp, z, r->st);
  }
}

/* Symmetric: the value of largest magnitude, m, maps to code lo - zero (-8 for int4, as
 * Q4_0) or -127 for int8; a few divisors around that are tried as well. */
static qbest group_sym(const float *w, int64_t n, const qrange *r, int *tmp) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; i++)
    if (fabsf(w[i]) > fabsf(m)) m = w[i];
  qbest b = {INFINITY, 0.0f, r->zero};
  if (m == 0.0f) return (qbest){0.0, 0.0f, r->zero};
  double base = (double)(r->zero - r->lo); /* 8 for int4, 127 for int8 */
  int steps = r->hi - r->lo > 15 ? 1 : 9;
  for (int t = 0; t < steps; t++) {
    double div = -(base + 1.0 - 0.25 * t); /* int4: -9 ... -7 */
    if (steps == 1) div = -base;
    try_scale(w, n, round_scale(m / div, r->st), r->zero, r, tmp, &b);
  }
  return b;
}

/* Asymmetric: [min, max] onto the code range, and a few clipped ranges. */
static qbest group_asym(const float *w, int64_t n, const qrange *r, int *tmp) {
  float lo = w[0], hi = w[0];
  for (int64_t i = 1; i < n; i++) {
    lo = w[i] < lo ? w[i] : lo;
    hi = w[i] > hi ? w[i] : hi;
  }
  qbest b = {INFINITY, 0.0f, 0};
  if (hi == lo) { /* a constant group: stretch the range to take in 0 */
    if (lo == 0.0f) return (qbest){0.0, 0.0f, r->lo};
    lo = lo > 0.0f ? 0.0f : lo;
    hi = hi < 0.0f ? 0.0f : hi;
  }
  static const double k_clip[] = {1.0, 0.96, 0.92, 0.88, 0.84, 0.8};
  int n_clip = r->hi - r->lo > 15 ? 1 : 6;
  for (int t = 0; t < n_clip; t++) {
    double mid = 0.5 * ((double)lo + hi), half = 0.5 * ((double)hi - lo) * k_clip[t];
    float s = round_scale(2.0 * half / (r->hi - r->lo), r->st);
    if (s == 0.0f) continue;
    double zf = r->lo - (mid - half) / s;
    long z = lrint(zf);
    z = z < r->lo ? r->lo : z > r->hi ? r->hi : z;
    try_scale(w, n, s, r->fraction ? round_scale(zf, IR_F16) : (float)z, r, tmp, &b);
  }
  if (!isfinite(b.err)) b = (qbest){0.0, 0.0f, r->lo};
  return b;
}

static void put_code(void *q, ir_dtype qt, int64_t idx, int c) {
  if (qt == IR_I8) {
    ((int8_t *)q)[idx] = (int8_t)c;
    return;
  }
  uint8_t *b = (uint8_t *)q + idx / 2;
  *b = idx & 1 ? (uint8_t)((*b & 0x0f) | c << 4) : (uint8_t)((*b & 0xf0) | c);
}

void pass_quant_matrix(const float *w, int64_t n, int64_t k, ir_dtype qt, int64_t group,
                       bool asym, ir_dtype st, void *q, void *scales, void *zp) {
  qrange r = qt == IR_I4 ? (qrange){0, 15, 8, st, asym}
             : asym      ? (qrange){-128, 127, 0, st, false}
                         : (qrange){-127, 127, 0, st, false};
  int *tmp = malloc((size_t)group * sizeof *tmp);
  if (!tmp) return; /* the caller checked the sizes; only an allocation failure gets here */
  int64_t ng = k / group;
  for (int64_t j = 0; j < n; j++)
    for (int64_t g = 0; g < ng; g++) {
      const float *wg = w + j * k + g * group;
      qbest b = asym ? group_asym(wg, group, &r, tmp) : group_sym(wg, group, &r, tmp);
      codes_at(wg, group, b.s, b.z, &r, tmp);
      for (int64_t i = 0; i < group; i++) put_code(q, qt, j * k + g * group + i, tmp[i]);
      if (st == IR_F16) ((uint16_t *)scales)[j * ng + g] = ir_f32_to_f16(b.s);
      else ((float *)scales)[j * ng + g] = b.s;
      if (asym && qt == IR_I8) ((int8_t *)zp)[j * ng + g] = (int8_t)b.z;
      else if (asym) ((uint16_t *)zp)[j * ng + g] = ir_f32_to_f16(b.z);
    }
  free(tmp);
}

/* ---- the pass ------------------------------------------------------------------------------- */

/* The logits projection: its output is a graph output, or its weight is also an
 * embedding table (tied). */
static bool is_lm_head(const ir_graph *g, const ir_node *n) {
  for (int32_t i = 0; i < g->n_outputs; i++)
    if (g->outputs[i] == n->out[0]) return true;
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == IR_OP_EMBED && g->nodes[i].in[1] == n->in[1]) return true;
  return false;
}

typedef struct quant_run {
  const pass_quant_opts *q;
  int32_t *made; /* per original tensor: the first of its (codes, scales, zero points), or -1 */
  int32_t n_orig;
  int n_done, n_kept;
  int64_t values;
  uint64_t bytes_before, bytes_after;
  char kept[160]; /* names of matmul weights left as they were, and why */
  int n_regrouped; /* weights whose K the group does not divide: a smaller group */
  int64_t regroup_k, regroup_g;
} quant_run;

static void note_kept(quant_run *r, const char *name, const char *why) {
  size_t l = strlen(r->kept);
  if (r->n_kept++ < 3)
    snprintf(r->kept + l, sizeof r->kept - l, "%s%s (%s)", l ? ", " : "", name, why);
  else if (r->n_kept == 4 && l + 5 < sizeof r->kept)
    snprintf(r->kept + l, sizeof r->kept - l, ", ...");
}

/* Adds a weight whose data is a new malloc'd buffer the graph adopts. */
static int32_t add_owned(ir_graph *g, const char *base, const char *suffix, ir_dtype dt,
                         int64_t rows, int64_t cols, uint64_t bytes, void **out_buf) {
  char name[512];
  snprintf(name, sizeof name, "%s.%s", base, suffix);
  void *buf = calloc(1, bytes ? bytes : 1);
  if (!buf || !ir_graph_adopt(g, buf)) return -1;
  *out_buf = buf;
  return ir_graph_add_weight(g, name, dt, 2, (int64_t[]){rows, cols}, buf, bytes);
}

/* Quantizes weight tensor wi (n, k) once: three new tensors from r->made[wi]. */
static ir_status quantize_weight(ir_graph *g, quant_run *r, int32_t wi, int64_t group,
                                 ir_diag *d) {
  const pass_quant_opts *q = r->q;
  ir_tensor w = g->tensors[wi]; /* a copy: adding tensors moves the array */
  int64_t n = w.dims[0].n, k = w.dims[1].n, ng = k / group;
  ir_dtype qt = q->scheme == PASS_QUANT_INT4 ? IR_I4 : IR_I8;
  ir_dtype st = qt == IR_I4 || group < k ? IR_F16 : IR_F32;
  float *wf = malloc((size_t)(n * k) * sizeof *wf);
  if (!wf) return ir_diag_set(d, IR_OOM, "out of memory quantizing '%s'", w.name);
  uint64_t row_bytes = ir_dtype_bytes(w.dtype, (uint64_t)k);
  for (int64_t j = 0; j < n; j++)
    kn_dequant_row((const uint8_t *)w.data + j * row_bytes, w.dtype, wf + j * k, k);
  void *qb = NULL, *sb = NULL, *zb = NULL;
  uint64_t qbytes = ir_dtype_bytes(qt, (uint64_t)(n * k)), sbytes = ir_dtype_bytes(st, (uint64_t)(n * ng));
  int32_t ti = add_owned(g, w.name, "qweight", qt, n, k, qbytes, &qb);
  int32_t si = ti >= 0 ? add_owned(g, w.name, "scales", st, n, ng, sbytes, &sb) : -1;
  ir_dtype zt = qt == IR_I4 ? IR_F16 : IR_I8;
  uint64_t zbytes = q->asym ? ir_dtype_bytes(zt, (uint64_t)(n * ng)) : 0;
  int32_t zi = si >= 0 && q->asym ? add_owned(g, w.name, "zero_points", zt, n, ng, zbytes, &zb)
                                  : -2;
  if (ti < 0 || si < 0 || zi == -1) {
    free(wf);
    return ir_diag_set(d, IR_OOM, "out of memory quantizing '%s'", w.name);
  }
  pass_quant_matrix(wf, n, k, qt, group, q->asym, st, qb, sb, zb);
  free(wf);
  r->made[wi] = ti;
  r->n_done++;
  r->values += n * k;
  r->bytes_before += w.nbytes;
  r->bytes_after += qbytes + sbytes + zbytes;
  return IR_OK;
}

/* The group for a K: the one asked for, or where it does not divide K the largest
 * multiple of 16 below it that does (g128 on K = 576 -> g96); 0 if none. */
static int64_t group_for(int64_t k, int64_t want) {
  if (k % want == 0) return want;
  for (int64_t g = want - 16; g >= 16; g -= 16)
    if (k % g == 0) return g;
  return 0;
}

/* Why matmul node n cannot take the scheme (NULL: it can), and its group. */
static const char *unsuited(const ir_graph *g, const ir_node *n, const pass_quant_opts *q,
                            int64_t *out_group) {
  const ir_tensor *w = &g->tensors[n->in[1]];
  int64_t k = w->dims[1].n, group = q->group ? group_for(k, q->group) : k;
  *out_group = group;
  if (!group) return "no group of 16 or more divides K";
  if (q->scheme == PASS_QUANT_INT4 && k % 2) return "odd K";
  if (q->scheme == PASS_QUANT_W8A8 && k > KN_W8A8_MAX_K) return "K too long for w8a8";
  if (!q->lm_head && is_lm_head(g, n)) return "lm_head";
  return NULL;
}

static bool float_matmul(const ir_graph *g, const ir_node *n) {
  if (n->op != IR_OP_MATMUL || n->n_in < 2 || n->in[1] < 0) return false;
  if (n->n_in > 3 && n->in[3] >= 0) return false;
  const ir_tensor *w = &g->tensors[n->in[1]];
  return w->kind == IR_TENSOR_WEIGHT && w->rank == 2 &&
         (w->dtype == IR_F32 || w->dtype == IR_F16 || w->dtype == IR_BF16);
}

static ir_status quantize_node(ir_graph *g, quant_run *r, int32_t ni, ir_diag *d) {
  ir_node *n = &g->nodes[ni];
  int32_t wi = n->in[1];
  int64_t group;
  const char *why = unsuited(g, n, r->q, &group);
  if (why) {
    note_kept(r, g->tensors[wi].name, why);
    return IR_OK;
  }
  if (r->made[wi] < 0) {
    ir_status st = quantize_weight(g, r, wi, group, d);
    if (st != IR_OK) return st;
    if (r->q->group && group != r->q->group && !r->n_regrouped++)
      r->regroup_k = g->tensors[wi].dims[1].n, r->regroup_g = group;
  }
  n = &g->nodes[ni];
  if (n->n_in < 3) n->in[2] = -1;
  n->in[1] = r->made[wi];
  n->in[3] = r->made[wi] + 1;
  n->in[4] = r->q->asym ? r->made[wi] + 2 : -1;
  n->n_in = r->q->asym ? 5 : 4;
  if (r->q->scheme == PASS_QUANT_W8A8) {
    if (n->n_attrs >= IR_MAX_ATTRS)
      return ir_diag_set(d, IR_UNSUPPORTED, "node '%s': no room for attribute act_int8", n->name);
    n->attrs[n->n_attrs++] = IR_AI(ir_attr_intern("act_int8"), 1);
  }
  return IR_OK;
}

static uint64_t weight_total(const ir_graph *g) {
  uint64_t n = 0;
  for (int32_t i = 0; i < g->n_tensors; i++)
    if (g->tensors[i].kind == IR_TENSOR_WEIGHT) n += g->tensors[i].nbytes;
  return n;
}

ir_status pass_quantize(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  const pass_quant_opts *q = o->quant;
  if (!q || q->scheme == PASS_QUANT_NONE) return IR_OK;
  uint64_t total_before = weight_total(g);
  quant_run r = {.q = q, .n_orig = g->n_tensors};
  r.made = malloc((size_t)(g->n_tensors > 0 ? g->n_tensors : 1) * sizeof *r.made);
  if (!r.made) return ir_diag_set(d, IR_OOM, "out of memory");
  for (int32_t i = 0; i < g->n_tensors; i++) r.made[i] = -1;
  ir_status st = IR_OK;
  for (int32_t i = 0; i < g->n_nodes && st == IR_OK; i++)
    if (float_matmul(g, &g->nodes[i]) && g->nodes[i].in[1] < r.n_orig)
      st = quantize_node(g, &r, i, d);
  free(r.made);
  if (st != IR_OK) return st;
  int32_t nodes_removed = 0, tensors_removed = 0;
  if (!pass_compact(g, NULL, &nodes_removed, &tensors_removed))
    return ir_diag_set(d, IR_OOM, "out of memory");
  char scheme[64];
  pass_quant_format(q, scheme, sizeof scheme);
  char regroup[96] = "";
  if (r.n_regrouped)
    snprintf(regroup, sizeof regroup, " (%d with g%lld: K = %lld%s)", r.n_regrouped,
             (long long)r.regroup_g, (long long)r.regroup_k, r.n_regrouped > 1 ? ", ..." : "");
  pass_log_add(log,
               "quantize %s: %d matmul weights%s (%.1fM values) %.1f MiB -> %.1f MiB%s%s; "
               "all weights %.1f MiB -> %.1f MiB",
               scheme, r.n_done, regroup, (double)r.values / 1e6,
               (double)r.bytes_before / 1048576.0, (double)r.bytes_after / 1048576.0,
               r.n_kept ? "; kept as built: " : "", r.kept, (double)total_before / 1048576.0,
               (double)weight_total(g) / 1048576.0);
  return IR_OK;
}
