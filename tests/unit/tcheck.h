/* tcheck: a minimal assertion harness for the unit tests. Every CHECK counts; a failed
 * one prints file:line and the expression, and the test exits non-zero at the end. */
#ifndef TCHECK_H
#define TCHECK_H

#include <stdio.h>

extern int tcheck_failed;
extern int tcheck_passed;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (cond) {                                                                                    \
      tcheck_passed++;                                                                             \
    } else {                                                                                       \
      tcheck_failed++;                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                     \
    }                                                                                              \
  } while (0)

#define CHECKF(cond, ...)                                                                          \
  do {                                                                                             \
    if (cond) {                                                                                    \
      tcheck_passed++;                                                                             \
    } else {                                                                                       \
      tcheck_failed++;                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);                     \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
    }                                                                                              \
  } while (0)

/* ctest's skip code (SKIP_RETURN_CODE in tests/CMakeLists.txt): the summary shows a skip. */
#define TCHECK_SKIP 77

/* Prints the summary and returns the process exit code: 1 when a check failed, or when no
 * check ran at all (a test that checked nothing has not passed). */
int tcheck_done(const char *suite);

/* For a test that cannot run here (no GPU, an unset environment variable): prints why and
 * returns TCHECK_SKIP when no check ran, else tcheck_done's code (the part that ran counts). */
int tcheck_skip(const char *suite, const char *why);

#endif
