#!/usr/bin/env bash
# What a test run left behind on this machine: entries of /dev/shm (libfabric shm regions
# "<pid>:...", Open MPI's segments, Python's semaphores) and processes. scripts/test.sh runs each
# test part under a marker in the environment (PROXYEP_TEST_RUN=<id>), which every process the
# tests start inherits (ranks, daemons, redis-server, node), and checks after the part: a
# leftover fails the part (a leak a user would hit too), and is then cleaned up so the next part
# starts clean.
#
#   leftovers.sh snapshot FILE   record the current /dev/shm entries in FILE
#   leftovers.sh check FILE ID   print what is left: processes whose environment holds
#                                PROXYEP_TEST_RUN=ID (given up to 10 s to finish ending), and
#                                /dev/shm entries that appeared since FILE and that no live
#                                process maps; exit 1 if anything is. Then end those processes
#                                (SIGKILL, by pid) and remove those entries.
set -uo pipefail
mode=${1:?usage: leftovers.sh snapshot|check FILE}
file=${2:?usage: leftovers.sh snapshot|check FILE}

shm_entries() { find /dev/shm -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort; }

if [[ $mode == snapshot ]]; then
  shm_entries >"$file"
  exit 0
fi
[[ $mode == check ]] || { echo "leftovers.sh: unknown mode $mode" >&2; exit 2; }
id=${3:?usage: leftovers.sh check FILE ID}
marker="PROXYEP_TEST_RUN=$id"

# Live (not zombie) processes whose environment holds the marker, this shell excepted.
marked_processes() {
  local environ pid state
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    grep -qzxF "$marker" "$environ" 2>/dev/null || continue
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || continue
    [[ -n $state && $state != Z ]] && echo "$pid"
  done
}

processes=""
for ((i = 0; i < 100; i++)); do
  processes=$(marked_processes)
  [[ -z $processes ]] && break
  sleep 0.1
done
found=0
for pid in $processes; do
  echo "leftovers: process $pid still running: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" >&2
  kill -9 "$pid" 2>/dev/null || true
  found=1
done
[[ -n $processes ]] && sleep 0.5  # their mappings go with them
# New entries that no live process maps (one that is mapped belongs to something running beside
# the tests, e.g. a job of the user's: not ours to judge or remove).
for entry in $(comm -13 "$file" <(shm_entries)); do
  grep -qsF "/dev/shm/$entry" /proc/[0-9]*/maps && continue
  echo "leftovers: /dev/shm/$entry ($(stat -c '%s bytes, owner %U' "/dev/shm/$entry" 2>/dev/null))" >&2
  rm -rf "/dev/shm/${entry:?}"
  found=1
done
exit $found
