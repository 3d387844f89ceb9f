#!/usr/bin/env bash
# Smoke test of `proxyep bench ep`: runs it with --json (the ranks start themselves; extra
# arguments go to the bench) and requires the top-level "verified": true -- ProxyEP's outputs and,
# when the MPI baseline was built, the baseline's matched the reference -- and, with the
# baseline, a speedup_vs_baseline figure and the baseline variant that was asked for
# (--variant: mpi, the lean program, by default; or mpi-records); across emulated nodes without
# --link, both MPI brackets (tcp and shared memory between every pair). With --reorder, the reorder shim
# must have delivered some completions out of order ("completions_out_of_order" above 0), or it
# tested no reordering.
# Every run must carry the per-phase times of its calls ("proxyep.phases", which --breakdown
# prints), adding up to each kind's time, and, unless --no-floor is among the arguments, the
# same-run memory floor ("proxyep.memcpy_floor": a positive p50, bytes received by some rank, and
# dispatch+combine's ratio to 2 such copies); with --no-floor, none. With --device simulated (or
# cuda), the device path must have made writes ("device_writes"), and over shm with FI_HMEM some
# into device arenas ("device_paths"); with host tensors none.
# With --compare, tests `--compare FILE` instead: a run saved with --json (the mpi-records
# baseline), then a run compared with it in JSON (ratios of dispatch, combine and total, p50 and
# p99; the lean baseline is not compared with the saved record one, and a note says so), one in
# the table form with the saved run's variant (ratio rows for ProxyEP and the baseline), and a
# run of another shape (--topk 4) refused before any rank starts. The bench arguments must then
# not set --topk.
# With --internode both, the per_rank run must be there and verified too, and the hierarchical
# run's fabric bytes within 5% of the node-deduplicated least (dispatch and combine).
# Usage: check_bench_ep.sh [--variant mpi|mpi-records | --compare] PROXYEP [bench ep arguments...]
set -euo pipefail
variant=mpi
compare=0
case "$1" in
  --variant) variant=$2; shift 2 ;;
  --compare) compare=1; shift ;;
esac
proxyep=$1
shift
args=("$@")
baseline="$(dirname "$proxyep")/proxyep-mpi-baseline"
with_baseline=0
if [[ -x "$baseline" ]] && command -v mpirun >/dev/null; then
  with_baseline=1
else
  echo "check_bench_ep: no MPI baseline built (or no mpirun); checking ProxyEP's side only" >&2
fi
fail() { echo "check_bench_ep: FAIL: $*" >&2; exit 1; }

# Runs the bench with the arguments given and the baseline variant $1 (when there is a baseline);
# fails unless it exits 0.
run_bench() {
  local with=()
  [[ $with_baseline -eq 1 ]] && with=(--baseline "$1")
  shift
  local rc=0
  timeout 25 "$proxyep" bench ep "${args[@]}" "${with[@]}" "$@" || rc=$?
  [[ $rc -eq 0 ]] || fail "proxyep bench ep exited with $rc"
}

if [[ $compare -eq 1 ]]; then
  saved=$(mktemp)
  trap 'rm -f "$saved"' EXIT
  run_bench mpi-records --json >"$saved"
  out=$(run_bench mpi --json --compare "$saved")
  echo "$out"
  /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)
saved_path, with_baseline = sys.argv[1], int(sys.argv[2])
c = r.get("compare") or sys.exit("check_bench_ep: no \"compare\" in the JSON")
if c["file"] != saved_path: sys.exit("check_bench_ep: compare.file is " + c["file"])
for phase in ("dispatch", "combine", "total"):
    for stat in ("p50", "p99"):
        entry = c["paths"]["proxyep"][phase][stat]
        if not (entry["now"] > 0 and entry["saved"] > 0 and entry["ratio"] > 0):
            sys.exit(f"check_bench_ep: compare proxyep {phase} {stat}: {entry}")
if with_baseline:
    if "baseline" in c["paths"]: sys.exit("check_bench_ep: mpi compared with a saved mpi-records run")
    if not any("mpi-records" in n for n in c["notes"]): sys.exit("check_bench_ep: no note on the variants")
' "$saved" "$with_baseline" <<<"$out"
  out=$(run_bench mpi-records --compare "$saved")
  echo "$out"
  ratio_row=' +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+ +[0-9.]+ +[0-9.]+x$'
  for row in "proxyep dispatch" "proxyep combine" "proxyep total"; do
    grep -Eq "^  $row$ratio_row" <<<"$out" || fail "no compare row \"$row\" in the table"
  done
  if [[ $with_baseline -eq 1 ]]; then
    grep -Eq "^  mpi-records total$ratio_row" <<<"$out" || fail "no compare row for mpi-records"
  fi
  # Another shape: refused before any rank starts (no "[rank N]" line), naming the difference.
  rc=0
  err=$(timeout 10 "$proxyep" bench ep "${args[@]}" --topk 4 --compare "$saved" 2>&1) || rc=$?
  echo "$err"
  [[ $rc -ne 0 ]] || fail "a saved run of another shape was compared"
  grep -q "another shape: topk 8 (this run: 4)" <<<"$err" || fail "the refusal does not name the shape"
  ! grep -q '^\[rank [0-9]' <<<"$err" || fail "ranks started before the refusal"
  echo "check_bench_ep: --compare checked" >&2
  exit 0
fi

