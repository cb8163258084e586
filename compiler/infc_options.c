/* infc_options: parsing and recording build options. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "infc_nvrtc.h"
#include "infc_options.h"
#include "ir_file.h"
#include "pass.h"
#include "ir_alloc.h"

infc_options infc_options_default(void) {
  infc_options o = {
      .model = model_build_opts_default(), .fold = true, .fuse = true, .repack = true};
  snprintf(o.target, sizeof o.target, "cpu");
  return o;
}

/* "1,2,4,8": ascending positive integers, at most IR_MAX_DECODE_BUCKETS of them. */
static ir_status set_decode_buckets(infc_options *o, const char *v, ir_diag *d) {
  int32_t n = 0;
  for (const char *p = v; *p;) {
    char *end = NULL;
    long long x = strtoll(p, &end, 10);
    if (end == p || (*end && *end != ',') || x < 1 || x > (1 << 20))
      return ir_diag_set(d, IR_INVALID_ARG,
                         "option 'decode_buckets': '%s' is not a list of batch sizes like 1,2,4,8",
                         v);
    if (n == IR_MAX_DECODE_BUCKETS)
      return ir_diag_set(d, IR_INVALID_ARG, "option 'decode_buckets': more than %d buckets",
                         IR_MAX_DECODE_BUCKETS);
    if (n > 0 && x <= o->decode_buckets[n - 1])
      return ir_diag_set(d, IR_INVALID_ARG,
                         "option 'decode_buckets': sizes must be ascending (%lld after %lld)", x,
                         (long long)o->decode_buckets[n - 1]);
    o->decode_buckets[n++] = x;
    p = *end ? end + 1 : end;
  }
  if (n == 0) return ir_diag_set(d, IR_INVALID_ARG, "option 'decode_buckets': empty list");
  o->n_decode_buckets = n;
  return IR_OK;
}

/* shapes.NAME = "1..64x3x224x224": dims separated by 'x', each N or LO..HI. */
static ir_status set_shape(infc_options *o, const char *name, const char *v, ir_diag *d) {
  infc_shape sh = {0};
  if (!*name || strlen(name) >= sizeof sh.input)
    return ir_diag_set(d, IR_INVALID_ARG, "option 'shape': bad input name '%s'", name);
  snprintf(sh.input, sizeof sh.input, "%s", name);
  for (const char *p = v; *p;) {
    char *end = NULL;
    long long lo = strtoll(p, &end, 10), hi = lo;
    if (end != p && end[0] == '.' && end[1] == '.') {
      const char *q = end + 2;
      hi = strtoll(q, &end, 10);
      if (end == q) end = (char *)p;
    }
    if (end == p || (*end && *end != 'x') || lo < 1 || hi < lo || hi > ((long long)1 << 31) ||
        sh.rank == IR_MAX_RANK)
      return ir_diag_set(d, IR_INVALID_ARG,
                         "option 'shape': '%s=%s' is not dims like 1..64x3x224x224 (each a "
                         "number >= 1 or a range lo..hi, at most %d)",
                         name, v, IR_MAX_RANK);
    sh.min[sh.rank] = lo;
    sh.max[sh.rank++] = hi;
    p = *end ? end + 1 : end;
    if (!*p && *end) return ir_diag_set(d, IR_INVALID_ARG, "option 'shape': '%s' ends in 'x'", v);
  }
  if (!sh.rank) return ir_diag_set(d, IR_INVALID_ARG, "option 'shape': '%s' is empty", name);
  int i = 0;
  while (i < o->n_shapes && strcmp(o->shapes[i].input, name)) i++;
  if (i == INFC_MAX_SHAPES)
    return ir_diag_set(d, IR_INVALID_ARG, "option 'shape': more than %d inputs", INFC_MAX_SHAPES);
  o->shapes[i] = sh;
  if (i == o->n_shapes) o->n_shapes++;
  return IR_OK;
}

static ir_status parse_int(const char *key, const char *v, int64_t lo, int64_t hi, int64_t *out,
                           ir_diag *d) {
  char *end = NULL;
  long long x = strtoll(v, &end, 10);
  if (!*v || *end || x < lo || x > hi)
    return ir_diag_set(d, IR_INVALID_ARG, "option '%s': '%s' is not an integer in [%lld, %lld]",
                       key, v, (long long)lo, (long long)hi);
  *out = x;
  return IR_OK;
}

