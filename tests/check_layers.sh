#!/usr/bin/env bash
# build.layers_enforced: an include that points up a layer must fail to compile.
#
# For pairs (lower layer L, header H of a layer above or beside L), a one-line probe
# `#include "H"` is compiled with exactly L's library's include directories and definitions (as
# CMake computed them for the build, written to <flags-dir>/L.includes and L.defines) and must
# fail for want of H (GCC: "H: No such file or directory"; Clang: "'H' file not found"). The same
# probe including a header of L, or of a layer below L, must compile, so the test cannot pass
# because the flags are broken; and every probed header must exist, so it cannot pass because a
# header was renamed. Finally, no layer may include through "../" (a path relative to the
# including file escapes the include roots).
#
# Usage: check_layers.sh <c++ compiler> <flags-dir> <include-roots-dir> <repository root>
set -euo pipefail
cxx=$1
flags_dir=$2
roots=$3
repo=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# compile LAYER HEADER: compiles the probe with LAYER's flags; its diagnostics go to $work/err.
compile() {
  local layer=$1 header=$2 flags=() dir define
  [[ -f "$flags_dir/$layer.includes" ]] || { echo "no flags for layer $layer" >&2; exit 2; }
  while IFS= read -r dir; do
    [[ -z "$dir" ]] && continue
    grep -qxF -- "$dir" "$flags_dir/implicit.includes" && continue
    # The layers' include roots as the build passes them; third-party directories as -isystem,
    # as CMake passes imported targets' directories.
    if [[ "$dir" == "$roots"/* ]]; then flags+=("-I$dir"); else flags+=("-isystem" "$dir"); fi
  done < "$flags_dir/$layer.includes"
  while IFS= read -r define; do
    [[ -n "$define" ]] && flags+=("-D$define")
  done < "$flags_dir/$layer.defines"
  [[ -f "$repo/$header" ]] || { fail "probe header $header does not exist (update $0)"; return 2; }
  printf '#include "%s"\n' "$header" > "$work/probe.cpp"
  (cd "$work" && "$cxx" -std=c++20 -fsyntax-only "${flags[@]}" probe.cpp) > "$work/err" 2>&1
}

# sees LAYER HEADER: LAYER's flags compile a probe including HEADER.
sees() {
  local rc=0
  compile "$1" "$2" || rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "ok: $1 sees $2"
  elif [[ $rc -ne 2 ]]; then
    fail "$1 should see $2, but the probe does not compile:"
    sed 's/^/    /' "$work/err" | head -20
  fi
}

# blind LAYER HEADER: LAYER's flags cannot even find HEADER.
blind() {
  local rc=0
  compile "$1" "$2" || rc=$?
  if [[ $rc -eq 0 ]]; then
    fail "$1 can include $2 (an include pointing up a layer compiles)"
  elif [[ $rc -ne 2 ]]; then
    # GCC: "H: No such file or directory"; Clang: "'H' file not found".
    if grep -qF -e "$2: No such file or directory" -e "'$2' file not found" "$work/err"; then
      echo "ok: $1 cannot include $2: $(grep -E 'No such file|file not found' "$work/err" | head -1)"
    else
      fail "$1 including $2 failed, but not for want of the header:"
      sed 's/^/    /' "$work/err" | head -20
    fi
  fi
}

# Each layer sees itself and what is below it...
sees common common/error.hpp
sees fabric fabric/fabric.hpp
sees fabric common/wire.hpp
sees gpu_side gpu_side/ring.hpp
sees gpu_side gpu_side/ep/tensor.hpp
sees gpu_side common/host_memory.hpp
sees control control/signal_router.hpp
sees control common/error_note.hpp
sees proxy proxy/engine/proxy_engine.hpp
sees proxy control/signal_router.hpp
sees proxy fabric/fabric.hpp
sees proxy gpu_side/ring.hpp
sees metrics metrics/metrics_exporter.hpp
sees metrics common/error.hpp
sees integrations integrations/buffer.hpp
sees integrations proxy/session/node_memory.hpp
sees integrations metrics/metrics_sink.hpp
sees daemon daemon/daemon.hpp
sees daemon proxy/session/session.hpp
sees daemon metrics/metrics_exporter.hpp

# ... and nothing above or beside it.
for header in fabric/fabric.hpp gpu_side/ring.hpp control/bootstrap.hpp proxy/engine/proxy_engine.hpp \
              metrics/metrics_sink.hpp integrations/buffer.hpp daemon/daemon.hpp \
              tools/commands.hpp tests/unit/fabric/fabric_pair.hpp; do
  blind common "$header"
done
blind fabric control/bootstrap.hpp
blind fabric gpu_side/ring.hpp
blind fabric proxy/engine/proxy_engine.hpp
blind gpu_side fabric/fabric.hpp
blind gpu_side control/imm_layout.hpp
blind gpu_side proxy/engine/ring_lane.hpp
blind control fabric/transport.hpp
blind control gpu_side/ring.hpp
blind control proxy/engine/proxy_engine.hpp
blind control proxy/engine/route_completion.hpp
blind proxy integrations/buffer.hpp
blind proxy metrics/metrics_sink.hpp
blind metrics proxy/engine/proxy_engine.hpp
blind metrics integrations/buffer.hpp
blind proxy tests/unit/proxy/proxy_pair.hpp
blind integrations tools/commands.hpp
blind integrations daemon/daemon.hpp
blind proxy daemon/daemon.hpp
sees proxy control/daemon_handshake.hpp
blind metrics daemon/daemon_stats.hpp
blind daemon integrations/buffer.hpp
blind daemon tools/commands.hpp

# No layer includes through "../".
escapes=$(cd "$repo" && grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*\.\./' \
            common fabric gpu_side control proxy metrics integrations daemon tools || true)
if [[ -n "$escapes" ]]; then
  fail "includes through ../ escape the include roots:"
  echo "$escapes" | sed 's/^/    /'
fi

# Inside proxy/, the session stands on the engine, never the other way: one library, so only
# the includes can say it.
upward=$(cd "$repo" && grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"proxy/session/' \
           proxy/engine || true)
if [[ -n "$upward" ]]; then
  fail "proxy/engine includes proxy/session (the session stands on the engine):"
  echo "$upward" | sed 's/^/    /'
fi

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "layers enforced: every probe behaved"
