/* tokenizer: the runtime tokenizer (byte-level BPE as GPT-2 / Llama 3 / Qwen2 / SmolLM use
 * it, and SentencePiece-style BPE with byte fallback as Llama 2 / Mistral use it), built
 * from a spec (HF tokenizer.json, GGUF metadata) and stored in plans as an encoded
 * infc.tok.Tokenizer message (ir/tokenizer.proto).
 *
 * Ownership: *_create / *_load / *_deserialize return objects owned by the caller
 * (tok_destroy). A tokenizer is immutable after creation and safe to use from many
 * threads at once; encode allocates nothing beyond its caller-supplied output except a
 * small per-call scratch (documented at tok_encode). */
#ifndef TEXT_TOKENIZER_H
#define TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir_status.h"

typedef enum tok_model {
  TOK_BPE_BYTE_LEVEL = 1, /* GPT-2 byte-to-unicode alphabet, regex pre-tokenizer */
  TOK_BPE_SPM = 2,        /* SentencePiece-style: spaces as U+2581, byte fallback */
} tok_model;

/* Pre-tokenizer split rules (values stored in plans: append only). Each is a hand-written
 * matcher equal to HF tokenizers' regex split (Isolated) with these patterns. */
typedef enum tok_pre {
  TOK_PRE_NONE = 0, /* SentencePiece-style: no split */
  TOK_PRE_GPT2 = 1, /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
  TOK_PRE_LLAMA3 =
      2, /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
  TOK_PRE_QWEN2 = 3,     /* as LLAMA3 but \p{N} one digit at a time */
  TOK_PRE_SMOLLM = 4,    /* each \p{N} alone (HF Digits individual_digits), then GPT2 */
  TOK_PRE_METASPACE = 5, /* SentencePiece-style, split before every U+2581 (HF Metaspace
                              * split=true: the U+2581 starts the next word) */
} tok_pre;

/* Where a prefix space goes (values stored in plans: append only). */
typedef enum tok_prefix {
  TOK_PREFIX_DEFAULT = 0,    /* from add_prefix_space: SPM -> NORMALIZER, byte-level ->
                                  * ALWAYS; nothing when add_prefix_space is false */
  TOK_PREFIX_NORMALIZER = 1, /* SPM, HF normalizer Sequence[Prepend("\u2581"), Replace(" ",
                                  * "\u2581")] (Llama 2, Mistral, llama.cpp): every non-empty text
                                  * run between special tokens gets U+2581, unconditionally */
  TOK_PREFIX_ALWAYS = 2,     /* HF Metaspace prepend_scheme "always", ByteLevel
                                  * add_prefix_space: every text run not already starting with
                                  * a space gets one */
  TOK_PREFIX_FIRST = 3,      /* HF Metaspace prepend_scheme "first": only the text run at
                                  * offset 0 of the input */
  TOK_PREFIX_NONE = 4,       /* never (HF Metaspace prepend_scheme "never") */
} tok_prefix;

typedef enum tok_type { /* per token, as GGUF token_type */
                        TOK_NORMAL = 1,
                        TOK_UNKNOWN = 2,
                        TOK_CONTROL =
                            3, /* special: <s>, <|im_end|>, ... matched in text only if asked */
                        TOK_USER_DEFINED = 4, /* added tokens matched verbatim in text */
                        TOK_UNUSED = 5,
                        TOK_BYTE = 6, /* <0xAB> byte-fallback pieces */
} tok_type;

/* Per-token flags for added tokens (HF AddedToken), all zero for GGUF vocabularies. */
enum {
  TOK_ATTR_LSTRIP = 1,      /* a match absorbs the white space before it */
  TOK_ATTR_RSTRIP = 2,      /* a match absorbs the white space after it */
  TOK_ATTR_SINGLE_WORD = 4, /* matched only when not inside a word */
  TOK_ATTR_NORMALIZED = 8,  /* matched in the normalized text (HF normalized=true), after
                                 * the tokens without it have been split out */
};

/* Everything needed to build a tokenizer; arrays are borrowed for the call.
 * Added tokens (matched verbatim in the text before pre-tokenization, longest leftmost
 * first, as HF does) are the tokens of type CONTROL, UNKNOWN and USER_DEFINED; CONTROL and
 * UNKNOWN ones are "special" (see parse_special at tok_encode). A zero-initialised spec
 * plus model, tokens and merges is a valid byte-level tokenizer. */
