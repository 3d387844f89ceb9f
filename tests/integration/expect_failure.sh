#!/usr/bin/env bash
# expect_failure.sh MAX_SECONDS REGEX [--forbid REGEX2] -- COMMAND...
# Passes when COMMAND fails cleanly: a non-zero exit that is not a crash (1..125, so no signal,
# no abort), an error message matching REGEX (extended grep, over stdout+stderr), no line matching
# REGEX2 when given (e.g. "\[rank 1\]": no rank was started), an exit within MAX_SECONDS (a hang
# is a failure: the command is killed at 3x MAX_SECONDS), and nothing left behind: no process it
# started still running, and no shared-memory region in /dev/shm named after one of its
# processes ("<pid>:...", what libfabric's shm provider leaves when a process dies with an
# endpoint open). Leftovers are reported, then removed (processes killed by pid).
#
# The command runs in a session of its own, so its processes (the launcher's ranks get process
# groups of their own, not sessions) are told from those of other tests running on the machine:
# its process ids are sampled while it runs, and the session is looked at again after it exits.
set -uo pipefail
max_seconds=$1
regex=$2
shift 2
forbid=""
if [[ "${1:-}" == "--forbid" ]]; then
  forbid=$2
  shift 2
fi
[[ "${1:-}" == "--" ]] && shift

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# What was there before is not this command's (a region of a process that died long ago can be
# named after a pid the kernel has given to one of ours since).
ls /dev/shm >"$work/shm_before" 2>/dev/null
start_ms=$(($(date +%s%N) / 1000000))
# sh writes its pid, which is the new session's id, then becomes timeout(1) and the command.
setsid --wait sh -c 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec "$@"' "$work/sid" \
  timeout --kill-after=5 $((max_seconds * 3)) "$@" >"$work/output" 2>&1 &
runner=$!
(
  until [[ -s "$work/sid" || -e "$work/done" ]]; do sleep 0.01; done
  [[ -s "$work/sid" ]] || exit 0
  sid=$(<"$work/sid")
  until [[ -e "$work/done" ]]; do
    ps -o pid= --sid "$sid" >>"$work/pids" 2>/dev/null
    sleep 0.1
  done
) &
sampler=$!
wait "$runner"
code=$?
touch "$work/done"
wait "$sampler"
elapsed_ms=$(($(date +%s%N) / 1000000 - start_ms))
output=$(<"$work/output")
echo "$output"
echo "expect_failure: exit code $code after ${elapsed_ms} ms"

leftovers=0
if [[ -s "$work/sid" ]]; then
  sid=$(<"$work/sid")
  left=$(ps -o pid= --sid "$sid" 2>/dev/null | tr -s ' \n' ' ')
  if [[ -n "${left// /}" ]]; then
    echo "expect_failure: FAIL: processes left running:"
    ps -o pid=,args= --sid "$sid"
    for pid in $left; do kill -KILL "$pid" 2>/dev/null; done
    leftovers=1
  fi
  echo "$sid" >>"$work/pids"
fi
if [[ -s "$work/pids" ]]; then
  for pid in $(sort -un "$work/pids"); do
    for region in /dev/shm/"$pid":*; do
      [[ -e "$region" ]] || continue
      grep -qxF -- "${region#/dev/shm/}" "$work/shm_before" && continue
      echo "expect_failure: FAIL: $region (a shm region of pid $pid) was left behind"
      rm -f -- "$region"
      leftovers=1
    done
  done
fi

if [[ $code -eq 0 ]]; then echo "expect_failure: FAIL: the command succeeded"; exit 1; fi
if [[ $code -eq 124 || $code -eq 137 ]]; then echo "expect_failure: FAIL: the command hung"; exit 1; fi
if [[ $code -gt 125 ]]; then echo "expect_failure: FAIL: crash (exit code $code)"; exit 1; fi
if ! grep -Eq -- "$regex" <<<"$output"; then
  echo "expect_failure: FAIL: no output matches /$regex/"; exit 1
fi
if [[ -n "$forbid" ]] && grep -Eq -- "$forbid" <<<"$output"; then
  echo "expect_failure: FAIL: output matches /$forbid/:"
  grep -E -- "$forbid" <<<"$output" | head -3
  exit 1
fi
if (( elapsed_ms > max_seconds * 1000 )); then
  echo "expect_failure: FAIL: took ${elapsed_ms} ms, more than ${max_seconds} s"; exit 1
fi
if (( leftovers )); then exit 1; fi
echo "expect_failure: PASS"