static ir_status parse_bool(const char *key, const char *v, bool *out, ir_diag *d) {
  if (!strcmp(v, "true") || !strcmp(v, "on") || !strcmp(v, "1")) *out = true;
  else if (!strcmp(v, "false") || !strcmp(v, "off") || !strcmp(v, "0")) *out = false;
  else return ir_diag_set(d, IR_INVALID_ARG, "option '%s': '%s' is not true or false", key, v);
  return IR_OK;
}

static ir_status set_dtype(infc_options *o, const char *v, ir_diag *d) {
  if (!strcmp(v, "auto")) {
    o->model.weight_dtype = IR_DTYPE_INVALID;
    return IR_OK;
  }
  ir_dtype t = ir_dtype_from_name(v);
  if (t != IR_F32 && t != IR_F16 && t != IR_BF16)
    return ir_diag_set(d, IR_INVALID_ARG, "option 'dtype': '%s' is not one of auto, f32, f16, bf16",
                       v);
  o->model.weight_dtype = t;
  return IR_OK;
}

/* passes.fuse_qkv: false (one fusion on or off; `fuse` still switches them all). */
static ir_status set_fusion(infc_options *o, const char *key, const char *v, ir_diag *d) {
  bool on = true;
  ir_status st = parse_bool(key, v, &on, d);
  unsigned bit = pass_fusion_from_name(key + 7);
  o->no_fuse = on ? o->no_fuse & ~bit : o->no_fuse | bit;
  return st;
}

/* --no-fuse=qkv,gate_up: the fusions to skip, by name. */
static ir_status set_no_fuse(infc_options *o, const char *v, ir_diag *d) {
  unsigned bits = 0;
  for (const char *p = v; *p;) {
    size_t n = strcspn(p, ",");
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), p);
    unsigned bit = pass_fusion_from_name(name);
    if (!bit)
      return ir_diag_set(d, IR_INVALID_ARG,
                         "option 'no_fuse': '%s' is not one of "
                         "rope_attention, qkv, gate_up, add_rms_norm",
                         name);
    bits |= bit;
    p += n + (p[n] == ',');
  }
  o->no_fuse |= bits;
  return IR_OK;
}

