// The device of a bench rank (bench_device.hpp).
#include "tools/bench/bench_device.hpp"

#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"

#if PROXYEP_HAVE_CUDA
#include "gpu_side/cuda/cuda_device.hpp"

#include <cuda_runtime_api.h>
#endif

namespace proxyep::tools {

const std::vector<std::string>& bench_device_kinds() {
  static const std::vector<std::string> kinds = {"host", "simulated", "cuda"};
  return kinds;
}

std::shared_ptr<gpu_side::device::DeviceRuntime> make_bench_device(const std::string& kind,
                                                                   int local_rank,
                                                                   std::string_view phase) {
  if (kind == "host") return nullptr;
  // As a GPU with GPUDirect RDMA (every cudaMalloc'ed GPU beside an EFA NIC): where the fabric
  // registers device memory (shm here), chunks leave from device memory and rows land in it.
  if (kind == "simulated")
    return std::make_shared<gpu_side::device::SimulatedDevice>(
        gpu_side::device::SimulatedDeviceOptions{.nic_reads_device_memory = true});
  require(kind == "cuda", phase, "--device {}: not one of host, simulated, cuda", kind);
#if PROXYEP_HAVE_CUDA
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  require(status == cudaSuccess && count > 0, phase, "--device cuda: no usable CUDA device ({})",
          status == cudaSuccess ? "none found" : cudaGetErrorString(status));
  return std::make_shared<gpu_side::cuda::CudaDevice>(local_rank % count);
#else
  (void)local_rank;
  fail(std::string(phase), "--device cuda: this build has no CUDA (nvcc was not found)");
#endif
}

}  // namespace proxyep::tools
