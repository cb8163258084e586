/* program: the generic run mode (inferrt.h, "generic programs"): a plan with static
 * shapes runs node by node on the CPU backend over its planned arena. Inputs live in
 * buffers of their own, so they survive runs; everything else is in the arena. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "inferrt.h"
#include "ir_plan.h"
#include "model.h"
#include "fmt_onnx_tensor.h"
#include "ir_alloc.h"
#include "ir_profile.h"

_Static_assert(IRT_DTYPE_F32 == (int)IR_F32 && IRT_DTYPE_F16 == (int)IR_F16 &&
                   IRT_DTYPE_BF16 == (int)IR_BF16 && IRT_DTYPE_I64 == (int)IR_I64 &&
                   IRT_DTYPE_I32 == (int)IR_I32 && IRT_DTYPE_I8 == (int)IR_I8 &&
                   IRT_DTYPE_U8 == (int)IR_U8,
               "irt_dtype values are the plan's ir_dtype values");
_Static_assert(IRT_MAX_RANK >= IR_MAX_RANK, "public rank limit covers the IR's");

struct irt_program {
  ir_plan *plan;
  const ir_graph *g;
  rt_backend be;
  void *arena;
  void **ptrs;  /* (n_tensors) */
  void **inbuf; /* (n_inputs) */
  bool ran;
  ir_graph *work; /* dynamic shapes: the graph at the current symbols (else NULL) */
  int64_t syms[IR_MAX_PROFILE_SYMS];
};

/* The graph at the shapes of the next run. */
static const ir_graph *cur(const irt_program *p) { return p->work ? p->work : p->g; }

static ir_status check_program(const ir_graph *g, ir_diag *d) {
  for (int32_t i = 0; i < g->n_tensors; i++)
    for (int k = 0; k < g->tensors[i].rank; k++)
      if (g->tensors[i].dims[k].sym != IR_SYM_NONE)
        return ir_diag_set(d, IR_UNSUPPORTED,
                           "tensor '%s' has a symbolic dim: this plan is an "
                           "LLM step program (open it as a model)",
                           g->tensors[i].name);
  for (int32_t i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].op == IR_OP_ATTENTION)
      return ir_diag_set(d, IR_UNSUPPORTED,
                         "node '%s' uses the paged KV cache: this plan is an "
                         "LLM step program (open it as a model)",
                         g->nodes[i].name);
  return IR_OK;
}

static ir_status bind(irt_program *p, ir_diag *d) {
  const ir_graph *g = p->g;
  p->arena = p->be.ops->alloc(p->be.ctx, g->arena_size);
  p->ptrs = ir_calloc((size_t)g->n_tensors + 1, sizeof *p->ptrs);
  p->inbuf = ir_calloc((size_t)g->n_inputs + 1, sizeof *p->inbuf);
  if (!p->arena || !p->ptrs || !p->inbuf) return ir_diag_set(d, IR_OOM, "out of memory");
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const ir_tensor *t = &g->tensors[i];
    uint64_t need = ir_tensor_bytes(g, t, NULL);
    if (t->kind == IR_TENSOR_WEIGHT) {
      p->ptrs[i] = (void *)t->data;
    } else if (t->arena_offset < 0 || need > g->arena_size ||
               (uint64_t)t->arena_offset > g->arena_size - need) {
      return ir_diag_set(d, IR_BAD_FORMAT, "tensor '%s' lies outside the arena", t->name);
    } else {
      p->ptrs[i] = (char *)p->arena + t->arena_offset;
    }
  }
  for (int32_t i = 0; i < g->n_inputs; i++) {
    int32_t t = g->inputs[i];
    if (!(p->inbuf[i] = p->be.ops->alloc(p->be.ctx, ir_tensor_bytes(g, &g->tensors[t], NULL))))
      return ir_diag_set(d, IR_OOM, "out of memory");
    p->ptrs[t] = p->inbuf[i];
  }
  return IR_OK;
}

