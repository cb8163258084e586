/* test_gguf: the GGUF reader and the GGUF -> Llama template frontend, on files this test
 * writes under TEST_TMP_DIR: valid v2 and v3 files read back (metadata of every type,
 * nested arrays, tensors, alignment); every truncation, bad magic and versions, unknown
 * types, huge counts and lengths, misaligned, overlapping and out-of-file tensors; and
 * what the frontend refuses through infc_build (unknown architecture, K-quants, ...).
 * Never a crash: also run under ASan + UBSan. (test_gguf_oracle runs converted models.) */
#include "fmt_gguf.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "infc_build.h"
#include "infc_gguf_llama.h"
#include "tcheck.h"

static char g_path[1024];

static const char *tmp_path(const char *name) {
  snprintf(g_path, sizeof g_path, "%s/gguf-%s", TEST_TMP_DIR, name);
  return g_path;
}

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECKF(f != NULL, "cannot create %s", path);
  if (!f) return;
  if (n) CHECK(fwrite(p, 1, n, f) == n);
  fclose(f);
}

/* Writes w to `name` and opens it; returns the status, the message in d. */
static ir_status open_bytes(const char *name, const gw *w, fmt_gguf **out, ir_diag *d) {
  const char *path = tmp_path(name);
  write_file(path, w->b, w->n);
  *d = (ir_diag){0};
  ir_status st = fmt_gguf_open(path, out, d);
  CHECKF(st == IR_OK || strstr(d->msg, path) == d->msg,
         "message does not start with the "
         "path: %s",
         d->msg);
  return st;
}

/* Opening must fail with `st` and a message holding `want`. */
static void expect_fail(const char *name, const gw *w, ir_status st, const char *want) {
  fmt_gguf *g = NULL;
  ir_diag d;
  ir_status got = open_bytes(name, w, &g, &d);
  CHECKF(got == st && g == NULL, "%s: status %d, want %d (%s)", name, got, st, d.msg);
  CHECKF(strstr(d.msg, want) != NULL, "%s: message lacks '%s': %s", name, want, d.msg);
  fmt_gguf_close(g);
}

/* ---- a valid file holding every metadata type ----------------------------------------- */

static float g_f32_data[6] = {1, 2, 3, 4, 5, 6};
static uint16_t g_f16_data[4], g_bf16_data[64];
static uint8_t g_q8_data[2 * 2 * 34], g_q40_data[18], g_q41_data[3 * 20], g_q4k_data[144];

static void fill_data(void) {
  for (int i = 0; i < 4; i++) g_f16_data[i] = ir_f32_to_f16((float)i + 0.5f);
  for (int i = 0; i < 64; i++) g_bf16_data[i] = ir_f32_to_bf16((float)i);
  for (size_t i = 0; i < sizeof g_q8_data; i++) g_q8_data[i] = (uint8_t)(i * 7);
  for (size_t i = 0; i < sizeof g_q40_data; i++) g_q40_data[i] = (uint8_t)(i * 5);
  for (size_t i = 0; i < sizeof g_q41_data; i++) g_q41_data[i] = (uint8_t)(i * 3);
}

static const gw_tensor k_valid_tensors[] = {
    {"t.f32", 0, 2, {3, 2}, g_f32_data, sizeof g_f32_data},
    {"t.f16", 1, 1, {4}, g_f16_data, sizeof g_f16_data},
    {"t.bf16", 30, 3, {32, 1, 2}, g_bf16_data, sizeof g_bf16_data},
    {"t.q8_0", 8, 2, {64, 2}, g_q8_data, sizeof g_q8_data},
    {"t.q4_0", 2, 1, {32}, g_q40_data, sizeof g_q40_data},
    {"t.q4_1", 3, 4, {32, 1, 3, 1}, g_q41_data, sizeof g_q41_data},
    {"t.q4_k", 12, 1, {256}, g_q4k_data, sizeof g_q4k_data},
};
enum { N_VALID_TENSORS = 7, N_VALID_KV = 18 };

