/* test_safetensors: valid files, sharded directories and every kind of corrupt header,
 * all generated at run time under TEST_TMP_DIR. */
#include "fmt_safetensors.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tcheck.h"

#define ST_DIR TEST_TMP_DIR "/safetensors"

/* ---- helpers ---------------------------------------------------------------------- */

static char g_path[1024];

static const char *tmp_path(const char *name) {
  snprintf(g_path, sizeof g_path, "%s/%s", ST_DIR, name);
  return g_path;
}

static void make_dir(const char *path) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST) fprintf(stderr, "mkdir %s failed\n", path);
}

static void write_bytes(const char *path, const void *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECKF(f != NULL, "cannot create %s", path);
  if (!f) return;
  if (n) CHECK(fwrite(buf, 1, n, f) == n);
  fclose(f);
}

/* Builds "u64 LE header length | header | data" into a malloc'd buffer. */
static uint8_t *build_st(const char *header, const void *data, size_t ndata, size_t *out_n) {
  size_t hn = strlen(header);
  uint8_t *buf = malloc(8 + hn + ndata + 1);
  if (!buf) abort();
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hn >> (8 * i));
  memcpy(buf + 8, header, hn);
  if (ndata) memcpy(buf + 8 + hn, data, ndata);
  *out_n = 8 + hn + ndata;
  return buf;
}

static void write_st(const char *path, const char *header, const void *data, size_t ndata) {
  size_t n;
  uint8_t *buf = build_st(header, data, ndata, &n);
  write_bytes(path, buf, n);
  free(buf);
}

/* Writes a file with a zero-filled data section of ndata bytes. */
static void write_st_zero(const char *path, const char *header, size_t ndata) {
  uint8_t *z = calloc(1, ndata + 1);
  write_st(path, header, z, ndata);
  free(z);
}

static void expect_fail_at(const char *path, ir_status want, const char *substr, int line) {
  ir_diag d = {0};
  fmt_st *st = (fmt_st *)1;
  ir_status s = fmt_st_open(path, &st, &d);
  if (getenv("ST_VERBOSE")) fprintf(stderr, "[%s] %s\n", ir_status_name(s), d.msg);
  CHECKF(s == want, "line %d: %s: status %s, want %s (%s)", line, path, ir_status_name(s),
         ir_status_name(want), d.msg);
  CHECKF(st == NULL, "line %d: out not NULL on error", line);
  CHECKF(d.status == want, "line %d: diag status %s", line, ir_status_name(d.status));
  CHECKF(strstr(d.msg, substr) != NULL, "line %d: message '%s' lacks '%s'", line, d.msg, substr);
  if (s == IR_OK) fmt_st_close(st);
}
#define EXPECT_FAIL(path, want, substr) expect_fail_at(path, want, substr, __LINE__)

/* Writes header (with zeroed data) to bad.safetensors and expects it to fail. */
static void bad_header_at(const char *header, size_t ndata, ir_status want, const char *substr,
                          int line) {
  const char *p = tmp_path("bad.safetensors");
  write_st_zero(p, header, ndata);
  expect_fail_at(p, want, substr, line);
}
#define BAD_HEADER(h, n, want, sub) bad_header_at(h, n, want, sub, __LINE__)

static void check_shape(const fmt_st_tensor *t, int rank, const int64_t *shape) {
  CHECK(t->rank == rank);
  for (int i = 0; i < rank && i < t->rank; i++) CHECK(t->shape[i] == shape[i]);
}

/* ---- the valid reference file ----------------------------------------------------- */

/* a: F32 [2,3] bytes 0..24, b: BF16 [4] 24..32, c: I64 [] 32..40, e: U8 [0] at 40, and
 * the data section holds exactly 40 bytes, so every truncation must be refused. */
static const char k_good_header[] =
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"hi\"},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"c\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[32,40]},"
    "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[40,40]}}";

static void good_data(uint8_t data[40]) {
  for (int i = 0; i < 40; i++) data[i] = (uint8_t)(i * 7 + 1);
}

