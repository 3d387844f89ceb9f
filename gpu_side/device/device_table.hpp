// upload_table: fresh device memory holding a host vector's items, for the tables of addresses a
// kernel reads (slots, sinks) that a step sets up once, outside any capture.
#pragma once

#include "gpu_side/device/device_runtime.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace proxyep::gpu_side::device {

// Queues the copy: `items` must stay as they are until the device is synchronized.
template <class T>
std::shared_ptr<std::byte[]> upload_table(DeviceRuntime& device, const std::vector<T>& items) {
  const uint64_t bytes = items.size() * sizeof(T);
  std::shared_ptr<std::byte[]> memory = device.allocate(bytes);
  device.copy(memory.get(), items.data(), bytes);
  return memory;
}

}  // namespace proxyep::gpu_side::device
