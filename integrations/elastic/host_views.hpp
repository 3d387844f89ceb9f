// HostViews: what the elastic layer's host arithmetic reads (topk_idx, the received rows'
// indices, a handle's slot table), as host memory whichever memory the call's tensors are in: a
// host tensor as it is, a device tensor copied to the host (DeviceSteering) on the Buffer's
// device stream after the work queued so far, so that the rows a call received are complete
// before they are read. Views stay valid while the HostViews lives.
//
//   HostViews host(buffer, "dispatch");
//   const TensorRef idx = host(args.topk_idx);  // queued
//   host.wait();                                // now readable
#pragma once

#include "integrations/buffer.hpp"
#include "integrations/device_steering.hpp"

#include <memory>
#include <optional>
#include <string_view>

namespace proxyep::integrations::elastic {

class HostViews {
 public:
  // `phase`: a literal, named by the errors.
  HostViews(Buffer& buffer, std::string_view phase) : buffer_(buffer), phase_(phase) {}

  // Orders the copies queued from here on after `event` (a call's previous_event; none: no
  // wait).
  void order_after(const std::shared_ptr<gpu_side::device::DeviceEvent>& event);
  // A host view of `t` (undefined stays undefined); a copy's is filled by wait().
  gpu_side::ep::TensorRef operator()(const gpu_side::ep::TensorRef& t);
  // Waits (ep.timeout_ms) for the copies queued so far; throws proxyep::Error(phase).
  void wait();

 private:
  DeviceSteering& steering();

  Buffer& buffer_;
  std::string_view phase_;
  std::optional<DeviceSteering> steering_;  // made at the first device tensor
};

}  // namespace proxyep::integrations::elastic
