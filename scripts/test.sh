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
# The sanitizer builds build only what their tests run, and they run beside the release tests
# at the lowest CPU priority (the summary's "sanitizer builds" time is what was left of them
# after the release tests). SKIP_SANITIZERS=1 runs the release part only, for a quick local run;
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

# sanitizer_builds: the sanitize and tsan builds, one after the other; the tsan part is noted as
# failed in $1 when its build failed (the sanitize part's status is the function's).
sanitizer_builds() {
  local tsan_status=$1 rc=0
  "$root/scripts/build.sh" sanitize proxyep_sanitize_tests || rc=$?
  "$root/scripts/build.sh" tsan proxyep_tsan_tests || echo failed >"$tsan_status"
  return $rc
}

sanitizers=1
[[ "${SKIP_SANITIZERS:-0}" != 1 ]] || sanitizers=0
background_pid=""
background_log=$(mktemp)
tsan_status=$(mktemp)
trap 'rm -f "$digest" "$background_log" "$tsan_status"' EXIT
if part "release build" "$root/scripts/build.sh" release; then
  # The sanitizer builds run beside the release tests at the lowest CPU priority (nice 19): the
  # tests run one at a time and leave a core idle much of the time (start-ups, waits, deadline
  # cases), which the builds take, while a test that wants both cores still gets them (a nice-19
  # process gets about 1.5% of a core against a busy nice-0 one). Their output is printed after
  # the tests, so the log stays readable.
  if [[ $sanitizers -eq 1 ]]; then
    (nice -n 19 bash -c "$(declare -f sanitizer_builds); root='$root'; sanitizer_builds '$tsan_status'") \
      >"$background_log" 2>&1 &
    background_pid=$!
  fi
  part "release tests" run_ctest release release "$@"
fi
if [[ $sanitizers -eq 1 ]]; then
  # join_sanitizer_builds: waits for the background builds (or runs them, when the release build
  # failed and none started) and prints their output.
  join_sanitizer_builds() {
    local rc=0
    if [[ -n "$background_pid" ]]; then
      wait "$background_pid" || rc=$?
      cat "$background_log" >&2
    else
      sanitizer_builds "$tsan_status" || rc=$?
    fi
    return $rc
  }
  if part "sanitizer builds" join_sanitizer_builds; then
    part "sanitize tests" run_ctest sanitize sanitize -L '^(unit|sanitize|sanitizer_report)$'
    # Two at a time: each fuzzes for a fixed wall time and checks no deadline, so running them
    # side by side halves the part at the cost of half the executions each.
    part "fuzz" run_ctest fuzz sanitize -L '^fuzz$' -j 2
  fi
  if [[ -s "$tsan_status" ]]; then
    summary+=("$(printf '%-22s %5s    %s' "tsan build" "" "FAILED (output above)")")
    failed+=("tsan build")
  else
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
