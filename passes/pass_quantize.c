/* pass_quantize: float matmul weights -> i8 / i4 codes with separate scales and zero
 * points (group-wise, searched scales), or W8A8. */
#include "pass_quantize.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir_alloc.h"
#include "ir_lazy.h"
#include "kn_matmul_wq.h"
#include "kn_pool.h"
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
  else if (!strcmp(name, "q8_0")) q.scheme = PASS_QUANT_Q8_0;
  else if (!strcmp(name, "q4_0")) q.scheme = PASS_QUANT_Q4_0;
  else if (!strcmp(name, "q4_1")) q.scheme = PASS_QUANT_Q4_1;
  else if (!strcmp(name, "fp8")) q.scheme = PASS_QUANT_FP8;
  else
    return ir_diag_set(d, IR_INVALID_ARG,
                       "quant '%s': expected none, int8[:sym|asym][:gN], "
                       "int4[:g32|g64|g128][:sym|asym], w8a8, q8_0, q4_0, q4_1 or fp8 (each may "
                       "add :lm_head)",
                       spec);
  for (tok = strtok_r(NULL, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
    ir_status st = parse_token(spec, tok, &q, d);
    if (st != IR_OK) return st;
  }
  if (q.scheme == PASS_QUANT_FP8 && (q.asym || q.group || strstr(spec, "sym")))
    return ir_diag_set(d, IR_INVALID_ARG,
                       "quant '%s': fp8 is symmetric and per channel (no gN, sym or asym)", spec);
  if (q.scheme == PASS_QUANT_W8A8 && (q.asym || q.group))
    return ir_diag_set(d, IR_INVALID_ARG,
                       "quant '%s': w8a8 is symmetric and per channel (no gN, no asym)", spec);
  if (pass_quant_block_dtype(&q) && (q.asym || q.group || strstr(spec, "sym")))
    return ir_diag_set(d, IR_INVALID_ARG,
                       "quant '%s': %s is a fixed block format (no gN, sym or asym)", spec, name);
  if (q.scheme == PASS_QUANT_NONE && (q.asym || q.group || q.lm_head))
    return ir_diag_set(d, IR_INVALID_ARG, "quant '%s': none takes no options", spec);
  *out = q;
  return IR_OK;
}

ir_dtype pass_quant_block_dtype(const pass_quant_opts *q) {
  return q->scheme == PASS_QUANT_Q8_0   ? IR_Q8_0
         : q->scheme == PASS_QUANT_Q4_0 ? IR_Q4_0
         : q->scheme == PASS_QUANT_Q4_1 ? IR_Q4_1
                                        : IR_DTYPE_INVALID;
}