out=$(run_bench "$variant" --json)
echo "$out"
# dump(2) indents top-level keys by exactly two spaces; nested "verified" keys sit deeper.
grep -q '^  "verified": true' <<<"$out" || fail "not verified"
if [[ $with_baseline -eq 1 ]]; then
  grep -Eq '^  "speedup_vs_baseline": [0-9]' <<<"$out" || fail "no speedup_vs_baseline"
  grep -q "^    \"variant\": \"$variant\"," <<<"$out" || fail "the baseline is not variant $variant"
  # Off the testbed across emulated nodes, MPI runs twice: tcp between every pair and shared
  # memory between every pair (the brackets of a cluster's MPI), each verified and named; on one
  # node, or on the testbed's links, once.
  on_testbed=0
  [[ " ${args[*]} " == *" --link "* ]] && on_testbed=1
  /usr/bin/python3 -c '
import json, sys
r, on_testbed = json.load(sys.stdin), int(sys.argv[1])
base, upper = r["baseline"], r.get("baseline_upper_bracket")
if r["nodes"] > 1 and not on_testbed:
    if not upper: sys.exit("check_bench_ep: across emulated nodes without the testbed, no upper MPI bracket")
    if not upper["verified"] or not r.get("speedup_vs_baseline_upper_bracket"):
        sys.exit("check_bench_ep: the upper MPI bracket did not verify")
    if "tcp over loopback between every pair" not in base["transport"]: sys.exit("check_bench_ep: lower bracket " + base["transport"])
    if "shared memory between every pair" not in upper["transport"]: sys.exit("check_bench_ep: upper bracket " + upper["transport"])
    if "btl vader,self" not in upper["command"] or "btl tcp,self" not in base["command"]:
        sys.exit("check_bench_ep: the brackets ran " + base["command"] + " / " + upper["command"])
elif upper is not None:
    sys.exit("check_bench_ep: an MPI bracket where the baseline had one transport: " + base["transport"])
' "$on_testbed" <<<"$out"
fi
# A --device run (simulated or cuda) must have taken the device path (writes from the device's
# stream or into device arenas); a run with host tensors none.
if [[ " ${args[*]} " =~ " --device "(simulated|cuda)" " ]]; then
  grep -Eq '^  "device_writes": [1-9]' <<<"$out" || fail "--device, but no write took the device path"
  # Over shm where it registers device memory (FI_HMEM: a build with CUDA), other nodes' rows
  # land in the receivers' device arenas (GPUDirect RDMA; the simulated device stands for a GPU
  # the NIC reads).
  if [[ " ${args[*]} " == *" --provider shm "* ]] &&
     "$proxyep" info --provider shm --json | grep -q '"hmem": true'; then
    grep -Eq '^    "sends_to_device_arenas": [1-9]' <<<"$out" ||
      fail "--device over shm with FI_HMEM, but no row went into a device arena"
  fi
else
  grep -q '^  "device_writes": 0,' <<<"$out" || fail "host tensors, but writes took the device path"
fi
if [[ " ${args[*]} " == *" --reorder "* ]]; then
  grep -Eq '"completions_out_of_order": [1-9]' <<<"$out" ||
    fail "--reorder, but no completion was delivered out of order" \
         "(the reorder shim did not reorder, or was not on)"
fi
# --internode both: per_rank and hierarchical in the same run, both verified; hierarchical sends
# each token once per node (fabric bytes within 5% of the node-deduplicated least, dispatch and
# combine), per_rank once per rank (more).
if [[ " ${args[*]} " == *" --internode both "* ]]; then
  /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)
mode = r.get("internode")
if mode != "hierarchical": sys.exit(f"check_bench_ep: internode {mode}")
per = r.get("per_rank") or sys.exit("check_bench_ep: --internode both, but no per_rank run")
if not per["verified"] or not r.get("speedup_vs_per_rank"): sys.exit("check_bench_ep: per_rank run")
for phase in ("dispatch", "combine"):
    hier = r["proxyep"]["fabric"][phase]["measured_over_convention"]
    rank = per["fabric"][phase]["measured_over_convention"]
    if not (0 < hier <= 1.05 < rank):
        sys.exit(f"check_bench_ep: {phase} fabric bytes over the least: hierarchical {hier}, per_rank {rank}")
' <<<"$out"
fi
# Where the time went: every kind of call has its phases, and they add up to its time.
/usr/bin/python3 -c '
import json, sys
phases = json.load(sys.stdin)["proxyep"].get("phases") or sys.exit("check_bench_ep: no proxyep.phases")
for kind in ("dispatch", "combine", "cached_dispatch"):
    p = phases[kind]
    parts = sum(v for k, v in p.items() if k.endswith("_us") and k != "sum_us")
    if not (p["calls"] > 0 and p["sum_us"] > 0 and abs(parts - p["sum_us"]) <= 1e-6 * p["sum_us"] + 1e-3):
        sys.exit(f"check_bench_ep: phases of {kind}: {p}")
if phases["combine"]["reduce_us"] <= 0: sys.exit("check_bench_ep: combine without a reduce")
' <<<"$out"
no_floor=0
[[ " ${args[*]} " == *" --no-floor "* ]] && no_floor=1
/usr/bin/python3 -c '
import json, sys
ours, no_floor = json.load(sys.stdin)["proxyep"], int(sys.argv[1])
floor = ours.get("memcpy_floor")
if no_floor:
    if floor is not None: sys.exit("check_bench_ep: --no-floor, but a proxyep.memcpy_floor")
    sys.exit(0)
if not floor: sys.exit("check_bench_ep: no proxyep.memcpy_floor")
ratio = floor.get("dispatch_combine_over_floor")
if not (floor["us"]["p50"] > 0 and floor["gbps"] > 0 and max(floor["bytes_per_rank"]) > 0
        and floor["dispatch_combine_floor_us"] == 2 * floor["us"]["p50"]
        and isinstance(ratio, (int, float)) and ratio > 0):
    floor.pop("samples_us", None)
    sys.exit(f"check_bench_ep: memcpy_floor: {floor}")
' "$no_floor" <<<"$out"
echo "check_bench_ep: verified" >&2
