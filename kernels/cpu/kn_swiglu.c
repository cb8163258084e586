/* kn_swiglu: the gated activations of the MLPs, silu(gate) * up (Llama) and
 * gelu_tanh(gate) * up (Gemma), and the tanh soft cap. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kn_cpu.h"
#include "kn_vexp.h"

/* a chunk this size outweighs the cost of waking the pool */
enum { KN_SWIGLU_GRAIN = 8192 };

/* Both gates are g * sigmoid(a) (gelu_tanh(g) = 0.5 g (1 + tanh(z)) = g * sigmoid(2z)): a = g
 * for silu, a = g (2 beta + 2 beta kappa g^2) for gelu_tanh, its square's product with the
 * constant added by one fused multiply-add on every path (so the paths agree bit for bit).
 * sigmoid(a) = s from e = kn_vexp(-|a|) <= 1: 1 / (1 + e) for a >= 0, e / (1 + e) below,
 * so no path overflows. */
#define GELU_C1 1.5957691216057308f  /* 2 sqrt(2 / pi) */
#define GELU_C2 0.07135481627159589f /* 2 sqrt(2 / pi) 0.044715 */

static inline float gate_mul_c(float g, float a, float u) {
  float e = kn_vexp(-fabsf(a));
  float s = (a >= 0.0f ? 1.0f : e) / (1.0f + e);
  return g * s * u;
}

static inline float gelu_arg_c(float g) { return g * fmaf(g * g, GELU_C2, GELU_C1); }

#if defined(__x86_64__) || defined(__i386__)
#define SILU_AVX2 __attribute__((target("avx2,fma")))
#define SILU_AVX512 __attribute__((target("avx2,fma,avx512f")))

static inline SILU_AVX2 __attribute__((always_inline)) __m256 gate_mul8(__m256 g, bool gelu,
                                                                        __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 a = gelu ? _mm256_mul_ps(g, _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(GELU_C2),
                                                     _mm256_set1_ps(GELU_C1)))
                  : g;
  __m256 e = kn_vexp8(_mm256_or_ps(a, _mm256_set1_ps(-0.0f))); /* -|a| */
  __m256 num = _mm256_blendv_ps(e, one, _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GE_OQ));
  return _mm256_mul_ps(_mm256_mul_ps(g, _mm256_div_ps(num, _mm256_add_ps(one, e))), u);
}

static inline SILU_AVX512 __attribute__((always_inline)) __m512 gate_mul16(__m512 g, bool gelu,
                                                                           __m512 u) {
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 a = gelu ? _mm512_mul_ps(g, _mm512_fmadd_ps(_mm512_mul_ps(g, g), _mm512_set1_ps(GELU_C2),
                                                     _mm512_set1_ps(GELU_C1)))
                  : g;
  __m512 e = kn_vexp16(_mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(a), _mm512_set1_epi32((int)0x80000000u))));
  __m512 num = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_GE_OQ), e, one);
  return _mm512_mul_ps(_mm512_mul_ps(g, _mm512_div_ps(num, _mm512_add_ps(one, e))), u);
}

static SILU_AVX2 void gate_mul_avx2(float *y, const float *g, const float *u, int64_t n,
                                    bool gelu) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, gate_mul8(_mm256_loadu_ps(g + i), gelu, _mm256_loadu_ps(u + i)));
  if (i == n) return;
  float gb[8] = {0}, ub[8] = {0}, yb[8];
  memcpy(gb, g + i, (size_t)(n - i) * sizeof *g);
  memcpy(ub, u + i, (size_t)(n - i) * sizeof *u);
  _mm256_storeu_ps(yb, gate_mul8(_mm256_loadu_ps(gb), gelu, _mm256_loadu_ps(ub)));
  memcpy(y + i, yb, (size_t)(n - i) * sizeof *y);
}

/* gate_mul16 is gate_mul8 lane for lane (kn_vexp16 is kn_vexp8's; the rest rounds once) */
static SILU_AVX512 void gate_mul_avx512(float *y, const float *g, const float *u, int64_t n,
                                        bool gelu) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, gate_mul16(_mm512_loadu_ps(g + i), gelu, _mm512_loadu_ps(u + i)));
  if (i < n) gate_mul_avx2(y + i, g + i, u + i, n - i, gelu);
}
#endif

static void gate_mul_n(float *y, const float *g, const float *u, int64_t n, bool gelu) {
#if defined(__x86_64__) || defined(__i386__)
  int isa = kn_cpu_isa();
  if (isa >= 2) {
    gate_mul_avx512(y, g, u, n, gelu);
    return;
  }
  if (isa >= 1) {
    gate_mul_avx2(y, g, u, n, gelu);
    return;
  }
#endif
  for (int64_t i = 0; i < n; i++) y[i] = gate_mul_c(g[i], gelu ? gelu_arg_c(g[i]) : g[i], u[i]);
}

void kn_silu_mul_n(float *y, const float *g, const float *u, int64_t n) {
  gate_mul_n(y, g, u, n, false);
}

float kn_silu_mul(float g, float u) {
  float y;
  kn_silu_mul_n(&y, &g, &u, 1);
  return y;
}

void kn_gelu_mul_n(float *y, const float *g, const float *u, int64_t n) {
  gate_mul_n(y, g, u, n, true);
}

float kn_gelu_tanh_mul(float g, float u) {
  float y;
  kn_gelu_mul_n(&y, &g, &u, 1);
  return y;
}

float kn_softcap1(float x, float cap) { return cap * tanhf(x / cap); }

typedef struct swiglu_args {
  float *out;
  const float *gate;
  const float *up;
  bool gelu;
  float cap;
} swiglu_args;

static void gate_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const swiglu_args *a = arg;
  gate_mul_n(a->out + begin, a->gate + begin, a->up + begin, end - begin, a->gelu);
}

void kn_swiglu(kn_pool *p, float *out, const float *gate, const float *up, int64_t n) {
  swiglu_args a = {.out = out, .gate = gate, .up = up, .gelu = false};
  kn_parallel_for(p, n, KN_SWIGLU_GRAIN, gate_task, &a);
}

void kn_geglu(kn_pool *p, float *out, const float *gate, const float *up, int64_t n) {
  swiglu_args a = {.out = out, .gate = gate, .up = up, .gelu = true};
  kn_parallel_for(p, n, KN_SWIGLU_GRAIN, gate_task, &a);
}

static void softcap_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  const swiglu_args *a = arg;
  for (int64_t i = begin; i < end; i++) a->out[i] = kn_softcap1(a->gate[i], a->cap);
}

void kn_softcap(kn_pool *p, float *out, const float *x, int64_t n, float cap) {
  swiglu_args a = {.out = out, .gate = x, .cap = cap};
  kn_parallel_for(p, n, KN_SWIGLU_GRAIN / 4, softcap_task, &a);
}
