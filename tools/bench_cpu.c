/* bench_cpu: the measurements behind tools/bench-cpu, one JSON object on stdout.
 *   bench_cpu membw [--threads N] [--mib M] [--repeats R]
 *       read bandwidth: N threads sum a buffer of M MiB (default 1024, past any L3),
 *       best of R passes, in GB/s (1e9 bytes/s).
 *   bench_cpu model model.plan [--threads N] [--prompt 512] [--decode 128] [--batch 16]
 *                   [--batch-steps 32] [--repeats R] [--kv-tokens K] [--kv-dtype T]
 *                   [--max-isa N: 0 portable, 1 AVX2, 2 AVX-512, 3 + AMX-INT8]
 *                   [--x16-order chain|tile: bf16x16 matmuls' order, the CPU's by default]
 *       plan load ms (irt_model_open, best of R; wall and process CPU time), prefill
 *       tok/s of a --prompt token prompt,
 *       decode tok/s at batch 1 (--decode steps), aggregate tok/s of --batch sequences
 *       decoding together (--batch-steps steps), peak RSS. Best of R for each speed.
 * Token ids are a fixed pseudo-random sequence: speed does not depend on the text.
 * Uses only the public inferrt API. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include "inferrt.h"
#include "kn_cpu.h"
#include "kn_matmul_wq.h"

static double clock_ms(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

static int fail(const char *msg) {
  fprintf(stderr, "bench_cpu: error: %s\n", msg);
  return 1;
}

/* ---- memory bandwidth ------------------------------------------------------------ */

typedef struct bw_job {
  const uint64_t *p;
  size_t n; /* words */
  uint64_t sum;
  pthread_barrier_t *bar;
  int passes;
  double *best_ms; /* written by thread 0 */
} bw_job;

/* Four independent xor chains so the loop is bound by loads, not by one dependency;
 * the compiler vectorises it to full-width loads. */
static uint64_t bw_read(const uint64_t *p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  return a + b + c + d;
}

static void *bw_thread(void *arg) {
  bw_job *j = arg;
  for (int r = 0; r < j->passes; r++) {
    pthread_barrier_wait(j->bar);
    double t0 = now_ms();
    j->sum += bw_read(j->p, j->n) + (uint64_t)r;
    pthread_barrier_wait(j->bar);
    double ms = now_ms() - t0;
    if (j->best_ms && ms < *j->best_ms) *j->best_ms = ms;
  }
  return NULL;
}

static int run_membw(int threads, int64_t mib, int repeats) {
  size_t bytes = (size_t)mib << 20, per = bytes / (size_t)threads / 64 * 64;
  uint64_t *buf = NULL;
  if (posix_memalign((void **)&buf, 4096, bytes) != 0) return fail("out of memory");
  for (size_t i = 0; i < bytes / 8; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
  pthread_t tid[256];
  bw_job job[256];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)threads);
  double best = 1e30;
  for (int t = 0; t < threads; t++)
    job[t] = (bw_job){.p = buf + per / 8 * (size_t)t,
                      .n = per / 8,
                      .bar = &bar,
                      .passes = repeats + 1,
                      .best_ms = t == 0 ? &best : NULL};
  for (int t = 1; t < threads; t++) pthread_create(&tid[t], NULL, bw_thread, &job[t]);
  bw_thread(&job[0]);
  uint64_t sum = job[0].sum;
  for (int t = 1; t < threads; t++) {
    pthread_join(tid[t], NULL);
    sum ^= job[t].sum;
  }
  pthread_barrier_destroy(&bar);
  free(buf);
  double gbps = (double)per * threads / (best * 1e-3) / 1e9;
  printf("{\"threads\": %d, \"mib\": %lld, \"gbps\": %.3f, \"checksum\": %llu}\n", threads,
         (long long)mib, gbps, (unsigned long long)(sum & 0xffff));
  return 0;
}

/* ---- vector peak ----------------------------------------------------------------- */

/* What the cores can issue, measured (a shared or virtual machine may give far less than
 * the data sheet): N threads each run twelve independent chains of f32 fma and of int8
 * dot products (vpdpbusd with AVX512-VNNI, else vpmaddubsw + vpmaddwd) in the widest
 * registers the CPU has, bf16 pair dot products (vdpbf16ps) where the CPU has
 * AVX512-BF16, and where the CPU and OS allow AMX-INT8, four independent
 * 16 x 16 x 64 tile products (tdpbssd). Prefill's roofline is the int8 (or f32) rate
 * over the multiply-adds a token takes: the tile rate where there is one. */