typedef struct tok_spec {
  tok_model model;
  tok_pre pre;
  int32_t n_tokens;
  const char *const *tokens;  /* (n_tokens) vocabulary strings as stored (UTF-8); byte-level
                                  * tokens use the GPT-2 byte-to-unicode alphabet */
  const int32_t *token_types; /* (n_tokens) tok_type, or NULL: all NORMAL */
  const uint8_t *token_attrs; /* (n_tokens) TOK_ATTR_* bits, or NULL: none */
  const float *scores;        /* (n_tokens) or NULL; SPM with scores and no merges (GGUF
                                  * "llama"): every split of a token into two tokens is a
                                  * merge, ranked by the token's score, highest first */
  int32_t n_merges;
  const char *const *merges; /* (n_merges) "left right" in rank order, or NULL when
                                  * merge_ids is given. A later duplicate overrides (as HF) */
  const int32_t *merge_ids;  /* (2 * n_merges) left, right token ids in rank order, or NULL */
  bool byte_fallback;        /* SPM: unknown bytes become <0xXX> tokens */
  bool fuse_unk;             /* consecutive unknown characters give one unk_id */
  bool ignore_merges;        /* a word that is itself a token is not merged (Llama 3) */
  bool nfc;                  /* NFC-normalize text runs first (HF normalizer NFC, Qwen2) */
  bool add_prefix_space;     /* SPM: prepend U+2581; byte-level: prepend ' ' */
  tok_prefix prefix;         /* where the prefix goes; DEFAULT is right for GGUF */
  bool add_bos, add_eos;
  int32_t bos_id, eos_id, pad_id, unk_id; /* -1 if none */
  const int32_t *eos_ids; /* extra end-of-generation ids (e.g. <|im_end|>), or NULL */
  int32_t n_eos_ids;
  const char *chat_template; /* the Jinja source, or NULL */
} tok_spec;

typedef struct irt_tokenizer irt_tokenizer;

/* Validates the spec (ids in range, every merge's halves and result in the vocabulary:
 * IR_INVALID_ARG naming the first bad one) and builds the lookup tables. */
ir_status tok_create(const tok_spec *spec, irt_tokenizer **out, ir_diag *d);
/* Reads an HF tokenizer.json and, if non-NULL, its tokenizer_config.json (bos/eos/pad
 * token strings, add_bos_token/add_eos_token overriding the post_processor, chat_template
 * as a string or the "default" of a list; without one, chat_template.jinja beside
 * tokenizer_json, as transformers >= 4.51 saves it). Unsupported models, normalizers or
 * pre-tokenizers are IR_UNSUPPORTED errors naming them. add_bos/add_eos come from the
 * post_processor (TemplateProcessing) so that add_special matches HF's
 * encode(add_special_tokens=True). Extra end-of-generation ids: the special tokens named
 * <|eot_id|>, <|im_end|>, <|endoftext|>, <|end_of_text|>, <|end|>, <|eom_id|>,
 * <end_of_turn>, </s> (as llama.cpp guesses them). */
ir_status tok_load_hf(const char *tokenizer_json, const char *tokenizer_config, irt_tokenizer **out,
                      ir_diag *d);
/* Encodes to an infc.tok.Tokenizer message (*out malloc'd, owned by the caller). */
ir_status tok_serialize(const irt_tokenizer *t, uint8_t **out, size_t *out_len, ir_diag *d);
ir_status tok_deserialize(const uint8_t *buf, size_t len, irt_tokenizer **out, ir_diag *d);
void tok_destroy(irt_tokenizer *t);

/* Text to ids. add_special: add BOS/EOS as the tokenizer is configured to;
 * parse_special: special (CONTROL, UNKNOWN) tokens written in the text become their ids,
 * otherwise they are encoded as plain text (HF encode_special_tokens=True). USER_DEFINED
 * (non-special added) tokens are always matched, as in HF and llama.cpp. Invalid UTF-8 is
 * an IR_INVALID_ARG error naming the byte offset. Writes at most cap ids; *out_n is the
 * full count (call again with a larger buffer if it exceeds cap).
 * Scratch: one malloc per call (IR_OOM if it fails) of about 45 bytes per input byte
 * (+ 90 per space for SPM, + 25 per byte with nfc), freed before returning; nothing is
 * cached and nothing is locked, so calls may run concurrently. */
ir_status tok_encode(const irt_tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *ids, size_t cap, size_t *out_n, ir_diag *d);
/* A byte range [start, end) of an encoder's input. */
typedef struct tok_span {
  size_t start, end;
} tok_span;