static void write_scalar_kvs(gw *w) {
  gw_key(w, "v.u8", FMT_GGUF_U8), gw_le(w, 200, 1);
  gw_key(w, "v.i8", FMT_GGUF_I8), gw_le(w, (uint8_t)-5, 1);
  gw_key(w, "v.u16", FMT_GGUF_U16), gw_le(w, 60000, 2);
  gw_key(w, "v.i16", FMT_GGUF_I16), gw_le(w, (uint16_t)-300, 2);
  kv_u32(w, "v.u32", 4000000000u);
  gw_key(w, "v.i32", FMT_GGUF_I32), gw_u32(w, (uint32_t)-70000);
  kv_f32(w, "v.f32", 0.25f);
  gw_key(w, "v.bool", FMT_GGUF_BOOL), gw_le(w, 1, 1);
  kv_str(w, "v.str", "hello");
  gw_key(w, "v.u64", FMT_GGUF_U64), gw_u64(w, 1ull << 40);
  gw_key(w, "v.i64", FMT_GGUF_I64), gw_u64(w, (uint64_t)-5000000000ll);
  gw_key(w, "v.f64", FMT_GGUF_F64);
  double f = 1.5;
  uint64_t u;
  memcpy(&u, &f, 8);
  gw_u64(w, u);
}

static void write_array_kvs(gw *w) {
  gw_key(w, "a.i32", FMT_GGUF_ARRAY), gw_u32(w, FMT_GGUF_I32), gw_u64(w, 3);
  gw_u32(w, 7), gw_u32(w, (uint32_t)-8), gw_u32(w, 9);
  gw_key(w, "a.f32", FMT_GGUF_ARRAY), gw_u32(w, FMT_GGUF_F32), gw_u64(w, 2);
  gw_f32(w, 0.5f), gw_f32(w, -2.0f);
  gw_key(w, "a.str", FMT_GGUF_ARRAY), gw_u32(w, FMT_GGUF_STRING), gw_u64(w, 3);
  gw_str(w, "a"), gw_str(w, ""), gw_str(w, "ccc");
  gw_key(w, "a.empty", FMT_GGUF_ARRAY), gw_u32(w, FMT_GGUF_U8), gw_u64(w, 0);
  /* [[1, 2], ["x"]]: an array of two arrays of different element types */
  gw_key(w, "a.nested", FMT_GGUF_ARRAY), gw_u32(w, FMT_GGUF_ARRAY), gw_u64(w, 2);
  gw_u32(w, FMT_GGUF_U16), gw_u64(w, 2), gw_le(w, 1, 2), gw_le(w, 2, 2);
  gw_u32(w, FMT_GGUF_STRING), gw_u64(w, 1), gw_str(w, "x");
}

static void build_valid(gw *w, uint32_t version, bool align64) {
  gw_header(w, version, N_VALID_TENSORS, N_VALID_KV - (align64 ? 0 : 1));
  write_scalar_kvs(w);
  write_array_kvs(w);
  if (align64) kv_u32(w, "general.alignment", 64);
  gw_tensors(w, k_valid_tensors, N_VALID_TENSORS, align64 ? 64 : 32);
}

static void check_scalars(const fmt_gguf *g) {
  uint32_t u32 = 0;
  int32_t i32 = 0;
  uint64_t u64 = 0;
  float f = 0;
  bool b = false;
  fmt_gguf_str s = {0};
  ir_diag d = {0};
  CHECK(fmt_gguf_get_u32(g, "v.u8", &u32, &d) == IR_OK && u32 == 200);
  CHECK(fmt_gguf_get_i32(g, "v.i8", &i32, &d) == IR_OK && i32 == -5);
  CHECK(fmt_gguf_get_u32(g, "v.u16", &u32, &d) == IR_OK && u32 == 60000);
  CHECK(fmt_gguf_get_i32(g, "v.i16", &i32, &d) == IR_OK && i32 == -300);
  CHECK(fmt_gguf_get_u32(g, "v.u32", &u32, &d) == IR_OK && u32 == 4000000000u);
  CHECK(fmt_gguf_get_i32(g, "v.i32", &i32, &d) == IR_OK && i32 == -70000);
  CHECK(fmt_gguf_get_f32(g, "v.f32", &f, &d) == IR_OK && f == 0.25f);
  CHECK(fmt_gguf_get_bool(g, "v.bool", &b, &d) == IR_OK && b);
  CHECK(fmt_gguf_get_str(g, "v.str", &s, &d) == IR_OK && fmt_gguf_str_eq(s, "hello"));
  CHECK(fmt_gguf_get_u64(g, "v.u64", &u64, &d) == IR_OK && u64 == 1ull << 40);
  CHECK(fmt_gguf_get_f32(g, "v.f64", &f, &d) == IR_OK && f == 1.5f);
  const fmt_gguf_kv *kv = fmt_gguf_kv_find(g, "v.i64");
  CHECK(kv && kv->value.type == FMT_GGUF_I64 && kv->value.num.i == -5000000000ll);
  CHECK(d.status == IR_OK);
  /* refusals name the file and key */
  d = (ir_diag){0};
  CHECK(fmt_gguf_get_u32(g, "v.i8", &u32, &d) == IR_BAD_FORMAT && strstr(d.msg, "'v.i8'"));
  d = (ir_diag){0};
  CHECK(fmt_gguf_get_i32(g, "v.u32", &i32, &d) == IR_BAD_FORMAT);
  d = (ir_diag){0};
  CHECK(fmt_gguf_get_u32(g, "v.u64", &u32, &d) == IR_BAD_FORMAT);
  d = (ir_diag){0};
  CHECK(fmt_gguf_get_u32(g, "v.str", &u32, &d) == IR_BAD_FORMAT &&
        strstr(d.msg, "has type STRING"));
  d = (ir_diag){0};
  CHECK(fmt_gguf_get_str(g, "v.nope", &s, &d) == IR_BAD_FORMAT &&
        strstr(d.msg, "'v.nope' is missing") && strstr(d.msg, fmt_gguf_path(g)) == d.msg);
}

