// sampling.cu: the engine's token choice on the device, so that a step's logits never come
// down. kn_pick: one CTA per pick; pick b reads row args[b].row of logits (vocab f32 each)
// and writes out[b] = {token, logprob}:
//   - lse = max + log(sum exp(x - max)), the sum in double; logprob = x[token] - lse;
//   - temperature <= 0: the argmax (lowest id among equal logits);
//   - else runtime/sampler.c's function, with its uniform draw u = args[b].u in [0, 1): the
//     candidates ordered by larger logit then lower id, those more than 40 temperatures
//     below the max dropped (their weight is under 2^-53 of the max's), the top_k best kept
//     (all when 0); weights w = exp((x - max) / temperature) in double, those under min_p
//     dropped (w is the probability relative to the max's), their sum S; with
//     0 < top_p < 1 the smallest prefix whose float-rounded weights reach top_p * S kept and
//     S set to that prefix's mass; the token where u * S falls in the running sum of the
//     float-rounded weights (the last candidate if it falls past the end).
// The same function, without a sort: every "first candidate whose running mass passes R" is
// a select over histograms. Level 1 bins the candidates by d = (max - x) / temperature in
// [0, 40] (PICK_BINS equal bins, monotone in the order), level 2 splits the chosen bin into
// PICK_BINS more, then the distinct logits of the chosen sub-bin are taken one by one in
// order, and among equal logits the ids in ascending order. The sums are added in another
// order than the CPU sampler's, so the two choose different tokens only when u * S lies
// within rounding (about 1e-16 relative) of a boundary between two candidates.
// With n_top > 0 (at most PICK_TOP) it also writes top[b * PICK_TOP + j], j < n_top: the
// n_top largest logits (lower id first among equal ones) and their logprobs. With n_pen >
// 0 the token is chosen (argmax included) from the row less pen_sub[pen_off + j] at
// pen_ids[pen_off + j] (presence/frequency penalties; distinct ids), built in
// work + b * vocab; lse, logprob and alternatives stay those of the row itself.
// Launch: grid (n_picks), block (PICK_THREADS).

#include "kn_cuda.cuh"

#ifndef PICK_THREADS
#define PICK_THREADS 1024
#endif
#define PICK_WARPS (PICK_THREADS / 32)
#define PICK_BINS 2048
#define PICK_SPAN 40.0 /* candidates lie within PICK_SPAN temperatures of the max */
#define PICK_TOP 20    /* most alternatives a pick reports (IRT_MAX_TOP_LOGPROBS) */

// One pick's settings (40 bytes; runtime/backend.h mirrors it as irt_pick_req).
struct kn_pick_args {
  float temperature, top_p;
  int top_k, row;
  double u;
  int n_top, n_pen, pen_off;
  float min_p;
};
struct kn_pick_out {
  int token;
  float logprob;
};

struct pk_smem {
  double bin[PICK_BINS];
  double red[32]; // pk_sum: per warp; pk_scan: per 1/32 of the bins
  unsigned long long kred[PICK_WARPS];
  int wsum[PICK_WARPS];
  double base; // the mass before the chosen bin
  int chosen, found;
};

// The order key: smaller keys come first (larger logits; -0 as +0; NaN last).
__device__ __forceinline__ unsigned pk_key(float f) {
  unsigned u = __float_as_uint(f);
  if (f != f) return 0xffffffffu;
  if (u == 0x80000000u) u = 0;
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); // ascending as unsigned
  return ~u;
}

// Block-wide sum (every thread gets it; warps added in one order, so every thread agrees).
__device__ double pk_sum(double v, pk_smem *sm) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sm->red[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < PICK_WARPS; w++) t += sm->red[w];
  __syncthreads();
  return t;
}

