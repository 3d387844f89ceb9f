#!/usr/bin/env bash
# Configures (once) and builds a CMake preset: release (default), sanitize (Clang: ASan + UBSan +
# LSan and the fuzz targets), tsan (Clang: ThreadSanitizer) or debug (GCC: ASan + UBSan + LSan).
# Targets after the preset build only those (e.g. `build.sh tsan proxyep_tsan_tests`).
# Quick when nothing changed: ninja rebuilds only what is out of date.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preset=${1:-release}
shift $(($# > 0 ? 1 : 0))
targets=()
for target in "$@"; do targets+=(--target "$target"); done
cd "$root"
# CUDA is optional; its toolkit, when installed in the standard place, is found through PATH.
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="$PATH:/usr/local/cuda/bin"
if [[ ! -f "build/$preset/build.ninja" ]]; then
  cmake --preset "$preset" >/dev/null
fi
cmake --build "build/$preset" -j "$(nproc)" "${targets[@]}"
