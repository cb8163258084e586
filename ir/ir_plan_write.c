/* ir_plan_write: serialises a graph into a model.plan file (layout in ir_plan.h).
 * Deterministic: the bytes depend only on the graph and the info strings. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ir_plan.h"
#include "ir_lazy.h"
#include "ir_plan_kernels.h"
#include "plan.pb-c.h"
#include "ir_alloc.h"

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Scratch for the protobuf message: all arrays allocated together, freed together. */
typedef struct meta_build {
  Infc__Plan__Plan plan;
  Infc__Plan__ModelConfig cfg;
  Infc__Plan__Tensor *tensors;
  Infc__Plan__Tensor **tensor_ptrs;
  Infc__Plan__Dim *dims;
  Infc__Plan__Dim **dim_ptrs;
  Infc__Plan__Node *nodes;
  Infc__Plan__Node **node_ptrs;
  Infc__Plan__Attr *attrs;
  Infc__Plan__Attr **attr_ptrs;
  Infc__Plan__BuildOption *opts;
  Infc__Plan__BuildOption **opt_ptrs;
  Infc__Plan__Profile profile;
  Infc__Plan__ShapeSym syms[IR_MAX_PROFILE_SYMS];
  Infc__Plan__ShapeSym *sym_ptrs[IR_MAX_PROFILE_SYMS];
  Infc__Plan__Affine *affs;
  Infc__Plan__Affine **aff_ptrs;
} meta_build;

static void meta_free(meta_build *m) {
  ir_free(m->tensors);
  ir_free(m->tensor_ptrs);
  ir_free(m->dims);
  ir_free(m->dim_ptrs);
  ir_free(m->nodes);
  ir_free(m->node_ptrs);
  ir_free(m->attrs);
  ir_free(m->attr_ptrs);
  ir_free(m->opts);
  ir_free(m->opt_ptrs);
  ir_free(m->affs);
  ir_free(m->aff_ptrs);
}

/* The dynamic-shape profile, when the graph has one. */
static void fill_profile(meta_build *m, const ir_graph *g) {
  const ir_profile *p = g->profile;
  if (!p) return;
  infc__plan__profile__init(&m->profile);
  for (int k = 0; k < p->n_syms; k++) {
    infc__plan__shape_sym__init(&m->syms[k]);
    m->syms[k].name = (char *)p->syms[k].name;
    m->syms[k].min = p->syms[k].min;
    m->syms[k].max = p->syms[k].max;
    m->sym_ptrs[k] = &m->syms[k];
  }
  m->profile.n_syms = (size_t)p->n_syms;
  m->profile.syms = m->sym_ptrs;
  for (int32_t i = 0; i < p->n_dims + p->n_attrs; i++) {
    const ir_affine *a = i < p->n_dims ? &p->dims[i] : &p->attrs[i - p->n_dims];
    Infc__Plan__Affine *o = &m->affs[i];
    infc__plan__affine__init(o);
    o->at = a->at;
    o->index = a->index;
    o->attr = (char *)(i < p->n_dims ? "" : a->attr);
    o->n_coef = (size_t)p->n_syms;
    o->coef = (int64_t *)a->coef;
    o->off = a->off;
    m->aff_ptrs[i] = o;
  }
  m->profile.n_dims = (size_t)p->n_dims;
  m->profile.dims = m->aff_ptrs;
  m->profile.n_attrs = (size_t)p->n_attrs;
  m->profile.attrs = m->aff_ptrs + p->n_dims;
  m->plan.profile = &m->profile;
}

