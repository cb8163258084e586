/* fake_cuda: a stand-in libcuda.so.1 (and, through a symlink, libcublas.so.13) for CI
 * machines without a GPU, so the CUDA backend's host side runs for real: driver calls,
 * kernel argument lists, launch geometry, the step buffer, padding to decode buckets,
 * graph capture and replay, logits download, KV copies, out-of-memory and arch errors.
 * "Device memory" is host memory; each kernel launch is decoded by the kernel's name from
 * its parameter list as written in kernels/cuda/<op>.cu and computed on the CPU (with the
 * kn_* kernels of the test executable, which exports them, or plainly here). Stream
 * capture records launches and copies; a graph launch replays them. Not thread-safe (the
 * backend uses one stream). Test-only: never installed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "inferrt.h"
#include "ir_dtype.h"
#include "kn_cpu.h"
#include "kn_matmul_wq.h"
#include "kn_quant.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
#define EXPORT __attribute__((visibility("default")))
#define NPARAM 20

static int g_head_dim = 16, g_block_size = 16, g_arch = 90;
static size_t g_max_alloc = (size_t)8 << 30;

/* The test sets the constants the kernels were compiled with, and the fake GPU's arch. */
EXPORT void fake_cuda_config(int head_dim, int block_size, int arch);
void fake_cuda_config(int head_dim, int block_size, int arch) {
  g_head_dim = head_dim, g_block_size = block_size, g_arch = arch;
}

/* --- kernels: name, parameter sizes, CPU emulation --------------------------------------- */

typedef struct launch_t {
  int fn;
  unsigned grid[3], block;
  uint64_t p[NPARAM]; /* parameter values, each widened to 8 bytes */
  bool pdl;           /* launched with programmatic stream serialization */
} launch_t;

#define PF(i) ((float *)(uintptr_t)l->p[i])
#define PI(i) ((int32_t *)(uintptr_t)l->p[i])
#define PV(i) ((void *)(uintptr_t)l->p[i])
#define I32(i) ((int)(int32_t)l->p[i])
#define I64(i) ((long long)l->p[i])
static float F32(const launch_t *l, int i) {
  float f;
  uint32_t u = (uint32_t)l->p[i];
  memcpy(&f, &u, 4);
  return f;
}

/* The launch being run is an _f16 entry: its KV cache holds f16 bits. */
static bool g_kv_f16;
static float kv_get(const void *cache, size_t i) {
  return g_kv_f16 ? ir_f16_to_f32(((const uint16_t *)cache)[i]) : ((const float *)cache)[i];
}
static void kv_put(void *cache, size_t i, float x) {
  if (g_kv_f16) ((uint16_t *)cache)[i] = ir_f32_to_f16(x);
  else ((float *)cache)[i] = x;
}

