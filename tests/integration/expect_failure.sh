#!/usr/bin/env bash
# expect_failure.sh MAX_SECONDS REGEX -- COMMAND...
# Passes when COMMAND fails cleanly: a non-zero exit that is not a crash (1..125, so no signal,
# no abort), an error message matching REGEX (extended grep, over stdout+stderr), and an exit
# within MAX_SECONDS (a hang is a failure: the command is killed at 3x MAX_SECONDS).
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
echo "expect_failure: exit code $code after ${elapsed_ms} ms"
if [[ $code -eq 0 ]]; then echo "expect_failure: FAIL: the command succeeded"; exit 1; fi
if [[ $code -eq 124 || $code -eq 137 ]]; then echo "expect_failure: FAIL: the command hung"; exit 1; fi
if [[ $code -gt 125 ]]; then echo "expect_failure: FAIL: crash (exit code $code)"; exit 1; fi
if ! grep -Eq -- "$regex" <<<"$output"; then
  echo "expect_failure: FAIL: no output matches /$regex/"; exit 1
fi
if (( elapsed_ms > max_seconds * 1000 )); then
  echo "expect_failure: FAIL: took ${elapsed_ms} ms, more than ${max_seconds} s"; exit 1
fi
echo "expect_failure: PASS"