static void check_arrays(const fmt_gguf *g) {
  const int64_t *ints = NULL;
  const float *fl = NULL;
  const fmt_gguf_str *strs = NULL;
  uint64_t n = 0;
  ir_diag d = {0};
  CHECK(fmt_gguf_get_ints(g, "a.i32", &ints, &n, &d) == IR_OK && n == 3 && ints[0] == 7 &&
        ints[1] == -8 && ints[2] == 9);
  CHECK(fmt_gguf_get_floats(g, "a.f32", &fl, &n, &d) == IR_OK && n == 2 && fl[0] == 0.5f &&
        fl[1] == -2.0f);
  CHECK(fmt_gguf_get_strs(g, "a.str", &strs, &n, &d) == IR_OK && n == 3 &&
        fmt_gguf_str_eq(strs[0], "a") && strs[1].len == 0 && fmt_gguf_str_eq(strs[2], "ccc"));
  CHECK(fmt_gguf_get_ints(g, "a.empty", &ints, &n, &d) == IR_OK && n == 0);
  const fmt_gguf_kv *kv = fmt_gguf_kv_find(g, "a.nested");
  CHECK(kv && kv->value.elem_type == FMT_GGUF_ARRAY && kv->value.count == 2 && kv->value.items);
  if (kv && kv->value.items) {
    const fmt_gguf_value *a = &kv->value.items[0], *b = &kv->value.items[1];
    CHECK(a->elem_type == FMT_GGUF_U16 && a->count == 2 && a->ints[0] == 1 && a->ints[1] == 2);
    CHECK(b->elem_type == FMT_GGUF_STRING && b->count == 1 && fmt_gguf_str_eq(b->strs[0], "x"));
  }
  CHECK(d.status == IR_OK);
  d = (ir_diag){0};
  CHECK(fmt_gguf_get_strs(g, "a.i32", &strs, &n, &d) == IR_BAD_FORMAT &&
        strstr(d.msg, "ARRAY of I32"));
  d = (ir_diag){0};
  CHECK(fmt_gguf_get_ints(g, "v.u8", &ints, &n, &d) == IR_BAD_FORMAT);
}

static void check_tensors(const fmt_gguf *g, uint32_t align) {
  CHECK(fmt_gguf_tensor_count(g) == N_VALID_TENSORS);
  static const ir_dtype want[N_VALID_TENSORS] = {IR_F32,  IR_F16,  IR_BF16,         IR_Q8_0,
                                                 IR_Q4_0, IR_Q4_1, IR_DTYPE_INVALID};
  for (int i = 0; i < N_VALID_TENSORS; i++) {
    const gw_tensor *w = &k_valid_tensors[i];
    const fmt_gguf_tensor *t = fmt_gguf_tensor_find(g, w->name);
    CHECKF(t && t == fmt_gguf_tensor_get(g, (size_t)i), "tensor %s", w->name);
    if (!t) continue;
    CHECK(t->dtype == want[i] && t->ggml_type == w->type && t->rank == w->rank);
    for (int k = 0; k < t->rank; k++) CHECK(t->shape[t->rank - 1 - k] == (int64_t)w->ne[k]);
    CHECK(t->nbytes == w->nbytes && memcmp(t->data, w->data, w->nbytes) == 0);
    CHECK(t->offset % align == 0 && (uintptr_t)t->data % align == 0);
  }
  const fmt_gguf_tensor *f = fmt_gguf_tensor_find(g, "t.f32");
  CHECK(f && f->shape[0] == 2 && f->shape[1] == 3); /* row-major [ne1, ne0] */
  CHECK(fmt_gguf_tensor_find(g, "t.none") == NULL);
  ir_diag d = {0};
  const fmt_gguf_tensor *k = fmt_gguf_tensor_find(g, "t.q4_k");
  CHECK(k && fmt_gguf_type_check(k, &d) == IR_UNSUPPORTED);
  CHECKF(strstr(d.msg, "tensor 't.q4_k': type 12 (Q4_K) is not supported (supported: F32, F16, "
                       "BF16, Q8_0, Q4_0, Q4_1)"),
         "%s", d.msg);
}

