/* ir_plan_read: maps a model.plan, checks it, and rebuilds the graph with weights
 * pointing into the mapping. Every offset, size and index is checked before use. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ir_file.h"
#include "ir_plan.h"
#include "ir_plan_kernels.h"
#include "plan.pb-c.h"
#include "ir_alloc.h"
#include "ir_profile.h"

struct ir_plan {
  const uint8_t *map;
  size_t map_size;
  ir_plan_header header;
  Infc__Plan__Plan *meta;
  ir_graph *graph;
  ir_plan_kernel *kernels; /* (n_kernels), data in the mapping */
  int n_kernels;
  int tp_size;         /* ranks the plan holds (1: a plain plan) */
  uint64_t rank_base;  /* the opened rank's block, from the weights section's start */
  uint64_t rank_bytes; /* its size: the whole section for a plain plan */
};

static ir_status map_file(const char *path, ir_plan *p, ir_diag *d) {
  int fd;
  uint64_t size;
  ir_status st = ir_file_open(path, &fd, &size, d);
  if (st != IR_OK) return st;
  if (size < sizeof(ir_plan_header)) {
    close(fd);
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "not a plan file: %llu bytes is shorter than a plan header",
                       (unsigned long long)size);
  }
  void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return ir_diag_set(d, IR_IO, "mmap failed: %s", strerror(errno));
  p->map = m;
  p->map_size = (size_t)size;
  return IR_OK;
}

static bool in_file(uint64_t off, uint64_t size, uint64_t file) {
  return off <= file && size <= file - off;
}

static ir_status check_header(ir_plan *p, ir_diag *d) {
  ir_plan_header *h = &p->header;
  memcpy(h, p->map, sizeof *h);
  if (memcmp(h->magic, IR_PLAN_MAGIC, 8) != 0)
    return ir_diag_set(d, IR_BAD_FORMAT, "not a plan file (bad magic)");
  if (h->version_major != IR_PLAN_VERSION_MAJOR)
    return ir_diag_set(d, IR_VERSION,
                       "plan format version %u.%u is not supported (this build reads %d.x); "
                       "rebuild the plan with this version of infc",
                       h->version_major, h->version_minor, IR_PLAN_VERSION_MAJOR);
  if (XXH3_64bits(h, offsetof(ir_plan_header, header_hash)) != h->header_hash)
    return ir_diag_set(d, IR_BAD_FORMAT, "header checksum mismatch (corrupt plan)");
  if (h->file_size != p->map_size)
    return ir_diag_set(d, IR_BAD_FORMAT, "file is %zu bytes but the header says %llu (%s)",
                       p->map_size, (unsigned long long)h->file_size,
                       p->map_size < h->file_size ? "truncated" : "trailing data");
  if (!in_file(h->meta_offset, h->meta_size, p->map_size) ||
      !in_file(h->weights_offset, h->weights_size, p->map_size) ||
      !in_file(h->kernels_offset, h->kernels_size, p->map_size) ||
      h->weights_offset % IR_PLAN_SECTION_ALIGN)
    return ir_diag_set(d, IR_BAD_FORMAT, "section offsets outside the file");
  if (XXH3_64bits(p->map + h->meta_offset, h->meta_size) != h->meta_hash)
    return ir_diag_set(d, IR_BAD_FORMAT, "metadata checksum mismatch (corrupt plan)");
  return IR_OK;
}

/* The weights (all of them, or one rank's block: rank >= 0 of a tensor-parallel plan) and
 * the kernels against their checksums. */
