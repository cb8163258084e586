/* pass_quantize: `infc build --quant SCHEME`: converts float matmul weights to i8 / i4
 * with separate scales and zero points (the matmul contract in ir_op.c), or to W8A8.
 *
 *   none                         leave the weights as they are
 *   int8[:sym|asym][:gN]         int8, per output channel (or groups of N along K)
 *   int4[:g32|g64|g128][:sym|asym]   int4 in groups of 32 (default), 64 or 128
 *   w8a8                         int8 per-channel symmetric weights, and activations
 *                                quantized per row at run time (VNNI where present)
 *   q8_0 | q4_0 | q4_1           ggml's block formats (32 values, f16 scales; K a multiple
 *                                of 32), made by ggml's reference quantizers
 *                                (kn_quant_row): the GGUF kernels, int8 activations on
 *                                the CPU, and a tied embedding table shared with the lookup
 *   fp8                          FP8 E4M3 codes (f8_e4m3) with an f32 scale per output
 *                                channel (max |w| / 448): half bf16's bytes for the GPU's
 *                                GEMV; the CPU runs it on its portable path
 * A ":lm_head" suffix also quantizes the logits projection (by default it stays as built:
 * it is the most sensitive matmul, and with tied embeddings the embedding lookup keeps
 * the float table, so a quantized copy would add bytes rather than save them -- except
 * for the block formats, whose table the lookup reads too: there the tie is kept).
 * The embedding is a lookup, not a matmul: never quantized here. */
#ifndef PASS_QUANTIZE_H
#define PASS_QUANTIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pass.h"

typedef enum pass_quant_scheme {
  PASS_QUANT_NONE = 0,
  PASS_QUANT_INT8 = 1,
  PASS_QUANT_INT4 = 2,
  PASS_QUANT_W8A8 = 3,
  PASS_QUANT_Q8_0 = 4,
  PASS_QUANT_Q4_0 = 5,
  PASS_QUANT_Q4_1 = 6,
  PASS_QUANT_FP8 = 7,
} pass_quant_scheme;

typedef struct pass_quant_opts {
  pass_quant_scheme scheme;
  int64_t group; /* columns per scale; 0 = per output channel (int8, w8a8 default) */
  bool asym;     /* zero points (int8, int4) */
  bool lm_head;  /* also the logits projection */
} pass_quant_opts;

/* Parses a scheme as above into *out. Errors name the spec and what is wrong. */
ir_status pass_quant_parse(const char *spec, pass_quant_opts *out, ir_diag *d);

/* The block dtype of a q8_0 / q4_0 / q4_1 scheme; IR_DTYPE_INVALID for the others. */
ir_dtype pass_quant_block_dtype(const pass_quant_opts *q);

/* The canonical text of a scheme ("int4:g32:sym", "none"), recorded in plans. */
void pass_quant_format(const pass_quant_opts *q, char *buf, size_t len);

/* The pass (runs after fusion, so fused q/k/v and gate/up weights are quantized whole).
 * o->quant selects the scheme; NULL or none does nothing.
 * W8A8 with o->quant_calib: a text file of activation maxima, one line per norm,
 *   NAME K v0 ... v(K-1)      (NAME: the norm's weight tensor, a ".f32" suffix of a
 *                             converted one optional; "#" lines are comments)
 * written by tools/w8a8-calib from calibration text. The norms it names are smoothed
 * (pass_quant_smooth, alpha PASS_QUANT_SMOOTH_ALPHA) and only matmuls reading a norm's
 * output get int8 activations; the rest (o_proj, down_proj) int8 weights, f32 activations.
 * Errors: the file unreadable or malformed, not w8a8, or naming no norm of the model. */
ir_status pass_quantize(ir_graph *g, const pass_opts *o, pass_log *log, ir_diag *d);

/* Activation maxima for smoothing: max_t |X[t, j]| (k values) of the output of the norm
 * whose weight tensor is named norm_weight, measured on calibration text; NULL when not
 * known (that norm is left alone). The returned array is borrowed. */
/* The migration strength with a calibration file: on SmolLM2, 0.5 gave +0.20% perplexity,
 * 0.85 +0.32% (both with f32 o_proj/down_proj activations). */
#define PASS_QUANT_SMOOTH_ALPHA 0.5f

typedef const float *(*pass_quant_amax_fn)(void *ctx, const char *norm_weight, int64_t k);

typedef struct pass_quant_smoothing {
  const pass_quant_opts *q; /* which matmuls will be quantized (only those are smoothed) */
  float alpha;              /* migration strength, 0..1 (SmoothQuant's 0.5 is typical) */
  pass_quant_amax_fn amax;
  void *ctx;
} pass_quant_smoothing;

/* SmoothQuant-style smoothing for W8A8, exact in real arithmetic. For each RMSNorm (or
 * add_rms_norm) whose output feeds only float matmuls that q quantizes (q/k/v, gate/up,
 * fused or not; at most 4), each weight read by that matmul alone, and whose f32 weight
 * gamma the norm alone reads: per input channel j
 *   s_j = amax_j^alpha / wmax_j^(1 - alpha),  wmax_j = max over the matmuls' rows |W[., j]|
 * (clamped to [1e-4, 1e4]; 1 where either max is 0), and the norm reads new f32 weights
 * gamma_j / s_j, the matmuls new f32 weights W[., j] * s_j ("<name>.smoothed"; the old
 * ones stay until pass_compact). In f32 the logits move by rounding only. *out_n: norms
 * smoothed. pass_quantize runs it for w8a8 given a calibration file (o->quant_calib);
 * without one nothing is smoothed (the weight-only proxy amax_j = |gamma_j| made SmolLM2's
 * W8A8 worse: +2.2% -> +4.6% perplexity). */
ir_status pass_quant_smooth(ir_graph *g, const pass_quant_smoothing *sm, int *out_n, ir_diag *d);

/* Quantizes w (n, k) f32 in groups of `group` columns (group divides k; i4 needs k even).
 * Writes q: (n, k) i8, or i4 packed two a byte (element 2t in the low nibble); scales:
 * (n, k / group) of st (IR_F32 or IR_F16); zp: (n, k / group) when asym (else NULL): i8
 * codes for i8, f16 fractional zero points for i4 (an affine fit per group, as Q4_1's
 * min; an integer zero point costs int4 about a fifth more error). Symmetric int8 codes
 * stay in [-127, 127] (W8A8 needs it).
 * Dequantized, w ~ (q - zp) * scale with zp 8 (i4) or 0 (i8) when symmetric. The scale
 * of each group is searched (round-to-nearest at a few candidate scales or clipping
 * ranges, least squares) to minimise the group's squared error. */
void pass_quant_matrix(const float *w, int64_t n, int64_t k, ir_dtype qt, int64_t group, bool asym,
                       ir_dtype st, void *q, void *scales, void *zp);

#endif
