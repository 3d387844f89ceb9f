#!/usr/bin/env bash
# check_rank_killed.sh SECONDS RANKS PROXYEP PROGRAM [program arguments...]: one rank of RANKS
# (the program's --die-rank) dies by SIGKILL mid-run (PROGRAM --kill: ep_low_latency with
# --shrink, or ep_buffer), under `proxyep launch --tolerate-failures 1`, so the launcher leaves
# the survivors to the library. Passes when, within SECONDS:
# - the launch exits 0: every survivor did what PROGRAM checks (low-latency: masked the rank and
#   verified later calls without it; normal mode: its call failed naming the rank and the next
#   call was refused), each within the bound PROGRAM was given (--mask-within-ms /
#   --fail-within-ms, from the moment of death in the stamp file this script names);
# - RANKS - 1 survivors reported their time (the distribution is printed);
# - nothing is left: no process whose command line names this run's stamp file, and no
#   /dev/shm region named after a process that is gone and was not gone before.
set -uo pipefail
seconds=$1 ranks=$2 proxyep=$3 program=$4
shift 4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stamp="$work/death"
ls /dev/shm >"$work/shm_before" 2>/dev/null
start=$SECONDS
timeout --kill-after=5 "$seconds" "$proxyep" launch -n "$ranks" --tolerate-failures 1 -- \
  "$program" --kill --death-stamp "$stamp" "$@" >"$work/output" 2>&1
rc=$?
echo "check_rank_killed: launch exited $rc after $((SECONDS - start)) s"
failed=0
if [[ $rc -ne 0 ]]; then
  echo "check_rank_killed: FAIL (exit $rc)"
  grep -v '\[info\]' "$work/output" | tail -40
  failed=1
fi
times=$(grep -Eo '(masked|failed) [0-9]+ ms after' "$work/output" | awk '{print $2}' | sort -n)
reported=$(grep -c . <<<"$times")
echo "check_rank_killed: $reported survivors reported (ms): $(tr '\n' ' ' <<<"$times")"
if [[ $reported -ne $((ranks - 1)) ]]; then
  echo "check_rank_killed: FAIL ($reported survivors reported, expected $((ranks - 1)))"
  failed=1
fi
sleep 0.5
if pgrep -f "$stamp" >/dev/null; then
  echo "check_rank_killed: FAIL (processes left: $(pgrep -f "$stamp" | tr '\n' ' '))"
  pkill -KILL -f "$stamp"
  failed=1
fi
for region in /dev/shm/*; do
  [[ -e $region ]] || continue
  name=$(basename "$region")
  grep -qxF "$name" "$work/shm_before" && continue
  pid=${name%%:*}
  [[ $pid =~ ^[0-9]+$ ]] || continue
  kill -0 "$pid" 2>/dev/null && continue
  echo "check_rank_killed: FAIL (shm region $name of exited pid $pid left; removed)"
  rm -f "$region"
  failed=1
done
[[ $failed -eq 0 ]] && echo "check_rank_killed: PASS"
exit "$failed"
