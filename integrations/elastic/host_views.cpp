// Host views of an elastic call's tensors (host_views.hpp).
#include "integrations/elastic/host_views.hpp"

#include "integrations/backend/row_backend.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::elastic {

void HostViews::order_after(const std::shared_ptr<gpu_side::device::DeviceEvent>& event) {
  steering().order_after(event);
}

ep::TensorRef HostViews::operator()(const ep::TensorRef& t) {
  if (!t.defined() || t.device == ep::Device::host) return t;
  return steering().to_host(t);
}

void HostViews::wait() {
  if (steering_) steering_->wait();
}

DeviceSteering& HostViews::steering() {
  if (!steering_) steering_.emplace(buffer_.row_backend(true, phase_).stream(), phase_);
  return *steering_;
}

}  // namespace proxyep::integrations::elastic