/* The first position a token at pos sees: 0, or pos - window + 1 under a sliding window. */
static int first_pos(int pos, int window) {
  return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

/* One query row against its sequence's cached positions first_pos(pos, window)..pos (double
 * accumulation), each scaled score soft-capped (softcap > 0) as kn_attn_io.softcap. */
static void attend(float *out, const float *q, const void *kc, const void *vc, const int32_t *bt,
                   int pos, int kvh, int n_kv, float scale, int window, float softcap) {
  int hd = g_head_dim, bs = g_block_size, lo = first_pos(pos, window);
  double *w = malloc(sizeof(double) * (size_t)(pos + 1)), mx = -INFINITY, sum = 0;
  for (int p = lo; p <= pos; p++) {
    size_t k = (((size_t)bt[p / bs] * n_kv + kvh) * bs + p % bs) * hd;
    double s = 0;
    for (int i = 0; i < hd; i++) s += (double)q[i] * kv_get(kc, k + (size_t)i);
    w[p] = s * scale;
    if (softcap > 0) w[p] = softcap * tanh(w[p] / softcap);
    if (w[p] > mx) mx = w[p];
  }
  for (int p = lo; p <= pos; p++) sum += w[p] = exp(w[p] - mx);
  for (int i = 0; i < hd; i++) {
    double a = 0;
    for (int p = lo; p <= pos; p++)
      a += w[p] * kv_get(vc, (((size_t)bt[p / bs] * n_kv + kvh) * bs + p % bs) * hd + i);
    out[i] = (float)(a / sum);
  }
  free(w);
}

/* attention params as kn_attn_decode: out, part_acc, part_ml, q, k, v, seq, pos, bt,
 * max_blocks, n_heads, n_kv_heads, scale, blocks_per_split, window, softcap. The splits
 * must cover the token's visible blocks from the first (attention.cu's split origin). */
static void emu_decode(const launch_t *l) {
  int maxb = I32(9), nh = I32(10), nkv = I32(11), bps = I32(13), window = I32(14);
  int splits = (int)l->grid[2];
  float scale = F32(l, 12), softcap = F32(l, 15);
  for (unsigned t = 0; t < l->grid[0]; t++)
    for (int h = 0; h < nh && h < (int)l->grid[1]; h++) {
      const int32_t *bt = PI(8) + (size_t)PI(6)[t] * maxb;
      int pos = PI(7)[t];
      if (bps < 1 || first_pos(pos, window) / g_block_size + splits * bps <= pos / g_block_size)
        abort(); /* a visible block no split reads */
      float o[256];
      attend(o, PF(3) + ((size_t)t * nh + h) * g_head_dim, PV(4), PV(5), bt, pos, h / (nh / nkv),
             nkv, scale, window, softcap);
      if (splits == 1) {
        memcpy(PF(0) + ((size_t)t * nh + h) * g_head_dim, o, sizeof(float) * g_head_dim);
        continue;
      }
      for (int z = 0; z < splits; z++) { /* the whole result in split 0, empty others */
        size_t row = ((size_t)t * nh + h) * splits + z;
        for (int i = 0; i < g_head_dim; i++) PF(1)[row * g_head_dim + i] = z ? 0.0f : o[i];
        PF(2)[row * 2] = z ? -INFINITY : 0.0f;
        PF(2)[row * 2 + 1] = z ? 0.0f : 1.0f;
      }
    }
}

static void emu_reduce(const launch_t *l) { /* kn_attn_decode_reduce, as in attention.cu */
  int nh = I32(3), ns = I32(4);
  for (unsigned t = 0; t < l->grid[0]; t++)
    for (unsigned h = 0; h < l->grid[1]; h++) {
      size_t row = (size_t)t * nh + h;
      const float *ml = PF(2) + row * ns * 2;
      float mx = -INFINITY;
      for (int z = 0; z < ns; z++) mx = fmaxf(mx, ml[2 * z]);
      for (unsigned d = 0; d < l->block; d++) {
        float a = 0, sum = 0;
        for (int z = 0; z < ns; z++) {
          if (ml[2 * z] == -INFINITY) continue;
          float wt = expf(ml[2 * z] - mx);
          sum += ml[2 * z + 1] * wt;
          a += PF(1)[(row * ns + z) * g_head_dim + d] * wt;
        }
        PF(0)[row * g_head_dim + d] = sum > 0 ? a / sum : 0;
      }
    }
}

/* kn_attn_prefill(_tc): out, q, k, v, seq, pos, bt, max_blocks, n_heads, n_kv_heads, scale,
 * t0, tn, window, softcap; tiles of at most `tile` tokens. */
static void emu_prefill(const launch_t *l, int tile) {
  int maxb = I32(7), nh = I32(8), nkv = I32(9);
  for (unsigned x = 0; x < l->grid[0]; x++)
    for (int r = 0; r < PI(12)[x]; r++) {
      int t = PI(11)[x] + r;
      if (r >= tile || PI(4)[t] != PI(4)[PI(11)[x]]) abort(); /* a tile is one sequence */
      for (int h = 0; h < nh; h++)
        attend(PF(0) + ((size_t)t * nh + h) * g_head_dim, PF(1) + ((size_t)t * nh + h) * g_head_dim,
               PV(2), PV(3), PI(6) + (size_t)PI(4)[t] * maxb, PI(5)[t], h / (nh / nkv), nkv,
               F32(l, 10), I32(13), F32(l, 14));
    }
}

static void emu_kv_write(const launch_t *l) {
  int maxb = I32(7), nkv = I32(8), hd = g_head_dim, bs = g_block_size;
  for (unsigned t = 0; t < l->grid[0]; t++) {
    int pos = PI(5)[t];
    long long blk = PI(6)[(size_t)PI(4)[t] * maxb + pos / bs];
    for (int i = 0; i < nkv * hd; i++) {
      size_t dst = (((size_t)blk * nkv + i / hd) * bs + pos % bs) * hd + i % hd;
      kv_put(PV(0), dst, PF(2)[(size_t)t * nkv * hd + i]);
      kv_put(PV(1), dst, PF(3)[(size_t)t * nkv * hd + i]);
    }
  }
}

/* kn_rope_kv_write: q_out, kc, vc, q, k, v, q_stride, kv_stride, seq, pos, bt, max_blocks,
 * n_heads, n_kv_heads, cos_sin, rot_dim, neox, q_norm, k_norm, qk_eps (kv_write.cu). */
static void emu_rope_kv_write(const launch_t *l) {
  int maxb = I32(11), nh = I32(12), nkv = I32(13), rot = I32(15), neox = I32(16);
  int hd = g_head_dim, bs = g_block_size;
  long long qs = I64(6), kvs = I64(7);
  if (rot < 0 || rot > hd || rot % 2 || (rot && !PV(14)) || l->block != 256) abort();
  for (unsigned t = 0; t < l->grid[0]; t++) {
    int pos = PI(9)[t];
    const float *cs = rot ? PF(14) + (size_t)pos * rot : NULL;
    for (int h = 0; h < nh; h++) {
      float *o = PF(0) + ((size_t)t * nh + h) * hd;
      memcpy(o, PF(3) + t * qs + h * hd, sizeof(float) * hd);
      if (PV(17)) kn_rms_norm_row(o, o, PF(17), hd, F32(l, 19));
      if (rot) kn_rope_head(o, cs, rot, neox);
    }
    long long blk = PI(10)[(size_t)PI(8)[t] * maxb + pos / bs];
    for (int h = 0; h < nkv; h++) {
      size_t dst = (((size_t)blk * nkv + h) * bs + pos % bs) * hd;
      float kr[256];
      memcpy(kr, PF(4) + t * kvs + h * hd, sizeof(float) * hd);
      if (PV(18)) kn_rms_norm_row(kr, kr, PF(18), hd, F32(l, 19));
      if (rot) kn_rope_head(kr, cs, rot, neox);
      for (int i = 0; i < hd; i++) {
        kv_put(PV(1), dst + (size_t)i, kr[i]);
        kv_put(PV(2), dst + (size_t)i, PF(5)[t * kvs + h * hd + i]);
      }
    }
  }
}

static void emu_gemv(const launch_t *l, ir_dtype dt, bool swiglu) {
  int m = I32(4), n = I32(5), k = I32(6);
  if ((long long)l->grid[0] * 4 < n || (long long)l->grid[1] * 4 < m || l->block != 128) abort();
  if (swiglu) kn_matmul_swiglu(NULL, PF(0), PF(1), PV(2), dt, PF(3), m, n, k);
  else kn_matmul(NULL, PF(0), PF(1), PV(2), dt, PF(3), m, n, k);
}

/* The weight-only W of a gemv_wq.cu launch: codes at argument w, scales and zero points at
 * sc and sc + 1, group, st and zt at g, g + 1, g + 2; checked (abort) as the kernels need
 * them for k. */
static kn_wq wq_arg(const launch_t *l, ir_dtype qt, int w, int sc, int g, int k) {
  static const ir_dtype zts[] = {IR_U8, IR_U8, IR_I8, IR_F16, IR_F32};
  int group = I32(g), st = I32(g + 1), zt = I32(g + 2);
  if (group <= 0 || k % group || group % (qt == IR_I4 ? 32 : 16) || st < 0 || st > 1 || zt < 0 ||
      zt > 4 || (zt != 0) != (PV(sc + 1) != NULL))
    abort();
  return (kn_wq){.q = PV(w),
                 .qt = qt,
                 .scales = PV(sc),
                 .st = st ? IR_F16 : IR_F32,
                 .zp = PV(sc + 1),
                 .zt = zts[zt],
                 .group = group};
}

/* kn_gemv_wq_i4/_i8/_f8: y, x, w, bias, scales, zp, m, n, k, group, st, zt (gemv_wq.cu); its
 * CTAs loop over row tiles, so any grid y up to the tile count computes every row. */
static void emu_gemv_wq(const launch_t *l, ir_dtype qt) {
  int m = I32(6), n = I32(7), k = I32(8);
  long long tiles = (m + 3) / 4;
  if ((long long)l->grid[0] * 4 < n || !l->grid[1] || l->grid[1] > 65535 || l->grid[1] > tiles ||
      l->block != 128)
    abort();
  kn_wq q = wq_arg(l, qt, 2, 4, 9, k);
  kn_matmul_wq(NULL, PF(0), PF(1), &q, PF(3), m, n, k, KN_WQ_ACT_NONE);
}

/* kn_dequant_wq_i4/_i8/_f8: out (n, k) f16, w, scales, zp, n, k, group, st, zt: kn_wq_value
 * rounded to f16; its grid-stride loop takes any grid. */
static void emu_dequant_wq(const launch_t *l, ir_dtype qt) {
  long long n = I64(4);
  int k = I32(5);
  if (!l->grid[0] || l->block != 256 || k % 16) abort();
  kn_wq q = wq_arg(l, qt, 1, 2, 6, k);
  for (long long j = 0; j < n; j++)
    for (int i = 0; i < k; i++)
      ((uint16_t *)PV(0))[j * k + i] = ir_f32_to_f16(kn_wq_value(&q, k, j, i));
}

/* kn_cast_f16 / kn_cast_bf16, and the _h kernels' copy of their output. */
static void half_copy(void *h, const float *x, long long n, int bf16) {
  for (long long i = 0; i < n; i++)
    ((uint16_t *)h)[i] = bf16 ? ir_f32_to_bf16(x[i]) : ir_f32_to_f16(x[i]);
}

/* kn_swiglu_packed: z (m, 2n) holds gate in columns [0, n), up in [n, 2n). */
static void swiglu_packed(float *out, const float *z, long long m, long long n) {
  for (long long i = 0; i < m * n; i++) {
    const float *zr = z + i / n * 2 * n;
    out[i] = kn_silu_mul(zr[i % n], zr[n + i % n]);
  }
}

static void emu_simple(const launch_t *l, const char *name) {
  if (!strcmp(name, "kn_add")) kn_add(NULL, PF(0), PF(1), PF(2), I64(3));
  else if (!strcmp(name, "kn_swiglu")) kn_swiglu(NULL, PF(0), PF(1), PF(2), I64(3));
  else if (!strcmp(name, "kn_geglu")) kn_geglu(NULL, PF(0), PF(1), PF(2), I64(3));
  else if (!strcmp(name, "kn_softcap")) kn_softcap(NULL, PF(0), PF(1), I64(2), F32(l, 3));
  else if (!strcmp(name, "kn_swiglu_packed")) swiglu_packed(PF(0), PF(1), I64(2), I64(3));
  else if (!strcmp(name, "kn_swiglu_packed_h")) {
    swiglu_packed(PF(0), PF(2), I64(3), I64(4));
    half_copy(PV(1), PF(0), I64(3) * I64(4), I32(5));
  } else if (!strcmp(name, "kn_gather_rows"))
    kn_gather_rows(NULL, PF(0), PF(1), PI(2), l->grid[0], I64(3));
  else if (!strcmp(name, "kn_rms_norm"))
    kn_rms_norm(NULL, PF(0), PF(1), PF(2), l->grid[0], I32(3), F32(l, 4));
  else if (!strcmp(name, "kn_add_rms_norm"))
    kn_add_rms_norm(NULL, PF(0), PF(1), PF(2), PF(3), PF(4), l->grid[0], I32(5), F32(l, 6));
  else if (!strcmp(name, "kn_rms_norm_h")) {
    kn_rms_norm(NULL, PF(0), PF(2), PF(3), l->grid[0], I32(4), F32(l, 5));
    half_copy(PV(1), PF(0), (long long)l->grid[0] * I32(4), I32(6));
  } else if (!strcmp(name, "kn_add_rms_norm_h")) {
    kn_add_rms_norm(NULL, PF(0), PF(2), PF(3), PF(4), PF(5), l->grid[0], I32(6), F32(l, 7));
    half_copy(PV(1), PF(0), (long long)l->grid[0] * I32(6), I32(8));
  } else if (!strncmp(name, "kn_rope_", 8))
    kn_rope(NULL, PF(0), PI(1), PF(2), l->grid[0], I32(3), I32(4), I32(5), name[8] == 'n');
  else if (!strcmp(name, "kn_add_bias"))
    for (long long i = 0; i < I64(2) * I64(3); i++) PF(0)[i] += PF(1)[i % I64(3)];
  else if (!strcmp(name, "kn_cast_f16") || !strcmp(name, "kn_cast_bf16"))
    half_copy(PV(0), PF(1), I64(2), name[8] == 'b');
  else abort();
}

static const struct {
  const char *name;
  int n;
  const char *sizes; /* '8' pointer / long long, '4' int / float */
} k_fns[] = {
    {"kn_add", 4, "8888"},
    {"kn_swiglu", 4, "8888"},
    {"kn_swiglu_packed", 4, "8888"},
    {"kn_geglu", 4, "8888"},
    {"kn_softcap", 4, "8884"},
    {"kn_gather_rows", 4, "8888"},
    {"kn_rope_kv_write", 20, "88888888888444844884"},
    {"kn_rms_norm", 5, "88844"},
    {"kn_add_rms_norm", 7, "8888844"},
    {"kn_rms_norm_h", 7, "8888444"},
    {"kn_add_rms_norm_h", 9, "888888444"},
    {"kn_swiglu_packed_h", 6, "888884"},
    {"kn_rope_neox", 6, "888444"},
    {"kn_rope_interleaved", 6, "888444"},
    {"kn_add_bias", 4, "8888"},
    {"kn_cast_f16", 3, "888"},
    {"kn_cast_bf16", 3, "888"},
    {"kn_dequant_q8_0", 3, "888"},
    {"kn_dequant_q4_0", 3, "888"},
    {"kn_dequant_q4_1", 3, "888"},
    {"kn_attn_decode", 16, "8888888884444444"},
    {"kn_attn_decode_reduce", 5, "88844"},
    {"kn_attn_prefill", 15, "888888844448844"},
    {"kn_attn_prefill_tc", 15, "888888844448844"},
    {"kn_kv_write", 9, "888888844"},
    {"kn_pick", 8, "88884888"},
    {"kn_attn_decode_f16", 16, "8888888884444444"},
    {"kn_attn_prefill_f16", 15, "888888844448844"},
    {"kn_attn_prefill_tc_f16", 15, "888888844448844"},
    {"kn_kv_write_f16", 9, "888888844"},
    {"kn_rope_kv_write_f16", 20, "88888888888444844884"},
    {"kn_gemv_f32", 7, "8888444"},
    {"kn_gemv_f16", 7, "8888444"},
    {"kn_gemv_bf16", 7, "8888444"},
    {"kn_gemv_q8_0", 7, "8888444"},
    {"kn_gemv_q4_0", 7, "8888444"},
    {"kn_gemv_q4_1", 7, "8888444"},
    {"kn_gemv_f32_swiglu", 7, "8888444"},
    {"kn_gemv_f16_swiglu", 7, "8888444"},
    {"kn_gemv_bf16_swiglu", 7, "8888444"},
    {"kn_gemv_q8_0_swiglu", 7, "8888444"},
    {"kn_gemv_q4_0_swiglu", 7, "8888444"},
    {"kn_gemv_q4_1_swiglu", 7, "8888444"},
    {"kn_gemv_wq_i4", 12, "888888444444"},
    {"kn_gemv_wq_i8", 12, "888888444444"},
    {"kn_gemv_wq_f8", 12, "888888444444"},
    {"kn_dequant_wq_i4", 9, "888884444"},
    {"kn_dequant_wq_i8", 9, "888884444"},
    {"kn_dequant_wq_f8", 9, "888884444"},
    {"kn_embed_f32", 5, "88884"},
    {"kn_embed_f16", 5, "88884"},
    {"kn_embed_bf16", 5, "88884"},
    {"kn_embed_q8_0", 5, "88884"},
    {"kn_embed_q4_0", 5, "88884"},
    {"kn_embed_q4_1", 5, "88884"},
    {"kn_pdl_ready", 0, ""}, /* a marker, never launched */
};
#define N_FNS ((int)(sizeof k_fns / sizeof k_fns[0]))

static ir_dtype dtype_of(const char *suffix) {
  return !strcmp(suffix, "f32")    ? IR_F32
         : !strcmp(suffix, "f16")  ? IR_F16
         : !strcmp(suffix, "bf16") ? IR_BF16
         : !strcmp(suffix, "q8_0") ? IR_Q8_0
         : !strcmp(suffix, "q4_0") ? IR_Q4_0
                                   : IR_Q4_1;
}

/* kn_pick: out, top, logits, args, vocab (sampling.cu): runtime/model/sampler.c's own function
 * with each pick's draw, so the backend's plumbing (rows, settings, results) is tested. */
int32_t sampler_sample_u(irt_sampler *s, const float *logits, double u);
void sampler_top_logprobs(const float *logits, int64_t vocab, double lse, int k, int32_t *ids,
                          float *lps);
static void emu_pick(const launch_t *l) {
  const int vocab = I32(4);
  for (unsigned b = 0; b < l->grid[0]; b++) {
    struct {
      float temperature, top_p;
      int32_t top_k, row;
      double u;
      int32_t n_top, n_pen, pen_off;
      float min_p;
    } a;
    memcpy(&a, (const char *)PV(3) + sizeof a * b, sizeof a);
    const float *x = PF(2) + (size_t)a.row * (size_t)vocab;
    irt_sampling p = {
        .temperature = a.temperature, .top_k = a.top_k, .top_p = a.top_p, .min_p = a.min_p};
    irt_sampler *s;
    int32_t tok = -1;
    float *w = malloc(sizeof(float) * (size_t)vocab); /* the row with the penalties */
    if (w) memcpy(w, x, sizeof(float) * (size_t)vocab);
    for (int j = 0; w && j < a.n_pen; j++) w[PI(6)[a.pen_off + j]] -= PF(7)[a.pen_off + j];
    if (w && irt_sampler_create(&p, vocab, &s, NULL) == IRT_OK) {
      tok = sampler_sample_u(s, w, a.u);
      irt_sampler_destroy(s);
    }
    free(w);
    double lse = kn_log_sum_exp(x, vocab);
    float lp = tok < 0 ? NAN : (float)((double)x[tok] - lse);
    memcpy((char *)PV(0) + 8 * b, &tok, 4);
    memcpy((char *)PV(0) + 8 * b + 4, &lp, 4);
    int32_t ids[20];
    float lps[20];
    int nt = a.n_top > 20 ? 20 : a.n_top;
    sampler_top_logprobs(x, vocab, lse, nt, ids, lps);
    for (int j = 0; j < nt; j++) {
      memcpy((char *)PV(1) + 8 * (20 * b + (unsigned)j), &ids[j], 4);
      memcpy((char *)PV(1) + 8 * (20 * b + (unsigned)j) + 4, &lps[j], 4);
    }
  }
}

/* kn_dequant_<t>: out (f16), w, n_blocks; whole blocks of the grid-stride loop */
static void emu_dequant(const launch_t *l, ir_dtype t) {
  long long bb = kn_quant_block_bytes(t);
  float v[32];
  if (l->block != 256 || !l->grid[0]) abort();
  for (long long b = 0; b < I64(2); b++) {
    kn_dequant_row((const uint8_t *)PV(1) + b * bb, t, v, 32);
    for (int i = 0; i < 32; i++) ((uint16_t *)PV(0))[b * 32 + i] = ir_f32_to_f16(v[i]);
  }
}

/* Kernel launches run so far, by k_fns entry (fake_cuda_launches). */
static long long g_launches[sizeof k_fns / sizeof k_fns[0]], g_pdl_launches;
static bool g_next_pdl; /* set by cuLaunchKernelEx for the cuLaunchKernel it calls */

EXPORT long long fake_cuda_launches(const char *prefix);
long long fake_cuda_launches(const char *prefix) {
  long long n = 0;
  for (size_t i = 0; i < sizeof k_fns / sizeof k_fns[0]; i++)
    if (!strncmp(k_fns[i].name, prefix, strlen(prefix))) n += g_launches[i];
  return n;
}

static void run_launch(const launch_t *l) {
  char name[64];
  g_launches[l->fn]++;
  g_pdl_launches += l->pdl;
  size_t len = strlen(k_fns[l->fn].name);
  g_kv_f16 = len > 4 && !strcmp(k_fns[l->fn].name + len - 4, "_f16") &&
             (strstr(k_fns[l->fn].name, "attn") || strstr(k_fns[l->fn].name, "kv_write"));
  snprintf(name, sizeof name, "%.*s", (int)(g_kv_f16 ? len - 4 : len), k_fns[l->fn].name);
  if (!strcmp(name, "kn_attn_decode")) emu_decode(l);
  else if (!strcmp(name, "kn_attn_decode_reduce")) emu_reduce(l);
  else if (!strcmp(name, "kn_attn_prefill")) emu_prefill(l, 16);
  else if (!strcmp(name, "kn_attn_prefill_tc")) emu_prefill(l, 64);
  else if (!strcmp(name, "kn_kv_write")) emu_kv_write(l);
  else if (!strcmp(name, "kn_rope_kv_write")) emu_rope_kv_write(l);
  else if (!strcmp(name, "kn_pick")) emu_pick(l);
  else if (!strncmp(name, "kn_gemv_wq_", 11))
    emu_gemv_wq(l, name[11] == 'f' ? IR_F8_E4M3 : name[12] == '4' ? IR_I4 : IR_I8);
  else if (!strncmp(name, "kn_dequant_wq_", 14))
    emu_dequant_wq(l, name[14] == 'f' ? IR_F8_E4M3 : name[15] == '4' ? IR_I4 : IR_I8);
  else if (!strncmp(name, "kn_gemv_", 8)) {
    const char *sw = strstr(name, "_swiglu");
    char dt[8];
    snprintf(dt, sizeof dt, "%.*s", sw ? (int)(sw - name - 8) : 7, name + 8);
    emu_gemv(l, dtype_of(dt), sw != NULL);
  } else if (!strncmp(name, "kn_embed_", 9))
    kn_embed_scaled(NULL, PF(0), PV(1), dtype_of(name + 9), PI(2), l->grid[0], I64(3), F32(l, 4));
  else if (!strncmp(name, "kn_dequant_", 11)) emu_dequant(l, dtype_of(name + 11));
  else emu_simple(l, name);
}

/* --- the recorded stream: a capture, or a graph ------------------------------------------- */

typedef struct op_t {
  int kind; /* 0 launch, 1 copy, 2 gemm */
  launch_t l;
  CUdeviceptr dst, src;
  size_t bytes;
  int g[9];  /* gemm: transa, transb, m, n, k, atype, lda, btype, ldb */
  int g2[3]; /* ctype, ldc, (unused) */
  float alpha, beta;
} op_t;

typedef struct graph_t {
  op_t *ops;
  int n, cap;
} graph_t;

static graph_t *g_capture; /* non-NULL while capturing */

static void record(const op_t *op) {
  if (g_capture->n == g_capture->cap) {
    g_capture->cap = g_capture->cap ? 2 * g_capture->cap : 256;
    g_capture->ops = realloc(g_capture->ops, sizeof(op_t) * (size_t)g_capture->cap);
  }
  g_capture->ops[g_capture->n++] = *op;
}

static float elem(const void *p, int type, size_t i) {
  if (type == 0) return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  if (type == 2) return ir_f16_to_f32(h);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Column-major C(m x n) = alpha op(A) op(B) + beta C, as cublasGemmEx. */
static void run_gemm(const op_t *o) {
  int ta = o->g[0], tb = o->g[1], m = o->g[2], n = o->g[3], k = o->g[4];
  const void *a = (const void *)(uintptr_t)o->src, *b = (const void *)(uintptr_t)o->l.p[0];
  float *c = (float *)(uintptr_t)o->dst;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double s = 0;
      for (int p = 0; p < k; p++)
        s += (double)elem(a, o->g[5], ta ? (size_t)i * o->g[6] + p : (size_t)p * o->g[6] + i) *
             elem(b, o->g[7], tb ? (size_t)p * o->g[8] + j : (size_t)j * o->g[8] + p);
      float *cv = &c[(size_t)j * o->g2[1] + i];
      *cv = (float)(o->alpha * s + (o->beta ? o->beta * *cv : 0));
    }
}

static void run_op(const op_t *o) {
  if (o->kind == 0) run_launch(&o->l);
  else if (o->kind == 1)
    memmove((void *)(uintptr_t)o->dst, (const void *)(uintptr_t)o->src, o->bytes);
  else run_gemm(o);
}

static void submit(const op_t *o) {
  if (g_capture) record(o);
  else run_op(o);
}

/* --- driver API ---------------------------------------------------------------------------- */
#define API(ret, name, ...)                                                                        \
  EXPORT ret name(__VA_ARGS__);                                                                    \
  ret name(__VA_ARGS__)

API(CUresult, cuInit, unsigned f) { return 0; }
/* NVRTC (in the same process, building plans) asks libcuda for its private tables. */
API(CUresult, cuGetExportTable, const void **table, const void *id) {
  *table = NULL;
  return 801; /* CUDA_ERROR_NOT_SUPPORTED */
}
API(CUresult, cuDriverGetVersion, int *v) {
  *v = 13000;
  return 0;
}
API(CUresult, cuDeviceGetCount, int *n) {
  *n = 1;
  return 0;
}
API(CUresult, cuDeviceGet, int *d, int i) {
  *d = 0;
  return i == 0 ? 0 : 101;
}
API(CUresult, cuDeviceGetName, char *s, int len, int d) {
  snprintf(s, (size_t)len, "Fake GPU");
  return 0;
}
API(CUresult, cuDeviceGetAttribute, int *v, int attr, int d) {
  *v = attr == 75 ? g_arch / 10 : attr == 76 ? g_arch % 10 : attr == 16 ? 132 : 1;
  return 0;
}
static int g_ctx;
API(CUresult, cuDevicePrimaryCtxRetain, void **c, int d) {
  *c = &g_ctx;
  return 0;
}
API(CUresult, cuDevicePrimaryCtxRelease_v2, int d) { return 0; }
API(CUresult, cuCtxSetCurrent, void *c) { return c == &g_ctx ? 0 : 201; }
static int g_mod;
API(CUresult, cuModuleLoadData, void **m, const void *image) {
  *m = &g_mod;
  return 0;
}
API(CUresult, cuModuleUnload, void *m) { return 0; }
API(CUresult, cuModuleGetFunction, void **f, void *m, const char *name) {
  for (int i = 0; i < N_FNS; i++)
    if (!strcmp(k_fns[i].name, name)) {
      *f = (void *)&k_fns[i];
      return 0;
    }
  return 500; /* CUDA_ERROR_NOT_FOUND */
}
API(CUresult, cuMemAlloc_v2, CUdeviceptr *p, size_t n) {
  void *q = NULL;
  if (n > g_max_alloc || posix_memalign(&q, 256, n ? n : 1)) return 2;
  memset(q, 0xff, n); /* never zero: the backend must zero what it promises zeroed */
  *p = (CUdeviceptr)(uintptr_t)q;
  return 0;
}
API(CUresult, cuMemFree_v2, CUdeviceptr p) {
  free((void *)(uintptr_t)p);
  return 0;
}
API(CUresult, cuMemAllocHost_v2, void **p, size_t n) { return (*p = malloc(n ? n : 1)) ? 0 : 2; }
API(CUresult, cuMemFreeHost, void *p) {
  free(p);
  return 0;
}
API(CUresult, cuMemGetInfo_v2, size_t *fr, size_t *tot) {
  *fr = (size_t)6 << 30, *tot = (size_t)8 << 30;
  return 0;
}
static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  op_t o = {.kind = 1, .dst = dst, .src = src, .bytes = n};
  submit(&o);
  return 0;
}
API(CUresult, cuMemcpyHtoDAsync_v2, CUdeviceptr d, const void *s, size_t n, void *st) {
  return g_capture ? 900 : copy(d, (CUdeviceptr)(uintptr_t)s, n); /* illegal while capturing */
}
API(CUresult, cuMemcpyDtoHAsync_v2, void *d, CUdeviceptr s, size_t n, void *st) {
  return g_capture ? 900 : copy((CUdeviceptr)(uintptr_t)d, s, n);
}
API(CUresult, cuMemcpyDtoDAsync_v2, CUdeviceptr d, CUdeviceptr s, size_t n, void *st) {
  return copy(d, s, n);
}
API(CUresult, cuMemsetD8Async, CUdeviceptr d, unsigned char v, size_t n, void *st) {
  if (g_capture) return 900;
  memset((void *)(uintptr_t)d, v, n);
  return 0;
}
API(CUresult, cuLaunchKernel, void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
    unsigned by, unsigned bz, unsigned smem, void *st, void **params, void **extra) {
  int fn = (int)((const char *)f - (const char *)k_fns) / (int)sizeof k_fns[0];
  op_t o = {.kind = 0, .l = {.fn = fn, .grid = {gx, gy, gz}, .block = bx, .pdl = g_next_pdl}};
  if (!gx || !gy || !gz || !bx || bx > 1024 || by != 1 || bz != 1 || extra) return 1;
  for (int i = 0; i < k_fns[fn].n; i++) {
    if (k_fns[fn].sizes[i] == '8') memcpy(&o.l.p[i], params[i], 8);
    else memcpy(&o.l.p[i], params[i], 4);
  }
  submit(&o);
  return 0;
}
/* cuLaunchKernelEx with cuda.h's CUlaunchConfig / CUlaunchAttribute layout: the one
 * attribute the backend sets (programmatic stream serialization, value 1) is checked and
 * counted; the fake runs launches in order anyway, which is what griddepcontrol.wait in
 * every kernel (kn_pdl) makes of them on a GPU. */