enum { PK_CHAINS = 12, PK_ITERS = 1 << 24, PK_AMX_ITERS = 1 << 20 };

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define PK_X86 1
__attribute__((target("avx512f"))) static float pk_f32_512(long n) {
  __m512 a[PK_CHAINS], b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
  for (int i = 0; i < PK_CHAINS; i++) a[i] = _mm512_set1_ps((float)i * 1e-3f);
  for (long k = 0; k < n; k++)
    for (int i = 0; i < PK_CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
  __m512 t = a[0];
  for (int i = 1; i < PK_CHAINS; i++) t = _mm512_add_ps(t, a[i]);
  return _mm512_reduce_add_ps(t);
}
__attribute__((target("avx512f,avx512vnni"))) static float pk_i8_512(long n) {
  __m512i a[PK_CHAINS], b = _mm512_set1_epi8(3), c = _mm512_set1_epi8(5);
  for (int i = 0; i < PK_CHAINS; i++) a[i] = _mm512_set1_epi32(i);
  for (long k = 0; k < n; k++)
    for (int i = 0; i < PK_CHAINS; i++) a[i] = _mm512_dpbusd_epi32(a[i], b, c);
  __m512i t = a[0]; /* the sums wrap (as they may): fold them without C's int adds */
  for (int i = 1; i < PK_CHAINS; i++) t = _mm512_xor_si512(t, a[i]);
  uint32_t o[16], x = 0;
  _mm512_storeu_si512(o, t);
  for (int i = 0; i < 16; i++) x ^= o[i];
  return (float)x;
}
/* bf16 pairs (vdpbf16ps: 32 multiply-adds a zmm), as kn_matmul_bf16x does them */
__attribute__((target("avx512f,avx512bf16"))) static float pk_bf16_512(long n) {
  __m512 a[PK_CHAINS];
  __m512bh b = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), c = (__m512bh)_mm512_set1_epi32(0x38d138d1);
  for (int i = 0; i < PK_CHAINS; i++) a[i] = _mm512_set1_ps((float)i * 1e-3f);
  for (long k = 0; k < n; k++)
    for (int i = 0; i < PK_CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], b, c);
  __m512 t = a[0];
  for (int i = 1; i < PK_CHAINS; i++) t = _mm512_add_ps(t, a[i]);
  return _mm512_reduce_add_ps(t);
}
/* Tiles 0-3 C (zero), 4-5 A, 6-7 B (from ab), all 16 rows of 64 bytes: the peak loops'
 * set-up; pk_amx_end stores C's tile 0 into c and releases the tiles. */
