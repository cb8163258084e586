/* fuzz_util: helpers the libFuzzer targets share. Most parsers under test take a path, so
 * an input's bytes go to a file in a private directory ($TMPDIR/infc-fuzz-XXXXXX, made once
 * per process and removed at a normal exit; tools/fuzz points TMPDIR at a directory of its
 * own, so what a crashed run leaves goes too); the file is kept open and rewritten in place (pwrite
 * + ftruncate) on every run. FUZZ_FIXTURES (set by tools/fuzz) is the absolute path of
 * tests/fixtures; FUZZ_VERBOSE=1 in the environment makes the targets say where an input was
 * refused (fz_note). */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FUZZ_FIXTURES
#define FUZZ_FIXTURES "tests/fixtures"
#endif

/* The libFuzzer entry points (the targets define the first, some the second). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FZ_MAX_FILES 4

static char fz_dir[4096];
static struct {
  char path[4200];
  int fd;
} fz_files[FZ_MAX_FILES];
static int fz_n_files;

__attribute__((unused)) static void fz_cleanup(void) {
  for (int i = 0; i < fz_n_files; i++) {
    close(fz_files[i].fd);
    unlink(fz_files[i].path);
  }
  if (fz_dir[0]) rmdir(fz_dir);
}

/* The private directory (created on first use). */
__attribute__((unused)) static const char *fz_tmpdir(void) {
  if (!fz_dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(fz_dir, sizeof fz_dir, "%s/infc-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fz_dir)) {
      perror("fuzz: mkdtemp");
      abort();
    }
    atexit(fz_cleanup);
  }
  return fz_dir;
}

/* The descriptor of the file `name` in the private directory, created on first use and kept
 * open (removed at exit). */
__attribute__((unused)) static int fz_open(const char *name) {
  for (int i = 0; i < fz_n_files; i++)
    if (!strcmp(strrchr(fz_files[i].path, '/') + 1, name)) return fz_files[i].fd;
  if (fz_n_files == FZ_MAX_FILES) abort();
  int i = fz_n_files;
  snprintf(fz_files[i].path, sizeof fz_files[i].path, "%s/%s", fz_tmpdir(), name);
  fz_files[i].fd = open(fz_files[i].path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fz_files[i].fd < 0) {
    perror("fuzz: open");
    abort();
  }
  fz_n_files++;
  return fz_files[i].fd;
}

/* The path of a file fz_open made. */
__attribute__((unused)) static const char *fz_path(const char *name) {
  for (int i = 0; i < fz_n_files; i++)
    if (!strcmp(strrchr(fz_files[i].path, '/') + 1, name)) return fz_files[i].path;
  abort();
}

/* Writes data[0, size) at off in fd (whole or abort). */
__attribute__((unused)) static void fz_pwrite(int fd, const void *data, size_t size, uint64_t off) {
  for (size_t done = 0; done < size;) {
    ssize_t w = pwrite(fd, (const uint8_t *)data + done, size - done, (off_t)(off + done));
    if (w <= 0) abort();
    done += (size_t)w;
  }
}

/* Makes the file `name` in the private directory hold exactly data[0, size); returns its
 * path (static, stable for the process). */
__attribute__((unused)) static const char *fz_write(const char *name, const uint8_t *data,
                                                    size_t size) {
  int fd = fz_open(name);
  fz_pwrite(fd, data, size, 0);
  if (ftruncate(fd, (off_t)size) != 0) abort();
  return fz_path(name);
}

/* With FUZZ_VERBOSE set, says why an input was refused (for reading a reproducer's run). */
__attribute__((unused)) static void fz_note(const char *stage, const char *msg) {
  static int verbose = -1;
  if (verbose < 0) verbose = getenv("FUZZ_VERBOSE") != NULL;
  if (verbose) fprintf(stderr, "fuzz: %s: %s\n", stage, msg);
}

/* A NUL-terminated copy of data (malloc'd). */
__attribute__((unused)) static char *fz_strndup(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) abort();
  if (size) memcpy(s, data, size);
  s[size] = 0;
  return s;
}

#endif
