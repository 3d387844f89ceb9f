#!/usr/bin/env bash
# check_tune.sh PROXYEP choice|timeout: `proxyep tune` end to end on a tiny EP shape.
#
# choice: a list it cannot use is refused before any run; a real search (threads 1, both pins,
# two chunk sizes, one eager size: 3 runs, the 2 of stage 1 each with a small bench proxy)
# prints its progress, a table with exactly one chosen row whose stage-1 rows carry the proxy
# p50 and descriptors/s (stage 2's row leaves them blank), and writes a config file holding
# exactly the four tuned parameters with the chosen row's values; `PROXYEP_CONFIG=<file> proxyep
# config --json` reports those values with source "config file"; a second tune refuses to
# overwrite the file without --force, and replaces it with --force (with --no-proxy-bench: no
# proxy columns, no proxy figures in its progress).
# timeout: a run far longer than --timeout 1 is stopped; the candidate is reported failed, the
# tune exits non-zero naming the timeout, writes nothing, and leaves no process behind.
set -uo pipefail
proxyep=$1
mode=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
fail() { echo "check_tune: FAIL: $*"; status=1; }
shape=(--tokens 64 --hidden 512 --iters 3 --warmup 1)

if [[ $mode == choice ]]; then
  # A malformed list: refused at once, before any run, naming the item.
  timeout 20 "$proxyep" tune "${shape[@]}" --threads 0..x --output "$work/bad.json" \
    >"$work/bad.out" 2>"$work/bad.err"
  code=$?
  cat "$work/bad.err"
  [[ $code -ne 0 && $code -ne 124 ]] || fail "--threads 0..x exited with $code"
  grep -q "\-\-threads '0..x': 'x' is not an integer" "$work/bad.err" ||
    fail "--threads 0..x: the error does not name the item"
  grep -q '^\[1/' "$work/bad.err" && fail "--threads 0..x: a run started"
  [[ -e $work/bad.json ]] && fail "--threads 0..x: a file was written"

  out=$work/tuned.json
  timeout 50 "$proxyep" tune "${shape[@]}" --threads 1..1 --chunk-bytes 64K,1M \
    --eager-bytes 128K --timeout 20 --proxy-runs 1 --proxy-latency-iters 200 \
    --proxy-stream 2000 --output "$out" >"$work/run.out" 2>"$work/run.err"
  code=$?
  cat "$work/run.err" "$work/run.out"
  [[ $code -eq 0 ]] || fail "tune exited with $code"
  for n in 1 2; do
    grep -q "^\[$n/3\] threads=1 pin=.*: p50 [0-9.]* us.*; proxy p50 [0-9.]* us, [0-9]* descriptors/s$" \
      "$work/run.err" || fail "no progress line [$n/3] with the proxy figures"
  done
  grep -q "^\[3/3\] threads=1 pin=.*: p50 [0-9.]* us, p99 [0-9.]* us, [0-9.]* GB/s$" "$work/run.err" ||
    fail "no progress line [3/3] (stage 2, without bench proxy)"
  grep -q "proxy.threads *proxy.pin *ep.chunk_bytes *ep.eager_bytes *GB/s *p50 us *p99 us *proxy p50 us *proxy desc/s$" \
    "$work/run.out" || fail "no table header with the proxy columns"
  rows=$(grep -Ec '^[* ] [123] ' "$work/run.out")
  chosen=$(grep -Ec '^\* [123] ' "$work/run.out")
  [[ $rows -eq 3 ]] || fail "$rows table rows, expected 3"
  [[ $chosen -eq 1 ]] || fail "$chosen rows marked chosen, expected 1"
  grep -q "^chosen (\*): .*, then the lower proxy p50)$" "$work/run.out" ||
    fail "the chosen line does not state the proxy tie-break"
  # Stage 1's rows: the EP figures, then the proxy p50 (us) and descriptors/s, numbers > 0;
  # stage 2's row: the EP figures only.
  /usr/bin/python3 - "$work/run.out" <<'EOF' || fail "the proxy columns do not hold numbers for stage 1 only"
import re, sys
rows = [l[2:].split() for l in open(sys.argv[1]) if re.match(r"[* ] [123] ", l)]
print("rows:", rows)
assert len(rows) == 3, rows
for r in rows:
    figures = [float(x) for x in r[5:]]
    if r[0] == "1":
        assert len(figures) == 5, r
        assert figures[3] > 0 and figures[4] > 0, r
    else:
        assert len(figures) == 3, r
EOF
  # The chosen row, the file and `proxyep config` must agree, value for value.
  /usr/bin/python3 - "$work/run.out" "$out" <<'EOF' || fail "the config file does not match the chosen row"
