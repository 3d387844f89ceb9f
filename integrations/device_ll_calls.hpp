// Low-latency calls whose tensors live on a device. They run the protocol with the Buffer's device
// backend, as normal-mode calls do (device_calls.hpp): kernels pack x's messages into the slots
// and unpack arriving ones into device outputs (dispatch); copy the expert outputs back into the
// slots and reduce the arriving rows into a device output (combine). topk_idx never reaches the
// host: the dispatch routes it on the device (RowBackend::ll_route, from a copy the handle keeps)
// and reads back only the per-expert counts its records carry and how many values named no
// expert (refused before anything is sent); the pack places the messages by that routing
// (ll_pack_routed), the combine counts the entries of its topk_idx that differ from the
// dispatch's on the device (refused likewise) and finds the rows sent back by the same routing
// (ll_combine_routed). Everything runs after previous_event on the device's stream. The
// statistics are added on the device; a mask query is written there.
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

// The dispatch: the device routes topk_idx (after previous_event); the kernels pack messages from x
// into the slots by it and unpack arriving ones into device outputs.
LowLatencyDispatchResult ll_dispatch_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, RowBackend& backend,
    low_latency::LowLatencyMode& mode, const LowLatencyDispatchArgs& args);

// The combine: topk_idx is checked against the dispatch's on the device (after previous_event);
// x, or with zero_copy `combine_buffer`, is copied into the slots on the device, the weights into
// a device copy, and the arriving rows, found by the dispatch's routing, reduced into `out` or a
// fresh device output.
LowLatencyCombineResult ll_combine_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, RowBackend& backend,
    low_latency::LowLatencyMode& mode, const LowLatencyCombineArgs& args,
    const gpu_side::ep::TensorRef& combine_buffer);

// The device twin of the host protocol's zero-copy combine buffer: one zeroed bf16 device tensor
// of [rows, cols], kept while its shape fits (as the host one is).
class DeviceCombineBuffer {
 public:
  // Made (zeroed) at the first call of a shape: on the device's stream, or, while it is
  // captured, on another (gpu_side/device/device_table.hpp), so it may be asked for inside a
  // capture (a captured zero_copy combine reads it at every launch).
  gpu_side::ep::Tensor get(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                           std::pair<int64_t, int64_t> shape);
  // The last one get() returned (undefined before the first).
  const gpu_side::ep::Tensor& current() const { return buffer_; }

 private:
  gpu_side::ep::Tensor buffer_;
};

}  // namespace proxyep::integrations