__attribute__((target("amx-tile"))) static void pk_amx_start(const void *ab) {
  kn_amx_cfg cfg = {.palette = 1};
  for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
  __asm__ volatile(
      "tileloadd (%0,%1,1), %%tmm4\n\ttileloadd (%0,%1,1), %%tmm5\n\t"
      "tileloadd (%0,%1,1), %%tmm6\n\ttileloadd (%0,%1,1), %%tmm7\n\t"
      "tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::"r"(ab),
      "r"((int64_t)64)
      : "memory");
}
__attribute__((target("amx-tile"))) static void pk_amx_end(void *c) {
  __asm__ volatile("tilestored %%tmm0, (%0,%1,1)\n\ttilerelease" ::"r"(c), "r"((int64_t)64)
                   : "memory");
}
/* AMX-INT8: 4 x 16384 multiply-adds a step. */
__attribute__((target("amx-tile,amx-int8"))) static float pk_i8_amx(long n) {
  static const int8_t ab[16 * 64] = {3};
  int32_t c[16 * 16];
  pk_amx_start(ab);
  for (long k = 0; k < n; k++)
    __asm__ volatile("tdpbssd %tmm6, %tmm4, %tmm0\n\ttdpbssd %tmm7, %tmm4, %tmm1\n\t"
                     "tdpbssd %tmm6, %tmm5, %tmm2\n\ttdpbssd %tmm7, %tmm5, %tmm3");
  pk_amx_end(c);
  return (float)c[0];
}
/* AMX-BF16 (tdpbf16ps: 4 x 16 x 16 x 32 multiply-adds a step, bf16 pairs). */
__attribute__((target("amx-tile,amx-bf16"))) static float pk_bf16_amx(long n) {
  static const uint16_t ab[16 * 32] = {0x3f80};
  float c[16 * 16];
  pk_amx_start(ab);
  for (long k = 0; k < n; k++)
    __asm__ volatile("tdpbf16ps %tmm6, %tmm4, %tmm0\n\ttdpbf16ps %tmm7, %tmm4, %tmm1\n\t"
                     "tdpbf16ps %tmm6, %tmm5, %tmm2\n\ttdpbf16ps %tmm7, %tmm5, %tmm3");
  pk_amx_end(c);
  return c[0];
}
__attribute__((target("avx2,fma"))) static float pk_f32_256(long n) {
  __m256 a[PK_CHAINS], b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f);
  for (int i = 0; i < PK_CHAINS; i++) a[i] = _mm256_set1_ps((float)i * 1e-3f);
  for (long k = 0; k < n; k++)
    for (int i = 0; i < PK_CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
  __m256 t = a[0];
  for (int i = 1; i < PK_CHAINS; i++) t = _mm256_add_ps(t, a[i]);
  float o[8];
  _mm256_storeu_ps(o, t);
  return o[0];
}
/* 32 multiply-adds per pair, as the AVX2 q8 kernels do them */
__attribute__((target("avx2"))) static float pk_i8_256(long n) {
  __m256i a[PK_CHAINS], b = _mm256_set1_epi8(3), c = _mm256_set1_epi8(5);
  const __m256i one = _mm256_set1_epi16(1);
  for (int i = 0; i < PK_CHAINS; i++) a[i] = _mm256_set1_epi32(i);
  for (long k = 0; k < n; k++)
    for (int i = 0; i < PK_CHAINS; i++)
      a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(b, c), one));
  __m256i t = a[0];
  for (int i = 1; i < PK_CHAINS; i++) t = _mm256_add_epi32(t, a[i]);
  return (float)_mm256_extract_epi32(t, 0);
}
#else
#define PK_X86 0
#endif

typedef struct pk_job {
  int kind; /* 0 f32, 1 int8, 2 int8 on AMX, 3 bf16 pairs (AVX512-BF16), 4 bf16 on AMX */
  int wide; /* 512-bit registers */
  pthread_barrier_t *bar;
  double ms;
  float sink;
} pk_job;

static void *pk_thread(void *arg) {
  pk_job *j = arg;
  pthread_barrier_wait(j->bar);
  double t0 = now_ms();
#if PK_X86
  j->sink = j->kind == 4   ? pk_bf16_amx(PK_AMX_ITERS)
            : j->kind == 3 ? pk_bf16_512(PK_ITERS)
            : j->kind == 2 ? pk_i8_amx(PK_AMX_ITERS)
            : j->kind == 0 ? (j->wide ? pk_f32_512(PK_ITERS) : pk_f32_256(PK_ITERS))
                           : (j->wide ? pk_i8_512(PK_ITERS) : pk_i8_256(PK_ITERS));
#endif
  j->ms = now_ms() - t0;
  return NULL;
}

/* Operations a second over all threads: f32 flops (2 a fma), int8 or bf16 ops (2 a
 * multiply-add), the slowest thread's time, best of `repeats`. */
static double pk_rate(int threads, int kind, int wide, int repeats) {
  double best = 0;
  pthread_t tid[256];
  pk_job job[256];
  for (int r = 0; r < repeats; r++) {
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) job[t] = (pk_job){.kind = kind, .wide = wide, .bar = &bar};
    for (int t = 1; t < threads; t++) pthread_create(&tid[t], NULL, pk_thread, &job[t]);
    pk_thread(&job[0]);
    double ms = job[0].ms;
    for (int t = 1; t < threads; t++) {
      pthread_join(tid[t], NULL);
      ms = job[t].ms > ms ? job[t].ms : ms;
    }
    pthread_barrier_destroy(&bar);
    double lanes = kind == 0 ? (wide ? 16 : 8) : kind == 3 ? 32 : (wide ? 64 : 32);
    double ops = kind == 2   ? 2.0 * 4 * 16 * 16 * 64 * (double)PK_AMX_ITERS * threads
                 : kind == 4 ? 2.0 * 4 * 16 * 16 * 32 * (double)PK_AMX_ITERS * threads
                             : 2.0 * lanes * PK_CHAINS * (double)PK_ITERS * threads;
    double rate = ops / (ms * 1e-3);
    best = rate > best ? rate : best;
  }
  return best;
}