static void fill_config(Infc__Plan__ModelConfig *o, const ir_model_config *c) {
  infc__plan__model_config__init(o);
  o->arch = (char *)c->arch;
  o->vocab_size = c->vocab_size;
  o->hidden_size = c->hidden_size;
  o->n_layers = c->n_layers;
  o->n_heads = c->n_heads;
  o->n_kv_heads = c->n_kv_heads;
  o->head_dim = c->head_dim;
  o->intermediate_size = c->intermediate_size;
  o->max_position = c->max_position;
  o->rms_norm_eps = c->rms_norm_eps;
  o->rope_theta = c->rope_theta;
  o->tie_word_embeddings = c->tie_word_embeddings;
  o->attention_bias = c->attention_bias;
  o->bos_token_id = c->bos_token_id;
  o->eos_token_id = c->eos_token_id;
  o->max_tokens = c->max_tokens;
  o->max_seqs = c->max_seqs;
  o->max_logits = c->max_logits;
  o->kv_block_size = c->kv_block_size;
  o->n_decode_buckets = (size_t)c->n_decode_buckets;
  o->decode_buckets = (int64_t *)c->decode_buckets; /* read only by the packer */
  o->tp_size = c->tp_size;
}

/* Tensors and dims; weight offsets assigned in tensor order, 64-byte aligned. */
static uint64_t fill_tensors(meta_build *m, const ir_graph *g) {
  uint64_t off = 0;
  size_t di = 0;
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const ir_tensor *t = &g->tensors[i];
    Infc__Plan__Tensor *o = &m->tensors[i];
    infc__plan__tensor__init(o);
    o->name = t->name;
    o->dtype = (uint32_t)t->dtype;
    o->kind = (uint32_t)t->kind;
    o->arena_offset = t->arena_offset;
    o->producer = t->producer;
    o->n_dims = (size_t)t->rank;
    o->dims = &m->dim_ptrs[di];
    for (int k = 0; k < t->rank; k++, di++) {
      infc__plan__dim__init(&m->dims[di]);
      m->dims[di].n = t->dims[k].n;
      m->dims[di].sym = (uint32_t)t->dims[k].sym;
      m->dim_ptrs[di] = &m->dims[di];
    }
    if (t->kind == IR_TENSOR_WEIGHT) {
      off = align_up(off, IR_PLAN_WEIGHT_ALIGN);
      o->data_offset = off;
      o->data_size = t->nbytes;
      off += t->nbytes;
    }
    m->tensor_ptrs[i] = o;
  }
  return off;
}

static void fill_nodes(meta_build *m, const ir_graph *g) {
  size_t ai = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    Infc__Plan__Node *o = &m->nodes[i];
    infc__plan__node__init(o);
    o->op = (uint32_t)n->op;
    o->name = n->name;
    o->n_inputs = (size_t)n->n_in;
    o->inputs = (int32_t *)n->in;
    o->n_outputs = (size_t)n->n_out;
    o->outputs = (int32_t *)n->out;
    o->n_attrs = (size_t)n->n_attrs;
    o->attrs = &m->attr_ptrs[ai];
    for (int k = 0; k < n->n_attrs; k++, ai++) {
      Infc__Plan__Attr *a = &m->attrs[ai];
      infc__plan__attr__init(a);
      a->name = (char *)n->attrs[k].name;
      a->type = (uint32_t)n->attrs[k].type;
      a->i = n->attrs[k].i;
      a->f = n->attrs[k].f;
      if (n->attrs[k].type == IR_ATTR_INTS) {
        a->n_ints = (size_t)n->attrs[k].i;
        a->ints = (int64_t *)n->attrs[k].ints;
      }
      m->attr_ptrs[ai] = a;
    }
    m->node_ptrs[i] = o;
  }
}

