#!/usr/bin/env bash
# peak-memory.sh COMMAND [ARGS...]: runs COMMAND and reports the peak of the proportional set size
# (PSS, /proc/<pid>/smaps_rollup) summed over COMMAND and every process under it, sampled every
# 0.5 s, on stderr as "peak-memory: <MiB> MiB peak PSS, <n> processes at the peak". PSS counts
# memory the ranks of a node share (their arenas are one memfd) once, split among them, so the
# sum is what the job costs the host. Exits with COMMAND's status.
set -uo pipefail
[[ $# -ge 1 ]] || { echo "usage: peak-memory.sh COMMAND [ARGS...]" >&2; exit 2; }
"$@" &
root=$!

# One sample: "<KiB> <processes>" summed over $root and its descendants (one ps, one awk).
sample() {
  local pids
  pids=$(ps -e -o pid=,ppid= | awk -v root="$root" '
    { parent[$1] = $2 }
    END {
      for (p in parent) { q = p; while (q != "" && q != root && q > 1) q = parent[q]; if (q == root) print p }
    }')
  [[ -n $pids ]] || { echo "0 0"; return; }
  # shellcheck disable=SC2046  # one path per pid
  awk '/^Pss:/ { kib += $2; n++; nextfile } END { print kib + 0, n + 0 }' \
    $(printf '/proc/%s/smaps_rollup ' $pids) 2>/dev/null
}

peak_kib=0 peak_procs=0
while kill -0 "$root" 2>/dev/null; do
  read -r kib procs < <(sample)
  if ((kib > peak_kib)); then peak_kib=$kib peak_procs=$procs; fi
  sleep 0.5
done
wait "$root"
rc=$?
echo "peak-memory: $((peak_kib / 1024)) MiB peak PSS, $peak_procs processes at the peak" >&2
exit "$rc"
