#!/usr/bin/env bash
# expect_failure.sh MAX_SECONDS REGEX [--forbid REGEX2] -- COMMAND...
# Passes when COMMAND fails cleanly: a non-zero exit that is not a crash (1..125, so no signal,
# no abort), an error message matching REGEX (extended grep, over stdout+stderr), no line matching
# REGEX2 when given (e.g. "\[rank 1\]": no rank was started), an exit within MAX_SECONDS,
# measured from the start of COMMAND (process start-up included) to its exit (a hang is a
# failure: the command is killed at 3x MAX_SECONDS), and nothing left behind: no process it
# started still running, and no shared-memory region in /dev/shm named after one of its
# processes ("<pid>:...", what libfabric's shm provider leaves when a process dies with an
# endpoint open). Leftovers are reported, then removed (processes killed by pid). Every check
# that fails is named.
#
# A test of a failure that must be noticed at once sets every deadline involved well above
# MAX_SECONDS (and below 3x, so a missed failure shows the deadline's own message) and a REGEX
# naming the cause: a check that stopped working then fails the bound and the message instead of
# passing through a deadline.
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
echo "expect_failure: exit code $code after ${elapsed_ms} ms (bound ${max_seconds} s)"

failed=0
fail() { echo "expect_failure: FAIL: $*"; failed=1; }
if [[ -s "$work/sid" ]]; then
  sid=$(<"$work/sid")
  # Zombies are not running (a sanitizer's llvm-symbolizer child can linger as one briefly).
  left=$(ps -o pid=,stat= --sid "$sid" 2>/dev/null | awk '$2 !~ /^Z/ {print $1}' | tr -s ' \n' ' ')
  if [[ -n "${left// /}" ]]; then
    fail "processes left running:"
    ps -o pid=,args= --sid "$sid"
    for pid in $left; do kill -KILL "$pid" 2>/dev/null; done
  fi
  echo "$sid" >>"$work/pids"
fi
if [[ -s "$work/pids" ]]; then
  for pid in $(sort -un "$work/pids"); do
    for region in /dev/shm/"$pid":*; do
      [[ -e "$region" ]] || continue
      grep -qxF -- "${region#/dev/shm/}" "$work/shm_before" && continue
      fail "$region (a shm region of pid $pid) was left behind"
      rm -f -- "$region"
    done
  done
fi

if [[ $code -eq 0 ]]; then fail "the command succeeded"
elif [[ $code -eq 124 || $code -eq 137 ]]; then fail "the command hung (killed after $((max_seconds * 3)) s)"
elif [[ $code -gt 125 ]]; then fail "crash (exit code $code)"
fi
if ! grep -Eq -- "$regex" <<<"$output"; then fail "no output matches /$regex/"; fi
if [[ -n "$forbid" ]] && grep -Eq -- "$forbid" <<<"$output"; then
  fail "output matches /$forbid/:"
  grep -E -- "$forbid" <<<"$output" | head -3
fi
if (( elapsed_ms > max_seconds * 1000 )); then
  fail "took ${elapsed_ms} ms, more than ${max_seconds} s"
fi
[[ $failed -eq 0 ]] || exit 1
echo "expect_failure: PASS"
