#!/usr/bin/env bash
# Configures (once) and builds a CMake preset: release (default), debug (ASan+UBSan) or tsan.
# Quick when nothing changed: ninja rebuilds only what is out of date.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preset=${1:-release}
cd "$root"
# CUDA is optional; its toolkit, when installed in the standard place, is found through PATH.
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="$PATH:/usr/local/cuda/bin"
if [[ ! -f "build/$preset/build.ninja" ]]; then
  cmake --preset "$preset" >/dev/null
fi
cmake --build "build/$preset" -j "$(nproc)"