irt_status irt_program_open(const char *plan_path, const irt_model_opts *opts, irt_program **out,
                            irt_error *err) {
  ir_diag d = {0};
  irt_model_opts o = opts ? *opts : irt_model_opts_default();
  *out = NULL;
  irt_program *p = ir_calloc(1, sizeof *p);
  ir_status st =
      p ? ir_plan_open(plan_path, o.skip_weight_checksum ? IR_PLAN_VERIFY_META : IR_PLAN_VERIFY_ALL,
                       &p->plan, &d)
        : ir_diag_set(&d, IR_OOM, "out of memory");
  if (st == IR_OK) {
    p->g = ir_plan_graph(p->plan);
    st = check_program(p->g, &d);
    if (st == IR_OK) st = backend_cpu_create(o.n_threads, &p->be, &d);
    if (st == IR_OK) st = p->be.ops->check(p->be.ctx, p->g, &d);
    if (st == IR_OK) st = bind(p, &d);
    if (st == IR_OK && p->g->profile) {
      for (int k = 0; k < p->g->profile->n_syms; k++) p->syms[k] = p->g->profile->syms[k].max;
      if (!(p->work = ir_profile_instance(p->g))) st = ir_diag_set(&d, IR_OOM, "out of memory");
      else st = ir_profile_instance_set(p->g, p->work, p->syms, &d);
    }
    if (st != IR_OK) ir_diag_prefix(&d, "%s", plan_path); /* ir_plan_open names it itself */
  }
  if (st != IR_OK) {
    rt_error_from_diag(err, &d);
    irt_program_close(p);
    return rt_status_from_ir(st);
  }
  *out = p;
  return IRT_OK;
}

void irt_program_close(irt_program *p) {
  if (!p) return;
  if (p->be.ops) {
    for (int32_t i = 0; p->inbuf && i < p->g->n_inputs; i++)
      if (p->inbuf[i]) p->be.ops->free(p->be.ctx, p->inbuf[i]);
    if (p->arena) p->be.ops->free(p->be.ctx, p->arena);
  }
  backend_destroy(&p->be);
  ir_profile_instance_free(p->work);
  ir_free(p->inbuf);
  ir_free(p->ptrs);
  ir_plan_close(p->plan);
  ir_free(p);
}

int irt_program_n_inputs(const irt_program *p) { return p->g->n_inputs; }
int irt_program_n_outputs(const irt_program *p) { return p->g->n_outputs; }

static void info_of(const ir_graph *g, int32_t t, irt_tensor_info *out) {
  const ir_tensor *x = &g->tensors[t];
  memset(out, 0, sizeof *out);
  out->name = x->name;
  out->dtype = (irt_dtype)x->dtype;
  out->rank = x->rank;
  for (int i = 0; i < x->rank; i++) out->shape[i] = x->dims[i].n;
  out->nbytes = ir_tensor_bytes(g, x, NULL);
}

irt_status irt_program_input_info(const irt_program *p, int i, irt_tensor_info *out) {
  if (i < 0 || i >= p->g->n_inputs) return IRT_INVALID_ARG;
  info_of(cur(p), p->g->inputs[i], out);
  return IRT_OK;
}

irt_status irt_program_output_info(const irt_program *p, int i, irt_tensor_info *out) {
  if (i < 0 || i >= p->g->n_outputs) return IRT_INVALID_ARG;
  info_of(cur(p), p->g->outputs[i], out);
  return IRT_OK;
}

irt_status irt_program_input_range(const irt_program *p, int i, int64_t *min, int64_t *max) {
  if (i < 0 || i >= p->g->n_inputs) return IRT_INVALID_ARG;
  int32_t t = p->g->inputs[i];
  const ir_tensor *x = &p->g->tensors[t];
  const ir_profile *pr = p->g->profile;
  for (int k = 0; k < x->rank; k++) {
    const ir_affine *a = ir_profile_dim(pr, t, k);
    max[k] = x->dims[k].n;
    min[k] = a ? ir_profile_at_min(pr, a) : max[k];
  }
  return IRT_OK;
}

