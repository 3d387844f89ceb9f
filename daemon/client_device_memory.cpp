// Opening a client's device memory for the NIC (client_device_memory.hpp).
#include "daemon/client_device_memory.hpp"

#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#ifdef PROXYEP_HAVE_CUDA
#include "gpu_side/cuda/cuda_ipc.hpp"
#endif

#include <string>

namespace proxyep::daemon {

gpu_side::device::NicMemory open_client_device_memory(std::string_view kind,
                                                      std::span<const uint8_t> handle, int fd,
                                                      uint64_t bytes, std::string_view phase) {
  if (kind == "simulated")
    return gpu_side::device::SimulatedDevice::open_for_nic(handle, fd, bytes, phase);
#ifdef PROXYEP_HAVE_CUDA
  if (kind == "cuda") return gpu_side::cuda::open_for_nic(handle, bytes, phase);
#endif
  fail(std::string(phase), "this proxyepd cannot open {} device memory{}", kind,
       kind == "cuda" ? " (built without CUDA)" : "");
}

}  // namespace proxyep::daemon
