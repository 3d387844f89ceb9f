#!/usr/bin/env bash
# Smoke test of `proxyep bench ep`: runs it with --json (the ranks start themselves; extra
# arguments go to the bench) and requires the top-level "verified": true -- ProxyEP's outputs and,
# when the MPI baseline was built, the baseline's matched the reference -- and, with the
# baseline, a speedup_vs_baseline figure. With --reorder, the reorder shim must have delivered
# some completions out of order ("completions_out_of_order" above 0), or it tested no reordering.
# Usage: check_bench_ep.sh PROXYEP [bench ep arguments...]
set -euo pipefail
proxyep=$1
shift
args=("$@")
baseline="$(dirname "$proxyep")/proxyep-mpi-baseline"
with_baseline=0
if [[ -x "$baseline" ]] && command -v mpirun >/dev/null; then
  args+=(--baseline mpi)
  with_baseline=1
else
  echo "check_bench_ep: no MPI baseline built (or no mpirun); checking ProxyEP's side only" >&2
fi
rc=0
out=$(timeout 25 "$proxyep" bench ep "${args[@]}" --json) || rc=$?
echo "$out"
[[ $rc -eq 0 ]] || { echo "check_bench_ep: proxyep bench ep exited with $rc" >&2; exit 1; }
# dump(2) indents top-level keys by exactly two spaces; nested "verified" keys sit deeper.
grep -q '^  "verified": true' <<<"$out" || { echo "check_bench_ep: not verified" >&2; exit 1; }
if [[ $with_baseline -eq 1 ]]; then
  grep -Eq '^  "speedup_vs_baseline": [0-9]' <<<"$out" ||
    { echo "check_bench_ep: no speedup_vs_baseline" >&2; exit 1; }
fi
if [[ " ${args[*]} " == *" --reorder "* ]]; then
  grep -Eq '"completions_out_of_order": [1-9]' <<<"$out" ||
    { echo "check_bench_ep: --reorder, but no completion was delivered out of order" \
           "(the reorder shim did not reorder, or was not on)" >&2; exit 1; }
fi
echo "check_bench_ep: verified" >&2
