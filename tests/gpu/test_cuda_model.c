/* test_cuda_model (label gpu): whole models on the CUDA backend against the CPU backend,
 * on the oracle fixtures (f32, f16 and bf16 weights, GQA/MHA, q/k/v bias). Per fixture:
 * prompt logits at every position (one prefill step: cuBLAS, tiled attention) and after a
 * chunked prefill, greedy continuations (decode steps: GEMV, split-K attention, CUDA
 * Graphs), a batch of sequences of different lengths decoded together with graphs on and
 * off (buckets with padding), token picks in the step (sampling on the device) against
 * the host sampler on the same rows, and parallel completions through the engine (KV
 * copy-on-write on the device). Bounds, ||cuda - cpu|| / ||cpu|| over the logits: f32
 * weights 1e-4 (f32 arithmetic, another summation order), also int4 MatMulNBits (GEMV
 * gemv_wq.cu at every m, dequantized as the CPU does); f16 5e-3 and bf16 2e-2 (cuBLAS
 * takes the activations of prefill GEMMs in the weights' type), also ggml q4_1 / q8_0
 * blocks (5e-3: a 48-token prompt step takes their f16 copies and f16 activations). Also the clear errors: a
 * plan for another arch, a KV pool larger than the GPU; and (fake driver) failed graph
 * captures falling back to eager steps. Exits 77 (ctest: skipped) printing "skipped: ..."
 * without a GPU. */
#include <dlfcn.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infc_build.h"
#include "inferrt.h"
#include "tcheck.h"

static int (*g_replays)(void);       /* set under tests/unit/fake_cuda.c: graph launches so far */
static int (*g_tiled_replays)(void); /* fake_cuda.c: those of drafted steps' graphs */
static void (*g_fail_instantiate)(int); /* fake_cuda.c: the next n graph instantiations fail */
static void (*g_config)(int, int, int); /* fake_cuda.c: head_dim, block size, arch */
static long long (*g_launches)(const char *); /* fake_cuda.c: launches of kernels named so */
static long long (*g_pdl_launches)(void);     /* fake_cuda.c: programmatic dependent ones */
static bool g_no_pdl;                         /* open_on's irt_model_opts.no_cuda_pdl */

typedef struct fixture {
  const char *name;
  double bound;
  const char *src;       /* under tests/fixtures, NULL: name */
  const char *opt, *val; /* one more infc option, or NULL */
  irt_kv_dtype kv;       /* of every model opened (CPU and CUDA alike) */
} fixture;

static irt_kv_dtype g_kv = IRT_KV_DTYPE_F32; /* the KV dtype open_on gives */

/* CUDA plans are fused as CPU plans are (packed qkv with rope folded into attention, gate_up
 * with its swiglu epilogue); "unfused" keeps the plain forms covered, "int4" runs the fused
 * gate_up on gemv_wq through the swiglu scratch. */
static const fixture k_fixtures[] = {
    {"llama-gqa-f32", 1e-4, NULL, NULL, NULL, IRT_KV_DTYPE_F32},
    {"llama-mha-f16", 5e-3, NULL, NULL, NULL, IRT_KV_DTYPE_F32},
    {"qwen2-bias-bf16", 2e-2, NULL, NULL, NULL, IRT_KV_DTYPE_F32},
    /* the q/k norm folded into attention (kn_rope_kv_write), and as norms in slices */
    {"qwen3-qknorm-bf16", 2e-2, NULL, NULL, NULL, IRT_KV_DTYPE_F32},
    {"qwen3-qknorm-bf16-unfused", 2e-2, "qwen3-qknorm-bf16", "fuse", "false", IRT_KV_DTYPE_F32},
    /* Phi-3's fused checkpoint matrices with a partial rope; SmolLM3's unroped layer */
    {"phi3-fused-f32", 1e-4, NULL, NULL, NULL, IRT_KV_DTYPE_F32},
    {"smollm3-nope-f32", 1e-4, NULL, NULL, NULL, IRT_KV_DTYPE_F32},
    /* Gemma 2: sliding-window layers (window 8, over blocks of 16), attention and final
     * logit soft caps, the gelu_tanh gate, scaled embeddings; Gemma 3: five local layers to
     * one global, q/k norms, no caps */
    {"gemma2-softcap-f32", 1e-4, NULL, NULL, NULL, IRT_KV_DTYPE_F32},
    {"gemma3-local-f32", 1e-4, NULL, NULL, NULL, IRT_KV_DTYPE_F32},
    /* int4 weights: GEMV below CUDA_DEQUANT_GEMM_M rows, f16 copies on cuBLAS from it */
    {"onnx-genai-int4", 5e-3, "onnx-genai-int4/model.onnx", NULL, NULL, IRT_KV_DTYPE_F32},
    {"llama-gqa-f32-unfused", 1e-4, "llama-gqa-f32", "fuse", "false", IRT_KV_DTYPE_F32},
    {"llama-gqa-int4", 5e-3, "llama-gqa-f32", "quant", "int4", IRT_KV_DTYPE_F32},
    {"llama-mha-fp8", 5e-3, "llama-mha-f16", "quant", "fp8", IRT_KV_DTYPE_F32},
    /* ggml blocks: GEMV below CUDA_DEQUANT_GEMM_M rows, f16 copies on cuBLAS from it */
    {"llama-gqa-q4_1", 5e-3, "llama-gqa-f32", "quant", "q4_1", IRT_KV_DTYPE_F32},
    {"llama-gqa-q8_0", 5e-3, "llama-gqa-f32", "quant", "q8_0", IRT_KV_DTYPE_F32},
    /* --kv-dtype f16 on both backends. K and V are rounded to f16 alike, but from f32 values
     * that already differ by delta (<= 1e-4 relative, the f32 bound): about delta / u of the
     * elements (u = 2^-11, f16's rounding step) round to neighbouring f16s, each off by u, so
     * the error grows to sqrt(delta * u) ~ 2.2e-4, not delta. Seen on an H200: 1.2e-4 after
     * three decode steps of 7 sequences (f32 KV: 8e-7). Greedy must still agree (< 5e-3). */
    {"llama-gqa-f32-kvf16", 1e-3, "llama-gqa-f32", NULL, NULL, IRT_KV_DTYPE_F16},
    {"llama-mha-f16-kvf16", 5e-3, "llama-mha-f16", NULL, NULL, IRT_KV_DTYPE_F16}};

