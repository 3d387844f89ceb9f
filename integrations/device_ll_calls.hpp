// Low-latency calls whose tensors live on a device. The dispatch runs the protocol with the
// Buffer's device backend, as normal-mode calls do (device_calls.hpp): kernels pack x's messages
// into the slots and unpack arriving ones into device outputs. The combine (and the mask query)
// is still staged through host memory: its inputs are copied to the host on the device's stream,
// the host protocol runs on the copies with the caller's return_recv_hook / async_finish, and
// its output is a device tensor, allocated when the call returns and filled when its receive
// phase completes: in the call itself, in `hook()`, or on the Buffer's communication stream
// right after the receive (so `event.wait()`, and every later Buffer call, finds it filled).
// Tensors written in place (`out`, a mask query's output) are copied back over the caller's
// device tensors at the same point; the statistics tensors get what the call adds to them added
// there (so two calls in flight both count).
//
// zero_copy: a dispatch with device tensors marks its handle (LowLatencyHandle::device), and
// get_next_low_latency_combine_buffer of such a handle is a device tensor (DeviceCombineBuffer);
// the combine copies it into the host protocol's buffer before it sends. A zero_copy combine
// whose tensors are on the other side of its handle's buffer is refused.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "integrations/backend/row_backend.hpp"
#include "integrations/comm_stream.hpp"
#include "integrations/low_latency/low_latency_mode.hpp"
#include "integrations/low_latency_types.hpp"

#include <functional>
#include <memory>

namespace proxyep::integrations {

using HostLlCombine = std::function<LowLatencyCombineResult(const LowLatencyCombineArgs&)>;

// The dispatch runs on the device backend (no staging): topk_idx is copied to the host for the
// routing (after previous_event); the kernels pack messages from x into the slots and unpack
// arriving ones into device outputs; the statistics are added on the device.
LowLatencyDispatchResult ll_dispatch_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, RowBackend& backend,
    low_latency::LowLatencyMode& mode, const LowLatencyDispatchArgs& args);

// `host_combine_buffer`: with zero_copy, the host protocol's combine buffer for args.handle
// (where the device buffer's bytes go); ignored otherwise.
LowLatencyCombineResult ll_combine_on_device(
    const std::shared_ptr<gpu_side::device::DeviceRuntime>& device, CommStream& stream,
    const LowLatencyCombineArgs& args, const gpu_side::ep::Tensor& device_combine_buffer,
    gpu_side::ep::Tensor host_combine_buffer, const HostLlCombine& host_call);

// low_latency_query_mask_buffer into a device tensor: `host_query` fills a host copy.
void ll_query_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                        const gpu_side::ep::TensorRef& out,
                        const std::function<void(const gpu_side::ep::TensorRef&)>& host_query);

// The device twin of the host protocol's zero-copy combine buffer: one device tensor of the host
// buffer's shape, kept while its shape fits (as the host one is).
class DeviceCombineBuffer {
 public:
  gpu_side::ep::Tensor get(gpu_side::device::DeviceRuntime& device,
                           const gpu_side::ep::Tensor& host_buffer);

 private:
  gpu_side::ep::Tensor buffer_;
};

}  // namespace proxyep::integrations
