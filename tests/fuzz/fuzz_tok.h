/* fuzz_tok: what the tokenizer targets do with a tokenizer that loaded (text/tokenizer.h):
 * encode a few texts (special tokens parsed and not, added BOS/EOS and not) and decode them
 * back, decode ids across the vocabulary in one call and streamed, look tokens up, and
 * serialize it as plans store it; the copy read back must encode the texts to the same ids
 * (a mismatch traps: the plan's tokenizer would differ from the one the compiler loaded).
 * With FUZZ_DUMP_BLOB=DIR the serialized form is also written to DIR (tok_blob's seeds:
 * tests/fuzz/gen_seeds.py). */
#ifndef FUZZ_TOK_H
#define FUZZ_TOK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "tokenizer.h"

static volatile uint64_t fz_tok_sink; /* keeps the reads below from being optimised away */

static const char *const fz_texts[] = {
    "Hello world",
    " 123 4567 abc\n\n\tdef's  don't",
    "<s>[INST] hi [/INST]</s><|im_start|>user\n\xe2\x96\x81x<|im_end|><|endoftext|>",
    "\xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 e\xcc\x81",
};
#define FZ_N_TEXTS (sizeof fz_texts / sizeof fz_texts[0])

/* Encodes text k; *ids malloc'd (NULL on refusal). */
static size_t fz_encode(const irt_tokenizer *t, size_t k, int32_t **ids) {
  ir_diag d = {0};
  size_t n = 0;
  *ids = NULL;
  if (tok_encode_alloc(t, fz_texts[k], strlen(fz_texts[k]), k & 1, k != 2, ids, &n, &d) != IR_OK) {
    free(*ids);
    *ids = NULL;
    return 0;
  }
  return n;
}

static void fz_dump_blob(const uint8_t *blob, size_t len) {
  const char *dir = getenv("FUZZ_DUMP_BLOB");
  if (!dir) return;
  uint64_t h = 1469598103934665603ull; /* FNV-1a: the file's name */
  for (size_t i = 0; i < len; i++) h = (h ^ blob[i]) * 1099511628211ull;
  char path[4096];
  snprintf(path, sizeof path, "%s/tok-%016llx", dir, (unsigned long long)h);
  FILE *f = fopen(path, "wb");
  if (f) fwrite(blob, 1, len, f), fclose(f);
}

__attribute__((unused)) static void fz_exercise_tokenizer(const irt_tokenizer *t) {
  int32_t nv = tok_vocab_size(t);
  char buf[1024];
  size_t len;
  ir_diag d;
  int32_t *ids[FZ_N_TEXTS];
  size_t n[FZ_N_TEXTS];
  for (size_t k = 0; k < FZ_N_TEXTS; k++) {
    n[k] = fz_encode(t, k, &ids[k]);
    d = (ir_diag){0};
    if (ids[k]) (void)tok_decode(t, ids[k], n[k], k & 1, buf, sizeof buf, &len, &d);
  }
  /* ids spread over the vocabulary, in one call and streamed */
  int32_t spread[96];
  for (int i = 0; i < 96; i++)
    spread[i] = nv > 0 ? (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)nv) : 0;
  d = (ir_diag){0};
  if (nv > 0) (void)tok_decode(t, spread, 96, false, buf, sizeof buf, &len, &d);
  tok_stream s;
  tok_stream_init(&s, t, true);
  size_t cap = tok_piece_max(t);
  char *piece = malloc(cap + 4);
  for (int i = 0; piece && nv > 0 && i < 96; i++)
    fz_tok_sink += tok_stream_push(&s, spread[i], piece, cap);
  if (piece) fz_tok_sink += tok_stream_finish(&s, piece, cap + 4);
  free(piece);
  for (int i = 0; i < 96 && nv > 0; i++) {
    const char *tok = tok_token(t, spread[i]);
    if (tok) fz_tok_sink += (uint64_t)tok_find(t, tok);
    size_t pl = 0;
    const uint8_t *p = tok_piece(t, spread[i], &pl);
    if (p && pl) fz_tok_sink += p[pl - 1];
    fz_tok_sink += tok_is_eog(t, spread[i]) + tok_is_special(t, spread[i]);
  }
  fz_tok_sink += (uint64_t)tok_bos(t) + (uint64_t)tok_eos(t) + tok_get_model(t) + tok_get_pre(t);
  const char *tmpl = tok_chat_template(t);
  if (tmpl) fz_tok_sink += strlen(tmpl);
  /* the plan's copy */
  uint8_t *blob = NULL;
  size_t blen = 0;
  d = (ir_diag){0};
  if (tok_serialize(t, &blob, &blen, &d) == IR_OK) {
    fz_dump_blob(blob, blen);
    irt_tokenizer *t2 = NULL;
    d = (ir_diag){0};
    if (tok_deserialize(blob, blen, &t2, &d) != IR_OK) __builtin_trap(); /* own output refused */
    for (size_t k = 0; k < FZ_N_TEXTS; k++) {
      int32_t *ids2;
      size_t n2 = fz_encode(t2, k, &ids2);
      if (!ids[k] != !ids2 || n2 != n[k] || (n2 && memcmp(ids[k], ids2, n2 * sizeof *ids2)))
        __builtin_trap(); /* the serialized tokenizer encodes differently */
      free(ids2);
    }
    tok_destroy(t2);
  }
  free(blob);
  for (size_t k = 0; k < FZ_N_TEXTS; k++) free(ids[k]);
}

#endif
