// Normal-mode calls whose tensors live on a device, and get_dispatch_layout's kernel.
//
// The direct path: the rows of a dispatch or combine with device tensors never pass through
// host code. The device backend's kernels pack them from the caller's tensors straight into the
// slots (the node peers' device arenas, opened by CUDA IPC: proxy/session/device_arenas.hpp; this
// rank's staging, host memory registered with the device: device_regions.hpp, or with FI_HMEM
// device staging), and copy arriving rows out of the slots into device outputs; the proxies
// move the slots as for host calls. What the protocol itself reads of the tensors, a dispatch's
// steering (is_token_in_rank, the counts, topk_idx's values to check), is copied to the host
// first, on the device's stream after previous_event. async_finish behaves as for host tensors:
// the call returns with its device outputs allocated and fills them on the CommStream.
//
// Rows from other nodes land in the receiver's device arena where the fabric registers device
// memory (FI_HMEM, proxy/session/device_arenas.hpp), else in its host arena (registered with the
// device), which the kernels copy out across PCIe. The handle's routing tables are host memory and
// its recv_src_idx device memory: pass it back unchanged. A call mixing host and device tensors is
// refused, naming the first tensor on the other side, before anything is sent.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "integrations/backend/row_backend.hpp"
#include "integrations/normal/normal_mode.hpp"
#include "integrations/normal_types.hpp"

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

// Whether `event` is a point inside a capture: a low-latency call given it joins that capture
// (the other calls refuse it: device_steering.hpp's order_after).
bool captured_point(const std::shared_ptr<gpu_side::device::DeviceEvent>& event);

// `mode`'s call with `backend` (a DeviceBackend on `device`) doing the per-row work.
DispatchResult dispatch_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                  RowBackend& backend, normal::NormalMode& mode,
                                  const DispatchArgs& args);
CombineResult combine_on_device(const std::shared_ptr<gpu_side::device::DeviceRuntime>& device,
                                RowBackend& backend, normal::NormalMode& mode,
                                const CombineArgs& args);

}  // namespace proxyep::integrations