void pass_quant_format(const pass_quant_opts *q, char *buf, size_t len) {
  static const char *const names[] = {"none", "int8", "int4", "w8a8",
                                      "q8_0", "q4_0", "q4_1", "fp8"};
  const char *name = q->scheme <= PASS_QUANT_FP8 ? names[q->scheme] : "?";
  if (q->scheme == PASS_QUANT_NONE) {
    snprintf(buf, len, "none");
    return;
  }
  char g[24] = "";
  if (q->group) snprintf(g, sizeof g, ":g%lld", (long long)q->group);
  snprintf(buf, len, "%s%s%s%s", name, g,
           q->scheme == PASS_QUANT_W8A8 || q->scheme == PASS_QUANT_FP8 || pass_quant_block_dtype(q)
               ? ""
           : q->asym ? ":asym"
                     : ":sym",
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

void pass_quant_matrix(const float *w, int64_t n, int64_t k, ir_dtype qt, int64_t group, bool asym,
                       ir_dtype st, void *q, void *scales, void *zp) {
  qrange r = qt == IR_I4 ? (qrange){0, 15, 8, st, asym}
             : asym      ? (qrange){-128, 127, 0, st, false}
                         : (qrange){-127, 127, 0, st, false};
  int *tmp = ir_malloc((size_t)group * sizeof *tmp);
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
  ir_free(tmp);
}

/* ---- smoothing (W8A8) ------------------------------------------------------------------------ */

static bool float_matmul(const ir_graph *g, const ir_node *n);
static const char *unsuited(const ir_graph *g, const ir_node *n, const pass_quant_opts *q,
                            int64_t *out_group);

enum { SMOOTH_MAX_USERS = 4 };

/* The matmuls reading norm output t, if they are all float matmuls the scheme quantizes,
 * each with a weight read by it alone, and there are at most SMOOTH_MAX_USERS; else 0. */
static int smooth_users(const ir_graph *g, const pass_quant_opts *q, int32_t t,
                        int32_t *out_users) {
  int n_users = 0;
  for (int32_t i = 0; i < g->n_outputs; i++)
    if (g->outputs[i] == t) return 0;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    bool reads = false;
    for (int a = 0; a < n->n_in; a++) reads |= n->in[a] == t;
    if (!reads) continue;
    int64_t group;
    if (n_users == SMOOTH_MAX_USERS || !float_matmul(g, n) || n->in[0] != t || n->in[1] == t ||
        unsuited(g, n, q, &group) || pass_count_uses(g, n->in[1], NULL) != 1)
      return 0;
    out_users[n_users++] = i;
  }
  return n_users;
}

/* A new f32 weight shaped like tensor `like`, named "<like>.smoothed", adopted by the
 * graph (its data is left for the caller to write). */
static int32_t add_f32_like(ir_graph *g, int32_t like, float **out_buf) {
  ir_tensor t = g->tensors[like];
  char name[512];
  snprintf(name, sizeof name, "%s.smoothed", t.name);
  int64_t dims[IR_MAX_RANK], count = 1;
  for (int i = 0; i < t.rank; i++) dims[i] = t.dims[i].n, count *= t.dims[i].n;
  float *buf = ir_malloc((size_t)(count > 0 ? count : 1) * sizeof *buf);
  if (!buf || !ir_graph_adopt(g, buf)) {
    ir_free(buf);
    return -1;
  }
  *out_buf = buf;
  return ir_graph_add_weight(g, name, IR_F32, t.rank, dims, buf, (uint64_t)count * 4);
}

/* A smoothed weight: the rows of `in` as f32 with column j multiplied by s[j]. */
typedef struct lz_smooth {
  ir_lazy z;
  ir_wref in;
  int64_t k;
  float s[];
} lz_smooth;

static ir_status smooth_fill(ir_lazy *z, int64_t r0, int64_t r1, void *dst, ir_diag *d) {
  lz_smooth *m = (lz_smooth *)z;
  uint8_t *row = ir_malloc(ir_wref_row_bytes(&m->in) + 1);
  if (!row) return ir_diag_set(d, IR_OOM, "out of memory smoothing a weight");
  ir_status st = IR_OK;
  for (int64_t r = r0; r < r1 && st == IR_OK; r++) {
    float *o = (float *)dst + (r - r0) * m->k;
    if ((st = ir_wref_read(&m->in, r, r + 1, row, d)) != IR_OK) break;
    kn_dequant_row(row, m->in.dtype, o, m->k);
    for (int64_t j = 0; j < m->k; j++) o[j] *= m->s[j];
  }
  ir_free(row);
  return st;
}

/* Weight wi (n, k) as f32 with column j multiplied by s[j] (a recipe); repoints node ni. */
static ir_status smooth_weight(ir_graph *g, int32_t ni, const float *s, ir_diag *d) {
  int32_t wi = g->nodes[ni].in[1];
  const ir_tensor *w = &g->tensors[wi];
  int64_t n = w->dims[0].n, k = w->dims[1].n;
  lz_smooth *m = ir_calloc(1, sizeof *m + (size_t)k * sizeof *s);
  char name[512];
  snprintf(name, sizeof name, "%s.smoothed", w->name);
  if (m) {
    m->in = ir_wref_of(w), m->k = k;
    memcpy(m->s, s, (size_t)k * sizeof *s);
    m->z = (ir_lazy){.fill = smooth_fill,
                     .drop = ir_lazy_free,
                     .rows = n,
                     .row_bytes = (uint64_t)k * 4,
                     .row_align = 1};
  }
  int32_t nw = m ? ir_graph_add_lazy_weight(g, name, IR_F32, 2, (int64_t[]){n, k}, &m->z) : -1;
  if (nw < 0) return ir_diag_set(d, IR_OOM, "out of memory smoothing '%s'", g->tensors[wi].name);
  g->nodes[ni].in[1] = nw;
  return IR_OK;
}

/* max_r |W[r, j]| over the users' weights, into wmax (k), which starts at zero. */
static ir_status column_max(const ir_graph *g, const int32_t *users, int n_users, float *wmax,
                            ir_diag *d) {
  ir_status st = IR_OK;
  for (int u = 0; u < n_users && st == IR_OK; u++) {
    const ir_tensor *w = &g->tensors[g->nodes[users[u]].in[1]];
    int64_t n = w->dims[0].n, k = w->dims[1].n;
    uint64_t row_bytes = ir_dtype_bytes(w->dtype, (uint64_t)k);
    float *row = ir_malloc((size_t)k * sizeof *row);
    uint8_t *raw = ir_malloc(row_bytes + 1);
    if (!row || !raw) st = ir_diag_set(d, IR_OOM, "out of memory smoothing '%s'", w->name);
    for (int64_t r = 0; r < n && st == IR_OK; r++) {
      if ((st = ir_weight_read(w, r, r + 1, raw, d)) != IR_OK) break;
      kn_dequant_row(raw, w->dtype, row, k);
      for (int64_t j = 0; j < k; j++) wmax[j] = fmaxf(wmax[j], fabsf(row[j]));
    }
    ir_free(row);
    ir_free(raw);
  }
  return st;
}

/* Smooths one norm and its users; *out_done when it did. */
static ir_status smooth_norm(ir_graph *g, const pass_quant_smoothing *sm, int32_t ni,
                             bool *out_done, ir_diag *d) {
  *out_done = false;
  const ir_node *norm = &g->nodes[ni];
  int32_t gi = norm->op == IR_OP_RMS_NORM ? norm->in[1] : norm->in[2], users[SMOOTH_MAX_USERS];
  int n_users = smooth_users(g, sm->q, norm->out[0], users);
  if (!n_users || gi < 0 || g->tensors[gi].dtype != IR_F32 || g->tensors[gi].rank != 1 ||
      pass_count_uses(g, gi, NULL) != 1)
    return IR_OK;
  int64_t k = g->tensors[gi].dims[0].n;
  const float *amax = sm->amax(sm->ctx, g->tensors[gi].name, k);
  if (!amax) return IR_OK;
  float *s = ir_calloc((size_t)k, sizeof *s), *gamma = NULL;
  if (!s) return ir_diag_set(d, IR_OOM, "out of memory");
  ir_status st = column_max(g, users, n_users, s, d);
  double alpha = sm->alpha;
  for (int64_t j = 0; j < k && st == IR_OK; j++) {
    double a = amax[j], w = s[j];
    double f = a > 0.0 && w > 0.0 ? pow(a, alpha) / pow(w, 1.0 - alpha) : 1.0;
    s[j] = (float)(f < 1e-4 ? 1e-4 : f > 1e4 ? 1e4 : f);
  }
  if (st == IR_OK) st = ir_graph_materialize_tensor(g, gi, d);
  int32_t ng = st == IR_OK ? add_f32_like(g, gi, &gamma) : 0;
  if (st == IR_OK && ng < 0) st = ir_diag_set(d, IR_OOM, "out of memory");
  for (int64_t j = 0; j < k && st == IR_OK; j++)
    gamma[j] = ((const float *)g->tensors[gi].data)[j] / s[j];
  if (st == IR_OK) {
    ir_node *n = &g->nodes[ni];
    if (n->op == IR_OP_RMS_NORM) n->in[1] = ng;
    else n->in[2] = ng;
  }
  for (int u = 0; u < n_users && st == IR_OK; u++) st = smooth_weight(g, users[u], s, d);
  ir_free(s);
  *out_done = st == IR_OK;
  return st;
}

ir_status pass_quant_smooth(ir_graph *g, const pass_quant_smoothing *sm, int *out_n, ir_diag *d) {
  *out_n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    ir_op op = g->nodes[i].op;
    if (op != IR_OP_RMS_NORM && op != IR_OP_ADD_RMS_NORM) continue;
    bool done = false;
    ir_status st = smooth_norm(g, sm, i, &done, d);
    if (st != IR_OK) return st;
    *out_n += done;
  }
  return IR_OK;
}

