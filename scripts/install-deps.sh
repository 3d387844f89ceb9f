#!/usr/bin/env bash
# Installs the Debian packages ProxyEP builds and tests with. Idempotent: when every package is
# already installed it returns at once without touching apt.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libfabric-dev libfabric-bin libhwloc-dev hwloc
  libconcurrentqueue-dev doctest-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  prometheus-cpp-dev  # the metrics endpoint (metrics/): Prometheus text exposition over HTTP
  libssl-dev  # libcrypto: HMAC-SHA256 and the CSPRNG (bootstrap membership proof, memory keys)
  openmpi-bin libopenmpi-dev  # the MPI_Alltoallv baseline of `proxyep bench ep --baseline mpi`
  # The sanitizer builds (presets sanitize, tsan): Clang, its sanitizer and libFuzzer runtimes
  # (-fsanitize=fuzzer links libclang-rt-14-dev's), and llvm-symbolizer in PATH for the reports.
  clang-14 libclang-rt-14-dev llvm
  # The Python packages (python/: proxyep, deep_ep) for /usr/bin/python3 and their tests:
  # pybind11 and DLPack's header to build the module, torch and pytest to run the tests.
  python3-dev pybind11-dev libdlpack-dev python3-torch python3-pytest
  python3-prometheus-client  # the metrics tests parse the endpoint with Prometheus' own parser
  python3-mpi4py  # deep_ep.Buffer(comm=...): setup through an mpi4py communicator (test_mpi4py.py)
  redis-server  # proxyep.rl's persistent coordinator store; its tests start a real one on loopback
  python3-redis  # the coordinator's Redis client (redis-py)
  python3-boto3  # proxyep.rl.train.object_store.S3Store: checkpoints to any S3-compatible endpoint
  python3-hypothesis  # property tests (the experience buffer's staleness bound over random schedules)
  python3-matplotlib  # the PNG plots of `python3 -m proxyep.bench rl` (Agg backend, no display)
  # The testbed (docs/TESTBED.md): ip and tc build the namespaces and shaped links, nsenter and
  # unshare put ranks (and the MPI baseline) into them.
  iproute2 util-linux
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
# Node.js and npm for tests/deploy/validate_k8s.mjs (the Kubernetes manifests of deploy/). Checked
# by command, not by package: an image may carry NodeSource's nodejs, which bundles npm and
# conflicts with Debian's npm package.
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)

if [[ ${#missing[@]} -ne 0 ]]; then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The npm packages of the Node.js test tools, exactly as each package-lock.json pins them: tests/deploy
# (yaml, kubernetes-models) and tests/python/rl/s3 (s3rver, the S3-compatible server of the
# checkpoint tests). Again only when node_modules is missing or older than the lock file (npm ci
# writes node_modules/.package-lock.json last, so it marks a complete install).
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
npm_ci() {
  local dir="$repo/$1"
  local stamp="$dir/node_modules/.package-lock.json"
  if [[ -f "$dir/package-lock.json" && ( ! -f "$stamp" || "$dir/package-lock.json" -nt "$stamp" ) ]]; then
    echo "install-deps: npm ci --prefix $1" >&2
    npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null
  fi
}
npm_ci tests/deploy
npm_ci tests/python/rl/s3
