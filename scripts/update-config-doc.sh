#!/usr/bin/env bash
# Regenerates docs/CONFIG.md from the parameter registry (the test docs.config_current checks it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
proxyep=${1:-$root/build/release/tools/proxyep}
{ cat "$root/docs/CONFIG.md.in"; env -u PROXYEP_CONFIG "$proxyep" config --markdown; } >"$root/docs/CONFIG.md"
