/* fuzz_gguf: libFuzzer target for the GGUF reader (formats/fmt_gguf.c) and what reads
 * through it: every key, value and tensor through the accessors; the tokenizer the file
 * carries (fmt_gguf_tok.c; the runtime tokenizer built from it is exercised as fuzz_tok.h
 * says); the Llama-family parameters (infc_gguf_llama.c) and, when those are accepted, the
 * Llama template over the file's tensors (model_llama_build, small step limits). The input is
 * the whole .gguf file. Build and run: tools/fuzz gguf. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_tok.h"
#include "fuzz_util.h"
#include "fmt_gguf.h"
#include "infc_gguf_llama.h"
#include "fmt_gguf_tok.h"
#include "infc_tokenizer.h"
#include "ir.h"
#include "llama.h"
#include "tokenizer.h"

static volatile uint64_t sink; /* keeps the reads below from being optimised away */

static void touch_str(fmt_gguf_str s) {
  if (s.len) sink += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
}

static void touch_value(const fmt_gguf_value *v, int depth) {
  if (v->type == FMT_GGUF_STRING) touch_str(v->str);
  if (v->type != FMT_GGUF_ARRAY || depth > FMT_GGUF_MAX_DEPTH) return;
  for (uint64_t i = 0; i < v->count; i++) {
    if (v->ints) sink += (uint64_t)v->ints[i];
    if (v->floats) sink += (uint64_t)(v->floats[i] != 0);
    if (v->strs) touch_str(v->strs[i]);
    if (v->items) touch_value(&v->items[i], depth + 1);
  }
}

/* Every key, value and tensor the reader hands out, through the public accessors. */
static void walk(const fmt_gguf *g) {
  uint64_t size = 0;
  const uint8_t *bytes = fmt_gguf_bytes(g, &size);
  if (size) sink += bytes[size - 1];
  sink += fmt_gguf_version(g) + fmt_gguf_alignment(g) + fmt_gguf_data_offset(g);
  for (size_t i = 0; i < fmt_gguf_kv_count(g); i++) {
    const fmt_gguf_kv *kv = fmt_gguf_kv_get(g, i);
    sink += strlen(kv->key) + (fmt_gguf_kv_find(g, kv->key) != NULL);
    sink += strlen(fmt_gguf_type_name(kv->value.type));
    touch_value(&kv->value, 0);
    ir_diag d = {0};
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    float f;
    bool b;
    fmt_gguf_str s;
    const fmt_gguf_str *strs;
    const int64_t *ints;
    const float *floats;
    uint64_t n;
    sink += fmt_gguf_get_u32(g, kv->key, &u32, &d) + fmt_gguf_get_i32(g, kv->key, &i32, &d) +
            fmt_gguf_get_u64(g, kv->key, &u64, &d) + fmt_gguf_get_f32(g, kv->key, &f, &d) +
            fmt_gguf_get_bool(g, kv->key, &b, &d) + fmt_gguf_get_str(g, kv->key, &s, &d) +
            fmt_gguf_get_strs(g, kv->key, &strs, &n, &d) +
            fmt_gguf_get_ints(g, kv->key, &ints, &n, &d) +
            fmt_gguf_get_floats(g, kv->key, &floats, &n, &d);
  }
  for (size_t i = 0; i < fmt_gguf_tensor_count(g); i++) {
    const fmt_gguf_tensor *t = fmt_gguf_tensor_get(g, i);
    sink +=
        (fmt_gguf_tensor_find(g, t->name) != NULL) + strlen(fmt_gguf_ggml_type_name(t->ggml_type));
    ir_diag d = {0};
    sink += fmt_gguf_type_check(t, &d);
    if (t->nbytes) /* the first and last byte of the data are inside the mapping */
      sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
  }
}

static void use_tokenizer(const fmt_gguf *g) {
  ir_diag d = {0};
  irt_tokenizer *t = NULL;
  if (fmt_gguf_tokenizer(g, &t, &d) != IR_OK || !t) {
    fz_note("tokenizer", d.msg[0] ? d.msg : "none");
    return;
  }
  fz_exercise_tokenizer(t);
  int32_t nv = tok_vocab_size(t);
  tok_destroy(t);
  infc_tok_blob tb = {0};
  d = (ir_diag){0};
  (void)infc_gguf_tokenizer_blob(g, nv, &tb, &d);
  infc_tok_blob_free(&tb);
}

static void use_llama(const fmt_gguf *g) {
  model_llama_params p;
  ir_diag d = {0};
  if (infc_gguf_llama_params(g, &p, &d) != IR_OK) {
    fz_note("llama params", d.msg);
    return;
  }
  model_tensor_src src = infc_gguf_llama_src(g);
  model_build_opts bo = model_build_opts_default();
  bo.max_tokens = 16, bo.max_seqs = 4, bo.max_logits = 4, bo.max_context = 64;
  ir_graph *graph = NULL;
  d = (ir_diag){0};
  if (model_llama_build(&p, &src, &bo, &graph, &d) == IR_OK) ir_graph_destroy(graph);
  else fz_note("model_llama_build", d.msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fz_write("model.gguf", data, size);
  fmt_gguf *g = NULL;
  ir_diag d = {0};
  if (fmt_gguf_open(path, &g, &d) != IR_OK) {
    fz_note("open", d.msg);
    return 0;
  }
  walk(g);
  use_tokenizer(g);
  use_llama(g);
  fmt_gguf_close(g);
  return 0;
}