__device__ unsigned long long pk_min(unsigned long long v, pk_smem *sm) {
  for (int o = 16; o > 0; o >>= 1) {
    unsigned long long t = __shfl_xor_sync(0xffffffffu, v, o);
    v = t < v ? t : v;
  }
  if ((threadIdx.x & 31) == 0) sm->kred[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned long long t = sm->kred[0];
  for (int w = 1; w < PICK_WARPS; w++) t = sm->kred[w] < t ? sm->kred[w] : t;
  __syncthreads();
  return t;
}

// One row being sampled: the candidates are those within PICK_SPAN temperatures of the max,
// with weight exp(e) >= min_p (min_p > 0; log_min = log(min_p)), and at or before the
// bound (key, id) in the order.
struct pk_row {
  const float *x;
  int vocab;
  double max, inv_t;
  unsigned bkey;
  int bid;
  double min_p, log_min;
};

// Is element i a candidate? *e = (x - max) / temperature, as the CPU sampler computes it.
__device__ __forceinline__ bool pk_cand(const pk_row &r, int i, unsigned *key, double *e) {
  float v = r.x[i];
  *e = ((double)v - r.max) * r.inv_t;
  if (*e < -PICK_SPAN) return false; // NaN stays, as on the CPU
  // min_p: exp only near the threshold (the CPU compares exp(e) with min_p)
  if (r.min_p > 0.0 && *e < r.log_min + 1e-9 && (*e < r.log_min - 1e-9 || exp(*e) < r.min_p))
    return false;
  *key = pk_key(v);
  return *key < r.bkey || (*key == r.bkey && i <= r.bid);
}

// The level-1 bin and level-2 sub-bin of a candidate: both monotone in its order.
__device__ __forceinline__ void pk_bins(double e, int *b1, int *b2) {
  double q = -e * (PICK_BINS / PICK_SPAN);
  if (!(q >= 0.0)) q = 0.0; // NaN
  int c = q < PICK_BINS - 1 ? (int)q : PICK_BINS - 1;
  double f = (q - c) * PICK_BINS;
  *b1 = c;
  *b2 = f < PICK_BINS - 1 ? (int)f : PICK_BINS - 1;
}

// Is element i a candidate? If so, its key, e (as pk_cand) and bins (as pk_bins).
__device__ __forceinline__ bool pk_binned(const pk_row &r, int i, unsigned *key, double *e,
                                          int *b1, int *b2) {
  if (!pk_cand(r, i, key, e)) return false;
  pk_bins(*e, b1, b2);
  return true;
}

// A candidate's mass: 1 (counting), or its weight rounded to float (the CPU sampler walks
// float weights).
__device__ __forceinline__ double pk_mass(bool count, double e) {
  return count ? 1.0 : (double)(float)exp(e);
}

// Does the running mass pass R? (> R, or >= R when ge)
__device__ __forceinline__ bool pk_passes(double acc, double R, bool ge) {
  return ge ? acc >= R : acc > R;
}

// After a histogram in sm->bin: the first bin where base + its running sum passes R, else
// the last non-empty bin (thread 0 scans, warp sums first); sm->chosen, sm->base set.
__device__ void pk_scan(pk_smem *sm, double base, double R, bool ge) {
  const int per = PICK_BINS / 32;
  if (threadIdx.x < 32) {
    double s = 0.0;
    for (int j = 0; j < per; j++) s += sm->bin[threadIdx.x * per + j];
    sm->red[threadIdx.x] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const double base0 = base;
    int lane = 0, chosen = -1;
    for (; lane < 32 && !pk_passes(base + sm->red[lane], R, ge); lane++) base += sm->red[lane];
    for (int j = lane * per; lane < 32 && j < (lane + 1) * per && chosen < 0; j++) {
      if (pk_passes(base + sm->bin[j], R, ge)) chosen = j;
      else base += sm->bin[j];
    }
    if (chosen < 0) { // nothing passes: the last non-empty bin (bin 0 if all are empty)
      chosen = 0;
      for (int j = 0; j < PICK_BINS; j++)
        if (sm->bin[j] > 0.0) chosen = j;
      base = base0;
      for (int j = 0; j < chosen; j++) base += sm->bin[j];
    }
    sm->chosen = chosen;
    sm->base = base;
  }
  __syncthreads();
}

// The id of the j-th (from 0) candidate with order key `key`, in ascending id order.
__device__ int pk_nth(const pk_row &r, unsigned key, int j, pk_smem *sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) sm->found = -1;
  __syncthreads();
  int seen = 0;
  for (int c0 = 0; c0 < r.vocab; c0 += PICK_THREADS) {
    int i = c0 + threadIdx.x;
    unsigned k;
    double e;
    int m = i < r.vocab && pk_cand(r, i, &k, &e) && k == key;
    int pre = m, tot = m; // hypercube scan: pre = inclusive prefix within the warp
    for (int o = 1; o < 32; o <<= 1) {
      int t = __shfl_xor_sync(0xffffffffu, tot, o);
      if (lane & o) pre += t;
      tot += t;
    }
    if (lane == 0) sm->wsum[warp] = tot;
    __syncthreads();
    int before = seen, all = 0;
    for (int w = 0; w < PICK_WARPS; w++) {
      if (w < warp) before += sm->wsum[w];
      all += sm->wsum[w];
    }
    if (m && before + pre - 1 == j) sm->found = i;
    seen += all;
    __syncthreads();
    if (sm->found >= 0) break;
  }
  return sm->found;
}