import json, re, sys
row = next(l for l in open(sys.argv[1]) if l.startswith("* "))
stage, threads, pin, chunk, eager = row.split()[1:6]
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
size = lambda t: int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t)
doc = json.load(open(sys.argv[2]))
expected = {"proxy.threads": int(threads), "proxy.pin": pin == "true",
            "ep.chunk_bytes": size(chunk), "ep.eager_bytes": size(eager)}
print("chosen row:", expected, "file:", doc)
assert doc == expected, (doc, expected)
assert expected["proxy.threads"] == 1 and expected["ep.eager_bytes"] == 128 << 10
assert expected["ep.chunk_bytes"] in (64 << 10, 1 << 20)
EOF
  PROXYEP_CONFIG=$out "$proxyep" config --json >"$work/config.json" ||
    fail "PROXYEP_CONFIG=$out proxyep config failed"
  /usr/bin/python3 - "$work/config.json" "$out" <<'EOF' || fail "proxyep config does not show the tuned values from the file"
import json, sys
params = {p["name"]: p for p in json.load(open(sys.argv[1]))}
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
for name, value in json.load(open(sys.argv[2])).items():
    p = params[name]
    text = p["value"]
    shown = (text == "true") if isinstance(value, bool) else (
        int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    print(name, "=", text, f"[{p['source']}]")
    assert p["source"] == "config file", p
    assert shown == value, (name, shown, value)
EOF

  # An existing file: refused before any run without --force; replaced with it.
  before=$(cat "$out")
  timeout 20 "$proxyep" tune "${shape[@]}" --threads 1 --pin true --chunk-bytes 64K \
    --eager-bytes 128K --output "$out" >"$work/again.out" 2>"$work/again.err"
  code=$?
  cat "$work/again.err"
  [[ $code -ne 0 && $code -ne 124 ]] || fail "overwrite without --force exited with $code"
  grep -q "the file exists; pass --force to replace it" "$work/again.err" ||
    fail "overwrite without --force: no clear message"
  grep -q '^\[1/' "$work/again.err" && fail "overwrite without --force: a run started"
  [[ "$(cat "$out")" == "$before" ]] || fail "the file changed without --force"
  timeout 30 "$proxyep" tune "${shape[@]}" --threads 1 --pin true --chunk-bytes 64K \
    --eager-bytes 128K --no-proxy-bench --output "$out" --force >"$work/force.out" \
    2>"$work/force.err" || fail "tune --force failed: $(cat "$work/force.err")"
  cat "$work/force.err" "$work/force.out"
  grep -q "GB/s *p50 us *p99 us$" "$work/force.out" ||
    fail "--no-proxy-bench: the table header is not the EP columns alone"
  grep -qi "proxy p50\|desc/s\|bench proxy\|then the lower proxy" "$work/force.out" "$work/force.err" &&
    fail "--no-proxy-bench: proxy figures or columns shown"
  grep -Eq '^\* 1 +1 +true +64K +128K +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$work/force.out" ||
    fail "--no-proxy-bench: the row is not the EP figures alone"
  /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ep.chunk_bytes"] == 65536 and d["proxy.pin"] is True, d' \
    "$out" || fail "--force did not replace the file"
elif [[ $mode == timeout ]]; then
  # Every process of the tune inherits this variable: any still alive afterwards is a leftover.
  export TUNE_CHECK_MARK=$work
  start_ms=$(($(date +%s%N) / 1000000))
  timeout 40 "$proxyep" tune --tokens 128 --hidden 1024 --iters 1000000 --warmup 0 \
    --threads 1 --pin true --chunk-bytes 1M --eager-bytes 128K --timeout 1 \
    --output "$work/never.json" >"$work/run.out" 2>"$work/run.err"
  code=$?
  elapsed_ms=$(($(date +%s%N) / 1000000 - start_ms))
  cat "$work/run.err" "$work/run.out"
  echo "check_tune: exit code $code after $elapsed_ms ms"
  [[ $code -ne 0 && $code -ne 124 ]] || fail "exit code $code (expected a failure of its own)"
  grep -q "failed: timed out after 1 s (stopped)" "$work/run.err" ||
    fail "the candidate is not reported as timed out"
  grep -q "every candidate failed; no config written" "$work/run.err" ||
    fail "no clear final error"
  [[ -e $work/never.json ]] && fail "a config file was written"
  ((elapsed_ms < 15000)) || fail "took $elapsed_ms ms"
  sleep 0.2
  for environ in /proc/[0-9]*/environ; do
    if { tr '\0' '\n' <"$environ"; } 2>/dev/null | grep -qx "TUNE_CHECK_MARK=$work"; then
      pid=${environ#/proc/}
      pid=${pid%/environ}
      [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
      fail "process $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)) was left behind"
      kill -KILL "$pid" 2>/dev/null
    fi
  done
else
  echo "usage: check_tune.sh PROXYEP choice|timeout"
  exit 2
fi
((status == 0)) && echo "check_tune $mode: PASS"
exit $status
