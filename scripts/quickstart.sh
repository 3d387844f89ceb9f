#!/usr/bin/env bash
# Quickstart, command 1: install what is missing, build, and run the main job: the fabric
# benchmark (RMA write with immediate data) between 2 local ranks on the shm and tcp providers.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" release >/dev/null
proxyep="$root/build/release/tools/proxyep"
for provider in shm tcp; do
  echo "== proxyep bench fabric --provider $provider (2 local ranks)"
  "$proxyep" bench fabric --provider "$provider" "$@"
done
