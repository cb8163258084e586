/* pass_capture_plan: which decode batch sizes get a CUDA Graph. A decode step of n tokens
 * replays the graph of the smallest bucket >= n, padding the batch up to it; more buckets
 * mean less padding but more graphs to capture and keep. The default is powers of two up
 * to the largest decode step the plan allows (that limit itself last). */
#include "pass.h"

#include <stdio.h>

ir_status pass_capture_plan(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  ir_model_config *c = &g->config;
  if (o->decode_buckets) {
    ir_status st = ir_check_decode_buckets(c, o->decode_buckets, o->n_decode_buckets, d);
    if (st != IR_OK) return st;
    c->n_decode_buckets = o->n_decode_buckets;
    for (int32_t i = 0; i < c->n_decode_buckets; i++) c->decode_buckets[i] = o->decode_buckets[i];
  } else {
    c->n_decode_buckets = ir_default_decode_buckets(c, c->decode_buckets);
  }
  char list[IR_MAX_DECODE_BUCKETS * 8 + 1] = "";
  size_t off = 0;
  for (int32_t i = 0; i < c->n_decode_buckets && off < sizeof list; i++)
    off += (size_t)snprintf(list + off, sizeof list - off, "%s%lld", i ? "," : "",
                            (long long)c->decode_buckets[i]);
  pass_log_add(log, "capture_plan: %d decode graphs (batch %s)", (int)c->n_decode_buckets, list);
  return IR_OK;
}
