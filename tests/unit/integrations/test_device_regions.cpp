// DeviceRegions (integrations/device_regions.hpp) on the host-simulated device: the regions are
// reachable by the device while registered and not after; a device that maps host memory away
// from its host address is refused, naming the region, with nothing left registered.
#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "integrations/device_regions.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

using namespace proxyep;
using gpu_side::device::DeviceEvent;
using gpu_side::device::DeviceRuntime;
using gpu_side::device::SimulatedDevice;
using integrations::DeviceRegions;

namespace {

constexpr auto kWait = std::chrono::seconds(10);

// Whether the device may write `region` now: fill() refuses an address it cannot reach before
// queueing anything.
bool reachable(DeviceRuntime& device, std::span<std::byte> region) {
  try {
    device.fill(region.data(), 0x5a, region.size());
    device.synchronize("test", kWait);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The simulated device, except that register_host maps the `shifted`-th region it is given at
// another address (as a device without unified addressing would).
class ShiftingDevice final : public DeviceRuntime {
 public:
  ShiftingDevice(std::shared_ptr<SimulatedDevice> inner, int shifted)
      : inner_(std::move(inner)), shifted_(shifted) {}
  std::string_view kind() const override { return "shifting"; }
  std::shared_ptr<DeviceRuntime> open_stream() const override { return inner_->open_stream(); }
  std::shared_ptr<std::byte[]> allocate(uint64_t bytes) override { return inner_->allocate(bytes); }
  void* register_host(void* host, uint64_t bytes) override {
    void* mapped = inner_->register_host(host, bytes);
    return registered_++ == shifted_ ? static_cast<std::byte*>(mapped) + 4096 : mapped;
  }
  void unregister_host(void* host) override { inner_->unregister_host(host); }
  void copy(void* to, const void* from, uint64_t bytes) override { inner_->copy(to, from, bytes); }
  void fill(void* to, uint8_t value, uint64_t bytes) override { inner_->fill(to, value, bytes); }
  // The kernels run on the simulated device's own stream, as every other operation.
  gpu_side::device::BoundKernels kernels() override { return inner_->kernels(); }
  std::unique_ptr<gpu_side::device::DeviceRingProducer> attach_ring(
      const gpu_side::Ring& ring) override {
    return inner_->attach_ring(ring);
  }
  void ring_push(gpu_side::device::DeviceRingProducer& producer,
                 const gpu_side::Descriptor* descriptors, int64_t count,
                 std::chrono::milliseconds timeout) override {
    inner_->ring_push(producer, descriptors, count, timeout);
  }
  void wait_value(const uint64_t* word, gpu_side::device::SignalValue value,
                  std::chrono::milliseconds timeout, std::string_view phase,
                  int64_t* waited_ns = nullptr) override {
    inner_->wait_value(word, value, timeout, phase, waited_ns);
  }
  void write_value(uint64_t* word, gpu_side::device::SignalValue value,
                   std::string_view phase) override {
    inner_->write_value(word, value, phase);
  }
  void add_value(uint64_t* word, uint64_t delta, std::string_view phase) override {
    inner_->add_value(word, delta, phase);
  }
  std::shared_ptr<DeviceEvent> record() override { return inner_->record(); }
  void wait_event(const std::shared_ptr<DeviceEvent>& event,
                  std::chrono::milliseconds timeout) override {
    inner_->wait_event(event, timeout);
  }
  bool reached(const DeviceEvent& event, std::string_view phase) override {
    return inner_->reached(event, phase);
  }
  void wait_for(const DeviceEvent& event, std::string_view phase,
                std::chrono::milliseconds timeout) override {
    inner_->wait_for(event, phase, timeout);
  }
  void synchronize(std::string_view phase, std::chrono::milliseconds timeout) override {
    inner_->synchronize(phase, timeout);
  }

 private:
  std::shared_ptr<SimulatedDevice> inner_;
  int shifted_;
  int registered_ = 0;
};

}  // namespace

TEST_CASE("device regions: reachable while registered, not after; empty regions skipped") {
  auto device = std::make_shared<SimulatedDevice>();
  std::vector<std::byte> a(8192), b(4096);
  const std::vector<std::span<std::byte>> regions{a, {}, b};
  CHECK_FALSE(reachable(*device, a));
  {
    const DeviceRegions registered(device, regions, "buffer");
    CHECK(registered.bytes() == a.size() + b.size());
    CHECK(reachable(*device, a));
    CHECK(reachable(*device, b));
    CHECK(a[100] == std::byte{0x5a});
  }
  CHECK_FALSE(reachable(*device, a));
  CHECK_FALSE(reachable(*device, b));
}

TEST_CASE("device regions: a device mapping host memory elsewhere is refused, nothing kept") {
  auto simulated = std::make_shared<SimulatedDevice>();
  auto device = std::make_shared<ShiftingDevice>(simulated, 1);
  std::vector<std::byte> a(8192), b(4096);
  std::string error;
  try {
    const DeviceRegions registered(device, {a, b}, "buffer");
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK(error.find("buffer") != std::string::npos);
  CHECK(error.find("unified addressing") != std::string::npos);
  CHECK(error.find("4096 bytes") != std::string::npos);  // the region refused
  // Both unregistered: neither is reachable, and both can be registered again.
  CHECK_FALSE(reachable(*simulated, a));
  CHECK_FALSE(reachable(*simulated, b));
  const DeviceRegions again(simulated, {a, b}, "buffer");
  CHECK(reachable(*simulated, b));
}