static void test_valid(void) {
  for (uint32_t version = 2; version <= 3; version++)
    for (int a64 = 0; a64 < 2; a64++) {
      gw w = {0};
      build_valid(&w, version, a64);
      fmt_gguf *g = NULL;
      ir_diag d;
      ir_status st = open_bytes("valid.gguf", &w, &g, &d);
      CHECKF(st == IR_OK, "v%u align64=%d: %s", version, a64, d.msg);
      if (g) {
        CHECK(fmt_gguf_version(g) == version);
        CHECK(fmt_gguf_alignment(g) == (a64 ? 64u : 32u));
        CHECK(fmt_gguf_kv_count(g) == (size_t)(N_VALID_KV - (a64 ? 0 : 1)));
        CHECK(!strcmp(fmt_gguf_kv_get(g, 0)->key, "v.u8"));
        check_scalars(g);
        check_arrays(g);
        check_tensors(g, a64 ? 64 : 32);
      }
      fmt_gguf_close(g);
      free(w.b);
    }
}

/* Every proper prefix of a valid file is refused (the last tensor ends the file). The
 * file is cut shorter in place, longest prefix first. */
static void test_truncated(void) {
  gw w = {0};
  build_valid(&w, 3, true);
  const char *path = tmp_path("trunc.gguf");
  write_file(path, w.b, w.n);
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0);
  int opened = 0;
  for (size_t len = w.n; fd >= 0 && len-- > 0;) {
    CHECK(ftruncate(fd, (off_t)len) == 0);
    fmt_gguf *g = NULL;
    ir_diag d = {0};
    if (fmt_gguf_open(path, &g, &d) == IR_OK || g || d.status == IR_OK || !d.msg[0]) {
      if (!opened++) fprintf(stderr, "prefix of %zu bytes opened\n", len);
    }
    fmt_gguf_close(g);
  }
  if (fd >= 0) close(fd);
  CHECKF(opened == 0, "%d truncated files opened", opened);
  free(w.b);
}

/* Reads everything an opened file offers, so that ASan sees any bad pointer. */
static uint64_t touch_all(const fmt_gguf *g) {
  uint64_t sum = 0;
  for (size_t i = 0; i < fmt_gguf_kv_count(g); i++) {
    const fmt_gguf_value *v = &fmt_gguf_kv_get(g, i)->value;
    sum += strlen(fmt_gguf_kv_get(g, i)->key) + v->count;
    for (uint64_t k = 0; v->strs && k < v->count; k++)
      sum += v->strs[k].len ? (uint8_t)v->strs[k].ptr[v->strs[k].len - 1] : 0;
    for (uint64_t k = 0; v->ints && k < v->count; k++) sum += (uint64_t)v->ints[k];
  }
  for (size_t i = 0; i < fmt_gguf_tensor_count(g); i++) {
    const fmt_gguf_tensor *t = fmt_gguf_tensor_get(g, i);
    for (uint64_t k = 0; k < t->nbytes; k++) sum += ((const uint8_t *)t->data)[k];
  }
  return sum;
}

/* Every byte before the data section set to 0, 0xff and flipped in its top bit: the
 * reader may accept or refuse each file, but must never crash or read out of bounds. */
static void test_mutations(void) {
  gw w = {0};
  build_valid(&w, 3, true);
  const char *path = tmp_path("mutant.gguf");
  size_t head = w.n - sizeof g_q4k_data; /* the last tensor's data is not header */
  int opened = 0, refused = 0;
  uint64_t sink = 0;
  write_file(path, w.b, w.n);
  int fd = open(path, O_RDWR); /* one byte rewritten in place per mutant */
  CHECK(fd >= 0);
  for (size_t i = 4; fd >= 0 && i < head; i++) {
    uint8_t keep = w.b[i];
    const uint8_t vals[4] = {0x00, 0xff, (uint8_t)(keep ^ 0x80), keep};
    for (int v = 0; v < 4; v++) {
      CHECK(pwrite(fd, &vals[v], 1, (off_t)i) == 1);
      if (v == 3) break; /* restored */
      fmt_gguf *g = NULL;
      ir_diag d = {0};
      if (fmt_gguf_open(path, &g, &d) == IR_OK) {
        opened++;
        sink += touch_all(g);
      } else {
        refused++;
        CHECKF(d.msg[0] && g == NULL, "byte %zu = %#x: refused without a message", i, vals[v]);
      }
      fmt_gguf_close(g);
    }
  }
  if (fd >= 0) close(fd);
  CHECK(opened > 0 && refused > 0);
  printf("mutations: %d opened, %d refused (checksum %llu)\n", opened, refused,
         (unsigned long long)sink);
  free(w.b);
}

