// What a call moved between nodes, measured, beside what DeepEP's conventions say it should
// move, and how busy it kept the links: the figures that judge an internode design on the
// testbed (tools/testbed/), where the fabric is the bottleneck as on EFA.
//
// Measured: each rank's BufferStats::bytes_to_fabric (row bytes posted to other nodes) across
// one untimed call of each phase; the routing is the same every iteration, so one call stands
// for all. Convention: the bytes DeepEP's design moves for the same call (normal mode: one row
// per (token, other node it reaches), node-deduplicated, the least any design must send;
// low-latency: one message per (token, expert) on another node). Link utilisation: the busiest
// node's measured bytes per p50 call time over its link's rate (testbed.link_gbps), on the testbed
// only.
#pragma once

#include "tools/bench/ep_stats.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::tools {

// One rank's measured bytes, as it puts them in its report ("fabric_bytes").
struct CallFabricBytes {
  uint64_t dispatch = 0;
  uint64_t combine = 0;
};
nlohmann::json to_json(const CallFabricBytes& bytes);

// Rank 0, from every rank's report: per phase {"measured_bytes_per_rank", "measured_bytes",
// "convention_bytes", "measured_over_convention", and on the testbed "link_utilisation" (and
// "link_gbps" once), "convention": `convention`}. `convention_*` per rank; `*_p50_us` the phase's
// p50 call time.
nlohmann::json fabric_bytes_json(const RankReports& reports, int ranks_per_node,
                                 const std::string& convention,
                                 const std::vector<double>& convention_dispatch,
                                 const std::vector<double>& convention_combine,
                                 double dispatch_p50_us, double combine_p50_us);

// Two lines for the text report, each after `label` ("" when nothing crossed nodes).
std::string format_fabric_bytes(const nlohmann::json& fabric, std::string_view label = "");

}  // namespace proxyep::tools
