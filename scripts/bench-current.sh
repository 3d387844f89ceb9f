#!/usr/bin/env bash
# Re-measures every row of docs/BENCHMARKS.md's "Current figures" table, one command after the
# other on a quiet machine (build nothing meanwhile), each with its baseline in the same run.
#
#   scripts/bench-current.sh [ROW...]     ROW: a row's name below (default: all of them)
#   scripts/bench-current.sh --list
#
# Each row runs in build/release/bench-current/<time>/, its output (stdout and stderr) in
# <row>.log there, and prints one line to the terminal: its name, exit code and seconds. The
# rows that need the testbed need root (docs/TESTBED.md), the MPI baselines Open MPI; a row that
# fails does not stop the rest. Repeats are fewer than the table's sources used where a row takes minutes (the soaks,
# the RL run); the row names say so. Read medians and ratios from the logs.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build/release}
pep=$build/tools/proxyep
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
py=(/usr/bin/python3 -m proxyep.bench)
ll_shape=(--tokens 128 --hidden 7168 --topk 8 --experts 64)
small=(--reorder --tokens 64 --hidden 1024 --experts 128 --iters 3 --warmup 1 --json)

# name|command (run by bash -c, with $pep, $py... exported below)
rows=(
  "ep-8r4pn-p5en|\$pep bench ep --ranks 8 --ranks-per-node 4 --tokens 1024 --internode both --baseline mpi --link preset:p5en"
  "ep-4r2pn-p5en|\$pep bench ep --ranks 4 --ranks-per-node 2 --tokens 1024 --internode both --baseline mpi --link preset:p5en"
  "ep-8r4pn-link4|\$pep bench ep --ranks 8 --ranks-per-node 4 --tokens 512 --internode both --link 4"
  "ll-8r4pn-p5en|\$pep bench ll --ranks 8 --ranks-per-node 4 --baseline mpi --link preset:p5en"
  "ll-4r2pn-p5en|\$pep bench ll --ranks 4 --ranks-per-node 2 --baseline mpi --link preset:p5en"
  "fabric-link|for r in 1 4 16; do \$pep bench fabric --provider tcp --link \$r --sizes 65536 262144 1048576 --reps 5 --latency-iters 20 --json; done"
  "ep-quickstart-loopback|\$pep bench ep --ranks 4 --ranks-per-node 2 --tokens 1024 --baseline mpi"
  "ep-intranode-x2|for i in 1 2; do \$pep bench ep --ranks 2 --iters 20 --baseline mpi; done"
  "ep-intranode-floor|\$pep bench ep --ranks 2 --iters 20 --baseline mpi --breakdown"
  "ep-2nodes-loopback-x2|for i in 1 2; do \$pep bench ep --ranks 2 --ranks-per-node 1 --iters 20 --baseline mpi; done"
  "ep-small-intranode-x2|for i in 1 2; do \$pep bench ep --ranks 2 --tokens 64 --iters 50 --baseline mpi --breakdown; done"
  "ep-small-2nodes-x2|for i in 1 2; do \$pep bench ep --ranks 2 --ranks-per-node 1 --tokens 64 --iters 50 --baseline mpi; done"
  "ll-intranode-x3|for i in 1 2 3; do \$pep bench ll --ranks 2 \${ll_shape[*]} --baseline mpi --warmup 3 --iters 20; done"
  "ll-2nodes-x3|for i in 1 2 3; do \$pep bench ll --ranks 2 --ranks-per-node 1 \${ll_shape[*]} --baseline mpi --warmup 3 --iters 20; done"
  "ll-hook|\$pep bench ll --ranks 2 \${ll_shape[*]} --baseline mpi --hook"
  "setup-128|$root/scripts/peak-memory.sh \$pep bench ep --ranks 128 --ranks-per-node 8 \${small[*]} && PROXYEP_EP_INTERNODE=per_rank $root/scripts/peak-memory.sh \$pep bench ep --ranks 128 --ranks-per-node 8 \${small[*]}"
  "soak-128-x2|$root/scripts/soak.sh --starts 2 128"
  "soak-256-ll-x1|$root/scripts/soak.sh --starts 1 256 ll --tokens 8 --hidden 512 --experts 256"
  "rxm-32|for b in 2048 0; do PROXYEP_FABRIC_RXM_BUFFER_BYTES=\$b $root/scripts/peak-memory.sh \$pep bench ep --ranks 32 --ranks-per-node 8 --reorder --tokens 64 --hidden 1024 --experts 64 --iters 10 --warmup 2; done"
  "rendezvous|\$pep bench rendezvous --ranks 16 32 64 128 256 512 1024 --reps 5"
  "rank-killed|ctest --test-dir $build -R rank_killed --output-on-failure -V"
  "proxy-latency|PROXYEP_LOG_LEVEL=warn \$pep bench proxy --provider tcp --idle-seconds 0 --runs 5"
  "proxy-bandwidth|\$pep bench proxy --provider tcp --size 1048576 --stream 3000"
  "ring|chrt -f 10 \$pep bench ring --json && chrt -f 10 \$pep bench ring --json --push-burst 32"
  "fabric-loopback|\$pep bench fabric --provider shm --json && \$pep bench fabric --provider tcp --json"
  "daemon-ep|for t in 1024 4096; do $root/scripts/bench-daemon.sh ep 2 -- --ranks 2 --ranks-per-node 1 --tokens \$t --iters 10 --no-floor; done"
  "daemon-ll|$root/scripts/bench-daemon.sh ll 3 -- --ranks 2 --ranks-per-node 1 --tokens 16 --iters 30"
  "daemon-testbed|$root/scripts/bench-daemon.sh ep 3 -- --ranks 4 --ranks-per-node 2 --tokens 1024 --iters 10 --no-floor --link preset:p5en && $root/scripts/bench-daemon.sh ll 3 -- --ranks 4 --ranks-per-node 2 --iters 20 --link preset:p5en"
  "python-ep-ll|\${py[*]} ep && \${py[*]} ll"
  "python-ep-v2|\${py[*]} ep --api v2 --tokens 64 --iters 200 --warmup 20 --no-cpp --baseline none && \${py[*]} ep --api v2 --tokens 4096 --iters 30 --no-cpp --baseline none && \$pep launch -n 4 --ranks-per-node 2 --link 4 -- \${py[*]} ep --api v2 --tokens 1024 --iters 30 --warmup 3 --no-cpp --baseline none --json"
  "python-moe|\${py[*]} moe"
  "python-weights|for b in 1M 64M 256M; do PROXYEP_FABRIC_PROVIDER=tcp \$pep launch -n 3 --ranks-per-node 1 --link 4 -- \${py[*]} weights --layout ep2 --bytes \$b --iters 6 --warmup 1 --json; done"
  "rl-x1|\$pep bench rl --repeats 1 --iterations 30 --scaling 2 --scaling-exchanges proxyep"
)

if [[ ${1:-} == --list ]]; then
  for row in "${rows[@]}"; do printf '%-24s %s\n' "${row%%|*}" "${row#*|}"; done
  exit 0
fi
[[ -x $pep ]] || { echo "bench-current: $pep is missing: run scripts/build.sh release" >&2; exit 2; }
out=$build/bench-current/$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
failed=0
for row in "${rows[@]}"; do
  name=${row%%|*}
  if [[ $# -gt 0 ]] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
  start=$SECONDS
  # The row's command sees the arrays as words (bash -c cannot inherit arrays); it runs in the
  # log folder, so what a bench writes beside itself (bench rl's runs/) stays with the logs.
  (cd "$out" && timeout 1800 bash -c "pep='$pep'; py=(${py[*]}); ll_shape=(${ll_shape[*]}); small=(${small[*]}); ${row#*|}" \
    >"$out/$name.log" 2>&1)
  rc=$?
  ((rc == 0)) || failed=$((failed + 1))
  printf '%-24s rc %-3d %5d s  %s\n' "$name" "$rc" $((SECONDS - start)) "$out/$name.log"
done
echo "bench-current: logs in $out; $failed row(s) failed"
((failed == 0))
