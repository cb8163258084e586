/* kn_cpu: the CPU kernels, one op per .c file. All activations are f32, row-major.
 * Weights may be f32, f16, bf16 or block-quantized (q8_0, q4_0, q4_1: kn_quant.h) and are
 * read in place (never converted per call).
 *
 * Batch invariance (a user-facing guarantee): every kernel computes each output row
 * with a reduction order that depends only on that row's data and the weights, never on
 * how many rows share the call or on the thread count. So a token's result is
 * bit-identical whether it runs alone, in a batch, or in a prefill chunk. */
#ifndef KN_CPU_H
#define KN_CPU_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "ir_dtype.h"
#include "kn_pool.h"

/* out[t, :] = table[ids[t], :] converted to f32.  table: (vocab, dim) of dtype `dt`
 * (f32, f16, bf16, or q8_0 / q4_0 / q4_1 with dim a multiple of 32).
 * ids are checked by the caller (0 <= id < vocab). */
void kn_embed(kn_pool *p, float *out, const void *table, ir_dtype dt, const int32_t *ids,
              int64_t n_tok, int64_t dim);
/* The same, each row then multiplied by scale in f32 (Gemma's sqrt(hidden) normalizer);
 * scale 1 is kn_embed. */
void kn_embed_scaled(kn_pool *p, float *out, const void *table, ir_dtype dt, const int32_t *ids,
                     int64_t n_tok, int64_t dim, float scale);
/* A table of the vocabulary's rows [row0, row0 + rows) (tensor parallelism's share): ids
 * outside them give zero rows, which the ranks' all-reduce fills. */
void kn_embed_part(kn_pool *p, float *out, const void *table, ir_dtype dt, const int32_t *ids,
                   int64_t n_tok, int64_t dim, float scale, int64_t row0, int64_t rows);

/* out[t] = x[t] * w / sqrt(mean(x[t]^2) + eps).  x, out: (n, dim); w: (dim) f32.
 * out may alias x. */
void kn_rms_norm(kn_pool *p, float *out, const float *x, const float *w, int64_t n, int64_t dim,
                 float eps);

/* Fused residual add + RMSNorm: sum = a + b (written to out_sum), out = rms_norm(sum).
 * out_sum may alias a or b. */
/* One row of kn_rms_norm (the same bits), for kernels that normalize a row on the way in;
 * out may alias x. */
void kn_rms_norm_row(float *out, const float *x, const float *w, int64_t dim, float eps);

void kn_add_rms_norm(kn_pool *p, float *out, float *out_sum, const float *a, const float *b,
                     const float *w, int64_t n, int64_t dim, float eps);

/* y = x . W^T (+ bias).  x: (m, k) f32; W: (n, k) of dtype `wt` (f32, f16, bf16, or
 * q8_0 / q4_0 / q4_1 with k a multiple of 32: rows of k/32 blocks, no alignment needed);
 * bias: (n) f32 or NULL; y: (m, n) f32.  Cache-blocked, threaded over output tiles;
 * the k-reduction of one y element never depends on m or the thread count. */
void kn_matmul(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt, const float *bias,
               int64_t m, int64_t n, int64_t k);

/* The swiglu epilogue: y[i, j] = kn_silu_mul(z[i, j], z[i, n + j]) for z = x . W^T (+ bias)
 * with W (2n, k): gate rows, then up rows; bias (2n) or NULL; y (m, n).  Each z is the
 * same dot product kn_matmul computes, so y equals kn_matmul then kn_swiglu bit for bit,
 * without the (m, 2n) intermediate. */
void kn_matmul_swiglu(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt,
                      const float *bias, int64_t m, int64_t n, int64_t k);

/* bf16 W with bf16 activations (a matmul with act_bf16): y = x . W^T (+ bias), x rounded
 * to bf16, bf16 products summed in f32 in the order of AVX512-BF16's vdpbf16ps (on it
 * where the CPU has it, bit for bit the same with f32 FMAs elsewhere; kn_matmul.c). W: (n,
 * k) bf16, or (2n, k) with swiglu (y as kn_matmul_swiglu's). A row's result never depends
 * on m or the thread count. */
void kn_matmul_bf16x(kn_pool *p, float *y, const float *x, const uint16_t *w, const float *bias,
                     int64_t m, int64_t n, int64_t k, bool swiglu);

/* kn_matmul_bf16x16: the same with W in IR_BF16_X16's layout (16 rows interleaved by
 * pairs; n a multiple of 16, k even), summed in that layout's order on this CPU
 * (kn_matmul_x16_order: one chain an output over the pairs, vdpbf16ps's step; or AMX-BF16's
 * blocks of 16 pairs; kn_matmul.c). */
