/* pass_repack: block-quantized weights of int8-activation matmuls rewritten with 8 rows
 * interleaved (IR_*_X8, ir_dtype.h): the CPU kernels then load the 8 rows' scales in one
 * register and the same 4 code positions of all 8 rows in one, so each row's products
 * add up in its own lane, with no horizontal sums: a fraction of the instructions the
 * GGUF layout takes (decode is bound by them on AVX2). bf16 weights of bf16-activation
 * matmuls likewise get 16 rows interleaved by pairs (IR_BF16_X16): a 64-byte load is one
 * vdpbf16ps operand of 16 output columns, against a broadcast pair of x. */
#include <stdlib.h>

#include "ir_alloc.h"
#include "ir_lazy.h"
#include "kn_quant.h"
#include "pass.h"

/* The interleaved rows, made 8 rows at a time from the GGUF-layout ones. */
typedef struct lz_x8 {
  ir_lazy z;
  ir_wref in;
  int64_t k;
} lz_x8;

static ir_status x8_fill(ir_lazy *z, int64_t r0, int64_t r1, void *dst, ir_diag *d) {
  lz_x8 *x = (lz_x8 *)z;
  uint8_t *src = ir_malloc(z->row_bytes * (uint64_t)(r1 - r0) + 1);
  if (!src) return ir_diag_set(d, IR_OOM, "out of memory repacking");
  ir_status st = ir_wref_read(&x->in, r0, r1, src, d);
  if (st == IR_OK && x->in.dtype == IR_BF16) kn_x16_pack((const uint16_t *)src, r1 - r0, x->k, dst);
  else if (st == IR_OK) kn_x8_pack(src, x->in.dtype, r1 - r0, x->k, dst);
  ir_free(src);
  return st;
}

/* Whether node n reads tensor ti only in a way that takes the interleaved layout: as the
 * weight of an act_int8 matmul whose row groups stay whole (8 rows; a fused gate/up needs
 * each half whole), or as an embedding table. -1: it does not read ti at all. */
static int reads_ok(const ir_graph *g, const ir_node *n, int32_t ti) {
  int uses = 0, ok = 1;
  for (int i = 0; i < n->n_in; i++) {
    if (n->in[i] != ti) continue;
    uses++;
    const ir_tensor *w = &g->tensors[ti];
    if (n->op == IR_OP_EMBED && i == 1 && ir_dtype_is_quant(w->dtype)) continue;
    bool swiglu = ir_node_attr_i(n, "act", IR_ACT_NONE) == IR_ACT_SWIGLU;
    if (n->op == IR_OP_MATMUL && i == 1 && ir_node_attr_i(n, "act_int8", 0) &&
        ir_dtype_is_quant(w->dtype) && w->dims[0].n % (swiglu ? 16 : 8) == 0)
      continue;
    if (n->op == IR_OP_MATMUL && i == 1 && ir_node_attr_i(n, "act_bf16", 0) &&
        ir_dtype_is_quant(w->dtype) && w->dims[0].n % (swiglu ? 32 : 16) == 0)
      continue;
    if (n->op == IR_OP_MATMUL && i == 1 && ir_node_attr_i(n, "act_bf16", 0) &&
        w->dtype == IR_BF16 && w->dims[0].n % (swiglu ? 32 : 16) == 0 && w->dims[1].n % 2 == 0)
      continue;
    ok = 0;
  }
  return uses ? ok : -1;
}

ir_status pass_repack(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  (void)o;
  int n_done = 0, n_kept = 0, n_bf16 = 0;
  uint64_t bytes = 0;
  for (int32_t ti = 0; ti < g->n_tensors; ti++) {
    ir_tensor *t = &g->tensors[ti];
    bool bf16 = t->dtype == IR_BF16;
    if (t->kind != IR_TENSOR_WEIGHT || !(ir_dtype_is_quant(t->dtype) || bf16) || t->rank != 2 ||
        t->dims[0].sym != IR_SYM_NONE || t->dims[1].sym != IR_SYM_NONE)
      continue;
    bool matmul = false, ok = true;
    for (int32_t i = 0; i < g->n_nodes && ok; i++) {
      int r = reads_ok(g, &g->nodes[i], ti);
      ok = r != 0;
      matmul |= r == 1 && g->nodes[i].op == IR_OP_MATMUL;
    }
    if (!matmul) continue;
    if (!ok || t->dims[0].n % (bf16 ? 16 : 8)) {
      n_kept++;
      continue;
    }
    lz_x8 *x = ir_calloc(1, sizeof *x);
    if (x) {
      x->in = ir_wref_of(t), x->k = t->dims[1].n;
      x->z = (ir_lazy){.fill = x8_fill,
                       .drop = ir_lazy_free,
                       .rows = t->dims[0].n,
                       .row_bytes = t->nbytes / (uint64_t)t->dims[0].n,
                       .row_align = bf16 ? 16 : 8};
    }
    if (!x || !ir_graph_adopt_lazy(g, &x->z)) /* (adopt drops it when it fails) */
      return ir_diag_set(d, IR_OOM, "out of memory repacking '%s'", t->name);
    t->data = NULL;
    t->lazy = &x->z;
    t->dtype = bf16 ? IR_BF16_X16 : ir_dtype_x8_of(t->dtype);
    n_done++;
    n_bf16 += bf16;
    bytes += t->nbytes;
  }
  log->res.repack_ran = true;
  log->res.repack_done = n_done, log->res.repack_bytes = bytes, log->res.repack_bf16 = n_bf16;
  log->res.repack_some_kept = n_kept > 0;
  char line[256];
  pass_results_line(&log->res, PASS_LINE_REPACK, line, sizeof line);
  pass_log_add(log, "%s", line);
  return IR_OK;
}
