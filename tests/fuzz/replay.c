/* replay: a fuzz target's plain driver, so ctest runs every target without clang or
 * libFuzzer: LLVMFuzzerTestOneInput once on each file of the directories (or files) given,
 * as libFuzzer replays a corpus. The committed seeds and the fuzzers' past finds
 * (tests/fuzz/regressions) go through it in the release and the sanitizer builds: a memory
 * error fails the sanitizer build, a trap fails either, a hang meets ctest's timeout. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return fprintf(stderr, "replay: cannot open %s\n", path), 1;
  uint8_t *buf = NULL;
  size_t n = 0, cap = 0;
  for (size_t r; !feof(f) && !ferror(f);) {
    if (n == cap) {
      uint8_t *p = realloc(buf, cap = cap ? 2 * cap : 65536);
      if (!p) return free(buf), fclose(f), fprintf(stderr, "replay: out of memory\n"), 1;
      buf = p;
    }
    r = fread(buf + n, 1, cap - n, f);
    n += r;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf ? buf : (const uint8_t *)"", n);
  free(buf);
  return 0;
}

static int replay(const char *path, int *count) {
  struct stat st;
  if (stat(path, &st) != 0) return 0; /* a target without regressions has no directory */
  if (!S_ISDIR(st.st_mode)) return (*count)++, replay_file(path);
  DIR *d = opendir(path);
  if (!d) return fprintf(stderr, "replay: cannot open %s\n", path), 1;
  int bad = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    bad |= replay(p, count);
  }
  closedir(d);
  return bad;
}

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  int bad = 0, count = 0;
  for (int i = 1; i < argc; i++) bad |= replay(argv[i], &count);
  printf("replay: %d inputs\n", count);
  if (count == 0) return printf("replay: FAIL: no input\n"), 1;
  return bad;
}