void kn_matmul_bf16x16(kn_pool *p, float *y, const float *x, const void *w, const float *bias,
                       int64_t m, int64_t n, int64_t k, bool swiglu);

/* Block-quantized W (q8_0, q4_0, q4_1, or their 8-row interleaved layouts) with bf16
 * activations (a matmul with act_bf16): W's values, kn_quant_value's f32 rounded to bf16,
 * summed exactly as kn_matmul_bf16x16 sums that bf16 W (its order on this CPU), x rounded
 * to bf16. Each task converts its W tile to the bf16x16 layout once (kn_x16_dequant) and
 * sweeps up to KN_MM_Q16_M_TILE rows over it, so a prefill converts W a few times a step,
 * not once per row. n a multiple of 16 (32 rows of W with swiglu), k of 32. A row's result
 * never depends on m or the thread count. */
void kn_matmul_bf16q(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt,
                     const float *bias, int64_t m, int64_t n, int64_t k, bool swiglu);
/* Rows 16 g .. 16 g + 15 of block W (k values a row) as IR_BF16_X16 group words at dst (k / 2
 * runs of 16 words: run p, word i = row 16 g + i's values 2p, 2p + 1 as bf16). */
void kn_x16_dequant(const void *w, ir_dtype wt, int64_t k, int64_t g, uint32_t *dst);

/* The order IR_BF16_X16 sums in on this CPU: KN_X16_TILE (AMX-BF16's tdpbf16ps: blocks of
 * 16 pairs, an even and an odd chain a block) where the CPU has AMX-BF16, on the tile unit
 * and on every other path there; KN_X16_CHAIN (vdpbf16ps's one chain) elsewhere. Every
 * row of every step on one CPU sums in the same order, so a row's result never depends on
 * the batch; the two orders differ in the last bits. kn_matmul_set_x16_order forces one
 * (-1: the CPU's again; tests) and returns the setting it replaces. */
enum { KN_X16_CHAIN = 0, KN_X16_TILE = 1 };
int kn_matmul_x16_order(void);
int kn_matmul_set_x16_order(int order);
/* Whether this CPU and OS run AMX-BF16; whether the CPU has AVX512-BF16. */
bool kn_cpu_has_amx_bf16(void);
bool kn_cpu_has_avx512bf16(void);

/* How the matmul kernels cut y (m, n) into pool tasks: tiles of mb rows x nb columns,
 * n_tiles of them along n; task t is row tile t / n_tiles, column tile t % n_tiles. Tiles
 * follow the cache (a W tile stays in L2 while x rows sweep it) and the thread count; they
 * change only which outputs share a task, never how one output is summed. */
typedef struct kn_mm_tiles {
  int64_t m, n, mb, nb, n_tiles, n_tasks;
} kn_mm_tiles;
/* col_bytes: bytes of W read per column of y; column tiles are multiples of align (a
 * multiple of 8: every kernel's width). */
kn_mm_tiles kn_mm_tiles_plan(int64_t m, int64_t n, int64_t col_bytes, int n_threads, int align);
/* The same with m tiles of up to m_tile rows (kn_mm_tiles_plan: 64), for kernels whose
 * tile set-up is worth amortizing over more rows. */
kn_mm_tiles kn_mm_tiles_plan_m(int64_t m, int64_t n, int64_t col_bytes, int n_threads, int align,
                               int64_t m_tile);
/* The rows [*i0, *i1) and columns [*j0, *j1) of task t. */
void kn_mm_tile_bounds(const kn_mm_tiles *t, int64_t task, int64_t *i0, int64_t *i1, int64_t *j0,
                       int64_t *j1);

/* Longest K kn_matmul_q8 quantizes x rows for (on the stack of each task). */
enum { KN_Q8_MAX_K = 16384 };

/* y = x . W^T (+ bias), or the swiglu epilogue (W (2n, k), y (m, n)), for block-quantized
 * W (q8_0, q4_0, q4_1; k a multiple of 32, k <= KN_Q8_MAX_K) with x quantized to int8 per
 * block of 32 values and summed in integers -- the speed of llama.cpp's CPU kernels, at
 * the precision of 8-bit activations (not the f32 sums of kn_matmul). Every path
 * (AMX-INT8, AVX-512 VNNI, AVX2, portable C) gives the same bits, and a row's result
 * depends on that row only. The order is written out in kn_matmul_q8.c. Other shapes and
 * types go to kn_matmul. W may also be one of the 8-row interleaved types (IR_*_X8, n a
 * multiple of 8; these have no kn_matmul path, other shapes compute nothing). */
