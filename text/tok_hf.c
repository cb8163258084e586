/* tok_hf: loading a Hugging Face tokenizer.json (+ tokenizer_config.json) into a spec.
 * Only the shapes the runtime implements exactly are accepted (BPE; ByteLevel with the
 * GPT-2 / Llama 3 / Qwen2 / SmolLM splits; SentencePiece-style with U+2581); anything else
 * is IR_UNSUPPORTED with a message that names it. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir_file.h"
#include "tok_internal.h"
#include "ir_alloc.h"

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3_HEAD "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL
#define RE_QWEN2 RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL
#define SPM_SPACE "\xE2\x96\x81"

/* Everything gathered from the JSON; pointers borrow from the parsed documents. */
typedef struct hf_load {
  const char *path;
  tok_spec spec;
  const char **tokens; /* (n) */
  int32_t *types;      /* (n) */
  uint8_t *attrs;      /* (n) */
  char **merges;       /* (n_merges) "left right", owned */
  int32_t n_merges;
  bool byte_level, spm, spm_replace, digits;
  const char *unk_token;
  int32_t eog[16];
} hf_load;

static ir_status unsupported(ir_diag *d, const char *what, const char *name) {
  return ir_diag_set(d, IR_UNSUPPORTED, "%s '%.200s' is not supported", what, name);
}

static const char *jstr(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jbool(const cJSON *o, const char *key, bool dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static const char *jtype(const cJSON *o) {
  const char *t = jstr(o, "type");
  return t ? t : "(no type)";
}

/* The whole file at path, NUL-terminated, into *out (malloc'd) and its length. A
 * tokenizer.json is a few MB (Llama 3's 9 MB, Gemma's 33 MB); past 256 MB it is refused. */
static ir_status read_text(const char *path, char **out, size_t *out_len, ir_diag *d) {
  ir_status st = ir_file_read(path, (size_t)256 << 20, out, out_len, d);
  if (st != IR_OK) ir_diag_prefix(d, "%s", path);
  return st;
}

/* chat_template.jinja beside tokenizer_json (where transformers >= 4.51 saves the template
 * when tokenizer_config.json holds none), or NULL. */
static char *template_beside(const char *tokenizer_json) {
  const char *slash = strrchr(tokenizer_json, '/');
  int dir = slash ? (int)(slash - tokenizer_json + 1) : 0;
  char path[4200], *text = NULL;
  size_t len;
  ir_diag quiet = {0};
  if (snprintf(path, sizeof path, "%.*schat_template.jinja", dir, tokenizer_json) >=
          (int)sizeof path ||
      read_text(path, &text, &len, &quiet) != IR_OK)
    return NULL;
  return text;
}

static ir_status read_json(const char *path, cJSON **out, ir_diag *d) {
  char *buf = NULL;
  size_t len = 0;
  ir_status st = read_text(path, &buf, &len, d);
  if (st != IR_OK) return st;
  unsigned long fails = ir_alloc_failures();
  *out = cJSON_ParseWithLength(buf, len);
  ir_free(buf);
  if (!*out && ir_alloc_failed_since(fails)) return ir_diag_set(d, IR_OOM, "out of memory");
  if (!*out) return ir_diag_set(d, IR_BAD_FORMAT, "%s: not valid JSON", path);
  return IR_OK;
}

/* ---- model ----------------------------------------------------------------------------- */

static ir_status check_model(hf_load *h, const cJSON *model, ir_diag *d) {
  if (!cJSON_IsObject(model)) return ir_diag_set(d, IR_BAD_FORMAT, "no \"model\" object");
  const char *type = jstr(model, "type");
  if (type && strcmp(type, "BPE") != 0)
    return ir_diag_set(d, IR_UNSUPPORTED, "model type '%.100s' is not supported (only BPE)", type);
  if (!type && !cJSON_GetObjectItemCaseSensitive(model, "merges"))
    return ir_diag_set(d, IR_UNSUPPORTED, "model without a type is not supported (only BPE)");
  const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
  if (cJSON_IsNumber(drop) && drop->valuedouble != 0.0)
    return unsupported(d, "BPE option", "dropout");
  const char *affix[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const char *v = jstr(model, affix[i]);
    if (v && v[0]) return unsupported(d, "BPE option", affix[i]);
  }
  h->spec.byte_fallback = jbool(model, "byte_fallback", false);
  h->spec.fuse_unk = jbool(model, "fuse_unk", false);
  h->spec.ignore_merges = jbool(model, "ignore_merges", false);
  h->unk_token = jstr(model, "unk_token");
  if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(model, "vocab")))
    return ir_diag_set(d, IR_BAD_FORMAT, "model has no \"vocab\" object");
  return IR_OK;
}

