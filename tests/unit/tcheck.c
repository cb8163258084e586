/* tcheck: counters and summary for the unit-test harness. */
#include "tcheck.h"

int tcheck_failed = 0;
int tcheck_passed = 0;

int tcheck_done(const char *suite) {
  printf("%s: %d checks passed, %d failed\n", suite, tcheck_passed, tcheck_failed);
  if (tcheck_passed + tcheck_failed == 0) {
    printf("%s: FAIL: no check ran\n", suite);
    return 1;
  }
  return tcheck_failed ? 1 : 0;
}

int tcheck_skip(const char *suite, const char *why) {
  printf("%s: skipped: %s\n", suite, why);
  if (tcheck_passed + tcheck_failed == 0) return TCHECK_SKIP;
  return tcheck_done(suite);
}