static double rel_err(const float *out, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(out[i])) return INFINITY;
    num += ((double)out[i] - ref[i]) * ((double)out[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

/* $INFC_TEST_ARCH (e.g. sm_90, as tools/gpu-check sets it) saves compiling for other archs. */
static bool build(const char *fix, const char *arch, const char *out, const char *opt,
                  const char *val) {
  char src[512];
  const char *env = getenv("INFC_TEST_ARCH");
  if (!arch && env && *env) arch = env;
  snprintf(src, sizeof src, FIXTURES_DIR "/%s", fix);
  infc_options o = infc_options_default();
  if (getenv("INFC_CACHE_DIR")) /* the tests' shared compile cache (tests/CMakeLists.txt) */
    snprintf(o.cache_dir, sizeof o.cache_dir, "%s", getenv("INFC_CACHE_DIR"));
  ir_diag d = {0};
  bool ok = infc_options_set(&o, "target", "cuda", &d) == IR_OK &&
            (!arch || infc_options_set(&o, "arch", arch, &d) == IR_OK) &&
            (!opt || infc_options_set(&o, opt, val, &d) == IR_OK) &&
            infc_build(src, &o, out, NULL, NULL, &d) == IR_OK;
  CHECKF(ok, "build %s: %s", fix, d.msg);
  return ok;
}

static irt_model *open_on(const char *plan, const char *dev, bool graphs, int64_t kv_tokens) {
  irt_model_opts o = irt_model_opts_default();
  o.n_threads = 4;
  o.device = dev;
  o.no_cuda_graphs = !graphs;
  o.kv_tokens = kv_tokens;
  o.kv_dtype = g_kv;
  o.no_cuda_pdl = g_no_pdl;
  irt_model *m = NULL;
  irt_error err = {0};
  CHECKF(irt_model_open(plan, &o, &m, &err) == IRT_OK, "open %s on %s: %s", plan, dev, err.msg);
  return m;
}

/* Logits of every prompt position, prefilled in chunks of `chunk` tokens. */
static float *prompt_logits(irt_model *m, const int32_t *ids, int64_t n, int64_t chunk) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = malloc((size_t)(n * V) * sizeof *lg);
  irt_seq *s = NULL;
  irt_error err = {0};
  irt_seq_create(m, &s, &err);
  for (int64_t off = 0; off < n; off += chunk) {
    int64_t c = n - off < chunk ? n - off : chunk;
    CHECKF(irt_seq_decode(m, s, ids + off, c, lg + off * V, true, &err) == IRT_OK, "%s", err.msg);
  }
  irt_seq_destroy(s);
  return lg;
}

static void greedy(irt_model *m, const int32_t *ids, int64_t n, int32_t *out, int n_out,
                   float *last_logits) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = malloc((size_t)V * sizeof *lg);
  irt_seq *s = NULL;
  irt_error err = {0};
  irt_seq_create(m, &s, &err);
  irt_status st = irt_seq_decode(m, s, ids, n, lg, false, &err);
  for (int i = 0; st == IRT_OK && i < n_out; i++) {
    int32_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (lg[v] > lg[best]) best = (int32_t)v;
    out[i] = best;
    st = irt_seq_decode(m, s, &out[i], 1, lg, false, &err);
  }
  CHECKF(st == IRT_OK, "greedy: %s", err.msg);
  memcpy(last_logits, lg, (size_t)V * sizeof *lg);
  irt_seq_destroy(s);
  free(lg);
}

/* n_seq sequences with prompts of different lengths, then `steps` decode steps of all of
 * them together; returns the logits of the last step (n_seq, V). */
static float *batch_decode(irt_model *m, int n_seq, int steps) {
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = calloc((size_t)(n_seq * V), sizeof *lg);
  irt_seq *s[64];
  irt_batch_item it[64];
  int32_t tok[64];
  irt_error err = {0};
  for (int i = 0; i < n_seq; i++) {
    int32_t p[40];
    for (int j = 0; j < 3 + 5 * i % 37; j++) p[j] = (int32_t)((7 * i + 13 * j + 1) % V);
    irt_seq_create(m, &s[i], &err);
    CHECKF(irt_seq_decode(m, s[i], p, 3 + 5 * i % 37, NULL, false, &err) == IRT_OK, "%s", err.msg);
  }
  for (int k = 0; k < steps; k++) {
    for (int i = 0; i < n_seq; i++) {
      tok[i] = (int32_t)((31 * i + 7 * k + 3) % V);
      it[i] = (irt_batch_item){.seq = s[i], .tokens = &tok[i], .n = 1, .logits = lg + i * V};
    }
    CHECKF(irt_decode_batch(m, it, n_seq, &err) == IRT_OK, "batch: %s", err.msg);
  }
  for (int i = 0; i < n_seq; i++) irt_seq_destroy(s[i]);
  return lg;
}

