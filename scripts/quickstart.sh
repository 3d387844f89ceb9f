#!/usr/bin/env bash
# Quickstart, command 1: install what is missing, build, and run the main job: the EP benchmark
# (`proxyep bench ep`) on 4 local ranks emulating 2 nodes of 2 ranks, so both the intranode path
# (shared memory) and the fabric path (tcp;ofi_rxm) run, its outputs checked against the
# reference, side by side with the same workload through MPI_Alltoallv (Open MPI). Where the
# machine allows it (CAP_NET_ADMIN: root) the two nodes are network namespaces joined by links
# shaped to p5en's NVLink:EFA ratio (docs/TESTBED.md), and MPI runs over the same links;
# elsewhere every rank talks over loopback, and a line says why. Extra arguments go to the bench
# (e.g. --json, --routing skewed, --fp8).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
begin=$SECONDS
"$root/scripts/install-deps.sh"
echo "== dependencies ready after $((SECONDS - begin)) s"

# The build, with a line at every tenth of it (a fresh build is minutes long) and, when it fails,
# the end of its log and where the whole log is.
mkdir -p "$root/build"
log="$root/build/quickstart-build.log"
echo "== building (release); the whole log: build/quickstart-build.log"
show_progress() {
  local line shown=-1 tenth
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]] && ((BASH_REMATCH[2] > 0)); then
      tenth=$((BASH_REMATCH[1] * 10 / BASH_REMATCH[2]))
      if ((tenth > shown)); then
        shown=$tenth
        echo "== build: ${BASH_REMATCH[1]} of ${BASH_REMATCH[2]} steps after $((SECONDS - begin)) s"
      fi
    fi
  done
}
: >"$log"
if ! "$root/scripts/build.sh" release 2>&1 | show_progress; then
  echo "== the build failed; its last lines (the whole log: $log):" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
echo "== built after $((SECONDS - begin)) s"
proxyep="$root/build/release/tools/proxyep"
# 1024 tokens of 7168 BF16 per rank, top-8 of 64 experts: about 20 s on a 2-core machine.
link=()
if (( (0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 12) & 1 )); then
  link=(--link preset:p5en)
else
  echo "== no CAP_NET_ADMIN (not root): no testbed; both nodes talk over loopback, as fast as" \
    "memory, which hides what a cluster's links cost (docs/TESTBED.md)"
fi
echo "== proxyep bench ep --ranks 4 --ranks-per-node 2 --tokens 1024 --baseline mpi ${link[*]}"
PROXYEP_LOG_LEVEL=${PROXYEP_LOG_LEVEL:-warn} \
  "$proxyep" bench ep --ranks 4 --ranks-per-node 2 --tokens 1024 --baseline mpi "${link[@]}" "$@"