ir_status infc_options_set(infc_options *o, const char *key, const char *v, ir_diag *d) {
  model_build_opts *m = &o->model;
  if (!strcmp(key, "dtype")) return set_dtype(o, v, d);
  if (!strcmp(key, "max_tokens")) {
    o->max_tokens_set = true;
    return parse_int(key, v, 1, 1 << 20, &m->max_tokens, d);
  }
  if (!strcmp(key, "max_seqs")) return parse_int(key, v, 1, 1 << 16, &m->max_seqs, d);
  if (!strcmp(key, "max_logits")) return parse_int(key, v, 1, 1 << 16, &m->max_logits, d);
  if (!strcmp(key, "kv_block_size")) return parse_int(key, v, 1, 4096, &m->kv_block_size, d);
  if (!strcmp(key, "max_context")) return parse_int(key, v, 0, 1 << 24, &m->max_context, d);
  if (!strcmp(key, "layers")) return parse_int(key, v, 0, 1 << 16, &m->layers, d);
  if (!strcmp(key, "tp")) {
    int64_t tp = 1;
    ir_status st = parse_int(key, v, 1, IR_MAX_TP, &tp, d);
    if (st == IR_OK) m->tp_size = (int)tp;
    return st;
  }
  if (!strcmp(key, "passes.fold") || !strcmp(key, "fold")) return parse_bool(key, v, &o->fold, d);
  if (!strcmp(key, "passes.repack") || !strcmp(key, "repack"))
    return parse_bool(key, v, &o->repack, d);
  if (!strcmp(key, "passes.fuse") || !strcmp(key, "fuse")) return parse_bool(key, v, &o->fuse, d);
  if (!strncmp(key, "passes.fuse_", 12) && pass_fusion_from_name(key + 7))
    return set_fusion(o, key, v, d);
  if (!strcmp(key, "no_fuse")) return set_no_fuse(o, v, d);
  if (!strcmp(key, "quant")) return pass_quant_parse(v, &o->quant, d);
  if (!strcmp(key, "quant_calib")) {
    if (strlen(v) >= sizeof o->quant_calib)
      return ir_diag_set(d, IR_INVALID_ARG, "option 'quant_calib': path too long");
    snprintf(o->quant_calib, sizeof o->quant_calib, "%s", v);
    return IR_OK;
  }
  if (!strcmp(key, "act_dtype")) {
    static const char *const names[] = {"auto", "f32", "int8", "bf16"};
    for (int i = 0; i < 4; i++)
      if (!strcmp(v, names[i])) {
        o->act_dtype = (infc_act_dtype)i;
        return IR_OK;
      }
    return ir_diag_set(d, IR_INVALID_ARG,
                       "option 'act_dtype': '%s' is not one of auto, f32, int8, bf16", v);
  }
  if (!strcmp(key, "attn_dtype")) {
    static const char *const names[] = {"auto", "f32", "bf16"};
    for (int i = 0; i < 3; i++)
      if (!strcmp(v, names[i])) {
        o->attn_dtype = (infc_attn_dtype)i;
        return IR_OK;
      }
    return ir_diag_set(d, IR_INVALID_ARG, "option 'attn_dtype': '%s' is not one of auto, f32, bf16",
                       v);
  }
  if (!strcmp(key, "tokenizer")) {
    if (strlen(v) >= sizeof o->tokenizer)
      return ir_diag_set(d, IR_INVALID_ARG, "option 'tokenizer': path too long");
    snprintf(o->tokenizer, sizeof o->tokenizer, "%s", v);
    return IR_OK;
  }
  if (!strcmp(key, "arch")) {
    int archs[INFC_NVRTC_MAX_ARCHS], n;
    ir_status st = infc_nvrtc_parse_archs(v, archs, INFC_NVRTC_MAX_ARCHS, &n, d);
    if (st != IR_OK) return st;
    if (strlen(v) >= sizeof o->arch)
      return ir_diag_set(d, IR_INVALID_ARG, "option 'arch': '%s' is too long", v);
    snprintf(o->arch, sizeof o->arch, "%s", v);
    return IR_OK;
  }
  if (!strcmp(key, "decode_buckets")) return set_decode_buckets(o, v, d);
  if (!strncmp(key, "shapes.", 7)) return set_shape(o, key + 7, v, d);
  if (!strcmp(key, "shape")) { /* NAME=DIMS, as --shape gives it */
    const char *eq = strchr(v, '=');
    char name[128];
    if (!eq || eq == v || (size_t)(eq - v) >= sizeof name)
      return ir_diag_set(d, IR_INVALID_ARG, "option 'shape': '%s' is not NAME=DIMS", v);
    snprintf(name, sizeof name, "%.*s", (int)(eq - v), v);
    return set_shape(o, name, eq + 1, d);
  }
  if (!strcmp(key, "target")) {
    if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0)
      return ir_diag_set(d, IR_UNSUPPORTED, "option 'target': '%s' is not one of cpu, cuda", v);
    snprintf(o->target, sizeof o->target, "%s", v);
    return IR_OK;
  }
  return ir_diag_set(d, IR_INVALID_ARG, "unknown option '%s'", key);
}

/* Applies every scalar pair of a mapping node; nested mappings prefix their keys. */
static ir_status apply_mapping(infc_options *o, yaml_document_t *doc, yaml_node_t *map,
                               const char *prefix, ir_diag *d) {
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
    yaml_node_t *k = yaml_document_get_node(doc, p->key);
    yaml_node_t *v = yaml_document_get_node(doc, p->value);
    if (!k || !v || k->type != YAML_SCALAR_NODE)
      return ir_diag_set(d, IR_BAD_FORMAT, "line %zu: expected a key", map->start_mark.line + 1);
    char key[128];
    snprintf(key, sizeof key, "%s%s", prefix, (const char *)k->data.scalar.value);
    ir_status st;
    if (v->type == YAML_MAPPING_NODE && !*prefix) {
      char sub[130];
      snprintf(sub, sizeof sub, "%s.", key);
      st = apply_mapping(o, doc, v, sub, d);
      if (st != IR_OK) return st; /* its own key's line is named already */
    } else if (v->type != YAML_SCALAR_NODE) {
      st = ir_diag_set(d, IR_BAD_FORMAT, "option '%s' must be a scalar", key);
    } else {
      st = infc_options_set(o, key, (const char *)v->data.scalar.value, d);
    }
    if (st != IR_OK) {
      ir_diag_prefix(d, "line %zu", k->start_mark.line + 1);
      return st;
    }
  }
  return IR_OK;
}