/* Picks (the step chooses tokens, on the device): 2 x n sequences with equal prompts; in one
 * decode step the first n bring their logits to the host and the other n pick, with the
 * settings below and equal seeds. The picked tokens must be runtime/model/sampler.c's on the
 * returned rows, the logprobs their log-softmax. */
static void test_picks(irt_model *m) {
  enum { N = 6 };
  static const irt_sampling set[N] = {{0.0f, 0, 1.0f, 1, 0},  {1.0f, 0, 1.0f, 2, 0.1f},
                                      {0.7f, 40, 0.9f, 3, 0}, {1.3f, 0, 0.5f, 4, 0.02f},
                                      {0.5f, 1, 1.0f, 5, 0},  {2.0f, 3, 1.0f, 6, 0}};
  int64_t V = irt_model_get_info(m)->vocab_size;
  float *lg = malloc((size_t)(N * V) * sizeof *lg);
  irt_seq *s[2 * N];
  irt_batch_item it[2 * N];
  irt_pick pk[N] = {{0}}; /* no penalties */
  int32_t top_ids[N][5];
  float top_lps[N][5];
  irt_sampler *host[N];
  int32_t tok[2 * N];
  irt_error err = {0};
  for (int i = 0; i < 2 * N; i++) {
    int32_t p[12];
    for (int j = 0; j < 4 + i % N; j++) p[j] = (int32_t)((5 * (i % N) + 3 * j + 2) % V);
    irt_seq_create(m, &s[i], &err);
    CHECKF(irt_seq_decode(m, s[i], p, 4 + i % N, NULL, false, &err) == IRT_OK, "%s", err.msg);
    tok[i] = (int32_t)((11 * (i % N) + 1) % V);
  }
  for (int i = 0; i < N; i++) {
    CHECK(irt_sampler_create(&set[i], V, &host[i], &err) == IRT_OK);
    CHECK(irt_sampler_create(&set[i], V, &pk[i].sampler, &err) == IRT_OK);
    pk[i].n_top = i % 2 ? 5 : 0; /* alternatives for every other one */
    pk[i].top_ids = top_ids[i], pk[i].top_logprobs = top_lps[i];
    it[i] = (irt_batch_item){.seq = s[i], .tokens = &tok[i], .n = 1, .logits = lg + i * V};
    it[N + i] = (irt_batch_item){.seq = s[N + i], .tokens = &tok[N + i], .n = 1, .pick = &pk[i]};
  }
  for (int step = 0; step < 3; step++) {
    CHECKF(irt_decode_batch(m, it, 2 * N, &err) == IRT_OK, "picks: %s", err.msg);
    int same = 0;
    double lp_err = 0;
    for (int i = 0; i < N; i++) {
      int32_t want = irt_sampler_sample(host[i], lg + i * V);
      same += pk[i].token == want;
      if (pk[i].token < 0 || pk[i].token >= V) continue;
      double lse = 0, mx = lg[i * V];
      for (int64_t v = 0; v < V; v++) mx = lg[i * V + v] > mx ? lg[i * V + v] : mx;
      for (int64_t v = 0; v < V; v++) lse += exp((double)lg[i * V + v] - mx);
      double e = fabs(pk[i].logprob - ((double)lg[i * V + pk[i].token] - mx - log(lse)));
      lp_err = e > lp_err ? e : lp_err;
      for (int j = 0; j < pk[i].n_top; j++) { /* the j-th largest of the returned row */
        int64_t above = 0;
        float v = lg[i * V + pk[i].top_ids[j]];
        for (int64_t u = 0; u < V; u++) above += lg[i * V + u] > v;
        same -= above > j; /* counted as a miss */
        e = fabs(pk[i].top_logprobs[j] - ((double)v - mx - log(lse)));
        lp_err = e > lp_err ? e : lp_err;
      }
      tok[i] = tok[N + i] = want; /* both halves go on with the same token */
    }
    printf("  picks, step %d: %d/%d tokens as the host sampler, logprob err %.1e\n", step, same, N,
           lp_err);
    CHECKF(same == N, "picks step %d: %d/%d", step, same, N);
    CHECKF(lp_err <= 1e-5, "picks step %d: logprob err %.3e", step, lp_err);
  }
  for (int i = 0; i < N; i++) irt_sampler_destroy(host[i]), irt_sampler_destroy(pk[i].sampler);
  for (int i = 0; i < 2 * N; i++) irt_seq_destroy(s[i]);
  free(lg);
}

