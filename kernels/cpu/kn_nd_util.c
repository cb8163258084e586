/* kn_nd_util: the broadcast iterator shared by the n-d kernels. */
#include "kn_nd_util.h"

void kn_bcast_init(kn_bcast *bc, const kn_view *y, const kn_view *const *ops, int n_ops) {
  int64_t shape[IR_MAX_RANK], st[3][IR_MAX_RANK];
  int r = y->rank;
  for (int k = 0; k < n_ops; k++) {
    int64_t full[IR_MAX_RANK];
    kn_strides(ops[k], full);
    int off = r - ops[k]->rank;
    for (int i = 0; i < r; i++)
      st[k][i] = i < off || ops[k]->shape[i - off] == 1 ? 0 : full[i - off];
  }
  for (int i = 0; i < r; i++) shape[i] = y->shape[i];
  /* Drop extent-1 dims, then merge a dim into its right neighbour when every operand
   * steps across the pair as one run. */
  int n = 0;
  for (int i = 0; i < r; i++) {
    if (shape[i] == 1) continue;
    bool merge = n > 0;
    for (int k = 0; merge && k < n_ops; k++) merge = bc->stride[k][n - 1] == st[k][i] * shape[i];
    if (merge) {
      bc->shape[n - 1] *= shape[i];
      for (int k = 0; k < n_ops; k++) bc->stride[k][n - 1] = st[k][i];
      continue;
    }
    bc->shape[n] = shape[i];
    for (int k = 0; k < n_ops; k++) bc->stride[k][n] = st[k][i];
    n++;
  }
  if (n == 0) { /* a single element */
    bc->shape[0] = 1;
    for (int k = 0; k < n_ops; k++) bc->stride[k][0] = 0;
    n = 1;
  }
  for (int i = 0; i < r; i++)
    if (y->shape[i] == 0) bc->shape[0] = 0; /* empty output: no rows */
  bc->rank = n;
  bc->n_ops = n_ops;
  bc->inner = bc->shape[n - 1];
  bc->rows = 1;
  for (int i = 0; i < n - 1; i++) bc->rows *= bc->shape[i];
  if (bc->shape[0] == 0) bc->rows = 0;
}

void kn_bcast_row(const kn_bcast *bc, int64_t r, int64_t *offs) {
  for (int k = 0; k < bc->n_ops; k++) offs[k] = 0;
  for (int i = bc->rank - 2; i >= 0; i--) {
    int64_t idx = r % bc->shape[i];
    r /= bc->shape[i];
    for (int k = 0; k < bc->n_ops; k++) offs[k] += idx * bc->stride[k][i];
  }
}
