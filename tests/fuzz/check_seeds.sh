#!/usr/bin/env bash
# Fails when the committed seed corpus (tests/fuzz/corpus) differs from what fuzz_seeds writes
# with this build's encoders, e.g. after a wire format change.
# Usage: check_seeds.sh FUZZ_SEEDS CORPUS_DIR SCRATCH_DIR
set -euo pipefail
generator=$1
corpus=$2
scratch=$3
rm -rf "$scratch"
"$generator" "$scratch"
if ! diff -r "$scratch" "$corpus"; then
  echo "tests/fuzz/corpus is stale: from the repository root run"
  echo "  rm -r tests/fuzz/corpus && $generator tests/fuzz/corpus"
  exit 1
fi
