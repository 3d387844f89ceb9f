// What every GPU test does first: without a usable CUDA device it prints why and exits with
// kSkipExitCode, which ctest reports as skipped (SKIP_RETURN_CODE in tests/gpu/CMakeLists.txt).
// run_gpu_cases() is the whole main() of a test that compares kernels case by case.
#pragma once

#include "common/error.hpp"

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

// Skips without a device; else runs `run_case(c)` (true = pass) for every case on device 0 and
// prints PASS or FAIL. The process's exit code.
template <typename Cases, typename RunCase>
int run_gpu_cases(const Cases& cases, RunCase&& run_case) {
  if (!cuda_device_present()) return kSkipExitCode;
  try {
    if (cudaSetDevice(0) != cudaSuccess) fail("gpu test", "cudaSetDevice(0) failed");
    bool ok = true;
    for (const auto& c : cases)
      ok &= run_case(c);
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}

}  // namespace proxyep::testing
