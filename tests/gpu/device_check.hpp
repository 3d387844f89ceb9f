// What every GPU test does first: without a usable CUDA device it prints why and exits with
// kSkipExitCode, which ctest reports as skipped (SKIP_RETURN_CODE in tests/gpu/CMakeLists.txt).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>

namespace proxyep::testing {

inline constexpr int kSkipExitCode = 77;

inline bool cuda_device_present() {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status == cudaSuccess && devices > 0) return true;
  std::printf("SKIP: no CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
              status != cudaSuccess ? cudaGetErrorString(status) : "ok", devices);
  return false;
}

}  // namespace proxyep::testing
