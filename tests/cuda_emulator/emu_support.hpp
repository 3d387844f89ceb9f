// What the emulator tests of the ring, signal and bench kernels share: host memory the fake
// runtime treats as mapped (so the detector's publication rules apply to every kernel store into
// it), device memory, and a bounded wait for a stream.
#pragma once

#include "common/deadline.hpp"
#include "common/host_memory.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace proxyep::cuemu_testing {

// Throws on a CUDA error (the tests' mains catch and fail): a fault the detector reported turns
// up here as cudaErrorLaunchFailure at the next synchronisation.
inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Page-aligned zeroed host memory registered with cudaHostRegister: the way the proxy's rings
// live (HostMemory, then registered), not cuda_pinned_memory (which calls the real libcudart).
class MappedMemory {
 public:
  explicit MappedMemory(size_t bytes) : memory_(HostMemory::heap(bytes)) {
    check(cudaHostRegister(memory_.host(), memory_.size(), cudaHostRegisterMapped),
          "cudaHostRegister");
  }
  ~MappedMemory() { (void)cudaHostUnregister(memory_.host()); }
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;

  std::span<std::byte> bytes() const { return memory_.bytes(); }
  // The device's address of the bytes (the same one here, as with unified addressing).
  void* device() const {
    void* device = nullptr;
    check(cudaHostGetDevicePointer(&device, memory_.host(), 0), "cudaHostGetDevicePointer");
    return device;
  }
  template <typename T>
  T& as() const {
    return *static_cast<T*>(memory_.host());
  }

 private:
  HostMemory memory_;
};

// Device memory holding `count` T, zeroed.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    check(cudaMalloc(&data_, count * sizeof(T)), "cudaMalloc");
    check(cudaMemset(data_, 0, count * sizeof(T)), "cudaMemset");
  }
  // A device copy of `host`.
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    check(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
          "cudaMemcpy(upload)");
  }
  ~DeviceArray() { (void)cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  size_t size() const { return count_; }

 private:
  T* data_ = nullptr;
  size_t count_;
};

// The whole main() of a test program of cases: runs `cases()` (true = pass), prints PASS or FAIL
// with the time taken, and turns an exception into a FAIL line. The process's exit code.
template <typename Cases>
int run_program(Cases&& cases) {
  try {
    const auto start = std::chrono::steady_clock::now();
    const bool ok = cases();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s (%.1f s)\n", ok ? "PASS" : "FAIL", seconds);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}

// Waits for `stream` until `deadline`; false when it is still busy then. The kernels' own waits
// all have timeouts, so a stream that does not settle is a hang the caller reports.
inline bool settle(cudaStream_t stream, const Deadline& deadline) {
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status != cudaErrorNotReady) {
      check(status, "cudaStreamQuery");
      return true;
    }
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// A stream of its own, destroyed with the scope.
class Stream {
 public:
  Stream() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return stream_; }  // NOLINT(google-explicit-constructor)

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace proxyep::cuemu_testing
