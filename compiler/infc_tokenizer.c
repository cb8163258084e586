/* infc_tokenizer: tokenizer discovery and encoding for plans. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infc_tokenizer.h"
#include "fmt_gguf_tok.h"
#include "infc_util.h"
#include "tokenizer.h"
#include "ir_alloc.h"

ir_status infc_tokenizer_load_json(const char *json_path, int64_t model_vocab, infc_tok_blob *out,
                                   ir_diag *d) {
  char dir[4096], cfg[4200];
  irt_tokenizer *t = NULL;
  memset(out, 0, sizeof *out);
  infc_path_dir(dir, sizeof dir, json_path);
  bool has_cfg =
      infc_path_join(cfg, sizeof cfg, dir, "tokenizer_config.json") && infc_file_exists(cfg);
  ir_status st = tok_load_hf(json_path, has_cfg ? cfg : NULL, &t, d);
  if (st == IR_OK && model_vocab > 0 && tok_vocab_size(t) > model_vocab)
    st = ir_diag_set(d, IR_BAD_FORMAT,
                     "%s: the tokenizer has %d tokens but the model's "
                     "vocabulary has %lld rows",
                     json_path, tok_vocab_size(t), (long long)model_vocab);
  if (st == IR_OK) st = tok_serialize(t, &out->data, &out->size, d);
  if (st == IR_OK) snprintf(out->origin, sizeof out->origin, "%s", json_path);
  tok_destroy(t);
  return st;
}

ir_status infc_tokenizer_beside(const char *src, int64_t model_vocab, infc_tok_blob *out,
                                ir_diag *d) {
  char dir[4096], path[4200];
  memset(out, 0, sizeof *out);
  if (infc_is_dir(src)) snprintf(dir, sizeof dir, "%s", src);
  else infc_path_dir(dir, sizeof dir, src);
  if (!infc_path_join(path, sizeof path, dir, "tokenizer.json") || !infc_file_exists(path))
    return IR_OK;
  return infc_tokenizer_load_json(path, model_vocab, out, d);
}

void infc_tok_blob_free(infc_tok_blob *b) {
  ir_free(b->data);
  memset(b, 0, sizeof *b);
}

ir_status infc_gguf_tokenizer_blob(const fmt_gguf *g, int64_t model_vocab, infc_tok_blob *out,
                                   ir_diag *d) {
  irt_tokenizer *t = NULL;
  memset(out, 0, sizeof *out);
  ir_status st = fmt_gguf_tokenizer(g, &t, d);
  if (st != IR_OK || !t) return st;
  if (model_vocab > 0 && tok_vocab_size(t) > model_vocab)
    st = ir_diag_set(d, IR_BAD_FORMAT,
                     "%s: the tokenizer has %d tokens but the model's "
                     "vocabulary has %lld rows",
                     fmt_gguf_path(g), tok_vocab_size(t), (long long)model_vocab);
  if (st == IR_OK) st = tok_serialize(t, &out->data, &out->size, d);
  if (st == IR_OK)
    snprintf(out->origin, sizeof out->origin, "%s (GGUF metadata)", fmt_gguf_path(g));
  tok_destroy(t);
  return st;
}
