#include "gpu_side/pinned_memory.hpp"

#include "common/error.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

namespace proxyep::gpu_side {

HostMemory cuda_pinned_memory(size_t bytes) {
  constexpr const char* kPhase = "gpu_side.pinned_memory";
  constexpr size_t kPage = 4096;
  require(bytes > 0, kPhase, "pinned memory of 0 bytes");
  const size_t size = (bytes + kPage - 1) / kPage * kPage;
  void* host = nullptr;
  cudaError_t status = cudaHostAlloc(&host, size, cudaHostAllocMapped | cudaHostAllocPortable);
  require(status == cudaSuccess, kPhase, "cudaHostAlloc of {} bytes failed: {}", size,
          cudaGetErrorString(status));
  std::memset(host, 0, size);
  void* device = nullptr;
  status = cudaHostGetDevicePointer(&device, host, 0);
  if (status != cudaSuccess) {
    (void)cudaFreeHost(host);
    fail(kPhase, "cudaHostGetDevicePointer failed: {}", cudaGetErrorString(status));
  }
  return HostMemory::adopt(host, size, device, [](void* address) { (void)cudaFreeHost(address); });
}

}  // namespace proxyep::gpu_side
