#!/usr/bin/env bash
# sigterm_in_rendezvous.sh PROXYEP: a rank waiting in the rendezvous for a rank 0 that never
# comes dies by SIGTERM at once (status 143), as a process with the default action does, and not
# by exit(1) from the handler the PSM libraries of Debian's libfabric install when they load
# (common/signal_hygiene.hpp). Run outside `proxyep launch` and with the libraries' opt-out
# variables removed, so the program's own restore is what is tested.
set -uo pipefail
proxyep=$1
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
trap 'rm -f "$log"' EXIT
env -u IPATH_NO_BACKTRACE -u HFI_NO_BACKTRACE RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" PROXYEP_BOOTSTRAP_TIMEOUT_MS=30000 \
  "$proxyep" bench fabric --provider tcp >"$log" 2>&1 &
pid=$!
sleep 1  # inside the rendezvous by now: connecting, retrying, to a port nobody serves
if ! kill -0 "$pid" 2>/dev/null; then
  echo "FAIL: the rank ended before the signal:"; cat "$log"; exit 1
fi
start=$(date +%s%N)
kill -TERM "$pid"
wait "$pid"
status=$?
took_ms=$((($(date +%s%N) - start) / 1000000))
echo "rank exited with status $status ${took_ms} ms after SIGTERM"
if [[ $status -ne 143 ]]; then
  echo "FAIL: expected death by SIGTERM (143); its output:"; cat "$log"; exit 1
fi
if ((took_ms > 2000)); then
  echo "FAIL: it took ${took_ms} ms"; exit 1
fi
echo "PASS"
