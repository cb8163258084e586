/* tcheck: counters and summary for the unit-test harness. */
#include "tcheck.h"

int tcheck_failed = 0;
int tcheck_passed = 0;

int tcheck_done(const char *suite) {
  printf("%s: %d checks passed, %d failed\n", suite, tcheck_passed, tcheck_failed);
  return tcheck_failed ? 1 : 0;
}
