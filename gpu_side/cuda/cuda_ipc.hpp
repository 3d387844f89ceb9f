// CUDA IPC for CudaDevice::allocate_shared / open_shared (device/device_runtime.hpp): device
// memory a node peer's kernels write into, reached through a handle the ranks exchange.
//
// Another process opens the handle with cudaIpcOpenMemHandle (peer access enabled lazily, so
// kernels reach it over NVLink or PCIe P2P). CUDA refuses to open a handle in the process that
// made it, and ranks run as threads of one process in tests and single-process jobs; there the
// owner's address is valid as it is (unified addressing), so a process-wide table of live
// allocations answers instead, and the opener holds the memory alive as the owner does.
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

}  // namespace proxyep::gpu_side::cuda