/* ---- calibration files -------------------------------------------------------------------- */

typedef struct calib_entry {
  char *name;
  int64_t k;
  float *amax;
} calib_entry;

typedef struct calib_set {
  calib_entry *e;
  int n, cap;
} calib_set;

static void calib_free(calib_set *c) {
  for (int i = 0; i < c->n; i++) ir_free(c->e[i].name), ir_free(c->e[i].amax);
  ir_free(c->e);
}

/* NAME matches the norm's weight as the source names it, or with the ".f32" the fold pass
 * adds when it converts a bf16 / f16 weight. */
static const float *calib_amax(void *ctx, const char *norm_weight, int64_t k) {
  const calib_set *c = ctx;
  size_t l = strlen(norm_weight);
  size_t base = l > 4 && !strcmp(norm_weight + l - 4, ".f32") ? l - 4 : l;
  for (int i = 0; i < c->n; i++) {
    const char *nm = c->e[i].name;
    if (c->e[i].k == k &&
        (!strcmp(nm, norm_weight) || (strlen(nm) == base && !strncmp(nm, norm_weight, base))))
      return c->e[i].amax;
  }
  return NULL;
}

/* One line "NAME K v0 ... v(K-1)" into c (line is modified). */
static ir_status calib_line(calib_set *c, char *line, const char *path, int ln, ir_diag *d) {
  static const char sep[] = " \t\r\n";
  char *save = NULL, *name = strtok_r(line, sep, &save), *ks = strtok_r(NULL, sep, &save);
  if (!name || name[0] == '#') return IR_OK;
  char *end = NULL;
  long long k = ks ? strtoll(ks, &end, 10) : 0;
  if (!ks || *end || k < 1 || k > KN_W8A8_MAX_K)
    return ir_diag_set(d, IR_BAD_FORMAT, "%s:%d: expected 'NAME K v0 ... v(K-1)'", path, ln);
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 64;
    calib_entry *e = ir_realloc(c->e, (size_t)cap * sizeof *e);
    if (!e) return ir_diag_set(d, IR_OOM, "out of memory");
    c->e = e, c->cap = cap;
  }
  calib_entry *e = &c->e[c->n];
  e->k = k, e->name = ir_strdup(name), e->amax = ir_malloc((size_t)k * sizeof *e->amax);
  if (!e->name || !e->amax) {
    ir_free(e->name), ir_free(e->amax);
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  c->n++;
  for (long long j = 0; j < k; j++) {
    char *v = strtok_r(NULL, sep, &save);
    e->amax[j] = v ? strtof(v, &end) : -1.0f;
    if (!v || *end || !(e->amax[j] >= 0.0f) || !isfinite(e->amax[j]))
      return ir_diag_set(d, IR_BAD_FORMAT, "%s:%d: '%s' needs %lld finite maxima >= 0", path, ln,
                         name, k);
  }
  if (strtok_r(NULL, sep, &save))
    return ir_diag_set(d, IR_BAD_FORMAT, "%s:%d: '%s' has more than %lld values", path, ln, name,
                       k);
  return IR_OK;
}