enum { YAML_MAX_BYTES = 1 << 20, YAML_MAX_DEPTH = 16 };

/* Refuses a document nested deeper than YAML_MAX_DEPTH before it is loaded: an options file
 * is a mapping of scalars one level deep, and libyaml's scanner is quadratic in the depth of
 * flow collections (200k '[' take it minutes). Events are pulled lazily, so the refusal
 * comes after YAML_MAX_DEPTH openers are scanned. */
static ir_status yaml_check_depth(const char *buf, size_t len, ir_diag *d) {
  yaml_parser_t parser;
  yaml_event_t ev;
  ir_status st = IR_OK;
  int depth = 0;
  yaml_parser_initialize(&parser);
  yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
  for (bool done = false; !done && st == IR_OK;) {
    if (!yaml_parser_parse(&parser, &ev)) {
      st = ir_diag_set(d, IR_BAD_FORMAT, "line %zu: %s", parser.problem_mark.line + 1,
                       parser.problem ? parser.problem : "YAML syntax error");
      break;
    }
    if (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT) {
      if (++depth > YAML_MAX_DEPTH)
        st = ir_diag_set(d, IR_BAD_FORMAT, "line %zu: nested deeper than %d levels",
                         ev.start_mark.line + 1, YAML_MAX_DEPTH);
    } else if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
      depth--;
    }
    done = ev.type == YAML_STREAM_END_EVENT;
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&parser);
  return st;
}

ir_status infc_options_load_yaml(infc_options *o, const char *path, ir_diag *d) {
  char *buf = NULL;
  size_t len = 0;
  ir_status st = ir_file_read(path, YAML_MAX_BYTES, &buf, &len, d);
  if (st == IR_OK) st = yaml_check_depth(buf, len, d);
  if (st != IR_OK) {
    ir_free(buf);
    ir_diag_prefix(d, "%s", path);
    return st;
  }
  yaml_parser_t parser;
  yaml_document_t doc;
  yaml_parser_initialize(&parser);
  yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
  if (!yaml_parser_load(&parser, &doc)) {
    st = ir_diag_set(d, IR_BAD_FORMAT, "line %zu: %s", parser.problem_mark.line + 1,
                     parser.problem ? parser.problem : "YAML syntax error");
  } else {
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root && root->type == YAML_MAPPING_NODE) st = apply_mapping(o, &doc, root, "", d);
    else if (root) st = ir_diag_set(d, IR_BAD_FORMAT, "top level must be a mapping of options");
    yaml_document_delete(&doc);
  }
  yaml_parser_delete(&parser);
  ir_free(buf);
  if (st != IR_OK) ir_diag_prefix(d, "%s", path);
  return st;
}

bool infc_options_act_bf16(const infc_options *o) { return o->act_dtype == INFC_ACT_BF16; }

bool infc_options_attn_bf16(const infc_options *o) {
  return o->attn_dtype == INFC_ATTN_BF16 ||
         (o->attn_dtype == INFC_ATTN_AUTO && o->act_dtype == INFC_ACT_BF16);
}

bool infc_options_act_int8(const infc_options *o) {
  return o->act_dtype == INFC_ACT_INT8 || o->act_dtype == INFC_ACT_BF16 ||
         (o->act_dtype == INFC_ACT_AUTO && strcmp(o->target, "cuda") != 0);
}