static void test_fixture(const fixture *f) {
  char plan[512];
  snprintf(plan, sizeof plan, TEST_TMP_DIR "/gpu_%s.plan", f->name);
  if (!build(f->src ? f->src : f->name, NULL, plan, f->opt, f->val)) return;
  g_kv = f->kv;
  irt_model *cpu = open_on(plan, "cpu", false, 4096);
  if (cpu && g_config) g_config((int)irt_model_get_info(cpu)->head_dim, 16, 90); /* the fake's */
  irt_model *gpu = open_on(plan, "cuda", true, 4096);
  irt_model *eager = open_on(plan, "cuda", false, 4096);
  if (!cpu || !gpu || !eager) goto done;
  CHECK(!strcmp(irt_model_get_info(gpu)->device, "cuda"));
  int64_t V = irt_model_get_info(cpu)->vocab_size, n = 48;
  int32_t ids[48];
  for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
  printf("%s (bound %.0e)\n", f->name, f->bound);
  long long casts = g_launches ? g_launches("kn_cast_") : 0;
  long long copies = g_launches ? g_launches("kn_rms_norm_h") + g_launches("kn_add_rms_norm_h") +
                                      g_launches("kn_swiglu_packed_h")
                                : 0;
  float *a = prompt_logits(cpu, ids, n, n), *b = prompt_logits(gpu, ids, n, n);
  if (g_launches) {
    /* 48 rows: every f16/bf16/block GEMM (q8_0, q4_1 from 32 rows) on cuBLAS. Its operand
     * comes from its producer (the norms, kn_swiglu_packed) or, past attention and
     * gather_rows, a cast: at most one a layer and the logits' (two unfused: the swiglu op
     * is not a producer; q, k, v share their norm's copy, gate and up too). */
    casts = g_launches("kn_cast_") - casts;
    copies = g_launches("kn_rms_norm_h") + g_launches("kn_add_rms_norm_h") +
             g_launches("kn_swiglu_packed_h") - copies;
    int64_t layers = irt_model_get_info(cpu)->n_layers;
    bool half = strstr(f->name, "f16") || strstr(f->name, "bf16") || strstr(f->name, "q4_1") ||
                strstr(f->name, "q8_0") || strstr(f->name, "int4") || strstr(f->name, "fp8");
    if (half && !strstr(f->name, "-f32-"))
      CHECKF(casts <= (strstr(f->name, "unfused") ? 2 : 1) * layers + 1 && copies >= 2 * layers,
             "%s: %lld casts, %lld operand copies from producers (%lld layers)", f->name, casts,
             copies, (long long)layers);
    else CHECKF(casts == 0 && copies == 0, "%s: %lld casts, %lld copies", f->name, casts, copies);
  }
  double e = rel_err(b, a, (size_t)(n * V));
  printf("  prompt logits, one step     rel err %.2e\n", e);
  CHECKF(e <= f->bound, "%s prompt: %.3e", f->name, e);
  free(b);
  b = prompt_logits(gpu, ids, n, 5);
  e = rel_err(b, a, (size_t)(n * V));
  printf("  prompt logits, chunks of 5  rel err %.2e\n", e);
  CHECKF(e <= f->bound, "%s chunked: %.3e", f->name, e);
  free(a), free(b);

  int32_t ga[24], gb[24], gc[24];
  float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4), *lc = malloc((size_t)V * 4);
  greedy(cpu, ids, 8, ga, 24, la);
  int replays = g_replays ? g_replays() : 0;
  greedy(gpu, ids, 8, gb, 24, lb);
  if (g_replays) CHECKF(g_replays() - replays >= 20, "%d graph launches", g_replays() - replays);
  greedy(eager, ids, 8, gc, 24, lc);
  int same = 0;
  while (same < 24 && ga[same] == gb[same]) same++;
  printf("  greedy: %d/24 tokens as on the CPU; graphs == no graphs: %s\n", same,
         memcmp(gb, gc, sizeof gb) ? "no" : "yes");
  CHECKF(same == 24 || f->bound >= 5e-3, "%s greedy differs at %d", f->name, same);
  CHECK(!memcmp(gb, gc, sizeof gb));
  CHECKF(rel_err(lb, lc, (size_t)V) <= 1e-6, "%s graphs vs eager logits", f->name);
  free(la), free(lb), free(lc);

  for (int bs = 1; bs <= 16; bs = bs * 2 + 1) { /* 1, 3, 7, 15: padded buckets */
    float *x = batch_decode(cpu, bs, 3), *y = batch_decode(gpu, bs, 3);
    float *z = batch_decode(eager, bs, 3);
    double e1 = rel_err(y, x, (size_t)(bs * V)), e2 = rel_err(z, x, (size_t)(bs * V));
    printf("  batch %2d decode: graphs rel err %.2e, no graphs %.2e\n", bs, e1, e2);
    CHECKF(e1 <= f->bound && e2 <= f->bound, "%s batch %d: %.3e %.3e", f->name, bs, e1, e2);
    free(x), free(y), free(z);
  }
  test_picks(gpu);
  test_picks(eager);
done:
  g_kv = IRT_KV_DTYPE_F32;
  irt_model_close(cpu);
  irt_model_close(gpu);
  irt_model_close(eager);
}

typedef struct collect {
  int32_t toks[4][32];
  int n[4];
} collect;

static void on_event(void *user, const irt_event *ev) {
  collect *c = user;
  if (ev->token >= 0 && ev->index < 4 && c->n[ev->index] < 32)
    c->toks[ev->index][c->n[ev->index]++] = ev->token;
}

/* n = 3 greedy completions share the prompt's blocks; the partial last block is copied on
 * the device when they diverge in their writes. */
