/* kn_logits: per-row reductions over a vocabulary of logits that the engine needs for
 * every sampled token: log-sum-exp (a token's logprob is its logit minus it). */
#include <math.h>

#include "kn_cpu.h"
#include "kn_vexp.h"

/* The largest x, NaNs skipped (the sum propagates them) unless x[0] is one. */
static float max_c(const float *x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

static double lse_c(const float *x, int64_t n, float mx) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) sum += kn_vexp(x[i] - mx);
  return sum;
}

#if defined(__x86_64__) || defined(__i386__)
#define LG_AVX2 __attribute__((target("avx2,fma")))

static LG_AVX2 float max_avx2(const float *x, int64_t n) {
  __m256 m0 = _mm256_set1_ps(x[0]), m1 = m0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_max_ps(m0, m1));
  float mx = max_c(lanes, 8);
  for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

/* e^(x - mx) in f32 lanes, summed in f64 (four accumulators of 4 lanes). */
static LG_AVX2 double lse_avx2(const float *x, int64_t n, float mx) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  __m256 m = _mm256_set1_ps(mx);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 e0 = kn_vexp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    __m256 e1 = kn_vexp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), m));
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e0)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1)));
    a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm256_castps256_ps128(e1)));
    a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1)));
  }
  double lanes[4];
  _mm256_storeu_pd(lanes, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lse_c(x + i, n - i, mx);
}
#endif

/* The result when the max is not finite: NaN if any x is (the max scans skip NaNs). */
static double lse_nonfinite(const float *x, int64_t n, float mx) {
  for (int64_t i = 0; i < n; i++)
    if (isnan(x[i])) return NAN;
  return mx;
}

double kn_log_sum_exp(const float *x, int64_t n) {
  if (n <= 0) return -INFINITY;
#if defined(__x86_64__) || defined(__i386__)
  if (kn_cpu_isa() >= 1) {
    float mx = max_avx2(x, n);
    if (!isfinite(mx)) return lse_nonfinite(x, n, mx); /* all -inf, or +inf somewhere */
    return mx + log(lse_avx2(x, n, mx));
  }
#endif
  float mx = max_c(x, n);
  if (!isfinite(mx)) return lse_nonfinite(x, n, mx);
  return mx + log(lse_c(x, n, mx));
}