static bool meta_alloc(meta_build *m, const ir_graph *g, int n_opts) {
  size_t nd = 0, na = 0;
  for (int32_t i = 0; i < g->n_tensors; i++) nd += (size_t)g->tensors[i].rank;
  for (int32_t i = 0; i < g->n_nodes; i++) na += (size_t)g->nodes[i].n_attrs;
  size_t nt = (size_t)g->n_tensors, nn = (size_t)g->n_nodes, no = (size_t)n_opts;
  m->tensors = ir_calloc(nt + 1, sizeof *m->tensors);
  m->tensor_ptrs = ir_calloc(nt + 1, sizeof *m->tensor_ptrs);
  m->dims = ir_calloc(nd + 1, sizeof *m->dims);
  m->dim_ptrs = ir_calloc(nd + 1, sizeof *m->dim_ptrs);
  m->nodes = ir_calloc(nn + 1, sizeof *m->nodes);
  m->node_ptrs = ir_calloc(nn + 1, sizeof *m->node_ptrs);
  m->attrs = ir_calloc(na + 1, sizeof *m->attrs);
  m->attr_ptrs = ir_calloc(na + 1, sizeof *m->attr_ptrs);
  m->opts = ir_calloc(no + 1, sizeof *m->opts);
  m->opt_ptrs = ir_calloc(no + 1, sizeof *m->opt_ptrs);
  size_t np = g->profile ? (size_t)(g->profile->n_dims + g->profile->n_attrs) : 0;
  m->affs = ir_calloc(np + 1, sizeof *m->affs);
  m->aff_ptrs = ir_calloc(np + 1, sizeof *m->aff_ptrs);
  return m->affs && m->aff_ptrs && m->tensors && m->tensor_ptrs && m->dims && m->dim_ptrs &&
         m->nodes && m->node_ptrs && m->attrs && m->attr_ptrs && m->opts && m->opt_ptrs;
}

static uint64_t meta_fill(meta_build *m, const ir_graph *g, const ir_plan_info *info) {
  infc__plan__plan__init(&m->plan);
  fill_config(&m->cfg, &g->config);
  m->plan.producer = "infc " INFC_VERSION;
  m->plan.config = &m->cfg;
  uint64_t wsize = fill_tensors(m, g);
  fill_nodes(m, g);
  m->plan.n_tensors = (size_t)g->n_tensors;
  m->plan.tensors = m->tensor_ptrs;
  m->plan.n_nodes = (size_t)g->n_nodes;
  m->plan.nodes = m->node_ptrs;
  m->plan.n_inputs = (size_t)g->n_inputs;
  m->plan.inputs = g->inputs;
  m->plan.n_outputs = (size_t)g->n_outputs;
  m->plan.outputs = g->outputs;
  m->plan.arena_size = g->arena_size;
  m->plan.target = (char *)(info && info->target ? info->target : "cpu");
  m->plan.source_hash = (char *)(info && info->source_hash ? info->source_hash : "");
  int no = info ? info->n_options : 0;
  for (int i = 0; i < no; i++) {
    infc__plan__build_option__init(&m->opts[i]);
    m->opts[i].key = (char *)info->option_keys[i];
    m->opts[i].value = (char *)info->option_values[i];
    m->opt_ptrs[i] = &m->opts[i];
  }
  fill_profile(m, g);
  m->plan.n_options = (size_t)no;
  m->plan.options = m->opt_ptrs;
  m->plan.n_pass_log = info ? (size_t)info->n_pass_log : 0;
  m->plan.pass_log = info ? (char **)info->pass_log : NULL;
  if (info && info->tokenizer) {
    m->plan.tokenizer.data = (uint8_t *)info->tokenizer;
    m->plan.tokenizer.len = info->tokenizer_size;
  }
  return wsize;
}

/* n zero bytes into f (when set) and the hash h (when set). */
static bool write_zeros(FILE *f, uint64_t n, XXH3_state_t *h) {
  static const uint8_t zeros[4096];
  while (n) {
    size_t c = n < sizeof zeros ? (size_t)n : sizeof zeros;
    if (f && fwrite(zeros, 1, c, f) != c) return false;
    if (h) XXH3_64bits_update(h, zeros, c);
    n -= c;
  }
  return true;
}

/* The graph whose weights rank r's block holds. */
static const ir_graph *rank_graph(const ir_graph *g, const ir_plan_info *info, int r) {
  return r == 0 || !info || !info->ranks ? g : info->ranks[r];
}

static int n_ranks(const ir_plan_info *info) {
  return info && info->ranks && info->n_ranks > 1 ? info->n_ranks : 1;
}