static ir_status check_sections(ir_plan *p, int rank, ir_diag *d) {
  const ir_plan_header *h = &p->header;
  if (rank >= 0 && p->tp_size > 1) {
    if (XXH3_64bits(p->map + h->weights_offset + p->rank_base, p->rank_bytes) !=
        p->meta->rank_weights_hash[rank])
      return ir_diag_set(d, IR_BAD_FORMAT, "rank %d's weights checksum mismatch (corrupt plan)",
                         rank);
  } else if (XXH3_64bits(p->map + h->weights_offset, h->weights_size) != h->weights_hash) {
    return ir_diag_set(d, IR_BAD_FORMAT, "weights checksum mismatch (corrupt plan)");
  }
  if (XXH3_64bits(p->map + h->kernels_offset, h->kernels_size) != h->kernels_hash)
    return ir_diag_set(d, IR_BAD_FORMAT, "kernels checksum mismatch (corrupt plan)");
  return IR_OK;
}

static ir_status read_config(ir_model_config *c, const Infc__Plan__ModelConfig *o, ir_diag *d) {
  snprintf(c->arch, sizeof c->arch, "%s", o->arch ? o->arch : "");
  c->vocab_size = o->vocab_size;
  c->hidden_size = o->hidden_size;
  c->n_layers = o->n_layers;
  c->n_heads = o->n_heads;
  c->n_kv_heads = o->n_kv_heads;
  c->head_dim = o->head_dim;
  c->intermediate_size = o->intermediate_size;
  c->max_position = o->max_position;
  c->rms_norm_eps = o->rms_norm_eps;
  c->rope_theta = o->rope_theta;
  c->tie_word_embeddings = o->tie_word_embeddings;
  c->attention_bias = o->attention_bias;
  c->bos_token_id = o->bos_token_id;
  c->eos_token_id = o->eos_token_id;
  c->max_tokens = o->max_tokens;
  c->max_seqs = o->max_seqs;
  c->max_logits = o->max_logits;
  c->kv_block_size = o->kv_block_size;
  if (o->n_decode_buckets > IR_MAX_DECODE_BUCKETS)
    return ir_diag_set(d, IR_BAD_FORMAT, "model config: %zu decode buckets (at most %d)",
                       o->n_decode_buckets, IR_MAX_DECODE_BUCKETS);
  c->n_decode_buckets = (int32_t)o->n_decode_buckets;
  for (size_t i = 0; i < o->n_decode_buckets; i++) c->decode_buckets[i] = o->decode_buckets[i];
  if (o->tp_size < 0 || o->tp_size > IR_MAX_TP)
    return ir_diag_set(d, IR_BAD_FORMAT, "model config: tp_size %d is outside 0..%d",
                       (int)o->tp_size, IR_MAX_TP);
  c->tp_size = o->tp_size;
  return IR_OK;
}

static ir_status read_tensor(ir_plan *p, const Infc__Plan__Tensor *o, ir_diag *d) {
  ir_graph *g = p->graph;
  if (o->n_dims > IR_MAX_RANK)
    return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': rank %zu too large", o->name, o->n_dims);
  ir_dim dims[IR_MAX_RANK];
  for (size_t k = 0; k < o->n_dims; k++)
    dims[k] = (ir_dim){.n = o->dims[k]->n, .sym = (ir_sym)o->dims[k]->sym};
  int32_t id = ir_graph_add_tensor(g, o->name, (ir_dtype)o->dtype, (int)o->n_dims, dims,
                                   (ir_tensor_kind)o->kind);
  if (id < 0) return ir_diag_set(d, IR_OOM, "out of memory");
  ir_tensor *t = &g->tensors[id];
  t->arena_offset = o->arena_offset;
  t->producer = o->producer;
  if (t->kind == IR_TENSOR_WEIGHT) {
    if (!in_file(o->data_offset, o->data_size, p->rank_bytes) ||
        o->data_offset % IR_PLAN_WEIGHT_ALIGN)
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s': data outside the weights section",
                         o->name);
    t->data = p->map + p->header.weights_offset + p->rank_base + o->data_offset;
    t->nbytes = o->data_size;
  }
  return IR_OK;
}

