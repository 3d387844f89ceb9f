// DeviceMemory: the memory side of a DeviceRuntime (device_runtime.hpp): device memory, memory a
// NIC reads (GPUDirect RDMA), memory the node's other ranks open (CUDA IPC), and host memory made
// visible to kernels. Allocations are stream-ordered where said, as on CUDA.
#pragma once

#include "common/error.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep::gpu_side::device {

// Device memory a NIC may read and write directly (GPUDirect RDMA), for a fabric that registers
// device memory (FI_HMEM): from DeviceRuntime::allocate_for_nic().
struct NicMemory {
  std::shared_ptr<std::byte[]> memory;  // null: this runtime offers none
  uint64_t bytes = 0;
  // How the fabric registers it: as host memory (the simulated device's stand-in, which is host
  // memory the proxy threads may read) or as CUDA memory (FI_HMEM_CUDA).
  bool registers_as_host = false;
};

// Device memory the node's other ranks may open (CUDA IPC), from DeviceRuntime::allocate_shared():
// the memory, and the handle a peer passes to open_shared() to reach it.
struct SharedMemory {
  std::shared_ptr<std::byte[]> memory;  // null: this runtime shares none
  uint64_t bytes = 0;
  std::vector<uint8_t> handle;  // opaque; at most kSharedHandleBytes
  // Whether a NIC may also write and read it once the fabric registered it (GPUDirect RDMA, as
  // NicMemory), and how: as host memory (the simulated device's stand-in) or as CUDA memory.
  bool nic_reads = false;
  bool registers_as_host = false;
  // A file descriptor of the same memory where the device has one (the simulated device's
  // memfd; CUDA: -1, the handle is all there is), owned with `memory` and valid while it lives:
  // a process it is passed to over a Unix socket (the node daemon) maps the pages from it, as
  // the NIC's view (open_for_nic in simulated_device.hpp).
  int fd = -1;
};
inline constexpr uint64_t kSharedHandleBytes = 128;

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // `bytes` of device memory (at least 256-byte aligned, uninitialised), released when the last
  // owner drops it, after the work queued before that point (stream-ordered, like
  // cudaFreeAsync): a tensor may be dropped while a kernel that uses it is still queued.
  virtual std::shared_ptr<std::byte[]> allocate(uint64_t bytes) = 0;

  // `bytes` of device memory kernels use as they use allocate()'s, which a NIC may also read and
  // write once the fabric registered it (GPUDirect RDMA), released when the last owner drops it
  // (not stream-ordered: only after the work that uses it finished). None (the default) where
  // the runtime cannot offer such memory.
  virtual NicMemory allocate_for_nic(uint64_t bytes) {
    (void)bytes;
    return {};
  }

  // `bytes` of device memory (kernels use it as allocate()'s) that runtimes of the same kind on
  // this node, in this process or another, may open (open_shared) so that their kernels write
  // and read it too: a node peer's arena (cudaMalloc + cudaIpcGetMemHandle). Released when the
  // last owner drops it, not stream-ordered (after the work that uses it finished). None (the
  // default) where the runtime cannot share memory.
  virtual SharedMemory allocate_shared(uint64_t bytes) {
    (void)bytes;
    return {};
  }
  // Opens memory a node peer's runtime shared (its SharedMemory::handle, `bytes` long) and
  // returns the address this runtime's kernels use for it (maybe not the owner's address),
  // reachable until the returned pointer's last owner drops it (then closed, not stream-ordered).
  // Throws proxyep::Error(phase) when the handle is not this kind's or cannot be opened.
  virtual std::shared_ptr<std::byte[]> open_shared(std::span<const uint8_t> handle, uint64_t bytes,
                                                   std::string_view phase) {
    (void)handle, (void)bytes;
    fail(std::string(phase), "this device cannot open memory another device shared");
  }

  // Makes `bytes` of host memory at `host` (an arena, a staging area) reachable by the device
  // (cudaHostRegister, mapped) and returns the address kernels use for it. Until unregister_host
  // the host memory must stay mapped. Registering memory twice is an error.
  virtual void* register_host(void* host, uint64_t bytes) = 0;
  virtual void unregister_host(void* host) = 0;
};

}  // namespace proxyep::gpu_side::device
