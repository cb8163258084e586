/* onnx_llm: serves an exported causal-LM graph as an LLM plan. The graph is imported as it
 * is (onnx_import.c) at two small specializations, and pass_canon_llm (passes/) recognises
 * the decoder in the generic IR by what it computes; the plan is the Llama template's
 * program over the paged KV cache. */
#include <stdlib.h>
#include <string.h>

#include "infc_hfconfig.h"
#include "infc_onnx_genai.h"
#include "infc_onnx_llm.h"
#include "infc_util.h"
#include "ir_alloc.h"
#include "onnx_internal.h"
#include "pass_canon.h"

/* The roles of the graph inputs an exported decoder may have. */
typedef enum role { ROLE_IDS, ROLE_MASK, ROLE_POS, ROLE_PAST } role;

typedef struct spec_input {
  const Onnx__ValueInfoProto *vi;
  role role;
  ir_dtype dt;
  int rank;
  int64_t fixed[IR_MAX_RANK]; /* declared dims, -1 where symbolic */
} spec_input;

static bool is_causal_lm(const Onnx__GraphProto *gp) {
  bool ids = false, logits = false;
  for (size_t i = 0; i < gp->n_input; i++)
    ids |= gp->input[i]->name && !strcmp(gp->input[i]->name, "input_ids");
  for (size_t i = 0; i < gp->n_output; i++)
    logits |= gp->output[i]->name && !strcmp(gp->output[i]->name, "logits");
  return ids && logits;
}

