// sampling.cu: token selection on the device, the same function as runtime/sampler.c.
// kn_argmax: out[r] = the lowest id among the largest logits of row r.
// kn_sample_topk_topp: keeps the top_k best logits (1 <= top_k <= TOPK_MAX; the host
// samples on the CPU when top_k is 0 or larger), weights exp((x - max) / temperature),
// keeps the smallest prefix with mass >= top_p (when 0 < top_p < 1), and picks the token
// where u[r] * mass falls: u[r] in [0, 1) comes from the host's seeded generator, so
// device and host choose the same token. Candidates are ordered by larger logit, then
// lower id, as the CPU sampler orders them.
// Launch: grid (n_rows), block (SAMPLE_THREADS); logits (n_rows, vocab) f32.

#ifndef SAMPLE_THREADS
#define SAMPLE_THREADS 1024
#endif
#ifndef TOPK_MAX
#define TOPK_MAX 64
#endif
#define SM_NEG_INF (-__int_as_float(0x7f800000))

// Is (v, i) ordered before (bv, bi)? Larger value first, lower id on ties.
__device__ __forceinline__ bool smp_better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// Block-wide best (value, id) among the elements ordered after (pv, pi) (pi < 0: all).
__device__ void smp_best_after(const float *x, int vocab, float pv, int pi, float *out_v,
                               int *out_i) {
  __shared__ float sv[SAMPLE_THREADS / 32];
  __shared__ int si[SAMPLE_THREADS / 32];
  float bv = SM_NEG_INF;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
    float v = x[i];
    if (pi >= 0 && !smp_better(pv, pi, v, i)) continue;
    if (smp_better(v, i, bv, bi)) bv = v, bi = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (smp_better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < SAMPLE_THREADS / 32; w++)
      if (smp_better(sv[w], si[w], sv[0], si[0])) sv[0] = sv[w], si[0] = si[w];
  }
  __syncthreads();
  *out_v = sv[0];
  *out_i = si[0];
  __syncthreads();  // sv/si are reused by the next call
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    kn_argmax(int *out, const float *logits, int vocab) {
  float v;
  int i;
  smp_best_after(logits + (long long)blockIdx.x * vocab, vocab, 0.0f, -1, &v, &i);
  if (threadIdx.x == 0) out[blockIdx.x] = i;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    kn_sample_topk_topp(int *out, const float *logits, int vocab, float temperature, int top_k,
                        float top_p, const float *u) {
  __shared__ float cv[TOPK_MAX];
  __shared__ int ci[TOPK_MAX];
  const float *x = logits + (long long)blockIdx.x * vocab;
  const int k = min(min(top_k, TOPK_MAX), vocab);
  float pv = 0.0f;
  int pi = -1;
  for (int c = 0; c < k; c++) {  // selection in order: k passes over the row
    smp_best_after(x, vocab, pv, pi, &pv, &pi);
    if (threadIdx.x == 0) cv[c] = pv, ci[c] = pi;
  }
  if (threadIdx.x != 0) return;
  // Weights rounded to float and summed in double, as the CPU sampler does; they
  // overwrite the logits in shared memory (no local-memory array).
  float *w = cv;
  double inv_t = 1.0 / (double)temperature, sum = 0.0, top = (double)cv[0];
  for (int c = 0; c < k; c++) {
    w[c] = (float)exp(((double)cv[c] - top) * inv_t);
    sum += w[c];
  }
  int n = k;
  if (top_p > 0.0f && top_p < 1.0f) {  // smallest prefix with mass >= top_p
    double acc = 0.0;
    int keep = 0;
    while (keep < n && acc < (double)top_p * sum) acc += w[keep++];
    n = keep;
    sum = acc;
  }
  double r = (double)u[blockIdx.x] * sum, acc = 0.0;
  for (int c = 0; c < n; c++) {
    acc += w[c];
    if (r < acc) {
      out[blockIdx.x] = ci[c];
      return;
    }
  }
  out[blockIdx.x] = ci[n - 1];
}
