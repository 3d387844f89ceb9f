// The rate a testbed link is shaped to: a number given by the user as is, or a preset
// (common/link_spec.hpp) scaled to this box. Scaling keeps the machine's NVLink:EFA ratio per
// GPU against what one rank can copy here through shared memory (the emulated NVLink):
//
//   copy per rank  = one core's memcpy rate x min(1, cores / ranks)   (ranks share the cores)
//   link per rank  = copy per rank / (NVLink per GPU / EFA per GPU)
//   link per node  = link per rank x ranks per node                  (Gbit/s, each direction)
//
// One core's memcpy rate is `launch.link_copy_gbytes` when set, else measured here (the fastest
// of a few copies of a buffer larger than the caches: what the core can do, the slower copies
// measure whatever else ran meanwhile; ~60 ms).
#pragma once

#include "common/link_spec.hpp"

#include <string>

namespace proxyep::tools::testbed {

struct ResolvedLink {
  double gbps = 0;        // per node and direction
  double latency_us = 0;  // one way
  std::string how;        // how the rate was found, for the launcher's first line and reports
};

// One core's memcpy rate (GB/s): the fastest of several copies of 64 MiB.
double measure_copy_gbytes();

// `spec` for a job of `ranks` ranks, `ranks_per_node` per node, on this machine.
ResolvedLink resolve_link(const LinkSpec& spec, int ranks, int ranks_per_node);

}  // namespace proxyep::tools::testbed