typedef struct fake_attr {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int value;
    void *align;
  } value;
} fake_attr;
typedef struct fake_launch_config {
  unsigned gx, gy, gz, bx, by, bz, smem;
  void *stream;
  fake_attr *attrs;
  unsigned n_attrs;
} fake_launch_config;
/* Launches run (replays included) that were launched as programmatic dependents. */
EXPORT long long fake_cuda_pdl_launches(void);
long long fake_cuda_pdl_launches(void) { return g_pdl_launches; }
API(CUresult, cuLaunchKernelEx, const fake_launch_config *c, void *f, void **params, void **extra) {
  if (g_arch < 90 || c->n_attrs != 1 || !c->attrs || c->attrs[0].id != 6 ||
      c->attrs[0].value.value != 1)
    return 1; /* CUDA_ERROR_INVALID_VALUE: only what the backend should ask, where it may */
  g_next_pdl = true;
  CUresult r = cuLaunchKernel(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem, c->stream,
                              params, extra);
  g_next_pdl = false;
  return r;
}
static int g_obj;
API(CUresult, cuStreamCreate, void **s, unsigned f) {
  *s = &g_obj;
  return 0;
}
API(CUresult, cuStreamDestroy_v2, void *s) { return 0; }
API(CUresult, cuStreamSynchronize, void *s) { return g_capture ? 900 : 0; }
API(CUresult, cuStreamBeginCapture_v2, void *s, int mode) {
  if (g_capture) return 900;
  g_capture = calloc(1, sizeof *g_capture);
  return 0;
}
API(CUresult, cuStreamEndCapture, void *s, void **graph) {
  *graph = g_capture;
  g_capture = NULL;
  return *graph ? 0 : 901;
}
static int g_fail_instantiate;
/* The next n graph instantiations fail (the backend must fall back to eager steps). */
EXPORT void fake_cuda_fail_instantiate(int n);
void fake_cuda_fail_instantiate(int n) { g_fail_instantiate = n; }
API(CUresult, cuGraphInstantiateWithFlags, void **exec, void *graph, unsigned long long fl) {
  if (g_fail_instantiate > 0) {
    g_fail_instantiate--;
    *exec = NULL;
    return 999; /* CUDA_ERROR_UNKNOWN */
  }
  graph_t *g = graph, *e = calloc(1, sizeof *e);
  e->n = e->cap = g->n;
  e->ops = malloc(sizeof(op_t) * (size_t)(g->n ? g->n : 1));
  memcpy(e->ops, g->ops, sizeof(op_t) * (size_t)g->n);
  *exec = e;
  return 0;
}
static int g_replays, g_tiled_replays;
/* Graph launches so far (the test checks that decode steps replay graphs), and those of
 * graphs with tiled attention (kn_attn_prefill*: drafted steps' graphs). */
