/* infc: the ahead-of-time compiler's command line (build, inspect). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infc_build.h"
#include "infc_onnx_profile.h"
#include "ir_profile.h"
#include "chat_template.h"
#include "ir_plan.h"
#include "tokenizer.h"

static int usage_main(FILE *f) {
  fputs("usage: infc <command> [options]\n\n"
        "commands:\n"
        "  build SRC -o model.plan   compile a model (HF checkpoint dir with config.json +\n"
        "                            safetensors) into a plan file\n"
        "  inspect model.plan        show a plan's config, tensors, ops, options and format\n\n"
        "options: --help, --version. `infc <command> --help` for a command's options.\n",
        f);
  return f == stderr ? 2 : 0;
}

static int usage_build(FILE *f) {
  fputs(
      "usage: infc build SRC -o OUT [options]\n\n"
      "  -o, --output PATH      plan file to write (required)\n"
      "  -c, --config PATH      build options file (YAML; see README)\n"
      "      --dtype T          weight dtype: auto (as stored), f32, f16, bf16\n"
      "      --max-tokens N     tokens per step (default 512; 2048 with --target cuda)\n"
      "      --max-seqs N       sequences per step (default 64)\n"
      "      --max-logits N     logit rows per step (default 64)\n"
      "      --kv-block-size N  tokens per KV cache block (default 16)\n"
      "      --max-context N    cap the context length (default: the model's)\n"
      "      --tp N             tensor parallelism: shard heads, ffn and vocabulary over N\n"
      "                         ranks, every rank's weights in the one plan (mpirun -n N)\n"
      "      --layers N         the first N decoder layers only, then the norm and head: a\n"
      "                         layer-skip draft of the same model (inferrt --draft)\n"
      "      --no-fold          disable constant folding\n"
      "      --no-fuse[=LIST]   disable fusion passes (all, or those listed of\n"
      "                         rope_attention,qkv,gate_up,add_rms_norm)\n"
      "      --tokenizer PATH   tokenizer.json to embed (default: the one beside the model)\n"
      "      --target T         cpu (default) or cuda (kernels compiled by NVRTC; no GPU needed)\n"
      "      --arch LIST        target cuda: GPU archs (default sm_80,sm_90)\n"
      "      --cache-dir DIR    target cuda: keep NVRTC's outputs in DIR (off: none; default\n"
      "                         $INFC_CACHE_DIR, else $XDG_CACHE_HOME/infc, else\n"
      "                         ~/.cache/infc)\n"
      "      --decode-buckets L target cuda: decode batch sizes captured as CUDA Graphs\n"
      "                         (default 1,2,4,... up to the step limit)\n"
      "      --quant SCHEME     quantize matmul weights: none (default), int8[:asym],\n"
      "                         int4[:g32|g64|g128][:sym|asym], w8a8 (int8 activations\n"
      "                         too, VNNI), q8_0|q4_0|q4_1 (ggml blocks, as GGUF); add\n"
      "                         :lm_head to include the logits projection\n"
      "      --quant-calib FILE w8a8: smooth with activation maxima from tools/w8a8-calib\n"
      "      --act-dtype T      activations of q8_0/q4_0/q4_1 matmuls: auto (int8 for\n"
      "                         --target cpu, f32 for cuda), f32, int8 (per 32 values);\n"
      "                         bf16: a prompt's rows multiply them converted to bf16 a\n"
      "                         tile at a time (AMX-BF16's prefill), generated rows and\n"
      "                         the logits projection keep int8; and bf16 weights multiply\n"
      "                         x rounded to bf16 (bf16 products, f32 sums; CPU)\n"
      "      --attn-dtype T     attention's q.k and p.v products: auto (bf16 with\n"
      "                         --act-dtype bf16, else f32), f32, bf16 (CPU)\n"
      "      --no-repack        keep those weights in their GGUF block layout (default:\n"
      "                         8 rows interleaved, the CPU kernels' faster layout)\n"
      "      --shape NAME=DIMS  a generic ONNX graph's input range, dims like 1..64x3x224x224\n"
      "                         (repeatable; symbolic dims not given range over 1..64)\n"
      "      --dump-ir          print the IR after each pass to stdout\n"
      "  -q, --quiet            print nothing on success\n",
      f);
  return f == stderr ? 2 : 0;
}

static int fail(const char *msg) {
  fprintf(stderr, "infc: error: %s\n", msg);
  return 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct build_args {
  const char *src, *out;
  bool dump, quiet;
} build_args;

static ir_status set_cache_dir(infc_options *o, const char *dir, ir_diag *d) {
  if (strlen(dir) >= sizeof o->cache_dir)
    return ir_diag_set(d, IR_INVALID_ARG, "--cache-dir: the path is too long");
  snprintf(o->cache_dir, sizeof o->cache_dir, "%s", strcmp(dir, "off") ? dir : "");
  return IR_OK;
}

/* The compile cache's default, from the environment (the library reads none):
 * $INFC_CACHE_DIR ("" or off: none), else $XDG_CACHE_HOME/infc, else ~/.cache/infc. */
