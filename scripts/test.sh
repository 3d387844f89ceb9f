#!/usr/bin/env bash
# Quickstart, command 2: install what is missing, build, and run the whole test suite. `.ci/run`
# runs exactly this. In order, each part even when an earlier one failed:
#   release   the release build and every ctest test; extra arguments go to this ctest
#             (e.g. -R fabric, -L unit)
#   sanitize  ASan + UBSan + LSan (preset sanitize, Clang): the unit tests, the integration and
#             failure tests labelled `sanitize`, and the canaries that prove a rank's report fails
#   fuzz      each libFuzzer target for PROXYEP_FUZZ_SECONDS (20 s) from the committed seeds
#   tsan      ThreadSanitizer (preset tsan): the concurrency-heavy unit tests (label tsan)
# The sanitizer builds build only what their tests run. SKIP_SANITIZERS=1 runs the release part
# only, for a quick local run; CI runs everything. Exits non-zero when any part failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/install-deps.sh" || exit 1

failed=()
summary=()
# part NAME COMMAND...: runs COMMAND, notes its time and whether it failed; returns its status.
part() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "=== test.sh: $name" >&2
  "$@" || rc=$?
  summary+=("$(printf '%-22s %5d s  %s' "$name" $((SECONDS - start)) "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)")")")
  [[ $rc -eq 0 ]] || failed+=("$name")
  return $rc
}
# One test at a time: the multi-rank tests busy-poll both cores, and the failure tests check
# deadlines, which a second test running beside them would stretch.
run_ctest() {
  local preset=$1
  shift
  (cd "$root/build/$preset" && ctest --output-on-failure --timeout 600 "$@")
}

if part "release build" "$root/scripts/build.sh" release; then
  part "release tests" run_ctest release "$@"
fi
if [[ "${SKIP_SANITIZERS:-0}" != 1 ]]; then
  if part "sanitize build" "$root/scripts/build.sh" sanitize proxyep_sanitize_tests; then
    part "sanitize tests" run_ctest sanitize -L '^(unit|sanitize|sanitizer_report)$'
    part "fuzz" run_ctest sanitize -L '^fuzz$'
  fi
  if part "tsan build" "$root/scripts/build.sh" tsan proxyep_tsan_tests; then
    part "tsan tests" run_ctest tsan -L '^(tsan|sanitizer_report)$'
  fi
fi

echo "=== test.sh: summary" >&2
printf '  %s\n' "${summary[@]}" >&2
if [[ ${#failed[@]} -ne 0 ]]; then
  echo "test.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