static bool valid_id(const cJSON *v) {
  return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < (1 << 24) &&
         v->valuedouble == (double)(int32_t)v->valuedouble;
}

/* The vocabulary size: one past the largest id of the vocab and the added tokens. */
static ir_status count_tokens(const cJSON *vocab, const cJSON *added, int32_t *n, ir_diag *d) {
  const cJSON *e;
  int64_t listed = 0;
  *n = 0;
  cJSON_ArrayForEach(e, vocab) {
    if (!valid_id(e)) return ir_diag_set(d, IR_BAD_FORMAT, "vocab: bad id for '%.100s'", e->string);
    if (e->valueint + 1 > *n) *n = e->valueint + 1;
    listed++;
  }
  cJSON_ArrayForEach(e, added) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
    if (!valid_id(id) || !jstr(e, "content"))
      return ir_diag_set(d, IR_BAD_FORMAT, "added_tokens: an entry without id or content");
    if (id->valueint + 1 > *n) *n = id->valueint + 1;
    listed++;
  }
  if (*n == 0) return ir_diag_set(d, IR_BAD_FORMAT, "empty vocabulary");
  /* the tables are sized by the largest id: ids mostly holes would cost memory the file does
   * not hold (one id of 2^24-1 in a 300-byte file: half a GB) */
  if (*n > 2 * listed + 1024)
    return ir_diag_set(d, IR_BAD_FORMAT,
                       "ids reach %d but only %lld tokens are listed (more "
                       "than half of the ids would be unused)",
                       *n - 1, (long long)listed);
  return IR_OK;
}

static bool is_byte_piece(const char *s) {
  return strlen(s) == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' &&
         strchr("0123456789ABCDEF", s[3]) && strchr("0123456789ABCDEF", s[4]);
}

static ir_status load_vocab(hf_load *h, const cJSON *vocab, const cJSON *added, ir_diag *d) {
  int32_t n;
  ir_status st = count_tokens(vocab, added, &n, d);
  if (st != IR_OK) return st;
  h->tokens = ir_calloc((size_t)n, sizeof *h->tokens);
  h->types = ir_calloc((size_t)n, sizeof *h->types); /* 0: not an added token */
  h->attrs = ir_calloc((size_t)n, 1);
  if (!h->tokens || !h->types || !h->attrs) return ir_diag_set(d, IR_OOM, "out of memory");
  const cJSON *e;
  cJSON_ArrayForEach(e, vocab) if (!h->tokens[e->valueint]) h->tokens[e->valueint] = e->string;
  cJSON_ArrayForEach(e, added) {
    int32_t id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
    const char *content = jstr(e, "content");
    bool special = jbool(e, "special", false);
    h->tokens[id] = content;
    h->types[id] = special ? TOK_CONTROL : TOK_USER_DEFINED;
    if (special && h->unk_token && strcmp(content, h->unk_token) == 0) h->types[id] = TOK_UNKNOWN;
    h->attrs[id] = (uint8_t)((jbool(e, "lstrip", false) ? TOK_ATTR_LSTRIP : 0) |
                             (jbool(e, "rstrip", false) ? TOK_ATTR_RSTRIP : 0) |
                             (jbool(e, "single_word", false) ? TOK_ATTR_SINGLE_WORD : 0) |
                             (jbool(e, "normalized", !special) ? TOK_ATTR_NORMALIZED : 0));
  }
  for (int32_t i = 0; i < n; i++) {
    if (h->types[i]) continue;
    h->types[i] = h->tokens[i] ? TOK_NORMAL : TOK_UNUSED;
    if (!h->tokens[i]) h->tokens[i] = "";
  }
  h->spec.n_tokens = n;
  h->spec.tokens = h->tokens;
  h->spec.token_types = h->types;
  h->spec.token_attrs = h->attrs;
  return IR_OK;
}

