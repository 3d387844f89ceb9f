// The links between the emulated nodes of the testbed (tools/testbed/): how `--link` and the
// `launch.link` parameter are written, and the presets that stand for real machines.
//
//   GBPS[,LATENCY_US]          each node's link, Gbit/s per direction, and one-way latency
//   preset:NAME[,LATENCY_US]   a machine's NVLink:fabric ratio, scaled to this box at launch
//
// A preset keeps a machine's *ratio* between what a GPU moves inside its node (NVLink, per
// direction) and what it moves to other nodes (its share of the node's EFA), because that
// ratio, not the absolute rates, decides which design wins. The launcher scales it to this box
// (tools/testbed/link_rate.hpp): per rank, what one core copies in shared memory here, divided
// by the ratio; per node, that times the ranks on the node. Pure parsing: nothing here touches
// the system.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace proxyep {

struct LinkPreset {
  std::string_view name;
  int gpus_per_node;             // the machine's ranks per node (the default --ranks-per-node)
  double nvlink_gbytes_per_gpu;  // NVLink, GB/s per direction
  double fabric_gbytes_per_gpu;  // the GPU's share of the node's EFA, GB/s per direction
  std::string_view source;       // where the two figures come from
  double ratio() const { return nvlink_gbytes_per_gpu / fabric_gbytes_per_gpu; }
};

// p5, p5en, p6-b200, in that order.
const std::vector<LinkPreset>& link_presets();
// nullptr when there is no preset of that name.
const LinkPreset* find_link_preset(std::string_view name);

struct LinkSpec {
  double gbps = 0;        // per node and direction; 0 with a preset (set at launch)
  double latency_us = 0;  // one way; 0 = none added
  const LinkPreset* preset = nullptr;
};

// The most and least a link may be given (Gbit/s), and the largest latency (us).
inline constexpr double kMinLinkGbps = 0.001;
inline constexpr double kMaxLinkGbps = 1000;
inline constexpr double kMaxLinkLatencyUs = 1e6;

// Parses the forms above; throws proxyep::Error(phase "launch.link") naming what is wrong.
LinkSpec parse_link_spec(std::string_view text);
// "" when `text` is empty or parses; otherwise why not (the parameter's check).
std::string link_spec_problem(std::string_view text);

}  // namespace proxyep
