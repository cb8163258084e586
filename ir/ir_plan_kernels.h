/* ir_plan_kernels: the kernel table (plan.proto Kernel) and the kernels section of a
 * plan, shared by ir_plan_write.c and ir_plan_read.c; not a public header. */
#ifndef IR_PLAN_KERNELS_H
#define IR_PLAN_KERNELS_H

#include <stdbool.h>
#include <stdio.h>

#include "ir_plan.h"
#include "plan.pb-c.h"
#include "ir_alloc.h"

/* Scratch for the table's messages; owned by the writer, freed by _meta_free. */
typedef struct ir_plan_kernels_meta {
  Infc__Plan__Kernel *msgs;
  Infc__Plan__Kernel **ptrs;
} ir_plan_kernels_meta;

/* Fills plan->kernels from info (offsets as the section will lay them out). False on OOM
 * or an empty image. */
bool ir_plan_kernels_meta_fill(ir_plan_kernels_meta *k, Infc__Plan__Plan *plan,
                               const ir_plan_info *info);
void ir_plan_kernels_meta_free(ir_plan_kernels_meta *k);
/* Bytes of the kernels section for info (0 without kernels). */
uint64_t ir_plan_kernels_size(const ir_plan_info *info);
/* Writes the section at the current position of f; *out_hash is its XXH3-64. */
bool ir_plan_kernels_write(FILE *f, const ir_plan_info *info, uint64_t *out_hash);
/* Checks meta's table against the section [sec, +size) and builds *out (owned by the
 * caller, ir_free()); names point into meta, data into sec. */
ir_status ir_plan_kernels_read(const Infc__Plan__Plan *meta, const uint8_t *sec, uint64_t size,
                               ir_plan_kernel **out, int *out_n, ir_diag *d);

#endif
