/* tok_serial: the tokenizer as an infc.tok.Tokenizer message (ir/tokenizer.proto).
 * Deserialization treats the bytes as untrusted: every count, length, enum and id is
 * checked (here, then again by tok_create) before anything is built from it. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "tokenizer.pb-c.h"
#include "ir_alloc.h"

#define TOK_FORMAT_VERSION 1
#define TOK_END_MARKER 0x4B4F5445u /* "ETOK" */

ir_status tok_serialize(const irt_tokenizer *t, uint8_t **out, size_t *out_len, ir_diag *d) {
  if (!t || !out || !out_len) return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: NULL argument");
  *out = NULL;
  *out_len = 0;
  Infc__Tok__Tokenizer m = INFC__TOK__TOKENIZER__INIT;
  size_t n = (size_t)t->n_tokens, text = 0;
  uint32_t *lens = ir_malloc(n * sizeof *lens);
  uint8_t *blob = ir_malloc(t->off[n] + 1);
  if (!lens || !blob) {
    ir_free(lens);
    ir_free(blob);
    return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    lens[i] = t->off[i + 1] - t->off[i] - 1;
    memcpy(blob + text, t->text + t->off[i], lens[i]);
    text += lens[i];
  }
  m.version = TOK_FORMAT_VERSION;
  m.model = (uint32_t)t->model;
  m.pre = (uint32_t)t->pre;
  m.prefix = (uint32_t)t->prefix;
  m.token_text = (ProtobufCBinaryData){text, blob};
  m.n_token_len = n;
  m.token_len = lens;
  m.token_type = (ProtobufCBinaryData){n, t->types};
  m.token_attr = (ProtobufCBinaryData){n, t->attrs};
  m.n_score = t->scores ? n : 0;
  m.score = t->scores;
  m.n_merge = 2 * (size_t)t->n_merges;
  m.merge = t->merges;
  m.byte_fallback = t->byte_fallback;
  m.fuse_unk = t->fuse_unk;
  m.ignore_merges = t->ignore_merges;
  m.nfc = t->nfc;
  m.add_bos = t->add_bos;
  m.add_eos = t->add_eos;
  m.bos_id = t->bos_id;
  m.eos_id = t->eos_id;
  m.pad_id = t->pad_id;
  m.unk_id = t->unk_id;
  m.n_eos_ids = (size_t)t->n_eos_ids;
  m.eos_ids = t->eos_ids;
  m.chat_template = t->chat_template ? t->chat_template : (char *)"";
  m.end_marker = TOK_END_MARKER;
  size_t size = infc__tok__tokenizer__get_packed_size(&m);
  uint8_t *buf = ir_malloc(size ? size : 1);
  if (buf) infc__tok__tokenizer__pack(&m, buf);
  ir_free(lens);
  ir_free(blob);
  if (!buf) return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  *out = buf;
  *out_len = size;
  return IR_OK;
}

/* Structural checks the builder cannot make (it sees only the spec made from them). */
static ir_status check_message(const Infc__Tok__Tokenizer *m, ir_diag *d) {
  size_t n = m->n_token_len;
  if (m->version != TOK_FORMAT_VERSION)
    return ir_diag_set(d, IR_VERSION, "tokenizer message: format version %u (this build reads %d)",
                       m->version, TOK_FORMAT_VERSION);
  if (m->end_marker != TOK_END_MARKER)
    return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: truncated (no end marker)");
  if (n == 0 || n > (1u << 24))
    return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: bad token count %zu", n);
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++) sum += m->token_len[i];
  if (sum != m->token_text.len)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tokenizer message: token lengths add up to %llu, text "
                       "holds %zu bytes",
                       (unsigned long long)sum, m->token_text.len);
  if (m->token_text.len && memchr(m->token_text.data, 0, m->token_text.len))
    return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: NUL byte in a token");
  if (m->token_type.len != n)
    return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: %zu token types for %zu tokens",
                       m->token_type.len, n);
  if (m->token_attr.len != 0 && m->token_attr.len != n)
    return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: %zu token attributes for %zu tokens",
                       m->token_attr.len, n);
  for (size_t i = 0; i < m->token_attr.len; i++)
    if (m->token_attr.data[i] & ~0x0F)
      return ir_diag_set(d, IR_BAD_FORMAT,
                         "tokenizer message: token %zu has unknown "
                         "attributes",
                         i);
  if (m->n_score != 0 && m->n_score != n)
    return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: %zu scores for %zu tokens", m->n_score,
                       n);
  if (m->n_merge % 2 || m->n_merge / 2 > (1u << 24))
    return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: bad merge count %zu", m->n_merge);
  if (m->n_eos_ids > n)
    return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: bad eos_ids count %zu", m->n_eos_ids);
  if (m->model < 1 || m->model > 2 || m->pre > TOK_PRE_METASPACE || m->prefix > TOK_PREFIX_NONE)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "tokenizer message: unknown model %u, pre-tokenizer %u "
                       "or prefix mode %u",
                       m->model, m->pre, m->prefix);
  return IR_OK;
}

