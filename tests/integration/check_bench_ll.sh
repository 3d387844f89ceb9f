#!/usr/bin/env bash
# Smoke test of `proxyep bench ll`: runs it with --json (the ranks start themselves; extra
# arguments go to the bench) and checks the document with /usr/bin/python3: the top-level
# "verified" is true (the low-latency outputs passed DeepEP's checks, normal mode's matched its
# reference, and, with the baseline, the MPI baseline's passed the same checks as ours); every
# phase has p50 <= p95 <= p99 and GB/s; normal mode's figures and speedup_vs_normal are there;
# with --hook the send and receive phases are timed apart; across nodes the dispatch reports
# messages per second; with the baseline (when built and mpirun is there: --baseline mpi is
# added) speedup_vs_baseline is a number; with --reorder the reorder shim delivered some
# completions out of order.
# Exits 77 (ctest: skipped) when this proxyep has no low-latency implementation.
# With --mpi-only, runs the baseline alone (`proxyep-mpi-baseline ll` under mpirun, two ranks,
# shared memory), which needs no implementation, and requires its "verified": true; 77 without
# the baseline or mpirun.
# With --compare, tests `--compare FILE`: a run saved with --json, then a run compared with it,
# whose JSON must hold the ratios (now / saved) of dispatch, combine and total, p50 and p99, for
# the low-latency side, normal mode and, with the baseline, the MPI baseline.
# Usage: check_bench_ll.sh [--mpi-only | --compare] PROXYEP [bench ll arguments...]
set -euo pipefail
mpi_only=0
compare=0
if [[ "$1" == "--mpi-only" ]]; then
  mpi_only=1
  shift
elif [[ "$1" == "--compare" ]]; then
  compare=1
  shift
fi
proxyep=$1
shift
args=("$@")
baseline="$(dirname "$proxyep")/proxyep-mpi-baseline"
if [[ $mpi_only -eq 1 ]]; then
  if [[ ! -x "$baseline" ]] || ! command -v mpirun >/dev/null; then
    echo "check_bench_ll: skipped: no MPI baseline built (or no mpirun)" >&2
    exit 77
  fi
  out=$(timeout 40 mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 --mca pml ob1 \
    --mca oob_tcp_if_include lo --mca btl vader,self "$baseline" ll "${args[@]}")
  echo "$out"
  /usr/bin/python3 -c '
import json, sys
r = json.loads([l for l in sys.stdin.read().splitlines() if l.startswith("{")][-1])
if r["verified"] is not True: sys.exit("check_bench_ll: baseline not verified: " + r.get("mismatch", ""))
for name in ("dispatch", "combine"):
    if not (0 < r[name]["us"]["p50"] and r[name]["gbps"] > 0): sys.exit("check_bench_ll: no " + name + " figures")
' <<<"$out"
  echo "check_bench_ll: baseline verified" >&2
  exit 0
fi
with_baseline=0
if [[ -x "$baseline" ]] && command -v mpirun >/dev/null; then
  args+=(--baseline mpi)
  with_baseline=1
else
  echo "check_bench_ll: no MPI baseline built (or no mpirun); checking ProxyEP's side only" >&2
fi
# Runs the bench with the arguments given and "$@" into $out; exits 77 (skipped) when this build
# has no low-latency implementation, 1 when the bench fails.
run_bench() {
  local rc=0 err_file err
  err_file=$(mktemp)
  out=$(timeout 40 "$proxyep" bench ll "${args[@]}" "$@" 2>"$err_file") || rc=$?
  err=$(cat "$err_file")
  rm -f "$err_file"
  echo "$out"
  echo "$err" >&2
  if [[ $rc -ne 0 ]] && grep -q "no low-latency implementation" <<<"$err"; then
    echo "check_bench_ll: skipped: this build has no low-latency implementation" >&2
    exit 77
  fi
  [[ $rc -eq 0 ]] || { echo "check_bench_ll: proxyep bench ll exited with $rc" >&2; exit 1; }
}
if [[ $compare -eq 1 ]]; then
  saved=$(mktemp)
  trap 'rm -f "$saved"' EXIT
  run_bench --json >/dev/null
  echo "$out" >"$saved"
  run_bench --json --compare "$saved"
  /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)
with_baseline = int(sys.argv[1])
c = r.get("compare") or sys.exit("check_bench_ll: no \"compare\" in the JSON")
sides = ["proxyep", "normal"] + (["baseline"] if with_baseline else [])
for side in sides:
    for phase in ("dispatch", "combine", "total"):
        for stat in ("p50", "p99"):
            entry = c["paths"][side][phase][stat]
            if not (entry["now"] > 0 and entry["saved"] > 0 and entry["ratio"] > 0):
                sys.exit(f"check_bench_ll: compare {side} {phase} {stat}: {entry}")
if c["differences"] or c["notes"]: sys.exit(f"check_bench_ll: the same run differs: {c}")
' "$with_baseline" <<<"$out"
  echo "check_bench_ll: --compare checked" >&2
  exit 0
fi
run_bench --json
hook=0 reorder=0
[[ " ${args[*]} " == *" --hook "* ]] && hook=1
[[ " ${args[*]} " == *" --reorder "* ]] && reorder=1
/usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()
lines = text.splitlines()
start = lines.index("{")
end = len(lines) - 1 - lines[::-1].index("}")
r = json.loads("\n".join(lines[start:end + 1]))
hook, reorder, with_baseline = (int(a) for a in sys.argv[1:4])
def fail(why):
    sys.exit("check_bench_ll: " + why)
def phase_ok(side, name, phase, rate=True):
    us = phase["us"]
    if not (0 < us["p50"] <= us["p95"] <= us["p99"]):
        fail(f"{side} {name}: p50/p95/p99 not ordered and positive: {us}")
    if rate and not phase.get("gbps", 0) > 0:
        fail(f"{side} {name}: no GB/s")
if r["benchmark"] != "ll": fail("not a bench ll document")
if r["verified"] is not True: fail("not verified: " + json.dumps(r["proxyep"]["mismatches"] + r["normal"]["mismatches"]))
ll = r["proxyep"]
for name in ("dispatch", "combine"):
    phase_ok("low-latency", name, ll[name])
    phase_ok("normal", name, r["normal"][name])
phase_ok("low-latency", "total", ll["total"], rate=False)
if not ll["combine_calc_diff_max"] < (9e-4 if r["workload"]["fp8"] else 1e-5): fail("calc_diff")
if not r["speedup_vs_normal"] > 0: fail("no speedup_vs_normal")
if sum(r["traffic"]["selections_per_rank"]) <= 0: fail("no selections")
for name in ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv"):
    if hook: phase_ok("low-latency", name, ll[name], rate=False)
    elif name in ll: fail(name + " without --hook")
if r["nodes"] > 1 and not ll["dispatch"].get("msgs_per_s", 0) > 0:
    fail("ranks span nodes, but no messages per second through the proxy")
if with_baseline:
    if not isinstance(r["speedup_vs_baseline"], (int, float)): fail("no speedup_vs_baseline")
    for name in ("dispatch", "combine"): phase_ok("mpi", name, r["baseline"][name])
if reorder and not r.get("proxyep", {}).get("reorder_shim", {}).get("completions_out_of_order", 0) > 0:
    fail("--reorder, but no completion was delivered out of order")
' "$hook" "$reorder" "$with_baseline" <<<"$out"
echo "check_bench_ll: verified" >&2
