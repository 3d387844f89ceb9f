// DeviceRegions: the session's row memory (proxy::Session::row_memory: this rank's arena, the
// node peers' arenas mapped here, the staging area) registered with a Buffer's device for as
// long as the Buffer lives, so that the device backend's kernels pack rows straight into the
// slots and read arriving rows out of them: a device call's rows cross PCIe once each way, and
// host code never touches them.
//
// The kernels are handed the host addresses the protocols compute, so registration must map
// each region at its host address (unified addressing, which every 64-bit CUDA platform has); a
// device that maps it elsewhere is refused when the Buffer is made, naming the region.
// Registration pins the pages: a Buffer with a device costs its arenas and staging in locked
// memory.
#pragma once

#include "gpu_side/device/device_runtime.hpp"

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace proxyep::integrations {

class DeviceRegions {
 public:
  DeviceRegions() = default;
  // Registers every region of `regions` with `device`; throws proxyep::Error(phase) (nothing
  // left registered) when one cannot be, or is mapped away from its host address.
  DeviceRegions(std::shared_ptr<gpu_side::device::DeviceRuntime> device,
                const std::vector<std::span<std::byte>>& regions, std::string_view phase);
  ~DeviceRegions();  // unregisters; a failure is logged, not thrown
  DeviceRegions(const DeviceRegions&) = delete;
  DeviceRegions& operator=(const DeviceRegions&) = delete;

  uint64_t bytes() const { return bytes_; }

 private:
  void release() noexcept;

  std::shared_ptr<gpu_side::device::DeviceRuntime> device_;
  std::vector<void*> registered_;
  uint64_t bytes_ = 0;
};

}  // namespace proxyep::integrations