// The first candidate of r whose running mass passes R: its key and id, and the mass up to
// and including it; past the end, the last candidate and the whole mass.
__device__ void pk_select(const pk_row &r, bool count, double R, bool ge, pk_smem *sm,
                          unsigned *out_key, int *out_id, double *out_cum) {
  double base = 0.0;
  int b1 = 0;
  for (int level = 0; level < 2; level++) {
    for (int b = threadIdx.x; b < PICK_BINS; b += PICK_THREADS) sm->bin[b] = 0.0;
    __syncthreads();
    for (int i = threadIdx.x; i < r.vocab; i += PICK_THREADS) {
      unsigned k;
      double e;
      int c1, c2;
      if (!pk_binned(r, i, &k, &e, &c1, &c2) || (level == 1 && c1 != b1)) continue;
      atomicAdd(&sm->bin[level ? c2 : c1], pk_mass(count, e));
    }
    __syncthreads();
    pk_scan(sm, base, R, ge);
    base = sm->base;
    if (level == 0) b1 = sm->chosen;
  }
  const int b2 = sm->chosen;
  // The distinct keys of sub-bin (b1, b2), in order.
  unsigned key = 0;
  long long n_key = 0;
  double each = 0.0;
  for (bool first = true;; first = false) {
    unsigned long long lo = ~0ull;
    for (int i = threadIdx.x; i < r.vocab; i += PICK_THREADS) {
      unsigned k;
      double e;
      int c1, c2;
      if (pk_binned(r, i, &k, &e, &c1, &c2) && c1 == b1 && c2 == b2 && (first || k > key)) {
        unsigned long long v = (unsigned long long)k << 32 | (unsigned)i;
        lo = v < lo ? v : lo;
      }
    }
    lo = pk_min(lo, sm);
    if (lo == ~0ull) break; // no more: the last key (past the end)
    const unsigned k = (unsigned)(lo >> 32);
    double cnt = 0.0;
    for (int i = threadIdx.x; i < r.vocab; i += PICK_THREADS) {
      unsigned ki;
      double e;
      if (pk_cand(r, i, &ki, &e) && ki == k) cnt += 1.0;
    }
    cnt = pk_sum(cnt, sm);
    unsigned kk;
    double e;
    pk_cand(r, (int)(unsigned)lo, &kk, &e); // equal logits have equal weights
    key = k, n_key = (long long)cnt, each = pk_mass(count, e);
    if (pk_passes(base + cnt * each, R, ge)) { // the j-th of these ids
      double need = (R - base) / each;
      long long j = ge ? (long long)ceil(need) - 1 : (long long)floor(need);
      j = j < 0 ? 0 : j >= n_key ? n_key - 1 : j;
      *out_key = key;
      *out_id = pk_nth(r, key, (int)j, sm);
      *out_cum = base + (double)(j + 1) * each;
      return;
    }
    base += cnt * each;
  }
  *out_key = key;
  *out_id = n_key ? pk_nth(r, key, (int)(n_key - 1), sm) : -1;
  *out_cum = base;
}

