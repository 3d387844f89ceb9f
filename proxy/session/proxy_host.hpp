// ProxyHost: where a session's proxy threads run, the one thing that differs between the two
// ways a rank reaches other nodes. The session (session.hpp) owns the client half: node memory,
// staging, rings, counters, the rank's one signal router, channels and waits. The host owns the
// proxy half (a RankProxy, rank_proxy.hpp) or stands for it:
//
//   in process  (proxy_host_in_process.hpp): a RankProxy in this process; the engine's threads
//               route immediates into the session's router; waits sleep on the engine.
//   proxyepd    (proxy_host_daemon.hpp): the node daemon's ServedRank holds the RankProxy; the
//               session's memory goes to it as memfds, its immediates come back through a relay
//               ring that every wait drains into the session's router; waits poll.
//
// The session drives the same collective setup through either (session.cpp):
//
//   host.open(attach)          the proxy half exists: its address and descriptors
//   allgather; connect()       every rank's fabric address
//   allgather; add_regions()   every rank's arena, landing and device arena descriptors
//   open_connections()         every pair's first write can go
//   barrier; start()           the threads drain the rings
//
// A host is also the captured steps' StepProxy (step_link.hpp): it registers their memory and
// has their words counted where its threads run.
#pragma once

#include "common/deadline.hpp"
#include "common/host_memory.hpp"
#include "control/signal_router.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_thread.hpp"
#include "proxy/session/arena_layout.hpp"
#include "proxy/session/device_arenas.hpp"
#include "proxy/session/device_route_ring.hpp"
#include "proxy/session/fabric_channel.hpp"
#include "proxy/session/node_memory.hpp"
#include "proxy/session/step_link.hpp"

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::proxy {

struct SessionConfig;

// What the session hands its host when the fabric path opens: everything outlives the host.
struct HostAttach {
  const ArenaLayout& layout;
  const SessionConfig& config;
  NodeMemory& node;  // the rank's arena: node.local(), node.bytes(), node.local_fd()
  HostMemory& staging;
  HostMemory& ring_memory;  // the descriptor ring, made by the session (one producer)
  const gpu_side::Ring& ring;
  gpu_side::Doorbell& doorbell;
  gpu_side::RingProducer& producer;  // the ring's one producer (this rank's protocol thread)
  DeviceRouteRing* route_ring;       // SessionConfig::device's ring, or null
  StepTransport* steps;              // the captured steps' ring, or null
  const DeviceArenas& device_arenas;
  control::SignalRouter& router;  // the rank's one router
};

// What the proxy half answered.
struct HostOpened {
  fabric::Bytes addresses;                             // this rank's fabric endpoint
  fabric::Bytes arena;                                 // this rank's arena descriptor
  std::optional<fabric::Bytes> landing, device_arena;  // where registered
  // Device memory this rank's chunks leave from (FI_HMEM), of staging_bytes; null: none.
  std::byte* device_staging = nullptr;
  // Whether a write may leave straight from the caller's memory (SessionConfig::send_from_caller
  // where the proxy shares this process's address space).
  bool from_caller = false;
};

class ProxyHost : public StepProxy {
 public:
  ~ProxyHost() override = default;

  // The proxy half exists; the session's memory is registered (or passed) and its rings drained
  // once started. Throws proxyep::Error("buffer").
  virtual HostOpened open(const HostAttach& attach) = 0;
  virtual void connect(const std::vector<fabric::Bytes>& addresses) = 0;
  // As RankProxy::add_regions.
  virtual void add_regions(const std::vector<fabric::Bytes>& arenas,
                           const std::vector<fabric::Bytes>& landings,
                           const std::vector<fabric::Bytes>& device_arenas) = 0;
  // Until every pair's connection to `peers` is open (throws naming a peer at the deadline).
  virtual void open_connections(const std::vector<int>& peers, const Deadline& deadline) = 0;
  virtual void start() = 0;
  // Before start(): drives the fabric while the bootstrap waits (none where the daemon does).
  virtual void progress() {}

  // Waits until `ready()`; throws proxyep::Error(phase) with describe() at the deadline, or when
  // the proxy failed.
  virtual void wait_until(const std::function<bool()>& ready, const Deadline& deadline,
                          std::string_view phase, const std::function<std::string()>& describe) = 0;
  // Until every write pushed into `poster`'s ring and the device ring has completed locally.
  virtual void quiet(const FabricPoster& poster, const DeviceRouteRing* route_ring,
                     std::string_view phase) = 0;
  // Throws proxyep::Error(phase) when the proxy failed.
  virtual void check_health(std::string_view phase) const = 0;
  virtual bool failed() const = 0;
  // Why the proxy gave up `rank` (tolerate_peer_failures), or nullopt.
  virtual std::optional<std::string> peer_failure(int rank) const = 0;
  // Stops the proxy threads (idempotent); abandoned(): one was left inside the provider, so
  // whatever it may touch must live as long as the process.
  virtual void stop() noexcept = 0;
  virtual bool abandoned() const { return false; }

  virtual std::vector<ThreadStats> thread_stats() const { return {}; }
  virtual std::optional<fabric::ReorderStats> reorder_stats() const { return std::nullopt; }
  // Where the proxy runs, for the debug log ("in process (tcp;ofi_rxm)").
  virtual std::string describe() const = 0;
};

}  // namespace proxyep::proxy
