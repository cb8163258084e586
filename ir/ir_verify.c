/* ir_verify: checks a graph before anything runs it (after every pass in debug builds,
 * always after loading a plan). Reports the first problem found. */
#include <stdio.h>

#include "ir.h"

static ir_status check_config(const ir_model_config *c, ir_diag *d) {
  if (c->max_tokens <= 0 || c->max_seqs <= 0 || c->max_logits <= 0 || c->kv_block_size <= 0)
    return ir_diag_set(d, IR_BAD_FORMAT, "model config: step limits must be positive");
  if (c->max_seqs > c->max_tokens || c->max_logits > c->max_tokens)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "model config: max_seqs and max_logits must not exceed max_tokens");
  return ir_check_decode_buckets(c, c->decode_buckets, c->n_decode_buckets, d);
}

int64_t ir_max_decode_batch(const ir_model_config *c) {
  int64_t cap = c->max_tokens;
  if (c->max_seqs < cap) cap = c->max_seqs;
  if (c->max_logits < cap) cap = c->max_logits;
  return cap;
}

int32_t ir_default_decode_buckets(const ir_model_config *c, int64_t *out) {
  int64_t cap = ir_max_decode_batch(c);
  int32_t n = 0;
  for (int64_t v = 1; v < cap && n < IR_MAX_DECODE_BUCKETS - 1; v *= 2) out[n++] = v;
  if (cap >= 1) out[n++] = cap;
  return n;
}

ir_status ir_check_decode_buckets(const ir_model_config *c, const int64_t *b, int32_t n,
                                  ir_diag *d) {
  int64_t cap = ir_max_decode_batch(c);
  if (n < 0 || n > IR_MAX_DECODE_BUCKETS)
    return ir_diag_set(d, IR_BAD_FORMAT, "decode buckets: %d of them (at most %d)", (int)n,
                       IR_MAX_DECODE_BUCKETS);
  for (int32_t i = 0; i < n; i++) {
    if (b[i] < 1 || b[i] > cap)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "decode bucket %lld is outside 1..%lld (the step limits: a decode "
                         "step holds at most min(max_tokens, max_seqs, max_logits) tokens)",
                         (long long)b[i], (long long)cap);
    if (i > 0 && b[i] <= b[i - 1])
      return ir_diag_set(d, IR_BAD_FORMAT, "decode buckets must be ascending (%lld after %lld)",
                         (long long)b[i], (long long)b[i - 1]);
  }
  return IR_OK;
}

static ir_status check_tensor(const ir_graph *g, int32_t i, ir_diag *d) {
  const ir_tensor *t = &g->tensors[i];
  if (!ir_dtype_valid(t->dtype))
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': invalid dtype %d", t->name, (int)t->dtype);
  if (t->rank < 0 || t->rank > IR_MAX_RANK)
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': rank %d out of range", t->name, t->rank);
  for (int k = 0; k < t->rank; k++) {
    ir_dim dm = t->dims[k];
    if (dm.sym >= IR_SYM_COUNT || (dm.sym == IR_SYM_NONE && dm.n < 0))
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': bad dim %d", t->name, k);
    if (t->kind == IR_TENSOR_WEIGHT && dm.sym != IR_SYM_NONE)
      return ir_diag_set(d, IR_BAD_FORMAT, "weight '%s' has a symbolic dim", t->name);
  }
  if (ir_dtype_is_x8(t->dtype) &&
      (t->rank != 2 || t->dims[0].sym != IR_SYM_NONE || t->dims[0].n % 8 != 0))
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': %s needs rank 2 and a multiple of 8 rows",
                       t->name, ir_dtype_name(t->dtype));
  if (ir_dtype_is_blocks(t->dtype) &&
      (t->rank < 1 || t->dims[t->rank - 1].sym != IR_SYM_NONE ||
       t->dims[t->rank - 1].n % ir_dtype_block(t->dtype) != 0))
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': %s rows must hold whole %d-value blocks",
                       t->name, ir_dtype_name(t->dtype), ir_dtype_block(t->dtype));
  if (t->kind == IR_TENSOR_WEIGHT) {
    uint64_t want = ir_tensor_bytes(g, t, NULL);
    if (!t->data || t->nbytes != want)
      return ir_diag_set(d, IR_BAD_FORMAT, "weight '%s': %llu bytes of data, shape needs %llu",
                         t->name, (unsigned long long)t->nbytes, (unsigned long long)want);
  } else if (t->kind == IR_TENSOR_ACT) {
    if (t->producer < 0 || t->producer >= g->n_nodes)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s' has no producer", t->name);
    const ir_node *p = &g->nodes[t->producer];
    bool listed = false;
    for (int k = 0; k < p->n_out && !listed; k++) listed = p->out[k] == i;
    if (!listed)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s' names node '%s' as producer, which does "
                         "not write it", t->name, p->name);
  } else if (t->kind != IR_TENSOR_INPUT) {
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': unknown kind", t->name);
  }
  return IR_OK;
}

