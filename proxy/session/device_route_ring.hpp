// DeviceRouteRing: what a session needs to let a device's stream hand its writes to other nodes
// to the proxies (Session::open_device_route, SessionConfig::device): the second ring, in memory
// the proxies map (heap for this process's proxy threads, a memfd for the node daemon's), and
// the DeviceRoute (device_route.hpp) made for the first device a call brings. Both sessions use
// it alike; it turns the poster's route on and off and drives the stream before waits.
#pragma once

#include "common/host_memory.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/session/device_route.hpp"
#include "proxy/session/fabric_channel.hpp"

#include <chrono>
#include <memory>
#include <string_view>

namespace proxyep::proxy {

class DeviceRouteRing {
 public:
  static constexpr uint64_t kRingSlots = 4096;

  // An empty multi-producer ring (the mode a GPU producer needs) of kRingSlots in `memory`
  // (at least Ring::bytes_for(kRingSlots)), which must stay mapped while the proxies drain it.
  explicit DeviceRouteRing(HostMemory memory);
  DeviceRouteRing(const DeviceRouteRing&) = delete;
  DeviceRouteRing& operator=(const DeviceRouteRing&) = delete;

  // The ring, for the engine (add_ring without a doorbell) or the daemon (memory().fd()).
  const gpu_side::Ring& ring() const { return ring_; }
  const HostMemory& memory() const { return memory_; }

  // Session::open_device_route on `poster`: the route is made for the first device
  // (registering the ring with it; throws proxyep::Error(phase) when that fails) and refused
  // (false) for another.
  bool open(FabricPoster& poster, const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
            std::chrono::milliseconds timeout, DeviceRoute::CheckDrain check_drain,
            std::string_view phase);
  // Session::close_device_route: `poster` posts into the session's own ring again.
  void close(FabricPoster& poster) noexcept;
  void flush();
  // Before a wait: has the stream push what it was handed (DeviceRoute::drive); once everything
  // is pushed and no call posts, the proxy may rest between polls again.
  void drive(const FabricPoster& poster, std::string_view phase);
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
