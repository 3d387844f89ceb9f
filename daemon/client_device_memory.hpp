// A client's device memory as this daemon's NIC reaches it. A rank whose Buffer has a device
// offers proxyepd its device staging (chunks its kernels pack) and its device arena (where node
// peers' and other nodes' device calls put rows, proxy/session/device_arenas.hpp) by their
// DeviceRuntime::allocate_shared handles; where the daemon's fabric registers device memory
// (FI_HMEM), the daemon opens them here and registers them, so chunks leave from GPU memory and
// rows land in it (GPUDirect RDMA) as in process, instead of bouncing through host memory.
//
// The daemon has no DeviceRuntime of its own: it opens a handle by the kind the client names,
//   cuda       CUDA IPC (cudaIpcOpenMemHandle) on the device of the handle's PCI bus id; only in
//              a build with CUDA (gpu_side/cuda/cuda_ipc.hpp)
//   simulated  the memfd passed beside the handle, mapped as the NIC's view
//              (SimulatedDevice::open_for_nic)
#pragma once

#include "gpu_side/device/device_runtime.hpp"

#include <cstdint>
#include <span>
#include <string_view>

namespace proxyep::daemon {

// The memory `handle` (of `kind`) names, at least `bytes`, as this process's NIC reaches it;
// `fd`: the descriptor that came with it, or -1 (the caller keeps it). Throws
// proxyep::Error(phase) for a kind this build cannot open (cuda without CUDA), or a handle
// that does not open.
gpu_side::device::NicMemory open_client_device_memory(std::string_view kind,
                                                      std::span<const uint8_t> handle, int fd,
                                                      uint64_t bytes, std::string_view phase);

}  // namespace proxyep::daemon