static int run_peak(int threads, int repeats) {
#if PK_X86
  __builtin_cpu_init();
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  int wide = __builtin_cpu_supports("avx512f");
  int vnni = wide && __builtin_cpu_supports("avx512vnni");
  if (!avx2) return fail("peak: needs AVX2 and FMA");
  double f = pk_rate(threads, 0, wide, repeats), q = pk_rate(threads, 1, vnni, repeats);
  /* int8_gops: the rate the q8 kernels can reach at best (the tile unit's where
   * kn_matmul_q8 uses it); int8_vector_gops: the vector units' */
  bool amx = kn_cpu_isa() >= 3;
  double t = amx ? pk_rate(threads, 2, 1, repeats) : q;
  /* bf16_gflops: vdpbf16ps where the CPU has it (kn_matmul_bf16x's unit), else absent */
  char bf[64] = "";
  if (kn_matmul_bf16dp())
    snprintf(bf, sizeof bf, ", \"bf16_gflops\": %.1f", pk_rate(threads, 3, 1, repeats) / 1e9);
  /* bf16_amx_gflops: tdpbf16ps where the CPU has AMX-BF16 (the tile order's unit) */
  char ba[64] = "";
  if (amx && kn_cpu_has_amx_bf16())
    snprintf(ba, sizeof ba, ", \"bf16_amx_gflops\": %.1f", pk_rate(threads, 4, 1, repeats) / 1e9);
  printf("{\"threads\": %d, \"f32\": \"%s\", \"int8\": \"%s\", \"f32_gflops\": %.1f, "
         "\"int8_gops\": %.1f, \"int8_vector_gops\": %.1f%s%s}\n",
         threads, wide ? "avx512 fma" : "avx2 fma",
         amx    ? "amx-int8"
         : vnni ? "avx512 vnni"
                : "avx2 maddubs",
         f / 1e9, t / 1e9, q / 1e9, bf, ba);
  return 0;
#else
  (void)threads, (void)repeats;
  return fail("peak: x86 only");
#endif
}

/* ---- the model ------------------------------------------------------------------- */

/* Peak RSS of this process image in bytes: VmHWM, not getrusage's ru_maxrss, which on
 * Linux carries the high-water mark of the parent across fork + exec (a Python driver
 * with llama.cpp loaded would count). Falls back to ru_maxrss without /proc. */
static long long peak_rss_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  if (f) fclose(f);
  if (kb < 0) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    kb = ru.ru_maxrss;
  }
  return kb * 1024;
}

typedef struct bench_opts {
  const char *plan;
  int threads, repeats;
  int64_t prompt, decode, batch, batch_steps, kv_tokens;
  irt_kv_dtype kv_dtype;
} bench_opts;

typedef struct bench_result {
  double load_ms, load_cpu_ms, prefill_tps, decode_tps, batch_tps;
} bench_result;

/* Skips the first 1000 ids (special and byte tokens) of a real vocabulary. */
static int32_t bench_token(int64_t i, int64_t vocab) {
  int64_t lo = vocab > 2000 ? 1000 : 0;
  return (int32_t)(lo + (int64_t)((uint64_t)(i * 2654435761u) % (uint64_t)(vocab - lo)));
}

static int32_t argmax(const float *v, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (v[i] > v[b]) b = i;
  return (int32_t)b;
}

