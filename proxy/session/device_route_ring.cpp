// A session's device ring and route (device_route_ring.hpp).
#include "proxy/session/device_route_ring.hpp"

#include "common/error.hpp"

namespace proxyep::proxy {

DeviceRouteRing::DeviceRouteRing(HostMemory memory)
    : memory_(std::move(memory)),
      ring_(gpu_side::Ring::create(memory_.bytes(), kRingSlots, gpu_side::ProducerMode::multi)) {}

bool DeviceRouteRing::open(FabricPoster& poster,
                           const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                           std::chrono::milliseconds timeout, DeviceRoute::CheckDrain check_drain,
                           std::string_view phase) {
  if (device == nullptr) return false;
  if (!route_)
    route_ = std::make_unique<DeviceRoute>(device, ring_, timeout, std::move(check_drain), phase);
  else if (&route_->device() != device.get())
    return false;
  route_->set_active(true);
  poster.set_route(route_.get());
  return true;
}

void DeviceRouteRing::close(FabricPoster& poster) noexcept {
  poster.set_route(nullptr);
  // Pushes the stream has yet to run keep the proxy polling (a stream rings no doorbell, and a
  // sleeping proxy thread adds up to proxy.idle_sleep_us); the next wait that sees them pushed
  // lets it rest.
  if (route_ && route_->pushed_all()) route_->set_active(false);
}

void DeviceRouteRing::flush() {
  if (route_) route_->flush();
}

void DeviceRouteRing::drive(const FabricPoster& poster, std::string_view phase) {
  if (!route_) return;
  if (!route_->pushed_all()) route_->drive(phase);
  if (!poster.routed()) route_->set_active(false);  // everything pushed, no call posting
}

bool DeviceRouteRing::retired_all() const {
  return !route_ || route_->posted() == 0 || route_->retired(route_->posted() - 1);
}

}  // namespace proxyep::proxy
