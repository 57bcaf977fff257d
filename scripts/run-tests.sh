#!/usr/bin/env bash
# Runs Criterion test programs one after another, prints each suite's synthesis and a total
# "N passed, N failed, N skipped" line last.  Exit status 1 if any test failed or crashed.
set -u
pass=0; fail=0; skip=0; bad_suites=()
export RINGLM_SHARED="${RINGLM_SHARED:-$(cd "$(dirname "$0")/.." && pwd)/../shared}"
export RINGLM_BUILD="${B:-build}"
export RINGLM_BIN="${RINGLM_BIN:-$(cd "${B:-build}" 2>/dev/null && pwd)/bin}"
# Under SANITIZE=1: leaks inside Criterion's own runner are not ours (scripts/lsan.supp).
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp:print_suppressions=0"
for t in "$@"; do
  name=$(basename "$t")
  out=$(mktemp)
  # A suite that hangs is a failure, not a stalled CI: each gets 10 minutes at most.
  timeout -k 10 600 "$t" --verbose --jobs "${RINGLM_TEST_JOBS:-2}" >"$out" 2>&1
  rc=$?
  syn=$(grep -a 'Synthesis:' "$out" | tail -1)
  if [ $rc -ne 0 ] || [ -z "$syn" ]; then
    cat "$out"
    bad_suites+=("$name(rc=$rc)")
  else
    grep -a -E '^\[SKIP\]|\[FAIL\]|Warning' "$out" | head -20
  fi
  echo "[$name] ${syn:-no synthesis (rc=$rc)}"
  tested=$(sed -n 's/.*Tested: \([0-9]*\).*/\1/p' <<<"$syn"); passing=$(sed -n 's/.*Passing: \([0-9]*\).*/\1/p' <<<"$syn")
  failing=$(sed -n 's/.*Failing: \([0-9]*\).*/\1/p' <<<"$syn"); crashing=$(sed -n 's/.*Crashing: \([0-9]*\).*/\1/p' <<<"$syn")
  skipped=$(grep -a -c -E '^\[SKIP\]' "$out")
  pass=$((pass + ${passing:-0}))
  fail=$((fail + ${failing:-0} + ${crashing:-0}))
  skip=$((skip + skipped))
  if [ -z "$syn" ]; then fail=$((fail + 1)); fi
  rm -f "$out"
done
echo
if [ ${#bad_suites[@]} -gt 0 ]; then echo "suites with failures: ${bad_suites[*]}"; fi
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ] && [ ${#bad_suites[@]} -eq 0 ]
