/* cli_batch: `inferrt batch` — offline OpenAI batch-style jobs. Each input line is
 * {"custom_id", "method", "url", "body"}; each output line is {"id", "custom_id",
 * "response": {"status_code", "request_id", "body"}, "error"}. Lines run through the engine
 * concurrently (a bounded number in flight). Nothing accepted is lost or done twice:
 * - one run at a time writes an output: OUT.lock is held (flock) for the whole run;
 * - every finished result is appended as one whole line with one write(2), and the output
 *   is fsynced every --sync-every lines and at exit, so a killed run (or machine) loses at
 *   most the lines since the last sync, which the rerun does again;
 * - a rerun reads the output first and keeps only whole result lines, one per custom_id:
 *   a torn or garbage line anywhere (not only the last), a duplicate, and with --retry-failed
 *   a failed result, are dropped by rewriting the output (a temporary file, fsynced, renamed
 *   over it), and their requests run again.
 * Bad lines give error results, never a crash. */
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_batch.h"
#include "openai.h"

typedef struct batch_args {
  const char *plan, *input, *output, *model_name, *chat_template, *device;
  int64_t concurrency, threads, kv_tokens, max_batched, sync_every;
  bool no_progress, no_cuda_graphs, retry_failed, allow_special;
  irt_kv_dtype kv_dtype;
  irt_engine_opts spec; /* the --spec-* fields; the engine's options start from it */
  cli_cuda cuda;
  /* mpirun with a one-rank plan: this rank runs lines shard_rank, + shard_n, ... into its
   * own output (output is then OUT.rankR-of-N) and merged is OUT, whose results count as
   * done; rank 0 merges the shards into it in input order at the end */
  int shard_rank, shard_n;
  const char *merged;
} batch_args;

/* A set of strings (open addressing; grows at half load). */
typedef struct strset {
  char **slot;
  size_t cap, n;
} strset;

typedef struct batch {
  srv_ctx c;
  char **lines;     /* (n_lines) pointers into buf, NUL-terminated */
  int64_t *line_no; /* (n_lines) 1-based line numbers in the input */
  int64_t n_lines;
  atomic_int_fast64_t next; /* next line to take */
  atomic_int_fast64_t ok, failed, skipped, finished, prompt_tokens, gen_tokens;
  pthread_mutex_t mu; /* guards done and the output fd */
  strset done;
  int out_fd;
  int64_t unsynced, sync_every; /* lines written since the last fsync; its period */
  bool write_failed;
} batch;

static int usage(FILE *f) {
  fputs("usage: inferrt batch model.plan --input IN.jsonl --output OUT.jsonl [options]\n\n"
        "  --input FILE            requests, one JSON object a line:\n"
        "                          {\"custom_id\", \"method\": \"POST\", \"url\": "
        "\"/v1/chat/completions\"\n"
        "                          or \"/v1/completions\", \"body\": {...}}\n"
        "  --output FILE           results, appended; custom_ids already there are skipped\n"
        "                          (one run at a time: FILE.lock is held while it runs)\n"
        "  --retry-failed          run again the lines whose result in the output is an error\n"
        "  --sync-every N          fsync the output every N result lines (default 64; always at\n"
        "                          exit): a crash loses at most that many, which a rerun redoes\n"
        "  --allow-special-in-content\n"
        "                          parse special tokens spelled in chat messages (default: text)\n"
        "  --concurrency N         requests in flight (default: the plan's sequences per step)\n"
        "  --model-name NAME       the model id in responses (default: the plan's file name)\n"
        "  --chat-template NAME    chatml, qwen3, deepseek-r1, llama3, llama3.1, mistral, llama2,\n"
        "                          gemma or phi3\n"
        "  --kv-tokens N           KV cache capacity in tokens, over all requests (default: one\n"
        "                          context length; raise it to run many requests at once)\n"
        "  --kv-dtype T            " CLI_KV_DTYPE_USAGE "\n"
        "  --max-batched-tokens N  token budget per step (default: the plan's)\n"
        "  --threads N             CPU threads (default: all cores)\n"
        "  --device DEV            cpu or cuda (default: the plan's target)\n"
        "  --no-cuda-graphs        CUDA: run decode steps kernel by kernel\n" CLI_CUDA_USAGE
            CLI_SPEC_USAGE "  --no-progress           no progress output\n",
        f);
  return f == stderr ? 2 : 0;
}

