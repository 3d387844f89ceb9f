// Where the bench's calls spend their time: the Buffer's per-phase times (BufferStats::
// dispatch_phases / combine_phases, integrations/buffer.hpp) summed over the timed iterations,
// apart for fresh dispatches, combines and cached dispatches, then averaged per call and over the
// ranks. What `bench ep --breakdown` prints and every JSON report carries ("phases").
#pragma once

#include "integrations/buffer.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace proxyep::tools {

struct EpPhaseTally {
  PhaseTimes dispatch, combine, cached_dispatch;  // sums over the timed calls
};

// Adds what happened between two snapshots of one kind's phases to `into`.
void add_phase_delta(PhaseTimes& into, const PhaseTimes& before, const PhaseTimes& after);

// One rank's tally as {"dispatch": {"prepare_us": ..., ..., "sum_us": ...}, ...}: microseconds
// per call.
nlohmann::json phases_json(const EpPhaseTally& tally);

// The mean over ranks of their phases_json() (ranks without "phases" are skipped; null if none).
nlohmann::json mean_phases(const std::vector<nlohmann::json>& per_rank);

// The names of the phases in the order the calls run them (the JSON keys less "_us").
const std::vector<const char*>& phase_names();

// mean_phases()' figures as a table (a row per phase, a column per kind of call, us per call),
// for --breakdown; "" for null.
std::string format_phases(const nlohmann::json& phases);

}  // namespace proxyep::tools
