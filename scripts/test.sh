#!/usr/bin/env bash
# Quickstart, command 2: install what is missing, build, and run the whole test suite.
# `.ci/run` runs exactly this. Extra arguments go to ctest (e.g. -R fabric, -L unit).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" release
cd "$root/build/release"
# One test at a time: the multi-rank tests busy-poll both cores, and the failure tests check
# deadlines, which a second test running beside them would stretch.
ctest --output-on-failure --timeout 600 "$@"