/* Where weight bytes go: the file (when f is set) and the hash. */
typedef struct wsink {
  FILE *f;
  XXH3_state_t *h;
  const ir_plan_info *info;
} wsink;

static bool sink_put(const wsink *s, const void *p, uint64_t n) {
  if (s->f && fwrite(p, 1, n, s->f) != n) return false;
  XXH3_64bits_update(s->h, p, n);
  return true;
}

/* After each chunk: the source pages it read go back (info->release), so a build's
 * resident set stays one chunk whatever the model's size. */
static void sink_release(const wsink *s) {
  if (s->info && s->info->release) s->info->release(s->info->release_ctx);
}

/* A lazy weight's chunk buffer, grown to the longest chunk seen. */
typedef struct wbuf {
  uint8_t *p;
  uint64_t cap;
} wbuf;

/* One weight, a chunk of rows at a time: borrowed bytes straight from where they lie, a
 * lazy weight's rows made into the buffer first. */
static ir_status write_tensor(const wsink *s, const ir_tensor *t, wbuf *buf, ir_diag *d) {
  ir_wref w = ir_wref_of(t);
  int64_t rows = ir_wref_rows(&w), step = ir_wref_chunk_rows(&w, IR_PLAN_WRITE_CHUNK);
  uint64_t rb = ir_wref_row_bytes(&w);
  if (rb * (uint64_t)rows != t->nbytes) rows = 1, step = 1, rb = t->nbytes; /* whole */
  if (step > rows) step = rows;
  uint64_t need = rb * (uint64_t)step;
  if (t->lazy && need > buf->cap) {
    ir_free(buf->p);
    if (!(buf->p = ir_malloc(need ? need : 1))) {
      buf->cap = 0;
      return ir_diag_set(d, IR_OOM, "out of memory writing '%s'", t->name);
    }
    buf->cap = need;
  }
  for (int64_t r = 0; r < rows; r += step) {
    int64_t hi = r + step < rows ? r + step : rows;
    const uint8_t *p = (const uint8_t *)t->data + rb * (uint64_t)r;
    if (t->lazy) {
      ir_status st = t->lazy->fill(t->lazy, r, hi, buf->p, d);
      if (st != IR_OK) {
        ir_diag_prefix(d, "weight '%s'", t->name);
        return st;
      }
      p = buf->p;
    }
    if (!sink_put(s, p, rb * (uint64_t)(hi - r)))
      return ir_diag_set(d, IR_IO, "write failed: %s", strerror(errno));
    sink_release(s);
  }
  return IR_OK;
}

/* Streams one graph's weights in tensor order with the alignment fill_tensors assigned,
 * then zeros up to `block` bytes. */
static ir_status write_weights(const wsink *s, const ir_graph *g, uint64_t block, ir_diag *d) {
  uint64_t off = 0;
  wbuf buf = {0};
  ir_status st = IR_OK;
  for (int32_t i = 0; st == IR_OK && i < g->n_tensors; i++) {
    const ir_tensor *t = &g->tensors[i];
    if (t->kind != IR_TENSOR_WEIGHT) continue;
    uint64_t pad = align_up(off, IR_PLAN_WEIGHT_ALIGN) - off;
    st = write_zeros(s->f, pad, s->h) ? write_tensor(s, t, &buf, d)
                                      : ir_diag_set(d, IR_IO, "write failed: %s", strerror(errno));
    off += pad + t->nbytes;
  }
  ir_free(buf.p);
  if (st == IR_OK && !write_zeros(s->f, block - off, s->h))
    st = ir_diag_set(d, IR_IO, "write failed: %s", strerror(errno));
  return st;
}

/* Every rank's block after the other (one block, unpadded, for a one-rank plan). */
static ir_status write_all_weights(FILE *f, const ir_graph *g, const ir_plan_info *info,
                                   uint64_t wsize, uint64_t *out_hash, ir_diag *d) {
  XXH3_state_t *h = XXH3_createState();
  if (!h) return ir_diag_set(d, IR_OOM, "out of memory");
  XXH3_64bits_reset(h);
  int n = n_ranks(info);
  uint64_t block = n > 1 ? wsize / (uint64_t)n : wsize;
  wsink s = {.f = f, .h = h, .info = info};
  ir_status st = IR_OK;
  for (int r = 0; st == IR_OK && r < n; r++)
    st = write_weights(&s, rank_graph(g, info, r), block, d);
  *out_hash = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return st;
}

