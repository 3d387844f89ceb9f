// Host copies of a device call's steering tensors (device_steering.hpp).
#include "integrations/device_steering.hpp"

#include "common/error.hpp"
#include "common/params.hpp"

#include <chrono>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations {

namespace {

// Elements from a tensor's first to its last, as its strides lay them out.
int64_t extent(const ep::TensorRef& t, std::string_view phase) {
  require(t.row_stride >= 0 && t.col_stride >= 0, phase,
          "device tensors with negative strides are not supported; got {}", t);
  if (t.numel() == 0) return 0;
  return (t.rows - 1) * t.row_stride + (t.dims == 2 ? (t.cols - 1) * t.col_stride : 0) + 1;
}

}  // namespace

void order_after(gpu_side::device::DeviceRuntime& device,
                 const std::shared_ptr<gpu_side::device::DeviceEvent>& event,
                 std::string_view phase) {
  constexpr const char* kNotCapturable =
      "a Buffer call waits on the host (its counts, records and slot releases) and cannot be "
      "captured into a graph yet; make it outside the capture";
  require(!device.capturing(), phase, "the Buffer's device stream is being captured: {}",
          kNotCapturable);
  require(event == nullptr || !event->captured(), phase,
          "previous_event was recorded inside a graph capture: {}", kNotCapturable);
  if (event) device.wait_event(event, std::chrono::milliseconds(params::ep_timeout_ms.get()));
}

DeviceSteering::DeviceSteering(std::shared_ptr<gpu_side::device::DeviceRuntime> device,
                               std::string_view phase)
    : device_(std::move(device)), phase_(phase) {}

void DeviceSteering::order_after(const std::shared_ptr<gpu_side::device::DeviceEvent>& event) {
  integrations::order_after(*device_, event, phase_);
}

ep::TensorRef DeviceSteering::to_host(const ep::TensorRef& t) {
  if (!t.defined()) return t;
  ep::Tensor host = ep::Tensor::empty(t.dtype, extent(t, phase_));
  ep::TensorRef view = t;
  view.data = host.raw();
  view.device = ep::Device::host;
  device_->copy(host.raw(), t.data, host.bytes());
  held_.push_back(std::move(host));
  return view;
}

void DeviceSteering::wait() {
  device_->synchronize(phase_, std::chrono::milliseconds(params::ep_timeout_ms.get()));
}

}  // namespace proxyep::integrations
