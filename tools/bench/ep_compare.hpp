// `proxyep bench ep|ll --compare FILE`: this run's timings against a saved `--json` run, so that a
// regression shows as a ratio rather than as two tables to read side by side.
//
// Before any rank starts, load_saved_run reads FILE and refuses (proxyep::Error, phase
// "bench.ep.compare" or "bench.ll.compare") a missing or unreadable file, a document that is not
// a `--json` run of the same benchmark, and one of another shape -- tokens, hidden, top-k,
// experts or ranks differ -- whose times measure other work. Any other difference (ranks per
// node, FP8, routing, seed, iterations, warm-up, --hook, the provider, the Buffer sizes) is
// compared all the same and named in "differences": comparing the fabric path with the
// intranode one, or FP8 with BF16, can be the point of the comparison.
//
// After the run, compare_runs gives the "compare" object of this run's JSON:
//   {"file": FILE, "benchmark": "ep" | "ll", "baseline_variant": this run's (with a baseline),
//    "differences": ["ranks_per_node: saved 2, now 1", ...], "notes": [...],
//    "paths": {side: {phase: {"p50": {"now", "saved", "ratio"}, "p99": {...}}}}}
// in microseconds, ratio = now / saved (below 1: faster now), for every phase timed in both runs.
// Sides: "proxyep", "normal" (bench ll's normal mode) and "baseline" when both runs ran the same
// baseline variant (a note says why not otherwise).
#pragma once

#include "tools/bench/ep_options.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace proxyep::tools {

// The saved run, checked against this run's workload and rank count (see above).
nlohmann::json load_saved_run(const std::string& path, const EpWorkloadCli& workload, int ranks);

nlohmann::json compare_runs(const nlohmann::json& now, const nlohmann::json& saved,
                            const std::string& path);

// The comparison as a table (after the report), its differences and notes.
void print_comparison(const nlohmann::json& compare);

}  // namespace proxyep::tools
