#!/usr/bin/env bash
# Quickstart, command 1: install what is missing, build, and run the main job: the EP benchmark
# (`proxyep bench ep`) on 4 local ranks emulating 2 nodes of 2 ranks, so both the intranode path
# and the fabric path (tcp;ofi_rxm over lo) run, its outputs checked against the reference, side
# by side with the same workload through MPI_Alltoallv (Open MPI). Extra arguments go to the
# bench (e.g. --json, --routing skewed, --fp8).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" release >/dev/null
proxyep="$root/build/release/tools/proxyep"
# 1024 tokens of 7168 BF16 per rank, top-8 of 64 experts: about 20 s on a 2-core machine.
echo "== proxyep bench ep --ranks 4 --ranks-per-node 2 --tokens 1024 --baseline mpi"
PROXYEP_LOG_LEVEL=${PROXYEP_LOG_LEVEL:-warn} \
  "$proxyep" bench ep --ranks 4 --ranks-per-node 2 --tokens 1024 --baseline mpi "$@"
