/* pass_capture_plan: which decode batch sizes get a CUDA Graph. A decode step of n tokens
 * replays the graph of the smallest bucket >= n, padding the batch up to it; more buckets
 * mean less padding but more graphs to capture and keep. The default is powers of two up
 * to the largest decode step the plan allows (that limit itself last). */
#include "pass.h"

#include <stdio.h>

ir_status pass_capture_plan(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d) {
  ir_model_config *c = &g->config;
  int64_t cap = c->max_tokens;
  if (c->max_seqs < cap) cap = c->max_seqs;
  if (c->max_logits < cap) cap = c->max_logits;
  int64_t b[IR_MAX_DECODE_BUCKETS];
  int32_t n = 0;
  if (o->decode_buckets) {
    ir_status st = ir_check_decode_buckets(c, o->decode_buckets, o->n_decode_buckets, d);
    if (st != IR_OK) return st;
    for (n = 0; n < o->n_decode_buckets; n++) b[n] = o->decode_buckets[n];
  } else {
    for (int64_t v = 1; v < cap && n < IR_MAX_DECODE_BUCKETS - 1; v *= 2) b[n++] = v;
    if (cap >= 1) b[n++] = cap;
  }
  c->n_decode_buckets = n;
  char list[IR_MAX_DECODE_BUCKETS * 8 + 1] = "";
  size_t off = 0;
  for (int32_t i = 0; i < n; i++) {
    c->decode_buckets[i] = b[i];
    off += (size_t)snprintf(list + off, sizeof list - off, "%s%lld", i ? "," : "",
                            (long long)b[i]);
    if (off >= sizeof list) break;
  }
  pass_log_add(log, "capture_plan: %d decode graphs (batch %s)", (int)n, list);
  return IR_OK;
}