/* ---- bad headers, metadata and tensor infos ------------------------------------------ */

static void test_bad_header(void) {
  gw w = {0};
  build_valid(&w, 3, false);
  w.b[3] = 'X';
  expect_fail("magic.gguf", &w, IR_BAD_FORMAT, "bad magic");
  w.b[3] = 'F';
  w.b[4] = 1;
  expect_fail("v1.gguf", &w, IR_VERSION, "version 1 is not supported");
  w.b[4] = 4;
  expect_fail("v4.gguf", &w, IR_VERSION, "unknown GGUF version 4");
  w.b[4] = 0, w.b[7] = 3;
  expect_fail("be.gguf", &w, IR_UNSUPPORTED, "big-endian");
  free(w.b);
  gw e = {0};
  expect_fail("empty.gguf", &e, IR_BAD_FORMAT, "not a GGUF file");
  gw_header(&e, 3, 1ull << 62, 0);
  expect_fail("tcount.gguf", &e, IR_BAD_FORMAT, "tensor count");
  e.n = 0;
  gw_header(&e, 3, 0, UINT64_MAX);
  expect_fail("kvcount.gguf", &e, IR_BAD_FORMAT, "metadata count");
  e.n = 0;
  gw_header(&e, 3, 0, 0); /* no tensors, no metadata: valid */
  fmt_gguf *g = NULL;
  ir_diag d;
  CHECKF(open_bytes("minimal.gguf", &e, &g, &d) == IR_OK, "%s", d.msg);
  CHECK(g && fmt_gguf_tensor_count(g) == 0 && fmt_gguf_kv_count(g) == 0);
  fmt_gguf_close(g);
  free(e.b);
}

/* One metadata entry written by `fn` after a header announcing one key. */
static void expect_bad_kv(const char *name, void (*fn)(gw *), ir_status st, const char *want) {
  gw w = {0};
  gw_header(&w, 3, 0, 1);
  fn(&w);
  gw_put(&w, "padding-so-counts-fit-the-file...", 32);
  expect_fail(name, &w, st, want);
  free(w.b);
}

static void kv_huge_key(gw *w) { gw_u64(w, 1ull << 63); }
static void kv_nul_key(gw *w) { gw_u64(w, 3), gw_put(w, "a\0b", 3), gw_u32(w, 4), gw_u32(w, 1); }
static void kv_bad_type(gw *w) { gw_key(w, "k", 13), gw_u32(w, 0); }
static void kv_bad_bool(gw *w) { gw_key(w, "k", FMT_GGUF_BOOL), gw_le(w, 2, 1); }
static void kv_huge_str(gw *w) { gw_key(w, "k", FMT_GGUF_STRING), gw_u64(w, UINT64_MAX); }
static void kv_huge_arr(gw *w) {
  gw_key(w, "k", FMT_GGUF_ARRAY), gw_u32(w, FMT_GGUF_U64), gw_u64(w, 1ull << 61);
}
static void kv_huge_strs(gw *w) {
  gw_key(w, "k", FMT_GGUF_ARRAY), gw_u32(w, FMT_GGUF_STRING), gw_u64(w, 1ull << 60);
}
static void kv_bad_elem(gw *w) { gw_key(w, "k", FMT_GGUF_ARRAY), gw_u32(w, 99), gw_u64(w, 1); }
static void kv_deep(gw *w) {
  gw_key(w, "k", FMT_GGUF_ARRAY);
  for (int i = 0; i < 10; i++) gw_u32(w, FMT_GGUF_ARRAY), gw_u64(w, 1);
}
static void kv_big_u64(gw *w) {
  gw_key(w, "k", FMT_GGUF_ARRAY), gw_u32(w, FMT_GGUF_U64), gw_u64(w, 1), gw_u64(w, UINT64_MAX);
}

