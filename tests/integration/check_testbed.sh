#!/usr/bin/env bash
# check_testbed.sh PROXYEP CASE: the testbed (tools/testbed/: emulated nodes in network
# namespaces, links shaped with tc) end to end. Needs CAP_NET_ADMIN: without it every case but
# `no_capability` exits 77 (skipped), and that one checks the refusal instead. Cases:
#   placement    each node's ranks run in their own namespace, the node's ranks in the same one;
#                the ranks' environment points at the testbed (MASTER_ADDR, FI_TCP_IFACE, testbed.*)
#   shaping      bench fabric across a 0.5 Gbit/s link cannot move more than it carries (a
#                transfer takes at least bytes / rate); the same sizes unshaped move far more
#   cleanup      a failing job and an interrupted one (SIGTERM, also while the testbed is built)
#                leave no namespace; a launcher killed with SIGKILL leaves its namespaces, and
#                the next testbed sweeps them
#   refusals     one node, shm across the links, a latency without netem: clear errors, nothing made
#   no_capability  without CAP_NET_ADMIN, --link fails at once naming it
#   mpi          bench ep and bench ll with the MPI baseline on the testbed: both verified, MPI's
#                daemons started in the nodes' namespaces (its command names the agent), the
#                fabric bytes reported
#   job ARGS...  `proxyep launch ARGS...` (a job on the testbed), then nothing may be left
set -uo pipefail
proxyep=$1
case=$2
fail() { echo "FAIL: $*"; exit 1; }
has_net_admin() { (( (0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 12) & 1 )); }
[[ $case == no_capability ]] || has_net_admin || { echo "SKIP: needs CAP_NET_ADMIN"; exit 77; }
ours() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^proxyep-$1-" || true; }

case $case in
placement)
  out=$("$proxyep" launch -n 4 --ranks-per-node 2 --link 2 --timeout 30 -- sh -c \
    'echo "ns=$(ip netns identify $$) node=$GROUP_RANK master=$MASTER_ADDR iface=$FI_TCP_IFACE gbps=$PROXYEP_TESTBED_LINK_GBPS nss=$PROXYEP_TESTBED_NAMESPACES"' 2>&1) ||
    fail "launch failed: $out"
  echo "$out"
  for r in 0 1 2 3; do
    line=$(grep -E "^\[rank $r\] ns=" <<<"$out") || fail "no line from rank $r"
    [[ $line =~ ns=(proxyep-[0-9]+-[0-9]+-n([0-9]+))\ node=([0-9]+)\ master=10\.200\.0\.1\ iface=pep0\ gbps=2\ nss=(.*) ]] ||
      fail "rank $r: unexpected placement: $line"
    [[ ${BASH_REMATCH[2]} == $((r / 2)) && ${BASH_REMATCH[3]} == $((r / 2)) ]] ||
      fail "rank $r runs in ${BASH_REMATCH[1]}, not node $((r / 2))'s namespace"
    [[ ${BASH_REMATCH[4]} == *"${BASH_REMATCH[1]}"* ]] || fail "testbed.namespaces misses ${BASH_REMATCH[1]}"
  done
  grep -q "testbed: 2 nodes of 2 ranks" <<<"$out" || fail "no testbed line"
  [[ -z $(ours '[0-9]+') ]] || fail "namespaces left: $(ours '[0-9]+')"
  ;;
shaping)
  args=(bench fabric --provider tcp --sizes 65536 --reps 3 --bytes-per-rep 16777216
        --latency-iters 10 --json)
  shaped=$("$proxyep" "${args[@]}" --link 0.5) || fail "bench fabric --link 0.5 failed"
  measured=$(/usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["link_gbps"], r["configured_link_gbps"])' <<<"$shaped") ||
    fail "no link_gbps in: $shaped"
  read -r gbps configured <<<"$measured"
  echo "shaped: $gbps Gbit/s measured over a $configured Gbit/s link"
  # Payload only: it can never exceed the rate the link was shaped to.
  /usr/bin/python3 -c "import sys; sys.exit(0 if 0 < $gbps <= 1.05 * $configured else 1)" ||
    fail "$gbps Gbit/s through a $configured Gbit/s link: the shaping is not real"
  free=$("$proxyep" "${args[@]}" 2>/dev/null) || fail "bench fabric on loopback failed"
  unshaped=$(/usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); print(max(x["gbps"] for x in r["results"]) * 8)' <<<"$free")
  echo "unshaped (loopback): $unshaped Gbit/s"
  /usr/bin/python3 -c "import sys; sys.exit(0 if $unshaped > 2 * $gbps else 1)" ||
    fail "loopback moved $unshaped Gbit/s, not clearly more than the shaped $gbps: the check cannot tell"
  ;;
