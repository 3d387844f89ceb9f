// CurrentDevice: makes a CUDA device the calling thread's current one for a scope, then restores
// the one that was current before.
//
// Why: every call of the CUDA runtime API acts on the calling thread's current device, and
// ProxyEP's calls run on its callers' threads (torch's, in Python). A device left current would
// send the caller's next allocations and kernels to it: on a process that drives several GPUs,
// the wrong one.
#pragma once

#include "gpu_side/cuda/cuda_error.hpp"

#include <cuda_runtime_api.h>

namespace proxyep::gpu_side::cuda {

class CurrentDevice {
 public:
  // Throws proxyep::Error(phase) when the device cannot be made current.
  CurrentDevice(int ordinal, const char* phase) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) current = -1;
    if (current == ordinal) return;
    const cudaError_t status = cudaSetDevice(ordinal);
    if (status != cudaSuccess) raise_cuda_error(phase, "cudaSetDevice", cudaGetErrorString(status));
    previous_ = current;
  }
  // For deleters and teardown, which must not throw: a failure is left for the next call on the
  // device to report.
  static CurrentDevice quietly(int ordinal) noexcept { return CurrentDevice(ordinal); }
  ~CurrentDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  CurrentDevice(CurrentDevice&& other) noexcept : previous_(other.previous_) {
    other.previous_ = -1;
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  CurrentDevice& operator=(CurrentDevice&&) = delete;

 private:
  explicit CurrentDevice(int ordinal) noexcept {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) current = -1;
    if (current != ordinal && cudaSetDevice(ordinal) == cudaSuccess) previous_ = current;
    (void)cudaGetLastError();  // leave no error of this probe for the next check to find
  }
  int previous_ = -1;  // the device to restore, -1: nothing to restore
};

}  // namespace proxyep::gpu_side::cuda
