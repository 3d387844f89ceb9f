// The Buffer's creation time in the benchmarks' reports, step by step (BufferStats::setup_steps):
// each rank reports its steps, rank 0 gives each step's median and slowest rank, so a start that
// grows with the ranks names its step (the allgathers, the fabric's connections, registration).
#pragma once

#include "common/step_clock.hpp"
#include "tools/bench/ep_stats.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace proxyep::tools {

// A rank's steps: [{"step": name, "s": wall seconds, "cpu_s": CPU seconds}, ...] in order.
nlohmann::json setup_steps_json(const StepClock::Steps& steps);

// Rank 0: every report's "setup" -> [{"step", "p50_ms", "max_ms", "cpu_p50_ms"}, ...] in rank
// 0's order (wall: median and slowest rank; CPU: median), the last entry "total" (each rank's
// sum); null when no report has steps.
nlohmann::json setup_summary(const RankReports& reports);

// One line for the tables: "  <label>Buffer setup: p50 X ms, slowest rank Y ms; slowest steps:
// ..." (the three with the largest max), or "" for a null summary.
std::string format_setup(const nlohmann::json& summary, std::string_view label = "");

}  // namespace proxyep::tools