static ir_status read_node(ir_plan *p, const Infc__Plan__Node *o, ir_diag *d) {
  ir_graph *g = p->graph;
  if (o->n_inputs > IR_MAX_IO || o->n_outputs > IR_MAX_IO || o->n_attrs > IR_MAX_ATTRS)
    return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': too many inputs, outputs or attributes",
                       o->name);
  ir_node n = {.op = (ir_op)o->op,
               .n_in = (int)o->n_inputs,
               .n_out = (int)o->n_outputs,
               .n_attrs = (int)o->n_attrs};
  if (o->n_inputs) memcpy(n.in, o->inputs, o->n_inputs * sizeof(int32_t));
  if (o->n_outputs) memcpy(n.out, o->outputs, o->n_outputs * sizeof(int32_t));
  for (size_t k = 0; k < o->n_attrs; k++) {
    const char *nm = ir_attr_intern(o->attrs[k]->name);
    if (!nm)
      return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': unknown attribute '%s'", o->name,
                         o->attrs[k]->name);
    n.attrs[k] = (ir_attr){.name = nm,
                           .type = (ir_attr_type)o->attrs[k]->type,
                           .i = o->attrs[k]->i,
                           .f = o->attrs[k]->f};
    if (n.attrs[k].type == IR_ATTR_INTS) { /* the values stay in the decoded metadata */
      size_t cnt = o->attrs[k]->n_ints;
      if (cnt > IR_MAX_ATTR_INTS || (int64_t)cnt != o->attrs[k]->i)
        return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': bad int list '%s'", o->name, nm);
      n.attrs[k].ints = o->attrs[k]->ints;
    } else if (n.attrs[k].type != IR_ATTR_INT && n.attrs[k].type != IR_ATTR_FLOAT) {
      return ir_diag_set(d, IR_BAD_FORMAT, "node '%s': attribute '%s' has unknown type %u", o->name,
                         nm, o->attrs[k]->type);
    }
  }
  ir_node *slot = ir_realloc(g->nodes, (size_t)(g->n_nodes + 1) * sizeof(ir_node));
  if (!slot || !(n.name = ir_strdup(o->name))) {
    if (slot) g->nodes = slot;
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  g->nodes = slot;
  g->cap_nodes = g->n_nodes + 1;
  g->nodes[g->n_nodes++] = n;
  return IR_OK;
}

static ir_status read_affine(const Infc__Plan__Affine *o, int n_syms, bool attr, ir_affine *a,
                             ir_diag *d) {
  memset(a, 0, sizeof *a);
  if (o->n_coef != (size_t)n_syms)
    return ir_diag_set(d, IR_BAD_FORMAT, "shape profile: %zu coefficients for %d symbols",
                       o->n_coef, n_syms);
  a->at = o->at;
  a->index = o->index;
  a->off = o->off;
  for (int k = 0; k < n_syms; k++) a->coef[k] = o->coef[k];
  if (attr && !(a->attr = ir_attr_intern(o->attr)))
    return ir_diag_set(d, IR_BAD_FORMAT, "shape profile: unknown attribute '%s'", o->attr);
  return IR_OK;
}

static ir_status read_profile(ir_graph *g, const Infc__Plan__Profile *o, ir_diag *d) {
  if (o->n_syms < 1 || o->n_syms > IR_MAX_PROFILE_SYMS || o->n_dims > (size_t)1 << 24 ||
      o->n_attrs > (size_t)1 << 24)
    return ir_diag_set(d, IR_BAD_FORMAT, "shape profile: %zu symbols", o->n_syms);
  ir_profile *p = ir_calloc(1, sizeof *p);
  if (!p) return ir_diag_set(d, IR_OOM, "out of memory");
  g->profile = p;
  p->n_syms = (int)o->n_syms;
  for (int k = 0; k < p->n_syms; k++) {
    snprintf(p->syms[k].name, sizeof p->syms[k].name, "%s", o->syms[k]->name);
    p->syms[k].min = o->syms[k]->min;
    p->syms[k].max = o->syms[k]->max;
  }
  p->dims = ir_calloc(o->n_dims + 1, sizeof *p->dims);
  p->attrs = ir_calloc(o->n_attrs + 1, sizeof *p->attrs);
  if (!p->dims || !p->attrs) return ir_diag_set(d, IR_OOM, "out of memory");
  ir_status st = IR_OK;
  for (size_t i = 0; st == IR_OK && i < o->n_dims; i++, p->n_dims++)
    st = read_affine(o->dims[i], p->n_syms, false, &p->dims[i], d);
  for (size_t i = 0; st == IR_OK && i < o->n_attrs; i++, p->n_attrs++)
    st = read_affine(o->attrs[i], p->n_syms, true, &p->attrs[i], d);
  return st;
}