static void engine_run(irt_model *m, collect *c) {
  irt_engine *e = NULL;
  irt_error err = {0};
  int32_t p[21];
  for (int i = 0; i < 21; i++) p[i] = (int32_t)(i * 5 + 2);
  irt_request r = {.prompt_ids = p,
                   .n_prompt = 21,
                   .sampling = irt_sampling_default(),
                   .max_tokens = 12,
                   .n = 3,
                   .ignore_eos = true,
                   .on_event = on_event,
                   .user = c};
  CHECKF(irt_engine_create(m, NULL, &e, &err) == IRT_OK, "%s", err.msg);
  if (!e) return;
  CHECKF(irt_engine_submit(e, &r, NULL, &err) == IRT_OK, "%s", err.msg);
  CHECKF(irt_engine_run(e, &err) == IRT_OK, "%s", err.msg);
  irt_engine_destroy(e);
}

static void test_engine_cow(void) {
  const char *plan = TEST_TMP_DIR "/gpu_llama-gqa-f32.plan";
  irt_model *cpu = open_on(plan, "cpu", false, 0), *gpu = open_on(plan, "cuda", true, 0);
  if (cpu && gpu) {
    collect a = {0}, b = {0};
    engine_run(cpu, &a);
    engine_run(gpu, &b);
    CHECK(a.n[0] == 12 && b.n[0] == 12 && b.n[2] == 12);
    CHECK(!memcmp(&a, &b, sizeof a));
    printf("engine, n=3 completions on the device: %s\n",
           memcmp(&a, &b, sizeof a) ? "DIFFER" : "as on the CPU");
  }
  irt_model_close(cpu);
  irt_model_close(gpu);
}

/* One engine, four requests batched together: greedy and top-p sampling (their tokens picked
 * on the device), top_logprobs and a presence penalty (their rows brought to the host).
 * The tokens must be the CPU engine's, with the same seeds; the logprobs close to them. */
typedef struct mixed {
  int32_t tok[4][16], alt[16][3]; /* alt: request 2's top_logprobs tokens */
  float lp[4][16];
  int n[4];
} mixed;

static void on_mixed(void *user, const irt_event *ev) {
  mixed *x = user;
  int r = (int)(ev->id - 1) & 3;
  if (ev->token < 0 || x->n[r] >= 16) return;
  for (int j = 0; r == 2 && j < ev->n_top && j < 3; j++) x->alt[x->n[r]][j] = ev->top_tokens[j];
  x->lp[r][x->n[r]] = ev->logprob, x->tok[r][x->n[r]++] = ev->token;
}

/* spec > 0: with that many prompt-lookup drafts (1-grams up), or drafts of the model
 * g_draft when set; *st gets the final stats. */
static irt_model *g_draft;
static void engine_mixed(irt_model *m, mixed *x, int spec, irt_engine_stats *st) {
  irt_engine *e = NULL;
  irt_error err = {0};
  int32_t p[4][9];
  irt_engine_opts eo = irt_engine_opts_default();
  eo.spec_tokens = spec, eo.spec_ngram_min = 1, eo.spec_always = true;
  eo.draft = spec ? g_draft : NULL;
  CHECKF(irt_engine_create(m, &eo, &e, &err) == IRT_OK, "%s", err.msg);
  if (!e) return;
  for (int r = 0; r < 4; r++) {
    for (int i = 0; i < 9; i++) p[r][i] = (int32_t)(13 * r + 7 * i + 1);
    irt_request q = {.prompt_ids = p[r],
                     .n_prompt = 9,
                     .sampling = irt_sampling_default(),
                     .max_tokens = 16,
                     .ignore_eos = true,
                     .on_event = on_mixed,
                     .user = x};
    if (r > 0) q.sampling = (irt_sampling){.temperature = 0.9f, .top_p = 0.9f, .seed = 5u + r};
    static const int32_t bias_ids[2] = {7, 8};
    static const float bias[2] = {3.0f, -100.0f};
    if (r == 1) q.logit_bias_ids = bias_ids, q.logit_bias = bias, q.n_logit_bias = 2;
    if (r == 2) q.top_logprobs = 3;
    if (r == 3)
      q.presence_penalty = 0.5f, q.logit_bias_ids = bias_ids, q.logit_bias = bias,
      q.n_logit_bias = 2;
    CHECKF(irt_engine_submit(e, &q, NULL, &err) == IRT_OK, "%s", err.msg);
  }
  CHECKF(irt_engine_run(e, &err) == IRT_OK, "%s", err.msg);
  irt_engine_get_stats(e, st);
  irt_engine_destroy(e);
}

