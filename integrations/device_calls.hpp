// Normal-mode calls whose tensors live on a device, and get_dispatch_layout's kernel.
//
// This step of the GPU backend stages through host memory: a dispatch or combine with device
// tensors copies its inputs to the host on the device's stream (one wait), runs the host
// protocol on the copies exactly as for CPU tensors, and returns device tensors holding the
// outputs. The protocols (normal/) do not change and results are bit-identical to the host
// path's. What it costs: two PCIe crossings of every row (the host bounce buffer that
// EFA_LIBFABRIC.md describes for providers without FI_HMEM, used for every path for now;
// device_staging.hpp). With async_finish the call returns as the host one does (a dispatch once
// its outputs are sized) with device outputs allocated, and the rows move, and are copied to the
// device, on the Buffer's communication stream; `event.wait()` (or any later Buffer call) finds
// them filled. get_dispatch_layout runs its kernel on the device (DeviceBackend).
//
// The handle stays in host memory (DeepEP keeps its tensors on the GPU): pass it back unchanged.
// A call mixing host and device tensors is refused, naming the first tensor on the other side,
// before anything is sent.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "integrations/buffer.hpp"
#include "integrations/comm_stream.hpp"

#include <functional>
#include <initializer_list>
#include <memory>
#include <string_view>

namespace proxyep::integrations {

struct NamedTensor {
  std::string_view name;
  const gpu_side::ep::TensorRef& tensor;
};

// True when every defined tensor of a call is on the device, false when every one is in host
// memory (or none is defined). Throws proxyep::Error(phase) naming the first that disagrees.
bool tensors_on_device(std::string_view phase, std::initializer_list<NamedTensor> tensors);

// A previous_event orders device work: refused (before anything is sent) for a call whose
// tensors are in host memory.
void require_event_on_device(std::string_view phase, bool on_device,
                             const std::shared_ptr<gpu_side::device::DeviceEvent>& event);

using HostDispatch = std::function<DispatchResult(const DispatchArgs&)>;
using HostCombine = std::function<CombineResult(const CombineArgs&)>;

DispatchResult dispatch_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                  CommStream& stream, const DispatchArgs& args,
                                  const HostDispatch& host_call);
CombineResult combine_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                CommStream& stream, const CombineArgs& args,
                                const HostCombine& host_call);

}  // namespace proxyep::integrations
