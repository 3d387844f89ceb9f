// What the Python module relies on of a CUDA device (gpu_side/device/open_device.hpp,
// gpu_side/cuda/current_device.hpp), on a GPU: "cuda" opens a CudaDevice with its own stream;
// device memory is found on its GPU (DLPack's kDLCUDA device of an output) and host memory on
// none; an event on a caller's stream orders the device's stream after the caller's work (a
// kernel-free check: the caller's stream copies a pattern, the device's stream copies it on
// after waiting); a runtime call leaves the caller's current device as it found it; and a
// caller's stream that captures a CUDA graph is refused without spoiling the capture.
// Exits 77 (skipped) without a usable CUDA device.
#include "gpu_side/cuda/current_device.hpp"
#include "gpu_side/device/open_device.hpp"
#include "tests/gpu/device_check.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

using namespace proxyep;
namespace device = proxyep::gpu_side::device;

namespace {

constexpr uint64_t kBytes = 64 << 20;  // long enough a copy that a missing wait shows

bool check(bool ok, const char* what) {
  if (!ok) std::printf("FAIL: %s\n", what);
  return ok;
}

}  // namespace

int main() {
  if (!testing::cuda_device_present()) return testing::kSkipExitCode;
  try {
    int count = 0;
    (void)cudaGetDeviceCount(&count);
    const int last = count - 1;
    bool ok = true;
    auto cuda = device::open_device("cuda", last, "gpu test");
    ok &= check(cuda && cuda->kind() == "cuda", "open_device(cuda) is a CUDA device");
    ok &= check(device::cuda_stream_of(*cuda) != 0, "a CUDA device has a stream");

    auto memory = cuda->allocate(kBytes);
    cuda->synchronize("gpu test", std::chrono::seconds(20));
    ok &= check(device::cuda_device_of(memory.get()) == last, "device memory is on its GPU");
    std::vector<std::byte> host(16);
    ok &= check(device::cuda_device_of(host.data()) == -1, "host memory is on no GPU");

    // The caller's stream (on the caller's device 0 current) fills `source`; the device's
    // stream, ordered after it by record_on_caller_stream, copies it to `memory`.
    if (cudaSetDevice(0) != cudaSuccess) fail("gpu test", "cudaSetDevice(0)");
    cudaStream_t caller = nullptr;
    void* source = nullptr;
    if (cudaSetDevice(last) != cudaSuccess || cudaStreamCreate(&caller) != cudaSuccess ||
        cudaMalloc(&source, kBytes) != cudaSuccess || cudaSetDevice(0) != cudaSuccess)
      fail("gpu test", "caller stream setup");
    {
      const gpu_side::cuda::CurrentDevice on_last(last, "gpu test");
      if (cudaMemsetAsync(source, 0x5a, kBytes, caller) != cudaSuccess)
        fail("gpu test", "cudaMemsetAsync");
    }
    auto event =
        device::record_on_caller_stream(*cuda, reinterpret_cast<uintptr_t>(caller), "gpu test");
    ok &= check(event != nullptr, "an event on the caller's stream");
    cuda->wait_event(event, std::chrono::seconds(20));
    cuda->copy(memory.get(), source, kBytes);
    std::vector<unsigned char> seen(kBytes);
    cuda->copy(seen.data(), memory.get(), kBytes);
    cuda->synchronize("gpu test", std::chrono::seconds(20));
    bool filled = true;
    for (unsigned char b : seen)
      filled &= b == 0x5a;
    ok &= check(filled, "the device's stream ran after the caller's work");

    int current = -1;
    (void)cudaGetDevice(&current);
    ok &= check(current == 0, "runtime calls leave the caller's current device");

    // A caller's stream capturing a CUDA graph is refused with the reason, and the capture
    // stays valid (nothing of ProxyEP's joined it).
    {
      const gpu_side::cuda::CurrentDevice on_last(last, "gpu test");
      if (cudaStreamBeginCapture(caller, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        fail("gpu test", "cudaStreamBeginCapture");
      bool refused = false;
      try {
        (void)device::record_on_caller_stream(*cuda, reinterpret_cast<uintptr_t>(caller),
                                              "gpu test");
      } catch (const Error& e) {
        refused = std::strstr(e.what(), "capturing a CUDA graph") != nullptr;
      }
      ok &= check(refused, "a capturing caller's stream is refused, naming graph capture");
      if (cudaMemsetAsync(source, 1, 16, caller) != cudaSuccess)
        fail("gpu test", "cudaMemsetAsync in capture");
      cudaGraph_t graph = nullptr;
      ok &= check(cudaStreamEndCapture(caller, &graph) == cudaSuccess && graph != nullptr,
                  "the caller's capture is still valid");
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      ok &= check(
          !refused ||
              [&] {
                try {
                  device::require_no_graph_capture(*cuda, reinterpret_cast<uintptr_t>(caller),
                                                   "gpu test");
                  return true;
                } catch (const Error&) {
                  return false;
                }
              }(),
          "after the capture the stream is accepted again");
    }

    (void)cudaSetDevice(last);
    (void)cudaFree(source);
    (void)cudaStreamDestroy(caller);
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