/* tok_encode with special tokens parsed (parse_special) everywhere but in the sorted,
 * disjoint text spans, where they are text: a chat's message content between the template's
 * own special tokens (a special token that overlaps a span at all is text). Non-special
 * added tokens match everywhere, as always. */
ir_status tok_encode_spans(const irt_tokenizer *t, const char *text, size_t len, bool add_special,
                           bool parse_special, const tok_span *spans, size_t n_spans, int32_t *ids,
                           size_t cap, size_t *out_n, ir_diag *d);
ir_status tok_encode_spans_alloc(const irt_tokenizer *t, const char *text, size_t len,
                                 bool add_special, bool parse_special, const tok_span *spans,
                                 size_t n_spans, int32_t **out, size_t *out_n, ir_diag *d);
/* tok_encode into *out, allocated to the full count (free it). A tokenizer can give more
 * ids than the text has bytes (byte fallback of every space, a prefix on each piece), so a
 * buffer sized by the text is only a first guess: this sizes it exactly. */
ir_status tok_encode_alloc(const irt_tokenizer *t, const char *text, size_t len, bool add_special,
                           bool parse_special, int32_t **out, size_t *out_n, ir_diag *d);

/* Ids to text. skip_special drops special (CONTROL, UNKNOWN) tokens; added tokens come out
 * verbatim; SPM: U+2581 becomes ' ', <0xXX> pieces become bytes and the leading space of
 * the text is dropped when a prefix is added at encode (as HF's Strip decoder does).
 * Writes at most cap bytes (no NUL); *out_len is the full length. Byte sequences that are
 * not valid UTF-8 are replaced by U+FFFD (one per maximal invalid subpart, as HF's
 * from_utf8_lossy). An id out of range is IR_INVALID_ARG. */
ir_status tok_decode(const irt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                     char *buf, size_t cap, size_t *out_len, ir_diag *d);

/* Streaming decode: push ids one at a time; text comes out only as complete UTF-8
 * characters (a character split over tokens is held until it completes). The
 * concatenated output equals tok_decode of the same ids. Plain struct, no cleanup. */
typedef struct tok_stream {
  const irt_tokenizer *t;
  bool skip_special;
  uint8_t pending[8];
  int n_pending;
  bool first; /* SPM: the leading space of the first piece is dropped */
} tok_stream;

void tok_stream_init(tok_stream *s, const irt_tokenizer *t, bool skip_special);
/* Writes the text completed by `id` to buf (no NUL) and returns its length. At most cap
 * bytes are written; a cap of tok_piece_max(t) never truncates. Invalid byte
 * sequences come out as U+FFFD; out-of-range ids give nothing. */
size_t tok_stream_push(tok_stream *s, int32_t id, char *buf, size_t cap);
/* Flushes held bytes at the end (incomplete characters become U+FFFD, at most 3 bytes) and
 * resets the stream for a new text. */
size_t tok_stream_finish(tok_stream *s, char *buf, size_t cap);
/* The bytes a token stands for in decoded text (not necessarily whole UTF-8 characters;
 * SPM's U+2581 already a space, <0xXX> pieces already their byte), borrowed; NULL and 0
 * for an id out of range. */
const uint8_t *tok_piece(const irt_tokenizer *t, int32_t id, size_t *len);
/* The most bytes one tok_stream_push can produce for this tokenizer. */
size_t tok_piece_max(const irt_tokenizer *t);

int32_t tok_vocab_size(const irt_tokenizer *t);
int32_t tok_bos(const irt_tokenizer *t);
int32_t tok_eos(const irt_tokenizer *t);
/* True for eos_id and every extra end-of-generation id. */
bool tok_is_eog(const irt_tokenizer *t, int32_t id);
bool tok_is_special(const irt_tokenizer *t, int32_t id);
/* The id of a token string exactly as in the vocabulary, or -1. */
int32_t tok_find(const irt_tokenizer *t, const char *token);
/* The vocabulary string of id (borrowed, NUL-terminated), or NULL if out of range. */
const char *tok_token(const irt_tokenizer *t, int32_t id);
/* The stored chat template source, or NULL. Borrowed. */
const char *tok_chat_template(const irt_tokenizer *t);
tok_model tok_get_model(const irt_tokenizer *t);
tok_pre tok_get_pre(const irt_tokenizer *t);

#endif
