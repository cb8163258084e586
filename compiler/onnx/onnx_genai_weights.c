/* onnx_genai_weights: the GenAI recogniser's weight store — projection weights
 * transposed or dequantized (MatMulNBits) to the template's [out, in] layout, the RoPE
 * cos/sin caches checked against a rope theta — and the configuration beside the model. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infc_hfconfig.h"
#include "infc_util.h"
#include "onnx_genai.h"
#include "ir_alloc.h"

bool gx_keep(gx *G, void *buf) {
  if (G->n_owned == G->cap_owned) {
    int cap = G->cap_owned ? 2 * G->cap_owned : 32;
    void **o = ir_realloc(G->owned, (size_t)cap * sizeof *o);
    if (!o) {
      ir_free(buf);
      return false;
    }
    G->owned = o;
    G->cap_owned = cap;
  }
  G->owned[G->n_owned++] = buf;
  return true;
}

static void oom(gx *G) {
  if (G->st == IR_OK) G->st = ir_diag_set(G->d, IR_OOM, "out of memory");
}

void gx_add(gx *G, const char *hf, ir_dtype dt, int rank, const int64_t *shape, const void *data) {
  if (G->st != IR_OK) return;
  if (G->n_w == G->cap_w) {
    int cap = G->cap_w ? 2 * G->cap_w : 64;
    gx_weight *w = ir_realloc(G->w, (size_t)cap * sizeof *w);
    if (!w) return oom(G);
    G->w = w;
    G->cap_w = cap;
  }
  gx_weight *w = &G->w[G->n_w++];
  snprintf(w->name, sizeof w->name, "%s", hf);
  w->t = (model_tensor){.dtype = dt, .rank = rank, .data = data};
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= w->t.shape[i] = shape[i];
  w->t.nbytes = ir_dtype_bytes(dt, (uint64_t)n);
}

static bool float_dtype(ir_dtype dt) { return dt == IR_F32 || dt == IR_F16 || dt == IR_BF16; }

void gx_add_const(gx *G, const char *hf, const char *v, int rank, const int64_t *shape) {
  onnx_dense t;
  if (G->st != IR_OK) return;
  bool ok = gx_const(G, v, &t);
  if (ok && (!float_dtype(t.dt) || t.rank != rank ||
             memcmp(t.shape, shape, (size_t)rank * sizeof *shape))) {
    ir_free(t.owned);
    ok = false;
  }
  if (!ok) {
    gx_fail(G, IR_UNSUPPORTED,
            "'%s' (%s) is not a constant f32/f16/bf16 tensor of shape "
            "[%lld%s]",
            v, hf, (long long)shape[0], rank > 1 ? ", ..." : "");
    return;
  }
  if (t.owned && !gx_keep(G, t.owned)) return oom(G);
  gx_add(G, hf, t.dt, t.rank, t.shape, t.data);
}

bool gx_find(void *ctx, const char *name, model_tensor *out) {
  gx *G = ctx;
  for (int i = 0; i < G->n_w; i++)
    if (!strcmp(G->w[i].name, name)) {
      *out = G->w[i].t;
      return true;
    }
  return false;
}

/* --- projections ------------------------------------------------------------------- */

static bool is_nbits(gx_node *n) {
  return gx_is_op(n, "MatMulNBits") && n->domain && !strcmp(n->domain, "com.microsoft");
}

bool gx_is_proj(gx *G, gx_node *n) {
  if (is_nbits(n)) return true;
  onnx_dense t;
  if (!gx_is_op(n, "MatMul") || !gx_const(G, gx_in(n, 1), &t)) return false;
  ir_free(t.owned);
  return t.rank == 2;
}

