#!/usr/bin/env bash
# A launcher killed by SIGKILL takes its ranks with it (their parent-death signal, set by
# tools/spawn_rank.cpp): `proxyep launch` of 2 ranks that would sleep 60 s, and `bench ep` of 2
# ranks (the self-launch every bench uses), each SIGKILLed once its ranks run. Every rank must
# be gone within 3 s. One node, so no fabric: a rank ended by a signal leaves no shm region.
set -euo pipefail
proxyep=$1

# A process that exists and is not a zombie (a container's init may be slow to reap).
running() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}

check() {
  "$@" >/dev/null 2>&1 &
  local launcher=$! ranks="" alive="" i p
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
  sleep 0.5  # the ranks are in their program by now
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