static void check_good(const fmt_st *st, const uint8_t *data) {
  CHECK(fmt_st_count(st) == 4);
  const char *names[4] = {"a", "b", "c", "e"};
  for (size_t i = 0; i < 4; i++) {
    const fmt_st_tensor *t = fmt_st_get(st, i);
    CHECKF(t && strcmp(t->name, names[i]) == 0, "tensor %zu", i);
    CHECK(t && fmt_st_find(st, names[i]) == t);
  }
  CHECK(fmt_st_get(st, 4) == NULL);
  CHECK(fmt_st_find(st, "zz") == NULL && fmt_st_find(st, "") == NULL);
  CHECK(fmt_st_find(st, "__metadata__") == NULL);
  const fmt_st_tensor *a = fmt_st_find(st, "a"), *b = fmt_st_find(st, "b");
  const fmt_st_tensor *c = fmt_st_find(st, "c"), *e = fmt_st_find(st, "e");
  if (!a || !b || !c || !e) return;
  CHECK(a->dtype == IR_F32 && a->nbytes == 24 && memcmp(a->data, data, 24) == 0);
  check_shape(a, 2, (const int64_t[]){2, 3});
  CHECK(b->dtype == IR_BF16 && b->nbytes == 8 && memcmp(b->data, data + 24, 8) == 0);
  check_shape(b, 1, (const int64_t[]){4});
  CHECK(c->dtype == IR_I64 && c->nbytes == 8 && c->rank == 0);
  CHECK(memcmp(c->data, data + 32, 8) == 0);
  CHECK(e->dtype == IR_U8 && e->nbytes == 0 && e->rank == 1 && e->shape[0] == 0);
  CHECK(fmt_st_metadata(st, "format") && strcmp(fmt_st_metadata(st, "format"), "pt") == 0);
  CHECK(fmt_st_metadata(st, "note") && strcmp(fmt_st_metadata(st, "note"), "hi") == 0);
  CHECK(fmt_st_metadata(st, "missing") == NULL);
}

static void test_valid_file(void) {
  uint8_t data[40];
  good_data(data);
  const char *p = tmp_path("good.safetensors");
  write_st(p, k_good_header, data, sizeof data);
  ir_diag d = {0};
  fmt_st *st = NULL;
  CHECKF(fmt_st_open(p, &st, &d) == IR_OK, "%s", d.msg);
  CHECK(st != NULL && d.status == IR_OK);
  if (st) check_good(st, data);
  fmt_st_close(st);
  fmt_st_close(NULL);
  CHECK(fmt_st_count(NULL) == 0 && fmt_st_get(NULL, 0) == NULL);
  CHECK(fmt_st_find(NULL, "a") == NULL && fmt_st_metadata(NULL, "format") == NULL);

  /* An empty header object is a valid (empty) checkpoint; so is space padding. */
  write_st(tmp_path("empty.safetensors"), "{}      ", NULL, 0);
  st = NULL;
  CHECKF(fmt_st_open(tmp_path("empty.safetensors"), &st, &d) == IR_OK, "%s", d.msg);
  CHECK(st && fmt_st_count(st) == 0);
  fmt_st_close(st);
}

static void test_single_dir(void) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", tmp_path("single"));
  make_dir(dir);
  char p[1100];
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  uint8_t data[40];
  good_data(data);
  write_st(p, k_good_header, data, sizeof data);
  ir_diag d = {0};
  fmt_st *st = NULL;
  CHECKF(fmt_st_open(dir, &st, &d) == IR_OK, "%s", d.msg);
  if (st) check_good(st, data);
  fmt_st_close(st);

  snprintf(dir, sizeof dir, "%s", tmp_path("emptydir"));
  make_dir(dir);
  EXPECT_FAIL(dir, IR_IO, "no model.safetensors or model.safetensors.index.json in");
  EXPECT_FAIL(tmp_path("does-not-exist.safetensors"), IR_IO, "does-not-exist.safetensors");
}

