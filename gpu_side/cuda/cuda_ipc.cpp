// CUDA IPC handles and the process-wide table of shared allocations (cuda_ipc.hpp).
#include "gpu_side/cuda/cuda_ipc.hpp"

#include "common/error.hpp"
#include "common/wire.hpp"
#include "gpu_side/cuda/current_device.hpp"
#include "gpu_side/cuda/ep_kernels.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>

namespace proxyep::gpu_side::cuda {

namespace {

constexpr const char* kPhase = "cuda device";

// The handle (little endian, common/wire.hpp):
//   u32 magic "PXCI" | u16 version | u16 0 | u64 pid | u64 process nonce | u64 address |
//   u64 bytes | u32 ordinal | PCI bus id (16 bytes, NUL-padded "dddd:bb:dd.f") |
//   cudaIpcMemHandle_t (64 bytes)
// The owner is its pid and a random nonce: processes in other PID namespaces (containers on one
// node, each rank's often pid 1) may share a pid, and an opener that took a peer's handle for
// its own would use its own memory.
constexpr uint32_t kHandleMagic = 0x49435850;  // "PXCI" read as little-endian bytes
constexpr uint16_t kHandleVersion = 3;
constexpr size_t kBusIdBytes = 16;
static_assert(32 + 8 + 4 + kBusIdBytes + sizeof(cudaIpcMemHandle_t) <= device::kSharedHandleBytes);

// This process's nonce, drawn once.
uint64_t process_nonce() {
  static const uint64_t nonce = [] {
    std::random_device random;
    return (uint64_t{random()} << 32) ^ random();
  }();
  return nonce;
}

struct Handle {
  uint64_t pid = 0, nonce = 0, address = 0, bytes = 0;
  int ordinal = 0;
  std::string bus_id;
  cudaIpcMemHandle_t ipc{};
};

Handle read_handle(std::span<const uint8_t> handle, uint64_t bytes, std::string_view phase) {
  ByteReader r(handle, std::string(phase));
  require(r.u32("magic") == kHandleMagic && r.u16("version") == kHandleVersion, phase,
          "open_shared: the handle is not a CUDA device's (or another ProxyEP version's)");
  (void)r.u16("reserved");
  Handle h;
  h.pid = r.u64("pid");
  h.nonce = r.u64("process nonce");
  h.address = r.u64("address");
  h.bytes = r.u64("bytes");
  h.ordinal = static_cast<int>(r.u32("ordinal"));
  const auto bus = r.bytes(kBusIdBytes, "PCI bus id");
  h.bus_id.assign(reinterpret_cast<const char*>(bus.data()),
                  strnlen(reinterpret_cast<const char*>(bus.data()), kBusIdBytes));
  std::memcpy(&h.ipc, r.bytes(sizeof h.ipc, "cudaIpcMemHandle_t").data(), sizeof h.ipc);
  r.expect_end("shared memory handle");
  require(h.bytes >= bytes, phase, "open_shared: the peer shared {} bytes, {} are needed", h.bytes,
          bytes);
  return h;
}

// This process's shared allocations by address, for openers in the same process.
struct LiveAllocations {
  std::mutex mutex;
  std::map<uintptr_t, std::weak_ptr<std::byte[]>> by_address;
};

LiveAllocations& live() {
  static LiveAllocations* table = new LiveAllocations;  // outlives every static owner
  return *table;
}

// Lets device `ordinal`'s kernels reach memory of device `owner` (same process).
void enable_peer(int ordinal, int owner, std::string_view phase) {
  if (ordinal == owner) return;
  int can = 0;
  check_cuda(cudaDeviceCanAccessPeer(&can, ordinal, owner), kPhase, "cudaDeviceCanAccessPeer");
  require(can != 0, phase,
          "open_shared: device {} cannot reach device {}'s memory (no peer access between "
          "them)",
          ordinal, owner);
  const CurrentDevice current(ordinal, kPhase);
  const cudaError_t status = cudaDeviceEnablePeerAccess(owner, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // clear it: it is not sticky, but later checks must not see it
    return;
  }
  check_cuda(status, kPhase, "cudaDeviceEnablePeerAccess");
}

}  // namespace

device::SharedMemory allocate_shared_memory(int ordinal, uint64_t bytes) {
  const CurrentDevice current(ordinal, kPhase);
  void* memory = nullptr;
  check_cuda(cudaMalloc(&memory, std::max<uint64_t>(bytes, 1)), kPhase, "cudaMalloc");
  cudaIpcMemHandle_t ipc{};
  const cudaError_t status = cudaIpcGetMemHandle(&ipc, memory);
  if (status != cudaSuccess) {
    (void)cudaFree(memory);
    check_cuda(status, kPhase, "cudaIpcGetMemHandle");
  }
  const auto address = reinterpret_cast<uintptr_t>(memory);
  device::SharedMemory shared;
  shared.bytes = bytes;
  shared.nic_reads = true;  // cudaMalloc memory registers for GPUDirect RDMA (FI_HMEM_CUDA)
  shared.memory = std::shared_ptr<std::byte[]>(
      static_cast<std::byte*>(memory), [ordinal, address](std::byte* p) {
        {
          std::lock_guard lock(live().mutex);
          live().by_address.erase(address);
        }
        const auto current = CurrentDevice::quietly(ordinal);
        (void)cudaFree(p);  // waits for the device
      });
  {
    std::lock_guard lock(live().mutex);
    live().by_address[address] = shared.memory;
  }
  ByteWriter w(shared.handle);
  w.u32(kHandleMagic);
  w.u16(kHandleVersion);
  w.u16(0);
  w.u64(static_cast<uint64_t>(::getpid()));
  w.u64(process_nonce());
  w.u64(address);
  w.u64(bytes);
  w.u32(static_cast<uint32_t>(ordinal));
  std::array<char, kBusIdBytes> bus{};
  check_cuda(cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), ordinal), kPhase,
             "cudaDeviceGetPCIBusId");
  bus.back() = '\0';
  w.bytes({reinterpret_cast<const uint8_t*>(bus.data()), bus.size()});
  w.bytes({reinterpret_cast<const uint8_t*>(&ipc), sizeof ipc});
  return shared;
}

