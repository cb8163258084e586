/* pass_memory_plan: places every activation and step input in one arena, sized for the
 * largest step (symbols at their limits). Two tensors share bytes only if their live
 * ranges [producer, last use] are disjoint; a node's inputs and outputs are live at the
 * node together, so no kernel ever reads and writes the same bytes unless it says so.
 * Greedy: largest first, lowest offset that fits beside every conflicting placed one. */
#include <stdlib.h>

#include "pass.h"
#include "ir_alloc.h"

#define ARENA_ALIGN 64

typedef struct live {
  int32_t tensor;
  int32_t first, last; /* node indices, inclusive */
  uint64_t size;
  uint64_t offset;
} live;

static uint64_t align_up(uint64_t x) { return (x + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

static int by_size_desc(const void *pa, const void *pb) {
  const live *a = pa, *b = pb;
  if (a->size != b->size) return a->size < b->size ? 1 : -1;
  return a->tensor - b->tensor; /* deterministic tie-break */
}

static int32_t collect(const ir_graph *g, live *out) {
  int32_t *slot = ir_malloc(((size_t)g->n_tensors + 1) * sizeof *slot);
  if (!slot) return -1;
  int32_t n = 0;
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const ir_tensor *t = &g->tensors[i];
    slot[i] = -1;
    if (t->kind == IR_TENSOR_WEIGHT) continue;
    int32_t first = t->kind == IR_TENSOR_INPUT ? 0 : t->producer;
    out[n] = (live){
        .tensor = i, .first = first, .last = first, .size = align_up(ir_tensor_bytes(g, t, NULL))};
    slot[i] = n++;
  }
  for (int32_t j = 0; j < g->n_nodes; j++)
    for (int k = 0; k < g->nodes[j].n_in; k++) {
      int32_t t = g->nodes[j].in[k];
      if (t >= 0 && slot[t] >= 0 && out[slot[t]].last < j) out[slot[t]].last = j;
    }
  for (int32_t i = 0; i < g->n_outputs; i++)
    if (slot[g->outputs[i]] >= 0) out[slot[g->outputs[i]]].last = g->n_nodes;
  ir_free(slot);
  return n;
}

/* Lowest offset for l[i] not overlapping any of l[0..i) whose range meets it.
 * Candidate offsets are 0 and the end of each conflicting block. */
static uint64_t place(const live *l, int32_t i) {
  uint64_t best = UINT64_MAX;
  for (int32_t c = -1; c < i; c++) {
    if (c >= 0 && (l[c].last < l[i].first || l[i].last < l[c].first)) continue;
    uint64_t off = c < 0 ? 0 : l[c].offset + l[c].size;
    if (off >= best) continue;
    bool fits = true;
    for (int32_t o = 0; o < i && fits; o++) {
      if (l[o].last < l[i].first || l[i].last < l[o].first) continue;
      fits = off + l[i].size <= l[o].offset || l[o].offset + l[o].size <= off;
    }
    if (fits) best = off;
  }
  return best;
}

ir_status pass_memory_plan(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  live *l = ir_malloc(((size_t)g->n_tensors + 1) * sizeof *l);
  int32_t n = l ? collect(g, l) : -1;
  if (n < 0) {
    ir_free(l);
    return ir_diag_set(d, IR_OOM, "memory plan: out of memory");
  }
  qsort(l, (size_t)n, sizeof *l, by_size_desc);
  uint64_t arena = 0, naive = 0;
  for (int32_t i = 0; i < n; i++) {
    l[i].offset = place(l, i);
    g->tensors[l[i].tensor].arena_offset = (int64_t)l[i].offset;
    if (l[i].offset + l[i].size > arena) arena = l[i].offset + l[i].size;
    naive += l[i].size;
  }
  g->arena_size = arena;
  ir_free(l);
  pass_log_add(log, "memory_plan: %d buffers in a %.2f MiB arena (%.2f MiB without reuse)", n,
               (double)arena / 1048576.0, (double)naive / 1048576.0);
  return IR_OK;
}