void kn_matmul_q8(kn_pool *p, float *y, const float *x, const void *w, ir_dtype wt,
                  const float *bias, int64_t m, int64_t n, int64_t k, bool swiglu);

/* Caps the instruction set kn_matmul dispatches to (0 portable C, 1 AVX2, 2 AVX-512,
 * 3 that and AMX-INT8 (kn_matmul_q8's prefill blocks); the CPU must still support it)
 * and returns the previous cap. For tests and benchmarks; call it only while no kernel
 * runs. */
int kn_matmul_set_max_isa(int isa);
/* Whether kn_matmul_bf16x may run on AVX512-BF16's vdpbf16ps (where the CPU has it,
 * under a cap of 2 or more); off, the AVX-512F kernels compute the same bits with f32
 * FMAs. Returns the previous setting. For tests and benchmarks, as above. */
bool kn_matmul_use_bf16dp(bool on);
/* Whether bf16 W runs on vdpbf16ps now (the CPU has it, the cap and the setting allow). */
bool kn_matmul_bf16dp(void);
/* The instruction set the CPU kernels dispatch to: the CPU's best under that cap. */
int kn_cpu_isa(void);
/* Whether this CPU and OS run AMX-INT8 (asks Linux for the tile state once). */
bool kn_cpu_has_amx(void);
/* The 64 bytes ldtilecfg reads (palette 1: tile t has rows[t] rows of colsb[t] bytes). */
typedef struct kn_amx_cfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} kn_amx_cfg;
_Static_assert(sizeof(kn_amx_cfg) == 64, "ldtilecfg reads 64 bytes");

/* log(sum_i e^x[i]) over n > 0 logits (the max taken out first; f32 exps within 2 ulp,
 * summed in f64): a sampled token's logprob is x[tok] minus it. -inf if every x is -inf;
 * +inf or NaN if some x is (NaN propagates through the sum). */
double kn_log_sum_exp(const float *x, int64_t n);

/* Rotary embedding in place on x: (n_tok, n_heads, head_dim), rotating the first
 * `rot_dim` dims of each head.  cos_sin: (max_pos, rot_dim/2, 2) f32 holding
 * (cos, sin) of pos * inv_freq[i].  pos[t] < max_pos is checked by the caller.
 * neox=1: rotate-half pairs (i, i + rot_dim/2) as HF Llama; neox=0: adjacent pairs
 * (2i, 2i+1) as GPT-J / interleaved. */
void kn_rope(kn_pool *p, float *x, const int32_t *pos, const float *cos_sin, int64_t n_tok,
             int64_t n_heads, int64_t head_dim, int64_t rot_dim, int neox);

/* swiglu's elementwise part, y[i] = silu(g[i]) * u[i], as every CPU kernel takes it (kn_swiglu
 * and the matmul epilogue, so both round alike): silu(g) = g * s with the sigmoid s from
 * e = kn_vexp(-|g|) <= 1 (kn_vexp.h, within 2 ulp): 1 / (1 + e) for g >= 0, e / (1 + e)
 * below (for g < -87 a signed zero). Then y = (g * s) * u. Eight or sixteen values a step
 * where the CPU has AVX2 or AVX-512, a short tail padded into a full step, so a value's
 * bits never depend on where it sits or how many come with it. */
void kn_silu_mul_n(float *y, const float *g, const float *u, int64_t n);

/* One value, as kn_silu_mul_n gives it. */
float kn_silu_mul(float g, float u);

/* The epilogue of one matmul kernel call (kn_matmul, kn_matmul_wq, kn_matmul_q8): mr rows
 * of z, nr sums each, into columns [0, nv) of y's rows (row stride ldy). Plain: y = z +
 * bg. swiglu: gate sums in z[0, cols), up sums in z[cols, 2 cols), y = kn_silu_mul(gate +
 * bg, up + bu). bg / bu: the gate and up bias at the first column, or NULL. Bias first, as
 * the plain matmul stores z, so swiglu is kn_swiglu of that output bit for bit. */