cleanup)
  out=$("$proxyep" launch -n 2 --ranks-per-node 1 --link 1 --timeout 30 -- sh -c '[ $RANK = 1 ] && exit 3; sleep 20' 2>&1)
  rc=$?
  [[ $rc == 3 ]] || fail "a failing rank gave exit code $rc: $out"
  [[ -z $(ours '[0-9]+') ]] || fail "a failed job left $(ours '[0-9]+')"
  # An interrupted job (SIGTERM to the launcher, once its ranks run) stops its ranks and
  # removes its testbed.
  pids=$(mktemp)
  "$proxyep" launch -n 2 --ranks-per-node 1 --link 1 -- sh -c "echo \$\$ >>$pids; exec sleep 60" &
  launcher=$!
  for _ in $(seq 100); do [[ $(wc -l <"$pids") == 2 ]] && break; sleep 0.1; done
  [[ $(wc -l <"$pids") == 2 ]] || fail "the interrupted job's ranks did not start"
  rm -f "$pids"
  kill -TERM "$launcher"
  wait "$launcher"
  rc=$?
  [[ $rc == 143 ]] || fail "the interrupted launcher exited with $rc, not 128+SIGTERM"
  [[ -z $(ours "$launcher") ]] || fail "an interrupted job left $(ours "$launcher")"
  # SIGTERM early, at delays that land before, while and after the testbed is built (here
  # ~0.2-0.4 s after the start): never a namespace left. (Before the launcher's handlers exist the
  # process ends by the signal or a library's handler: any non-zero exit.)
  for delay in 0.1 0.2 0.25 0.3 0.35 0.4 0.5; do
    "$proxyep" launch -n 2 --ranks-per-node 1 --link 1 -- sleep 60 2>/dev/null &
    launcher=$!
    sleep $delay
    kill -TERM "$launcher"
    wait "$launcher"
    rc=$?
    [[ $rc != 0 ]] || fail "SIGTERM after $delay s: the launcher exited with 0"
    [[ -z $(ours "$launcher") ]] || fail "SIGTERM after $delay s left $(ours "$launcher")"
  done
  # A launcher killed outright cannot clean up: the next testbed must.
  pids=$(mktemp)
  "$proxyep" launch -n 2 --ranks-per-node 1 --link 1 -- sh -c "echo \$\$ >>$pids; exec sleep 60" &
  launcher=$!
  for _ in $(seq 100); do [[ $(wc -l <"$pids") == 2 ]] && break; sleep 0.1; done
  left=$(ours "$launcher")
  [[ $(wc -l <<<"$left") == 3 ]] || fail "the running testbed has not 3 namespaces: $left"
  kill -9 "$launcher"
  wait "$launcher" 2>/dev/null
  xargs -r kill -9 <"$pids"  # the ranks outlive a SIGKILLed launcher; end them ourselves
  rm -f "$pids"
  [[ -n $(ours "$launcher") ]] || fail "nothing left to sweep"
  out=$("$proxyep" launch -n 2 --ranks-per-node 1 --link 1 --timeout 30 -- true 2>&1) || fail "next launch failed: $out"
  [[ -z $(ours "$launcher") ]] || fail "the next testbed did not sweep $(ours "$launcher")"
  grep -Eq "removed [0-9]+ network namespace.*$launcher" <<<"$out" || fail "the sweep was not reported: $out"
  ;;
refusals)
  expect() {  # expect REGEX COMMAND...: fails cleanly with the message, makes nothing
    local regex=$1 out rc
    shift
    out=$("$@" 2>&1)
    rc=$?
    [[ $rc != 0 ]] || fail "accepted: $*"
    grep -Eq -- "$regex" <<<"$out" || fail "'$*' said: $out"
    [[ -z $(ours '[0-9]+') ]] || fail "'$*' left $(ours '[0-9]+')"
  }
  expect "are one node: give --ranks-per-node smaller" "$proxyep" launch -n 2 --link 1 -- true
  expect "the shm provider moves bytes between nodes through shared memory" \
    "$proxyep" bench fabric --provider shm --link 1
  expect "no preset 'p4d'" "$proxyep" launch -n 2 --ranks-per-node 1 --link preset:p4d -- true
  # A latency needs the kernel's netem: refused naming it where there is none, applied where
  # there is.
  out=$("$proxyep" launch -n 2 --ranks-per-node 1 --link 1,10 -- true 2>&1)
  if [[ $? != 0 ]]; then
    grep -q "a latency of 10us needs tc's netem" <<<"$out" || fail "latency refused without naming netem: $out"
  else
    grep -q "10 us one way" <<<"$out" || fail "latency accepted but not reported: $out"
  fi
  [[ -z $(ours '[0-9]+') ]] || fail "the latency case left $(ours '[0-9]+')"
  ;;
no_capability)
  out=$(setpriv --inh-caps=-net_admin --bounding-set=-net_admin -- \
        "$proxyep" launch -n 2 --ranks-per-node 1 --link 1 -- true 2>&1)
  rc=$?
  [[ $rc != 0 ]] || fail "ran without CAP_NET_ADMIN"
  grep -q "needs CAP_NET_ADMIN" <<<"$out" || fail "the refusal does not name CAP_NET_ADMIN: $out"
  ;;
mpi)
  small=(--ranks 4 --ranks-per-node 2 --iters 2 --warmup 1 --baseline mpi --link 4 --json)
  for bench in "ep --tokens 64 --hidden 256 --no-floor" "ll --tokens 16 --hidden 512 --topk 4 --experts 8"; do
    out=$("$proxyep" bench $bench "${small[@]}" 2>/dev/null) || fail "bench $bench on the testbed failed"
    /usr/bin/python3 - "$out" <<'PY' || fail "bench $bench: $out"
import json, sys
r = json.loads(sys.argv[1])
assert r["verified"] and r["baseline"]["verified"], "not verified"
assert "proxyep-netns-agent" in r["baseline"]["command"], "MPI did not start in the namespaces"
f = r["proxyep"]["fabric"]
assert f["dispatch"]["measured_bytes"] > 0 and "link_utilisation" in f["dispatch"], f
PY
  done
  [[ -z $(ours '[0-9]+') ]] || fail "left $(ours '[0-9]+')"
  ;;
job)
  shift 2
  "$proxyep" launch "$@" || fail "the job failed ($?)"
  [[ -z $(ours '[0-9]+') ]] || fail "the job left $(ours '[0-9]+')"
  ;;
*) fail "unknown case $case" ;;
esac
echo "OK: testbed $case"
