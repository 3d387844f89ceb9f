#!/usr/bin/env bash
# Soak: the failure tests and the EP integration tests, over and over for N minutes, while CPU
# hogs keep every core busy, so that races that show once in a hundred runs show here instead of
# in CI. Not part of the default test command. Every failing run's output is kept.
#
#   ./scripts/soak.sh [minutes=30] [hogs=cores]   (extra ctest filters: SOAK_REGEX)
#
# Prints a line per round and a table at the end (test, runs, failures); exits non-zero when any
# run failed. Logs: build/release/soak/<start time>/round-<k>/ (ctest's output of each round).
#
#   ./scripts/soak.sh --starts [times=20] [ranks=128] [ep|ll] [shape flags, e.g. --tokens 8
#                     --hidden 512 --experts 256, instead of the default shape]
#
# Starts: a job of RANKS ranks (emulated nodes of 8, tcp with the reorder shim) started TIMES
# times, `proxyep bench ep` (or `bench ll` with `ll`) of a small shape, each run verified against
# the reference; one line per start (verified or not, seconds, peak host memory, setup p50 and
# slowest rank) and "soak: K of N starts verified" at the end; non-zero exit unless all were.
# No CPU hogs: the ranks fill the cores. Logs of failing starts: build/release/soak/<time>/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ "${1:-}" == "--starts" ]]; then
  times=${2:-20} ranks=${3:-128} kind=${4:-ep}
  shift $(($# < 4 ? $# : 4))
  "$root/scripts/build.sh" release >/dev/null
  out="$root/build/release/soak/$(date +%Y%m%d-%H%M%S)-starts"
  mkdir -p "$out"
  if [[ $kind == ll ]]; then
    shape=(--tokens 16 --hidden 1024 --experts "$ranks")
  else
    shape=(--tokens 64 --hidden 1024 --experts "$ranks")
  fi
  [[ $# -gt 0 ]] && shape=("$@")  # a shape of the caller's instead
  verified=0
  for ((i = 1; i <= times; i++)); do
    log="$out/start-$i.log" json="$out/start-$i.json"
    begin=$SECONDS
    if "$root/scripts/peak-memory.sh" "$root/build/release/tools/proxyep" bench "$kind" \
         --ranks "$ranks" --ranks-per-node 8 --reorder "${shape[@]}" --iters 3 --warmup 1 \
         --json >"$json" 2>"$log" && grep -q '"verified": true' "$json"; then
      verified=$((verified + 1))
      verdict=verified
    else
      verdict="NOT verified (log: $log)"
    fi
    setup=$(/usr/bin/python3 -c '
import json, sys
try:
    total = json.load(open(sys.argv[1]))["proxyep"]["setup"][-1]
    print("setup p50 %.1f s, slowest rank %.1f s" % (total["p50_ms"] / 1e3, total["max_ms"] / 1e3))
except Exception:
    print("no setup figures")' "$json")
    echo "soak: start $i of $times: $verdict after $((SECONDS - begin)) s;" \
      "$(grep -o 'peak-memory: [0-9]* MiB' "$log" | sed 's/peak-memory: //') peak; $setup"
    [[ $verdict == verified ]] && rm -f "$log" "$json"
  done
  echo "soak: $verified of $times starts of $ranks ranks verified"
  [[ $verified -eq $times ]]
  exit
fi
minutes=${1:-30}
hogs=${2:-$(nproc)}
regex=${SOAK_REGEX:-'^(failure\.|integration\.ep\.|integration\.bench_ep\.|integration\.ll\.|integration\.proxy_alltoall\.)'}

"$root/scripts/build.sh" release >/dev/null
build="$root/build/release"
out="$build/soak/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"

# CPU hogs: plain busy loops at normal priority, one per core unless told otherwise. They are
# this script's children, ended by pid when it exits however it exits.
hog_pids=()
stop_hogs() {
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_hogs EXIT
for ((i = 0; i < hogs; i++)); do
  (exec yes >/dev/null) &
  hog_pids+=($!)
done

end=$((SECONDS + minutes * 60))
round=0
while ((SECONDS < end)); do
  round=$((round + 1))
  dir="$out/round-$round"
  mkdir -p "$dir"
  # One test at a time, as the suite runs them; each test's own TIMEOUT bounds a hang.
  if (cd "$build" && ctest -R "$regex" --output-on-failure --output-junit "$dir/junit.xml" \
        >"$dir/ctest.log" 2>&1); then
    echo "soak: round $round passed ($(((end - SECONDS + 59) / 60)) min left)"
    rm -f "$dir/ctest.log"  # keep the logs of failing rounds only; junit.xml keeps the counts
  else
    echo "soak: round $round FAILED: $dir/ctest.log"
  fi
done
stop_hogs

/usr/bin/python3 - "$out" <<'EOF'
# Sums the rounds' JUnit reports: runs and failures per test, failing rounds named.
import glob, os, sys
import xml.etree.ElementTree as ET
runs, failed = {}, {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "round-*", "junit.xml"))):
    round_name = os.path.basename(os.path.dirname(path))
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        if case.get("status") == "notrun" or case.find("skipped") is not None:
            continue
        runs[name] = runs.get(name, 0) + 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.setdefault(name, []).append(round_name)
print(f"\n{'test':60} {'runs':>6} {'failed':>7}")
for name in sorted(runs):
    print(f"{name:60} {runs[name]:6d} {len(failed.get(name, [])):7d}  {' '.join(failed.get(name, []))}")
total = sum(runs.values())
bad = sum(len(v) for v in failed.values())
print(f"\nsoak: {total} runs, {bad} failed; logs in {sys.argv[1]}")
sys.exit(1 if bad else 0)
EOF