static ir_status load_merges(hf_load *h, const cJSON *merges, ir_diag *d) {
  int n = cJSON_GetArraySize(merges);
  h->merges = ir_calloc((size_t)n + 1, sizeof *h->merges);
  if (!h->merges) return ir_diag_set(d, IR_OOM, "out of memory");
  const cJSON *e;
  cJSON_ArrayForEach(e, merges) {
    const cJSON *a = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
    char *m;
    if (cJSON_IsString(e)) {
      m = ir_strdup(e->valuestring);
    } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(a) &&
               cJSON_IsString(b)) {
      size_t la = strlen(a->valuestring), lb = strlen(b->valuestring);
      if ((m = ir_malloc(la + lb + 2)) != NULL) {
        memcpy(m, a->valuestring, la);
        m[la] = ' ';
        memcpy(m + la + 1, b->valuestring, lb + 1);
      }
    } else {
      return ir_diag_set(d, IR_BAD_FORMAT, "merges: entry %d is not \"a b\" or [a, b]",
                         (int)h->n_merges);
    }
    if (!m) return ir_diag_set(d, IR_OOM, "out of memory");
    h->merges[h->n_merges++] = m;
  }
  h->spec.n_merges = h->n_merges;
  h->spec.merges = (const char *const *)h->merges;
  return IR_OK;
}

/* ---- normalizer and pre-tokenizer ------------------------------------------------------ */

static ir_status one_normalizer(hf_load *h, const cJSON *n, ir_diag *d) {
  const char *type = jtype(n);
  if (strcmp(type, "NFC") == 0) {
    h->spec.nfc = true;
    return IR_OK;
  }
  if (strcmp(type, "Prepend") == 0) {
    const char *p = jstr(n, "prepend");
    if (!p || strcmp(p, SPM_SPACE) != 0) return unsupported(d, "Prepend normalizer of", p ? p : "");
    h->spec.prefix = TOK_PREFIX_NORMALIZER;
    h->spm = true;
    return IR_OK;
  }
  if (strcmp(type, "Replace") == 0) {
    const char *from = jstr(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String");
    const char *to = jstr(n, "content");
    if (!from || !to || strcmp(from, " ") != 0 || strcmp(to, SPM_SPACE) != 0)
      return unsupported(d, "normalizer", "Replace (other than ' ' -> U+2581)");
    h->spm = h->spm_replace = true;
    return IR_OK;
  }
  return unsupported(d, "normalizer", type);
}

static ir_status load_normalizer(hf_load *h, const cJSON *n, ir_diag *d) {
  if (!n || cJSON_IsNull(n)) return IR_OK;
  ir_status st = IR_OK;
  if (strcmp(jtype(n), "Sequence") == 0) {
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(n, "normalizers")) {
      if ((st = one_normalizer(h, e, d)) != IR_OK) return st;
    }
  } else {
    st = one_normalizer(h, n, d);
  }
  if (st == IR_OK && h->spec.prefix == TOK_PREFIX_NORMALIZER && !h->spm_replace)
    return unsupported(d, "normalizer", "Prepend without Replace(' ', U+2581)");
  return st;
}

