#!/usr/bin/env bash
# Quickstart, command 2: install what is missing, build, and run the whole test suite. `.ci/run`
# runs exactly this. In order, each part even when an earlier one failed:
#   release   the release build and every ctest test; extra arguments go to this ctest
#             (e.g. -R fabric, -L unit)
#   sanitize  ASan + UBSan + LSan (preset sanitize, Clang): the unit tests, the integration and
#             failure tests labelled `sanitize`, and the canaries that prove a rank's report fails
#   fuzz      each libFuzzer target for PROXYEP_FUZZ_SECONDS (20 s) from the committed seeds,
#             two at a time
#   tsan      ThreadSanitizer (preset tsan): the concurrency-heavy unit tests (label tsan)
# The sanitizer builds build only what their tests run, and they run in the background at the
# lowest CPU priority beside the release tests and the sanitize tests (the summary's "build
# (rest)" times are what was left of them when their tests were due). SKIP_SANITIZERS=1 runs the release part only, for a quick local run;
# CI runs everything. Exits non-zero when any part failed; after the summary it prints, for each
# failed test, the lines that say why (scripts/failed-test-digest.py).
# After adding or removing tests: PROXYEP_UPDATE_TEST_COUNTS=1 ./scripts/test.sh writes the
# per-label counts each part ran into tests/expected-test-counts.json (commit it).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Every suite must register and run here: a missing test dependency stops the configure
# (cmake/TestDependencies.cmake) and a test that would skip for want of one fails instead.
export PROXYEP_REQUIRE_ALL_TESTS=1
"$root/scripts/install-deps.sh" || exit 1

failed=()
summary=()
# Why each failed test failed, printed after the summary (scripts/failed-test-digest.py).
digest=$(mktemp)
background_pid=""
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
# deadlines, which a second test running beside them would stretch. Every process the tests
# start carries a marker in its environment; a process or a /dev/shm entry still there after
# the tests fails the part (scripts/leftovers.sh), as a leak a user would hit. A full part (no
# extra arguments) must also have run, per label, at least the tests
# tests/expected-test-counts.json lists (scripts/check-test-counts.py).
# run_ctest PART PRESET [ctest arguments...]
run_ctest() {
  local name=$1 preset=$2 rc=0 id snapshot junit
  shift 2
  id="$$-$name-$SECONDS-$RANDOM"
  snapshot=$(mktemp)
  junit="$root/build/$preset/ctest-$name.xml"
  "$root/scripts/leftovers.sh" snapshot "$snapshot"
  (cd "$root/build/$preset" &&
    PROXYEP_TEST_RUN=$id ctest --output-on-failure --timeout 600 --output-junit "$junit" "$@") ||
    rc=$?
  [[ $rc -eq 0 ]] || "$root/scripts/failed-test-digest.py" "$name" "$junit" >>"$digest"
  if ! "$root/scripts/leftovers.sh" check "$snapshot" "$id"; then
    echo "test.sh: the tests above left processes or /dev/shm entries behind (listed above)" >&2
    [[ $rc -ne 0 ]] || rc=1
  fi
  rm -f "$snapshot"
  local update=()
  [[ "${PROXYEP_UPDATE_TEST_COUNTS:-0}" == 1 ]] && update=(--update)
  if [[ $full -eq 1 ]] &&
    ! "$root/scripts/check-test-counts.py" --build "$root/build/$preset" --junit "$junit" \
      --part "$name" "${update[@]}"; then
    [[ $rc -ne 0 ]] || rc=1
  fi
  return $rc
}
full=1
[[ $# -eq 0 ]] || full=0  # tests chosen by hand: no counts to hold them to

# The sanitizer builds, each noting its exit status in $work/<preset>.status and its output in
# $work/<preset>.log (read by join_build).
work=$(mktemp -d)
trap 'rm -rf "$digest" "$work"' EXIT
sanitizer_builds() {
  local preset rc
  for preset in sanitize tsan; do
    rc=0
    "$root/scripts/build.sh" "$preset" "proxyep_${preset}_tests" >"$work/$preset.log" 2>&1 || rc=$?
    echo "$rc" >"$work/$preset.status"
  done
}

# join_build PRESET: waits for PRESET's build (the background builds' process gone without a
# status counts as a failure), prints its output, returns its status.
join_build() {
  local preset=$1
  until [[ -s "$work/$preset.status" ]] || ! kill -0 "$background_pid" 2>/dev/null; do
    sleep 1
  done
  cat "$work/$preset.log" >&2 2>/dev/null
  [[ -s "$work/$preset.status" ]] || { echo "test.sh: the $preset build ended without a status" >&2; return 1; }
  return "$(cat "$work/$preset.status")"
}

sanitizers=1
[[ "${SKIP_SANITIZERS:-0}" != 1 ]] || sanitizers=0
if [[ $sanitizers -eq 1 ]] && part "release build" "$root/scripts/build.sh" release; then
  # The sanitizer builds (sanitize, then tsan) run in the background at the lowest CPU priority
  # (nice 19), beside the release tests, then the sanitize tests and fuzzing: the tests run one
  # at a time and leave a core idle much of the time (start-ups, waits, deadline cases), which
  # the builds take, while a test that wants both cores still gets them (a nice-19 process gets
  # about 1.5% of a core against a busy nice-0 one). A build's output is printed when its tests
  # are about to run, so the log stays readable.
  (nice -n 19 bash -c "$(declare -f sanitizer_builds); root='$root' work='$work' sanitizer_builds") &
  background_pid=$!
  part "release tests" run_ctest release release "$@"
elif [[ $sanitizers -eq 0 ]] && part "release build" "$root/scripts/build.sh" release; then
  part "release tests" run_ctest release release "$@"
elif [[ $sanitizers -eq 1 ]]; then
  # No release build, so nothing beside which to build: the sanitizer builds run here.
  part "sanitizer builds" sanitizer_builds
fi
if [[ $sanitizers -eq 1 ]]; then
  if part "sanitize build (rest)" join_build sanitize; then
    part "sanitize tests" run_ctest sanitize sanitize -L '^(unit|sanitize|sanitizer_report)$'
    # Two at a time: each fuzzes for a fixed wall time and checks no deadline, so running them
    # side by side halves the part at the cost of half the executions each.
    part "fuzz" run_ctest fuzz sanitize -L '^fuzz$' -j 2
  fi
  if part "tsan build (rest)" join_build tsan; then
    part "tsan tests" run_ctest tsan tsan -L '^(tsan|sanitizer_report)$'
  fi
fi

echo "=== test.sh: summary" >&2
printf '  %s\n' "${summary[@]}" >&2
if [[ -s "$digest" ]]; then
  echo "=== test.sh: why the failed tests failed" >&2
  cat "$digest" >&2
fi
if [[ ${#failed[@]} -ne 0 ]]; then
  echo "test.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