/* Prefill of o->prompt tokens, then o->decode greedy steps of one token. */
static irt_status bench_single(irt_model *m, const bench_opts *o, float *lg, int32_t *ids,
                               bench_result *r, irt_error *err) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  irt_seq *s = NULL;
  irt_status st = irt_seq_create(m, &s, err);
  if (st == IRT_OK) irt_seq_set_prompt_len(s, o->prompt); /* as the engine marks it */
  double t0 = now_ms();
  if (st == IRT_OK) st = irt_seq_decode(m, s, ids, o->prompt, lg, false, err);
  double t1 = now_ms();
  for (int64_t i = 0; st == IRT_OK && i < o->decode; i++) {
    int32_t tok = argmax(lg, V);
    st = irt_seq_decode(m, s, &tok, 1, lg, false, err);
  }
  double t2 = now_ms();
  irt_seq_destroy(s);
  if (st != IRT_OK) return st;
  r->prefill_tps = fmax(r->prefill_tps, (double)o->prompt / ((t1 - t0) * 1e-3));
  r->decode_tps = fmax(r->decode_tps, (double)o->decode / ((t2 - t1) * 1e-3));
  return IRT_OK;
}

/* o->batch sequences with 16-token prompts, then o->batch_steps steps of one token each. */
static irt_status bench_batch(irt_model *m, const bench_opts *o, float *lg, int32_t *ids,
                              bench_result *r, irt_error *err) {
  int64_t V = irt_model_get_info(m)->vocab_size, nb = o->batch;
  irt_seq **s = calloc((size_t)nb, sizeof *s);
  irt_batch_item *it = calloc((size_t)nb, sizeof *it);
  int32_t *tok = calloc((size_t)nb, sizeof *tok);
  irt_status st = s && it && tok ? IRT_OK : IRT_OOM;
  for (int64_t i = 0; st == IRT_OK && i < nb; i++) {
    st = irt_seq_create(m, &s[i], err);
    if (st == IRT_OK) irt_seq_set_prompt_len(s[i], 16);
    if (st == IRT_OK) st = irt_seq_decode(m, s[i], ids + 16 * i, 16, lg + i * V, false, err);
  }
  double t0 = now_ms();
  for (int64_t step = 0; st == IRT_OK && step < o->batch_steps; step++) {
    for (int64_t i = 0; i < nb; i++) {
      tok[i] = argmax(lg + i * V, V);
      it[i] = (irt_batch_item){.seq = s[i], .tokens = &tok[i], .n = 1, .logits = lg + i * V};
    }
    st = irt_decode_batch(m, it, (int)nb, err);
  }
  double t1 = now_ms();
  for (int64_t i = 0; s && i < nb; i++) irt_seq_destroy(s[i]);
  free(s), free(it), free(tok);
  if (st == IRT_OK)
    r->batch_tps = fmax(r->batch_tps, (double)(nb * o->batch_steps) / ((t1 - t0) * 1e-3));
  return st;
}

static irt_status bench_open(const bench_opts *o, irt_model **m, bench_result *r, irt_error *err) {
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = o->threads;
  mo.kv_tokens = o->kv_tokens;
  mo.kv_dtype = o->kv_dtype;
  r->load_ms = r->load_cpu_ms = 1e30;
  for (int i = 0; i < o->repeats; i++) {
    double t0 = now_ms(), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
    irt_status st = irt_model_open(o->plan, &mo, m, err);
    double ms = now_ms() - t0, cpu = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (st != IRT_OK) return st;
    r->load_ms = fmin(r->load_ms, ms);
    r->load_cpu_ms = fmin(r->load_cpu_ms, cpu);
    if (i + 1 < o->repeats) irt_model_close(*m);
  }
  return IRT_OK;
}