static void test_engine_mixed(void) {
  const char *plan = TEST_TMP_DIR "/gpu_llama-gqa-f32.plan";
  irt_model *cpu = open_on(plan, "cpu", false, 0), *gpu = open_on(plan, "cuda", true, 0);
  if (cpu && gpu) {
    mixed a = {0}, b = {0}, c = {0};
    irt_engine_stats sa, sb, sc;
    engine_mixed(cpu, &a, 0, &sa);
    engine_mixed(gpu, &b, 0, &sb);
    int replays = g_replays ? g_replays() : 0, tiled = g_replays ? g_tiled_replays() : 0;
    engine_mixed(gpu, &c, 4, &sc); /* drafts: rows picked on the device (penalty: host) */
    replays = g_replays ? g_replays() - replays : -1;
    tiled = g_replays ? g_tiled_replays() - tiled : -1;
    printf("engine with prompt-lookup drafts on the device: %s, %lld drafts, %lld kept, "
           "%lld steps (%lld without), %d graph launches (%d of drafted steps)\n",
           memcmp(a.tok, c.tok, sizeof a.tok) ? "DIFFER" : "as on the CPU",
           (long long)sc.spec_draft_tokens, (long long)sc.spec_accepted_tokens, (long long)sc.steps,
           (long long)sb.steps, replays, tiled);
    /* Drafted steps (several rows of a sequence, all verified) replay graphs as decode steps
     * do: every step but the prefill and each bucket's first (eager) one. The decode
     * buckets were warmed by the run without drafts; drafted steps have their own graphs. */
    if (g_replays)
      CHECKF(replays >= sc.steps / 2 && tiled > 0,
             "%d graph launches (%d drafted) in %lld drafted-run steps", replays, tiled,
             (long long)sc.steps);
    CHECK(!memcmp(a.tok, c.tok, sizeof a.tok) && !memcmp(a.n, c.n, sizeof a.n));
    /* A draft model on the device (the same plan, its own KV): drafted rows come to the host
     * to be checked; the greedy request keeps its tokens, the sampled ones their lengths. */
    g_draft = open_on(plan, "cuda", true, 0);
    if (g_draft) {
      mixed dm = {0};
      irt_engine_stats sd;
      engine_mixed(gpu, &dm, 4, &sd);
      double lp0 = 0;
      for (int i = 0; i < dm.n[0] && i < b.n[0]; i++)
        lp0 = fabs(dm.lp[0][i] - b.lp[0][i]) > lp0 ? fabs(dm.lp[0][i] - b.lp[0][i]) : lp0;
      printf("engine with a draft model on the device: greedy %s, %lld drafts, %lld kept, %lld "
             "steps (%lld without), logprob diff %.1e\n",
             memcmp(dm.tok[0], b.tok[0], sizeof dm.tok[0]) ? "DIFFERS" : "as without drafts",
             (long long)sd.spec_draft_tokens, (long long)sd.spec_accepted_tokens,
             (long long)sd.steps, (long long)sb.steps, lp0);
      CHECK(!memcmp(dm.tok[0], b.tok[0], sizeof dm.tok[0]) && !memcmp(dm.n, b.n, sizeof dm.n));
      CHECK(sd.spec_accepted_tokens > 0 && sd.steps < sb.steps && lp0 <= 1e-5);
      CHECKF(sd.kv_blocks_used == sb.kv_blocks_used, "%lld blocks held",
             (long long)sd.kv_blocks_used);
      irt_model_close(g_draft);
      g_draft = NULL;
    }
    CHECK(!memcmp(a.alt, c.alt, sizeof a.alt) && sc.spec_draft_tokens > 0);
    /* (the model's pad block for graph replays stays held) */
    CHECKF(sc.kv_blocks_used == sb.kv_blocks_used, "%lld blocks held, %lld without drafts",
           (long long)sc.kv_blocks_used, (long long)sb.kv_blocks_used);
    double lp = 0;
    for (int r = 0; r < 4; r++)
      for (int i = 0; i < b.n[r]; i++)
        lp = fabs(a.lp[r][i] - b.lp[r][i]) > lp ? fabs(a.lp[r][i] - b.lp[r][i]) : lp;
    printf("engine, greedy / top-p / top_logprobs / penalty requests on the device: %s, "
           "logprob diff %.1e\n",
           memcmp(a.tok, b.tok, sizeof a.tok) ? "DIFFER" : "as on the CPU", lp);
    CHECK(a.n[0] == 16 && a.n[3] == 16 && !memcmp(a.n, b.n, sizeof a.n));
    int banned = 0, pushed = 0; /* logit_bias on requests 1 and 3: token 8 -100, 7 +3 */
    for (int r = 1; r < 4; r += 2)
      for (int i = 0; i < a.n[r]; i++) banned += a.tok[r][i] == 8, pushed += a.tok[r][i] == 7;
    CHECKF(banned == 0 && pushed > 0, "logit_bias: %d banned, %d pushed", banned, pushed);
    CHECK(!memcmp(a.tok, b.tok, sizeof a.tok));
    CHECK(!memcmp(a.alt, b.alt, sizeof a.alt) && a.alt[0][0] != a.alt[0][1]);
    CHECKF(lp <= 1e-4, "logprobs differ by %.3e", lp);
  }
  irt_model_close(cpu);
  irt_model_close(gpu);
}

/* Graph captures that fail (fake driver only) leave decode steps eager and correct. */
static void test_graph_fallback(void) {
  if (!g_fail_instantiate) return;
  const char *plan = TEST_TMP_DIR "/gpu_llama-gqa-f32.plan";
  g_fail_instantiate(1000); /* from the captures of the warm-up at open on */
  irt_model *gpu = open_on(plan, "cuda", true, 4096), *cpu = open_on(plan, "cpu", false, 4096);
  if (gpu && cpu) {
    int64_t V = irt_model_get_info(gpu)->vocab_size;
    int replays = g_replays();
    float *x = batch_decode(cpu, 3, 4), *y = batch_decode(gpu, 3, 4);
    double e = rel_err(y, x, (size_t)(3 * V));
    printf("failed graph captures: batch 3 decode rel err %.2e, %d graph launches\n", e,
           g_replays() - replays);
    CHECKF(e <= 1e-4 && g_replays() == replays, "%.3e, %d", e, g_replays() - replays);
    free(x), free(y);
  }
  g_fail_instantiate(0);
  irt_model_close(gpu);
  irt_model_close(cpu);
}

