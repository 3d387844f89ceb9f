// CurrentDevice: makes a CUDA device the calling thread's current one for a scope, then restores
// the context that was current before (none included).
//
// Why: every call of the CUDA runtime API acts on the calling thread's current device, and
// ProxyEP's calls run on its callers' threads (torch's, in Python). A device left current would
// send the caller's next allocations and kernels to it: on a process that drives several GPUs,
// the wrong one. And a thread that had no context must get none back: restoring "device 0"
// with cudaSetDevice would create device 0's primary context there (hundreds of MiB on a GPU
// the process may not use, refused outright in EXCLUSIVE_PROCESS mode), so the driver's own
// context calls (cuCtxGetCurrent / cuCtxSetCurrent, reached through the runtime: the library
// does not link libcuda, so it loads where no driver is) save and restore the context itself.
#pragma once

#include "gpu_side/cuda/cuda_error.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

namespace proxyep::gpu_side::cuda {

// The driver's context calls, found once; null where the driver offers none (then the device
// number is restored instead, as the runtime alone can).
struct ContextCalls {
  PFN_cuCtxGetCurrent_v4000 get = nullptr;
  PFN_cuCtxSetCurrent_v4000 set = nullptr;

  static const ContextCalls& driver() {
    static const ContextCalls calls = [] {
      ContextCalls found;
      void* get = nullptr;
      void* set = nullptr;
      cudaDriverEntryPointQueryResult get_result{}, set_result{};
      if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault,
                                           &get_result) == cudaSuccess &&
          cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault,
                                           &set_result) == cudaSuccess &&
          get_result == cudaDriverEntryPointSuccess && set_result == cudaDriverEntryPointSuccess) {
        found.get = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(get);
        found.set = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(set);
      }
      (void)cudaGetLastError();  // a probe: leave nothing for the next check to find
      return found;
    }();
    return calls;
  }
};

class CurrentDevice {
 public:
  // Throws proxyep::Error(phase) when the device cannot be made current.
  CurrentDevice(int ordinal, const char* phase) {
    if (!enter(ordinal)) return;
    const cudaError_t status = cudaSetDevice(ordinal);
    if (status != cudaSuccess) raise_cuda_error(phase, "cudaSetDevice", cudaGetErrorString(status));
    restore_ = true;
  }
  // For deleters and teardown, which must not throw: a failure is left for the next call on the
  // device to report.
  static CurrentDevice quietly(int ordinal) noexcept { return CurrentDevice(ordinal); }
  ~CurrentDevice() {
    if (!restore_) return;
    if (saved_context_)
      (void)ContextCalls::driver().set(context_);  // null: the thread had none
    else
      (void)cudaSetDevice(previous_);
    (void)cudaGetLastError();
  }
  CurrentDevice(CurrentDevice&& other) noexcept
      : previous_(other.previous_),
        context_(other.context_),
        saved_context_(other.saved_context_),
        restore_(other.restore_) {
    other.restore_ = false;
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  CurrentDevice& operator=(CurrentDevice&&) = delete;

 private:
  explicit CurrentDevice(int ordinal) noexcept {
    if (enter(ordinal) && cudaSetDevice(ordinal) == cudaSuccess) restore_ = true;
    (void)cudaGetLastError();  // leave no error of this probe for the next check to find
  }
  // Whether `ordinal` must be made current; saves what to restore when so.
  bool enter(int ordinal) noexcept {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) current = -1;
    (void)cudaGetLastError();
    if (current == ordinal) return false;
    previous_ = current < 0 ? 0 : current;
    const ContextCalls& calls = ContextCalls::driver();
    saved_context_ = calls.get != nullptr && calls.set != nullptr && calls.get(&context_) == 0;
    return true;
  }

  int previous_ = 0;             // the device to restore without the driver's context calls
  CUcontext context_ = nullptr;  // the context to restore (null: none was current)
  bool saved_context_ = false;
  bool restore_ = false;
};

}  // namespace proxyep::gpu_side::cuda