static int run_model(const bench_opts *o) {
  bench_result r = {0};
  irt_error err = {0};
  irt_model *m = NULL;
  irt_status st = bench_open(o, &m, &r, &err);
  if (st != IRT_OK) return fail(err.msg);
  const irt_model_info *info = irt_model_get_info(m);
  int64_t V = info->vocab_size, n_ids = o->prompt > 16 * o->batch ? o->prompt : 16 * o->batch;
  float *lg = malloc((size_t)(V * (o->batch > 1 ? o->batch : 1)) * sizeof *lg);
  int32_t *ids = malloc((size_t)n_ids * sizeof *ids);
  if (!lg || !ids) st = IRT_OOM;
  for (int64_t i = 0; st == IRT_OK && i < n_ids; i++) ids[i] = bench_token(i, V);
  /* Warm-up: the first steps fault the weight pages in and wake the pool. */
  bench_opts warm = *o;
  bench_result unused = {0};
  warm.prompt = warm.prompt < 16 ? warm.prompt : 16;
  warm.decode = 2;
  if (st == IRT_OK) st = bench_single(m, &warm, lg, ids, &unused, &err);
  for (int i = 0; st == IRT_OK && i < o->repeats; i++) {
    st = bench_single(m, o, lg, ids, &r, &err);
    if (st == IRT_OK && o->batch > 0) st = bench_batch(m, o, lg, ids, &r, &err);
  }
  if (st == IRT_OK)
    printf("{\"load_ms\": %.3f, \"load_cpu_ms\": %.3f, \"prefill_tps\": %.3f, "
           "\"decode_tps\": %.3f, "
           "\"batch_tps\": %.3f, \"peak_rss_bytes\": %lld, \"weight_bytes\": %llu, "
           "\"kv_bytes\": %llu, \"kv_token_bytes\": %llu, \"arena_bytes\": %llu, "
           "\"threads\": %d}\n",
           r.load_ms, r.load_cpu_ms, r.prefill_tps, r.decode_tps, r.batch_tps, peak_rss_bytes(),
           (unsigned long long)info->weight_bytes, (unsigned long long)info->kv_bytes,
           (unsigned long long)irt_model_kv_token_bytes(m, o->kv_dtype),
           (unsigned long long)info->arena_bytes, o->threads);
  free(lg);
  free(ids);
  irt_model_close(m);
  return st == IRT_OK ? 0 : fail(err.msg[0] ? err.msg : irt_status_name(st));
}

/* ---- attention alone ---------------------------------------------------------------- */

/* Page i of the eviction buffer: a store to each of its lines (memset may go around the
 * caches). */
static void cold_task(void *arg, int64_t begin, int64_t end, int tid) {
  (void)tid;
  unsigned char *buf = arg;
  for (int64_t i = begin * 4096; i < end * 4096; i += 64) buf[i]++;
}

/* One decode step of attention: `batch` sequences of ctx cached positions each (SmolLM2's
 * heads by default), the KV cache in `dtype`, blocks of 16 laid out as an allocator hands
 * them out (sequence after sequence). Prints the best time of a call and the KV bytes it
 * reads per second. With cold, every call first finds the caches full of other data (a
 * 64 MiB buffer written through by the pool, untimed), as a model's layer does after the
 * weights and the other layers' caches went by; the time is then the best mean of 16
 * such calls. */
/* kn_attention_paged, in the bf16 order with bf16. */
static void attn_call(kn_pool *pool, float *out, const float *q, const float *kn, const float *vn,
                      const kn_kv_layer *kv, const kn_attn_batch *b, int64_t n_heads, bool bf16) {
  kn_attn_io io = {.q = q,
                   .k = kn,
                   .v = vn,
                   .q_stride = n_heads * kv->head_dim,
                   .kv_stride = kv->n_kv_heads * kv->head_dim,
                   .bf16 = bf16};
  kn_attention_paged_io(pool, out, &io, kv, b, n_heads, 0.125f);
}