/* ---- sharded directories ---------------------------------------------------------- */

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static const char *shard_dir(const char *name, const char *index_json) {
  static char dir[1024];
  snprintf(dir, sizeof dir, "%s", tmp_path(name));
  make_dir(dir);
  char p[1200];
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  write_bytes(p, index_json, strlen(index_json));
  uint8_t d1[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, d2[4] = {0xaa, 0xbb, 0xcc, 0xdd};
  snprintf(p, sizeof p, "%s/" SHARD1, dir);
  write_st(p,
           "{\"__metadata__\":{\"format\":\"pt\"},"
           "\"w1\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
           "\"w3\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
           d1, sizeof d1);
  snprintf(p, sizeof p, "%s/" SHARD2, dir);
  write_st(p,
           "{\"__metadata__\":{\"format\":\"other\"},"
           "\"w2\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
           d2, sizeof d2);
  return dir;
}

static void test_sharded(void) {
  const char *dir = shard_dir("sharded", "{\"metadata\":{\"total_size\":16},\"weight_map\":{"
                                         "\"w1\":\"" SHARD1 "\",\"w2\":\"" SHARD2 "\","
                                         "\"w3\":\"" SHARD1 "\"}}");
  ir_diag d = {0};
  fmt_st *st = NULL;
  CHECKF(fmt_st_open(dir, &st, &d) == IR_OK, "%s", d.msg);
  if (!st) return;
  CHECK(fmt_st_count(st) == 3);
  const fmt_st_tensor *w1 = fmt_st_find(st, "w1"), *w2 = fmt_st_find(st, "w2");
  const fmt_st_tensor *w3 = fmt_st_find(st, "w3");
  CHECK(w1 && w1->dtype == IR_F16 && w1->nbytes == 8 && ((const uint8_t *)w1->data)[0] == 1);
  CHECK(w2 && w2->dtype == IR_I32 && ((const uint8_t *)w2->data)[3] == 0xdd);
  CHECK(w3 && w3->dtype == IR_I8 && ((const uint8_t *)w3->data)[0] == 9);
  const char *fmt = fmt_st_metadata(st, "format");
  CHECKF(fmt && strcmp(fmt, "pt") == 0, "metadata of the first shard: %s", fmt ? fmt : "NULL");
  fmt_st_close(st);
}

static void test_sharded_bad(void) {
  const char *dir = shard_dir("missing_shard", "{\"weight_map\":{\"w1\":\"" SHARD1 "\","
                                               "\"w2\":\"nowhere.safetensors\"}}");
  EXPECT_FAIL(dir, IR_IO, "nowhere.safetensors: cannot open");
  dir = shard_dir("absent_tensor", "{\"weight_map\":{\"w1\":\"" SHARD1 "\",\"w2\":\"" SHARD2
                                   "\",\"w3\":\"" SHARD1 "\",\"ghost\":\"" SHARD2 "\"}}");
  EXPECT_FAIL(dir, IR_BAD_FORMAT, "tensor 'ghost' is listed in shard '" SHARD2 "'");
  dir = shard_dir("wrong_shard", "{\"weight_map\":{\"w1\":\"" SHARD2 "\",\"w2\":\"" SHARD1 "\"}}");
  EXPECT_FAIL(dir, IR_BAD_FORMAT, "is listed in shard");
  dir = shard_dir("no_weight_map", "{\"metadata\":{}}");
  EXPECT_FAIL(dir, IR_BAD_FORMAT, "weight_map is missing");
  dir = shard_dir("index_not_json", "{\"weight_map\":");
  EXPECT_FAIL(dir, IR_BAD_FORMAT, "index is not valid JSON");
  dir = shard_dir("shard_path", "{\"weight_map\":{\"w1\":\"../" SHARD1 "\"}}");
  EXPECT_FAIL(dir, IR_BAD_FORMAT, "not a shard file name");
  dir = shard_dir("shard_num", "{\"weight_map\":{\"w1\":3}}");
  EXPECT_FAIL(dir, IR_BAD_FORMAT, "not a shard file name");

  /* The same tensor name in two shards. */
  dir = shard_dir("dup", "{\"weight_map\":{\"w1\":\"" SHARD1 "\",\"w2\":\"" SHARD2 "\"}}");
  char p[1200];
  snprintf(p, sizeof p, "%s/" SHARD2, dir);
  write_st_zero(p, "{\"w1\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  EXPECT_FAIL(dir, IR_BAD_FORMAT, "tensor 'w1' appears in both");

  /* A corrupt shard is reported with its own path. */
  dir = shard_dir("bad_shard", "{\"weight_map\":{\"w1\":\"" SHARD1 "\",\"w2\":\"" SHARD2 "\"}}");
  snprintf(p, sizeof p, "%s/" SHARD2, dir);
  write_st_zero(p, "{\"w2\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
  EXPECT_FAIL(dir, IR_UNSUPPORTED, SHARD2 ": tensor 'w2': dtype 'F64' is not supported");
}

/* ---- corrupt single files --------------------------------------------------------- */

static void test_bad_lengths(void) {
  const char *p = tmp_path("bad.safetensors");
  write_bytes(p, "", 0);
  EXPECT_FAIL(p, IR_BAD_FORMAT, "too short");
  write_bytes(p, "\x02\0\0\0\0", 5);
  EXPECT_FAIL(p, IR_BAD_FORMAT, "bad.safetensors: file is 5 bytes, too short");
  write_bytes(p, "\x40\0\0\0\0\0\0\0{}", 10);
  EXPECT_FAIL(p, IR_BAD_FORMAT, "truncated: header length 64");
  write_bytes(p, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
  EXPECT_FAIL(p, IR_BAD_FORMAT, "truncated: header length");

  /* A header length over the 100 MB limit, in a sparse file long enough to hold it. */
  uint64_t big = 150u * 1000u * 1000u;
  uint8_t hdr[8];
  for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)(big >> (8 * i));
  write_bytes(p, hdr, 8);
  CHECK(truncate(p, (off_t)(8 + big)) == 0);
  EXPECT_FAIL(p, IR_BAD_FORMAT, "exceeds the limit");
  unlink(p);
}

static void test_bad_json(void) {
  BAD_HEADER("{not json", 0, IR_BAD_FORMAT, "header is not valid JSON");
  BAD_HEADER("", 0, IR_BAD_FORMAT, "header is not valid JSON");
  BAD_HEADER("[1,2]", 0, IR_BAD_FORMAT, "header is not a JSON object");
  BAD_HEADER("\"str\"", 0, IR_BAD_FORMAT, "not a JSON object");
  BAD_HEADER("{} x", 0, IR_BAD_FORMAT, "trailing bytes");
  const char *p = tmp_path("bad.safetensors");
  write_bytes(p, "\x04\0\0\0\0\0\0\0{\0}\n", 12);
  EXPECT_FAIL(p, IR_BAD_FORMAT, "NUL byte");
  BAD_HEADER("{\"__metadata__\":[1]}", 0, IR_BAD_FORMAT, "__metadata__ is not an object");
  BAD_HEADER("{\"__metadata__\":{\"k\":1}}", 0, IR_BAD_FORMAT, "__metadata__ 'k' is not a string");
  BAD_HEADER("{\"__metadata__\":{},\"__metadata__\":{}}", 0, IR_BAD_FORMAT, "appears twice");
  BAD_HEADER("{\"x\":5}", 0, IR_BAD_FORMAT, "bad.safetensors: tensor 'x': entry is not an object");
}

static void test_bad_entries(void) {
  BAD_HEADER("{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, IR_BAD_FORMAT,
             "tensor 'x': missing 'dtype'");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, IR_BAD_FORMAT,
             "missing 'shape'");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, IR_BAD_FORMAT,
             "missing 'data_offsets'");
  BAD_HEADER("{\"x\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, IR_BAD_FORMAT,
             "dtype is not a string");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"y\":1}}", 4,
             IR_BAD_FORMAT, "unexpected key 'y'");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             4, IR_BAD_FORMAT, "repeated key 'dtype'");
  BAD_HEADER("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, IR_UNSUPPORTED,
             "tensor 'x': dtype 'F64' is not supported");
  BAD_HEADER("{\"x\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, IR_UNSUPPORTED,
             "dtype 'BOOL' is not supported");
  BAD_HEADER("{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             IR_UNSUPPORTED, "dtype 'F8_E4M3' is not supported");
  BAD_HEADER("{\"x\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, IR_UNSUPPORTED,
             "dtype 'f32' is not supported");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, IR_BAD_FORMAT,
             "tensor 'x': shape[0] is not a non-negative integer");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, IR_BAD_FORMAT,
             "shape[0] is not a non-negative integer");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,\"3\"],\"data_offsets\":[0,4]}}", 4,
             IR_BAD_FORMAT, "shape[1] is not a non-negative integer");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16, IR_BAD_FORMAT,
             "shape is not an array");
  BAD_HEADER("{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
             IR_BAD_FORMAT, "rank 9 exceeds");
  BAD_HEADER("{\"x\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
             "\"data_offsets\":[0,1]}}",
             1, IR_BAD_FORMAT, "element count overflows");
  BAD_HEADER("{\"x\":{\"dtype\":\"U8\",\"shape\":[1e300],\"data_offsets\":[0,1]}}", 1,
             IR_BAD_FORMAT, "shape[0] is not a non-negative integer");
}

