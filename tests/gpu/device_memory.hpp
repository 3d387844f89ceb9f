// Device memory for the GPU tests: one cudaMalloc'd allocation with upload/download, and the
// byte comparison the tests report differences with. CUDA failures throw proxyep::Error.
#pragma once

#include "gpu_side/cuda/ep_kernels.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace proxyep::testing {

inline void check_cuda(cudaError_t status, const char* what) {
  gpu_side::cuda::check_cuda(status, "gpu test", what);
}

// One device allocation (256-byte aligned, like every cudaMalloc).
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) {
    check_cuda(cudaMalloc(&data_, bytes == 0 ? 1 : bytes), "cudaMalloc");
  }
  DeviceMemory(const void* host, size_t bytes) : DeviceMemory(bytes) { upload(host, bytes); }
  ~DeviceMemory() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  DeviceMemory(DeviceMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(other.bytes_) {}
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  DeviceMemory& operator=(DeviceMemory&&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void upload(const void* host, size_t bytes) {
    if (bytes > 0) check_cuda(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "upload");
  }
  template <typename T>
  std::vector<T> download(size_t count) const {
    std::vector<T> out(count);
    if (count > 0)
      check_cuda(cudaMemcpy(out.data(), data_, count * sizeof(T), cudaMemcpyDeviceToHost),
                 "download");
    return out;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The first differing byte, or -1.
inline int64_t first_difference(const void* a, const void* b, size_t bytes) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < bytes; ++i)
    if (x[i] != y[i]) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace proxyep::testing