/* Dim k of graph input vi when it is a fixed number, else -1. */
static int64_t input_dim(const Onnx__ValueInfoProto *vi, size_t k) {
  const Onnx__TypeProto *t = vi->type;
  const Onnx__TensorShapeProto *sh =
      t && t->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && t->tensor_type
          ? t->tensor_type->shape
          : NULL;
  if (!sh || k >= sh->n_dim || !sh->dim[k] ||
      sh->dim[k]->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
    return -1;
  return sh->dim[k]->dim_value;
}

static int input_rank(const Onnx__ValueInfoProto *vi) {
  const Onnx__TypeProto *t = vi->type;
  const Onnx__TensorShapeProto *sh =
      t && t->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && t->tensor_type
          ? t->tensor_type->shape
          : NULL;
  return sh ? (int)sh->n_dim : -1;
}

/* Whether every graph input has fixed dims, as the generic importer needs. */
static bool static_inputs(const Onnx__GraphProto *gp) {
  for (size_t i = 0; i < gp->n_input; i++) {
    int r = input_rank(gp->input[i]);
    if (r < 0) return false;
    for (int k = 0; k < r; k++)
      if (input_dim(gp->input[i], (size_t)k) < 0) return false;
  }
  return true;
}

/* Classifies the graph inputs (initializers listed as inputs are skipped). */
static ir_status read_inputs(const infc_onnx *m, spec_input *in, int *n, bool *has_past,
                             ir_diag *d) {
  const Onnx__GraphProto *gp = m->model->graph;
  *n = 0;
  *has_past = false;
  for (size_t i = 0; i < gp->n_input; i++) {
    const Onnx__ValueInfoProto *vi = gp->input[i];
    const char *name = vi->name ? vi->name : "";
    bool init = false;
    for (size_t k = 0; k < gp->n_initializer && !init; k++)
      init = gp->initializer[k]->name && !strcmp(gp->initializer[k]->name, name);
    if (init) continue;
    spec_input s = {.vi = vi, .rank = input_rank(vi)};
    const Onnx__TypeProto *t = vi->type;
    bool is_bool = false;
    if (s.rank < 0 || s.rank > IR_MAX_RANK || !t->tensor_type ||
        !fmt_onnx_dtype_to_ir(t->tensor_type->elem_type, &s.dt, &is_bool))
      return ir_diag_set(d, IR_UNSUPPORTED, "graph input '%s' has no tensor type and shape", name);
    for (int k = 0; k < s.rank; k++) s.fixed[k] = input_dim(vi, (size_t)k);
    if (!strcmp(name, "input_ids") && s.rank == 2) s.role = ROLE_IDS;
    else if (!strcmp(name, "attention_mask") && s.rank == 2) s.role = ROLE_MASK;
    else if (!strcmp(name, "position_ids") && s.rank == 2) s.role = ROLE_POS;
    else if (strstr(name, "past") && s.rank == 4 && s.fixed[1] > 0 && s.fixed[3] > 0)
      s.role = ROLE_PAST, *has_past = true;
    else
      return ir_diag_set(d, IR_UNSUPPORTED,
                         "graph input '%s' is none of input_ids, attention_mask, position_ids or "
                         "a past-KV input [batch, kv_heads, past, head_dim]",
                         name);
    if (*n >= INFC_ONNX_LLM_MAX_INPUTS)
      return ir_diag_set(d, IR_UNSUPPORTED, "more than %d graph inputs", INFC_ONNX_LLM_MAX_INPUTS);
    in[(*n)++] = s;
  }
  return IR_OK;
}

/* A tensor of dtype dt: n values of start + i (arange) or all `fill`. */
static void *values(ir_dtype dt, int64_t n, int64_t start, bool arange) {
  size_t es = ir_dtype_bytes(dt, 1);
  uint8_t *p = ir_calloc((size_t)(n ? n : 1), es ? es : 1);
  for (int64_t i = 0; p && i < n; i++) {
    int64_t v = arange ? start + i : 1;
    switch (dt) {
    case IR_I64: ((int64_t *)p)[i] = v; break;
    case IR_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case IR_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case IR_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case IR_F32: ((float *)p)[i] = (float)v; break;
    default: break;
    }
  }
  return p;
}

/* The graph imported with S tokens after P past ones: the mask bound to ones, the
 * positions to P..P+S-1, the ids and past KV inputs given those sizes. */
static ir_status import_spec(infc_onnx *m, const spec_input *in, int n, int64_t P, int64_t S,
                             ir_graph **og, ir_diag *d) {
  infc_onnx_binding b[INFC_ONNX_LLM_MAX_INPUTS];
  fmt_onnx_tensor val[INFC_ONNX_LLM_MAX_INPUTS];
  int64_t shapes[INFC_ONNX_LLM_MAX_INPUTS][IR_MAX_RANK];
  void *bufs[INFC_ONNX_LLM_MAX_INPUTS] = {0};
  ir_status st = IR_OK;
  for (int i = 0; i < n && st == IR_OK; i++) {
    const spec_input *s = &in[i];
    int64_t *sh = shapes[i];
    b[i] = (infc_onnx_binding){.name = s->vi->name, .rank = s->rank, .shape = sh};
    sh[0] = 1;
    if (s->role == ROLE_PAST) {
      sh[1] = s->fixed[1];
      sh[2] = P;
      sh[3] = s->fixed[3];
      continue;
    }
    sh[1] = s->role == ROLE_MASK ? P + S : S;
    if (s->role == ROLE_IDS) continue;
    if (s->dt != IR_I64 && s->dt != IR_I32 && s->dt != IR_U8 && s->dt != IR_F32) {
      st = ir_diag_set(d, IR_UNSUPPORTED, "graph input '%s' has dtype %s", s->vi->name,
                       ir_dtype_name(s->dt));
      break;
    }
    bufs[i] = values(s->dt, sh[1], P, s->role == ROLE_POS);
    if (!bufs[i]) {
      st = ir_diag_set(d, IR_OOM, "out of memory");
      break;
    }
    val[i] = (fmt_onnx_tensor){.name = (char *)s->vi->name,
                               .dtype = s->dt,
                               .rank = 2,
                               .shape = {1, sh[1]},
                               .data = bufs[i],
                               .nbytes = ir_dtype_bytes(s->dt, (uint64_t)sh[1])};
    b[i].value = &val[i];
  }
  if (st == IR_OK) st = infc_onnx_import_loaded(m, NULL, b, n, og, d);
  for (int i = 0; i < n; i++) ir_free(bufs[i]);
  return st;
}

/* Recognises the decoder of m at one specialization; the imported graph kept in *g (the
 * weights point into it and into m). */
static ir_status recognise(infc_onnx *m, const char *path, const spec_input *in, int n, int64_t P,
                           int64_t S, ir_graph **g, pass_llm *r, ir_diag *d) {
  ir_status st = import_spec(m, in, n, P, S, g, d);
  if (st != IR_OK) return st;
  pass_llm_io io = {.input_ids = ir_graph_find_tensor(*g, "input_ids"),
                    .logits = ir_graph_find_tensor(*g, "logits"),
                    .past = P,
                    .seq = S};
  st = pass_canon_llm(*g, &io, r, d);
  if (st != IR_OK) ir_diag_prefix(d, "%s", path);
  return st;
}

/* max_position_embeddings, bos, eos and sliding_window from a config.json beside the model
 * (else 2048, -1, -1, 0). */
static void read_config_beside(model_llama_params *p, const char *path) {
  char dir[4096], cfg[4200];
  model_llama_params c;
  ir_diag ignore = {0};
  p->max_position = 2048;
  p->bos_token_id = p->eos_token_id = -1;
  infc_path_dir(dir, sizeof dir, path);
  if (!infc_path_join(cfg, sizeof cfg, dir, "config.json") || !infc_file_exists(cfg) ||
      infc_hfconfig_load(cfg, &c, &ignore) != IR_OK)
    return;
  p->max_position = c.max_position;
  p->bos_token_id = c.bos_token_id;
  p->eos_token_id = c.eos_token_id;
  p->sliding_window = c.sliding_window; /* only to size the recognition; the mask decides */
}

/* Whether two recognitions describe the same model (the second at another size). */
static bool same_model(const model_llama_params *a, const model_llama_params *b) {
  return a->n_layers == b->n_layers && a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
         a->head_dim == b->head_dim && a->hidden_size == b->hidden_size &&
         a->intermediate_size == b->intermediate_size && a->vocab_size == b->vocab_size &&
         a->rope_theta == b->rope_theta && a->rope_interleaved == b->rope_interleaved &&
         a->attn_scale == b->attn_scale && a->rms_norm_eps == b->rms_norm_eps &&
         a->attention_bias == b->attention_bias && a->qk_norm == b->qk_norm &&
         a->tie_word_embeddings == b->tie_word_embeddings;
}

/* A causal LM graph whose decoder was not matched (d says where): with fixed input dims
 * it still runs in generic mode (recognised says why it is not a servable LLM); with
 * symbolic ones it cannot, and that is the error. */
static ir_status not_servable(const Onnx__GraphProto *gp, const char *path, char *recognised,
                              ir_diag *d) {
  char msg[sizeof d->msg];
  snprintf(msg, sizeof msg, "%s", d->msg);
  *d = (ir_diag){0};
  size_t pl = strlen(path);
  const char *rest = !strncmp(msg, path, pl) && !strncmp(msg + pl, ": ", 2) ? msg + pl + 2 : msg;
  if (static_inputs(gp)) {
    snprintf(recognised, INFC_ONNX_LLM_RECOGNISED,
             "generic graph for `inferrt run`, not a servable LLM: %.200s", rest);
    return IR_OK;
  }
  return ir_diag_set(d, IR_UNSUPPORTED,
                     "%s: a causal LM graph (input_ids -> logits) that infc cannot serve as an "
                     "LLM plan, nor run in generic mode (its input dims are symbolic): %s",
                     path, rest);
}

ir_status infc_onnx_llm_import(const char *path, const model_build_opts *bo, bool *out_is_lm,
                               infc_onnx **out_model, ir_graph **out_graph, char *out_hash,
                               char *recognised, ir_diag *d) {
  *out_is_lm = false;
  *out_model = NULL;
  *out_graph = NULL;
  infc_onnx *m = NULL;
  ir_status st = onnx_model_load(path, &m, d);
  if (st != IR_OK) {
    ir_diag_prefix(d, "%s", path);
    return st;
  }
  const Onnx__GraphProto *gp = m->model->graph;
  if (!is_causal_lm(gp)) {
    snprintf(recognised, INFC_ONNX_LLM_RECOGNISED,
             "generic graph for `inferrt run`, not an LLM (no input_ids input and logits "
             "output)");
    infc_onnx_close(m);
    return IR_OK;
  }
  if (infc_onnx_genai_detect(m)) { /* ONNX Runtime GenAI builder output: onnx_genai.c */
    *out_is_lm = true;
    return infc_onnx_genai_import(m, path, bo, out_model, out_graph, out_hash, recognised, d);
  }
  spec_input in[INFC_ONNX_LLM_MAX_INPUTS];
  int n = 0;
  bool has_past = false;
  char hash[17] = {0};
  infc_onnx_hash(m, hash);
  st = read_inputs(m, in, &n, &has_past, d);
  if (st != IR_OK) {
    ir_diag_prefix(d, "%s", path);
    if (st == IR_UNSUPPORTED) st = not_servable(gp, path, recognised, d);
    infc_onnx_close(m);
    return st;
  }
  /* two sizes: the positions include 1, where the rope's frequencies are read, and both
   * are long enough to show a sliding window of up to 11 tokens in the mask (a graph
   * exported with fixed sizes is recognised at those) */
  int64_t P = has_past ? 1 : 0, S1 = 16, S2 = 12;
  model_llama_params cfg = {0}; /* a config.json beside it: a longer window shows past it */
  read_config_beside(&cfg, path);
  if (cfg.sliding_window > 11 && cfg.sliding_window < INFC_ONNX_LLM_MAX_WINDOW_SEEN)
    S1 = cfg.sliding_window + 4;
  for (int i = 0; i < n; i++) {
    if (in[i].role == ROLE_IDS && in[i].fixed[1] > 0) S1 = S2 = in[i].fixed[1];
    if (in[i].role == ROLE_PAST && in[i].fixed[2] >= 0) P = in[i].fixed[2];
  }
  ir_graph *g1 = NULL, *g2 = NULL;
  pass_llm r1 = {0}, r2 = {0};
  st = recognise(m, path, in, n, P, S1, &g1, &r1, d);
  if (st == IR_OK && S2 != S1) {
    st = recognise(m, path, in, n, P, S2, &g2, &r2, d);
    if (st == IR_OK && !same_model(&r1.p, &r2.p))
      st = ir_diag_set(d, IR_UNSUPPORTED,
                       "%s: the graph computes a different model at %lld tokens than at %lld", path,
                       (long long)S2, (long long)S1);
    pass_llm_free(&r2);
    ir_graph_destroy(g2);
  }
  if (st == IR_UNSUPPORTED) {
    st = not_servable(gp, path, recognised, d);
  } else if (st == IR_OK) {
    *out_is_lm = true;
    r1.p.max_position = cfg.max_position; /* the window is what the mask showed */
    r1.p.bos_token_id = cfg.bos_token_id;
    r1.p.eos_token_id = cfg.eos_token_id;
    st = pass_canon_llm_build(&r1, bo, out_graph, d);
    /* the built graph points into g1's folded constants too: it adopts them */
    for (int32_t i = 0; st == IR_OK && i < g1->n_owned; i++) {
      void *buf = g1->owned[i];
      g1->owned[i] = NULL;
      if (!ir_graph_adopt(*out_graph, buf)) st = ir_diag_set(d, IR_OOM, "out of memory");
    }
    if (st == IR_OK) {
      pass_llm_describe(&r1, recognised, INFC_ONNX_LLM_RECOGNISED);
      memcpy(out_hash, hash, sizeof hash);
      *out_model = m;
      m = NULL;
    } else {
      ir_graph_destroy(*out_graph);
      *out_graph = NULL;
    }
  }
  pass_llm_free(&r1);
  ir_graph_destroy(g1);
  infc_onnx_close(m);
  return st;
}
