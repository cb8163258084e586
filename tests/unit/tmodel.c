/* tmodel: shared helpers of the oracle tests (tmodel.h) and the kernel references (tref.h). */
#include "tmodel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tcheck.h"
#include "tref.h"

irt_model *tmodel_open(const char *plan) {
  irt_model *m = NULL;
  irt_error err = {0};
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = 2;
  CHECKF(irt_model_open(plan, &mo, &m, &err) == IRT_OK, "open %s: %s", plan, err.msg);
  return m;
}

float *tmodel_prompt_logits(irt_model *m, const int32_t *ids, int64_t n) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = malloc((size_t)(n * V) * sizeof *lg);
  irt_seq *s = NULL;
  irt_error err = {0};
  irt_seq_create(m, &s, &err);
  CHECKF(irt_seq_decode(m, s, ids, n, lg, true, &err) == IRT_OK, "decode: %s", err.msg);
  irt_seq_destroy(s);
  return lg;
}

irt_status tmodel_greedy(irt_model *m, const int32_t *ids, int64_t n, int32_t *out, int n_out) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = malloc((size_t)V * sizeof *lg);
  irt_seq *s = NULL;
  irt_sampler *smp = NULL;
  irt_error err = {0};
  irt_sampling sp = irt_sampling_default();
  irt_status st = lg ? irt_seq_create(m, &s, &err) : IRT_OOM;
  if (st == IRT_OK) st = irt_sampler_create(&sp, V, &smp, &err);
  if (st == IRT_OK) st = irt_seq_decode(m, s, ids, n, lg, false, &err);
  for (int i = 0; st == IRT_OK && i < n_out; i++) {
    out[i] = irt_sampler_sample(smp, lg);
    st = irt_seq_decode(m, s, &out[i], 1, lg, false, &err);
  }
  CHECKF(st == IRT_OK, "greedy decode: %s", err.msg);
  irt_sampler_destroy(smp);
  irt_seq_destroy(s);
  free(lg);
  return st;
}

int64_t tmodel_json_ids(const cJSON *arr, int32_t *out, int64_t cap) {
  int64_t n = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, arr) if (n < cap) out[n++] = (int32_t)v->valueint;
  return n;
}

double tmodel_max_rel_error(const float *lg, const cJSON *rows, int64_t V, int64_t *out_rows,
                            bool *out_short) {
  double worst = 0;
  int64_t t = 0;
  const cJSON *row, *v;
  *out_short = false;
  cJSON_ArrayForEach(row, rows) {
    int64_t i = 0;
    cJSON_ArrayForEach(v, row) {
      double ref = v->valuedouble, e = fabs((double)lg[t * V + i] - ref) / (1.0 + fabs(ref));
      if (e > worst) worst = e;
      i++;
    }
    *out_short |= i != V;
    t++;
  }
  *out_rows = t;
  return worst;
}

int tref_matmul_ok(const float *y, const float *x, const float *w, const float *bias, int64_t m,
                   int64_t n, int64_t k, double rel) {
  int ok = 1;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double ref = bias ? bias[j] : 0.0, mag = bias ? fabs(bias[j]) : 0.0;
      for (int64_t l = 0; l < k; l++) {
        ref += (double)x[i * k + l] * w[j * k + l];
        mag += fabs((double)x[i * k + l] * w[j * k + l]);
      }
      ok &= fabs(y[i * n + j] - ref) <= rel * mag + 1e-6;
    }
  return ok;
}

double tmodel_longrope_check(irt_model *ms, irt_model *ml, const cJSON *prompts,
                             const cJSON *logits, int64_t orig, double tol, const char *name,
                             int *n_short, int *n_long) {
  const cJSON *p;
  int np = 0;
  double worst = 0;
  *n_short = *n_long = 0;
  int64_t V = irt_model_get_info(ml)->vocab_size;
  cJSON_ArrayForEach(p, prompts) {
    int32_t ids[64];
    int64_t n = tmodel_json_ids(p, ids, 64), rows = 0;
    bool lng = n > orig, short_row = false;
    float *lg = tmodel_prompt_logits(lng ? ml : ms, ids, n);
    double w = tmodel_max_rel_error(lg, cJSON_GetArrayItem(logits, np), V, &rows, &short_row);
    CHECKF(!short_row && rows == n && w <= tol,
           "%s: prompt %d (%s factors): logits differ "
           "from transformers by %.3g, tolerance %g",
           name, np, lng ? "long" : "short", w, tol);
    if (w > worst) worst = w;
    if (lng) {
      float *other = tmodel_prompt_logits(ms, ids, orig);
      CHECKF(memcmp(other, lg, (size_t)(orig * V) * sizeof *lg) != 0,
             "%s: the long and short factors gave the same logits", name);
      free(other);
    }
    *n_long += lng, *n_short += !lng;
    free(lg);
    np++;
  }
  CHECKF(*n_short > 0 && *n_long > 0, "%s: %d short and %d long prompts", name, *n_short, *n_long);
  return worst;
}
