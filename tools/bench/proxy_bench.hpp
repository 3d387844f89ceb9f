// `proxyep bench proxy`: the proxy path against the raw fabric, 2 ranks, one provider, in one
// run. Per repetition ("run"), on the same fabric and write size:
//   raw    `bench fabric`'s fi_write ping-pong and streaming (tools/bench/fabric_bench.hpp);
//   proxy  descriptor -> remote flag latency: rank 0 pushes one descriptor into its ring, its
//          proxy posts the write, rank 1's proxy routes the completion to its counter bank, the
//          flag rises, rank 1 answers the same way; half the round trip. Then descriptors/s:
//          rank 0 streams descriptors (its credit window bounds those in flight), rank 1 counts
//          them under one key and answers once.
// Reported: the median over runs of each run's p50 and p99, for both paths, and their ratio.
// Last, the CPU the idle proxy threads of both ranks use over an idle window (/proc).
#pragma once

#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"
#include "tools/commands.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>

namespace proxyep::tools {

struct ProxyBenchOptions {
  size_t size = 8;               // bytes per write (latency and streaming)
  int runs = 5;                  // repetitions of raw + proxy, interleaved
  int latency_iters = 1000;      // timed ping-pongs per run (after a tenth as warm-up)
  size_t stream_writes = 20000;  // descriptors streamed per run
  size_t window = 64;            // writes in flight: raw window and proxy credits
  double idle_seconds = 10;      // idle CPU window; 0 = skip
  int64_t timeout_ms = 30000;    // deadline of every wait
};

// Runs on both ranks; results on rank 0, an empty object elsewhere. The caller's bootstrap
// progress hook is replaced while proxy threads own the rails and restored afterwards.
nlohmann::json run_proxy_bench(control::Bootstrap& bootstrap, fabric::Fabric& fabric,
                               const ProxyBenchOptions& options);
void print_proxy_bench(const nlohmann::json& results);

// Adds `proxyep bench proxy` under `bench` (called by register_bench in cmd_bench.cpp).
void register_bench_proxy(CLI::App& bench, Action& action);

}  // namespace proxyep::tools
