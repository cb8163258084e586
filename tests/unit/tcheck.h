/* tcheck: a minimal assertion harness for the unit tests. Every CHECK counts; a failed
 * one prints file:line and the expression, and the test exits non-zero at the end. */
#ifndef TCHECK_H
#define TCHECK_H

#include <stdio.h>

extern int tcheck_failed;
extern int tcheck_passed;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (cond) {                                                                                \
      tcheck_passed++;                                                                         \
    } else {                                                                                   \
      tcheck_failed++;                                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                 \
    }                                                                                          \
  } while (0)

#define CHECKF(cond, ...)                                                                      \
  do {                                                                                         \
    if (cond) {                                                                                \
      tcheck_passed++;                                                                         \
    } else {                                                                                   \
      tcheck_failed++;                                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);                 \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fputc('\n', stderr);                                                                     \
    }                                                                                          \
  } while (0)

/* Prints the summary and returns the process exit code. */
int tcheck_done(const char *suite);

#endif
