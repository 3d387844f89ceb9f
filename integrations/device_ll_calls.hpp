// Low-latency calls whose tensors live on a device. They run the protocol with the Buffer's device
// backend, as normal-mode calls do (device_calls.hpp): kernels pack x's messages into the slots
// and unpack arriving ones into device outputs (dispatch); copy the expert outputs back into the
// slots and reduce the arriving rows into a device output (combine). The host reads only what
// steers the work: a copy of topk_idx, taken on the device's stream after previous_event (the
// checks, the records' counts, the combine's routing); the dispatch's messages are placed by the
// device's own routing of topk_idx (RowBackend::ll_route, ll_pack_routed), not by a host-made list.
// The statistics are added on the device; a mask query is written there.
//
// zero_copy: a dispatch with device tensors marks its handle (LowLatencyHandle::device), and
// get_next_low_latency_combine_buffer of such a handle is a device tensor (DeviceCombineBuffer),
// which the combine sends from. A zero_copy combine whose tensors are on the other side of its
// handle's buffer is refused.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "integrations/backend/row_backend.hpp"
#include "integrations/low_latency/low_latency_mode.hpp"
#include "integrations/low_latency_types.hpp"

#include <cstdint>
#include <memory>
#include <utility>

namespace proxyep::integrations {

// The dispatch: topk_idx is copied to the host for the routing (after previous_event); the
// kernels pack messages from x into the slots and unpack arriving ones into device outputs.
LowLatencyDispatchResult ll_dispatch_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, RowBackend& backend,
    low_latency::LowLatencyMode& mode, const LowLatencyDispatchArgs& args);

// The combine: topk_idx is copied to the host for the check against the dispatch's routing
// (after previous_event); x, or with zero_copy `combine_buffer`, is copied into the slots on the
// device, the weights into a device copy, and the arriving rows reduced into `out` or a fresh
// device output.
LowLatencyCombineResult ll_combine_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, RowBackend& backend,
    low_latency::LowLatencyMode& mode, const LowLatencyCombineArgs& args,
    const gpu_side::ep::TensorRef& combine_buffer);

// The device twin of the host protocol's zero-copy combine buffer: one zeroed bf16 device tensor
// of [rows, cols], kept while its shape fits (as the host one is).
class DeviceCombineBuffer {
 public:
  gpu_side::ep::Tensor get(gpu_side::device::DeviceRuntime& device,
                           std::pair<int64_t, int64_t> shape);
  // The last one get() returned (undefined before the first).
  const gpu_side::ep::Tensor& current() const { return buffer_; }

 private:
  gpu_side::ep::Tensor buffer_;
};

}  // namespace proxyep::integrations