bool gx_const_transposed(gx *G, const char *v, gx_mat *out) {
  onnx_dense t;
  if (!gx_const(G, v, &t)) return false;
  if (!float_dtype(t.dt) || t.rank != 2) {
    ir_free(t.owned);
    gx_fail(G, IR_UNSUPPORTED, "weight '%s' is not an f32/f16/bf16 matrix", v);
    return false;
  }
  size_t es = (size_t)ir_dtype_bytes(t.dt, 1), r = (size_t)t.shape[0], c = (size_t)t.shape[1];
  uint8_t *dst = ir_malloc(t.nbytes ? t.nbytes : 1);
  if (!dst || !gx_keep(G, dst)) {
    ir_free(t.owned);
    oom(G);
    return false;
  }
  const uint8_t *src = t.data;
  for (size_t i = 0; i < r; i++)
    for (size_t j = 0; j < c; j++) memcpy(dst + (j * r + i) * es, src + (i * c + j) * es, es);
  ir_free(t.owned);
  *out = (gx_mat){.dt = t.dt, .n = (int64_t)c, .k = (int64_t)r, .data = dst};
  return true;
}

/* A MatMul's [k, n] constant, transposed to [n, k]. */
static bool matmul_read(gx *G, gx_node *n, gx_mat *out) {
  if (!gx_const_transposed(G, gx_in(n, 1), out)) return false;
  out->node = n;
  G->n_matmul++;
  return true;
}

typedef struct nbits {
  int64_t K, N, bs, nblk, blob;
  onnx_dense b, s, z;
  bool has_z;
} nbits;

static void nbits_free(nbits *q) {
  ir_free(q->b.owned);
  ir_free(q->s.owned);
  ir_free(q->z.owned);
}

static float nb_scale(const nbits *q, int64_t i) {
  return q->s.dt == IR_F16 ? ir_f16_to_f32(((const uint16_t *)q->s.data)[i])
                           : ((const float *)q->s.data)[i];
}

static bool nbits_scales_zp(gx *G, gx_node *n, nbits *q, size_t si, size_t zi);

/* Checks attributes and the shapes of B, scales and zero_points. */
static bool nbits_check(gx *G, gx_node *n, nbits *q) {
  static const char *const known[] = {"K", "N", "bits", "block_size", "accuracy_level", NULL};
  if (!gx_attrs_known(G, n, known)) return false;
  q->K = gx_attr_i(n, "K", 0);
  q->N = gx_attr_i(n, "N", 0);
  q->bs = gx_attr_i(n, "block_size", 0);
  if (q->K <= 0 || q->N <= 0 || q->K > (1 << 24) || q->N > (1 << 24) || q->bs < 16 ||
      q->bs > 4096 || (q->bs & (q->bs - 1)))
    return gx_fail_node(G, n, IR_BAD_FORMAT,
                        "needs attributes 'K', 'N' (1..2^24) and "
                        "'block_size' (a power of two >= 16)"),
           false;
  if (!gx_attr_i_is(G, n, "bits", 4, 4, "only 4-bit weights are supported")) return false;
  for (size_t i = 4; i < n->n_input; i++)
    if (n->input[i][0])
      return gx_fail_node(G, n, IR_UNSUPPORTED, "input %zu ('%s', %s) is not supported", i,
                          n->input[i], i == 4 ? "g_idx" : "bias"),
             false;
  q->nblk = (q->K + q->bs - 1) / q->bs;
  q->blob = q->bs / 2;
  if (!gx_const(G, gx_in(n, 1), &q->b) || q->b.dt != IR_U8 || q->b.is_bool || q->b.rank < 1 ||
      q->b.nbytes != (uint64_t)(q->N * q->nblk * q->blob) || q->b.shape[0] != q->N)
    return gx_fail_node(G, n, IR_BAD_FORMAT,
                        "input B is not a constant uint8 tensor [N=%lld, "
                        "%lld blocks, %lld bytes]",
                        (long long)q->N, (long long)q->nblk, (long long)q->blob),
           false;
  return nbits_scales_zp(G, n, q, 2, 3);
}

