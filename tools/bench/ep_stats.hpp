// Timing figures of the EP benchmarks, one convention for `bench ep` and the MPI baseline:
// every rank times each iteration of a phase itself (after a barrier); an iteration's time is
// the slowest rank's, since a collective is done only when every rank is; p50/p95/p99 are taken
// over the timed iterations; GB/s = (bytes per rank, averaged over ranks, DeepEP's convention)
// / 1e9 / p50 time.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <vector>

namespace proxyep::tools {

inline double seconds_between(std::chrono::steady_clock::time_point a,
                              std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Timings of one rank: seconds per timed iteration of each phase.
struct EpRankTimings {
  std::vector<double> dispatch, cached_dispatch, combine, total;  // total = dispatch + combine
};

// Element-wise maximum over ranks: per_rank[r][i] -> out[i].
std::vector<double> slowest_rank(const std::vector<std::vector<double>>& per_rank);

// {"us": {"p50","p95","p99","min","max"}, "samples_us": [...], "gbps": ..., "rdma_gbps": ...}
// (GB/s from the p50; "gbps" / "rdma_gbps" only when bytes / rdma_bytes are given).
nlohmann::json phase_json(const std::vector<double>& seconds, const std::vector<double>& bytes,
                          const std::vector<double>& rdma_bytes = {});

}  // namespace proxyep::tools