static int parse(int argc, char **argv, batch_args *a) {
  static const struct option longs[] = {{"input", 1, 0, 1},
                                        {"output", 1, 0, 2},
                                        {"concurrency", 1, 0, 3},
                                        {"model-name", 1, 0, 4},
                                        {"chat-template", 1, 0, 5},
                                        {"kv-tokens", 1, 0, 6},
                                        {"max-batched-tokens", 1, 0, 7},
                                        {"threads", 1, 0, 8},
                                        {"no-progress", 0, 0, 9},
                                        {"device", 1, 0, 10},
                                        {"no-cuda-graphs", 0, 0, 11},
                                        {"kv-dtype", 1, 0, 12},
                                        {"spec-tokens", 1, 0, 13},
                                        {"spec-ngram", 1, 0, 14},
                                        {"spec-always", 0, 0, 15},
                                        {"retry-failed", 0, 0, 16},
                                        {"sync-every", 1, 0, 17},
                                        {"allow-special-in-content", 0, 0, 18},
                                        CLI_DRAFT_LONGOPT,
                                        CLI_CUDA_LONGOPTS,
                                        {"help", 0, 0, 'h'},
                                        {0, 0, 0, 0}};
  int c;
  bool ok = true;
  while (ok && (c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    int rc = cli_cuda_flag(c, optarg, &a->cuda);
    if (rc > 0) return rc;
    if (rc == 0) continue;
    switch (c) {
    case 1: a->input = optarg; break;
    case 2: a->output = optarg; break;
    case 3: ok = cli_parse_i64(optarg, 1, 4096, &a->concurrency); break;
    case 4: a->model_name = optarg; break;
    case 5: a->chat_template = optarg; break;
    case 6: ok = cli_parse_i64(optarg, 1, (int64_t)1 << 40, &a->kv_tokens); break;
    case 7: ok = cli_parse_i64(optarg, 1, 1 << 20, &a->max_batched); break;
    case 8: ok = cli_parse_i64(optarg, 0, 4096, &a->threads); break;
    case 9: a->no_progress = true; break;
    case 10: a->device = optarg; break;
    case 11: a->no_cuda_graphs = true; break;
    case 12:
      if (cli_parse_kv_dtype(optarg, &a->kv_dtype)) return 1;
      break;
    case 13:
    case 14:
    case 15:
      if (cli_parse_spec(longs[c - 1].name, optarg, &a->spec)) return 1;
      break;
    case 16: a->retry_failed = true; break;
    case 17: ok = cli_parse_i64(optarg, 0, (int64_t)1 << 40, &a->sync_every); break;
    case 18: a->allow_special = true; break;
    case 'h': return usage(stdout) - 1;
    default: return usage(stderr);
    }
    if (!ok) return cli_fail("bad value for --%s: '%s'", longs[c - 1].name, optarg);
  }
  if (optind != argc - 1) return usage(stderr);
  if (!a->input || !a->output) return cli_fail("batch needs --input and --output");
  a->plan = argv[optind];
  return 0;
}

/* --- the set of finished custom_ids ------------------------------------------------------ */

static uint64_t str_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
  return h;
}

/* Adds s (copied); false if it was there already (or on OOM). */
static bool strset_add(strset *st, const char *s) {
  if (2 * (st->n + 1) > st->cap) {
    strset big = {.cap = st->cap ? st->cap * 2 : 64};
    if (!(big.slot = calloc(big.cap, sizeof *big.slot))) return false;
    for (size_t i = 0; i < st->cap; i++)
      if (st->slot[i]) {
        size_t k = str_hash(st->slot[i]) & (big.cap - 1);
        while (big.slot[k]) k = (k + 1) & (big.cap - 1);
        big.slot[k] = st->slot[i];
      }
    free(st->slot);
    big.n = st->n;
    *st = big;
  }
  size_t k = str_hash(s) & (st->cap - 1);
  for (; st->slot[k]; k = (k + 1) & (st->cap - 1))
    if (!strcmp(st->slot[k], s)) return false;
  if (!(st->slot[k] = strdup(s))) return false;
  st->n++;
  return true;
}

static void strset_free(strset *st) {
  for (size_t i = 0; i < st->cap; i++) free(st->slot[i]);
  free(st->slot);
}

