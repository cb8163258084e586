/* pass_util: the pass log and graph surgery shared by the passes. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "pass.h"
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