/* scales (input si) and the optional packed zero points (input zi) of N x blocks. */
static bool nbits_scales_zp(gx *G, gx_node *n, nbits *q, size_t si, size_t zi) {
  if (!gx_const(G, gx_in(n, si), &q->s) || (q->s.dt != IR_F32 && q->s.dt != IR_F16) ||
      ir_nd_numel(q->s.rank, q->s.shape) != q->N * q->nblk)
    return gx_fail_node(G, n, IR_BAD_FORMAT,
                        "input scales is not a constant f32/f16 tensor "
                        "of N x blocks = %lld values",
                        (long long)(q->N * q->nblk)),
           false;
  q->has_z = gx_in(n, zi)[0];
  if (!q->has_z) return true;
  if (!gx_const(G, gx_in(n, zi), &q->z))
    return gx_fail_node(G, n, IR_BAD_FORMAT, "input zero_points is not a constant"), false;
  if (q->z.dt != IR_U8 || q->z.is_bool)
    return gx_fail_node(G, n, IR_UNSUPPORTED,
                        "zero_points of dtype %s are not supported "
                        "(packed uint8 only)",
                        ir_dtype_name(q->z.dt)),
           false;
  if (q->z.nbytes != (uint64_t)(q->N * ((q->nblk + 1) / 2)))
    return gx_fail_node(G, n, IR_BAD_FORMAT,
                        "input zero_points has %llu bytes, expected "
                        "N x ceil(blocks / 2) = %lld",
                        (unsigned long long)q->z.nbytes, (long long)(q->N * ((q->nblk + 1) / 2))),
           false;
  return true;
}

/* w[n][k] = (q - zp) * scale for k's block: MatMulNBits' definition, in f32. */
static float *nbits_dequant(const nbits *q) {
  float *w = ir_malloc((size_t)(q->N * q->K) * sizeof *w);
  if (!w) return NULL;
  const uint8_t *B = q->b.data, *Z = q->has_z ? q->z.data : NULL;
  int64_t zrow = (q->nblk + 1) / 2;
  for (int64_t n = 0; n < q->N; n++)
    for (int64_t b = 0; b < q->nblk; b++) {
      int zp = 8;
      if (Z) zp = (Z[n * zrow + b / 2] >> (4 * (b & 1))) & 15;
      float s = nb_scale(q, n * q->nblk + b);
      const uint8_t *blk = B + (n * q->nblk + b) * q->blob;
      for (int64_t j = 0; j < q->bs && b * q->bs + j < q->K; j++) {
        int v = (blk[j / 2] >> (4 * (j & 1))) & 15;
        w[n * q->K + b * q->bs + j] = (float)(v - zp) * s;
      }
    }
  return w;
}

/* K a whole number of blocks: B's rows are then exactly [k / 2] bytes of codes, low
 * nibble first, as the IR's i4 weight is. Keeps B and the scales (adopting copies the
 * decoder made) and unpacks the zero points to one byte each. */
static bool nbits_keep_packed(gx *G, nbits *q, gx_mat *out) {
  uint8_t *zp = NULL;
  if (q->has_z) {
    zp = ir_malloc((size_t)(q->N * q->nblk));
    if (!zp || !gx_keep(G, zp)) return oom(G), false;
    const uint8_t *Z = q->z.data;
    for (int64_t n = 0; n < q->N; n++)
      for (int64_t b = 0; b < q->nblk; b++)
        zp[n * q->nblk + b] = (Z[n * ((q->nblk + 1) / 2) + b / 2] >> (4 * (b & 1))) & 15;
  }
  if ((q->b.owned && !gx_keep(G, q->b.owned)) || (q->s.owned && !gx_keep(G, q->s.owned))) {
    q->b.owned = q->s.owned = NULL;
    return oom(G), false;
  }
  q->b.owned = q->s.owned = NULL;
  out->q = q->b.data;
  out->scales = q->s.data;
  out->st = q->s.dt;
  out->zp = zp;
  out->group = q->bs;
  return true;
}

static bool nbits_read(gx *G, gx_node *n, gx_mat *out) {
  nbits q = {0};
  bool ok = nbits_check(G, n, &q);
  /* Staying packed, the template's f32 copy is never read (the matmul is rewired to the
   * codes, and gx_qw_rewire fails if one is not): untouched zero pages, no dequantized
   * model in memory at build time. */
  bool packed = ok && G->keep_int4 && q.K % q.bs == 0;
  float *w = !ok ? NULL : packed ? ir_calloc((size_t)(q.N * q.K), sizeof *w) : nbits_dequant(&q);
  if (ok && (!w || !gx_keep(G, w))) {
    oom(G);
    ok = false;
  }
  if (ok) {
    *out = (gx_mat){.node = n, .dt = IR_F32, .n = q.N, .k = q.K, .data = (const uint8_t *)w};
    ok = !packed || nbits_keep_packed(G, &q, out);
    G->n_nbits_packable += out->q != NULL;
    if (G->n_nbits && G->nbits_block != q.bs) G->nbits_mixed = true;
    G->nbits_block = q.bs;
    G->nbits_zp |= q.has_z;
    G->n_nbits++;
  }
  nbits_free(&q);
  return ok;
}