static void test_bad_metadata(void) {
  expect_bad_kv("key-huge.gguf", kv_huge_key, IR_BAD_FORMAT, "exceeds the");
  expect_bad_kv("key-nul.gguf", kv_nul_key, IR_BAD_FORMAT, "NUL byte");
  expect_bad_kv("kv-type.gguf", kv_bad_type, IR_BAD_FORMAT, "'k': unknown value type 13");
  expect_bad_kv("kv-bool.gguf", kv_bad_bool, IR_BAD_FORMAT, "bool value 2");
  expect_bad_kv("kv-str.gguf", kv_huge_str, IR_BAD_FORMAT, "string length");
  expect_bad_kv("kv-arr.gguf", kv_huge_arr, IR_BAD_FORMAT, "array of 2305843009213693952 U64");
  expect_bad_kv("kv-strs.gguf", kv_huge_strs, IR_BAD_FORMAT, "array of");
  expect_bad_kv("kv-elem.gguf", kv_bad_elem, IR_BAD_FORMAT, "unknown array element type 99");
  expect_bad_kv("kv-deep.gguf", kv_deep, IR_BAD_FORMAT, "nested deeper");
  expect_bad_kv("kv-u64.gguf", kv_big_u64, IR_UNSUPPORTED, "above INT64_MAX");
  gw w = {0};
  gw_header(&w, 3, 0, 2);
  kv_u32(&w, "dup", 1), kv_u32(&w, "dup", 2);
  expect_fail("kv-dup.gguf", &w, IR_BAD_FORMAT, "'dup' appears twice");
  w.n = 0;
  gw_header(&w, 3, 0, 1);
  kv_u32(&w, "general.alignment", 48);
  expect_fail("align48.gguf", &w, IR_BAD_FORMAT, "not a power of two");
  w.n = 0;
  gw_header(&w, 3, 0, 1);
  gw_key(&w, "general.alignment", FMT_GGUF_U64), gw_u64(&w, 64);
  expect_fail("align-u64.gguf", &w, IR_BAD_FORMAT, "expected U32");
  free(w.b);
}

static uint8_t g_zero[4096];

/* A file of the given tensors (offsets as written by gw_tensors unless `offsets`). */
static void expect_bad_tensors(const char *name, const gw_tensor *ts, int nt,
                               const uint64_t *offsets, ir_status st, const char *want) {
  gw w = {0};
  gw_header(&w, 3, (uint64_t)nt, 0);
  if (!offsets) {
    gw_tensors(&w, ts, nt, 32);
  } else {
    for (int i = 0; i < nt; i++) {
      gw_str(&w, ts[i].name);
      gw_u32(&w, (uint32_t)ts[i].rank);
      for (int k = 0; k < ts[i].rank; k++) gw_u64(&w, ts[i].ne[k]);
      gw_u32(&w, ts[i].type);
      gw_u64(&w, offsets[i]);
    }
    gw_pad(&w, 32);
    gw_put(&w, g_zero, 256);
  }
  expect_fail(name, &w, st, want);
  free(w.b);
}

static void test_bad_tensors(void) {
  gw_tensor t = {"w", 0, 1, {16}, g_zero, 64};
  gw_tensor bad = t;
  bad.type = 99;
  expect_bad_tensors("type99.gguf", &bad, 1, NULL, IR_BAD_FORMAT, "tensor 'w': unknown type 99");
  bad.type = 4; /* Q4_2, removed from ggml */
  expect_bad_tensors("type4.gguf", &bad, 1, NULL, IR_BAD_FORMAT, "unknown type 4");
  bad = t, bad.rank = 5;
  expect_bad_tensors("rank5.gguf", &bad, 1, NULL, IR_BAD_FORMAT, "rank 5");
  bad = t, bad.rank = 0;
  expect_bad_tensors("rank0.gguf", &bad, 1, NULL, IR_BAD_FORMAT, "rank 0");
  bad = t, bad.rank = 2, bad.ne[0] = 1ull << 40, bad.ne[1] = 1ull << 40;
  expect_bad_tensors("elems.gguf", &bad, 1, NULL, IR_BAD_FORMAT, "element count overflows");
  bad = t, bad.ne[0] = 1ull << 62;
  expect_bad_tensors("bytes.gguf", &bad, 1, NULL, IR_BAD_FORMAT, "byte size overflows");
  bad = t, bad.ne[0] = 1ull << 61;
  expect_bad_tensors("big.gguf", &bad, 1, NULL, IR_BAD_FORMAT, "ends past the data section");
  bad = t, bad.type = 8, bad.ne[0] = 33;
  expect_bad_tensors("block.gguf", &bad, 1, NULL, IR_BAD_FORMAT, "not a multiple of the Q8_0");
  uint64_t off8 = 8, off_far = 1ull << 40, off_max = UINT64_MAX - 31;
  expect_bad_tensors("misaligned.gguf", &t, 1, &off8, IR_BAD_FORMAT,
                     "not a multiple of the "
                     "alignment 32");
  expect_bad_tensors("far.gguf", &t, 1, &off_far, IR_BAD_FORMAT, "ends past the data section");
  expect_bad_tensors("wrap.gguf", &t, 1, &off_max, IR_BAD_FORMAT, "ends past the data section");
  gw_tensor two[2] = {{"a", 0, 1, {16}, g_zero, 64}, {"b", 0, 1, {8}, g_zero, 32}};
  uint64_t overlap[2] = {0, 32}, same[2] = {64, 64}, ok[2] = {64, 0};
  expect_bad_tensors("overlap.gguf", two, 2, overlap, IR_BAD_FORMAT, "overlaps tensor");
  expect_bad_tensors("same.gguf", two, 2, same, IR_BAD_FORMAT, "overlaps tensor");
  two[1].name = "a";
  expect_bad_tensors("dupname.gguf", two, 2, ok, IR_BAD_FORMAT, "tensor 'a' appears twice");
  /* tensor infos end exactly at the file end: the data section would start past it */
  gw w = {0};
  gw_header(&w, 3, 1, 0);
  gw_str(&w, "w"), gw_u32(&w, 1), gw_u64(&w, 16), gw_u32(&w, 0), gw_u64(&w, 0);
  expect_fail("nodata.gguf", &w, IR_BAD_FORMAT, "data section starts at byte");
  free(w.b);
}

