#!/usr/bin/env bash
# A launcher killed by SIGKILL takes its ranks with it (their parent-death signal, set by
# tools/spawn_rank.cpp): `proxyep launch` of 2 ranks that would sleep 60 s, and `bench ep` of 2
# ranks (the self-launch every bench uses), each SIGKILLed once its ranks run. Every rank must
# be gone within 3 s. Then a job over libfabric's shm provider (2 nodes of 1) SIGKILLed whole,
# ranks first (as the OOM killer or a node agent might): the regions their endpoints leave in
# /dev/shm must be gone once the next job has started (every process sweeps the regions of
# dead ones: fabric/shm_stale.hpp). (A rank ended by its parent-death signal, SIGTERM, removes
# its own.)
set -euo pipefail
proxyep=$1

# A process that exists and is not a zombie (a container's init may be slow to reap).
running() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}

# The shm regions named after the given pids.
regions_of() {
  local p
  for p in "$@"; do ls /dev/shm 2>/dev/null | grep -E "^$p:" | sed 's|^|/dev/shm/|' || true; done
}

# check [--shm] COMMAND...: starts COMMAND, SIGKILLs it once its 2 ranks run, and requires the
# ranks to end. With --shm, waits until the ranks have opened their shm endpoints and SIGKILLs
# the ranks first. Leaves the ranks' pids in $ranks.
ranks=""
check() {
  local wait_regions=0
  [[ $1 == --shm ]] && { wait_regions=1; shift; }
  "$@" >/dev/null 2>&1 &
  local launcher=$! alive="" i p
  ranks=""
  for ((i = 0; i < 400; i++)); do
    ranks=$(pgrep -P "$launcher" || true)
    [[ $(wc -w <<<"$ranks") -ge 2 ]] && break
    sleep 0.05
  done
  if [[ $(wc -w <<<"$ranks") -lt 2 ]]; then
    kill -9 "$launcher" 2>/dev/null || true
    echo "FAIL: the ranks of '$*' did not start"
    exit 1
  fi
  if [[ $wait_regions -eq 1 ]]; then
    for ((i = 0; i < 400; i++)); do
      [[ $(regions_of $ranks | wc -l) -ge 2 ]] && break
      sleep 0.05
    done
    if [[ $(regions_of $ranks | wc -l) -lt 2 ]]; then
      kill -9 "$launcher" $ranks 2>/dev/null || true
      echo "FAIL: the ranks of '$*' did not open their shm endpoints"
      exit 1
    fi
  fi
  sleep 0.5  # the ranks are in their program by now
  if [[ $wait_regions -eq 1 ]]; then
    # Stopped first, so that it cannot reap the ranks and remove their regions itself.
    kill -STOP "$launcher"
    kill -9 $ranks
  fi
  kill -9 "$launcher"
  wait "$launcher" 2>/dev/null || true
  for ((i = 0; i < 60; i++)); do
    alive=""
    for p in $ranks; do running "$p" && alive+=" $p"; done
    [[ -z $alive ]] && break
    sleep 0.05
  done
  if [[ -n $alive ]]; then
    kill -9 $alive 2>/dev/null || true
    echo "FAIL: ranks$alive outlived their SIGKILLed launcher ('$*')"
    exit 1
  fi
  echo "ok: the ranks ($(echo $ranks)) ended with their launcher: $*"
}

check "$proxyep" launch -n 2 -- sleep 60
check "$proxyep" bench ep --ranks 2 --ranks-per-node 2 --tokens 256 --hidden 256 --iters 1000000 \
  --baseline none
shm_job=(bench ep --ranks 2 --ranks-per-node 1 --provider shm --tokens 256 --hidden 256
         --baseline none)
check --shm "$proxyep" "${shm_job[@]}" --iters 1000000
killed=$ranks
[[ -n $(regions_of $killed) ]] || { echo "FAIL: the killed ranks left no shm region to sweep"; exit 1; }
echo "the killed ranks left: $(regions_of $killed | tr '\n' ' ')"
# The next job on the node: its ranks sweep what nobody maps any more.
"$proxyep" "${shm_job[@]}" --iters 2 --warmup 1 >/dev/null
left=$(regions_of $killed)
if [[ -n $left ]]; then
  echo "FAIL: the next job's start left the killed ranks' shm regions: $left"
  rm -f $left
  exit 1
fi
echo "ok: the next job removed the killed ranks' shm regions"