static int run_attn(int threads, int64_t ctx, int64_t batch, int64_t n_heads, int64_t n_kv,
                    int64_t hd, irt_kv_dtype dtype, int repeats, bool cold, bool bf16) {
  const int64_t bs = 16, per_seq = (ctx + bs - 1) / bs, nb = per_seq * batch;
  const int64_t vals = nb * n_kv * bs * hd;
  kn_kv_layer kv = {.n_blocks = nb, .block_size = bs, .n_kv_heads = n_kv, .head_dim = hd};
  size_t es = dtype == IRT_KV_DTYPE_INT8 ? 1 : dtype == IRT_KV_DTYPE_F16 ? 2 : 4;
  void *kbuf = malloc((size_t)vals * es), *vbuf = malloc((size_t)vals * es);
  float *ks = malloc((size_t)(nb * n_kv * bs) * sizeof(float));
  float *vs = malloc((size_t)(nb * n_kv * bs) * sizeof(float));
  float *q = malloc((size_t)(batch * n_heads * hd) * sizeof(float));
  float *kn = malloc((size_t)(batch * n_kv * hd) * sizeof(float));
  float *vn = malloc((size_t)(batch * n_kv * hd) * sizeof(float));
  float *out = malloc((size_t)(batch * n_heads * hd) * sizeof(float));
  int32_t *seq = malloc((size_t)batch * sizeof(int32_t)),
          *pos = malloc((size_t)batch * sizeof(int32_t));
  int32_t *tables = malloc((size_t)nb * sizeof(int32_t));
  kn_pool *pool = kn_pool_create(threads);
  if (!kbuf || !vbuf || !ks || !vs || !q || !kn || !vn || !out || !seq || !pos || !tables || !pool)
    return fail("out of memory");
  /* values as a model's: uniform in (-1, 1) for K and V (int8: codes in [-127, 127]) */
  uint64_t r = 0x9e3779b97f4a7c15ull;
  for (int64_t i = 0; i < 2 * vals; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    float x = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    void *dst = i < vals ? kbuf : vbuf;
    int64_t j = i < vals ? i : i - vals;
    if (es == 1) ((int8_t *)dst)[j] = (int8_t)lrintf(x * 127.0f);
    else if (es == 2) ((uint16_t *)dst)[j] = ir_f32_to_f16(x);
    else ((float *)dst)[j] = x;
  }
  for (int64_t i = 0; i < nb * n_kv * bs; i++) ks[i] = vs[i] = 0.01f;
  for (int64_t i = 0; i < batch * n_heads * hd; i++) q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
  for (int64_t i = 0; i < batch * n_kv * hd; i++) kn[i] = vn[i] = (float)(i % 7) / 7.0f;
  for (int64_t i = 0; i < nb; i++) tables[i] = (int32_t)i;
  for (int64_t s = 0; s < batch; s++) seq[s] = (int32_t)s, pos[s] = (int32_t)(ctx - 1);
  if (dtype == IRT_KV_DTYPE_INT8) kv.k8 = kbuf, kv.v8 = vbuf, kv.k_scale = ks, kv.v_scale = vs;
  else if (dtype == IRT_KV_DTYPE_F16) kv.k16 = kbuf, kv.v16 = vbuf;
  else kv.k = kbuf, kv.v = vbuf;
  kn_attn_batch b = {.n_tok = batch,
                     .tok_seq = seq,
                     .tok_pos = pos,
                     .max_blocks_per_seq = per_seq,
                     .block_tables = tables};
  double best = 1e30;
  enum { COLD_BYTES = 64 << 20, COLD_CALLS = 16 };
  unsigned char *evict = cold ? calloc(COLD_BYTES, 1) : NULL;
  if (cold && !evict) return fail("out of memory");
  for (int rep = 0; cold && rep < repeats; rep++) {
    double ms = 0;
    for (int c = 0; c < COLD_CALLS; c++) {
      /* a store to every line, by every thread of the pool (each core's own caches; and
       * the workers are awake when the call starts, as in a model) */
      kn_parallel_for(pool, COLD_BYTES / 4096, 1, cold_task, evict);
      double t0 = now_ms();
      attn_call(pool, out, q, kn, vn, &kv, &b, n_heads, bf16);
      ms += (now_ms() - t0) / COLD_CALLS;
    }
    if (ms < best) best = ms;
  }
  free(evict);
  for (int rep = 0; !cold && rep < repeats; rep++) {
    double t0 = now_ms();
    int calls = 0;
    do {
      attn_call(pool, out, q, kn, vn, &kv, &b, n_heads, bf16);
      calls++;
    } while (now_ms() - t0 < 200.0);
    double ms = (now_ms() - t0) / calls;
    if (ms < best) best = ms;
  }
  double bytes = (double)batch * (double)ctx * (double)(n_kv * hd) * 2.0 * (double)es +
                 (dtype == IRT_KV_DTYPE_INT8 ? (double)(batch * ctx * n_kv) * 8.0 : 0.0);
  printf("{\"threads\": %d, \"ctx\": %lld, \"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
         "\"head_dim\": %lld, \"kv_dtype\": \"%s\", \"bf16\": %s, \"cold\": %s, \"us\": %.1f, "
         "\"kv_gbps\": %.2f, \"checksum\": %.6g}\n",
         threads, (long long)ctx, (long long)batch, (long long)n_heads, (long long)n_kv,
         (long long)hd, irt_kv_dtype_name(dtype), bf16 ? "true" : "false", cold ? "true" : "false",
         best * 1e3, bytes / (best * 1e-3) / 1e9,
         (double)out[0] + (double)out[batch * n_heads * hd - 1]);
  kn_pool_destroy(pool);
  free(kbuf), free(vbuf), free(ks), free(vs), free(q), free(kn), free(vn), free(out);
  free(seq), free(pos), free(tables);
  return 0;
}