EXPORT int fake_cuda_replays(void);
int fake_cuda_replays(void) { return g_replays; }
EXPORT int fake_cuda_tiled_replays(void);
int fake_cuda_tiled_replays(void) { return g_tiled_replays; }
API(CUresult, cuGraphLaunch, void *exec, void *st) {
  graph_t *e = exec;
  bool tiled = false;
  for (int i = 0; i < e->n; i++) {
    run_op(&e->ops[i]);
    tiled |= e->ops[i].kind == 0 && !strncmp(k_fns[e->ops[i].l.fn].name, "kn_attn_prefill", 15);
  }
  g_replays++;
  g_tiled_replays += tiled;
  return 0;
}
static void graph_free(graph_t *g) {
  if (g) free(g->ops);
  free(g);
}
API(CUresult, cuGraphExecDestroy, void *e) {
  graph_free(e);
  return 0;
}
API(CUresult, cuGraphDestroy, void *g) {
  graph_free(g);
  return 0;
}
/* Events: the host clock at record (the fake's launches run at once, on the host). */
API(CUresult, cuEventCreate, void **e, unsigned f) {
  (void)f;
  return (*e = calloc(1, sizeof(struct timespec))) ? 0 : 2;
}
API(CUresult, cuEventRecord, void *e, void *s) {
  (void)s;
  clock_gettime(CLOCK_MONOTONIC, e);
  return 0;
}
API(CUresult, cuEventSynchronize, void *e) { return 0; }
API(CUresult, cuEventDestroy_v2, void *e) {
  free(e);
  return 0;
}
API(CUresult, cuEventElapsedTime, float *ms, void *a, void *b) {
  const struct timespec *x = a, *y = b;
  *ms = (float)((y->tv_sec - x->tv_sec) * 1e3 + (y->tv_nsec - x->tv_nsec) * 1e-6);
  return 0;
}
API(CUresult, cuGetErrorString, CUresult r, const char **s) {
  *s = r == 2 ? "out of memory (fake)" : "fake CUDA error";
  return 0;
}

/* --- cuBLAS -------------------------------------------------------------------------------- */
static int g_blas;
API(int, cublasCreate_v2, void **h) {
  *h = &g_blas;
  return 0;
}
API(int, cublasDestroy_v2, void *h) { return 0; }
API(int, cublasSetStream_v2, void *h, void *s) { return 0; }
API(int, cublasSetWorkspace_v2, void *h, void *w, size_t n) { return 0; }
API(int, cublasGemmEx, void *h, int ta, int tb, int m, int n, int k, const void *alpha,
    const void *a, int at, int lda, const void *b, int bt, int ldb, const void *beta, void *c,
    int ct, int ldc, int compute, int algo) {
  if (ct != 0 || compute != 68 || at != bt) return 7; /* CUBLAS_STATUS_INVALID_VALUE */
  op_t o = {.kind = 2,
            .dst = (CUdeviceptr)(uintptr_t)c,
            .src = (CUdeviceptr)(uintptr_t)a,
            .g = {ta, tb, m, n, k, at, lda, bt, ldb},
            .g2 = {ct, ldc, 0},
            .alpha = *(const float *)alpha,
            .beta = *(const float *)beta};
  o.l.p[0] = (uint64_t)(uintptr_t)b;
  submit(&o);
  return 0;
}
