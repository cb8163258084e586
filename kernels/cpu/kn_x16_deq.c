/* kn_x16_deq: block-quantized W rows dequantized to bf16 in IR_BF16_X16's layout, the
 * operand the bf16x16 matmuls read (kn_matmul_bf16q: W tiles converted once per step, then
 * summed as bf16 weights). A value is kn_quant_value's f32 (kn_quant.h) rounded to bf16 as
 * vcvtneps2bf16 rounds (kn_bf16_round): one definition, computed by the portable loop for
 * every layout and by AVX-512 (with AVX512-BF16's conversion) from the 8-row interleaved
 * one, bit for bit alike (test_matmul_bf16). The portable loop is a reference, slow: the
 * path is meant for CPUs with AVX512-BF16 (and AMX-BF16, whose tiles make it pay). */
#include <string.h>

#include "kn_bf16.h"
#include "kn_cpu.h"
#include "kn_quant.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define KN_DEQ_X86 1
enum { KN_DEQ_PREFETCH = 16384 }; /* bytes ahead in each of the two 8-row groups */
#else
#define KN_DEQ_X86 0
#endif

/* Row `row` of W's block b (base layout, or IR_*_X8's), decoded. */
static void deq_block(const void *w, ir_dtype wt, int64_t k, int64_t row, int64_t b, float *v) {
  ir_dtype base = ir_dtype_x8_base(wt);
  uint8_t tmp[34] = {0};
  const uint8_t *blk = tmp;
  if (ir_dtype_is_x8(wt)) kn_x8_block(w, base, k, row, b, tmp);
  else blk = (const uint8_t *)w + (row * (k / KN_QBLOCK) + b) * kn_quant_block_bytes(base);
  float q[KN_QBLOCK], d, m;
  kn_quant_block(blk, base, q, &d, &m);
  for (int i = 0; i < KN_QBLOCK; i++) v[i] = kn_quant_value(base, q[i], d, m);
}

static void deq_group_c(const void *w, ir_dtype wt, int64_t k, int64_t g, uint32_t *dst) {
  for (int i = 0; i < 16; i++)
    for (int64_t b = 0; b < k / KN_QBLOCK; b++) {
      float v[KN_QBLOCK];
      deq_block(w, wt, k, 16 * g + i, b, v);
      for (int t = 0; t < KN_QBLOCK / 2; t++)
        dst[(b * 16 + t) * 16 + i] = kn_bf16_round(v[2 * t]) | (uint32_t)kn_bf16_round(v[2 * t + 1])
                                                                   << 16;
    }
}

#if KN_DEQ_X86
#define DEQ_AVX512 __attribute__((target("avx512f,avx512bw,avx512bf16,avx2,fma,f16c")))
#define DEQ_INLINE                                                                                 \
  static inline __attribute__((target("avx512f,avx512bw,avx512bf16,avx2,fma,f16c"), always_inline))

/* Words of two runs interleaved: lane i of e (value 2p of row i) and of o (2p + 1). */
DEQ_INLINE void deq_put(uint32_t *dst, __m512 e, __m512 o, __m512i idx) {
  __m512i h = (__m512i)_mm512_cvtne2ps_pbh(o, e); /* words 0-15: e, 16-31: o */
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(idx, h));
}

/* 16 rows from two 8-row groups of IR_*_X8 (ga, gb: a block's group start in each), block
 * by block: the 16 rows' d (and m) in one vector each, a 32-byte code chunk of each group
 * side by side in one register, its lane i row i's 4 code bytes. */