static int usage(void) {
  return fail("usage: bench_cpu membw [--threads N] [--mib M] [--repeats R]\n"
              "       bench_cpu peak [--threads N] [--repeats R]\n"
              "       bench_cpu attn [--threads N] [--ctx 4096] [--batch 1] [--heads 9]\n"
              "                 [--kv-heads 3] [--head-dim 64] [--kv-dtype f16] [--repeats R] "
              "[--cold] [--bf16]\n"
              "       bench_cpu model model.plan [--threads N] [--prompt 512] [--decode 128]\n"
              "                 [--batch 16] [--batch-steps 32] [--repeats R] [--kv-tokens K]\n"
              "                 [--kv-dtype f32|f16|int8] [--max-isa 0|1|2|3]");
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  bench_opts o = {
      .threads = 0, .repeats = 3, .prompt = 512, .decode = 128, .batch = 16, .batch_steps = 32};
  int64_t mib = 1024, ctx = 4096, heads = 9, kv_heads = 3, head_dim = 64;
  bool membw = !strcmp(argv[1], "membw"), attn = !strcmp(argv[1], "attn"), cold = false;
  bool bf16 = false;
  bool peak = !strcmp(argv[1], "peak");
  if (attn) o.batch = 1, o.kv_dtype = IRT_KV_DTYPE_F16;
  if (!membw && !attn && !peak && strcmp(argv[1], "model")) return usage();
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int64_t *dst = !strcmp(a, "--prompt")        ? &o.prompt
                   : !strcmp(a, "--decode")      ? &o.decode
                   : !strcmp(a, "--batch")       ? &o.batch
                   : !strcmp(a, "--batch-steps") ? &o.batch_steps
                   : !strcmp(a, "--kv-tokens")   ? &o.kv_tokens
                   : !strcmp(a, "--mib")         ? &mib
                   : !strcmp(a, "--ctx")         ? &ctx
                   : !strcmp(a, "--heads")       ? &heads
                   : !strcmp(a, "--kv-heads")    ? &kv_heads
                   : !strcmp(a, "--head-dim")    ? &head_dim
                                                 : NULL;
    if (dst && v) *dst = atoll(v), i++;
    else if (!strcmp(a, "--threads") && v) o.threads = atoi(v), i++;
    else if (!strcmp(a, "--repeats") && v) o.repeats = atoi(v), i++;
    else if (!strcmp(a, "--cold") && attn) cold = true;
    else if (!strcmp(a, "--bf16") && attn) bf16 = true;
    else if (!strcmp(a, "--kv-dtype") && v && irt_kv_dtype_parse(v, &o.kv_dtype)) i++;
    else if (!strcmp(a, "--max-isa") && v) { /* 0 portable, 1 AVX2, 2 AVX-512, 3 + AMX */
      kn_matmul_set_max_isa(atoi(v)), kn_matmul_wq_set_max_isa(atoi(v)), i++;
    } else if (!strcmp(a, "--x16-order") && v && (!strcmp(v, "chain") || !strcmp(v, "tile"))) {
      kn_matmul_set_x16_order(!strcmp(v, "tile") ? KN_X16_TILE : KN_X16_CHAIN), i++;
    } else if (a[0] != '-' && !o.plan && !membw && !attn && !peak) o.plan = a;
    else return usage();
  }
  if (o.threads <= 0) o.threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (o.repeats < 1 || o.prompt < 1 || o.decode < 0 || o.batch < 0 || o.batch > 256 || mib < 1 ||
      o.threads > 256)
    return usage();
  if (membw) return run_membw(o.threads, mib, o.repeats);
  if (peak) return run_peak(o.threads, o.repeats);
  if (attn) {
    if (ctx < 1 || o.batch < 1 || kv_heads < 1 || heads % kv_heads || head_dim < 1 ||
        head_dim > 256)
      return usage();
    return run_attn(o.threads, ctx, o.batch, heads, kv_heads, head_dim, o.kv_dtype, o.repeats, cold,
                    bf16);
  }
  return o.plan ? run_model(&o) : usage();
}
