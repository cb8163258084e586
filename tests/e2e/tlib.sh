# tlib: the helpers every e2e script sources. The script sets TMP (its scratch folder)
# before sourcing; `tsummary` at the end prints the counts and gives the exit status.
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
# check NAME 'SHELL CONDITION'
check() { if eval "$2"; then ok; else bad "$1"; fi; }
# expect_error NAME NEEDLE CMD...: exit 1, one stderr line with "error:" and NEEDLE.
expect_error() {
  local name=$1 needle=$2; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$? lines
  lines=$(wc -l <"$TMP/err")
  if [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && grep -q "error:" "$TMP/err" && grep -qF -- "$needle" "$TMP/err"; then
    ok
  else
    bad "$name: rc=$rc lines=$lines stderr=$(cat "$TMP/err")"
  fi
}