/* --- files ---------------------------------------------------------------------------------- */

const char *batch_result_id(const cJSON *o, bool *failed) {
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "custom_id");
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "response");
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
  const cJSON *code = cJSON_GetObjectItemCaseSensitive(r, "status_code");
  if (!cJSON_IsObject(o) || !cJSON_IsString(id) || !id->valuestring[0]) return NULL;
  bool ok = cJSON_IsObject(r) && cJSON_IsNumber(code) &&
            cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(r, "body"));
  if (!ok && !cJSON_IsObject(e)) return NULL; /* neither a response nor an error */
  *failed = !ok || code->valueint != 200;
  return id->valuestring;
}

/* Writes all of buf[0..len) to fd, retrying short and interrupted writes. */
static bool write_all(int fd, const char *buf, size_t len) {
  for (size_t off = 0; off < len;) {
    ssize_t w = write(fd, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += (size_t)w;
  }
  return true;
}

/* Writes buf[0..len) as path's new content: a temporary file beside it, fsynced, renamed over
 * it, the directory fsynced, so a crash leaves the old or the new file, never a mix. */
static bool replace_file(const char *path, const char *buf, size_t len) {
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return errno = ENAMETOOLONG, false;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = write_all(fd, buf, len) && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  ok = ok && rename(tmp, path) == 0;
  if (!ok) {
    unlink(tmp);
    return false;
  }
  char dir[4200];
  const char *slash = strrchr(path, '/');
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) fsync(dfd), close(dfd);
  return true;
}

/* Reads the results already written and records their custom_ids as done. Lines that are not
 * whole results (torn by a kill, garbage), repeated custom_ids and, with retry_failed, failed
 * results are dropped by rewriting the output; their requests run again. */
static bool load_done(batch *b, const char *path, bool retry_failed) {
  size_t len = 0;
  char *buf = cli_read_file(path, &len);
  if (!buf) return errno == ENOENT;
  char *keep = malloc(len + 1);
  if (!keep) return free(buf), errno = ENOMEM, false;
  size_t kept = 0, start = 0;
  int64_t torn = 0, dup = 0, retried = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && buf[i] != '\n') continue;
    if (i == start) { /* an empty line */
      start = i + 1;
      continue;
    }
    bool whole = i < len; /* the last line without its newline was cut short */
    if (whole) buf[i] = '\0';
    cJSON *o = whole ? cJSON_ParseWithLength(buf + start, i - start) : NULL;
    bool failed = false;
    const char *id = batch_result_id(o, &failed);
    if (!id) torn++;
    else if (retry_failed && failed) retried++;
    else if (!strset_add(&b->done, id)) dup++;
    else {
      memcpy(keep + kept, buf + start, i - start);
      kept += i - start;
      keep[kept++] = '\n';
    }
    cJSON_Delete(o);
    start = i + 1;
  }
  bool ok = true;
  if (kept < len) {
    fprintf(stderr,
            "inferrt: batch: %s: dropping %lld torn or garbage, %lld duplicate and %lld "
            "failed lines (their requests run again)\n",
            path, (long long)torn, (long long)dup, (long long)retried);
    ok = replace_file(path, keep, kept);
  }
  free(keep);
  free(buf);
  return ok;
}

/* Takes PATH.lock (created if absent) for the whole run: a second run on the same output
 * would append the same requests' results again. */
static int lock_output(const char *path) {
  char lock[4200];
  if (snprintf(lock, sizeof lock, "%s.lock", path) >= (int)sizeof lock) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    close(fd);
    errno = e == EWOULDBLOCK ? EBUSY : e;
    return -1;
  }
  return fd;
}

/* Splits the input into lines (blank ones dropped); the buffer is kept by the caller. */
static bool split_lines(batch *b, char *buf, size_t len) {
  int64_t cap = 0, no = 0;
  for (size_t start = 0, i = 0; i <= len; i++) {
    if (i < len && buf[i] != '\n') continue;
    buf[i] = '\0';
    char *s = buf + start;
    start = i + 1;
    no++;
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    if (!*s) continue;
    if (b->n_lines == cap) {
      cap = cap ? cap * 2 : 1024;
      char **p = realloc(b->lines, (size_t)cap * sizeof *p);
      if (p) b->lines = p;
      int64_t *q = p ? realloc(b->line_no, (size_t)cap * sizeof *q) : NULL;
      if (q) b->line_no = q;
      if (!p || !q) return false;
    }
    b->line_no[b->n_lines] = no;
    b->lines[b->n_lines++] = s;
  }
  return true;
}

