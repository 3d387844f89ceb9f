#include "proxy/engine/fabric_connections.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "proxy/engine/region_ids.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <thread>

namespace proxyep::proxy {

std::vector<fabric::Fabric::ConnectionProbe> connection_probes(const RegionTable& regions,
                                                               const std::vector<int>& peers,
                                                               std::string_view phase) {
  std::vector<fabric::Fabric::ConnectionProbe> probes;
  probes.reserve(peers.size());
  for (int peer : peers) {
    fabric::Fabric::ConnectionProbe probe{.peer = peer, .rails = {}};
    for (int rail = 0; rail < regions.rails(); ++rail) {
      WriteRequest request{.dst = peer,
                           .local_region = region::kStaging,
                           .remote_region = region::kArena,
                           .op = "connection probe"};
      fabric::WriteOp op;
      std::string why;
      if (regions.translate(request, rail, op, why) != Status::ok)
        fail(std::string(phase), "opening the connection to rank {}: {}", peer, why);
      probe.rails.push_back(op.remote);
    }
    probes.push_back(std::move(probe));
  }
  return probes;
}

void wait_for_connections(const std::function<bool()>& open,
                          const std::function<std::string()>& waiting,
                          const control::PeerWatch* peers_watch, const Deadline& deadline,
                          std::string_view phase) {
  // Sleep between looks rather than spin: at 256 ranks on two cores, hundreds of ranks wait here
  // at once, and the CPU they would spin away is what the connections need.
  constexpr std::chrono::microseconds kNap{1000};
  while (!open()) {
    if (peers_watch != nullptr)
      if (auto failure = peers_watch->failure())
        fail(std::string(phase), "rank {} left the job while the fabric connections opened: {}",
             failure->rank, failure->reason);
    if (deadline.expired())
      fail(std::string(phase),
           "the fabric connections did not open in time (still waiting for {}); are those ranks "
           "alive and reachable?",
           waiting());
    std::this_thread::sleep_for(kNap);
  }
}

void open_fabric_connections(fabric::Fabric& fabric, const RegionTable& regions,
                             const std::vector<int>& peers, const control::PeerWatch* peers_watch,
                             const Deadline& deadline, std::string_view phase) {
  fabric.open_connections(connection_probes(regions, peers, phase));
  const auto waiting = [&fabric] {
    std::vector<int> ranks = fabric.peers_awaiting_connection();
    const size_t count = ranks.size();
    if (ranks.size() > 16) ranks.resize(16);
    return fmt::format("{} rank(s): {}", count, fmt::join(ranks, ", "));
  };
  try {
    wait_for_connections([&fabric] { return fabric.connections_open(); }, waiting, peers_watch,
                         deadline, phase);
  } catch (const Error& e) {
    if (e.phase() == phase) throw;
    fail(std::string(phase), "{}", e.what());  // the fabric's own text names the peer
  }
}

}  // namespace proxyep::proxy
