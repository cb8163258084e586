/* kn_matmul_wq: matmul against int8 / int4 weights whose quantization parameters are
 * separate tensors (the layout of ONNX MatMulNBits and TensorRT-LLM weight-only GEMMs),
 * and W8A8: the same int8 weights against activations quantized per row at run time,
 * summed in integers with VNNI (vpdpbusd) or AMX-INT8 where the CPU has it.
 *
 * Both are batch-invariant like every CPU kernel (kn_cpu.h): a row's result depends only
 * on that row and the weights, never on m, the other rows or the thread count. Nothing
 * allocates per call; both are safe to call from one thread at a time per pool. */
#ifndef KN_MATMUL_WQ_H
#define KN_MATMUL_WQ_H

#include <stdint.h>

#include "ir_dtype.h"
#include "kn_pool.h"

/* Longest K of a W8A8 matmul: a kernel call quantizes its rows of x onto the stack. */
enum { KN_W8A8_MAX_K = 32768 };

/* A quantized weight W (n, k), borrowed. Value w[j, i] = ((float)q[j, i] - z) * s in f32
 * (the difference exact for integer zero points, the product rounded once), with
 * s = scales[j, i / group] and z = zero_points[j, i / group] (or 8 for i4, 0 for i8 when
 * zero_points is NULL). */
typedef struct kn_wq {
  const void *q; /* (n, k): IR_I8 (signed bytes) or IR_I4 (k even, two a byte: element
                       * 2t in the low nibble of byte t, 2t+1 in the high; unsigned 0..15),
                       * or IR_F8_E4M3 (value = code's value * s: zero points none; the
                       * portable path only, the GPU being its target) */
  ir_dtype qt;
  const void *scales; /* (n, k / group) of st: IR_F32 or IR_F16 */
  ir_dtype st;
  const void *zp; /* (n, k / group) of zt (IR_U8, IR_I8, IR_F16, IR_F32), or NULL */
  ir_dtype zt;
  int64_t group; /* columns per scale; divides k (group == k: per output channel) */
} kn_wq;

/* w[row, col] as the kernels use it. */
float kn_wq_value(const kn_wq *w, int64_t k, int64_t row, int64_t col);

/* Epilogues (the matmul's "act", ir.h's ir_act): none, or swiglu -- W is (n, k) with n
 * even, gate rows then up rows, and y[i, j] = kn_silu_mul(z[i, j], z[i, n/2 + j]) for
 * z = x . W^T (+ bias), so y is (m, n/2), bit for bit the plain matmul then kn_swiglu. */
enum { KN_WQ_ACT_NONE = 0, KN_WQ_ACT_SWIGLU = 1 };

/* y = x . W^T (+ bias).  x: (m, k) f32; bias: (n) f32 or NULL; y: (m, n) f32.
 * W is dequantized in registers and summed in the f32 order of kn_matmul (16 lanes over
 * k, folded pairwise, tail in order): on the AVX2 and AVX-512 paths (k and group
 * multiples of 16) the result is bit for bit kn_matmul of the dequantized f32 W. */
void kn_matmul_wq(kn_pool *p, float *y, const float *x, const kn_wq *w, const float *bias,
                  int64_t m, int64_t n, int64_t k, int act);

/* W8A8: W is i8, symmetric, per channel (group == k, zp NULL), k <= KN_W8A8_MAX_K.
 * Each row of x is quantized on its own: sx = max|x| / 127, xq = round-to-even(x * (127 /
 * max|x|)) in [-127, 127] (all zero for a zero row); then
 *   y[i, j] = (float)(sum_l xq[i, l] * q[j, l]) * (sx[i] * s[j]) (+ bias[j]).
 * The sum is exact in int32, so every instruction set gives the same bits. */
void kn_matmul_w8a8(kn_pool *p, float *y, const float *x, const kn_wq *w, const float *bias,
                    int64_t m, int64_t n, int64_t k, int act);

/* Caps the instruction set both kernels dispatch to (0 portable C, 1 AVX2 (W8A8: AVX-VNNI
 * where the CPU has it, else vpmaddubsw), 2 AVX-512 (+ AVX512-VNNI), 3 that and AMX-INT8 for W8A8 blocks of 16 rows, k <=
 * 8192; weight-only stops at 2); the CPU must still support it. Returns the previous cap.
 * For tests and benchmarks; call it only while no kernel runs. */
int kn_matmul_wq_set_max_isa(int isa);

/* The path kn_matmul_w8a8 takes now: "amx-int8", "avx512-vnni", "avx-vnni", "avx2" or
 * "portable". */
const char *kn_matmul_w8a8_path(void);

#endif
