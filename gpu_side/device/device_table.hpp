// What a step that a graph may capture (integrations/low_latency/ll_node_dispatch.hpp) sets up
// once: the stream it sets up on, and the tables of addresses its kernels read (slots, sinks),
// uploaded from host vectors.
#pragma once

#include "gpu_side/device/device_runtime.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace proxyep::gpu_side::device {

// The stream a step allocates and uploads on: the device's own, or, while that one is being
// captured (where the host may neither copy from its memory nor wait), another stream of the
// device, with the thread's capture relaxed (DeviceRuntime::relax_capture) while it is used.
// Memory allocated on that one is released in its order, not the captured stream's: the step
// must outlive the graph's launches (as a graph's memory must).
struct SetupStream {
  std::shared_ptr<void> relaxed;  // declared first: dropped after the stream
  std::shared_ptr<DeviceRuntime> stream;
  DeviceRuntime* operator->() const { return stream.get(); }
  DeviceRuntime& operator*() const { return *stream; }
};

inline SetupStream setup_stream(const std::shared_ptr<DeviceRuntime>& device) {
  if (!device->capturing()) return {nullptr, device};
  std::shared_ptr<void> relaxed = device->relax_capture();
  return {std::move(relaxed), device->open_stream()};
}

// Whether `p` is a multiple of `to` bytes (a step's plan check: slots 16, words 8).
inline bool is_aligned(const void* p, uintptr_t to) {
  return reinterpret_cast<uintptr_t>(p) % to == 0;
}

// Queues the copy: `items` must stay as they are until the device is synchronized.
template <class T>
std::shared_ptr<std::byte[]> upload_table(DeviceRuntime& device, const std::vector<T>& items) {
  const uint64_t bytes = items.size() * sizeof(T);
  std::shared_ptr<std::byte[]> memory = device.allocate(bytes);
  device.copy(memory.get(), items.data(), bytes);
  return memory;
}

}  // namespace proxyep::gpu_side::device
