// CUDA IPC for CudaDevice::allocate_shared / open_shared (device/device_runtime.hpp): device
// memory a node peer's kernels write into, reached through a handle the ranks exchange.
//
// Another process opens the handle with cudaIpcOpenMemHandle (peer access enabled lazily, so
// kernels reach it over NVLink or PCIe P2P). CUDA refuses to open a handle in the process that
// made it, and ranks run as threads of one process in tests and single-process jobs; there the
// owner's address is valid as it is (unified addressing), so a process-wide table of live
// allocations answers instead, and the opener holds the memory alive as the owner does. The
// handle names the owner's device by its PCI bus id too, for a process that numbers devices
// otherwise (open_for_nic).
#pragma once

#include "gpu_side/device/device_runtime.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace proxyep::gpu_side::cuda {

// cudaMalloc'ed `bytes` on device `ordinal` with its handle; cudaFree when the last owner goes.
device::SharedMemory allocate_shared_memory(int ordinal, uint64_t bytes);

// The address device `ordinal`'s kernels use for the memory `handle` names (at least `bytes`).
// Throws proxyep::Error(phase) for a handle of another kind or one CUDA cannot open.
std::shared_ptr<std::byte[]> open_shared_memory(int ordinal, std::span<const uint8_t> handle,
                                                uint64_t bytes, std::string_view phase);

// The NIC's view of the memory `handle` names, in a process that has no CudaDevice for it (the
// node daemon, which registers it for GPUDirect RDMA, FI_HMEM_CUDA): opened on the device that
// owns it, found by its PCI bus id (the daemon's device numbering may differ from the owner's,
// CUDA_VISIBLE_DEVICES). Throws proxyep::Error(phase) as open_shared_memory does, or when this
// process sees no device of that bus id.
device::NicMemory open_for_nic(std::span<const uint8_t> handle, uint64_t bytes,
                               std::string_view phase);

}  // namespace proxyep::gpu_side::cuda
