/* kn_embed: token embedding lookup, converting one table row to f32 per token. */
#include "kn_cpu.h"
#include "kn_quant.h"

/* Rows are short; batching a few thousand values per chunk amortises the pool wake. */
enum { KN_EMBED_MIN_WORK = 16384 };

typedef struct embed_args {
  float *out;
  const void *table;
  ir_dtype dt;
  const int32_t *ids;
  int64_t dim;
  float scale;
  int64_t row0, rows; /* the table holds ids [row0, row0 + rows); others give zeros */
} embed_args;

static void embed_row(float *restrict out, const void *table, ir_dtype dt, int64_t row,
                      int64_t dim) {
  kn_dequant_row_at(table, dt, row, dim, out);
}

static void embed_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const embed_args *a = arg;
  for (int64_t t = begin; t < end; t++) {
    float *o = a->out + t * a->dim;
    int64_t row = (int64_t)a->ids[t] - a->row0;
    if (row < 0 || row >= a->rows) {
      for (int64_t i = 0; i < a->dim; i++) o[i] = 0.0f;
      continue;
    }
    embed_row(o, a->table, a->dt, row, a->dim);
    if (a->scale != 1.0f)
      for (int64_t i = 0; i < a->dim; i++) o[i] *= a->scale;
  }
}

void kn_embed_part(kn_pool *p, float *out, const void *table, ir_dtype dt, const int32_t *ids,
                   int64_t n_tok, int64_t dim, float scale, int64_t row0, int64_t rows) {
  embed_args a = {.out = out,
                  .table = table,
                  .dt = dt,
                  .ids = ids,
                  .dim = dim,
                  .scale = scale,
                  .row0 = row0,
                  .rows = rows};
  int64_t grain = dim > 0 ? 1 + KN_EMBED_MIN_WORK / dim : 1;
  kn_parallel_for(p, n_tok, grain, embed_task, &a);
}

void kn_embed_scaled(kn_pool *p, float *out, const void *table, ir_dtype dt, const int32_t *ids,
                     int64_t n_tok, int64_t dim, float scale) {
  kn_embed_part(p, out, table, dt, ids, n_tok, dim, scale, 0, INT64_MAX);
}

void kn_embed(kn_pool *p, float *out, const void *table, ir_dtype dt, const int32_t *ids,
              int64_t n_tok, int64_t dim) {
  kn_embed_scaled(p, out, table, dt, ids, n_tok, dim, 1.0f);
}
