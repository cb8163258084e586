/* tokenizer: the runtime tokenizer (byte-level BPE as GPT-2 / Llama 3 / Qwen2 / SmolLM use
 * it, and SentencePiece-style BPE with byte fallback as Llama 2 / Mistral use it), built
 * from a spec (HF tokenizer.json, GGUF metadata) and stored in plans as an encoded
 * infc.tok.Tokenizer message (ir/tokenizer.proto).
 *
 * Ownership: *_create / *_load / *_deserialize return objects owned by the caller
 * (irt_tok_destroy). A tokenizer is immutable after creation and safe to use from many
 * threads at once; encode allocates nothing beyond its caller-supplied output except a
 * small per-call scratch (documented at irt_tok_encode). */
#ifndef IRT_TOKENIZER_H
#define IRT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir_status.h"

typedef enum irt_tok_model {
  IRT_TOK_BPE_BYTE_LEVEL = 1, /* GPT-2 byte-to-unicode alphabet, regex pre-tokenizer */
  IRT_TOK_BPE_SPM = 2,        /* SentencePiece-style: spaces as U+2581, byte fallback */
} irt_tok_model;

/* Pre-tokenizer split rules (values stored in plans: append only). */
typedef enum irt_tok_pre {
  IRT_TOK_PRE_NONE = 0,   /* SentencePiece-style: no split */
  IRT_TOK_PRE_GPT2 = 1,   /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
  IRT_TOK_PRE_LLAMA3 = 2, /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
  IRT_TOK_PRE_QWEN2 = 3,  /* as LLAMA3 but \p{N} one digit at a time */
  IRT_TOK_PRE_SMOLLM = 4, /* each digit alone, then GPT2 */
} irt_tok_pre;

typedef enum irt_tok_type { /* per token, as GGUF token_type */
  IRT_TOK_NORMAL = 1,
  IRT_TOK_UNKNOWN = 2,
  IRT_TOK_CONTROL = 3,      /* special: <s>, <|im_end|>, ... matched in text only if asked */
  IRT_TOK_USER_DEFINED = 4, /* added tokens matched verbatim in text */
  IRT_TOK_UNUSED = 5,
  IRT_TOK_BYTE = 6,         /* <0xAB> byte-fallback pieces */
} irt_tok_type;

/* Everything needed to build a tokenizer; arrays are borrowed for the call. */
typedef struct irt_tok_spec {
  irt_tok_model model;
  irt_tok_pre pre;
  int32_t n_tokens;
  const char *const *tokens;     /* (n_tokens) vocabulary strings as stored (UTF-8) */
  const int32_t *token_types;    /* (n_tokens) irt_tok_type, or NULL: all NORMAL */
  const float *scores;           /* (n_tokens) or NULL (unused by BPE merges) */
  int32_t n_merges;
  const char *const *merges;     /* (n_merges) "left right" in rank order */
  bool byte_fallback;            /* SPM: unknown bytes become <0xXX> tokens */
  bool add_prefix_space;         /* SPM: prepend U+2581; byte-level: prepend ' ' */
  bool add_bos, add_eos;
  int32_t bos_id, eos_id, pad_id, unk_id; /* -1 if none */
  const int32_t *eos_ids;        /* extra end-of-generation ids (e.g. <|im_end|>), or NULL */
  int32_t n_eos_ids;
  const char *chat_template;     /* the Jinja source, or NULL */
} irt_tok_spec;

typedef struct irt_tokenizer irt_tokenizer;

ir_status irt_tok_create(const irt_tok_spec *spec, irt_tokenizer **out, ir_diag *d);
/* Reads an HF tokenizer.json and, if non-NULL, its tokenizer_config.json (special-token
 * flags, add_bos/add_eos, chat_template). Unsupported models, normalizers or
 * pre-tokenizers are errors naming them. */
ir_status irt_tok_load_hf(const char *tokenizer_json, const char *tokenizer_config,
                          irt_tokenizer **out, ir_diag *d);
/* Encodes to an infc.tok.Tokenizer message (*out malloc'd, owned by the caller). */
ir_status irt_tok_serialize(const irt_tokenizer *t, uint8_t **out, size_t *out_len, ir_diag *d);
ir_status irt_tok_deserialize(const uint8_t *buf, size_t len, irt_tokenizer **out, ir_diag *d);
void irt_tok_destroy(irt_tokenizer *t);

/* Text to ids. add_special: add BOS/EOS as the tokenizer is configured to;
 * parse_special: control and user-defined tokens written in the text become their ids
 * (otherwise they are encoded as plain text). Invalid UTF-8 is an IR_INVALID_ARG error
 * naming the byte offset. Writes at most cap ids; *out_n is the full count (call again
 * with a larger buffer if it exceeds cap). */
ir_status irt_tok_encode(const irt_tokenizer *t, const char *text, size_t len, bool add_special,
                         bool parse_special, int32_t *ids, size_t cap, size_t *out_n, ir_diag *d);

/* Ids to text. skip_special drops control tokens. Writes at most cap bytes (no NUL);
 * *out_len is the full length. Byte sequences that are not valid UTF-8 are replaced by
 * U+FFFD. */
ir_status irt_tok_decode(const irt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                         char *buf, size_t cap, size_t *out_len, ir_diag *d);

/* Streaming decode: push ids one at a time; text comes out only as complete UTF-8
 * characters (a character split over tokens is held until it completes). */
typedef struct irt_tok_stream {
  const irt_tokenizer *t;
  bool skip_special;
  uint8_t pending[8];
  int n_pending;
  bool first; /* SPM: the leading space of the first piece is dropped */
} irt_tok_stream;

void irt_tok_stream_init(irt_tok_stream *s, const irt_tokenizer *t, bool skip_special);
/* Appends the text completed by `id` to buf (at most cap bytes); returns its length. */
size_t irt_tok_stream_push(irt_tok_stream *s, int32_t id, char *buf, size_t cap);
/* Flushes held bytes at the end (incomplete characters become U+FFFD). */
size_t irt_tok_stream_finish(irt_tok_stream *s, char *buf, size_t cap);

int32_t irt_tok_vocab_size(const irt_tokenizer *t);
int32_t irt_tok_bos(const irt_tokenizer *t);
int32_t irt_tok_eos(const irt_tokenizer *t);
/* True for eos_id and every extra end-of-generation id. */
bool irt_tok_is_eog(const irt_tokenizer *t, int32_t id);
bool irt_tok_is_special(const irt_tokenizer *t, int32_t id);
/* The id of a token string exactly as in the vocabulary, or -1. */
int32_t irt_tok_find(const irt_tokenizer *t, const char *token);
/* The stored chat template source, or NULL. Borrowed. */
const char *irt_tok_chat_template(const irt_tokenizer *t);
irt_tok_model irt_tok_get_model(const irt_tokenizer *t);
irt_tok_pre irt_tok_get_pre(const irt_tokenizer *t);

#endif