int infc_options_describe(const infc_options *o, const char **keys, const char **values, int cap,
                          char *buf, size_t len) {
  const model_build_opts *m = &o->model;
  char tmp[9][64];
  const char *k[9] = {"dtype",       "max_tokens", "max_seqs", "max_logits", "kv_block_size",
                      "max_context", "passes",     "target",   "arch"};
  snprintf(tmp[0], 32, "%s", m->weight_dtype ? ir_dtype_name(m->weight_dtype) : "auto");
  snprintf(tmp[1], 32, "%lld", (long long)m->max_tokens);
  snprintf(tmp[2], 32, "%lld", (long long)m->max_seqs);
  snprintf(tmp[3], 32, "%lld", (long long)m->max_logits);
  snprintf(tmp[4], 32, "%lld", (long long)m->kv_block_size);
  snprintf(tmp[5], 32, "%lld", (long long)m->max_context);
  snprintf(tmp[6], 64, "fold=%d fuse=%d", o->fold, o->fuse);
  if (!o->repack) { /* only if unset: default plans record what they did before */
    size_t l = strlen(tmp[6]);
    snprintf(tmp[6] + l, 64 - l, " repack=0");
  }
  static const char *const fusions[] = {"rope_attention", "qkv", "gate_up", "add_rms_norm"};
  for (int i = 0, first = 1; o->fuse && i < 4; i++) /* only if set: default plans keep bytes */
    if (o->no_fuse & pass_fusion_from_name(fusions[i])) {
      size_t l = strlen(tmp[6]);
      snprintf(tmp[6] + l, 64 - l, "%s%s", first ? " no_fuse=" : ",", fusions[i]);
      first = 0;
    }
  snprintf(tmp[7], 32, "%s", o->target);
  /* arch only for CUDA plans, so CPU plans keep their bytes */
  snprintf(tmp[8], 64, "%s", o->arch[0] ? o->arch : INFC_NVRTC_DEFAULT_ARCHS);
  int n_keys = strcmp(o->target, "cuda") ? 8 : 9;
  int n = 0;
  size_t off = 0;
  for (int i = 0; i < n_keys && n < cap; i++) {
    size_t l = strlen(tmp[i]) + 1;
    if (off + l > len) break;
    memcpy(buf + off, tmp[i], l);
    keys[n] = k[i];
    values[n++] = buf + off;
    off += l;
  }
  const char *act = o->act_dtype == INFC_ACT_BF16 ? "bf16"
                    : infc_options_act_int8(o)    ? "int8"
                                                  : "f32";
  if (n < cap && off + strlen(act) + 1 <= len) {
    memcpy(buf + off, act, strlen(act) + 1);
    keys[n] = "act_dtype";
    values[n++] = buf + off;
    off += strlen(act) + 1;
  }
  const char *attn = o->attn_dtype == INFC_ATTN_BF16 ? "bf16" : "f32";
  if (o->attn_dtype != INFC_ATTN_AUTO && n < cap && off + strlen(attn) + 1 <= len) {
    memcpy(buf + off, attn, strlen(attn) + 1); /* only when set: plans keep their bytes */
    keys[n] = "attn_dtype";
    values[n++] = buf + off;
    off += strlen(attn) + 1;
  }
  char qs[64]; /* only when set: plans built without --quant keep their bytes */
  pass_quant_format(&o->quant, qs, sizeof qs);
  if (o->quant.scheme != PASS_QUANT_NONE && n < cap && off + strlen(qs) + 1 <= len) {
    memcpy(buf + off, qs, strlen(qs) + 1);
    keys[n] = "quant";
    values[n++] = buf + off;
    off += strlen(qs) + 1;
  }
  char tps[16]; /* only when set: one-rank plans keep their bytes */
  snprintf(tps, sizeof tps, "%d", o->model.tp_size);
  if (o->model.tp_size > 1 && n < cap && off + strlen(tps) + 1 <= len) {
    memcpy(buf + off, tps, strlen(tps) + 1);
    keys[n] = "tp";
    values[n++] = buf + off;
    off += strlen(tps) + 1;
  }
  char ls[24]; /* only when set: plans of every layer keep their bytes */
  snprintf(ls, sizeof ls, "%lld", (long long)o->model.layers);
  if (o->model.layers > 0 && n < cap && off + strlen(ls) + 1 <= len) {
    memcpy(buf + off, ls, strlen(ls) + 1);
    keys[n] = "layers";
    values[n++] = buf + off;
  }
  return n;
}