static ir_status calib_load(const char *path, calib_set *c, ir_diag *d) {
  FILE *f = fopen(path, "r");
  if (!f) return ir_diag_set(d, IR_IO, "%s: cannot open the calibration file", path);
  size_t cap = 1 << 20;
  char *line = ir_malloc(cap);
  ir_status st = line ? IR_OK : ir_diag_set(d, IR_OOM, "out of memory");
  for (int ln = 1; st == IR_OK && fgets(line, (int)cap, f); ln++) {
    if (!strchr(line, '\n') && !feof(f))
      st = ir_diag_set(d, IR_BAD_FORMAT, "%s:%d: line too long", path, ln);
    else st = calib_line(c, line, path, ln, d);
  }
  ir_free(line);
  fclose(f);
  if (st == IR_OK && !c->n) st = ir_diag_set(d, IR_BAD_FORMAT, "%s: no activation maxima", path);
  return st;
}

/* Smooths from o->quant_calib (W8A8 only); *out_n: norms smoothed (0 without a file). */
static ir_status smooth_from_file(ir_graph *g, const pass_opts *o, int *out_n, ir_diag *d) {
  *out_n = 0;
  if (!o->quant_calib) return IR_OK;
  if (o->quant->scheme != PASS_QUANT_W8A8)
    return ir_diag_set(d, IR_INVALID_ARG, "a calibration file (%s) goes with w8a8 only",
                       o->quant_calib);
  calib_set c = {0};
  ir_status st = calib_load(o->quant_calib, &c, d);
  pass_quant_smoothing sm = {
      .q = o->quant, .alpha = PASS_QUANT_SMOOTH_ALPHA, .amax = calib_amax, .ctx = &c};
  if (st == IR_OK) st = pass_quant_smooth(g, &sm, out_n, d);
  calib_free(&c);
  if (st == IR_OK && !*out_n)
    st = ir_diag_set(d, IR_INVALID_ARG, "%s: names no norm this model can smooth", o->quant_calib);
  return st;
}

/* Whether tensor t is the output of a norm. */
static bool norm_output(const ir_graph *g, int32_t t) {
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].out[0] == t)
      return g->nodes[i].op == IR_OP_RMS_NORM || g->nodes[i].op == IR_OP_ADD_RMS_NORM;
  return false;
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
  struct kn_pool *pool; /* the recipes' threads (pass_opts.pool) */
  int32_t *made; /* per original tensor: the first of its (codes, scales, zero points), or -1 */
  int32_t n_orig;
  int n_done, n_kept;
  int64_t values;
  uint64_t bytes_before, bytes_after;
  char kept[160];  /* names of matmul weights left as they were, and why */
  int n_regrouped; /* weights whose K the group does not divide: a smaller group */
  int64_t regroup_k, regroup_g;
  int n_smoothed; /* norms smoothed from a calibration file (W8A8) */
} quant_run;

static void note_kept(quant_run *r, const char *name, const char *why) {
  size_t l = strlen(r->kept);
  if (r->n_kept++ < 3)
    snprintf(r->kept + l, sizeof r->kept - l, "%s%s (%s)", l ? ", " : "", name, why);
  else if (r->n_kept == 4 && l + 5 < sizeof r->kept)
    snprintf(r->kept + l, sizeof r->kept - l, ", ...");
}

/* ---- the quantized weights, made when the plan is written ------------------------------- */

/* Rows [r0, r1) of w dequantized to f32 (k values a row) into out. */
static ir_status rows_f32(const ir_wref *w, int64_t r0, int64_t r1, int64_t k, float *out,
                          uint8_t *raw, ir_diag *d) {
  ir_status st = ir_wref_read(w, r0, r1, raw, d);
  uint64_t rb = ir_wref_row_bytes(w);
  for (int64_t j = r0; j < r1 && st == IR_OK; j++)
    kn_dequant_row(raw + rb * (uint64_t)(j - r0), w->dtype, out + (j - r0) * k, k);
  return st;
}

enum { QUANT_ROWS = 256 }; /* rows dequantized at a time, then quantized on the pool */

/* Block formats: ggml blocks, rows quantized one by one. */
typedef struct lz_qblock {
  ir_lazy z;
  ir_wref in;
  ir_dtype bt;
  int64_t k;
  struct kn_pool *pool;
} lz_qblock;

typedef struct qblock_task {
  const lz_qblock *q;
  const float *wf;
  uint8_t *out;
} qblock_task;