irt_status irt_program_set_input_shape(irt_program *p, int i, int rank, const int64_t *shape,
                                       irt_error *err) {
  ir_diag d = {0};
  int64_t syms[IR_MAX_PROFILE_SYMS];
  bool known[IR_MAX_PROFILE_SYMS] = {0};
  memcpy(syms, p->syms, sizeof syms);
  ir_status st = IR_OK;
  if (i < 0 || i >= p->g->n_inputs)
    st = ir_diag_set(&d, IR_INVALID_ARG, "input %d of %d does not exist", i, p->g->n_inputs);
  else if (rank < 0 || rank > IR_MAX_RANK || (rank && !shape))
    st = ir_diag_set(&d, IR_INVALID_ARG, "bad rank %d", rank);
  else st = ir_profile_solve(p->g, p->g->inputs[i], rank, shape, syms, known, &d);
  if (st == IR_OK && p->work) {
    st = ir_profile_instance_set(p->g, p->work, syms, &d);
    ir_diag ignore = {0};
    if (st == IR_OK) memcpy(p->syms, syms, sizeof syms);
    else ir_profile_instance_set(p->g, p->work, p->syms, &ignore); /* back as it was */
  }
  if (st != IR_OK) {
    rt_error_from_diag(err, &d);
    return rt_status_from_ir(st);
  }
  return IRT_OK;
}

static int find(const ir_graph *g, const int32_t *ids, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(g->tensors[ids[i]].name, name)) return i;
  return -1;
}

int irt_program_find_input(const irt_program *p, const char *name) {
  return find(p->g, p->g->inputs, p->g->n_inputs, name);
}

int irt_program_find_output(const irt_program *p, const char *name) {
  return find(p->g, p->g->outputs, p->g->n_outputs, name);
}

irt_status irt_program_set_input(irt_program *p, int i, const void *data, uint64_t nbytes,
                                 irt_error *err) {
  ir_diag d = {0};
  irt_tensor_info in;
  if (irt_program_input_info(p, i, &in) != IRT_OK)
    ir_diag_set(&d, IR_INVALID_ARG, "input %d of %d does not exist", i, p->g->n_inputs);
  else if (nbytes != in.nbytes || (nbytes && !data))
    ir_diag_set(&d, IR_INVALID_ARG, "input '%s' takes %llu bytes, got %llu", in.name,
                (unsigned long long)in.nbytes, (unsigned long long)nbytes);
  if (d.status != IR_OK) {
    rt_error_from_diag(err, &d);
    return rt_status_from_ir(d.status);
  }
  if (nbytes) memcpy(p->inbuf[i], data, nbytes);
  return IRT_OK;
}

irt_status irt_program_run(irt_program *p, irt_error *err) {
  ir_diag d = {0};
  model_step step = {.syms = {0}};
  for (int32_t i = 0; i < p->g->n_nodes; i++)
    if (p->be.ops->run_node(p->be.ctx, cur(p), i, p->ptrs, &step, &d) != IR_OK) {
      rt_error_from_diag(err, &d);
      p->ran = false;
      return rt_status_from_ir(d.status);
    }
  p->ran = true;
  return IRT_OK;
}

const void *irt_program_output(const irt_program *p, int i, uint64_t *out_nbytes) {
  if (!p->ran || i < 0 || i >= p->g->n_outputs) return NULL;
  int32_t t = p->g->outputs[i];
  if (out_nbytes) *out_nbytes = ir_tensor_bytes(cur(p), &cur(p)->tensors[t], NULL);
  return p->ptrs[t];
}

const char *irt_dtype_name(irt_dtype t) { return ir_dtype_name((ir_dtype)t); }

/* --- TensorProto files (formats/fmt_onnx_tensor) ------------------------------------- */

irt_status irt_tensor_file_load(const char *path, irt_tensor_file *out, irt_error *err) {
  ir_diag d = {0};
  fmt_onnx_tensor t;
  memset(out, 0, sizeof *out);
  if (fmt_onnx_tensor_load(path, &t, &d) != IR_OK) return rt_error_from_diag(err, &d);
  out->info.name = t.name;
  out->info.dtype = (irt_dtype)t.dtype;
  out->info.rank = t.rank;
  memcpy(out->info.shape, t.shape, sizeof out->info.shape);
  out->info.nbytes = t.nbytes;
  out->data = t.data;
  return IRT_OK;
}

void irt_tensor_file_free(irt_tensor_file *t) {
  if (!t) return;
  ir_free((char *)t->info.name);
  ir_free(t->data);
  memset(t, 0, sizeof *t);
}

irt_status irt_tensor_file_save(const char *path, const irt_tensor_info *info, const void *data,
                                irt_error *err) {
  ir_diag d = {0};
  if (fmt_onnx_tensor_save(path, info->name ? info->name : "", (ir_dtype)info->dtype, false,
                           info->rank, info->shape, data, &d) != IR_OK)
    return rt_error_from_diag(err, &d);
  return IRT_OK;
}
