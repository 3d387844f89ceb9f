#!/usr/bin/env bash
# check_launch_interrupt.sh PROXYEP: SIGTERM reaches `proxyep launch` while it is still starting
# ranks (rank 0 sends it to its parent, the launcher, as soon as it runs). The launcher must stop
# spawning at once (ranks reported "not started"), stop the ranks it started, exit 143 (128 +
# SIGTERM) within seconds, and leave none of them running.
set -uo pipefail
proxyep=$1
ranks=256
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/pids"
start_ms=$(($(date +%s%N) / 1000000))
timeout --kill-after=5 30 "$proxyep" launch -n "$ranks" --grace-ms 2000 -- \
  sh -c 'echo $$ > "$0/$RANK"; [ "$RANK" = 0 ] && kill -TERM $PPID; exec sleep 60' "$work/pids" \
  >"$work/output" 2>&1
code=$?
elapsed_ms=$(($(date +%s%N) / 1000000 - start_ms))
cat "$work/output"
started=$(ls "$work/pids" | wc -l)
echo "check_launch_interrupt: exit code $code after ${elapsed_ms} ms; $started of $ranks ranks ran"
status=0
# Every rank that ran must be gone (they are ours: any survivor is killed by its pid).
for file in "$work/pids"/*; do
  [[ -e "$file" ]] || continue
  pid=$(<"$file")
  if kill -0 "$pid" 2>/dev/null; then
    echo "check_launch_interrupt: FAIL: rank $(basename "$file") (pid $pid) is still running"
    kill -KILL "$pid" 2>/dev/null
    status=1
  fi
done
if [[ $code -ne 143 ]]; then echo "check_launch_interrupt: FAIL: exit code $code, not 143"; status=1; fi
if ! grep -q "interrupted by SIGTERM" "$work/output"; then
  echo "check_launch_interrupt: FAIL: the interruption is not reported"; status=1
fi
if ! grep -Eq "ranks? [0-9, -]+ not started" "$work/output"; then
  echo "check_launch_interrupt: FAIL: the launcher went on spawning after SIGTERM"; status=1
fi
if (( elapsed_ms > 15000 )); then
  echo "check_launch_interrupt: FAIL: took ${elapsed_ms} ms"; status=1
fi
(( status == 0 )) && echo "check_launch_interrupt: PASS"
exit $status
