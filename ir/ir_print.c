/* ir_print: a readable listing of a graph, used by `infc build --dump-ir` and
 * `infc inspect`. One line per node: outputs = op(inputs) {attributes}. */
#include <inttypes.h>

#include "ir.h"

static void print_tensor_ref(const ir_graph *g, int32_t ti, FILE *f) {
  if (ti < 0) {
    fputs("_", f);
    return;
  }
  const ir_tensor *t = &g->tensors[ti];
  char shape[96];
  ir_tensor_format_shape(t, shape, sizeof shape);
  fprintf(f, "%%%s:%s%s", t->name, ir_dtype_name(t->dtype), shape);
}

static void print_attrs(const ir_node *n, FILE *f) {
  if (!n->n_attrs) return;
  fputs(" {", f);
  for (int i = 0; i < n->n_attrs; i++) {
    const ir_attr *a = &n->attrs[i];
    if (a->type == IR_ATTR_INT) {
      fprintf(f, "%s%s=%" PRId64, i ? ", " : "", a->name, a->i);
    } else if (a->type == IR_ATTR_INTS) {
      fprintf(f, "%s%s=[", i ? ", " : "", a->name);
      for (int64_t k = 0; k < a->i; k++) fprintf(f, "%s%" PRId64, k ? "," : "", a->ints[k]);
      fputc(']', f);
    } else fprintf(f, "%s%s=%g", i ? ", " : "", a->name, a->f);
  }
  fputs("}", f);
}

static void print_config(const ir_model_config *c, FILE *f) {
  fprintf(f,
          "model %s: vocab %" PRId64 ", hidden %" PRId64 ", layers %" PRId64 ", heads %" PRId64
          "/%" PRId64 " kv, head_dim %" PRId64 ", ffn %" PRId64 "\n",
          c->arch, c->vocab_size, c->hidden_size, c->n_layers, c->n_heads, c->n_kv_heads,
          c->head_dim, c->intermediate_size);
  fprintf(f, "step limits: T<=%" PRId64 " S<=%" PRId64 " L<=%" PRId64 ", kv block %" PRId64 "\n",
          c->max_tokens, c->max_seqs, c->max_logits, c->kv_block_size);
  if (c->n_decode_buckets > 0) {
    fprintf(f, "decode graphs:");
    for (int32_t i = 0; i < c->n_decode_buckets; i++)
      fprintf(f, "%s%" PRId64, i ? "," : " ", c->decode_buckets[i]);
    fprintf(f, "\n");
  }
}

void ir_graph_print(const ir_graph *g, FILE *f) {
  print_config(&g->config, f);
  uint64_t wbytes = 0;
  int32_t nw = 0;
  for (int32_t i = 0; i < g->n_tensors; i++)
    if (g->tensors[i].kind == IR_TENSOR_WEIGHT) {
      wbytes += g->tensors[i].nbytes;
      nw++;
    }
  fprintf(f, "weights: %d tensors, %.2f MiB\n", nw, (double)wbytes / (1024.0 * 1024.0));
  for (int32_t i = 0; i < g->n_inputs; i++) {
    fputs("input ", f);
    print_tensor_ref(g, g->inputs[i], f);
    fputc('\n', f);
  }
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    fprintf(f, "%4d  ", i);
    for (int o = 0; o < n->n_out; o++) {
      if (o) fputs(", ", f);
      print_tensor_ref(g, n->out[o], f);
    }
    fprintf(f, " = %s(", ir_op_name(n->op));
    for (int k = 0; k < n->n_in; k++) {
      if (k) fputs(", ", f);
      print_tensor_ref(g, n->in[k], f);
    }
    fputc(')', f);
    print_attrs(n, f);
    fputc('\n', f);
  }
  for (int32_t i = 0; i < g->n_outputs; i++) {
    fputs("output ", f);
    print_tensor_ref(g, g->outputs[i], f);
    fputc('\n', f);
  }
  if (g->arena_size) fprintf(f, "arena: %.2f MiB\n", (double)g->arena_size / (1024.0 * 1024.0));
}
