/* tref: naive double-precision references shared by the kernel tests. */
#ifndef TREF_H
#define TREF_H

#include <stdint.h>

/* 1 if every y[i][j] is within rel * sum_l |x_il w_jl| + 1e-6 of the double-precision
 * x . W^T (+ bias) computed from x (m, k), w (n, k) f32 and bias (n) or NULL. */
int tref_matmul_ok(const float *y, const float *x, const float *w, const float *bias, int64_t m,
                   int64_t n, int64_t k, double rel);

#endif