static void qblock_rows(void *arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  const qblock_task *t = arg;
  for (int64_t j = b; j < e; j++)
    kn_quant_row(t->wf + j * t->q->k, t->q->bt, t->out + t->q->z.row_bytes * (uint64_t)j, t->q->k);
}

static ir_status qblock_fill(ir_lazy *z, int64_t r0, int64_t r1, void *dst, ir_diag *d) {
  lz_qblock *q = (lz_qblock *)z;
  float *wf = ir_malloc((size_t)(QUANT_ROWS * q->k) * sizeof *wf);
  uint8_t *raw = ir_malloc(ir_wref_row_bytes(&q->in) * QUANT_ROWS + 1);
  ir_status st = wf && raw ? IR_OK : ir_diag_set(d, IR_OOM, "out of memory quantizing");
  for (int64_t r = r0; r < r1 && st == IR_OK; r += QUANT_ROWS) {
    int64_t hi = r + QUANT_ROWS < r1 ? r + QUANT_ROWS : r1;
    st = rows_f32(&q->in, r, hi, q->k, wf, raw, d);
    qblock_task t = {q, wf, (uint8_t *)dst + z->row_bytes * (uint64_t)(r - r0)};
    if (st == IR_OK) kn_parallel_for(q->pool, hi - r, 1, qblock_rows, &t);
  }
  ir_free(wf);
  ir_free(raw);
  return st;
}

/* Group-wise int8 / int4: one job makes codes, scales and zero points together; the codes'
 * rows are what the writer asks for first, and the scales and zero points of the rows made
 * wait in side buffers (a few bytes a group) until their tensors are written. */
typedef struct qgroup_job {
  ir_wref in;
  int64_t n, k, group, ng;
  ir_dtype qt, st, zt;
  bool asym;
  uint8_t *scales, *zp; /* n * ng each (zp: asym only), or NULL until first needed */
  bool *have;           /* rows whose scales and zero points are in them */
  bool served[3];       /* parts whose last row went out: the side buffers may go */
  int refs;
  struct kn_pool *pool;
} qgroup_job;

typedef struct qgroup_task {
  const qgroup_job *j;
  const float *wf;
  uint8_t *codes, *scales, *zp; /* at the chunk's first row */
} qgroup_task;

/* FP8 rows: scale max |w| / 448 (f32; 0 for a zero row), codes E4M3 of w / scale. */
static void fp8_rows(const float *w, int64_t rows, int64_t k, uint8_t *codes, float *scales) {
  for (int64_t r = 0; r < rows; r++) {
    const float *x = w + r * k;
    float m = 0.0f;
    for (int64_t i = 0; i < k; i++) m = fmaxf(m, fabsf(x[i]));
    float s = m / 448.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
    scales[r] = s;
    for (int64_t i = 0; i < k; i++) codes[r * k + i] = ir_f32_to_f8e4m3(x[i] * inv);
  }
}

static void qgroup_rows(void *arg, int64_t b, int64_t e, int tid) {
  (void)tid;
  const qgroup_task *t = arg;
  const qgroup_job *j = t->j;
  if (j->qt == IR_F8_E4M3) {
    fp8_rows(t->wf + b * j->k, e - b, j->k, t->codes + (uint64_t)(b * j->k),
             (float *)t->scales + b);
    return;
  }
  uint64_t crow = ir_dtype_bytes(j->qt, (uint64_t)j->k);
  uint64_t ss = ir_dtype_bytes(j->st, 1), zs = ir_dtype_bytes(j->zt, 1);
  pass_quant_matrix(t->wf + b * j->k, e - b, j->k, j->qt, j->group, j->asym, j->st,
                    t->codes + crow * (uint64_t)b, t->scales + ss * (uint64_t)(b * j->ng),
                    j->asym ? t->zp + zs * (uint64_t)(b * j->ng) : NULL);
}

typedef struct lz_qpart {
  ir_lazy z;
  qgroup_job *job;
  int part; /* 0 codes, 1 scales, 2 zero points */
} lz_qpart;

static void job_free_side(qgroup_job *j) {
  ir_free(j->scales), ir_free(j->zp), ir_free(j->have);
  j->scales = j->zp = NULL, j->have = NULL;
}

/* Codes of rows [r0, r1) into codes (NULL: made and dropped), their scales and zero points
 * into the side buffers. */
