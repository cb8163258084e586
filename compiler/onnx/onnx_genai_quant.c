/* onnx_genai_quant: keeps MatMulNBits weights packed. The Llama template builds over
 * f32 stand-ins; each matmul reading one is then rewired to the IR's weight-only
 * int4 matmul (ir_op.c: i4 codes [N,K], scales [N,K/group], zero points [N,K/group] u8),
 * whose value is MatMulNBits' own, w = (q - zp) * scale in f32 with zp 8 when absent. The
 * stand-ins are then dead and dce drops them from the plan. */
#include <stdlib.h>
#include <string.h>

#include "onnx_genai.h"
#include "ir_alloc.h"

typedef struct gx_qw {
  char name[96]; /* the HF name the template gave the weight */
  const uint8_t *q;
  const void *scales;
  ir_dtype st;
  const uint8_t *zp;
  int64_t n, k, group;
} gx_qw;

void gx_qw_note(gx *G, const char *hf, const gx_mat *mat, int64_t r0, int64_t rows) {
  if (G->st != IR_OK) return;
  if (G->n_qw == G->cap_qw) {
    int cap = G->cap_qw ? 2 * G->cap_qw : 32;
    gx_qw *q = ir_realloc(G->qw, (size_t)cap * sizeof *q);
    if (!q) {
      G->st = ir_diag_set(G->d, IR_OOM, "out of memory");
      return;
    }
    G->qw = q;
    G->cap_qw = cap;
  }
  int64_t ng = mat->k / mat->group;
  gx_qw *w = &G->qw[G->n_qw++];
  snprintf(w->name, sizeof w->name, "%s", hf);
  w->q = mat->q + r0 * (mat->k / 2);
  w->scales = (const uint8_t *)mat->scales + ir_dtype_bytes(mat->st, (uint64_t)(r0 * ng));
  w->st = mat->st;
  w->zp = mat->zp ? mat->zp + r0 * ng : NULL;
  w->n = rows;
  w->k = mat->k;
  w->group = mat->group;
}

static int32_t add_param(ir_graph *g, const gx_qw *w, const char *suffix, ir_dtype dt, int64_t cols,
                         const void *data) {
  char name[128];
  snprintf(name, sizeof name, "%s.%s", w->name, suffix);
  int64_t shape[2] = {w->n, cols};
  return ir_graph_add_weight(g, name, dt, 2, shape, data,
                             ir_dtype_bytes(dt, (uint64_t)(w->n * cols)));
}

/* Rewires the matmuls reading tensor t (n_in <= 3: float, not yet rewired). */
static int rewire_one(ir_graph *g, const gx_qw *w, int32_t t) {
  int32_t q = -1, s = -1, z = -1;
  int cnt = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    ir_node *n = &g->nodes[i];
    if (n->op != IR_OP_MATMUL || n->n_in < 2 || n->n_in > 3 || n->in[1] != t) continue;
    if (q < 0) {
      q = add_param(g, w, "i4", IR_I4, w->k, w->q);
      s = add_param(g, w, "scales", w->st, w->k / w->group, w->scales);
      z = w->zp ? add_param(g, w, "zero_points", IR_U8, w->k / w->group, w->zp) : -1;
      if (q < 0 || s < 0 || (w->zp && z < 0)) return -1;
    }
    if (n->n_in < 3) n->in[2] = -1;
    n->in[1] = q;
    n->in[3] = s;
    n->in[4] = z;
    n->n_in = z >= 0 ? 5 : 4;
    cnt++;
  }
  return cnt;
}

int gx_qw_rewire(gx *G, ir_graph *g) {
  int total = 0;
  for (int i = 0; i < G->n_qw; i++) {
    int32_t t = ir_graph_find_tensor(g, G->qw[i].name);
    int c = t < 0 ? 0 : rewire_one(g, &G->qw[i], t);
    if (c < 0) {
      ir_diag_set(G->d, IR_OOM, "out of memory");
      return -1;
    }
    if (c == 0) { /* its f32 stand-in holds no values: never let it reach a plan */
      ir_diag_set(G->d, IR_UNSUPPORTED,
                  "MatMulNBits weight '%s' is not read by a matmul "
                  "of the built program",
                  G->qw[i].name);
      return -1;
    }
    total += c;
  }
  return total;
}
