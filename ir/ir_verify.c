/* ir_verify: checks a graph before anything runs it (after every pass in debug builds,
 * always after loading a plan). Reports the first problem found. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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
  if (ir_tensor_bytes(g, t, NULL) > IR_MAX_TENSOR_BYTES) /* also a product that overflowed */
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': its shape holds more than 2^48 bytes",
                       t->name);
  if (ir_dtype_is_x8(t->dtype) &&
      (t->rank != 2 || t->dims[0].sym != IR_SYM_NONE || t->dims[0].n % 8 != 0))
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': %s needs rank 2 and a multiple of 8 rows",
                       t->name, ir_dtype_name(t->dtype));
  if (ir_dtype_is_x16(t->dtype) &&
      (t->rank != 2 || t->dims[0].sym != IR_SYM_NONE || t->dims[0].n % 16 != 0 ||
       t->dims[1].sym != IR_SYM_NONE || t->dims[1].n % 2 != 0))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor '%s': %s needs rank 2, a multiple of 16 rows and an even K", t->name,
                       ir_dtype_name(t->dtype));
  if (ir_dtype_is_blocks(t->dtype) && (t->rank < 1 || t->dims[t->rank - 1].sym != IR_SYM_NONE ||
                                       t->dims[t->rank - 1].n % ir_dtype_block(t->dtype) != 0))
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': %s rows must hold whole %d-value blocks",
                       t->name, ir_dtype_name(t->dtype), ir_dtype_block(t->dtype));
  if (t->kind == IR_TENSOR_WEIGHT) {
    uint64_t want = ir_tensor_bytes(g, t, NULL);
    if ((!t->data && !t->lazy) || t->nbytes != want)
      return ir_diag_set(d, IR_BAD_FORMAT, "weight '%s': %llu bytes of data, shape needs %llu",
                         t->name, (unsigned long long)t->nbytes, (unsigned long long)want);
  } else if (t->kind == IR_TENSOR_ACT) {
    if (t->producer < 0 || t->producer >= g->n_nodes)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s' has no producer", t->name);
    const ir_node *p = &g->nodes[t->producer];
    bool listed = false;
    for (int k = 0; k < p->n_out && !listed; k++) listed = p->out[k] == i;
    if (!listed)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "tensor '%s' names node '%s' as producer, which does "
                         "not write it",
                         t->name, p->name);
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
      return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': input %d refers to tensor %d of %d", n->name,
                         i, ti, g->n_tensors);
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
    return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': %d outputs, op %s has %d", n->name, n->n_out,
                       ir_op_name(n->op), n_out);
  for (int i = 0; i < n_out; i++) {
    int32_t ti = n->out[i];
    if (ti < 0 || ti >= g->n_tensors || g->tensors[ti].producer != ni)
      return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': output %d is not owned by the node", n->name,
                         i);
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
  if (st == IR_OK && g->n_outputs == 0) st = ir_diag_set(d, IR_BAD_FORMAT, "graph has no outputs");
  return st;
}

/* ---- LLM step programs: the config against the graph ---------------------------------- */

/* The model config's own bounds: what the runtime sizes buffers and the KV cache by. */
static ir_status check_llm_config(const ir_model_config *c, ir_diag *d) {
  if (c->vocab_size <= 0 || c->vocab_size > INT32_MAX)
    return ir_diag_set(d, IR_BAD_FORMAT, "model config: vocab_size %lld is outside 1..2^31-1",
                       (long long)c->vocab_size);
  if (c->n_layers <= 0 || c->n_layers > IR_MAX_LAYERS)
    return ir_diag_set(d, IR_BAD_FORMAT, "model config: n_layers %lld is outside 1..%d",
                       (long long)c->n_layers, IR_MAX_LAYERS);
  if (c->n_heads <= 0 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads || c->n_heads > 4096)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "model config: n_heads %lld must be a positive multiple "
                       "of n_kv_heads %lld (at most 4096)",
                       (long long)c->n_heads, (long long)c->n_kv_heads);
  if (c->head_dim <= 0 || c->head_dim > 256 || c->head_dim % 2)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "model config: head_dim %lld is not an even number in "
                       "2..256",
                       (long long)c->head_dim);
  if (c->max_position <= 0 || c->max_position > INT32_MAX)
    return ir_diag_set(d, IR_BAD_FORMAT, "model config: max_position %lld is outside 1..2^31-1",
                       (long long)c->max_position);
  if (c->max_tokens > (1 << 24) || c->kv_block_size > 4096)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "model config: max_tokens %lld or kv_block_size %lld "
                       "is out of range",
                       (long long)c->max_tokens, (long long)c->kv_block_size);
  return IR_OK;
}

/* tokens[T], positions[T] and logit_rows[L]: the i32 inputs the runtime writes. */
static ir_status check_step_input(const ir_graph *g, const char *name, ir_sym sym, ir_diag *d) {
  for (int32_t i = 0; i < g->n_inputs; i++) {
    const ir_tensor *t = &g->tensors[g->inputs[i]];
    if (strcmp(t->name, name) != 0) continue;
    if (t->dtype != IR_I32 || t->rank != 1 || t->dims[0].sym != sym)
      return ir_diag_set(d, IR_BAD_FORMAT, "input '%s' must be i32[%s]", name, ir_sym_name(sym));
    return IR_OK;
  }
  return ir_diag_set(d, IR_BAD_FORMAT, "the step program has no input '%s'", name);
}

static bool is_input(const ir_graph *g, int32_t t, const char *name) {
  return t >= 0 && t < g->n_tensors && g->tensors[t].kind == IR_TENSOR_INPUT &&
         strcmp(g->tensors[t].name, name) == 0;
}