static ir_status split_regex(hf_load *h, const cJSON *p, ir_diag *d) {
  const char *re = jstr(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "Regex");
  const char *behavior = jstr(p, "behavior");
  if (!re) return unsupported(d, "Split pre-tokenizer with", "a non-regex pattern");
  if (jbool(p, "invert", false) || !behavior || strcmp(behavior, "Isolated") != 0)
    return unsupported(d, "Split pre-tokenizer behavior", behavior ? behavior : "(none)");
  if (strcmp(re, RE_GPT2) == 0) h->spec.pre = TOK_PRE_GPT2;
  else if (strcmp(re, RE_LLAMA3) == 0) h->spec.pre = TOK_PRE_LLAMA3;
  else if (strcmp(re, RE_QWEN2) == 0) h->spec.pre = TOK_PRE_QWEN2;
  else return unsupported(d, "pre-tokenizer regex", re);
  return IR_OK;
}

static ir_status metaspace(hf_load *h, const cJSON *p, ir_diag *d) {
  const char *rep = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");
  if (rep && strcmp(rep, SPM_SPACE) != 0) return unsupported(d, "Metaspace replacement", rep);
  h->spm = true;
  if (!scheme) scheme = jbool(p, "add_prefix_space", true) ? "always" : "never";
  if (strcmp(scheme, "always") == 0) h->spec.prefix = TOK_PREFIX_ALWAYS;
  else if (strcmp(scheme, "first") == 0) h->spec.prefix = TOK_PREFIX_FIRST;
  else if (strcmp(scheme, "never") == 0) h->spec.prefix = TOK_PREFIX_NONE;
  else return unsupported(d, "Metaspace prepend_scheme", scheme);
  h->spec.pre = jbool(p, "split", true) ? TOK_PRE_METASPACE : TOK_PRE_NONE;
  return IR_OK;
}

/* Split on the string " " once the normalizer has made every space U+2581 (Gemma's
 * Split(" ", MergedWithPrevious)) finds nothing to split, whatever the behavior: a no-op.
 * Inverted, the whole text would be the delimiter, so that is left to be refused. */
static bool noop_space_split(const hf_load *h, const cJSON *p) {
  const char *s = jstr(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "String");
  return h->spm_replace && s && strcmp(s, " ") == 0 && !jbool(p, "invert", false);
}

/* One step of the pre-tokenizer; `last` tells whether it ends the sequence. */
static ir_status one_pre(hf_load *h, const cJSON *p, bool first, bool last, ir_diag *d) {
  const char *type = jtype(p);
  if (strcmp(type, "Split") == 0 && noop_space_split(h, p)) return IR_OK;
  if (strcmp(type, "Digits") == 0 && first && !last && jbool(p, "individual_digits", false)) {
    h->digits = true;
    return IR_OK;
  }
  if (strcmp(type, "Split") == 0 && !last && h->spec.pre == TOK_PRE_NONE)
    return split_regex(h, p, d);
  if (strcmp(type, "Metaspace") == 0 && first && last) return metaspace(h, p, d);
  if (strcmp(type, "ByteLevel") != 0 || !last) return unsupported(d, "pre-tokenizer", type);
  h->byte_level = true;
  bool regex = jbool(p, "use_regex", true), prefix = jbool(p, "add_prefix_space", false);
  if (regex && h->spec.pre != TOK_PRE_NONE)
    return unsupported(d, "pre-tokenizer", "ByteLevel(use_regex=true) after a Split");
  if (regex) h->spec.pre = TOK_PRE_GPT2;
  if (prefix && (!first || !regex))
    return unsupported(d, "pre-tokenizer", "ByteLevel(add_prefix_space=true) in a Sequence");
  h->spec.prefix = prefix ? TOK_PREFIX_ALWAYS : TOK_PREFIX_NONE;
  return IR_OK;
}

static ir_status load_pre(hf_load *h, const cJSON *p, ir_diag *d) {
  if (!p || cJSON_IsNull(p)) return IR_OK;
  ir_status st = IR_OK;
  if (strcmp(jtype(p), "Sequence") == 0) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *e;
    cJSON_ArrayForEach(e, list) {
      st = one_pre(h, e, e == list->child, e->next == NULL, d);
      if (st != IR_OK) return st;
    }
  } else {
    st = one_pre(h, p, true, true, d);
  }
  if (h->digits) {
    if (h->spec.pre != TOK_PRE_GPT2)
      return unsupported(d, "pre-tokenizer", "Digits before a split other than GPT-2's");
    h->spec.pre = TOK_PRE_SMOLLM;
  }
  return st;
}

