// The same-run memory floor of `bench ep`: what the machine's memory allows for moving one rank's
// received rows, measured by the same ranks in the same launch, so that "dispatch+combine is
// within N x of the memory limit" can be read off one run rather than from a figure taken on
// another day under other load.
//
// Each rank, once its Buffer is gone (no proxy thread busy-polls meanwhile) and all ranks at once
// (they contend for memory bandwidth as the real calls do), times `warmup` + `iters` repetitions
// of barrier, t0, one std::memcpy of B bytes between two buffers written before timing (no page
// fault is timed), t1, where B = the bytes of this rank's dispatch output rows (received rows x
// the row format: BF16, or FP8 with its scales). Like every row: the slowest rank per
// iteration, p50/p95/p99, GB/s = mean B over ranks / p50.
//
// The floor of dispatch+combine is 2 copies: dispatch must write every received row once and
// combine must read every received row once. (With FP8 dispatch, combine still reads BF16 rows,
// twice the FP8 bytes, so the floor is low and the ratio to it errs high.)
#pragma once

#include "control/bootstrap.hpp"
#include "tools/bench/ep_stats.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

namespace proxyep::tools {

// One rank's side (collective): {"bytes": B, "seconds": [one per timed repetition]}. With
// B = 0 (no row received) the rank copies nothing and reports no sample, but joins every
// barrier, so the other ranks keep their schedule.
nlohmann::json time_memcpy_floor(control::Bootstrap& bootstrap, size_t bytes, int warmup,
                                 int iters);

// Rank 0: the "memcpy_floor" row from every rank's report (time_memcpy_floor's figures under
// "memcpy_floor"): phase_json's figures plus "bytes_per_rank", "dispatch_combine_floor_us"
// (2 x the p50) and "dispatch_combine_over_floor" (total_p50_us over that). Null when some rank
// did not time it (--no-floor) or no rank received a row.
nlohmann::json memcpy_floor_json(const RankReports& reports, double total_p50_us);

// The report's line on the floor of a side ("proxyep" of the JSON), "" when it has none.
std::string memory_floor_line(const nlohmann::json& side);

}  // namespace proxyep::tools
