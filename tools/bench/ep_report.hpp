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
void attach_baseline(nlohmann::json& results, nlohmann::json baseline);

void print_ep_report(const nlohmann::json& results);

}  // namespace proxyep::tools