namespace {

// open_shared_memory of a handle already read.
std::shared_ptr<std::byte[]> open_handle(int ordinal, const Handle& h, std::string_view phase) {
  if (h.pid == static_cast<uint64_t>(::getpid()) && h.nonce == process_nonce()) {
    std::shared_ptr<std::byte[]> memory;
    {
      std::lock_guard lock(live().mutex);
      const auto it = live().by_address.find(h.address);
      if (it != live().by_address.end()) memory = it->second.lock();
    }
    require(memory != nullptr, phase,
            "open_shared: the memory this process shared at {:#x} was released", h.address);
    enable_peer(ordinal, h.ordinal, phase);
    return memory;
  }
  const CurrentDevice current(ordinal, kPhase);
  void* opened = nullptr;
  check_cuda(cudaIpcOpenMemHandle(&opened, h.ipc, cudaIpcMemLazyEnablePeerAccess), kPhase,
             "cudaIpcOpenMemHandle");
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(opened), [ordinal](std::byte* p) {
    const auto current = CurrentDevice::quietly(ordinal);
    (void)cudaIpcCloseMemHandle(p);
  });
}

}  // namespace

std::shared_ptr<std::byte[]> open_shared_memory(int ordinal, std::span<const uint8_t> handle,
                                                uint64_t bytes, std::string_view phase) {
  return open_handle(ordinal, read_handle(handle, bytes, phase), phase);
}

device::NicMemory open_for_nic(std::span<const uint8_t> handle, uint64_t bytes,
                               std::string_view phase) {
  const Handle h = read_handle(handle, bytes, phase);
  int ordinal = -1;
  const cudaError_t found = cudaDeviceGetByPCIBusId(&ordinal, h.bus_id.c_str());
  if (found != cudaSuccess) {
    (void)cudaGetLastError();
    fail(std::string(phase), "open_for_nic: this process sees no CUDA device at PCI bus id {} ({})",
         h.bus_id, cudaGetErrorString(found));
  }
  return {.memory = open_handle(ordinal, h, phase), .bytes = bytes, .registers_as_host = false};
}

}  // namespace proxyep::gpu_side::cuda
