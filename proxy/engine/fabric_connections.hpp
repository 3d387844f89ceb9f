// Opening a session's fabric connections before its first call (fabric::Fabric::open_connections
// says why). Each pair of ranks that talk over the fabric is probed from its lower rank only, so
// no pair ever connects from both sides at once; the session's barrier after the probes keeps
// every rank's first data write behind every pair's connection.
#pragma once

#include "common/deadline.hpp"
#include "control/peer_watch.hpp"
#include "fabric/fabric.hpp"
#include "proxy/engine/region_table.hpp"

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

// One probe per peer, aimed at the start of the peer's arena (a region every fabric peer
// registered) on each rail. Throws Error(phase) when a peer's arena is not in `regions`.
std::vector<fabric::Fabric::ConnectionProbe> connection_probes(const RegionTable& regions,
                                                               const std::vector<int>& peers,
                                                               std::string_view phase);

// Calls `open` (which drives the connections) every millisecond until it returns true. Throws
// Error(phase) naming the peer when a peer left the job (`peers_watch`, may be null), and what
// `waiting` says is outstanding once `deadline` expired. Both session kinds wait through it.
void wait_for_connections(const std::function<bool()>& open,
                          const std::function<std::string()>& waiting,
                          const control::PeerWatch* peers_watch, const Deadline& deadline,
                          std::string_view phase);

// In process: posts the probes and drives the fabric until each completed (wait_for_connections;
// a failed probe's error names its peer).
void open_fabric_connections(fabric::Fabric& fabric, const RegionTable& regions,
                             const std::vector<int>& peers, const control::PeerWatch* peers_watch,
                             const Deadline& deadline, std::string_view phase);

}  // namespace proxyep::proxy