/* ---- post-processor, config, end-of-generation ---------------------------------------- */

static int32_t find_token(const hf_load *h, const char *s) {
  if (!s) return -1;
  for (int32_t i = h->spec.n_tokens - 1; i >= 0; i--)
    if (strcmp(h->tokens[i], s) == 0) return i;
  return -1;
}

/* TemplateProcessing "single": special tokens before $A are BOS, after it EOS. */
static ir_status template_single(hf_load *h, const cJSON *p, ir_diag *d) {
  const cJSON *e, *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
  bool seen_a = false;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "single")) {
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
    if (!sp) {
      seen_a = true;
      continue;
    }
    const char *name = jstr(sp, "id");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(specials, name ? name : ""), "ids");
    const cJSON *id = cJSON_GetArrayItem(ids, 0);
    if (cJSON_GetArraySize(ids) != 1 || !valid_id(id) || id->valueint >= h->spec.n_tokens)
      return ir_diag_set(d, IR_BAD_FORMAT, "post_processor: special token '%.100s' has no id",
                         name ? name : "");
    if (!seen_a && !h->spec.add_bos) h->spec.add_bos = true, h->spec.bos_id = id->valueint;
    else if (seen_a && !h->spec.add_eos) h->spec.add_eos = true, h->spec.eos_id = id->valueint;
    else return unsupported(d, "post_processor template", "with several special tokens on a side");
  }
  return IR_OK;
}

static ir_status load_post(hf_load *h, const cJSON *p, ir_diag *d) {
  if (!p || cJSON_IsNull(p)) return IR_OK;
  const char *type = jtype(p);
  if (strcmp(type, "ByteLevel") == 0) return IR_OK;
  if (strcmp(type, "TemplateProcessing") == 0) return template_single(h, p, d);
  if (strcmp(type, "Sequence") == 0) {
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "processors")) {
      ir_status st = load_post(h, e, d);
      if (st != IR_OK) return st;
    }
    return IR_OK;
  }
  if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(p, "cls");
    const cJSON *sep = cJSON_GetObjectItemCaseSensitive(p, "sep");
    const cJSON *ci = cJSON_GetArrayItem(cls, 1), *si = cJSON_GetArrayItem(sep, 1);
    if (!valid_id(ci) || !valid_id(si) || ci->valueint >= h->spec.n_tokens ||
        si->valueint >= h->spec.n_tokens)
      return ir_diag_set(d, IR_BAD_FORMAT, "post_processor: bad cls / sep");
    h->spec.add_bos = h->spec.add_eos = true;
    h->spec.bos_id = ci->valueint;
    h->spec.eos_id = si->valueint;
    return IR_OK;
  }
  return unsupported(d, "post_processor", type);
}

/* A token named in tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(const cJSON *cfg, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
  if (cJSON_IsString(v)) return v->valuestring;
  return jstr(v, "content");
}

static const char *chat_template(const cJSON *cfg) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *e;
  if (cJSON_IsString(v)) return v->valuestring;
  cJSON_ArrayForEach(e, v) {
    const char *name = jstr(e, "name");
    if (name && strcmp(name, "default") == 0) return jstr(e, "template");
  }
  return NULL;
}

static void load_config(hf_load *h, const cJSON *cfg) {
  const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
  const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
  int32_t bos = find_token(h, config_token(cfg, "bos_token"));
  int32_t eos = find_token(h, config_token(cfg, "eos_token"));
  int32_t pad = find_token(h, config_token(cfg, "pad_token"));
  if (bos >= 0 && !h->spec.add_bos) h->spec.bos_id = bos;
  if (eos >= 0) h->spec.eos_id = eos;
  if (pad >= 0) h->spec.pad_id = pad;
  if (cJSON_IsBool(ab)) h->spec.add_bos = cJSON_IsTrue(ab);
  if (cJSON_IsBool(ae)) h->spec.add_eos = cJSON_IsTrue(ae);
  h->spec.chat_template = chat_template(cfg);
}

/* End-of-generation tokens as llama.cpp guesses them. */
static void guess_eog(hf_load *h) {
  static const char *const names[] = {"<|eot_id|>",      "<|im_end|>", "<|endoftext|>",
                                      "<|end_of_text|>", "<|end|>",    "<|eom_id|>",
                                      "<end_of_turn>",   "</s>"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int32_t id = find_token(h, names[i]);
    if (id < 0 || h->types[id] != TOK_CONTROL) continue;
    if (h->spec.eos_id < 0) h->spec.eos_id = id;
    if (id != h->spec.eos_id) h->eog[h->spec.n_eos_ids++] = id;
  }
  h->spec.eos_ids = h->eog;
}