static inline void kn_mm_store(float *y, int64_t ldy, const float *z, int mr, int nr, int cols,
                               int64_t nv, const float *bg, const float *bu, bool swiglu) {
  for (int r = 0; r < mr; r++, y += ldy) {
    const float *zr = z + r * nr;
    if (!swiglu && bg)
      for (int64_t c = 0; c < nv; c++) y[c] = zr[c] + bg[c];
    else if (!swiglu)
      for (int64_t c = 0; c < nv; c++) y[c] = zr[c];
    else if (!bg) kn_silu_mul_n(y, zr, zr + cols, nv);
    else
      for (int64_t c0 = 0; c0 < nv; c0 += 64) { /* gate and up with their bias */
        float g[64], u[64];
        int64_t w = nv - c0 < 64 ? nv - c0 : 64;
        for (int64_t c = 0; c < w; c++) {
          g[c] = zr[c0 + c] + bg[c0 + c];
          u[c] = zr[cols + c0 + c] + bu[c0 + c];
        }
        kn_silu_mul_n(y + c0, g, u, w);
      }
  }
}

/* A swiglu matmul's gate and up values (bias added) of up to KN_MM_GATE_COLS columns of
 * KN_MM_GATE_ROWS rows, gathered from kernel calls (kn_mm_gates_put, kn_mm_store's z and
 * bias) and gated together (kn_mm_gates_apply): a kernel call's two or four columns at a
 * time had spent a fifth of a prefill in the gate's set-up. The gate's vector code is lane
 * for lane its tail's, so the bits are kn_mm_store's. */
enum { KN_MM_GATE_ROWS = 4, KN_MM_GATE_COLS = 64 };
typedef struct kn_mm_gates {
  int64_t j0; /* the first column gathered */
  float g[KN_MM_GATE_ROWS][KN_MM_GATE_COLS], u[KN_MM_GATE_ROWS][KN_MM_GATE_COLS];
} kn_mm_gates;

/* Columns [j0, j0 + nv) of one call's z (mr rows of nr sums: gate in [0, cols), up in
 * [cols, 2 cols)); bg / bu as kn_mm_store's. Without a bias -0 stays -0, as there. */
static inline void kn_mm_gates_put(kn_mm_gates *gt, const float *z, int mr, int nr, int cols,
                                   int64_t nv, int64_t j0, const float *bg, const float *bu) {
  for (int r = 0; r < mr; r++)
    for (int64_t c = 0; c < nv; c++) {
      float gz = z[r * nr + c], uz = z[r * nr + cols + c];
      gt->g[r][j0 - gt->j0 + c] = bg ? gz + bg[c] : gz;
      gt->u[r][j0 - gt->j0 + c] = bu ? uz + bu[c] : uz;
    }
}

/* The gathered columns [gt->j0, je) of mr rows gated into y (its first row, stride ldy, at
 * column 0 = gt->j0). */
static inline void kn_mm_gates_apply(const kn_mm_gates *gt, float *y, int64_t ldy, int mr,
                                     int64_t je) {
  for (int r = 0; r < mr; r++) kn_silu_mul_n(y + r * ldy, gt->g[r], gt->u[r], je - gt->j0);
}

/* Rotates one head in place (x: head_dim values, the first rot_dim rotated) with the
 * (cos, sin) row of its position: cs = cos_sin + pos * rot_dim. The arithmetic of kn_rope. */
void kn_rope_head(float *x, const float *cs, int64_t rot_dim, int neox);

/* out = silu(gate) * up, elementwise over n values. out may alias gate or up. */
void kn_swiglu(kn_pool *p, float *out, const float *gate, const float *up, int64_t n);

/* out = gelu_tanh(gate) * up (Gemma's gelu_pytorch_tanh: 0.5 g (1 + tanh(sqrt(2/pi) (g +
 * 0.044715 g^3)))), elementwise over n values, computed as g * sigmoid(2z) times u with the
 * sigmoid of kn_silu_mul_n (and z's polynomial by one fma): within a few ulp of the formula,
 * the same bits on every path and in any position, as kn_silu_mul_n. kn_gelu_mul_n is the
 * unthreaded form, kn_gelu_tanh_mul one value. out may alias gate or up. */
void kn_geglu(kn_pool *p, float *out, const float *gate, const float *up, int64_t n);
void kn_gelu_mul_n(float *y, const float *g, const float *u, int64_t n);
float kn_gelu_tanh_mul(float g, float u);

/* out = cap * tanhf(x / cap) over n values (kn_softcap1 each; cap > 0); out may alias x. */
void kn_softcap(kn_pool *p, float *out, const float *x, int64_t n, float cap);
float kn_softcap1(float x, float cap);

/* out = a + b, elementwise over n values. out may alias a or b. */
void kn_add(kn_pool *p, float *out, const float *a, const float *b, int64_t n);

/* out[r, :] = x[rows[r], :] for r in [0, n_rows). */
void kn_gather_rows(kn_pool *p, float *out, const float *x, const int32_t *rows, int64_t n_rows,
                    int64_t dim);

