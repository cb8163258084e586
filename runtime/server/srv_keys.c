/* srv_keys: API keys, each mapped to a tenant (its own prefix-cache domain) and a priority
 * class. Keys come from --api-key flags or a file of "key [tenant [priority]]" lines. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "srv.h"

irt_status srv_keys_add(srv_keys *ks, const char *key, const char *tenant, int priority) {
  if (ks->n == ks->cap) {
    int cap = ks->cap ? ks->cap * 2 : 8;
    srv_key *k = realloc(ks->k, (size_t)cap * sizeof *k);
    if (!k) return IRT_OOM;
    ks->k = k, ks->cap = cap;
  }
  srv_key *k = &ks->k[ks->n];
  k->key = strdup(key);
  k->tenant = tenant ? strdup(tenant) : NULL;
  k->priority = priority;
  if (!k->key || (tenant && !k->tenant)) {
    free(k->key);
    free(k->tenant);
    return IRT_OOM;
  }
  ks->n++;
  return IRT_OK;
}

static irt_status parse_line(srv_keys *ks, char *line, int lineno, const char *path,
                             irt_error *err) {
  char *hash = strchr(line, '#');
  if (hash) *hash = '\0';
  char *save = NULL, *key = strtok_r(line, " \t\r\n", &save);
  if (!key) return IRT_OK;
  char *tenant = strtok_r(NULL, " \t\r\n", &save), *prio = strtok_r(NULL, " \t\r\n", &save);
  char *extra = strtok_r(NULL, " \t\r\n", &save), *end = NULL;
  long p = 0;
  if (prio) {
    errno = 0;
    p = strtol(prio, &end, 10);
    if (*end || errno || p < -1000000 || p > 1000000)
      return srv_errorf(err, IRT_INVALID_ARG, "%s:%d: priority '%s' is not an integer", path,
                        lineno, prio);
  }
  if (extra)
    return srv_errorf(err, IRT_INVALID_ARG, "%s:%d: expected 'key [tenant [priority]]'", path,
                      lineno);
  if (srv_keys_find(ks, key))
    return srv_errorf(err, IRT_INVALID_ARG, "%s:%d: duplicate key", path, lineno);
  if (srv_keys_add(ks, key, tenant, (int)p) != IRT_OK)
    return srv_errorf(err, IRT_OOM, "out of memory");
  return IRT_OK;
}

irt_status srv_keys_load(srv_keys *ks, const char *path, irt_error *err) {
  FILE *f = irt_file_open(path, err); /* regular files only: a FIFO would hang the start */
  if (!f) return err ? err->status : IRT_IO;
  char *line = NULL;
  size_t n = 0;
  int lineno = 0;
  irt_status st = IRT_OK;
  while (st == IRT_OK && getline(&line, &n, f) >= 0) st = parse_line(ks, line, ++lineno, path, err);
  free(line);
  fclose(f);
  return st;
}

/* Equal in time that depends only on the lengths, not on where they differ. */
static bool same_key(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  unsigned char d = la != lb;
  for (size_t i = 0; i < la && i < lb; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

const srv_key *srv_keys_find(const srv_keys *ks, const char *key) {
  const srv_key *hit = NULL;
  for (int i = 0; ks && i < ks->n; i++)
    if (same_key(ks->k[i].key, key) && !hit) hit = &ks->k[i];
  return hit;
}

void srv_keys_free(srv_keys *ks) {
  for (int i = 0; i < ks->n; i++) {
    free(ks->k[i].key);
    free(ks->k[i].tenant);
  }
  free(ks->k);
  *ks = (srv_keys){0};
}
