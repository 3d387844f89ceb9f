// The report of `proxyep bench ep`: ProxyEP's figures and the baseline's side by side (its rows
// named by its variant, "mpi" or "mpi-records"), their ratio, and the overall verdict. JSON
// (--json) carries every figure; the table the main ones.
#pragma once

#include <nlohmann/json.hpp>

namespace proxyep::tools {

// Adds the baseline (or null) to rank 0's results and derives "verified" (ProxyEP's and the
// baseline's outputs matched the reference) and "speedup_vs_baseline" (the baseline's
// dispatch+combine p50 over ours; null without a baseline). With "normal" (bench ll: normal mode
// on the same tokens) its verdict counts too, and "speedup_vs_normal" is its p50 over ours.
// `upper_bracket` (null unless the baseline ran off the testbed across emulated nodes): the
// baseline again with shared memory between every pair, kept as "baseline_upper_bracket" with
// "speedup_vs_baseline_upper_bracket"; its verdict counts too.
void attach_baseline(nlohmann::json& results, nlohmann::json baseline,
                     nlohmann::json upper_bracket = nullptr);

// Prints the two MPI brackets' ratios and what they mean, when the run has both (else nothing).
void print_baseline_brackets(const nlohmann::json& results);

void print_ep_report(const nlohmann::json& results);

}  // namespace proxyep::tools
