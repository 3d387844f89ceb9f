#!/usr/bin/env bash
# expect_failure.sh MAX_SECONDS REGEX -- COMMAND...
# Passes when COMMAND fails cleanly: a non-zero exit that is not a crash (1..125, so no signal,
# no abort), an error message matching REGEX (extended grep, over stdout+stderr), and an exit
# within MAX_SECONDS, measured from the start of COMMAND (process start-up included) to its exit.
# A hang is a failure: the command is killed at 3x MAX_SECONDS. Every check that fails is named.
#
# A test of a failure that must be noticed at once sets every deadline involved well above
# MAX_SECONDS (and below 3x, so a missed failure shows the deadline's own message) and a REGEX
# naming the cause: a check that stopped working then fails the bound and the message instead of
# passing through a deadline.
set -uo pipefail
max_seconds=$1
regex=$2
shift 2
[[ "${1:-}" == "--" ]] && shift
start_ms=$(( $(date +%s%N) / 1000000 ))
output=$(timeout --kill-after=5 $((max_seconds * 3)) "$@" 2>&1)
code=$?
elapsed_ms=$(( $(date +%s%N) / 1000000 - start_ms ))
echo "$output"
echo "expect_failure: exit code $code after ${elapsed_ms} ms (bound ${max_seconds} s)"
failed=0
fail() { echo "expect_failure: FAIL: $*"; failed=1; }
if [[ $code -eq 0 ]]; then fail "the command succeeded"
elif [[ $code -eq 124 || $code -eq 137 ]]; then fail "the command hung (killed after $((max_seconds * 3)) s)"
elif [[ $code -gt 125 ]]; then fail "crash (exit code $code)"
fi
if ! grep -Eq -- "$regex" <<<"$output"; then fail "no output matches /$regex/"; fi
if (( elapsed_ms > max_seconds * 1000 )); then
  fail "took ${elapsed_ms} ms, more than ${max_seconds} s"
fi
[[ $failed -eq 0 ]] || exit 1
echo "expect_failure: PASS"