/* A rope table cs[P, rot/2, 2] must cover every position the config admits. */
static ir_status check_rope_table(const ir_graph *g, const ir_node *n, int k, ir_diag *d) {
  if (n->n_in <= k || n->in[k] < 0) return IR_OK;
  const ir_tensor *cs = &g->tensors[n->in[k]];
  if (cs->rank < 1 || cs->dims[0].sym != IR_SYM_NONE || cs->dims[0].n < g->config.max_position)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "node '%s': the rope table '%s' has %lld rows for "
                       "max_position %lld",
                       n->name, cs->name, (long long)cs->dims[0].n,
                       (long long)g->config.max_position);
  return IR_OK;
}

static ir_status check_attention(const ir_graph *g, const ir_node *n, ir_diag *d) {
  const ir_model_config *c = &g->config;
  const char *names[4] = {"layer", "n_heads", "n_kv_heads", "head_dim"};
  for (int i = 0; i < 4; i++) {
    const ir_attr *a = NULL;
    for (int k = 0; k < n->n_attrs && !a; k++)
      if (!strcmp(n->attrs[k].name, names[i])) a = &n->attrs[k];
    if (!a || a->type != IR_ATTR_INT)
      return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': attribute '%s' must be an integer", n->name,
                         names[i]);
  }
  int64_t layer = ir_node_attr_i(n, "layer", -1);
  if (layer < 0 || layer >= c->n_layers)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "node '%s': layer %lld is outside the config's %lld "
                       "layers",
                       n->name, (long long)layer, (long long)c->n_layers);
  int64_t nh = ir_node_attr_i(n, "n_heads", 0), nkv = ir_node_attr_i(n, "n_kv_heads", 0);
  int64_t hd = ir_node_attr_i(n, "head_dim", 0);
  if (nh != c->n_heads || nkv != c->n_kv_heads || hd != c->head_dim)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "node '%s': %lld heads, %lld kv heads of %lld dims, "
                       "where the config says %lld, %lld, %lld (the KV cache is laid out by the "
                       "config)",
                       n->name, (long long)nh, (long long)nkv, (long long)hd, (long long)c->n_heads,
                       (long long)c->n_kv_heads, (long long)c->head_dim);
  if (g->tensors[n->in[0]].dims[0].sym != IR_SYM_TOKENS)
    return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': q must have T rows", n->name);
  if (n->n_in > 3 && n->in[3] >= 0 && !is_input(g, n->in[3], "positions"))
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "node '%s': the rope's positions must be the input "
                       "'positions'",
                       n->name);
  return check_rope_table(g, n, 4, d);
}

ir_status ir_graph_verify_step(const ir_graph *g, ir_diag *d) {
  bool step = false;
  for (int32_t i = 0; i < g->n_nodes && !step; i++) step = g->nodes[i].op == IR_OP_ATTENTION;
  if (!step) return IR_OK; /* a generic program: ir_graph_verify covers it */
  ir_status st = check_llm_config(&g->config, d);
  if (st == IR_OK) st = check_step_input(g, "tokens", IR_SYM_TOKENS, d);
  if (st == IR_OK) st = check_step_input(g, "positions", IR_SYM_TOKENS, d);
  if (st == IR_OK) st = check_step_input(g, "logit_rows", IR_SYM_LOGITS, d);
  for (int32_t i = 0; st == IR_OK && i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    switch (n->op) {
    case IR_OP_ATTENTION: st = check_attention(g, n, d); break;
    case IR_OP_ROPE:
      if (!is_input(g, n->in[1], "positions"))
        st = ir_diag_set(d, IR_BAD_FORMAT,
                         "node '%s': the rope's positions must be the input "
                         "'positions'",
                         n->name);
      else st = check_rope_table(g, n, 2, d);
      break;
    case IR_OP_EMBED: {
      const ir_tensor *tab = &g->tensors[n->in[1]];
      int64_t tp = g->config.tp_size > 1 ? g->config.tp_size : 1;
      bool vp = ir_node_attr_i(n, "vocab_part", 0) != 0; /* each rank holds its 1/tp of the rows */
      bool part = vp && tp > 1 && tab->dims[0].n * tp == g->config.vocab_size;
      if (!is_input(g, n->in[0], "tokens") || tab->dims[0].sym != IR_SYM_NONE ||
          (!vp && tab->dims[0].n < g->config.vocab_size) || (vp && !part))
        st = ir_diag_set(d, IR_BAD_FORMAT,
                         "node '%s': an embedding of the input 'tokens' "
                         "needs a table of at least vocab_size (%lld) rows",
                         n->name, (long long)g->config.vocab_size);
      break;
    }
    case IR_OP_ALL_REDUCE:
    case IR_OP_ALL_GATHER:
      if (ir_node_attr_i(n, "ranks", 0) != g->config.tp_size)
        st = ir_diag_set(d, IR_BAD_FORMAT,
                         "node '%s': a collective over %lld ranks in a plan of tp_size %d", n->name,
                         (long long)ir_node_attr_i(n, "ranks", 0), g->config.tp_size);
      break;
    case IR_OP_GATHER_ROWS:
      if (!is_input(g, n->in[1], "logit_rows") || g->tensors[n->in[0]].dims[0].sym != IR_SYM_TOKENS)
        st = ir_diag_set(d, IR_BAD_FORMAT,
                         "node '%s': gathers rows of a T-row tensor by the "
                         "input 'logit_rows'",
                         n->name);
      break;
    default: break;
    }
  }
  return st;
}