/* ---- the HF name map ------------------------------------------------------------------ */

static void test_names(void) {
  static const char *const k_map[][2] = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
      {"model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight"},
      {"model.layers.12.self_attn.k_proj.bias", "blk.12.attn_k.bias"},
      {"model.layers.3.self_attn.v_proj.weight", "blk.3.attn_v.weight"},
      {"model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight"},
      {"model.layers.3.mlp.gate_proj.weight", "blk.3.ffn_gate.weight"},
      {"model.layers.3.mlp.up_proj.weight", "blk.3.ffn_up.weight"},
      {"model.layers.3.mlp.down_proj.weight", "blk.3.ffn_down.weight"},
      {"model.layers.3.input_layernorm.weight", "blk.3.attn_norm.weight"},
      {"model.layers.3.post_attention_layernorm.weight", "blk.3.ffn_norm.weight"},
      {"model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight"}, /* qwen3 */
      {"model.layers.3.self_attn.k_norm.weight", "blk.3.attn_k_norm.weight"},
  };
  char buf[128];
  for (size_t i = 0; i < sizeof k_map / sizeof k_map[0]; i++)
    CHECKF(infc_gguf_llama_name(k_map[i][0], buf, sizeof buf) && !strcmp(buf, k_map[i][1]), "%s",
           k_map[i][0]);
  static const char *const k_none[] = {"model.layers.01.mlp.up_proj.weight",
                                       "model.layers..x",
                                       "model.layers.1.mlp.foo.weight",
                                       "lm_head.scale",
                                       "model.layers.1.mlp.up_proj",
                                       "weight",
                                       ""};
  for (size_t i = 0; i < sizeof k_none / sizeof k_none[0]; i++)
    CHECKF(!infc_gguf_llama_name(k_none[i], buf, sizeof buf), "'%s' mapped", k_none[i]);
  CHECK(!infc_gguf_llama_name("model.layers.3.mlp.up_proj.weight", buf, 8)); /* too short */
  /* Gemma's norms: its post_attention_layernorm follows the attention (llama's is the MLP's
   * input norm, pre_feedforward_layernorm in Gemma) */
  static const char *const k_gemma[][2] = {
      {"model.layers.3.post_attention_layernorm.weight", "blk.3.post_attention_norm.weight"},
      {"model.layers.3.pre_feedforward_layernorm.weight", "blk.3.ffn_norm.weight"},
      {"model.layers.3.post_feedforward_layernorm.weight", "blk.3.post_ffw_norm.weight"},
      {"model.layers.3.input_layernorm.weight", "blk.3.attn_norm.weight"},
      {"model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight"},
      {"model.embed_tokens.weight", "token_embd.weight"},
  };
  for (size_t i = 0; i < sizeof k_gemma / sizeof k_gemma[0]; i++)
    for (int a = 0; a < 2; a++)
      CHECKF(infc_gguf_llama_name_arch(a ? "gemma3" : "gemma2", k_gemma[i][0], buf, sizeof buf) &&
                 !strcmp(buf, k_gemma[i][1]),
             "%s", k_gemma[i][0]);
  CHECK(!infc_gguf_llama_name("model.layers.3.post_feedforward_layernorm.weight", buf, sizeof buf));
}

