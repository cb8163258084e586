/* pass_util: the pass log and graph surgery shared by the passes. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "pass.h"
#include "pass_quantize.h"
#include "ir_alloc.h"

void pass_log_add(pass_log *log, const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  char **l = ir_realloc(log->lines, (size_t)(log->n + 1) * sizeof *l);
  if (!l) return;
  log->lines = l;
  if ((l[log->n] = ir_strdup(buf))) log->n++;
}

bool pass_results_line(const pass_results *r, pass_line which, char *buf, size_t len) {
  if (len) buf[0] = '\0';
  switch (which) {
  case PASS_LINE_OPS: {
    char b[200]; /* the length the log has always had */
    int o = snprintf(b, sizeof b, "ops: %d -> %d", r->nodes_before, r->nodes_after);
    const char *sep = " (";
    for (int i = 0; i < r->n_deltas && o < (int)sizeof b; i++) {
      o += snprintf(b + o, sizeof b - (size_t)o, "%s%s %+d", sep, r->deltas[i].pass,
                    r->deltas[i].delta);
      sep = ", ";
    }
    if (o < (int)sizeof b && *sep == ',') snprintf(b + o, sizeof b - (size_t)o, ")");
    snprintf(buf, len, "%s", b);
    return true;
  }
  case PASS_LINE_QUANT: {
    if (!r->quantized) return false;
    char regroup[96] = "", smooth[96] = "";
    if (r->quant.n_regrouped)
      snprintf(regroup, sizeof regroup, " (%d with g%lld: K = %lld%s)", r->quant.n_regrouped,
               (long long)r->quant.regroup_g, (long long)r->quant.regroup_k,
               r->quant.n_regrouped > 1 ? ", ..." : "");
    if (r->quant.n_smoothed)
      snprintf(smooth, sizeof smooth, "; smoothed %d norms (alpha %.2f), f32 activations elsewhere",
               r->quant.n_smoothed, (double)PASS_QUANT_SMOOTH_ALPHA);
    snprintf(buf, len,
             "quantize %s: %d matmul weights%s (%.1fM values) %.1f MiB -> %.1f MiB%s%s%s; "
             "all weights %.1f MiB -> %.1f MiB",
             r->quant.scheme, r->quant.n_done, regroup, (double)r->quant.values / 1e6,
             (double)r->quant.bytes_before / 1048576.0, (double)r->quant.bytes_after / 1048576.0,
             smooth, r->quant.n_kept ? "; kept as built: " : "", r->quant.kept,
             (double)r->quant.all_before / 1048576.0, (double)r->quant.all_after / 1048576.0);
    return true;
  }
  case PASS_LINE_ACT_INT8: {
    if (!r->act_int8_ran) return false;
    char extra[64] = "";
    if (r->act_int8_long)
      snprintf(extra, sizeof extra, "; %d with K > %d keep f32", r->act_int8_long, IR_Q8_ACT_MAX_K);
    snprintf(buf, len, "act_int8: %d q8_0/q4_0/q4_1 matmuls take int8 activations%s",
             r->act_int8_done, extra);
    return true;
  }
  case PASS_LINE_ACT_BF16:
    if (!r->act_bf16_done && !r->act_bf16_attn) return false;
    if (r->act_bf16_blocks)
      snprintf(buf, len,
               "act_bf16: %d matmuls take bf16 activations (%d bf16, %d q8_0/q4_0/q4_1 converted "
               "to bf16 a tile at a time), %d attentions take bf16 products",
               r->act_bf16_done, r->act_bf16_done - r->act_bf16_blocks, r->act_bf16_blocks,
               r->act_bf16_attn);
    else
      snprintf(buf, len,
               "act_bf16: %d bf16 matmuls take bf16 activations, %d attentions take bf16 products",
               r->act_bf16_done, r->act_bf16_attn);
    return true;
  case PASS_LINE_REPACK: {
    if (!r->repack_ran) return false;
    char bf[64] = "";
    if (r->repack_bf16) /* (only then: the line of other plans keeps its bytes) */
      snprintf(bf, sizeof bf, " (%d of them bf16, by 16 rows)", r->repack_bf16);
    snprintf(buf, len, "repack: %d weights (%.1f MiB) interleaved by 8 rows%s%s", r->repack_done,
             (double)r->repack_bytes / 1048576.0, bf,
             r->repack_some_kept ? "; some kept (other readers or shapes)" : "");
    return true;
  }
  }
  return false;
}