static void test_bad_offsets(void) {
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16,
             IR_BAD_FORMAT,
             "tensor 'x': data_offsets [0, 12) do not match shape [2, 2] of F32 (16 bytes)");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, IR_BAD_FORMAT,
             "tensor 'x': data_offsets begin 8 > end 4");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4.5]}}", 8,
             IR_BAD_FORMAT, "data_offsets are not non-negative integers");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",\"4\"]}}", 8,
             IR_BAD_FORMAT, "data_offsets are not non-negative integers");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8, IR_BAD_FORMAT,
             "data_offsets are not non-negative integers");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, IR_BAD_FORMAT,
             "data_offsets is not an array of two integers");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 8, IR_BAD_FORMAT,
             "data_offsets is not an array of two integers");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 6, IR_BAD_FORMAT,
             "truncated: tensor 'x' ends at byte 8");
  BAD_HEADER("{\"x\":{\"dtype\":\"U8\",\"shape\":[1],"
             "\"data_offsets\":[18446744073709551615,18446744073709551616]}}",
             8, IR_BAD_FORMAT, "data_offsets are not non-negative integers");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12, IR_BAD_FORMAT, "overlaps");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             16, IR_BAD_FORMAT, "tensor 'y' [4, 8) overlaps tensor 'x' [0, 16)");
  BAD_HEADER("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             8, IR_BAD_FORMAT, "tensor 'x' appears twice");
}

