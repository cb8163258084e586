/* backend_cpu_nd: how the CPU backend checks and runs the n-d generic ops (IR_OP_ND_*):
 * through kn_nd_exec, the kernels' node adapter. */
#ifndef IRT_BACKEND_CPU_ND_H
#define IRT_BACKEND_CPU_ND_H

#include "ir.h"
#include "kn_pool.h"

/* At plan load: every tensor the node touches has static dims. */
ir_status cpu_nd_check(const ir_graph *g, const ir_node *n, ir_diag *d);
/* Runs node ni; ptrs[t] is the address of tensor t. */
ir_status cpu_nd_run(kn_pool *p, const ir_graph *g, int32_t ni, void *const *ptrs, ir_diag *d);

#endif
