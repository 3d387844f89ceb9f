// EpKernels: the EP kernels of both modes as a table of functions each backend fills once, as
// fabtests' ft_hmem_ops does for memory: adding a kernel adds an entry here and a function to
// each backend's table (gpu_side/cuda/cuda_device.cpp, simulated_kernels.cpp), and nothing to
// the runtime interface. Each entry queues its kernel on the stream of the runtime it is given;
// a runtime hands out its table with itself (DeviceRuntime::kernels), and callers go through
// queue_kernel() (device_runtime.hpp), which keeps the two together:
//
//   queue_kernel(*device, &EpKernels::dispatch_rows, params);
//
// Parameters are the kernels' own (ep/kernel_params.hpp, ep/ll_kernel_params.hpp). An entry
// throws proxyep::Error at once for parameters it refuses or an address the device cannot
// reach, before anything is queued.
#pragma once

#include "gpu_side/ep/kernel_params.hpp"
#include "gpu_side/ep/ll_kernel_params.hpp"

namespace proxyep::gpu_side::device {

class DeviceRuntime;

struct EpKernels {
  template <typename Params>
  using Kernel = void (*)(DeviceRuntime& stream, const Params& params);

  // Normal mode (ep/kernel_params.hpp): the layout of a dispatch, its rows into every rank's
  // block, one chunk's rows, the combine's reduce, element-wise sums, and copies of runs.
  Kernel<ep::LayoutParams> dispatch_layout = nullptr;
  Kernel<ep::DispatchParams> dispatch_rows = nullptr;
  Kernel<ep::ChunkParams> dispatch_chunk = nullptr;
  Kernel<ep::CombineParams> combine = nullptr;
  Kernel<ep::AddParams> add = nullptr;
  Kernel<ep::CopyRunsParams> copy_runs = nullptr;
  // The low-latency kernels (ll_kernel_params.hpp): the pack and combine by host-made tables.
  Kernel<ep::LlPackParams> ll_pack = nullptr;
  Kernel<ep::LlCombineParams> ll_combine = nullptr;
  // The routing of a low-latency dispatch from a device topk_idx (ep/ll_route.hpp); refuses at
  // once the sizes ll_route_error refuses.
  Kernel<ep::LlRouteParams> ll_route = nullptr;
  // The pack placed by ll_route's output, with no host-made item list.
  Kernel<ep::LlPackRoutedParams> ll_pack_routed = nullptr;
  // The combine whose rows are found by the dispatch's ll_route output, with no host-made table.
  Kernel<ep::LlCombineRoutedParams> ll_combine_routed = nullptr;
  // A dispatch's receive placed by the counts its sources announced (ep/ll_counted.hpp),
  // recv_count and layout_range written beside, with no host-made item list.
  Kernel<ep::LlUnpackCountedParams> ll_unpack_counted = nullptr;
  // A combine's rows sent back to their sources by the dispatch's layout_range, with no
  // host-made run list.
  Kernel<ep::LlReturnCountedParams> ll_return_counted = nullptr;
  // How many elements of two device arrays differ: a combine's topk_idx checked against its
  // dispatch's without either reaching the host.
  Kernel<ep::MismatchParams> count_mismatches = nullptr;
  // The lengths (and ops) of a step's writes to other nodes from the counts the step computed
  // (ep/ll_counted.hpp), in descriptors a later ring_push() reads.
  Kernel<ep::SizeWritesParams> ll_write_bytes = nullptr;
};

// A runtime's kernels and the runtime whose stream runs them (DeviceRuntime::kernels).
struct BoundKernels {
  const EpKernels& table;
  DeviceRuntime& stream;
};

}  // namespace proxyep::gpu_side::device
