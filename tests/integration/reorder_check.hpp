// Shared by the integration programs that run with --reorder: proof that the reorder shim really
// reordered. A shim that delivered in order would let every ordering bug through those tests
// unnoticed, so each of them ends with require_reordered(): every rank reports whether its shim
// was on and how many completions, remote and local, it delivered after a later write's
// (fabric::ReorderStats, or BufferStats::reordered_completions), the counts are summed over the
// ranks (one rank may legitimately see none), and the sum must be positive. Collective. The
// smallest programs see a few dozen such completions in all, so the sum is never 0 by chance.
#pragma once

#include "common/error.hpp"
#include "control/bootstrap.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

namespace proxyep::testing {

// `out_of_order`: this rank's count; nullopt when its fabric has no shim (or it has no fabric).
inline void require_reordered(control::Bootstrap& boot, std::optional<uint64_t> out_of_order,
                              const std::string& program) {
  // Per rank: [shim on: 0/1][count], 16 bytes.
  uint64_t mine[2] = {out_of_order ? 1u : 0u, out_of_order.value_or(0)};
  auto all = boot.allgather(std::span(reinterpret_cast<const uint8_t*>(mine), sizeof mine),
                            program + "(reorder stats)");
  uint64_t sum = 0;
  std::string per_rank;
  for (size_t r = 0; r < all.size(); ++r) {
    uint64_t theirs[2] = {0, 0};
    require(all[r].size() == sizeof theirs, program, "rank {} sent {} bytes of reorder stats", r,
            all[r].size());
    std::memcpy(theirs, all[r].data(), sizeof theirs);
    require(theirs[0] == 1, program,
            "rank {} ran without the reorder shim although --reorder was given (no fabric, or "
            "the shim was not opened)",
            r);
    sum += theirs[1];
    per_rank += fmt::format("{}{}", r == 0 ? "" : ", ", theirs[1]);
  }
  require(sum > 0, program,
          "the reorder shim delivered every completion in order on every rank (--reorder must "
          "reorder, or the ordering it tests is never exercised)");
  if (boot.rank() == 0)
    std::fprintf(stderr,
                 "%s: reorder shim: %llu completions delivered out of order (per rank: %s)\n",
                 program.c_str(), static_cast<unsigned long long>(sum), per_rank.c_str());
}

// The count require_reordered() takes, from a Fabric's (or Session's) reorder_stats().
template <typename Stats>
std::optional<uint64_t> out_of_order(const std::optional<Stats>& stats) {
  if (!stats) return std::nullopt;
  return stats->remote_out_of_order + stats->local_out_of_order;
}

}  // namespace proxyep::testing