/* Paged KV cache geometry for one layer. A block holds `block_size` consecutive
 * positions of one sequence: k and v are (n_blocks, n_kv_heads, block_size, head_dim) f32.
 * int8 cache (k8 set; k, v unused): k8, v8 have that shape in int8 and k_scale, v_scale
 * are (n_blocks, n_kv_heads, block_size) f32; x = scale * q, scale = max|x| / 127 per
 * (position, kv head), so writing a position never touches another. */
typedef struct kn_kv_layer {
  float *k;
  float *v;
  int64_t n_blocks;
  int64_t block_size;
  int64_t n_kv_heads;
  int64_t head_dim;
  int8_t *k8, *v8;     /* NULL: the f32 (or f16) cache */
  uint16_t *k16, *v16; /* f16 cache (k, v, k8 unused): values rounded to nearest */
  float *k_scale, *v_scale;
} kn_kv_layer;

/* The flat step batch as attention sees it. Token t belongs to sequence tok_seq[t] and
 * sits at absolute position tok_pos[t]. Sequence s maps logical block j to physical
 * block block_tables[s * max_blocks_per_seq + j]. Tokens of a sequence attend to every
 * cached position <= their own (causal), including positions written in this step. */
typedef struct kn_attn_batch {
  int64_t n_tok;
  const int32_t *tok_seq; /* (n_tok) */
  const int32_t *tok_pos; /* (n_tok) */
  int64_t max_blocks_per_seq;
  const int32_t *block_tables; /* (n_seq, max_blocks_per_seq) */
} kn_attn_batch;

/* Writes k_new/v_new of every token into the cache at its position, then computes
 * out = softmax(q k^T * scale) v per head over each token's context, with grouped-query
 * mapping head h -> kv head h / (n_heads / n_kv_heads).
 * q: (n_tok, n_heads, head_dim); k_new, v_new: (n_tok, n_kv_heads, head_dim);
 * out: (n_tok, n_heads, head_dim).  Threaded over (token, head). */
void kn_attention_paged(kn_pool *p, float *out, const float *q, const float *k_new,
                        const float *v_new, const kn_kv_layer *kv, const kn_attn_batch *b,
                        int64_t n_heads, float scale);

/* Where attention finds q, k and v, and the per-head RMSNorm and rope it applies first.
 * Head h of token t is at q + t * q_stride + h * head_dim (k, v likewise with kv_stride),
 * so one packed qkv row (q heads, k heads, v heads) is q = qkv, k = qkv + n_heads *
 * head_dim, ... with every stride the packed width. With q_norm set, each q and k head is
 * first normalized as kn_rms_norm_row would; with cos_sin set, q and k are rotated as
 * kn_rope would (k as it is written to the cache; the inputs are not modified), by the
 * positions pos[t]. */
typedef struct kn_attn_io {
  const float *q, *k, *v;
  int64_t q_stride, kv_stride; /* floats between consecutive tokens */
  const int32_t *pos;          /* (n_tok), < the table's rows (checked by the caller) */
  const float *cos_sin;        /* (max_pos, rot_dim / 2, 2) or NULL: no rope */
  int64_t rot_dim;
  int neox;
  const float *q_norm, *k_norm; /* (head_dim) or NULL: kn_rms_norm_row of each q / k head */
  float qk_eps;                 /* before the rope (Qwen3's q_norm, k_norm) */
  int64_t window; /* > 0: a token at position p attends p - window < j <= p only (sliding
                     window); 0: every position <= p */
  float softcap;  /* > 0: each scaled score s becomes kn_softcap1(s, softcap) (Gemma 2) */
  int bf16;       /* nonzero: q . k and p . v on bf16 values in the bf16 order (plans with
                     act_bf16 attention; kn_attention.c), head_dim <= 256 (wider heads take
                     the f32 order); 0: f32 */
} kn_attn_io;

/* kn_attention_paged over strided (packed) inputs with an optional per-head norm and rope:
 * bit for bit kn_rms_norm (rows of head_dim) and kn_rope on q and k followed by
 * kn_attention_paged. */
void kn_attention_paged_io(kn_pool *p, float *out, const kn_attn_io *io, const kn_kv_layer *kv,
                           const kn_attn_batch *b, int64_t n_heads, float scale);

/* Turns the full-chunk kernels of kn_attention (several queries folded over one read of
 * a 16-row chunk) off or on and returns the previous setting; off, every chunk takes the
 * per-query phases, which must give the same bits. For tests; call it only while no
 * kernel runs. */
bool kn_attention_set_chunk_kernels(bool on);

#endif