static ir_status read_graph(ir_plan *p, ir_diag *d) {
  const Infc__Plan__Plan *m = p->meta;
  if (!m->config) return ir_diag_set(d, IR_BAD_FORMAT, "plan has no model config");
  if (!(p->graph = ir_graph_create())) return ir_diag_set(d, IR_OOM, "out of memory");
  ir_status st = read_config(&p->graph->config, m->config, d);
  for (size_t i = 0; st == IR_OK && i < m->n_tensors; i++) st = read_tensor(p, m->tensors[i], d);
  for (size_t i = 0; st == IR_OK && i < m->n_nodes; i++) st = read_node(p, m->nodes[i], d);
  for (size_t i = 0; st == IR_OK && i < m->n_inputs; i++) {
    int32_t ti = m->inputs[i];
    if (ti < 0 || ti >= p->graph->n_tensors)
      return ir_diag_set(d, IR_BAD_FORMAT, "graph input %zu out of range", i);
    int32_t *in = ir_realloc(p->graph->inputs, (i + 1) * sizeof *in);
    if (!in) return ir_diag_set(d, IR_OOM, "out of memory");
    p->graph->inputs = in;
    in[p->graph->n_inputs++] = ti;
  }
  for (size_t i = 0; st == IR_OK && i < m->n_outputs; i++)
    if (!ir_graph_add_output(p->graph, m->outputs[i])) st = ir_diag_set(d, IR_OOM, "out of memory");
  p->graph->arena_size = m->arena_size;
  if (st == IR_OK && m->profile) st = read_profile(p->graph, m->profile, d);
  if (st == IR_OK) st = ir_graph_verify(p->graph, d);
  if (st == IR_OK) st = ir_profile_verify(p->graph, d);
  return st == IR_OK ? ir_graph_verify_step(p->graph, d) : st;
}

/* The ranks of the plan and the block of rank `rank` (-1: rank 0's, for a whole-file
 * reader), checked against the section before any tensor points into it. */
static ir_status read_ranks(ir_plan *p, int rank, ir_diag *d) {
  const Infc__Plan__Plan *m = p->meta;
  int tp = m->config && m->config->tp_size > 1 ? m->config->tp_size : 1;
  p->tp_size = tp;
  p->rank_base = 0;
  p->rank_bytes = p->header.weights_size;
  if (rank >= tp)
    return ir_diag_set(d, IR_INVALID_ARG,
                       "rank %d: the plan is built for %d tensor-parallel rank%s", rank, tp,
                       tp == 1 ? "" : "s");
  if (tp == 1) return IR_OK;
  if (tp > IR_MAX_TP || m->n_rank_weights_hash != (size_t)tp || !m->rank_stride ||
      m->rank_stride % IR_PLAN_SECTION_ALIGN ||
      m->rank_stride > p->header.weights_size / (uint64_t)tp ||
      m->rank_stride * (uint64_t)tp != p->header.weights_size)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tensor-parallel plan of %d ranks: rank blocks do not tile the weights "
                       "section",
                       tp);
  p->rank_bytes = m->rank_stride;
  p->rank_base = (uint64_t)(rank < 0 ? 0 : rank) * m->rank_stride;
  return IR_OK;
}