/* Appends one result line with one write(2) (retrying short writes). */
static void write_line(batch *b, cJSON *o) {
  char *s = cJSON_PrintUnformatted(o);
  size_t n = s ? strlen(s) : 0;
  char *line = s ? realloc(s, n + 2) : NULL;
  if (!line) {
    free(s);
    b->write_failed = true;
    return;
  }
  line[n++] = '\n';
  pthread_mutex_lock(&b->mu);
  if (!b->write_failed && !write_all(b->out_fd, line, n)) b->write_failed = true;
  if (b->sync_every > 0 && ++b->unsynced >= b->sync_every) { /* durable every N lines */
    if (fdatasync(b->out_fd) != 0) b->write_failed = true;
    b->unsynced = 0;
  }
  pthread_mutex_unlock(&b->mu);
  free(line);
}

/* --- one line ------------------------------------------------------------------------------ */

static void emit(batch *b, const char *custom_id, int status, cJSON *body, const char *request_id,
                 const char *err_code, const char *err_msg) {
  char id[48];
  uint64_t x = b->c.id_salt ^ (atomic_fetch_add(&b->c.next_id, 1) * 0x9e3779b97f4a7c15ull);
  snprintf(id, sizeof id, "batch_req_%016llx",
           (unsigned long long)((x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull));
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", id);
  cJSON_AddStringToObject(o, "custom_id", custom_id);
  if (body) {
    cJSON *r = cJSON_AddObjectToObject(o, "response");
    cJSON_AddNumberToObject(r, "status_code", status);
    cJSON_AddStringToObject(r, "request_id", request_id ? request_id : id);
    cJSON_AddItemToObject(r, "body", body);
    cJSON_AddNullToObject(o, "error");
  } else {
    cJSON_AddNullToObject(o, "response");
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", err_code);
    cJSON_AddStringToObject(e, "message", err_msg);
  }
  write_line(b, o);
  cJSON_Delete(o);
  atomic_fetch_add(status == 200 ? &b->ok : &b->failed, 1);
}

static cJSON *error_body(const srv_error *e) {
  char *s = srv_render_error(e);
  cJSON *o = s ? cJSON_Parse(s) : NULL;
  free(s);
  return o ? o : cJSON_CreateObject();
}

/* Runs a request body to completion; 429 from a full engine queue is retried. */
static void run_request(batch *b, const char *custom_id, srv_endpoint ep, cJSON *body) {
  srv_params p;
  srv_error e;
  if (!srv_params_from_json(&b->c, ep, body, &p, &e)) {
    emit(b, custom_id, e.status, error_body(&e), NULL, NULL, NULL);
    return;
  }
  srv_job *j;
  while (!(j = srv_job_submit(&b->c, &p, &e)) && e.status == 429) usleep(2000);
  if (!j) {
    srv_params_free(&p);
    emit(b, custom_id, e.status, error_body(&e), NULL, NULL, NULL);
    return;
  }
  while (!srv_job_wait(j, 1000)) {}
  if (j->failed) {
    srv_fail(&e, 500, "server_error", NULL, NULL,
             "The engine failed while generating this response.");
    emit(b, custom_id, 500, error_body(&e), j->id, NULL, NULL);
  } else {
    atomic_fetch_add(&b->prompt_tokens, j->prompt_tokens);
    for (int i = 0; i < j->p.n; i++) atomic_fetch_add(&b->gen_tokens, j->ch[i].n_gen);
    emit(b, custom_id, 200, srv_render_response(j), j->id, NULL, NULL);
  }
  srv_job_release(j);
}

batch_verdict batch_line_read(const char *line, int64_t line_no, batch_line *l) {
  memset(l, 0, sizeof *l);
  snprintf(l->fallback, sizeof l->fallback, "line-%lld", (long long)line_no);
  l->o = cJSON_Parse(line);
  const cJSON *cid = cJSON_GetObjectItemCaseSensitive(l->o, "custom_id");
  bool has_id = cJSON_IsString(cid) && cid->valuestring[0];
  l->id = has_id ? cid->valuestring : l->fallback;
  const cJSON *method = cJSON_GetObjectItemCaseSensitive(l->o, "method");
  const cJSON *url = cJSON_GetObjectItemCaseSensitive(l->o, "url");
  cJSON *body = cJSON_GetObjectItemCaseSensitive(l->o, "body");
  if (!l->o) {
    l->code = "invalid_json_line", l->msg = "the line is not valid JSON";
    return BATCH_LINE_ERROR;
  }
  if (!cJSON_IsObject(l->o) || !has_id) {
    l->code = "missing_custom_id", l->msg = "the line needs a non-empty string 'custom_id'";
    return BATCH_LINE_ERROR;
  }
  if (!cJSON_IsString(url) || (strcmp(url->valuestring, "/v1/completions") &&
                               strcmp(url->valuestring, "/v1/chat/completions"))) {
    srv_fail(&l->e, 404, "invalid_request_error", "unknown_url", "url",
             "Unknown request URL: %.200s.", cJSON_IsString(url) ? url->valuestring : "(none)");
    return BATCH_REFUSED;
  }
  if (!cJSON_IsString(method) || strcmp(method->valuestring, "POST")) {
    srv_fail(&l->e, 405, "invalid_request_error", "method_not_allowed", "method",
             "The method must be POST.");
    return BATCH_REFUSED;
  }
  if (!cJSON_IsObject(body)) {
    srv_bad(&l->e, "body", "The line needs a JSON object 'body'.");
    return BATCH_REFUSED;
  }
  cJSON_DeleteItemFromObjectCaseSensitive(body, "stream"); /* batch results are whole */
  cJSON_DeleteItemFromObjectCaseSensitive(body, "stream_options");
  l->ep = strcmp(url->valuestring, "/v1/completions") ? SRV_CHAT : SRV_COMPLETIONS;
  l->body = body;
  return BATCH_RUN;
}

static void run_line(batch *b, int64_t k) {
  batch_line l;
  batch_verdict v = batch_line_read(b->lines[k], b->line_no[k], &l);
  pthread_mutex_lock(&b->mu);
  bool fresh = strset_add(&b->done, l.id);
  pthread_mutex_unlock(&b->mu);
  if (!fresh) {
    atomic_fetch_add(&b->skipped, 1);
    cJSON_Delete(l.o);
    return;
  }
  switch (v) {
  case BATCH_LINE_ERROR: emit(b, l.id, 0, NULL, NULL, l.code, l.msg); break;
  case BATCH_REFUSED: emit(b, l.id, l.e.status, error_body(&l.e), NULL, NULL, NULL); break;
  case BATCH_RUN: run_request(b, l.id, l.ep, l.body); break;
  }
  atomic_fetch_add(&b->finished, 1);
  cJSON_Delete(l.o);
}

static void *worker(void *arg) {
  batch *b = arg;
  for (int64_t k; (k = atomic_fetch_add(&b->next, 1)) < b->n_lines;) run_line(b, k);
  return NULL;
}

/* --- progress ------------------------------------------------------------------------------- */

static void progress(batch *b, double t0, bool tty, bool final) {
  int64_t ran = atomic_load(&b->finished), skipped = atomic_load(&b->skipped);
  int64_t done = ran + skipped, total = b->n_lines;
  double secs = (cli_now_ms() - t0) / 1e3, rate = secs > 0 ? (double)ran / secs : 0;
  if (tty) {
    char bar[31];
    int fill = total ? (int)(30 * done / total) : 30;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '-';
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %lld/%lld (%lld skipped)  %.1f req/s  ETA %.0fs   ", bar,
            (long long)done, (long long)total, (long long)skipped, rate,
            rate > 0 ? (double)(total - done) / rate : 0.0);
    if (final) fputc('\n', stderr);
  } else {
    fprintf(stderr, "inferrt: batch: %lld/%lld lines done (%lld skipped), %.1f req/s\n",
            (long long)done, (long long)total, (long long)skipped, rate);
  }
  if (final) {
    irt_engine_stats st;
    irt_engine_get_stats(b->c.e, &st);
    fprintf(stderr, "inferrt: batch: %lld tokens generated in %.2f s (%.1f tok/s), %lld steps\n",
            (long long)st.generated_tokens, secs, secs > 0 ? (double)st.generated_tokens / secs : 0,
            (long long)st.steps);
    if (st.spec_draft_tokens)
      fprintf(stderr, "inferrt: batch: speculation: %lld draft tokens, %lld kept (%.1f%%)\n",
              (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens,
              100.0 * (double)st.spec_accepted_tokens / (double)st.spec_draft_tokens);
  }
  fflush(stderr);
}

static void watch(batch *b, double t0, bool show) {
  bool tty = isatty(STDERR_FILENO);
  double last = cli_now_ms();
  int64_t last_done = -1;
  while (atomic_load(&b->finished) + atomic_load(&b->skipped) < b->n_lines) {
    usleep(50000);
    double now = cli_now_ms();
    int64_t done = atomic_load(&b->finished) + atomic_load(&b->skipped);
    bool due = tty ? now - last >= 200 : (now - last >= 2000 && done != last_done);
    if (show && due) progress(b, t0, tty, false), last = now, last_done = done;
  }
  if (show) progress(b, t0, tty, true);
}

static int run_batch(batch *b, const batch_args *a) {
  size_t len = 0;
  char *buf = cli_read_file(a->input, &len);
  if (!buf) return cli_fail("%s: %s", a->input, strerror(errno));
  int lock = lock_output(a->output);
  if (lock < 0) {
    free(buf);
    return errno == EBUSY ? cli_fail("%s: another batch run is writing it (%s.lock is held)",
                                     a->output, a->output)
                          : cli_fail("%s.lock: %s", a->output, strerror(errno));
  }
  bool pre = true; /* the merged output's results (rank 0 has cleaned it first) */
  if (a->merged && a->shard_rank == 0) pre = load_done(b, a->merged, a->retry_failed);
  if (a->merged && cli_dist_barrier()) pre = false;
  if (a->merged && a->shard_rank > 0 && pre) pre = load_done(b, a->merged, false);
  if (!pre || !split_lines(b, buf, len) || !load_done(b, a->output, a->retry_failed)) {
    free(buf);
    close(lock);
    return cli_fail("%s: %s", a->output, strerror(errno));
  }
  if (a->shard_n > 1) { /* this rank's lines: every shard_n-th from shard_rank */
    int64_t k = 0;
    for (int64_t i = a->shard_rank; i < b->n_lines; i += a->shard_n, k++)
      b->lines[k] = b->lines[i], b->line_no[k] = b->line_no[i];
    b->n_lines = k;
  }
  b->sync_every = a->sync_every;
  b->out_fd = open(a->output, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (b->out_fd < 0) {
    free(buf);
    close(lock);
    return cli_fail("%s: %s", a->output, strerror(errno));
  }
  int n_workers = (int)(a->concurrency > 0 ? a->concurrency : b->c.max_n);
  pthread_t *th = calloc((size_t)n_workers, sizeof *th);
  double t0 = cli_now_ms();
  int started = 0;
  while (th && started < n_workers && pthread_create(&th[started], NULL, worker, b) == 0) started++;
  watch(b, t0, !a->no_progress && started > 0);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  double secs = (cli_now_ms() - t0) / 1e3;
  if (fsync(b->out_fd) != 0) b->write_failed = true; /* everything written is durable */
  close(b->out_fd);
  close(lock);
  free(th);
  free(buf);
  if (!started) return cli_fail("cannot start worker threads");
  int64_t ok = atomic_load(&b->ok), failed = atomic_load(&b->failed),
          gen = atomic_load(&b->gen_tokens);
  printf(
      "inferrt: batch: %lld requests in %.2f s: %lld ok, %lld failed, %lld skipped (already done); "
      "%.2f req/s, %lld prompt + %lld generated tokens (%.1f generated tok/s)\n",
      (long long)(ok + failed), secs, (long long)ok, (long long)failed,
      (long long)atomic_load(&b->skipped), secs > 0 ? (double)(ok + failed) / secs : 0,
      (long long)atomic_load(&b->prompt_tokens), (long long)gen, secs > 0 ? (double)gen / secs : 0);
  return b->write_failed ? cli_fail("%s: writing results failed", a->output) : 0;
}

/* A result line of a shard, by custom_id. */
typedef struct result_ref {
  char *id;
  const char *line;
  size_t len;
} result_ref;

static int cmp_ref(const void *x, const void *y) {
  return strcmp(((const result_ref *)x)->id, ((const result_ref *)y)->id);
}

/* Reads the shard outputs' results (each line whole: a shard run kept only whole ones);
 * *bufs keeps their text. */
static bool read_shards(const batch_args *a, char **bufs, result_ref **out, size_t *n_out) {
  size_t n = 0, cap = 0;
  result_ref *refs = NULL;
  for (int r = 0; r < a->shard_n; r++) {
    char path[4200];
    snprintf(path, sizeof path, "%s.rank%d-of-%d", a->merged, r, a->shard_n);
    size_t len = 0;
    bufs[r] = cli_read_file(path, &len);
    if (!bufs[r] && errno != ENOENT) {
      for (size_t i = 0; i < n; i++) free(refs[i].id);
      free(refs);
      return false;
    }
    for (size_t start = 0, i = 0; bufs[r] && i < len; i++) {
      if (bufs[r][i] != '\n') continue;
      cJSON *o = cJSON_ParseWithLength(bufs[r] + start, i - start);
      bool failed;
      const char *id = batch_result_id(o, &failed);
      if (id && n == cap) {
        cap = cap ? cap * 2 : 1024;
        result_ref *p = realloc(refs, cap * sizeof *p);
        if (!p) {
          cJSON_Delete(o);
          for (size_t k = 0; k < n; k++) free(refs[k].id);
          free(refs);
          return false;
        }
        refs = p;
      }
      if (id && (refs[n].id = strdup(id)))
        refs[n].line = bufs[r] + start, refs[n].len = i - start + 1, n++;
      cJSON_Delete(o);
      start = i + 1;
    }
  }
  qsort(refs, n, sizeof *refs, cmp_ref);
  *out = refs, *n_out = n;
  return true;
}

/* Rank 0, after every rank's run: the shards' results appended to the merged output in
 * input order (those it already holds skipped), made durable, then the shards removed. A
 * line without a result leaves the shards in place and fails: a rerun redoes it. */
static int merge_shards(const batch_args *a) {
  batch *in = calloc(1, sizeof *in), *have = calloc(1, sizeof *have);
  char **bufs = calloc((size_t)a->shard_n, sizeof *bufs);
  size_t len = 0, n_refs = 0, n_out = 0, cap = 0;
  result_ref *refs = NULL;
  char *text = in && have && bufs ? cli_read_file(a->input, &len) : NULL, *out = NULL;
  bool ok = text && split_lines(in, text, len) && load_done(have, a->merged, false) &&
            read_shards(a, bufs, &refs, &n_refs);
  int64_t merged = 0, missing = 0;
  for (int64_t k = 0; ok && k < in->n_lines; k++) {
    batch_line l;
    batch_line_read(in->lines[k], in->line_no[k], &l);
    if (strset_add(&have->done, l.id)) {
      result_ref key = {.id = (char *)l.id};
      result_ref *r = bsearch(&key, refs, n_refs, sizeof *refs, cmp_ref);
      if (!r) missing++;
      else if (n_out + r->len > cap) {
        cap = (n_out + r->len) * 2;
        char *p = realloc(out, cap);
        ok = p != NULL;
        out = p ? p : out;
      }
      if (r && ok) memcpy(out + n_out, r->line, r->len), n_out += r->len, merged++;
    }
    cJSON_Delete(l.o);
  }
  int fd = ok ? open(a->merged, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
  ok = ok && fd >= 0 && write_all(fd, out, n_out) && fsync(fd) == 0;
  if (fd >= 0) close(fd);
  for (int r = 0; ok && !missing && r < a->shard_n; r++) {
    char path[4200];
    snprintf(path, sizeof path, "%s.rank%d-of-%d", a->merged, r, a->shard_n);
    unlink(path);
    strncat(path, ".lock", sizeof path - strlen(path) - 1);
    unlink(path);
  }
  if (ok)
    fprintf(stderr, "inferrt: batch: merged %lld results of %d ranks into %s in input order\n",
            (long long)merged, a->shard_n, a->merged);
  for (size_t i = 0; i < n_refs; i++) free(refs[i].id);
  for (int r = 0; bufs && r < a->shard_n; r++) free(bufs[r]);
  free(refs), free(bufs), free(out), free(text);
  if (in) free(in->lines), free(in->line_no), strset_free(&in->done);
  if (have) free(have->lines), free(have->line_no), strset_free(&have->done);
  free(in), free(have);
  if (!ok) return cli_fail("%s: merging the ranks' results failed", a->merged);
  if (missing)
    return cli_fail("%s: %lld lines have no result in the ranks' outputs (kept: a rerun "
                    "redoes them)",
                    a->merged, (long long)missing);
  return 0;
}

int cmd_batch(int argc, char **argv) {
  batch_args a = {.sync_every = 64};
  int rc = parse(argc, argv, &a);
  if (rc) return rc < 0 ? 0 : rc;
  char shard[4200];
  int merge_lock = -1;
  a.shard_n = cli_dist_data_parallel(a.plan, &a.shard_rank);
  if (a.shard_n > 1) { /* mpirun with a one-rank plan: a share of the lines each */
    if (snprintf(shard, sizeof shard, "%s.rank%d-of-%d", a.output, a.shard_rank, a.shard_n) >=
        (int)sizeof shard)
      return cli_fail("%s: path too long", a.output);
    a.merged = a.output, a.output = shard;
    if (a.shard_rank == 0 && (merge_lock = lock_output(a.merged)) < 0)
      return cli_fail("%s: another batch run is writing it (or %s)", a.merged, strerror(errno));
  }
  batch *b = calloc(1, sizeof *b);
  if (!b) return cli_fail("out of memory");
  pthread_mutex_init(&b->mu, NULL);
  irt_model_opts mo = irt_model_opts_default();
  mo.n_threads = (int)a.threads;
  mo.kv_tokens = a.kv_tokens;
  mo.device = a.device;
  mo.no_cuda_graphs = a.no_cuda_graphs;
  if (cli_model_opts(&mo, &a.cuda)) return 1;
  mo.kv_dtype = a.kv_dtype;
  srv_ctx *c = &b->c;
  c->chat_template = a.chat_template;
  c->allow_special = a.allow_special;
  c->created = (int64_t)time(NULL);
  c->id_salt = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
  irt_error err = {0};
  irt_status st = cli_model_open(a.plan, &mo, &c->m, &err);
  irt_model *draft = NULL;
  if (st == IRT_OK) {
    c->info = irt_model_get_info(c->m);
    c->tok = irt_model_get_tokenizer(c->m);
    c->max_n = c->info->max_step_seqs < c->info->max_step_logits ? c->info->max_step_seqs
                                                                 : c->info->max_step_logits;
    int64_t workers = a.concurrency > 0 ? a.concurrency : c->max_n;
    irt_engine_opts eo = a.spec; /* the --spec-* fields, then the rest */
    eo.max_batched_tokens = a.max_batched, eo.max_waiting = workers + 1;
    st = cli_open_draft(c->m, &mo, &eo, &draft, &err);
    if (st == IRT_OK) st = irt_engine_create(c->m, &eo, &c->e, &err);
  }
  if (st == IRT_OK) st = irt_engine_start(c->e, &err);
  if (st == IRT_OK) {
    const char *base = strrchr(a.plan, '/') ? strrchr(a.plan, '/') + 1 : a.plan;
    size_t n = strlen(base);
    snprintf(c->model_name, sizeof c->model_name, "%.*s",
             (int)(n > 5 && !strcmp(base + n - 5, ".plan") ? n - 5 : n), base);
    if (a.model_name) snprintf(c->model_name, sizeof c->model_name, "%s", a.model_name);
    rc = run_batch(b, &a);
  } else {
    rc = cli_fail("%s", err.msg[0] ? err.msg : irt_status_name(st));
  }
  irt_engine_destroy(c->e);
  irt_model_close(draft);
  cli_model_close(c->m);
  if (a.shard_n > 1 && rc) cli_dist_abort(rc); /* the other ranks would wait at the merge */
  if (a.shard_n > 1 && cli_dist_barrier()) rc = cli_fail("the ranks could not meet to merge");
  if (a.shard_n > 1 && a.shard_rank == 0 && !rc) rc = merge_shards(&a);
  if (merge_lock >= 0) close(merge_lock);
  strset_free(&b->done);
  free(b->lines);
  free(b->line_no);
  pthread_mutex_destroy(&b->mu);
  free(b);
  return rc;
}