/* The constant under a Reshape (GatherBlockQuantized's data): the bytes are the same;
 * the shape is the Reshape's when it is constant. */
static bool reshaped_const(gx *G, const char *v, onnx_dense *out) {
  gx_node *r = gx_producer(G, gx_skip(G, v));
  onnx_dense shp;
  if (!gx_is_op(r, "Reshape")) return gx_const(G, v, out);
  if (!gx_const(G, gx_in(r, 1), &shp)) return false;
  bool ok = shp.dt == IR_I64 && shp.rank == 1 && shp.shape[0] >= 1 && shp.shape[0] <= IR_MAX_RANK &&
            gx_const(G, gx_in(r, 0), out);
  if (ok) {
    out->rank = (int)shp.shape[0];
    for (int i = 0; i < out->rank; i++) out->shape[i] = ((const int64_t *)shp.data)[i];
  }
  ir_free(shp.owned);
  return ok;
}

/* GatherBlockQuantized (gather rows of a 4-bit table quantized along the row): the same
 * block layout as MatMulNBits with N = rows, K = the row length. */
static bool gbq_check(gx *G, gx_node *n, nbits *q) {
  static const char *const known[] = {"bits", "block_size", "gather_axis", "quantize_axis", NULL};
  if (!gx_attrs_known(G, n, known) ||
      !gx_attr_i_is(G, n, "bits", 4, 4, "only 4-bit tables are supported") ||
      !gx_attr_i_is(G, n, "gather_axis", 0, 0, "row lookups only"))
    return false;
  int64_t qa = gx_attr_i(n, "quantize_axis", 1);
  q->bs = gx_attr_i(n, "block_size", 128);
  if (qa != 1 && qa != -1)
    return gx_fail_node(G, n, IR_UNSUPPORTED,
                        "attribute 'quantize_axis' = %lld is not "
                        "supported (blocks along the row only)",
                        (long long)qa),
           false;
  if (q->bs < 16 || q->bs > 4096 || (q->bs & (q->bs - 1)))
    return gx_fail_node(G, n, IR_BAD_FORMAT,
                        "attribute 'block_size' = %lld is not a power "
                        "of two >= 16",
                        (long long)q->bs),
           false;
  if (!reshaped_const(G, gx_in(n, 0), &q->b) || q->b.dt != IR_U8 || q->b.is_bool ||
      q->b.rank != 2 || q->b.shape[0] <= 0 || q->b.shape[1] <= 0 || q->b.shape[0] > (1 << 24) ||
      q->b.shape[1] > (1 << 23) || q->b.nbytes != (uint64_t)(q->b.shape[0] * q->b.shape[1]))
    return gx_fail_node(G, n, IR_UNSUPPORTED,
                        "input data is not a constant packed uint8 "
                        "[rows, row length / 2] table"),
           false;
  q->N = q->b.shape[0];
  q->K = 2 * q->b.shape[1];
  q->nblk = (q->K + q->bs - 1) / q->bs;
  q->blob = q->bs / 2;
  if (q->K % q->bs)
    return gx_fail_node(G, n, IR_UNSUPPORTED,
                        "row length %lld is not a multiple of the "
                        "block size %lld",
                        (long long)q->K, (long long)q->bs),
           false;
  return nbits_scales_zp(G, n, q, 2, 3);
}