/* Two nodes alike: the plan stores one graph's nodes for every rank. */
static bool nodes_alike(const ir_node *a, const ir_node *b) {
  if (a->op != b->op || a->n_in != b->n_in || a->n_out != b->n_out || a->n_attrs != b->n_attrs ||
      memcmp(a->in, b->in, (size_t)a->n_in * sizeof *a->in) ||
      memcmp(a->out, b->out, (size_t)a->n_out * sizeof *a->out))
    return false;
  for (int k = 0; k < a->n_attrs; k++) {
    const ir_attr *x = &a->attrs[k], *y = &b->attrs[k];
    if (strcmp(x->name, y->name) || x->type != y->type || x->i != y->i ||
        memcmp(&x->f, &y->f, sizeof x->f) ||
        (x->type == IR_ATTR_INTS && memcmp(x->ints, y->ints, (size_t)x->i * sizeof *x->ints)))
      return false;
  }
  return true;
}

static bool tensors_alike(const ir_tensor *a, const ir_tensor *b) {
  if (a->kind != b->kind || a->dtype != b->dtype || a->rank != b->rank ||
      a->arena_offset != b->arena_offset || (a->kind == IR_TENSOR_WEIGHT && a->nbytes != b->nbytes))
    return false;
  for (int k = 0; k < a->rank; k++)
    if (a->dims[k].n != b->dims[k].n || a->dims[k].sym != b->dims[k].sym) return false;
  return true;
}

/* The ranks' graphs must be one graph but for their weights' bytes: the same nodes, the
 * same tensors, the same weight sizes (the plan stores rank 0's graph for all). */
static bool ranks_alike(const ir_graph *g, const ir_plan_info *info) {
  for (int r = 1; r < n_ranks(info); r++) {
    const ir_graph *o = info->ranks[r];
    if (!o || o->n_tensors != g->n_tensors || o->n_nodes != g->n_nodes) return false;
    for (int32_t i = 0; i < g->n_nodes; i++)
      if (!nodes_alike(&g->nodes[i], &o->nodes[i])) return false;
    for (int32_t i = 0; i < g->n_tensors; i++)
      if (!tensors_alike(&g->tensors[i], &o->tensors[i])) return false;
  }
  return true;
}

static ir_status write_file(FILE *f, const ir_graph *g, const ir_plan_info *info,
                            const uint8_t *meta, size_t meta_size, uint64_t wsize, ir_diag *d) {
  ir_plan_header hd;
  memset(&hd, 0, sizeof hd);
  memcpy(hd.magic, IR_PLAN_MAGIC, 8);
  hd.version_major = IR_PLAN_VERSION_MAJOR;
  hd.version_minor = IR_PLAN_VERSION_MINOR;
  hd.meta_offset = sizeof hd;
  hd.meta_size = meta_size;
  hd.weights_offset = align_up(hd.meta_offset + meta_size, IR_PLAN_SECTION_ALIGN);
  hd.weights_size = wsize;
  hd.kernels_offset = align_up(hd.weights_offset + wsize, IR_PLAN_SECTION_ALIGN);
  hd.kernels_size = ir_plan_kernels_size(info);
  hd.file_size = hd.kernels_offset + hd.kernels_size;
  hd.meta_hash = XXH3_64bits(meta, meta_size);
  bool ok = fwrite(&hd, sizeof hd, 1, f) == 1 && fwrite(meta, 1, meta_size, f) == meta_size &&
            write_zeros(f, hd.weights_offset - hd.meta_offset - meta_size, NULL);
  if (!ok) return ir_diag_set(d, IR_IO, "write failed: %s", strerror(errno));
  ir_status st = write_all_weights(f, g, info, wsize, &hd.weights_hash, d);
  if (st != IR_OK) return st;
  ok = write_zeros(f, hd.kernels_offset - hd.weights_offset - wsize, NULL) &&
       ir_plan_kernels_write(f, info, &hd.kernels_hash);
  hd.header_hash = XXH3_64bits(&hd, offsetof(ir_plan_header, header_hash));
  ok = ok && fseek(f, 0, SEEK_SET) == 0 && fwrite(&hd, sizeof hd, 1, f) == 1;
  if (!ok) return ir_diag_set(d, IR_IO, "write failed: %s", strerror(errno));
  return IR_OK;
}

