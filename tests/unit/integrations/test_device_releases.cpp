// DeviceReleases (integrations/device_releases.hpp) on the host-simulated device: an output let
// go is kept until the reader's point is reached, dropped by collect() once it is, dropped at
// once without a point or while the stream is captured, never queued as a wait on the Buffer's
// stream while the Buffer lives (which a stream waiting for the Buffer's later work would
// deadlock), and freed behind waits for the pending points at the end.
#include "gpu_side/device/simulated_device.hpp"
#include "integrations/device_releases.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>

using namespace proxyep;
using gpu_side::device::SimulatedDevice;
using gpu_side::device::SimulatedDeviceOptions;
using integrations::DeviceReleases;
namespace ep = gpu_side::ep;
using namespace std::chrono_literals;

namespace {

// A device tensor, and a watch on its memory.
struct Output {
  explicit Output(SimulatedDevice& device)
      : memory(device.allocate(64)),
        tensor(ep::Tensor::over(memory, ep::DType::u8, 64, -1, ep::Device::cuda)),
        watch(memory) {
    memory.reset();  // the tensor is the only owner
  }
  std::shared_ptr<std::byte[]> memory;
  ep::Tensor tensor;
  std::weak_ptr<std::byte[]> watch;
};

}  // namespace

TEST_CASE("device releases: kept until the reader's point is reached, then dropped") {
  // The reader's stream runs nothing until waited for: its point stays unreached till then.
  auto device =
      std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.defer_until_synchronize = true});
  DeviceReleases releases(device);
  Output first(*device), second(*device);
  releases.release(std::move(first.tensor), device->record());
  CHECK(releases.pending() == 1);
  CHECK_FALSE(first.watch.expired());
  releases.collect();
  CHECK_FALSE(first.watch.expired());  // the point is not reached: still kept

  device->synchronize("test", 10s);
  releases.collect();
  CHECK(releases.pending() == 0);
  CHECK(first.watch.expired());

  // Without a point (a runtime without the caller's streams): dropped at once.
  releases.release(std::move(second.tensor), nullptr);
  CHECK(second.watch.expired());
  CHECK(releases.pending() == 0);
}

TEST_CASE("device releases: a release asks nothing; the end frees behind waits for the rest") {
  auto device =
      std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.defer_until_synchronize = true});
  Output a(*device), b(*device), c(*device);
  {
    DeviceReleases releases(device);
    releases.release(std::move(a.tensor), device->record());
    device->synchronize("test", 10s);
    releases.release(std::move(b.tensor), device->record());
    CHECK_FALSE(a.watch.expired());  // a's point is reached, but only collect() asks
    releases.collect();
    CHECK(a.watch.expired());
    CHECK_FALSE(b.watch.expired());
    CHECK(releases.pending() == 1);
    releases.release(std::move(c.tensor), device->record());
    CHECK(releases.pending() == 2);
  }  // the end: the stream waits for b's and c's points, their memory is freed behind them
  CHECK(b.watch.expired());
  CHECK(c.watch.expired());
  device->synchronize("test", 10s);  // the waits and the frees ran
}

TEST_CASE("device releases: nothing is asked of a stream being captured") {
  auto device = std::make_shared<SimulatedDevice>();
  DeviceReleases releases(device);
  Output kept(*device), during(*device);
  const auto point = device->record();
  device->synchronize("test", 10s);
  releases.release(std::move(kept.tensor), point);
  releases.collect();  // reached already
  CHECK(kept.watch.expired());
  device->begin_capture("test capture");
  // A point asked for now would be a host query inside the capture: dropped at once instead
  // (the runtime keeps memory freed during a capture for the graph).
  releases.release(std::move(during.tensor), device->record());
  releases.collect();
  CHECK(releases.pending() == 0);
  CHECK_NOTHROW((void)device->end_capture("test capture"));  // the capture is still valid
}