bool gx_embed_read(gx *G, gx_node *n, gx_mat *out) {
  nbits q = {0};
  bool ok = gbq_check(G, n, &q);
  float *w = ok ? nbits_dequant(&q) : NULL;
  if (ok && (!w || !gx_keep(G, w))) {
    oom(G);
    ok = false;
  }
  if (ok) *out = (gx_mat){.node = n, .dt = IR_F32, .n = q.N, .k = q.K, .data = (const uint8_t *)w};
  nbits_free(&q);
  return ok;
}

bool gx_mat_read(gx *G, gx_node *n, gx_mat *out) {
  if (G->st != IR_OK) return false;
  bool ok = is_nbits(n) ? nbits_read(G, n, out) : matmul_read(G, n, out);
  if (!ok && G->st == IR_OK)
    gx_fail_node(G, n, IR_UNSUPPORTED, "right operand '%s' is not a constant matrix", gx_in(n, 1));
  return ok;
}

void gx_mat_add(gx *G, const char *hf, const gx_mat *mat, int64_t r0, int64_t rows) {
  int64_t shape[2] = {rows, mat->k};
  uint64_t off = ir_dtype_bytes(mat->dt, (uint64_t)(r0 * mat->k));
  gx_add(G, hf, mat->dt, 2, shape, mat->data + off);
  if (mat->q) gx_qw_note(G, hf, mat, r0, rows);
}

/* --- RoPE caches ------------------------------------------------------------------- */

static double cache_at(const onnx_dense *t, int64_t i) {
  return t->dt == IR_F16 ? ir_f16_to_f32(((const uint16_t *)t->data)[i])
                         : ((const float *)t->data)[i];
}

/* inv_freq[i]: the phase of entry i followed from position 1 to the last, doubling the
 * position each step so the predicted phase is always within pi of the true one. */
static double inv_freq(const onnx_dense *c, const onnx_dense *s, int64_t rows, int64_t half,
                       int64_t i) {
  const double two_pi = 6.283185307179586;
  double inv = atan2(cache_at(s, half + i), cache_at(c, half + i));
  for (int64_t p = 1; p < rows - 1;) {
    p = 2 * p < rows - 1 ? 2 * p : rows - 1;
    double a = atan2(cache_at(s, p * half + i), cache_at(c, p * half + i));
    inv = (a + two_pi * round(((double)p * inv - a) / two_pi)) / (double)p;
  }
  return inv;
}

/* theta from inv_freq[1] = theta^(-2/d), measured over the whole cache (f16 caches too);
 * rounded to an integer when within 1e-4 of one. */
static double rope_theta(const onnx_dense *c, const onnx_dense *s, int64_t rows, int64_t half) {
  double theta = pow(inv_freq(c, s, rows, half, 1), -(double)half);
  double r = round(theta);
  return fabs(theta - r) <= 1e-4 * r ? r : theta;
}

/* Every entry against cosf/sinf((float)pos * inv_freq[i]) as the template computes it;
 * the tolerance allows for a last-bit difference of inv_freq growing with pos. */
static bool rope_matches(const onnx_dense *c, const onnx_dense *s, int64_t rows, int64_t half,
                         double theta) {
  double tol0 = c->dt == IR_F16 ? 2e-3 : 2e-4;
  for (int64_t i = 0; i < half; i++) {
    float inv = (float)(1.0 / pow(theta, (double)(2 * i) / (double)(2 * half)));
    for (int64_t pos = 0; pos < rows; pos++) {
      float f = (float)pos * inv;
      double tol = tol0 + 4e-7 * (double)pos;
      if (fabs(cache_at(c, pos * half + i) - cosf(f)) > tol ||
          fabs(cache_at(s, pos * half + i) - sinf(f)) > tol)
        return false;
    }
  }
  return true;
}