ir_status ir_plan_open_rank(const char *path, ir_plan_verify verify, int rank, ir_plan **out,
                            ir_diag *d) {
  *out = NULL;
  ir_plan *p = ir_calloc(1, sizeof *p);
  if (!p) return ir_diag_set(d, IR_OOM, "out of memory");
  ir_status st = map_file(path, p, d);
  if (st == IR_OK) st = check_header(p, d);
  if (st == IR_OK) {
    unsigned long fails = ir_alloc_failures();
    p->meta =
        infc__plan__plan__unpack(&ir_pb_alloc, p->header.meta_size, p->map + p->header.meta_offset);
    if (!p->meta)
      st = ir_alloc_failed_since(fails) ? ir_diag_set(d, IR_OOM, "out of memory")
                                        : ir_diag_set(d, IR_BAD_FORMAT, "metadata does not decode");
  }
  if (st == IR_OK) st = read_ranks(p, rank, d);
  if (st == IR_OK && verify == IR_PLAN_VERIFY_ALL) st = check_sections(p, rank, d);
  if (st == IR_OK) st = read_graph(p, d);
  if (st == IR_OK)
    st = ir_plan_kernels_read(p->meta, p->map + p->header.kernels_offset, p->header.kernels_size,
                              &p->kernels, &p->n_kernels, d);
  if (st != IR_OK) {
    ir_diag_prefix(d, "%s", path);
    ir_plan_close(p);
    return st;
  }
  *out = p;
  return IR_OK;
}

ir_status ir_plan_open(const char *path, ir_plan_verify verify, ir_plan **out, ir_diag *d) {
  return ir_plan_open_rank(path, verify, -1, out, d);
}

int ir_plan_tp_size(const ir_plan *p) { return p->tp_size; }

void ir_plan_close(ir_plan *p) {
  if (!p) return;
  ir_graph_destroy(p->graph);
  ir_free(p->kernels);
  if (p->meta) infc__plan__plan__free_unpacked(p->meta, &ir_pb_alloc);
  if (p->map) munmap((void *)p->map, p->map_size);
  ir_free(p);
}

const ir_graph *ir_plan_graph(const ir_plan *p) { return p->graph; }
const void *ir_plan_weights(const ir_plan *p, uint64_t *out_bytes) {
  *out_bytes = p->rank_bytes;
  return p->map + p->header.weights_offset + p->rank_base;
}

const ir_plan_header *ir_plan_get_header(const ir_plan *p) { return &p->header; }
const char *ir_plan_producer(const ir_plan *p) { return p->meta->producer; }
const char *ir_plan_target(const ir_plan *p) { return p->meta->target; }
const char *ir_plan_source_hash(const ir_plan *p) { return p->meta->source_hash; }
int ir_plan_n_options(const ir_plan *p) { return (int)p->meta->n_options; }
void ir_plan_option(const ir_plan *p, int i, const char **out_key, const char **out_value) {
  *out_key = p->meta->options[i]->key;
  *out_value = p->meta->options[i]->value;
}
int ir_plan_n_pass_log(const ir_plan *p) { return (int)p->meta->n_pass_log; }
const uint8_t *ir_plan_tokenizer(const ir_plan *p, size_t *out_size) {
  *out_size = p->meta->tokenizer.len;
  return p->meta->tokenizer.len ? p->meta->tokenizer.data : NULL;
}
const char *ir_plan_pass_log(const ir_plan *p, int i) { return p->meta->pass_log[i]; }
int ir_plan_n_kernels(const ir_plan *p) { return p->n_kernels; }
const ir_plan_kernel *ir_plan_kernel_at(const ir_plan *p, int i) { return &p->kernels[i]; }
const ir_plan_kernel *ir_plan_find_kernel(const ir_plan *p, const char *name, uint32_t arch,
                                          ir_plan_kernel_kind kind) {
  for (int i = 0; i < p->n_kernels; i++) {
    const ir_plan_kernel *k = &p->kernels[i];
    if (k->arch == arch && k->kind == (uint32_t)kind && !strcmp(k->name, name)) return k;
  }
  return NULL;
}