ir_status ir_plan_write(const ir_graph *g, const ir_plan_info *info, const char *path, ir_diag *d) {
  meta_build m = {0};
  ir_status st = IR_OK;
  uint8_t *meta = NULL;
  if (!meta_alloc(&m, g, info ? info->n_options : 0)) {
    meta_free(&m);
    return ir_diag_set(d, IR_OOM, "out of memory");
  }
  uint64_t wsize = meta_fill(&m, g, info);
  int nr = n_ranks(info);
  uint64_t rank_hash[IR_MAX_TP];
  if ((nr > 1 || g->config.tp_size > 1) &&
      (nr > IR_MAX_TP || nr != g->config.tp_size || !ranks_alike(g, info)))
    st = ir_diag_set(d, IR_INVALID_ARG,
                     "%d rank graphs for a plan of tp_size %d, or ranks whose weights differ "
                     "in layout",
                     nr, g->config.tp_size);
  if (st == IR_OK && nr > 1) { /* each rank's block, padded to a page, hashed on its own
                                 * (a pass of its own: the metadata holding the hashes comes
                                 * first in the file) */
    uint64_t stride = align_up(wsize, IR_PLAN_SECTION_ALIGN);
    for (int r = 0; r < nr && st == IR_OK; r++) {
      XXH3_state_t *h = XXH3_createState();
      if (!h) st = ir_diag_set(d, IR_OOM, "out of memory");
      else {
        XXH3_64bits_reset(h);
        wsink s = {.h = h, .info = info};
        st = write_weights(&s, rank_graph(g, info, r), stride, d);
        rank_hash[r] = XXH3_64bits_digest(h);
        XXH3_freeState(h);
      }
    }
    m.plan.rank_stride = stride;
    m.plan.n_rank_weights_hash = (size_t)nr;
    m.plan.rank_weights_hash = rank_hash;
    wsize = stride * (uint64_t)nr;
  }
  ir_plan_kernels_meta km;
  if (!ir_plan_kernels_meta_fill(&km, &m.plan, info))
    st = ir_diag_set(d, IR_INVALID_ARG, "kernel table: out of memory or an empty image");
  size_t meta_size = infc__plan__plan__get_packed_size(&m.plan);
  meta = ir_malloc(meta_size ? meta_size : 1);
  if (!meta) st = ir_diag_set(d, IR_OOM, "out of memory");
  if (st == IR_OK) infc__plan__plan__pack(&m.plan, meta);
  meta_free(&m);
  ir_plan_kernels_meta_free(&km);
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = st == IR_OK ? fopen(tmp, "wb") : NULL;
  if (st == IR_OK && !f) st = ir_diag_set(d, IR_IO, "cannot create %s: %s", tmp, strerror(errno));
  if (f) {
    st = write_file(f, g, info, meta, meta_size, wsize, d);
    if (fclose(f) != 0 && st == IR_OK) st = ir_diag_set(d, IR_IO, "close of %s failed", tmp);
    if (st == IR_OK && rename(tmp, path) != 0)
      st = ir_diag_set(d, IR_IO, "cannot rename into place: %s", strerror(errno));
    if (st != IR_OK) remove(tmp);
  }
  ir_free(meta);
  if (st != IR_OK) ir_diag_prefix(d, "%s", path);
  return st;
}
