/* fuzz_plan: libFuzzer target for the plan reader behind the checksums (ir/ir_plan_read.c,
 * ir_plan_kernels.c, the graph checks in ir_verify.c) and for what the runtime builds from an
 * accepted plan (irt_model_open: backend check, arena and KV setup, the plan's tokenizer, a
 * warm-up step). The checksums would refuse nearly every mutated file before any parsing, so
 * the input is the plan's *metadata* (the protobuf-c infc.plan.Plan message) and the harness
 * makes a well-formed file around it: at start-up it builds a base plan with infc_build from
 * tests/fixtures/llama-text (a 2-layer llama with a tokenizer, small step limits); for each
 * input the file is the base plan's bytes, then the input appended as the metadata section,
 * with the header's meta_offset / meta_size / file_size, meta_hash and header_hash set to
 * match (weights and kernels sections are the base's, in place, hashes unchanged). Seeds
 * (tests/fuzz/corpus/plan) are the base plan's own metadata, with and without its tokenizer:
 * FUZZ_PLAN_DUMP_META=FILE writes them at start-up (tests/fuzz/gen_seeds.py). Build and run:
 * tools/fuzz plan. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "fuzz_util.h"
#include "infc_build.h"
#include "infc_options.h"
#include "inferrt.h"
#include "ir.h"
#include "ir_plan.h"
#include "plan.pb-c.h"

static uint8_t *base; /* the base plan file */
static uint64_t base_size;
static ir_plan_header base_h;
static int plan_fd;

static uint8_t *slurp(const char *path, uint64_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f || fseek(f, 0, SEEK_END) != 0) abort();
  long n = ftell(f);
  uint8_t *b = malloc((size_t)n);
  if (n <= 0 || !b || fseek(f, 0, SEEK_SET) != 0 || fread(b, 1, (size_t)n, f) != (size_t)n) abort();
  fclose(f);
  *size = (uint64_t)n;
  return b;
}

static void write_file(const char *path, const void *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
}

/* The seeds: the base plan's metadata (to PATH), and the same without its tokenizer (to
 * PATH.notok; the tokenizer is most of the bytes, and tok_blob fuzzes it on its own). */
static void dump_meta(const char *path) {
  const uint8_t *meta = base + base_h.meta_offset;
  write_file(path, meta, base_h.meta_size);
  Infc__Plan__Plan *m = infc__plan__plan__unpack(NULL, base_h.meta_size, meta);
  if (!m) abort();
  m->tokenizer.len = 0;
  size_t n = infc__plan__plan__get_packed_size(m);
  uint8_t *buf = malloc(n);
  if (!buf) abort();
  infc__plan__plan__pack(m, buf);
  char notok[4096];
  snprintf(notok, sizeof notok, "%s.notok", path);
  write_file(notok, buf, n);
  free(buf);
  infc__plan__plan__free_unpacked(m, NULL);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  infc_options o = infc_options_default();
  o.model.max_tokens = 16, o.model.max_seqs = 4, o.model.max_logits = 4;
  o.model.max_context = 64, o.max_tokens_set = true;
  char path[4200];
  snprintf(path, sizeof path, "%s/base.plan", fz_tmpdir());
  ir_diag d = {0};
  if (infc_build(FUZZ_FIXTURES "/llama-text", &o, path, NULL, NULL, &d) != IR_OK) {
    fprintf(stderr, "fuzz_plan: cannot build the base plan: %s\n", d.msg);
    abort();
  }
  base = slurp(path, &base_size);
  remove(path);
  memcpy(&base_h, base, sizeof base_h);
  const char *dump = getenv("FUZZ_PLAN_DUMP_META");
  if (dump) dump_meta(dump);
  plan_fd = fz_open("fuzz.plan");
  fz_pwrite(plan_fd, base, base_size, 0);
  return 0;
}

static volatile uint64_t sink;

static void walk(const ir_plan *p) {
  sink += strlen(ir_plan_producer(p)) + strlen(ir_plan_target(p)) + strlen(ir_plan_source_hash(p));
  for (int i = 0; i < ir_plan_n_options(p); i++) {
    const char *k, *v;
    ir_plan_option(p, i, &k, &v);
    sink += strlen(k) + strlen(v);
  }
  for (int i = 0; i < ir_plan_n_pass_log(p); i++) sink += strlen(ir_plan_pass_log(p, i));
  for (int i = 0; i < ir_plan_n_kernels(p); i++) {
    const ir_plan_kernel *k = ir_plan_kernel_at(p, i);
    sink += strlen(k->name) + (k->size ? k->data[k->size - 1] : 0);
    sink += ir_plan_find_kernel(p, k->name, k->arch, (ir_plan_kernel_kind)k->kind) != NULL;
  }
  size_t n = 0;
  const uint8_t *tok = ir_plan_tokenizer(p, &n);
  if (tok) sink += tok[n - 1];
  const ir_graph *g = ir_plan_graph(p);
  ir_diag d = {0};
  sink += ir_graph_verify_step(g, &d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ir_plan_header h = base_h;
  h.meta_offset = base_size;
  h.meta_size = size;
  h.file_size = base_size + size;
  h.meta_hash = XXH3_64bits(data, size);
  h.header_hash = XXH3_64bits(&h, offsetof(ir_plan_header, header_hash));
  fz_pwrite(plan_fd, &h, sizeof h, 0);
  fz_pwrite(plan_fd, data, size, base_size);
  if (ftruncate(plan_fd, (off_t)(base_size + size)) != 0) abort();
  const char *path = fz_path("fuzz.plan");
  ir_plan *p = NULL;
  ir_diag d = {0};
  if (ir_plan_open(path, IR_PLAN_VERIFY_ALL, &p, &d) != IR_OK) {
    fz_note("ir_plan_open", d.msg);
    return 0;
  }
  walk(p);
  ir_plan_close(p);
  /* what `inferrt` does with it: one thread, a small KV pool, on the CPU */
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = 1, mo.kv_tokens = 64, mo.device = "cpu";
  irt_model *m = NULL;
  irt_error err = {0};
  if (irt_model_open(path, &mo, &m, &err) == IRT_OK) {
    const irt_model_info *info = irt_model_get_info(m);
    sink += (uint64_t)info->vocab_size + strlen(info->arch);
    irt_model_close(m);
  } else {
    fz_note("irt_model_open", err.msg);
  }
  return 0;
}