extern "C" __global__ void __launch_bounds__(PICK_THREADS)
    kn_pick(kn_pick_out *out, kn_pick_out *top, const float *logits, const kn_pick_args *args,
            int vocab, float *work, const int *pen_ids, const float *pen_sub) {
  kn_pdl();
  __shared__ pk_smem sm;
  const kn_pick_args a = args[blockIdx.x];
  pk_row r = {logits + (long long)a.row * vocab, vocab, 0.0, 1.0, 0xffffffffu, 0x7fffffff,
              0.0, 0.0};
  // max and argmax: the smallest (key, id)
  unsigned long long best = ~0ull;
  for (int i = threadIdx.x; i < vocab; i += PICK_THREADS) {
    unsigned long long v = (unsigned long long)pk_key(r.x[i]) << 32 | (unsigned)i;
    best = v < best ? v : best;
  }
  best = pk_min(best, &sm);
  int token = (int)(unsigned)best;
  r.max = (double)r.x[token];
  double s = 0.0;
  for (int i = threadIdx.x; i < vocab; i += PICK_THREADS) s += exp((double)r.x[i] - r.max);
  const double lse = r.max + log(pk_sum(s, &sm));
  // The alternatives: the best (key, id) after the previous one, n_top times.
  for (int j = 0, n = min(a.n_top, min(PICK_TOP, vocab)); j < n; j++) {
    const unsigned long long prev = best;
    if (j > 0) {
      best = ~0ull;
      for (int i = threadIdx.x; i < vocab; i += PICK_THREADS) {
        unsigned long long v = (unsigned long long)pk_key(r.x[i]) << 32 | (unsigned)i;
        best = v > prev && v < best ? v : best;
      }
      best = pk_min(best, &sm);
    }
    const int id = (int)(unsigned)best;
    if (threadIdx.x == 0) top[blockIdx.x * PICK_TOP + j] = {id, (float)((double)r.x[id] - lse)};
  }
  const float *raw = r.x;
  if (a.n_pen > 0) { // the sampler's row: the penalties applied, then its own argmax
    float *w = work + (long long)blockIdx.x * vocab;
    for (int i = threadIdx.x; i < vocab; i += PICK_THREADS) w[i] = raw[i];
    __syncthreads();
    for (int j = threadIdx.x; j < a.n_pen; j += PICK_THREADS)
      w[pen_ids[a.pen_off + j]] -= pen_sub[a.pen_off + j];
    __syncthreads();
    best = ~0ull;
    for (int i = threadIdx.x; i < vocab; i += PICK_THREADS) {
      unsigned long long v = (unsigned long long)pk_key(w[i]) << 32 | (unsigned)i;
      best = v < best ? v : best;
    }
    best = pk_min(best, &sm);
    token = (int)(unsigned)best;
    r.x = w;
    r.max = (double)w[token];
  }
  if (a.temperature > 0.0f) {
    unsigned key;
    int id;
    double cum;
    r.inv_t = 1.0 / (double)a.temperature;
    if (a.min_p > 0.0f) r.min_p = (double)a.min_p, r.log_min = log((double)a.min_p);
    if (a.top_k > 0) { // the top_k-th candidate bounds the rest
      pk_select(r, true, (double)a.top_k - 1.0, false, &sm, &key, &id, &cum);
      r.bkey = key, r.bid = id;
    }
    double S = 0.0;
    for (int i = threadIdx.x; i < vocab; i += PICK_THREADS) {
      double e;
      if (pk_cand(r, i, &key, &e)) S += exp(e);
    }
    S = pk_sum(S, &sm);
    if (a.top_p > 0.0f && a.top_p < 1.0f) {
      pk_select(r, false, (double)a.top_p * S, true, &sm, &key, &id, &cum);
      r.bkey = key, r.bid = id;
      S = cum;
    }
    pk_select(r, false, a.u * S, false, &sm, &key, &id, &cum);
    if (id >= 0) token = id;
  }
  if (threadIdx.x == 0) out[blockIdx.x] = {token, (float)((double)raw[token] - lse)};
}