static ir_status load_tokenizer(hf_load *h, const cJSON *root, const cJSON *cfg, ir_diag *d) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  ir_status st = check_model(h, model, d);
  if (st == IR_OK) st = load_vocab(h, cJSON_GetObjectItemCaseSensitive(model, "vocab"), added, d);
  if (st == IR_OK) st = load_merges(h, cJSON_GetObjectItemCaseSensitive(model, "merges"), d);
  if (st == IR_OK) st = load_normalizer(h, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), d);
  if (st == IR_OK) st = load_pre(h, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), d);
  if (st != IR_OK) return st;
  if (h->byte_level == h->spm)
    return unsupported(d, "tokenizer",
                       h->spm ? "mixing ByteLevel and U+2581 spaces"
                              : "without ByteLevel or a U+2581 normalizer "
                                "/ Metaspace");
  h->spec.model = h->byte_level ? TOK_BPE_BYTE_LEVEL : TOK_BPE_SPM;
  h->spec.add_prefix_space =
      h->spec.prefix != TOK_PREFIX_NONE && h->spec.prefix != TOK_PREFIX_DEFAULT;
  if (h->spec.prefix == TOK_PREFIX_DEFAULT) h->spec.prefix = TOK_PREFIX_NONE;
  h->spec.unk_id = find_token(h, h->unk_token);
  if (h->spec.model == TOK_BPE_SPM && h->spec.byte_fallback)
    for (int32_t i = 0; i < h->spec.n_tokens; i++)
      if (h->types[i] == TOK_NORMAL && is_byte_piece(h->tokens[i])) h->types[i] = TOK_BYTE;
  st = load_post(h, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), d);
  if (st != IR_OK) return st;
  if (cfg) load_config(h, cfg);
  guess_eog(h);
  return IR_OK;
}

ir_status tok_load_hf(const char *tokenizer_json, const char *tokenizer_config, irt_tokenizer **out,
                      ir_diag *d) {
  if (!out || !tokenizer_json) return ir_diag_set(d, IR_INVALID_ARG, "tokenizer: NULL argument");
  *out = NULL;
  cJSON *root = NULL, *cfg = NULL;
  hf_load h = {.path = tokenizer_json};
  h.spec.bos_id = h.spec.eos_id = h.spec.pad_id = h.spec.unk_id = -1;
  ir_status st = read_json(tokenizer_json, &root, d);
  if (st == IR_OK && tokenizer_config) st = read_json(tokenizer_config, &cfg, d);
  char *jinja = NULL;
  if (st == IR_OK) {
    st = load_tokenizer(&h, root, cfg, d);
    if (st == IR_OK && !h.spec.chat_template)
      h.spec.chat_template = jinja = template_beside(tokenizer_json);
    if (st == IR_OK) st = tok_create(&h.spec, out, d);
    if (st != IR_OK) ir_diag_prefix(d, "%s", tokenizer_json);
  }
  ir_free(jinja);
  for (int32_t i = 0; i < h.n_merges; i++) ir_free(h.merges[i]);
  ir_free(h.merges);
  ir_free(h.tokens);
  ir_free(h.types);
  ir_free(h.attrs);
  cJSON_Delete(root);
  cJSON_Delete(cfg);
  return st;
}
