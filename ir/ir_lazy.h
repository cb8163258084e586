/* ir_lazy: weights whose bytes are made when they are needed, a range of rows at a time,
 * instead of when a pass creates them. A fused, cast, quantized, repacked or sharded weight
 * is a recipe over its inputs (borrowed source bytes or other lazy weights) until the plan
 * writer streams it into the file, so a build holds one chunk of rows of one tensor at a
 * time, whatever the model's size.
 *
 * A tensor's rows are its first dim (a rank-1 tensor's rows are its values); row r holds
 * bytes [r * row_bytes, (r + 1) * row_bytes) of its data. A lazy weight has data == NULL
 * and lazy set; ir_weight_read gives either kind's rows. */
#ifndef IR_LAZY_H
#define IR_LAZY_H

#include "ir.h"

typedef struct ir_lazy ir_lazy;

struct ir_lazy {
  /* Writes rows [r0, r1) of the output into dst ((r1 - r0) * row_bytes bytes). r0 is a
   * multiple of row_align; r1 is too, or rows. */
  ir_status (*fill)(ir_lazy *z, int64_t r0, int64_t r1, void *dst, ir_diag *d);
  void (*drop)(ir_lazy *z); /* frees z and what it owns (not its inputs' lazies) */
  int64_t rows;
  uint64_t row_bytes;
  int64_t row_align; /* 1, or the row group a fill must start on (x8 repacking: 8) */
};

/* A weight as a lazy's input: a copy of its description, so that the tensor itself may
 * leave the graph (pass_compact drops weights nobody reads) while the recipe holds on. */
typedef struct ir_wref {
  ir_dtype dtype;
  int rank;
  int64_t dims[IR_MAX_RANK];
  uint64_t nbytes;
  const void *data; /* borrowed bytes, or */
  ir_lazy *lazy;    /* a recipe (owned by the graph) */
} ir_wref;

/* Rows and bytes per row of a weight of that shape (rank 0: one row). */
int64_t ir_wref_rows(const ir_wref *w);
uint64_t ir_wref_row_bytes(const ir_wref *w);
ir_wref ir_wref_of(const ir_tensor *t);

/* Rows [r0, r1) of w into dst, whichever kind it is (an unaligned range of a lazy with a
 * row_align goes through a scratch buffer). */
ir_status ir_wref_read(const ir_wref *w, int64_t r0, int64_t r1, void *dst, ir_diag *d);
static inline ir_status ir_weight_read(const ir_tensor *t, int64_t r0, int64_t r1, void *dst,
                                       ir_diag *d) {
  ir_wref w = ir_wref_of(t);
  return ir_wref_read(&w, r0, r1, dst, d);
}

/* Rows a chunk of w may take so that it holds at most `bytes` (at least one aligned group). */
int64_t ir_wref_chunk_rows(const ir_wref *w, uint64_t bytes);

/* The drop of a recipe that owns nothing but itself (its struct, allocated whole). */
void ir_lazy_free(ir_lazy *z);

/* The graph takes z (dropped by ir_graph_destroy; on failure dropped at once: false). */
bool ir_graph_adopt_lazy(ir_graph *g, ir_lazy *z);
/* A weight made by z (adopted first; -1 on failure, z dropped). */
int32_t ir_graph_add_lazy_weight(ir_graph *g, const char *name, ir_dtype dt, int rank,
                                 const int64_t *shape, ir_lazy *z);

/* Makes tensor ti's bytes now (a graph-owned buffer) if it is lazy: for the few passes that
 * read small weights whole, and for tests and tools that run a graph in memory. */
ir_status ir_graph_materialize_tensor(ir_graph *g, int32_t ti, ir_diag *d);
ir_status ir_graph_materialize(ir_graph *g, ir_diag *d);

/* The recipes every layer shares. */
/* Inputs stacked along rows (their row bytes equal). */
ir_lazy *ir_lazy_concat(const ir_wref *in, int n);
/* Bytes [off, off + len) of every row of w (a column shard). */
ir_lazy *ir_lazy_cols(const ir_wref *w, uint64_t off, uint64_t len);

#endif
