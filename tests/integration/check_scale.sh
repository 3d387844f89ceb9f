#!/usr/bin/env bash
# check_scale.sh SECONDS PROXYEP ep|ll [bench arguments...]: one `proxyep bench ep` or `bench ll`
# run at scale (64 ranks in the suite) must finish within SECONDS, exit 0 and report
# "verified": true (every rank's outputs against the reference), with the reorder shim having
# delivered completions out of order somewhere (else the unordered path was not exercised).
set -uo pipefail
seconds=$1 proxyep=$2 kind=$3
shift 3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$SECONDS
timeout "$seconds" "$proxyep" bench "$kind" "$@" --json >"$out"
rc=$?
took=$((SECONDS - start))
echo "check_scale: bench $kind $* exited $rc after ${took} s"
[[ $rc -eq 0 ]] || { echo "check_scale: FAIL (exit $rc)"; exit 1; }
grep -q '"verified": true' "$out" || { echo "check_scale: FAIL (not verified)"; cat "$out"; exit 1; }
grep -Eq '"completions_out_of_order": [1-9]' "$out" ||
  { echo "check_scale: FAIL (no completion was reordered)"; exit 1; }
echo "check_scale: PASS"
