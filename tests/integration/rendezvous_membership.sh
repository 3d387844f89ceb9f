#!/usr/bin/env bash
# rendezvous_membership.sh CASE PROXYEP PROBE STRANGER
# Multi-process checks that only a job's own ranks join its rendezvous (docs/SECURITY.md), with
# real processes started by `proxyep launch`:
#   strangers   during a 3-rank job's rendezvous, a stranger claims rank 1 twice (an old-style
#               version 1 hello, then a hello with a guessed MAC) before the real rank 1
#               arrives: the job completes, rank 0 logs both refusals, the launcher's secret
#               file is gone afterwards.
#   two_jobs    job A serves the rendezvous on a port; job B is launched on the same port while
#               A is still meeting: B fails, its ranks naming the other job; A completes and
#               logs the refusals.
#   wrong_secret  one rank of a launch is given another secret file: it is refused with a clear
#               error on its side and the launch fails.
#   config      the secret never appears in `proxyep config` (text or JSON), and a secret on the
#               command line is refused without being echoed.
set -uo pipefail
case_name=$1 proxyep=$2 probe=$3 stranger=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "rendezvous_membership $case_name: FAIL: $*"; exit 1; }
expect() {  # expect FILE REGEX WHAT
  grep -Eq -- "$2" "$1" || { cat "$1"; fail "no line matches /$2/ ($3)"; }
}

case $case_name in
strangers)
  "$proxyep" launch -n 3 --timeout 60 -- sh -c '
    echo "secret file: $PROXYEP_BOOTSTRAP_SECRET_FILE"
    if [ "$RANK" = 1 ]; then
      "$0" --as v1 --claim 1 && "$0" --as bad-mac --claim 1 || exit 9
    fi
    exec "$1"' "$stranger" "$probe" >"$work/out" 2>&1
  code=$?
  cat "$work/out"
  [[ $code -eq 0 ]] || fail "the job failed (exit $code)"
  for rank in 0 1 2; do expect "$work/out" "\[rank $rank\] probe: rank $rank of 3 .* ok" "rank $rank"; done
  expect "$work/out" "\[rank 0\].*rank 0 refused a connection .*claiming rank 1.*protocol version 1" \
    "rank 0 logs the old-style hello"
  expect "$work/out" "\[rank 0\].*rank 0 refused a connection .*claiming rank 1.*does not verify" \
    "rank 0 logs the guessed MAC"
  expect "$work/out" "\[rank 1\] stranger \(bad-mac\): .*rank 0 refused this rank" "the stranger is told"
  file=$(sed -n 's/^\[rank 0\] secret file: //p' "$work/out")
  [[ -n "$file" ]] || fail "proxyep launch gave its ranks no secret file"
  [[ ! -e "$file" && ! -e "$(dirname "$file")" ]] || fail "the secret file $file was left behind"
  ;;
two_jobs)
  port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  flag=$work/job_b_done
  # Job A: rank 0 serves at once; ranks 1 and 2 join only after job B has come and gone.
  "$proxyep" launch -n 3 --master-port "$port" --timeout 90 -- sh -c '
    if [ "$RANK" != 0 ]; then
      i=0; while [ ! -e "$1" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    fi
    exec "$0"' "$probe" "$flag" >"$work/a" 2>&1 &
  job_a=$!
  # Wait until A's rank 0 listens (LISTEN is state 0A in /proc/net/tcp), without connecting to it.
  hex=$(printf '%04X' "$port")
  for _ in $(seq 600); do
    grep -q ":$hex 00000000:0000 0A" /proc/net/tcp && break
    sleep 0.1
  done
  grep -q ":$hex 00000000:0000 0A" /proc/net/tcp || { touch "$flag"; wait $job_a; cat "$work/a"; fail "job A never listened"; }
  "$proxyep" launch -n 3 --master-port "$port" --timeout 60 -- "$probe" >"$work/b" 2>&1
  code_b=$?
  touch "$flag"
  wait $job_a
  code_a=$?
  echo "--- job A (exit $code_a)"; cat "$work/a"
  echo "--- job B (exit $code_b)"; cat "$work/b"
  [[ $code_a -eq 0 ]] || fail "job A failed"
  [[ $code_b -ne 0 ]] || fail "job B succeeded on job A's port"
  expect "$work/b" "\[rank [12]\].*serves another job: its job id is 'launch-[0-9a-f]+', this rank's is 'launch-[0-9a-f]+'" \
    "job B's ranks name the other job"
  expect "$work/a" "\[rank 0\].*rank 0 refused a connection .*it belongs to job 'launch-" \
    "job A's rank 0 logs the refusal"
  for rank in 0 1 2; do expect "$work/a" "\[rank $rank\] probe: rank $rank of 3 .* ok" "job A rank $rank"; done
  ;;
wrong_secret)
  ( umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/other_secret" )
  PROXYEP_BOOTSTRAP_TIMEOUT_MS=3000 "$proxyep" launch -n 2 --timeout 60 -- sh -c '
    [ "$RANK" = 1 ] && export PROXYEP_BOOTSTRAP_SECRET_FILE="$1"
    exec "$0"' "$probe" "$work/other_secret" >"$work/out" 2>&1
  code=$?
  cat "$work/out"
  [[ $code -ne 0 ]] || fail "a rank with another secret joined"
  expect "$work/out" "\[rank 1\].*bootstrap.rendezvous: rank 0 refused this rank: its proof of the job's secret does not verify" \
    "rank 1 is told why"
  ;;
config)
  secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  PROXYEP_BOOTSTRAP_SECRET=$secret "$proxyep" config >"$work/text" 2>&1 || fail "proxyep config failed"
  PROXYEP_BOOTSTRAP_SECRET=$secret "$proxyep" config --json >"$work/json" 2>&1 || fail "config --json failed"
  cat "$work/text"
  for out in text json; do
    if grep -q "$secret" "$work/$out"; then fail "the secret appears in proxyep config ($out)"; fi
  done
  expect "$work/text" "bootstrap.secret +=.*<redacted>.*environment" "the secret is shown as set"
  ( umask 077; echo "$secret" >"$work/secret" )
  PROXYEP_BOOTSTRAP_SECRET_FILE=$work/secret "$proxyep" config --json >"$work/json2" 2>&1
  if grep -q "$secret" "$work/json2"; then fail "the secret file's content appears in proxyep config"; fi
  "$proxyep" --set "bootstrap.secret=$secret" config >"$work/cli" 2>&1 && fail "a secret on the command line was accepted"
  cat "$work/cli"
  expect "$work/cli" "is a secret" "the refusal says why"
  if grep -q "$secret" "$work/cli"; then fail "the refused secret was echoed"; fi
  ;;
*)
  echo "unknown case $case_name"; exit 2 ;;
esac
echo "rendezvous_membership $case_name: PASS"
