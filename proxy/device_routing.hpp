// DeviceRouting: what a session needs to let a device's stream hand its writes to other nodes
// to the proxies (Session::route_posts, SessionConfig::device): the second ring, in memory
// the proxies map (heap for this process's proxy threads, a memfd for the node daemon's), and
// the DeviceRoute (device_route.hpp) made for the first device a call brings. Both sessions use
// it alike; it turns the link's route on and off and drives the stream before waits.
#pragma once

#include "common/host_memory.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/device_route.hpp"
#include "proxy/fabric_channel.hpp"

#include <chrono>
#include <memory>
#include <string_view>

namespace proxyep::proxy {

class DeviceRouting {
 public:
  static constexpr uint64_t kRingSlots = 4096;

  // An empty multi-producer ring (the mode a GPU producer needs) of kRingSlots in `memory`
  // (at least Ring::bytes_for(kRingSlots)), which must stay mapped while the proxies drain it.
  explicit DeviceRouting(HostMemory memory);
  DeviceRouting(const DeviceRouting&) = delete;
  DeviceRouting& operator=(const DeviceRouting&) = delete;

  // The ring, for the engine (add_ring without a doorbell) or the daemon (memory().fd()).
  const gpu_side::Ring& ring() const { return ring_; }
  const HostMemory& memory() const { return memory_; }

  // Session::route_posts on `link`: the route is made for the first device (registering the
  // ring with it; throws proxyep::Error(phase) when that fails) and refused (false) for
  // another; null ends the route.
  bool route_posts(FabricLink& link, const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                   std::chrono::milliseconds timeout, DeviceRoute::CheckDrain check_drain,
                   std::string_view phase);
  void flush();
  // Before a wait: has the stream push what it was handed (DeviceRoute::drive); once everything
  // is pushed and no call posts, the proxy may rest between polls again.
  void drive(const FabricLink& link, std::string_view phase);
  // Whether every write posted through the route has completed locally (quiet's test).
  bool retired_all() const;
  uint64_t posted() const { return route_ ? route_->posted() : 0; }

 private:
  HostMemory memory_;
  gpu_side::Ring ring_;
  // Last: its destructor waits for the stream's pushes into the ring above.
  std::unique_ptr<DeviceRoute> route_;
};

}  // namespace proxyep::proxy
