// ServedRank: the data path the daemon runs for one attached client (one rank of a job): the
// client's memory mapped here, a fabric endpoint opened for it, its arena and staging registered
// there, and a proxy engine whose threads drain the client's descriptor ring and relay the
// immediates that arrive back to the client (proxy/signal_relay.hpp). Built in steps that follow
// the client's own collective setup (proxy/daemon_session.hpp):
//
//   ServedRank rank(request, fds);  // maps, opens the fabric, registers: addresses(), arena()
//   rank.connect(addresses);        // every rank's fabric address, after the job's allgather
//   rank.add_arenas(descriptors);   // every rank's arena descriptor, after another allgather
//   rank.start();                   // the proxy threads start draining
//
// Memory: each region is this process's own mapping of the client's memfd, so when the client
// dies mid-call the pages stay valid until the rank is destroyed: writes in flight complete
// into and out of memory that still exists, and only then are the regions deregistered and
// unmapped.
//
// Isolation: the engine's region table holds this client's own regions and the descriptors its
// job exchanged; a descriptor names regions by index, so a client can only write from its own
// memory into its own job's arenas. Daemon::check_group() (daemon.cpp) refuses an address list
// that names another job's rank on this daemon.
#pragma once

#include "common/host_memory.hpp"
#include "control/signal_router.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/doorbell.hpp"
#include "proxy/health.hpp"
#include "proxy/proxy_engine.hpp"
#include "proxy/signal_relay.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace proxyep::daemon {

// What an attach frame asks for ({"proxyep":"attach", ...}).
struct AttachRequest {
  int rank = 0;
  int ranks = 0;
  bool tolerate_peer_failures = false;
  // ep.landing_fabric of the client, when it passed its landing region (the sixth descriptor):
  // registered as FabricLink::kLandingRegion when registers_landing() says so for this fabric.
  std::string landing_fabric;
  // Whether the client passed a device ring (after the landing region, when it passed one): a
  // ring its device's stream pushes into (proxy/device_routing.hpp), drained beside the first.
  bool device_ring = false;
  // The descriptors that came with the frame, in this order (landing and device ring optional).
  enum Fd { arena, staging, ring, doorbell, relay, count, landing = count };
};

class ServedRank {
 public:
  // Takes ownership of `fds` (AttachRequest::Fd order). Throws proxyep::Error("daemon.attach")
  // for memory that cannot be mapped, a ring that does not attach, or a fabric that fails.
  ServedRank(const AttachRequest& request, std::vector<int> fds);
  ~ServedRank();
  ServedRank(const ServedRank&) = delete;
  ServedRank& operator=(const ServedRank&) = delete;

  int rank() const { return request_.rank; }
  int ranks() const { return request_.ranks; }
  fabric::Bytes addresses() const { return state_->fabric->addresses(); }
  fabric::Bytes arena_descriptor() const;
  // The landing region's descriptor when it is registered, else nullopt.
  std::optional<fabric::Bytes> landing_descriptor() const;
  const fabric::Capabilities& capabilities() const { return state_->fabric->capabilities(); }
  // The job's fabric addresses (index = rank), as connect() accepted them; empty before.
  const std::vector<fabric::Bytes>& group() const { return group_; }

  void connect(const std::vector<fabric::Bytes>& group);
  // Every rank's arena descriptor, and (when the landing region is registered) every rank's
  // landing descriptor.
  void add_arenas(const std::vector<fabric::Bytes>& descriptors,
                  const std::vector<fabric::Bytes>& landing_descriptors);
  void start();
  bool started() const { return started_; }
  // Before start(): the client's collectives wait on its peers, whose fabric needs this side
  // to progress (connection requests, early writes).
  void progress();

  std::optional<proxy::Failure> failure() const;
  // Peers given up under tolerate_peer_failures, not reported before (each once).
  std::vector<std::pair<int, proxy::Failure>> new_peer_failures();
  // Each proxy thread's counters (CPU time included), from any thread while the rank lives.
  std::vector<proxy::ThreadStats> thread_stats() const;
  uint64_t relayed() const { return state_->relay ? state_->relay->relayed() : 0; }

 private:
  AttachRequest request_;
  std::vector<fabric::Bytes> group_;
  bool started_ = false;
  std::vector<bool> peer_failure_reported_;
  // Everything the proxy threads may touch; leaked whole when stop() had to abandon a thread.
  struct State {
    std::unique_ptr<HostMemory> arena, staging, ring_memory, relay_memory, landing,
        device_ring_memory;
    std::unique_ptr<gpu_side::Doorbell> doorbell;
    std::unique_ptr<fabric::Fabric> fabric;
    std::unique_ptr<fabric::MemoryRegion> arena_region, staging_region, landing_region;
    std::unique_ptr<proxy::RelaySender> relay;
    control::SignalRouter router;
    std::unique_ptr<proxy::ProxyEngine> engine;
  };
  std::unique_ptr<State> state_ = std::make_unique<State>();
};

}  // namespace proxyep::daemon
