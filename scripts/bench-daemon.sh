#!/usr/bin/env bash
# The proxy in the node daemon against the proxy in process, on the same job: starts one proxyepd
# per emulated node on sockets in a fresh directory, then runs `proxyep bench KIND` ROUNDS times
# each way, alternating (in process first), and prints each run's dispatch and combine p50 and
# the medians' ratio (daemon / in process). Over tcp, both ways on the same fabric: without the
# reorder shim (a testing aid that delays completions: it would slow both sides, not alike), or
# with it on both sides when REORDER=1 (as the suite runs it).
#
#   scripts/bench-daemon.sh [KIND] [ROUNDS] [-- extra bench arguments]
#   scripts/bench-daemon.sh ll 5 -- --ranks 2 --ranks-per-node 1 --tokens 16 --iters 30
#
# KIND: ll (default) or ep. Without extra arguments: 4 ranks, 2 per node, 30 iterations. The
# build is build/release (BUILD_DIR overrides). Stops the daemons it started, by their pids.
#
# With --link RATE among the extra arguments the job runs on the testbed (docs/TESTBED.md, needs
# root): both ways through `proxyep launch --link`, and the daemons run in their nodes' network
# namespaces, started by scripts/testbed-daemon-rank.sh, so their fabric endpoints sit on the
# shaped links (each checks that its daemon served its node's ranks).
set -euo pipefail
shopt -s inherit_errexit

kind=${1:-ll}
rounds=${2:-5}
shift $(($# < 2 ? $# : 2))
[[ ${1:-} == "--" ]] && shift
extra=("$@")
[[ ${#extra[@]} -eq 0 ]] && extra=(--ranks 4 --ranks-per-node 2 --iters 30)

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$repo/build/release}
proxyep=$build/tools/proxyep
proxyepd=$build/tools/proxyepd
for tool in "$proxyep" "$proxyepd"; do
  [[ -x $tool ]] || { echo "bench-daemon: $tool is missing: run scripts/build.sh release" >&2; exit 2; }
done

dir=$(mktemp -d /tmp/proxyep-bench-daemon.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

# As many daemons as nodes: the ranks and ranks per node in the extra arguments decide.
ranks=4 per_node=2 link=
bench_args=()
for ((i = 0; i < ${#extra[@]}; i++)); do
  case ${extra[i]} in
    --ranks) ranks=${extra[i + 1]} ;;
    --ranks-per-node) per_node=${extra[i + 1]} ;;
    --link) link=${extra[i + 1]} ;;
    *) bench_args+=("${extra[i]}"); continue ;;
  esac
  ((++i))
done
nodes=$(((ranks + per_node - 1) / per_node))
export PROXYEP_FABRIC_PROVIDER=${PROXYEP_FABRIC_PROVIDER:-tcp}
# The daemons open the fabric from their own parameters: the same shim setting as the bench.
export PROXYEP_FABRIC_REORDER=${REORDER:-0}
reorder=()
[[ $PROXYEP_FABRIC_REORDER == 1 ]] && reorder=(--reorder)
# On the testbed the wrapper starts each node's daemon in the node's namespace.
[[ -n $link ]] && nodes=0
for ((n = 0; n < nodes; n++)); do
  "$proxyepd" --socket "$dir/node$n.sock" > "$dir/proxyepd-$n.log" 2>&1 &
  pids+=($!)
done
for ((n = 0; n < nodes; n++)); do
  for _ in $(seq 200); do
    grep -q "proxyepd: serving" "$dir/proxyepd-$n.log" 2> /dev/null && break
    sleep 0.05
  done
  grep -q "proxyepd: serving" "$dir/proxyepd-$n.log" \
    || { echo "bench-daemon: proxyepd $n did not start:" >&2; cat "$dir/proxyepd-$n.log" >&2; exit 1; }
done

# One run: prints "dispatch_p50 combine_p50" (microseconds) from the bench's JSON. On the
# testbed: `run env [WRAPPER...]`, the job launched with each rank under WRAPPER; rank 0's lines
# carry the JSON.
run() {
  local out
  if [[ -n $link ]]; then
    out=$(PROXYEP_LOG_LEVEL=warn "$proxyep" launch -n "$ranks" --ranks-per-node "$per_node" \
      --link "$link" -- "${@:2}" "$proxyep" bench "$kind" "${reorder[@]}" --json "${bench_args[@]}" \
      | sed -n 's/^\[rank 0\] //p')
  else
    out=$("$@" PROXYEP_LOG_LEVEL=warn "$proxyep" bench "$kind" "${reorder[@]}" --json "${extra[@]}")
  fi
  /usr/bin/python3 -c '
import json, sys
doc = json.loads(sys.stdin.read())
if doc.get("verified") is not True:
    sys.exit("bench-daemon: a run was not verified: " + json.dumps(doc)[:2000])
low = doc.get("proxyep", doc)
print(low["dispatch"]["us"]["p50"], low["combine"]["us"]["p50"])' <<< "$out"
}

in_process=() daemon=()
for ((r = 1; r <= rounds; r++)); do
  in_process+=("$(run env)")
  if [[ -n $link ]]; then
    daemon+=("$(run env "$repo/scripts/testbed-daemon-rank.sh" "$proxyepd")")
  else
    daemon+=("$(run env PROXYEP_PROXY_MODE=daemon "PROXYEP_DAEMON_SOCKET=$dir/node{node}.sock")")
  fi
  echo "round $r: in process ${in_process[-1]} us, daemon ${daemon[-1]} us (dispatch combine p50)"
done
# Every daemon run really went through the daemons: each served its node's ranks every round.
# (On the testbed the wrapper checked its node's daemon itself.)
if [[ -z $link ]]; then
  served=$(cat "$dir"/proxyepd-*.log | grep -c "serves rank" || true)
  ((served >= rounds * ranks)) \
    || { echo "bench-daemon: the daemons served $served ranks, $((rounds * ranks)) expected" >&2; exit 1; }
fi
/usr/bin/python3 - "${in_process[@]}" -- "${daemon[@]}" << 'EOF'
import statistics, sys
args = sys.argv[1:]
split = args.index("--")
def medians(runs):
    pairs = [tuple(map(float, run.split())) for run in runs]
    return [statistics.median(p[i] for p in pairs) for i in (0, 1)]
inp, dae = medians(args[:split]), medians(args[split + 1:])
for name, a, b in (("dispatch", inp[0], dae[0]), ("combine", inp[1], dae[1])):
    print(f"{name}: median p50 {a:.1f} us in process, {b:.1f} us through the daemons: {b / a:.2f}x")
EOF
