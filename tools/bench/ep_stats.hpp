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

// {"us": {"p50","p95","p99","min","max"}, "samples_us": [...], "gbps": ..., "rdma_gbps": ...,
// "msgs_per_s": ...} (rates from the p50, per rank averaged over ranks; each only when its
// per-rank figures are given: bytes, bytes over the fabric, messages to other nodes).
nlohmann::json phase_json(const std::vector<double>& seconds, const std::vector<double>& bytes,
                          const std::vector<double>& rdma_bytes = {},
                          const std::vector<double>& messages = {});

// Rank 0's view of every rank's report ({phase: [seconds...], "diff": "...", optionally
// "reordered_completions": n}), as the benchmarks gather them.
using RankReports = std::vector<nlohmann::json>;

// slowest_rank over the reports' samples of `phase`.
std::vector<double> slowest_rank(const RankReports& reports, const char* phase);

// Adds "verified" (no rank reported a difference from the reference), "mismatches" (each rank's
// difference) and, when every rank ran with the reorder shim, "reorder_shim":
// {"completions_out_of_order": sum over ranks}.
void add_verdict(nlohmann::json& out, const RankReports& reports);

}  // namespace proxyep::tools