/* ---- the frontend through infc_build -------------------------------------------------- */

static void llama_kvs(gw *w, const char *arch, uint32_t layers) {
  char k[128];
  kv_str(w, "general.architecture", arch);
#define KV(suffix, v) (snprintf(k, sizeof k, "%s." suffix, arch), kv_u32(w, k, (v)))
  KV("block_count", layers);
  KV("context_length", 64);
  KV("embedding_length", 32);
  KV("feed_forward_length", 64);
  KV("attention.head_count", 2);
  KV("vocab_size", 16);
#undef KV
  snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
  kv_f32(w, k, 1e-5f);
}

static ir_status build_gguf(const char *name, const gw *w, ir_diag *d) {
  const char *path = tmp_path(name);
  char src[1024], plan[1100];
  write_file(path, w->b, w->n);
  snprintf(src, sizeof src, "%s", path);
  snprintf(plan, sizeof plan, "%s.plan", src);
  infc_options o = infc_options_default();
  *d = (ir_diag){0};
  return infc_build(src, &o, plan, NULL, NULL, d);
}

static void test_frontend_refusals(void) {
  gw w = {0};
  ir_diag d;
  gw_header(&w, 3, 0, 8);
  llama_kvs(&w, "gpt2", 1);
  CHECK(build_gguf("arch.gguf", &w, &d) == IR_UNSUPPORTED);
  CHECKF(strstr(d.msg, "unknown architecture 'gpt2'") && strstr(d.msg, "arch.gguf"), "%s", d.msg);
  w.n = 0;
  gw_header(&w, 3, 0, 8);
  llama_kvs(&w, "llama", 4000000000u);
  CHECK(build_gguf("layers.gguf", &w, &d) == IR_BAD_FORMAT);
  CHECKF(strstr(d.msg, "block_count 4000000000 exceeds"), "%s", d.msg);
  w.n = 0; /* without the rms epsilon */
  gw_header(&w, 3, 0, 7);
  kv_str(&w, "general.architecture", "llama");
  kv_u32(&w, "llama.block_count", 1), kv_u32(&w, "llama.context_length", 8);
  kv_u32(&w, "llama.embedding_length", 32), kv_u32(&w, "llama.feed_forward_length", 64);
  kv_u32(&w, "llama.attention.head_count", 2), kv_u32(&w, "llama.vocab_size", 16);
  CHECK(build_gguf("noeps.gguf", &w, &d) == IR_BAD_FORMAT);
  CHECKF(strstr(d.msg, "'llama.attention.layer_norm_rms_epsilon' is missing"), "%s", d.msg);
  /* a layer tensor in a K-quant: refused with its GGUF name */
  w.n = 0;
  gw_header(&w, 3, 1, 8);
  llama_kvs(&w, "llama", 1);
  gw_tensor k4 = {"blk.0.attn_q.weight", 12, 2, {256, 1}, g_zero, 144};
  gw_tensors(&w, &k4, 1, 32);
  CHECK(build_gguf("q4k.gguf", &w, &d) == IR_UNSUPPORTED);
  CHECKF(strstr(d.msg, "q4k.gguf: tensor 'blk.0.attn_q.weight': type 12 (Q4_K) is not "
                       "supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"),
         "%s", d.msg);
  /* experts (one stray tensor keeps block_count plausible) */
  gw_tensor stray = {"x", 0, 1, {16}, g_zero, 64};
  w.n = 0;
  gw_header(&w, 3, 1, 9);
  llama_kvs(&w, "llama", 1);
  kv_u32(&w, "llama.expert_count", 8);
  gw_tensors(&w, &stray, 1, 32);
  CHECK(build_gguf("moe.gguf", &w, &d) == IR_UNSUPPORTED && strstr(d.msg, "experts"));
  /* missing tensors are named by their HF name, with the file */
  w.n = 0;
  gw_header(&w, 3, 1, 8);
  llama_kvs(&w, "llama", 1);
  gw_tensors(&w, &stray, 1, 32);
  CHECK(build_gguf("empty-model.gguf", &w, &d) == IR_BAD_FORMAT);
  CHECKF(strstr(d.msg, "empty-model.gguf") && strstr(d.msg, "model.embed_tokens.weight"), "%s",
         d.msg);
  free(w.b);
}

int main(void) {
  fill_data();
  test_valid();
  test_truncated();
  test_mutations();
  test_bad_header();
  test_bad_metadata();
  test_bad_tensors();
  test_names();
  test_frontend_refusals();
  return tcheck_done("gguf");
}