/* Valid corner cases that a too-strict reader would refuse. */
static void test_edge_valid(void) {
  const char *p = tmp_path("edge.safetensors");
  /* Zero-sized tensors sharing offsets, inside a gap, and a trailing unused byte. */
  write_st_zero(p,
                "{\"a\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[4,4]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[4,4]},"
                "\"c\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"d\":{\"dtype\":\"F16\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[4,6]}}",
                7);
  ir_diag d = {0};
  fmt_st *st = NULL;
  CHECKF(fmt_st_open(p, &st, &d) == IR_OK, "%s", d.msg);
  CHECK(st && fmt_st_count(st) == 4);
  const fmt_st_tensor *t = fmt_st_find(st, "d");
  CHECK(t && t->rank == 8 && t->nbytes == 2);
  t = fmt_st_find(st, "a");
  CHECK(t && t->nbytes == 0 && t->rank == 2 && t->shape[1] == 5);
  fmt_st_close(st);
}

/* A realistic tensor count: every name must be found by lookup, in sorted order. */
static void test_many_tensors(void) {
  enum { N = 1000 };
  size_t cap = (size_t)N * 96 + 16, len = 0;
  char *h = malloc(cap);
  if (!h) abort();
  len += (size_t)snprintf(h + len, cap - len, "{");
  for (int i = N - 1; i >= 0; i--)
    len += (size_t)snprintf(h + len, cap - len,
                            "%s\"model.layers.%d.w\":{\"dtype\":\"F16\",\"shape\":[2],"
                            "\"data_offsets\":[%d,%d]}",
                            i == N - 1 ? "" : ",", i, 4 * i, 4 * i + 4);
  snprintf(h + len, cap - len, "}");
  uint8_t *data = malloc(4 * N);
  if (!data) abort();
  for (int i = 0; i < 4 * N; i++) data[i] = (uint8_t)(i / 4);
  write_st(tmp_path("many.safetensors"), h, data, 4 * N);
  ir_diag d = {0};
  fmt_st *st = NULL;
  CHECKF(fmt_st_open(tmp_path("many.safetensors"), &st, &d) == IR_OK, "%s", d.msg);
  CHECK(fmt_st_count(st) == N);
  int found = 0, sorted = 1;
  for (int i = 0; i < N; i++) {
    char name[64];
    snprintf(name, sizeof name, "model.layers.%d.w", i);
    const fmt_st_tensor *t = fmt_st_find(st, name);
    if (t && strcmp(t->name, name) == 0 && ((const uint8_t *)t->data)[3] == (uint8_t)i) found++;
  }
  for (size_t i = 1; i < fmt_st_count(st); i++)
    if (strcmp(fmt_st_get(st, i - 1)->name, fmt_st_get(st, i)->name) >= 0) sorted = 0;
  CHECK(found == N && sorted);
  fmt_st_close(st);
  free(data);
  free(h);
}