static ir_status check_inputs(const ir_graph *g, int32_t ni, ir_diag *d) {
  const ir_node *n = &g->nodes[ni];
  for (int i = 0; i < n->n_in; i++) {
    int32_t ti = n->in[i];
    if (ti == -1) continue;
    if (ti < 0 || ti >= g->n_tensors)
      return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': input %d refers to tensor %d of %d",
                         n->name, i, ti, g->n_tensors);
    const ir_tensor *t = &g->tensors[ti];
    if (t->kind == IR_TENSOR_ACT && t->producer >= ni)
      return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': input '%s' is used before it is produced",
                         n->name, t->name);
  }
  return IR_OK;
}

static ir_status check_outputs(const ir_graph *g, int32_t ni, ir_diag *d) {
  const ir_node *n = &g->nodes[ni];
  ir_dtype dt[IR_MAX_IO];
  int rank[IR_MAX_IO], n_out = 0;
  ir_dim dims[IR_MAX_IO][IR_MAX_RANK];
  ir_status st = ir_op_infer(g, n, dt, rank, dims, &n_out, d);
  if (st != IR_OK) return st;
  if (n_out != n->n_out)
    return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': %d outputs, op %s has %d", n->name,
                       n->n_out, ir_op_name(n->op), n_out);
  for (int i = 0; i < n_out; i++) {
    int32_t ti = n->out[i];
    if (ti < 0 || ti >= g->n_tensors || g->tensors[ti].producer != ni)
      return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': output %d is not owned by the node",
                         n->name, i);
    const ir_tensor *t = &g->tensors[ti];
    bool ok = t->dtype == dt[i] && t->rank == rank[i];
    for (int k = 0; ok && k < t->rank; k++)
      ok = t->dims[k].sym == dims[i][k].sym &&
           (t->dims[k].sym != IR_SYM_NONE || t->dims[k].n == dims[i][k].n);
    if (!ok) {
      char have[96], want[96];
      ir_tensor inferred = {.rank = rank[i]};
      for (int k = 0; k < rank[i]; k++) inferred.dims[k] = dims[i][k];
      ir_tensor_format_shape(t, have, sizeof have);
      ir_tensor_format_shape(&inferred, want, sizeof want);
      return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': output '%s' is %s %s, op gives %s %s",
                         n->name, t->name, ir_dtype_name(t->dtype), have, ir_dtype_name(dt[i]),
                         want);
    }
  }
  return IR_OK;
}

ir_status ir_graph_verify(const ir_graph *g, ir_diag *d) {
  ir_status st = check_config(&g->config, d);
  for (int32_t i = 0; st == IR_OK && i < g->n_tensors; i++) st = check_tensor(g, i, d);
  for (int32_t i = 0; st == IR_OK && i < g->n_nodes; i++) {
    st = check_inputs(g, i, d);
    if (st == IR_OK) st = check_outputs(g, i, d);
  }
  for (int32_t i = 0; st == IR_OK && i < g->n_inputs; i++)
    if (g->inputs[i] < 0 || g->inputs[i] >= g->n_tensors ||
        g->tensors[g->inputs[i]].kind != IR_TENSOR_INPUT)
      st = ir_diag_set(d, IR_BAD_FORMAT, "graph input %d is not an input tensor", i);
  for (int32_t i = 0; st == IR_OK && i < g->n_outputs; i++)
    if (g->outputs[i] < 0 || g->outputs[i] >= g->n_tensors)
      st = ir_diag_set(d, IR_BAD_FORMAT, "graph output %d refers to no tensor", i);
  if (st == IR_OK && g->n_outputs == 0)
    st = ir_diag_set(d, IR_BAD_FORMAT, "graph has no outputs");
  return st;
}