static bool rope_check(gx *G, gx_node *node, const onnx_dense *c, const onnx_dense *s) {
  bool fp = (c->dt == IR_F32 || c->dt == IR_F16) && c->dt == s->dt;
  if (!fp || c->rank != 2 || s->rank != 2 || c->shape[0] != s->shape[0] ||
      c->shape[1] != s->shape[1] || c->shape[0] < 2)
    return gx_fail_node(G, node, IR_UNSUPPORTED,
                        "cos/sin caches are not two f32/f16 "
                        "[positions, rotary_dim / 2] tensors"),
           false;
  int64_t rows = c->shape[0], half = c->shape[1];
  if (2 * half != G->p.head_dim || half < 2)
    return gx_fail_node(G, node, IR_UNSUPPORTED,
                        "rotary dim %lld (cos cache width x 2) is "
                        "not head_dim %lld: partial rotary is not supported",
                        (long long)(2 * half), (long long)G->p.head_dim),
           false;
  double theta = rope_theta(c, s, rows, half);
  if (!(theta > 1) || !rope_matches(c, s, rows, half, theta))
    return gx_fail_node(G, node, IR_UNSUPPORTED,
                        "cos/sin caches are not cos/sin(pos * "
                        "theta^(-2i/d)) for one theta (scaled RoPE is not supported)"),
           false;
  if (G->p.rope_theta > 0 && G->p.rope_theta != theta)
    return gx_fail_node(G, node, IR_UNSUPPORTED,
                        "rope theta %g differs from an earlier "
                        "layer's %g",
                        theta, G->p.rope_theta),
           false;
  G->p.rope_theta = theta;
  G->rope_rows = G->rope_rows ? (rows < G->rope_rows ? rows : G->rope_rows) : rows;
  return true;
}

bool gx_rope_caches(gx *G, gx_node *node, const char *cos, const char *sin) {
  if (G->cos && gx_same(G, G->cos, cos) && gx_same(G, G->sin, sin)) return true;
  onnx_dense c = {0}, s = {0};
  bool ok = gx_const(G, cos, &c);
  ok = gx_const(G, sin, &s) && ok;
  if (!ok)
    gx_fail_node(G, node, IR_UNSUPPORTED,
                 "cos/sin caches '%s', '%s' are not constants (a "
                 "rotary cache chosen at run time is not supported)",
                 cos, sin);
  else ok = rope_check(G, node, &c, &s);
  ir_free(c.owned);
  ir_free(s.owned);
  if (ok) {
    G->cos = cos;
    G->sin = sin;
  }
  return ok;
}

/* --- configuration beside the model ----------------------------------------------- */

static int64_t json_id(const cJSON *v) {
  if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0);
  return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

static bool read_genai_config(gx *G, const char *dir) {
  char path[4200], *text = NULL;
  ir_diag ignore = {0};
  if (!infc_path_join(path, sizeof path, dir, "genai_config.json") || !infc_file_exists(path) ||
      infc_read_file(path, 1u << 20, &text, NULL, &ignore) != IR_OK)
    return false;
  cJSON *root = cJSON_Parse(text);
  ir_free(text);
  const cJSON *model = cJSON_GetObjectItem(root, "model");
  if (!cJSON_IsObject(model)) {
    cJSON_Delete(root);
    return false;
  }
  const cJSON *ctx = cJSON_GetObjectItem(model, "context_length");
  if (cJSON_IsNumber(ctx) && ctx->valuedouble >= 1 && ctx->valuedouble < G->p.max_position)
    G->p.max_position = (int64_t)ctx->valuedouble;
  G->p.bos_token_id = json_id(cJSON_GetObjectItem(model, "bos_token_id"));
  G->p.eos_token_id = json_id(cJSON_GetObjectItem(model, "eos_token_id"));
  cJSON_Delete(root);
  return true;
}

void gx_read_config(gx *G, const char *path) {
  char dir[4096], cfg[4200];
  model_llama_params c;
  ir_diag ignore = {0};
  G->p.max_position = G->rope_rows > 0 ? G->rope_rows : 2048;
  G->p.bos_token_id = G->p.eos_token_id = -1;
  infc_path_dir(dir, sizeof dir, path);
  if (read_genai_config(G, dir)) return;
  if (!infc_path_join(cfg, sizeof cfg, dir, "config.json") || !infc_file_exists(cfg) ||
      infc_hfconfig_load(cfg, &c, &ignore) != IR_OK)
    return;
  if (c.max_position < G->p.max_position) G->p.max_position = c.max_position;
  G->p.bos_token_id = c.bos_token_id;
  G->p.eos_token_id = c.eos_token_id;
}
