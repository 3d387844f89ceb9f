// The handle of the simulated device's shared memory (SimulatedDevice::allocate_shared): what a
// peer needs to map the same memfd (the owner's pid and descriptor), its size, and whether the
// owner's device lets a NIC reach it. Little endian (common/wire.hpp):
//   u32 magic "PXSD" | u16 version | u16 flags | u64 pid | u64 fd | u64 bytes
// flags bit 0: the NIC reads it (SimulatedDeviceOptions::nic_reads_device_memory).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace proxyep::gpu_side::device {

struct SimulatedSharedHandle {
  bool nic_reads = false;
  uint64_t pid = 0, fd = 0, bytes = 0;
};

std::vector<uint8_t> encode_shared_handle(const SimulatedSharedHandle& handle);

// The fields of `handle`, a simulated device's handle of at least `bytes`. Throws
// proxyep::Error(phase), prefixed with `what`, for a handle of another kind, a malformed one, or
// too few bytes.
SimulatedSharedHandle read_shared_handle(std::span<const uint8_t> handle, uint64_t bytes,
                                         std::string_view what, std::string_view phase);

}  // namespace proxyep::gpu_side::device