/* Programmatic dependent launch (fake driver, sm_90): every kernel of a step goes through
 * cuLaunchKernelEx with the attribute (graphs on: captured so too), none with
 * irt_model_opts.no_cuda_pdl, and the logits are the same either way. */
static void test_pdl(void) {
  if (!g_pdl_launches) return;
  const char *plan = TEST_TMP_DIR "/gpu_llama-gqa-f32.plan";
  long long n0 = g_pdl_launches(), k0 = g_launches("kn_"), p0 = g_launches("kn_pick");
  irt_model *a = open_on(plan, "cuda", true, 4096);
  float *x = a ? batch_decode(a, 3, 4) : NULL;
  long long pdl = g_pdl_launches() - n0, all = g_launches("kn_") - k0;
  long long picks = g_launches("kn_pick") - p0; /* kn_pick: a launch of its own, not PDL */
  irt_model_close(a);
  g_no_pdl = true;
  n0 = g_pdl_launches();
  irt_model *b = open_on(plan, "cuda", true, 4096);
  float *y = b ? batch_decode(b, 3, 4) : NULL;
  long long off = g_pdl_launches() - n0;
  g_no_pdl = false;
  if (x && y) {
    int64_t V = irt_model_get_info(b)->vocab_size;
    double e = rel_err(y, x, (size_t)(3 * V));
    printf("programmatic dependent launch: %lld of %lld launches (%lld kn_pick aside), %lld "
           "with no_cuda_pdl; logits rel err %.1e\n",
           pdl, all, picks, off, e);
    /* plain: kn_pick, each step's first kernel (after its upload), a kernel after a copy */
    CHECKF(pdl > 0 && pdl >= (all - picks) * 3 / 4 && pdl < all - picks && off == 0,
           "%lld of %lld (%lld picks), %lld", pdl, all, picks, off);
    CHECKF(e == 0.0, "pdl changes the logits: %.3e", e);
  }
  free(x), free(y);
  irt_model_close(b);
}

/* irt_model_opts.cuda_profile: the same logits, and at close a table through the log
 * callback (info lines) with a row per kind of node and step (prefill and decode). */
typedef struct log_text {
  char text[8192];
  size_t n;
  int info, other;
} log_text;

static void collect_log(void *user, irt_log_level level, const char *msg) {
  log_text *t = user;
  if (level == IRT_LOG_INFO) t->info++;
  else t->other++;
  int w = snprintf(t->text + t->n, sizeof t->text - t->n, "%s\n", msg);
  if (w > 0) t->n = t->n + (size_t)w < sizeof t->text ? t->n + (size_t)w : sizeof t->text - 1;
}

static void test_profile(void) {
  const char *plan = TEST_TMP_DIR "/gpu_llama-gqa-f32.plan";
  int32_t ids[12] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, ga[4], gb[4];
  irt_model *cpu = open_on(plan, "cpu", false, 0);
  static log_text lt;
  irt_model_opts o = irt_model_opts_default();
  o.n_threads = 4;
  o.device = "cuda";
  o.kv_dtype = g_kv;
  o.cuda_profile = true;
  o.log = collect_log;
  o.log_user = &lt;
  irt_model *gpu = NULL;
  irt_error err = {0};
  CHECKF(irt_model_open(plan, &o, &gpu, &err) == IRT_OK, "open %s profiled: %s", plan, err.msg);
  if (cpu && gpu) {
    int64_t V = irt_model_get_info(gpu)->vocab_size;
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    greedy(cpu, ids, 12, ga, 4, la);
    greedy(gpu, ids, 12, gb, 4, lb);
    CHECKF(rel_err(lb, la, (size_t)V) <= 1e-4 && !memcmp(ga, gb, sizeof ga), "profiled logits");
    free(la), free(lb);
  }
  irt_model_close(gpu);
  char *text = lt.text;
  printf("profile table:\n%s", text);
  CHECKF(lt.info > 3 && lt.other == 0, "%d info lines, %d others", lt.info, lt.other);
  CHECKF(strstr(text, "cuda profile: 1 prefill steps") && strstr(text, "4 decode steps") &&
             strstr(text, "prefill  attention") && strstr(text, "decode   matmul f32"),
         "profile table: %s", text);
  /* The nodes' times are parts of their steps' (the warm-up at open counted in neither): each
   * kind's shares add up to at most 100%, plus rounding. */
  double share[2] = {0, 0};
  for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) { /* rows: "kind ... 12.3% ..." */
    char kind[16], *pct = strchr(l, '%');
    if (!pct || sscanf(l, "%15s", kind) != 1) continue;
    while (pct > l && pct[-1] != ' ') pct--;
    share[!strcmp(kind, "decode")] += strtod(pct, NULL);
  }
  CHECKF(share[0] > 50 && share[0] <= 100.5 && share[1] > 50 && share[1] <= 100.5,
         "profile shares: prefill %.1f%%, decode %.1f%% of their steps", share[0], share[1]);
  irt_model_close(cpu);
}

