#!/usr/bin/env bash
# check_no_shm_left.sh PROGRAM [ARGS...]: runs PROGRAM and passes when it exits 0 and leaves no
# /dev/shm region named after its pid ("<pid>:..."; libfabric's shm provider names its regions
# so). For a process that abandons its fabric on purpose (a proxy thread stuck inside the
# provider): the regions must still go when it exits (fabric/shm_stale.hpp).
set -uo pipefail
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1 &
pid=$!
wait "$pid"
rc=$?
cat "$out"
[[ $rc -eq 0 ]] || { echo "check_no_shm_left: FAIL (the program exited $rc)"; exit 1; }
# A doctest filter that matches nothing passes without running anything.
if grep -q '^\[doctest\] test cases: 0 ' "$out"; then
  echo "check_no_shm_left: FAIL (no test case ran)"
  exit 1
fi
left=$(cd /dev/shm 2>/dev/null && ls -d -- "$pid":* 2>/dev/null)
if [[ -n $left ]]; then
  echo "check_no_shm_left: FAIL (left in /dev/shm: $(tr '\n' ' ' <<<"$left"); removed)"
  (cd /dev/shm && rm -f -- $left)
  exit 1
fi
echo "check_no_shm_left: PASS (pid $pid left no shm region)"