static ir_status job_make(qgroup_job *j, int64_t r0, int64_t r1, void *codes, ir_diag *d) {
  uint64_t ss = ir_dtype_bytes(j->st, 1), zs = ir_dtype_bytes(j->zt, 1);
  if (!j->scales) {
    j->scales = ir_calloc((size_t)(j->n * j->ng), ss);
    j->zp = j->asym ? ir_calloc((size_t)(j->n * j->ng), zs) : NULL;
    j->have = ir_calloc((size_t)j->n + 1, sizeof *j->have);
    if (!j->scales || (j->asym && !j->zp) || !j->have) {
      job_free_side(j);
      return ir_diag_set(d, IR_OOM, "out of memory quantizing");
    }
  }
  uint64_t crow = ir_dtype_bytes(j->qt, (uint64_t)j->k);
  float *wf = ir_malloc((size_t)(QUANT_ROWS * j->k) * sizeof *wf);
  uint8_t *raw = ir_malloc(ir_wref_row_bytes(&j->in) * QUANT_ROWS + 1);
  uint8_t *tmp = codes ? NULL : ir_malloc(crow * QUANT_ROWS + 1);
  ir_status st = wf && raw && (codes || tmp) ? IR_OK : ir_diag_set(d, IR_OOM, "out of memory");
  for (int64_t r = r0; r < r1 && st == IR_OK; r += QUANT_ROWS) {
    int64_t hi = r + QUANT_ROWS < r1 ? r + QUANT_ROWS : r1;
    st = rows_f32(&j->in, r, hi, j->k, wf, raw, d);
    uint8_t *c = codes ? (uint8_t *)codes + crow * (uint64_t)(r - r0) : tmp;
    if (st != IR_OK) break;
    memset(c, 0, crow * (uint64_t)(hi - r));
    qgroup_task t = {j, wf, c, j->scales + ss * (uint64_t)(r * j->ng),
                     j->zp ? j->zp + zs * (uint64_t)(r * j->ng) : NULL};
    kn_parallel_for(j->pool, hi - r, 1, qgroup_rows, &t);
    for (int64_t x = r; x < hi; x++) j->have[x] = true;
  }
  ir_free(wf), ir_free(raw), ir_free(tmp);
  return st;
}

static ir_status qpart_fill(ir_lazy *z, int64_t r0, int64_t r1, void *dst, ir_diag *d) {
  lz_qpart *p = (lz_qpart *)z;
  qgroup_job *j = p->job;
  if (p->part == 0) return job_make(j, r0, r1, dst, d);
  for (int64_t r = r0; r < r1;) { /* rows not made yet: made now, codes dropped */
    int64_t e = r;
    while (e < r1 && !(j->have && j->have[e])) e++;
    if (e > r) {
      ir_status st = job_make(j, r, e, NULL, d);
      if (st != IR_OK) return st;
    }
    while (e < r1 && j->have[e]) e++;
    r = e;
  }
  const uint8_t *side = p->part == 1 ? j->scales : j->zp;
  memcpy(dst, side + z->row_bytes * (uint64_t)r0, z->row_bytes * (uint64_t)(r1 - r0));
  if (r1 == j->n) j->served[p->part] = true;
  if (j->served[1] && (!j->asym || j->served[2])) {
    job_free_side(j);
    j->served[1] = j->served[2] = false;
  }
  return IR_OK;
}

static void qpart_drop(ir_lazy *z) {
  lz_qpart *p = (lz_qpart *)z;
  if (--p->job->refs == 0) {
    job_free_side(p->job);
    ir_free(p->job);
  }
  ir_free(p);
}

/* Adds part `part` of job j as weight "<base>.<suffix>" [rows, cols] of dtype dt. */
static int32_t add_part(ir_graph *g, qgroup_job *j, int part, const char *base, const char *suffix,
                        ir_dtype dt, int64_t cols) {
  char name[512];
  snprintf(name, sizeof name, "%s.%s", base, suffix);
  lz_qpart *p = ir_calloc(1, sizeof *p);
  if (!p) return -1;
  p->job = j, p->part = part;
  j->refs++;
  p->z = (ir_lazy){.fill = qpart_fill,
                   .drop = qpart_drop,
                   .rows = j->n,
                   .row_bytes = ir_dtype_bytes(dt, (uint64_t)cols),
                   .row_align = 1};
  return ir_graph_add_lazy_weight(g, name, dt, 2, (int64_t[]){j->n, cols}, &p->z);
}

/* Block formats: one new tensor of ggml blocks, r->made[wi]. */
static ir_status quantize_blocks(ir_graph *g, quant_run *r, int32_t wi, ir_diag *d) {
  ir_tensor w = g->tensors[wi]; /* a copy: adding tensors moves the array */
  ir_dtype bt = pass_quant_block_dtype(r->q);
  int64_t n = w.dims[0].n, k = w.dims[1].n;
  uint64_t out_row = ir_dtype_bytes(bt, (uint64_t)k);
  lz_qblock *q = ir_calloc(1, sizeof *q);
  char name[512];
  snprintf(name, sizeof name, "%s.%s", w.name, ir_dtype_name(bt));
  if (q) {
    q->in = ir_wref_of(&w), q->bt = bt, q->k = k, q->pool = r->pool;
    q->z = (ir_lazy){
        .fill = qblock_fill, .drop = ir_lazy_free, .rows = n, .row_bytes = out_row, .row_align = 1};
  }
  int32_t ti = q ? ir_graph_add_lazy_weight(g, name, bt, 2, (int64_t[]){n, k}, &q->z) : -1;
  if (ti < 0) return ir_diag_set(d, IR_OOM, "out of memory quantizing '%s'", w.name);
  r->made[wi] = ti;
  r->n_done++;
  r->values += n * k;
  r->bytes_before += w.nbytes;
  r->bytes_after += out_row * (uint64_t)n;
  return IR_OK;
}

