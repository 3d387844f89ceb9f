// `proxyep bench fabric`: RMA write-with-immediate bandwidth and latency between 2 ranks on one
// libfabric provider, straight on the fabric layer (no rings, no proxy): the raw baseline the
// proxy path is later compared against.
//
// Bandwidth, per size and repetition: rank 0 streams `bytes_per_rep` of writes to rank 1 with at
// most `window` in flight; rank 1 counts their remote completions (the only proof of arrival on
// EFA) and answers with a zero-length write; the time from the first post to that answer gives
// GB/s (1e9 bytes/s). Latency: ping-pong of one write each way, half the round trip.
#pragma once

#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <vector>

namespace proxyep::tools {

struct FabricBenchOptions {
  std::vector<size_t> sizes;         // default 4 KiB .. 1 MiB, powers of two
  size_t window = 64;                // writes in flight
  size_t bytes_per_rep = 32u << 20;  // bytes streamed per bandwidth repetition
  size_t min_writes_per_rep = 256;
  int reps = 7;                // timed bandwidth repetitions per size (after one warm-up)
  int latency_iters = 300;     // timed ping-pongs per size (after a tenth as warm-up)
  int64_t timeout_ms = 30000;  // deadline of every wait
};

std::vector<size_t> default_fabric_bench_sizes();

// Runs on both ranks (rank 0 drives); returns the results on rank 0, an empty object elsewhere.
// Throws proxyep::Error naming the phase and the peer when a wait runs past its deadline.
nlohmann::json run_fabric_bench(control::Bootstrap& bootstrap, fabric::Fabric& fabric,
                                const FabricBenchOptions& options);

// Human-readable table of run_fabric_bench's results.
void print_fabric_bench(const nlohmann::json& results);

}  // namespace proxyep::tools
