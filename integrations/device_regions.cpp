// A Buffer's row memory registered with its device (device_regions.hpp).
#include "integrations/device_regions.hpp"

#include "common/error.hpp"
#include "common/log.hpp"

namespace proxyep::integrations {

DeviceRegions::DeviceRegions(std::shared_ptr<gpu_side::device::DeviceRuntime> device,
                             const std::vector<std::span<std::byte>>& regions,
                             std::string_view phase)
    : device_(std::move(device)) {
  try {
    for (const std::span<std::byte> region : regions) {
      if (region.empty()) continue;
      void* mapped = device_->register_host(region.data(), region.size());
      registered_.push_back(region.data());
      bytes_ += region.size();
      require(mapped == region.data(), phase,
              "the {} device maps host memory at {} to {}, not the same address: the device "
              "backend needs unified addressing (region of {} bytes)",
              device_->kind(), static_cast<void*>(region.data()), mapped, region.size());
    }
  } catch (...) {
    release();
    throw;
  }
}

DeviceRegions::~DeviceRegions() {
  release();
}

void DeviceRegions::release() noexcept {
  for (void* host : registered_) {
    try {
      device_->unregister_host(host);
    } catch (const std::exception& e) {
      log::warn("buffer: unregistering row memory at {} from the device: {}", host, e.what());
    }
  }
  registered_.clear();
  bytes_ = 0;
}

}  // namespace proxyep::integrations