void pass_log_free(pass_log *log) {
  for (int i = 0; i < log->n; i++) ir_free(log->lines[i]);
  ir_free(log->lines);
  log->lines = NULL;
  log->n = 0;
}

void pass_replace_uses(ir_graph *g, int32_t from, int32_t to) {
  for (int32_t i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].in[k] == from) g->nodes[i].in[k] = to;
  for (int32_t i = 0; i < g->n_outputs; i++)
    if (g->outputs[i] == from) g->outputs[i] = to;
}

int pass_count_uses(const ir_graph *g, int32_t t, int32_t *out_user) {
  int uses = 0;
  int32_t user = -1;
  for (int32_t i = 0; i < g->n_nodes; i++)
    for (int k = 0; k < g->nodes[i].n_in; k++)
      if (g->nodes[i].in[k] == t) uses++, user = i;
  for (int32_t i = 0; i < g->n_outputs; i++) uses += g->outputs[i] == t;
  if (out_user) *out_user = user;
  return uses;
}

unsigned pass_fusion_from_name(const char *name) {
  static const struct {
    const char *name;
    unsigned bit;
  } k[] = {{"rope_attention", PASS_FUSE_ROPE_ATTENTION},
           {"qkv", PASS_FUSE_QKV},
           {"gate_up", PASS_FUSE_GATE_UP},
           {"add_rms_norm", PASS_FUSE_ADD_RMS_NORM}};
  if (!strncmp(name, "fuse_", 5)) name += 5;
  for (size_t i = 0; i < sizeof k / sizeof *k; i++)
    if (!strcmp(name, k[i].name)) return k[i].bit;
  return 0;
}

static void mark_used(const ir_graph *g, const bool *dead, bool *used) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    if (dead && dead[i]) continue;
    const ir_node *n = &g->nodes[i];
    for (int k = 0; k < n->n_in; k++)
      if (n->in[k] >= 0) used[n->in[k]] = true;
    for (int k = 0; k < n->n_out; k++) used[n->out[k]] = true;
  }
  for (int32_t i = 0; i < g->n_inputs; i++) used[g->inputs[i]] = true;
  for (int32_t i = 0; i < g->n_outputs; i++) used[g->outputs[i]] = true;
}

static void remap_ids(int32_t *ids, int n, const int32_t *map) {
  for (int k = 0; k < n; k++)
    if (ids[k] >= 0) ids[k] = map[ids[k]];
}

bool pass_compact(ir_graph *g, const bool *dead, int32_t *out_nodes_removed,
                  int32_t *out_tensors_removed) {
  bool *used = ir_calloc((size_t)g->n_tensors + 1, sizeof *used);
  int32_t *tmap = ir_malloc(((size_t)g->n_tensors + 1) * sizeof *tmap);
  int32_t *nmap = ir_malloc(((size_t)g->n_nodes + 1) * sizeof *nmap);
  if (!used || !tmap || !nmap) {
    ir_free(used), ir_free(tmap), ir_free(nmap);
    return false;
  }
  mark_used(g, dead, used);
  int32_t nt = 0, nn = 0;
  for (int32_t i = 0; i < g->n_tensors; i++) {
    if (!used[i]) {
      ir_free(g->tensors[i].name);
      tmap[i] = -1;
      continue;
    }
    tmap[i] = nt;
    g->tensors[nt++] = g->tensors[i];
  }
  for (int32_t i = 0; i < g->n_nodes; i++) {
    if (dead && dead[i]) {
      ir_free(g->nodes[i].name);
      nmap[i] = -1;
      continue;
    }
    nmap[i] = nn;
    g->nodes[nn++] = g->nodes[i];
  }
  for (int32_t i = 0; i < nn; i++) {
    remap_ids(g->nodes[i].in, g->nodes[i].n_in, tmap);
    remap_ids(g->nodes[i].out, g->nodes[i].n_out, tmap);
  }
  for (int32_t i = 0; i < nt; i++)
    if (g->tensors[i].producer >= 0) g->tensors[i].producer = nmap[g->tensors[i].producer];
  remap_ids(g->inputs, g->n_inputs, tmap);
  remap_ids(g->outputs, g->n_outputs, tmap);
  if (out_nodes_removed) *out_nodes_removed = g->n_nodes - nn;
  if (out_tensors_removed) *out_tensors_removed = g->n_tensors - nt;
  g->n_tensors = nt;
  g->n_nodes = nn;
  ir_free(used), ir_free(tmap), ir_free(nmap);
  return true;
}