DEQ_INLINE void deq_group_x8(const uint8_t *ga, const uint8_t *gb, ir_dtype base, int64_t nb,
                             int64_t gstep, uint32_t *dst) {
  __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23,
                                 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const int head = kn_x8_head(base);
  const __m512i nib = _mm512_set1_epi32(0x0f);
  for (int64_t b = 0; b < nb; b++, ga += gstep, gb += gstep, dst += 256) {
    /* W streams from memory (a short prompt reads each tile once): ask for it ahead */
    for (int64_t o = 0; o < gstep; o += 64) {
      _mm_prefetch((const char *)ga + KN_DEQ_PREFETCH + o, _MM_HINT_T0);
      _mm_prefetch((const char *)gb + KN_DEQ_PREFETCH + o, _MM_HINT_T0);
    }
    __m512 d = _mm512_cvtph_ps(
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)ga)),
                                _mm_loadu_si128((const __m128i *)gb), 1));
    __m512 m = _mm512_setzero_ps();
    if (base == IR_Q4_1)
      m = _mm512_cvtph_ps(_mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(ga + 16))),
          _mm_loadu_si128((const __m128i *)(gb + 16)), 1));
    const int chunks = base == IR_Q8_0 ? 8 : 4;
    for (int j = 0; j < chunks; j++) {
      __m512i v = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ga + head + 32 * j))),
          _mm256_loadu_si256((const __m256i *)(gb + head + 32 * j)), 1);
      if (base == IR_Q8_0) { /* values 4j .. 4j + 3: pairs 2j, 2j + 1 */
        __m512 f[4];
        for (int t = 0; t < 4; t++) {
          __m512i s = _mm512_srai_epi32(t == 3 ? v : _mm512_slli_epi32(v, 24 - 8 * t), 24);
          f[t] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s));
        }
        deq_put(dst + (2 * j) * 16, f[0], f[1], idx);
        deq_put(dst + (2 * j + 1) * 16, f[2], f[3], idx);
        continue;
      }
      /* nibbles: low t -> value 4j + t, high t -> value 16 + 4j + t */
      __m512 f[8];
      for (int t = 0; t < 8; t++) {
        __m512i q = _mm512_and_si512(t ? _mm512_srli_epi32(v, 4 * t) : v, nib);
        __m512 qf = _mm512_cvtepi32_ps(q);
        if (base == IR_Q4_1) f[t] = _mm512_fmadd_ps(d, qf, m);
        else f[t] = _mm512_mul_ps(d, _mm512_sub_ps(qf, _mm512_set1_ps(8.0f)));
      }
      /* f[2t]: low nibble of byte t, f[2t + 1]: its high nibble */
      deq_put(dst + (2 * j) * 16, f[0], f[2], idx);
      deq_put(dst + (2 * j + 1) * 16, f[4], f[6], idx);
      deq_put(dst + (8 + 2 * j) * 16, f[1], f[3], idx);
      deq_put(dst + (9 + 2 * j) * 16, f[5], f[7], idx);
    }
  }
}

/* one copy a type, its branches folded */
static DEQ_AVX512 void deq_x8_q8_0(const uint8_t *ga, const uint8_t *gb, int64_t nb,
                                   uint32_t *dst) {
  deq_group_x8(ga, gb, IR_Q8_0, nb, 8 * 34, dst);
}
static DEQ_AVX512 void deq_x8_q4_0(const uint8_t *ga, const uint8_t *gb, int64_t nb,
                                   uint32_t *dst) {
  deq_group_x8(ga, gb, IR_Q4_0, nb, 8 * 18, dst);
}
static DEQ_AVX512 void deq_x8_q4_1(const uint8_t *ga, const uint8_t *gb, int64_t nb,
                                   uint32_t *dst) {
  deq_group_x8(ga, gb, IR_Q4_1, nb, 8 * 20, dst);
}
#endif

void kn_x16_dequant(const void *w, ir_dtype wt, int64_t k, int64_t g, uint32_t *dst) {
#if KN_DEQ_X86
  if (ir_dtype_is_x8(wt) && kn_cpu_isa() >= 2 && kn_cpu_has_avx512bf16()) {
    ir_dtype base = ir_dtype_x8_base(wt);
    int64_t nb = k / KN_QBLOCK, bb = kn_quant_block_bytes(base);
    /* x8 groups 2g and 2g + 1; a group's block b at (group * nb + b) * 8 bb */
    const uint8_t *ga = (const uint8_t *)w + (2 * g) * nb * 8 * bb;
    const uint8_t *gb = ga + nb * 8 * bb;
    if (base == IR_Q8_0) deq_x8_q8_0(ga, gb, nb, dst);
    else if (base == IR_Q4_0) deq_x8_q4_0(ga, gb, nb, dst);
    else deq_x8_q4_1(ga, gb, nb, dst);
    return;
  }
#endif
  deq_group_c(w, wt, k, g, dst);
}