static void default_cache_dir(infc_options *o) {
  const char *env = getenv("INFC_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  char dir[4096] = "";
  if (env) snprintf(dir, sizeof dir, "%s", strcmp(env, "off") ? env : "");
  else if (xdg && *xdg) snprintf(dir, sizeof dir, "%s/infc", xdg);
  else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/infc", home);
  ir_diag ignore = {0};
  set_cache_dir(o, dir, &ignore);
}

static int parse_build(int argc, char **argv, infc_options *o, build_args *a) {
  default_cache_dir(o);
  static const struct option longs[] = {{"output", required_argument, 0, 'o'},
                                        {"config", required_argument, 0, 'c'},
                                        {"dtype", required_argument, 0, 1},
                                        {"max-tokens", required_argument, 0, 2},
                                        {"max-seqs", required_argument, 0, 3},
                                        {"max-logits", required_argument, 0, 4},
                                        {"kv-block-size", required_argument, 0, 5},
                                        {"max-context", required_argument, 0, 6},
                                        {"no-fold", no_argument, 0, 7},
                                        {"no-fuse", optional_argument, 0, 8},
                                        {"dump-ir", no_argument, 0, 9},
                                        {"quiet", no_argument, 0, 'q'},
                                        {"tokenizer", required_argument, 0, 10},
                                        {"target", required_argument, 0, 11},
                                        {"arch", required_argument, 0, 12},
                                        {"quant", required_argument, 0, 13},
                                        {"quant-calib", required_argument, 0, 14},
                                        {"decode-buckets", required_argument, 0, 15},
                                        {"act-dtype", required_argument, 0, 16},
                                        {"no-repack", no_argument, 0, 17},
                                        {"cache-dir", required_argument, 0, 18},
                                        {"shape", required_argument, 0, 19},
                                        {"tp", required_argument, 0, 20},
                                        {"layers", required_argument, 0, 21},
                                        {"attn-dtype", required_argument, 0, 22},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  static const char *keys[] = {"",           "dtype",         "max_tokens",  "max_seqs",
                               "max_logits", "kv_block_size", "max_context", "fold",
                               "fuse"};
  ir_diag d = {0};
  int c;
  while ((c = getopt_long(argc, argv, "o:c:qh", longs, NULL)) != -1) {
    ir_status st = IR_OK;
    if (c == 'o') a->out = optarg;
    else if (c == 'c') st = infc_options_load_yaml(o, optarg, &d);
    else if (c >= 1 && c <= 6) st = infc_options_set(o, keys[c], optarg, &d);
    else if (c == 8 && optarg) st = infc_options_set(o, "no_fuse", optarg, &d);
    else if (c == 7 || c == 8) st = infc_options_set(o, keys[c], "false", &d);
    else if (c == 9) a->dump = true;
    else if (c == 10) st = infc_options_set(o, "tokenizer", optarg, &d);
    else if (c == 11 || c == 12) st = infc_options_set(o, c == 11 ? "target" : "arch", optarg, &d);
    else if (c == 13) st = infc_options_set(o, "quant", optarg, &d);
    else if (c == 14) st = infc_options_set(o, "quant_calib", optarg, &d);
    else if (c == 15) st = infc_options_set(o, "decode_buckets", optarg, &d);
    else if (c == 16) st = infc_options_set(o, "act_dtype", optarg, &d);
    else if (c == 17) st = infc_options_set(o, "repack", "false", &d);
    else if (c == 18) st = set_cache_dir(o, optarg, &d);
    else if (c == 19) st = infc_options_set(o, "shape", optarg, &d);
    else if (c == 20) st = infc_options_set(o, "tp", optarg, &d);
    else if (c == 21) st = infc_options_set(o, "layers", optarg, &d);
    else if (c == 22) st = infc_options_set(o, "attn_dtype", optarg, &d);
    else if (c == 'q') a->quiet = true;
    else if (c == 'h') return usage_build(stdout) - 1;
    else return usage_build(stderr);
    if (st != IR_OK) return fail(d.msg);
  }
  if (optind != argc - 1 || !a->out) return usage_build(stderr);
  a->src = argv[optind];
  return 0;
}

static int cmd_build(int argc, char **argv) {
  infc_options o = infc_options_default();
  build_args a = {0};
  int rc = parse_build(argc, argv, &o, &a);
  if (rc) return rc < 0 ? 0 : rc;
  ir_diag d = {0};
  infc_build_report r = {0};
  double t0 = now_s();
  if (infc_build(a.src, &o, a.out, a.dump ? stdout : NULL, &r, &d) != IR_OK) return fail(d.msg);
  if (!a.quiet)
    printf("infc: built %s from %s (%s): %d -> %d ops, %.1f MiB weights, %.1f MiB arena, "
           "%.2f s\n",
           a.out, a.src, r.source_kind, r.nodes_before, r.nodes_after,
           (double)r.weight_bytes / 1048576.0, (double)r.arena_bytes / 1048576.0, now_s() - t0);
  static const pass_line lines[] = {PASS_LINE_OPS, PASS_LINE_QUANT, PASS_LINE_ACT_INT8,
                                    PASS_LINE_ACT_BF16, PASS_LINE_REPACK};
  for (size_t i = 0; !a.quiet && i < sizeof lines / sizeof *lines; i++) {
    char line[256]; /* the pass log's width */
    if (pass_results_line(&r.passes, lines[i], line, sizeof line)) printf("infc: %s\n", line);
  }
  if (!a.quiet && r.recognised[0]) printf("infc: recognised: %s\n", r.recognised);
  if (!a.quiet && r.shapes[0]) printf("infc: dynamic shapes: %s\n", r.shapes);
  if (!a.quiet)
    printf("infc: tokenizer: %s\n",
           r.tokenizer[0] ? r.tokenizer : "none (the plan takes token ids)");
  return 0;
}

static void print_op_counts(const ir_graph *g) {
  int counts[IR_OP_COUNT] = {0};
  for (int32_t i = 0; i < g->n_nodes; i++) counts[g->nodes[i].op]++;
  printf("ops:         %d", g->n_nodes);
  for (int op = 1; op < IR_OP_COUNT; op++)
    if (counts[op]) printf(" %s=%d", ir_op_name((ir_op)op), counts[op]);
  printf("\n");
}

static void print_tensors(const ir_graph *g, bool all) {
  uint64_t by_type[IR_DTYPE_COUNT] = {0};
  int n = 0;
  for (int32_t i = 0; i < g->n_tensors; i++) {
    const ir_tensor *t = &g->tensors[i];
    if (t->kind != IR_TENSOR_WEIGHT) continue;
    by_type[t->dtype] += t->nbytes;
    n++;
    if (!all) continue;
    char shape[96];
    ir_tensor_format_shape(t, shape, sizeof shape);
    printf("  %-56s %-5s %-16s %10llu B\n", t->name, ir_dtype_name(t->dtype), shape,
           (unsigned long long)t->nbytes);
  }
  printf("weights:     %d tensors;", n);
  for (int t = 1; t < IR_DTYPE_COUNT; t++)
    if (by_type[t])
      printf(" %s %.2f MiB", ir_dtype_name((ir_dtype)t), (double)by_type[t] / 1048576.0);
  printf("\n");
}

static void print_tokenizer(const ir_plan *p) {
  size_t n = 0;
  const uint8_t *blob = ir_plan_tokenizer(p, &n);
  irt_tokenizer *t = NULL;
  ir_diag d = {0};
  if (!blob) {
    printf("tokenizer:   none (the plan takes token ids)\n");
    return;
  }
  if (tok_deserialize(blob, n, &t, &d) != IR_OK) {
    printf("tokenizer:   unreadable: %s\n", d.msg);
    return;
  }
  static const char *const pre[] = {"none", "gpt2", "llama3", "qwen2", "smollm", "metaspace"};
  tok_pre k = tok_get_pre(t);
  chat_tmpl ct;
  const char *tpl = tok_chat_template(t);
  d = (ir_diag){0};
  bool known = tpl && chat_template_detect(tpl, &ct, &d) == IR_OK;
  printf("tokenizer:   %s BPE, %s pre-tokenizer, %d tokens, bos %d, eos %d, chat template %s\n",
         tok_get_model(t) == TOK_BPE_SPM ? "SentencePiece-style" : "byte-level",
         (unsigned)k < sizeof pre / sizeof *pre ? pre[k] : "?", tok_vocab_size(t), tok_bos(t),
         tok_eos(t),
         !tpl    ? "none"
         : known ? chat_kind_name(ct.kind)
                 : "not recognised");
  tok_destroy(t);
}

/* A generic program's dynamic shapes: the symbols' ranges and each input's dims. */
static void print_profile(const ir_graph *g) {
  const ir_profile *pr = g->profile;
  char buf[512];
  if (!pr) return;
  infc_onnx_profile_describe(pr, buf, sizeof buf);
  printf("shapes:      %s (memory planned for the maxima)\n", buf);
  for (int32_t i = 0; i < g->n_inputs; i++) {
    const ir_tensor *t = &g->tensors[g->inputs[i]];
    printf("  input %-24s %s[", t->name, ir_dtype_name(t->dtype));
    for (int k = 0; k < t->rank; k++) {
      const ir_affine *a = ir_profile_dim(pr, g->inputs[i], k);
      if (a)
        printf("%s%lld..%lld", k ? "," : "", (long long)ir_profile_at_min(pr, a),
               (long long)t->dims[k].n);
      else printf("%s%lld", k ? "," : "", (long long)t->dims[k].n);
    }
    printf("]\n");
  }
}

static void print_plan(const ir_plan *p, bool tensors) {
  const ir_plan_header *h = ir_plan_get_header(p);
  const ir_graph *g = ir_plan_graph(p);
  const ir_model_config *c = &g->config;
  printf("format:      %u.%u (%s), %llu bytes\n", h->version_major, h->version_minor,
         ir_plan_producer(p), (unsigned long long)h->file_size);
  printf("target:      %s\nsource hash: %s\n", ir_plan_target(p), ir_plan_source_hash(p));
  printf("model:       %s, vocab %lld, hidden %lld, layers %lld, heads %lld (kv %lld), "
         "head_dim %lld, ffn %lld\n",
         c->arch, (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->n_layers,
         (long long)c->n_heads, (long long)c->n_kv_heads, (long long)c->head_dim,
         (long long)c->intermediate_size);
  printf("             context %lld, rope_theta %g, rms_norm_eps %g, tied embeddings %s, "
         "qkv bias %s, bos %lld, eos %lld\n",
         (long long)c->max_position, c->rope_theta, c->rms_norm_eps,
         c->tie_word_embeddings ? "yes" : "no", c->attention_bias ? "yes" : "no",
         (long long)c->bos_token_id, (long long)c->eos_token_id);
  printf("step limits: %lld tokens, %lld sequences, %lld logit rows; KV block %lld\n",
         (long long)c->max_tokens, (long long)c->max_seqs, (long long)c->max_logits,
         (long long)c->kv_block_size);
  if (c->tp_size > 1) {
    uint64_t wb = 0;
    for (int32_t i = 0; i < g->n_tensors; i++)
      if (g->tensors[i].kind == IR_TENSOR_WEIGHT) wb += g->tensors[i].nbytes;
    printf("tensor par.: %d ranks (mpirun -n %d); heads, kv heads and ffn above are one rank's; "
           "%.2f MiB of weights a rank\n",
           c->tp_size, c->tp_size, (double)wb / 1048576.0);
  }
  if (c->n_decode_buckets > 0) {
    printf("cuda graphs: decode batch");
    for (int32_t i = 0; i < c->n_decode_buckets; i++)
      printf("%s%lld", i ? "," : " ", (long long)c->decode_buckets[i]);
    printf("\n");
  }
  print_tensors(g, tensors);
  print_op_counts(g);
  print_profile(g);
  printf("arena:       %.2f MiB\n", (double)g->arena_size / 1048576.0);
  if (ir_plan_n_kernels(p) > 0) {
    uint64_t kb = 0;
    for (int i = 0; i < ir_plan_n_kernels(p); i++) kb += ir_plan_kernel_at(p, i)->size;
    printf("kernels:     %d images (CUBIN and PTX per source and arch), %.2f MiB\n",
           ir_plan_n_kernels(p), (double)kb / 1048576.0);
  }
  print_tokenizer(p);
  printf("options:    ");
  for (int i = 0; i < ir_plan_n_options(p); i++) {
    const char *k, *v;
    ir_plan_option(p, i, &k, &v);
    printf(" %s=%s", k, v);
  }
  printf("\n");
  for (int i = 0; i < ir_plan_n_pass_log(p); i++)
    printf("pass:        %s\n", ir_plan_pass_log(p, i));
}

static int cmd_inspect(int argc, char **argv) {
  static const struct option longs[] = {{"tensors", no_argument, 0, 't'},
                                        {"ir", no_argument, 0, 'i'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  bool tensors = false, ir = false;
  int c;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    if (c == 't') tensors = true;
    else if (c == 'i') ir = true;
    else {
      fputs("usage: infc inspect model.plan [--tensors] [--ir]\n"
            "  --tensors  list every weight tensor\n"
            "  --ir       print the program\n",
            c == 'h' ? stdout : stderr);
      return c == 'h' ? 0 : 2;
    }
  }
  if (optind != argc - 1) return fail("inspect needs one plan file (see infc inspect --help)");
  ir_plan *p = NULL;
  ir_diag d = {0};
  if (ir_plan_open(argv[optind], IR_PLAN_VERIFY_ALL, &p, &d) != IR_OK) return fail(d.msg);
  print_plan(p, tensors);
  if (ir) ir_graph_print(ir_plan_graph(p), stdout);
  ir_plan_close(p);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage_main(stderr);
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("infc %s (plan format %d.%d)\n", INFC_VERSION, IR_PLAN_VERSION_MAJOR,
           IR_PLAN_VERSION_MINOR);
    return 0;
  }
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help"))
    return usage_main(stdout);
  if (!strcmp(cmd, "build")) return cmd_build(argc - 1, argv + 1);
  if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
  fprintf(stderr, "infc: error: unknown command '%s'\n", cmd);
  return usage_main(stderr);
}
