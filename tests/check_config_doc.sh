#!/usr/bin/env bash
# Fails when docs/CONFIG.md differs from what the parameter registry generates.
set -euo pipefail
proxyep=$1
root=$2
expected=$(cat "$root/docs/CONFIG.md.in"; "$proxyep" config --markdown)
if ! diff <(echo "$expected") "$root/docs/CONFIG.md"; then
  echo "docs/CONFIG.md is stale: run scripts/update-config-doc.sh"
  exit 1
fi
