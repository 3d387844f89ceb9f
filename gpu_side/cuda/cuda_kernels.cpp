// The CUDA kernels' table (cuda_kernels.hpp): each entry checks what the kernel's rules refuse,
// makes the stream's device current and launches on the stream; a launch error is raised at once,
// an error while the kernel runs at the stream's next synchronize().
#include "gpu_side/cuda/cuda_kernels.hpp"

#include "common/error.hpp"
#include "gpu_side/cuda/cuda_device.hpp"
#include "gpu_side/cuda/current_device.hpp"
#include "gpu_side/cuda/ep_kernels.hpp"
#include "gpu_side/cuda/ll_kernels.hpp"
#include "gpu_side/ep/ll_counted.hpp"
#include "gpu_side/ep/ll_route.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <string>
#include <type_traits>

namespace proxyep::gpu_side::cuda {

namespace {

constexpr const char* kPhase = "cuda device";

template <typename Params>
using Launcher = cudaError_t (*)(const Params&, cudaStream_t);
// A kernel's rules (ep/*.hpp): why `params` is refused, or null.
template <typename Params>
using Refusal = const char* (*)(const Params&);

// Launches `launcher` on `stream`'s CUDA stream with its device current, once `refuse` (when
// given) found nothing wrong with the parameters. The table is handed out only with a CudaDevice
// (CudaDevice::kernels), which queue_kernel keeps together with it.
template <typename Params>
void launch(device::DeviceRuntime& stream, const Params& params,
            std::type_identity_t<Launcher<Params>> launcher,
            std::type_identity_t<Refusal<Params>> refuse, const char* name) {
  if (refuse != nullptr) {
    const char* error = refuse(params);
    require(error == nullptr, kPhase, "{}: {}", name, error != nullptr ? error : "");
  }
  auto& cuda = static_cast<CudaDevice&>(stream);
  const CurrentDevice current(cuda.ordinal(), kPhase);
  // The message is made only for an error: a launch is a hot path.
  const cudaError_t status = launcher(params, static_cast<cudaStream_t>(cuda.stream()));
  if (status != cudaSuccess) check_cuda(status, kPhase, fmt::format("{} launch", name).c_str());
}

}  // namespace

const device::EpKernels& cuda_kernels() {
  static const device::EpKernels table{
      .dispatch_layout =
          [](device::DeviceRuntime& stream, const ep::LayoutParams& params) {
            launch(stream, params, launch_dispatch_layout, nullptr, "dispatch_layout");
          },
      .dispatch_rows =
          [](device::DeviceRuntime& stream, const ep::DispatchParams& params) {
            launch(stream, params, launch_dispatch_rows, nullptr, "dispatch_rows");
          },
      .dispatch_chunk =
          [](device::DeviceRuntime& stream, const ep::ChunkParams& params) {
            launch(stream, params, launch_dispatch_chunk, nullptr, "dispatch_chunk");
          },
      .combine =
          [](device::DeviceRuntime& stream, const ep::CombineParams& params) {
            launch(stream, params, launch_combine, nullptr, "combine");
          },
      .add =
          [](device::DeviceRuntime& stream, const ep::AddParams& params) {
            launch(stream, params, launch_add, nullptr, "add");
          },
      .copy_runs =
          [](device::DeviceRuntime& stream, const ep::CopyRunsParams& params) {
            launch(stream, params, launch_copy_runs, nullptr, "copy_runs");
          },
      .ll_pack =
          [](device::DeviceRuntime& stream, const ep::LlPackParams& params) {
            launch(stream, params, launch_ll_pack, nullptr, "ll_pack");
          },
      .ll_combine =
          [](device::DeviceRuntime& stream, const ep::LlCombineParams& params) {
            launch(stream, params, launch_ll_combine, nullptr, "ll_combine");
          },
      .ll_route =
          [](device::DeviceRuntime& stream, const ep::LlRouteParams& params) {
            launch(stream, params, launch_ll_route, ep::ll_route_error, "ll_route");
          },
      .ll_pack_routed =
          [](device::DeviceRuntime& stream, const ep::LlPackRoutedParams& params) {
            launch(stream, params, launch_ll_pack_routed, ep::ll_pack_routed_error,
                   "ll_pack_routed");
          },
      .ll_combine_routed =
          [](device::DeviceRuntime& stream, const ep::LlCombineRoutedParams& params) {
            launch(stream, params, launch_ll_combine_routed, ep::ll_combine_routed_error,
                   "ll_combine_routed");
          },
      .ll_unpack_counted =
          [](device::DeviceRuntime& stream, const ep::LlUnpackCountedParams& params) {
            launch(stream, params, launch_ll_unpack_counted, ep::ll_unpack_counted_error,
                   "ll_unpack_counted");
          },
      .ll_return_counted =
          [](device::DeviceRuntime& stream, const ep::LlReturnCountedParams& params) {
            launch(stream, params, launch_ll_return_counted, ep::ll_return_counted_error,
                   "ll_return_counted");
          },
      .count_mismatches =
          [](device::DeviceRuntime& stream, const ep::MismatchParams& params) {
            launch(stream, params, launch_count_mismatches, ep::mismatch_error, "count_mismatches");
          },
      .ll_write_bytes =
          [](device::DeviceRuntime& stream, const ep::SizeWritesParams& params) {
            launch(stream, params, launch_ll_write_bytes, ep::ll_write_bytes_error,
                   "ll_write_bytes");
          },
  };
  return table;
}

}  // namespace proxyep::gpu_side::cuda