/* ---- robustness ------------------------------------------------------------------- */

static void test_every_truncation(void) {
  uint8_t data[40];
  good_data(data);
  size_t n;
  uint8_t *buf = build_st(k_good_header, data, sizeof data, &n);
  const char *p = tmp_path("trunc.safetensors");
  int wrong = 0;
  for (size_t len = 0; len <= n; len++) {
    write_bytes(p, buf, len);
    ir_diag d = {0};
    fmt_st *st = NULL;
    ir_status s = fmt_st_open(p, &st, &d);
    bool ok = len == n ? (s == IR_OK && st) : (s == IR_BAD_FORMAT && !st && d.msg[0]);
    if (!ok && wrong++ < 5) fprintf(stderr, "truncated to %zu: %s\n", len, d.msg);
    if (len < n && len >= n - sizeof data) CHECK(strstr(d.msg, "truncated: tensor") != NULL);
    if (st) check_good(st, data);
    fmt_st_close(st);
  }
  CHECKF(wrong == 0, "%d of %zu truncations misjudged", wrong, n + 1);
  free(buf);
}

/* Overwrites every byte of the valid file with a few values; open must never crash, and
 * whatever it accepts must describe tensors that lie inside the file. */
static void test_byte_mutations(void) {
  static const uint8_t k_vals[] = {0x00, 0xff, '"', '}', ']', '9', '-', ',', '.', 'e'};
  uint8_t data[40];
  good_data(data);
  size_t n;
  uint8_t *buf = build_st(k_good_header, data, sizeof data, &n);
  const char *p = tmp_path("mut.safetensors");
  size_t accepted = 0, bad = 0;
  for (size_t i = 0; i < n - sizeof data; i++) {
    for (size_t v = 0; v < sizeof k_vals; v++) {
      uint8_t keep = buf[i];
      buf[i] = k_vals[v];
      write_bytes(p, buf, n);
      buf[i] = keep;
      ir_diag d = {0};
      fmt_st *st = NULL;
      ir_status s = fmt_st_open(p, &st, &d);
      if (s != IR_OK && (st || !d.msg[0])) bad++;
      if (s != IR_OK) continue;
      accepted++;
      uint64_t sum = 0;
      for (size_t k = 0; k < fmt_st_count(st); k++) {
        const fmt_st_tensor *t = fmt_st_get(st, k);
        for (uint64_t j = 0; j < t->nbytes; j++) sum += ((const uint8_t *)t->data)[j];
      }
      (void)sum;
      fmt_st_close(st);
    }
  }
  CHECK(bad == 0);
  CHECK(accepted > 0); /* e.g. edits inside metadata strings stay valid */
  free(buf);
}

int main(void) {
  make_dir(TEST_TMP_DIR);
  make_dir(ST_DIR);
  test_valid_file();
  test_single_dir();
  test_sharded();
  test_sharded_bad();
  test_bad_lengths();
  test_bad_json();
  test_bad_entries();
  test_bad_offsets();
  test_edge_valid();
  test_many_tensors();
  test_every_truncation();
  test_byte_mutations();
  return tcheck_done("safetensors");
}