/* Quantizes weight tensor wi (n, k) once: three new tensors from r->made[wi] (codes,
 * scales, and zero points when asymmetric), made together when written. */
static ir_status quantize_weight(ir_graph *g, quant_run *r, int32_t wi, int64_t group, ir_diag *d) {
  const pass_quant_opts *q = r->q;
  if (pass_quant_block_dtype(q)) return quantize_blocks(g, r, wi, d);
  ir_tensor w = g->tensors[wi]; /* a copy: adding tensors moves the array */
  int64_t n = w.dims[0].n, k = w.dims[1].n, ng = k / group;
  qgroup_job *j = ir_calloc(1, sizeof *j);
  if (!j) return ir_diag_set(d, IR_OOM, "out of memory quantizing '%s'", w.name);
  j->in = ir_wref_of(&w), j->n = n, j->k = k, j->group = group, j->ng = ng;
  j->qt = q->scheme == PASS_QUANT_INT4 ? IR_I4 : q->scheme == PASS_QUANT_FP8 ? IR_F8_E4M3 : IR_I8;
  j->st = j->qt == IR_I4 || group < k ? IR_F16 : IR_F32;
  j->zt = j->qt == IR_I4 ? IR_F16 : IR_I8;
  j->asym = q->asym;
  j->pool = r->pool;
  j->refs = 1; /* this function's, until the parts hold it */
  int32_t ti = add_part(g, j, 0, w.name, "qweight", j->qt, k);
  int32_t si = ti >= 0 ? add_part(g, j, 1, w.name, "scales", j->st, ng) : -1;
  int32_t zi = si >= 0 && q->asym ? add_part(g, j, 2, w.name, "zero_points", j->zt, ng) : -2;
  uint64_t qbytes = ir_dtype_bytes(j->qt, (uint64_t)(n * k)),
           sbytes = ir_dtype_bytes(j->st, (uint64_t)(n * ng)),
           zbytes = q->asym ? ir_dtype_bytes(j->zt, (uint64_t)(n * ng)) : 0;
  if (--j->refs == 0) ir_free(j); /* no part was made */
  if (ti < 0 || si < 0 || zi == -1)
    return ir_diag_set(d, IR_OOM, "out of memory quantizing '%s'", w.name);
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
  if (pass_quant_block_dtype(q)) {
    *out_group = KN_QBLOCK;
    if (k % KN_QBLOCK) return "K not a multiple of 32";
    return !q->lm_head && is_lm_head(g, n) ? "lm_head" : NULL;
  }
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
  if (pass_quant_block_dtype(r->q)) { /* the lookup of a tied table reads the blocks too */
    for (int32_t i = 0; i < g->n_nodes; i++)
      if (g->nodes[i].op == IR_OP_EMBED && g->nodes[i].in[1] == wi) g->nodes[i].in[1] = r->made[wi];
    n->in[1] = r->made[wi];
    return IR_OK;
  }
  if (n->n_in < 3) n->in[2] = -1;
  n->in[1] = r->made[wi];
  n->in[3] = r->made[wi] + 1;
  n->in[4] = r->q->asym ? r->made[wi] + 2 : -1;
  n->n_in = r->q->asym ? 5 : 4;
  /* Smoothed: inputs not from a norm (o_proj, down_proj) keep f32 activations, which
   * halves what is left of the error (measured on SmolLM2). */
  if (r->q->scheme == PASS_QUANT_W8A8 && (!r->n_smoothed || norm_output(g, n->in[0]))) {
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
  quant_run r = {.q = q, .pool = o->pool};
  ir_status st = smooth_from_file(g, o, &r.n_smoothed, d);
  if (st != IR_OK) return st;
  r.n_orig = g->n_tensors;
  r.made = ir_malloc((size_t)(g->n_tensors > 0 ? g->n_tensors : 1) * sizeof *r.made);
  if (!r.made) return ir_diag_set(d, IR_OOM, "out of memory");
  for (int32_t i = 0; i < g->n_tensors; i++) r.made[i] = -1;
  for (int32_t i = 0; i < g->n_nodes && st == IR_OK; i++)
    if (float_matmul(g, &g->nodes[i]) && g->nodes[i].in[1] < r.n_orig)
      st = quantize_node(g, &r, i, d);
  ir_free(r.made);
  if (st != IR_OK) return st;
  int32_t nodes_removed = 0, tensors_removed = 0;
  if (!pass_compact(g, NULL, &nodes_removed, &tensors_removed))
    return ir_diag_set(d, IR_OOM, "out of memory");
  pass_results *res = &log->res;
  res->quantized = true;
  pass_quant_format(q, res->quant.scheme, sizeof res->quant.scheme);
  res->quant.n_done = r.n_done, res->quant.n_kept = r.n_kept;
  res->quant.n_regrouped = r.n_regrouped, res->quant.n_smoothed = r.n_smoothed;
  res->quant.values = r.values, res->quant.regroup_g = r.regroup_g;
  res->quant.regroup_k = r.regroup_k;
  res->quant.bytes_before = r.bytes_before, res->quant.bytes_after = r.bytes_after;
  res->quant.all_before = total_before, res->quant.all_after = weight_total(g);
  snprintf(res->quant.kept, sizeof res->quant.kept, "%s", r.kept);
  char line[512];
  pass_results_line(res, PASS_LINE_QUANT, line, sizeof line);
  pass_log_add(log, "%s", line);
  return IR_OK;
}

/* ---- int8 activations for block-quantized weights ----------------------------------------- */

/* Whether pass_act_bf16 gives matmul n bf16 activations over its block weight (o->act_bf16):
 * every one over the step's token rows (not the logit rows) whose rows fill 16-row groups
 * (of gate and of up rows with swiglu), K <= IR_Q8_ACT_MAX_K, but the logits projection,
 * which keeps int8 activations. A step converts a W tile to bf16 once
 * for all its prompt rows, which pays when a prompt's rows share it; generated rows (one
 * a sequence a step) keep int8 activations, which read W with no conversion, and so does
 * the logits projection, which only ever multiplies one row a sequence. */
static bool bf16_blocks(const ir_graph *g, const ir_node *n, const pass_opts *o) {
  if (!o->act_bf16 || n->op != IR_OP_MATMUL || n->n_in < 2 || n->in[1] < 0) return false;
  const ir_tensor *w = &g->tensors[n->in[1]], *x = &g->tensors[n->in[0]];
  bool swiglu = ir_node_attr_i(n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU;
  return ir_dtype_is_quant(w->dtype) && w->rank == 2 && w->dims[0].sym == IR_SYM_NONE &&
         x->rank == 2 && x->dims[0].sym == IR_SYM_TOKENS &&
         w->dims[0].n % (swiglu ? 32 : 16) == 0 && w->dims[1].n <= IR_Q8_ACT_MAX_K &&
         !is_lm_head(g, n) && !ir_node_attr_i(n, "act_int8", 0);
}

ir_status pass_act_int8(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  int n_done = 0, n_long = 0;
  const char *key = ir_attr_intern("act_int8");
  for (int32_t i = 0; i < g->n_nodes; i++) {
    ir_node *n = &g->nodes[i];
    if (n->op != IR_OP_MATMUL || n->n_in < 2 || n->in[1] < 0) continue;
    const ir_tensor *w = &g->tensors[n->in[1]];
    if (!ir_dtype_is_quant(w->dtype) || w->rank != 2 || ir_node_attr_i(n, "act_int8", 0)) continue;
    if (bf16_blocks(g, n, o) || ir_node_attr_i(n, "act_bf16", 0)) continue;
    if (w->dims[1].n > IR_Q8_ACT_MAX_K) {
      n_long++;
      continue;
    }
    if (n->n_attrs >= IR_MAX_ATTRS)
      return ir_diag_set(d, IR_UNSUPPORTED, "node '%s': no room for attribute act_int8", n->name);
    n->attrs[n->n_attrs++] = IR_AI(key, 1);
    n_done++;
  }
  log->res.act_int8_ran = true;
  log->res.act_int8_done = n_done, log->res.act_int8_long = n_long;
  char line[256];
  pass_results_line(&log->res, PASS_LINE_ACT_INT8, line, sizeof line);
  pass_log_add(log, "%s", line);
  return IR_OK;
}

/* ---- bf16 activations for bf16 weights ---------------------------------------------------- */

ir_status pass_act_bf16(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  int n_done = 0, n_attn = 0, n_blocks = 0;
  const char *key = ir_attr_intern("act_bf16");
  for (int32_t i = 0; i < g->n_nodes; i++) {
    ir_node *n = &g->nodes[i];
    if (!(n->op == IR_OP_MATMUL && o->act_bf16) && !(n->op == IR_OP_ATTENTION && o->attn_bf16))
      continue;
    if (ir_node_attr_i(n, "act_bf16", 0)) continue;
    if (n->op == IR_OP_MATMUL) {
      if (n->n_in < 2 || n->in[1] < 0) continue;
      const ir_tensor *w = &g->tensors[n->in[1]];
      if ((w->dtype != IR_BF16 || w->rank != 2) && !bf16_blocks(g, n, o)) continue;
      n_blocks += w->dtype != IR_BF16;
    }
    if (n->n_attrs >= IR_MAX_ATTRS)
      return ir_diag_set(d, IR_UNSUPPORTED, "node '%s': no room for attribute act_bf16", n->name);
    n->attrs[n->n_attrs++] = IR_AI(key, 1);
    if (n->op == IR_OP_MATMUL) n_done++;
    else n_attn++;
  }
  log->res.act_bf16_done = n_done;
  log->res.act_bf16_blocks = n_blocks;
  log->res.act_bf16_attn = n_attn;
  char line[256];
  if (pass_results_line(&log->res, PASS_LINE_ACT_BF16, line, sizeof line))
    pass_log_add(log, "%s", line);
  return IR_OK;
}
