// DeviceSteering: host copies of the device tensors that steer a device call's work (topk_idx:
// the routing, the checks, the notify counts are computed on the host), moved on the device's
// stream after the call's previous_event. The copies are queued; wait() makes them complete.
// The host buffers live as long as the DeviceSteering.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <memory>
#include <string_view>
#include <vector>

namespace proxyep::integrations {

// Makes the work `device` queues from here on wait for `event` (a call's previous_event; none: no
// wait), for at most ep.timeout_ms. A call of the host protocols is not capturable (it waits on
// the host; captured LL calls take low_latency/ll_captured.hpp instead), so first, before
// anything is queued: refused (proxyep::Error(phase)) while `device`'s stream is
// being captured, or for an event recorded inside a capture; the capture is left as it was.
void order_after(gpu_side::device::DeviceRuntime& device,
                 const std::shared_ptr<gpu_side::device::DeviceEvent>& event,
                 std::string_view phase);

class DeviceSteering {
 public:
  DeviceSteering(std::shared_ptr<gpu_side::device::DeviceRuntime> device, std::string_view phase);

  // Makes the copies queued from here on wait for `event` (none: no wait).
  void order_after(const std::shared_ptr<gpu_side::device::DeviceEvent>& event);
  // A host view of device tensor `t` with its shape and strides, filled by the next wait().
  // Copies the span the strides cover; undefined stays undefined.
  gpu_side::ep::TensorRef to_host(const gpu_side::ep::TensorRef& t);
  // Waits (ep.timeout_ms) for every copy queued so far; throws proxyep::Error(phase).
  void wait();

 private:
  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  std::string_view phase_;  // a literal
  std::vector<gpu_side::ep::Tensor> held_;
};

}  // namespace proxyep::integrations
