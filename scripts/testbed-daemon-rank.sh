#!/bin/sh
# testbed-daemon-rank.sh PROXYEPD CMD ARGS...: one rank of a job on the testbed whose proxies are
# its node's proxyepd (tcp, with the reorder shim unless PROXYEP_FABRIC_REORDER=0). Local rank 0
# starts the node's daemon here, in the node's network namespace, so the daemon's fabric endpoint
# sits on the node's shaped link; every rank waits for the socket and runs CMD through the
# daemon; local rank 0 then waits for the node's other ranks, checks the daemon served each of
# them, and stops it (SIGTERM drains).
set -u
proxyepd=$1
shift
dir=${TMPDIR:-/tmp}/proxyep-testbed-daemon-$MASTER_PORT-node$GROUP_RANK  # MASTER_PORT: per launch
sock=$dir/proxyepd.sock
if [ "$LOCAL_RANK" = 0 ]; then
  mkdir -p "$dir"
  PROXYEP_LOG_LEVEL=info PROXYEP_FABRIC_PROVIDER=tcp PROXYEP_FABRIC_REORDER=${PROXYEP_FABRIC_REORDER:-1} "$proxyepd" --socket "$sock" \
    >"$dir/proxyepd.log" 2>&1 &
  daemon=$!
fi
i=0
while [ ! -S "$sock" ]; do
  i=$((i + 1))
  [ $i -le 400 ] || { echo "rank $RANK: node $GROUP_RANK's proxyepd did not come up ($sock)"; exit 1; }
  sleep 0.05
done
PROXYEP_PROXY_MODE=daemon PROXYEP_DAEMON_SOCKET=$sock "$@"
rc=$?
touch "$dir/done.$LOCAL_RANK"
[ "$LOCAL_RANK" = 0 ] || exit $rc
i=0
while [ "$(ls "$dir" | grep -c '^done\.')" -lt "$LOCAL_WORLD_SIZE" ] && [ $i -le 600 ]; do
  i=$((i + 1))
  sleep 0.05
done
first=$((GROUP_RANK * LOCAL_WORLD_SIZE))
for r in $(seq $first $((first + LOCAL_WORLD_SIZE - 1))); do
  grep -q "serves rank $r of $WORLD_SIZE" "$dir/proxyepd.log" ||
    { echo "node $GROUP_RANK's proxyepd did not serve rank $r:"; cat "$dir/proxyepd.log"; rc=1; }
done
kill -TERM "$daemon"
wait "$daemon"
rm -rf "$dir"
exit $rc
