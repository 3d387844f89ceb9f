// Opening a session's fabric connections before its first call (fabric::Fabric::open_connections
// says why). Each pair of ranks that talk over the fabric is probed from its lower rank only, so
// no pair ever connects from both sides at once; the session's barrier after the probes keeps
// every rank's first data write behind every pair's connection.
#pragma once

#include "control/peer_watch.hpp"
#include "fabric/fabric.hpp"
#include "proxy/arena_layout.hpp"
#include "proxy/region_table.hpp"

#include <chrono>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

// The peers this rank probes: its fabric peers with a higher rank.
std::vector<int> peers_to_probe(const ArenaLayout& layout);

// One probe per peer, aimed at the start of the peer's arena (a region every fabric peer
// registered) on each rail. Throws Error(phase) when a peer's arena is not in `regions`.
std::vector<fabric::Fabric::ConnectionProbe> connection_probes(const RegionTable& regions,
                                                               const std::vector<int>& peers,
                                                               std::string_view phase);

// Posts the probes and drives the fabric until each completed. Throws Error(phase) naming the
// peer when a probe failed or a peer left the job (`peers_watch`, may be null), and naming the
// peers still outstanding after `timeout`.
void open_fabric_connections(fabric::Fabric& fabric, const RegionTable& regions,
                             const std::vector<int>& peers, const control::PeerWatch* peers_watch,
                             std::chrono::milliseconds timeout, std::string_view phase);

}  // namespace proxyep::proxy
