/* ir_plan_kernels: kernel table and kernels section of a plan (see ir_plan_kernels.h).
 * Images sit in table order, each on an IR_PLAN_KERNEL_ALIGN boundary of the section. */
#include "ir_plan_kernels.h"
#include "ir_alloc.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static uint64_t kern_align(uint64_t x) {
  return (x + IR_PLAN_KERNEL_ALIGN - 1) / IR_PLAN_KERNEL_ALIGN * IR_PLAN_KERNEL_ALIGN;
}

bool ir_plan_kernels_meta_fill(ir_plan_kernels_meta *k, Infc__Plan__Plan *plan,
                               const ir_plan_info *info) {
  int n = info ? info->n_kernels : 0;
  memset(k, 0, sizeof *k);
  if (n <= 0) return true;
  k->msgs = ir_calloc((size_t)n, sizeof *k->msgs);
  k->ptrs = ir_calloc((size_t)n, sizeof *k->ptrs);
  if (!k->msgs || !k->ptrs) return false;
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    const ir_plan_kernel *src = &info->kernels[i];
    if (!src->size || !src->data || !src->name) return false;
    Infc__Plan__Kernel *m = &k->msgs[i];
    infc__plan__kernel__init(m);
    m->name = (char *)src->name;
    m->arch = src->arch;
    m->kind = src->kind;
    m->offset = off = kern_align(off);
    m->size = src->size;
    off += src->size;
    k->ptrs[i] = m;
  }
  plan->n_kernels = (size_t)n;
  plan->kernels = k->ptrs;
  return true;
}

void ir_plan_kernels_meta_free(ir_plan_kernels_meta *k) {
  ir_free(k->msgs);
  ir_free(k->ptrs);
  memset(k, 0, sizeof *k);
}

uint64_t ir_plan_kernels_size(const ir_plan_info *info) {
  uint64_t off = 0;
  for (int i = 0; info && i < info->n_kernels; i++) off = kern_align(off) + info->kernels[i].size;
  return off;
}

bool ir_plan_kernels_write(FILE *f, const ir_plan_info *info, uint64_t *out_hash) {
  static const uint8_t zeros[IR_PLAN_KERNEL_ALIGN];
  XXH3_state_t *h = XXH3_createState();
  if (!h) return false;
  XXH3_64bits_reset(h);
  uint64_t off = 0;
  bool ok = true;
  for (int i = 0; ok && info && i < info->n_kernels; i++) {
    const ir_plan_kernel *k = &info->kernels[i];
    size_t pad = (size_t)(kern_align(off) - off);
    ok = fwrite(zeros, 1, pad, f) == pad && fwrite(k->data, 1, k->size, f) == k->size;
    XXH3_64bits_update(h, zeros, pad);
    XXH3_64bits_update(h, k->data, k->size);
    off += pad + k->size;
  }
  *out_hash = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return ok;
}

static ir_status kern_check(const Infc__Plan__Kernel *m, const uint8_t *sec, uint64_t size,
                            ir_diag *d) {
  if (!m->name || !*m->name) return ir_diag_set(d, IR_BAD_FORMAT, "kernel table: unnamed entry");
  if (m->kind != IR_PLAN_KERNEL_CUBIN && m->kind != IR_PLAN_KERNEL_PTX)
    return ir_diag_set(d, IR_BAD_FORMAT, "kernel '%s': unknown kind %u", m->name, m->kind);
  if (m->offset > size || m->size > size - m->offset || m->size == 0)
    return ir_diag_set(d, IR_BAD_FORMAT, "kernel '%s' sm_%u: image outside the kernels section",
                       m->name, m->arch);
  if (m->kind == IR_PLAN_KERNEL_PTX && sec[m->offset + m->size - 1] != '\0')
    return ir_diag_set(d, IR_BAD_FORMAT, "kernel '%s' sm_%u: PTX is not NUL-terminated", m->name,
                       m->arch);
  return IR_OK;
}

ir_status ir_plan_kernels_read(const Infc__Plan__Plan *meta, const uint8_t *sec, uint64_t size,
                               ir_plan_kernel **out, int *out_n, ir_diag *d) {
  *out = NULL;
  *out_n = 0;
  if (meta->n_kernels == 0) return IR_OK;
  ir_plan_kernel *ks = ir_calloc(meta->n_kernels, sizeof *ks);
  if (!ks) return ir_diag_set(d, IR_OOM, "out of memory");
  for (size_t i = 0; i < meta->n_kernels; i++) {
    const Infc__Plan__Kernel *m = meta->kernels[i];
    ir_status st = kern_check(m, sec, size, d);
    if (st != IR_OK) {
      ir_free(ks);
      return st;
    }
    ks[i] = (ir_plan_kernel){.name = m->name,
                             .arch = m->arch,
                             .kind = m->kind,
                             .data = sec + m->offset,
                             .size = m->size};
  }
  *out = ks;
  *out_n = (int)meta->n_kernels;
  return IR_OK;
}