static void test_errors(void) {
  irt_model *m = NULL;
  irt_error err = {0};
  irt_model_opts o = irt_model_opts_default();
  const char *plan = TEST_TMP_DIR "/gpu_llama-gqa-f32.plan";
  /* 1 Gi tokens x 512 B: more than any GPU holds; 32 Mi (16 GiB) for the fake one of 8 */
  o.kv_tokens = (int64_t)1 << (g_replays ? 25 : 30);
  CHECK(irt_model_open(plan, &o, &m, &err) == IRT_OOM && !m);
  printf("KV too large: %s\n", err.msg);
  CHECKF(strstr(err.msg, "out of device memory for the KV pool") && strstr(err.msg, "MiB"), "%s",
         err.msg);
  o = irt_model_opts_default();
  o.kv_dtype = IRT_KV_DTYPE_INT8; /* CPU-only */
  CHECK(irt_model_open(plan, &o, &m, &err) == IRT_UNSUPPORTED && !m);
  printf("KV int8 on CUDA: %s\n", err.msg);
  CHECKF(strstr(err.msg, "int8") && strstr(err.msg, "--kv-dtype"), "%s", err.msg);
  const char *other = TEST_TMP_DIR "/gpu_sm100.plan";
  if (build("llama-gqa-f32", "sm_100", other, NULL, NULL)) {
    o = irt_model_opts_default();
    err = (irt_error){0};
    irt_status st = irt_model_open(other, &o, &m, &err);
    printf("plan for sm_100: %s\n", err.msg);
    CHECKF(st == IRT_UNSUPPORTED && strstr(err.msg, "sm_100") && strstr(err.msg, "is sm_"), "%s",
           err.msg);
    irt_model_close(m);
  }
  /* sm_80 only: on a newer GPU the driver JIT-compiles the PTX. */
  const char *ptx = TEST_TMP_DIR "/gpu_sm80.plan";
  if (build("llama-gqa-f32", "sm_80", ptx, NULL, NULL)) {
    irt_model *a = open_on(ptx, "cuda", true, 0), *c = open_on(ptx, "cpu", false, 0);
    if (a && c) {
      int32_t ids[] = {3, 1, 4, 1, 5, 9, 2, 6};
      int64_t V = irt_model_get_info(a)->vocab_size;
      long long pdl = g_pdl_launches ? g_pdl_launches() : 0;
      float *x = prompt_logits(a, ids, 8, 8), *y = prompt_logits(c, ids, 8, 8);
      double e = rel_err(x, y, (size_t)(8 * V));
      pdl = g_pdl_launches ? g_pdl_launches() - pdl : 0;
      printf("plan for sm_80 only (PTX JIT or sm_80 CUBIN): rel err %.2e, %lld programmatic "
             "launches (its kernels do not wait for them)\n",
             e, pdl);
      CHECK(e <= 1e-4 && pdl == 0);
      free(x), free(y);
    }
    irt_model_close(a);
    irt_model_close(c);
  }
}

int main(void) {
  void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cu && getenv("INFC_FAKE_CUDA")) { /* the fake must load: a symbol it lacks is a bug */
    CHECKF(false, "the fake libcuda does not load: %s", dlerror());
    return tcheck_done("cuda_model");
  }
  if (!cu) return tcheck_skip("cuda_model", "no libcuda (no NVIDIA driver)");
  void *cfg = dlsym(cu, "fake_cuda_config"), *rep = dlsym(cu, "fake_cuda_replays");
  void *tiled = dlsym(cu, "fake_cuda_tiled_replays");
  if (cfg && rep && tiled) { /* tests/unit/fake_cuda.c: the fixtures' head_dim, block size */
    memcpy(&g_config, &cfg, sizeof g_config);
    memcpy(&g_replays, &rep, sizeof g_replays);
    memcpy(&g_tiled_replays, &tiled, sizeof g_tiled_replays);
    void *fi = dlsym(cu, "fake_cuda_fail_instantiate");
    if (fi) memcpy(&g_fail_instantiate, &fi, sizeof g_fail_instantiate);
    void *fl = dlsym(cu, "fake_cuda_launches");
    if (fl) memcpy(&g_launches, &fl, sizeof g_launches);
    void *fp = dlsym(cu, "fake_cuda_pdl_launches");
    if (fp && fl) memcpy(&g_pdl_launches, &fp, sizeof g_pdl_launches);
    g_config(16, 16, 90);
    printf("fake libcuda (CPU emulation): checks the backend's host side, not the kernels\n");
  }
  irt_model *probe = NULL;
  irt_error err = {0};
  const char *plan = TEST_TMP_DIR "/gpu_llama-gqa-f32.plan";
  if (!build("llama-gqa-f32", NULL, plan, NULL, NULL)) return tcheck_done("cuda_model");
  irt_model_opts o = irt_model_opts_default();
  o.device = "cuda";
  if (irt_model_open(plan, &o, &probe, &err) == IRT_DEVICE && strstr(err.msg, "no CUDA device")) {
    return tcheck_skip("cuda_model", err.msg);
  }
  irt_model_close(probe);
  for (size_t i = 0; i < sizeof k_fixtures / sizeof k_fixtures[0]; i++)
    test_fixture(&k_fixtures[i]);
  test_engine_cow();
  test_engine_mixed();
  test_graph_fallback();
  test_pdl();
  test_profile();
  test_errors();
  return tcheck_done("cuda_model");
}