/* Builds the spec's token pointers and types from the message; *text gets the NUL-separated
 * copy of the token strings. */
static ir_status spec_tokens(const Infc__Tok__Tokenizer *m, tok_spec *s, char **text,
                             const char ***toks, int32_t **types, ir_diag *d) {
  size_t n = m->n_token_len, o = 0, p = 0;
  *text = ir_malloc(m->token_text.len + n);
  *toks = ir_malloc(n * sizeof **toks);
  *types = ir_malloc(n * sizeof **types);
  if (!*text || !*toks || !*types) return ir_diag_set(d, IR_OOM, "tokenizer: out of memory");
  for (size_t i = 0; i < n; i++) {
    (*toks)[i] = *text + o;
    memcpy(*text + o, m->token_text.data + p, m->token_len[i]);
    o += m->token_len[i];
    p += m->token_len[i];
    (*text)[o++] = '\0';
    (*types)[i] = m->token_type.data[i];
  }
  s->n_tokens = (int32_t)n;
  s->tokens = *toks;
  s->token_types = *types;
  s->token_attrs = m->token_attr.len ? m->token_attr.data : NULL;
  s->scores = m->n_score ? m->score : NULL;
  return IR_OK;
}

static ir_status build_from(const Infc__Tok__Tokenizer *m, irt_tokenizer **out, ir_diag *d) {
  tok_spec s = {
      .model = (tok_model)m->model,
      .pre = (tok_pre)m->pre,
      .prefix = (tok_prefix)m->prefix,
      .n_merges = (int32_t)(m->n_merge / 2),
      .merge_ids = m->merge,
      .byte_fallback = m->byte_fallback,
      .fuse_unk = m->fuse_unk,
      .ignore_merges = m->ignore_merges,
      .nfc = m->nfc,
      .add_prefix_space = m->prefix != TOK_PREFIX_NONE,
      .add_bos = m->add_bos,
      .add_eos = m->add_eos,
      .bos_id = m->bos_id,
      .eos_id = m->eos_id,
      .pad_id = m->pad_id,
      .unk_id = m->unk_id,
      .eos_ids = m->eos_ids,
      .n_eos_ids = (int32_t)m->n_eos_ids,
      .chat_template = m->chat_template && m->chat_template[0] ? m->chat_template : NULL,
  };
  char *text = NULL;
  const char **toks = NULL;
  int32_t *types = NULL;
  ir_status st = spec_tokens(m, &s, &text, &toks, &types, d);
  if (st == IR_OK) {
    ir_diag inner = {0};
    st = tok_create(&s, out, &inner);
    if (st == IR_INVALID_ARG) st = IR_BAD_FORMAT;
    if (st != IR_OK) ir_diag_set(d, st, "tokenizer message: %s", inner.msg);
  }
  ir_free(text);
  ir_free(toks);
  ir_free(types);
  return st;
}

ir_status tok_deserialize(const uint8_t *buf, size_t len, irt_tokenizer **out, ir_diag *d) {
  if (!out) return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: NULL output");
  *out = NULL;
  if (!buf || len == 0) return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: empty");
  unsigned long fails = ir_alloc_failures();
  Infc__Tok__Tokenizer *m = infc__tok__tokenizer__unpack(&ir_pb_alloc, len, buf);
  if (!m && ir_alloc_failed_since(fails)) return ir_diag_set(d, IR_OOM, "out of memory");
  if (!m) return ir_diag_set(d, IR_BAD_FORMAT, "tokenizer message: not a valid encoding");
  ir_status st = check_message(m, d);
  if (st == IR_OK) st = build_from(m, out, d);
  infc__tok__tokenizer__free_unpacked(m, &ir_pb_alloc);
  return st;
}
