// DeviceCompletion (integrations/device_completion.hpp) on the host-simulated device: points
// reached only once their task raised the word, in order, a caller's stream ordered after one,
// and the backstop deadline failing a point without hanging anything.
#include "common/error.hpp"
#include "common/params.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "integrations/device_completion.hpp"
#include "tests/unit/integrations/device_test_tensors.hpp"

#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

using namespace proxyep;
using gpu_side::device::SimulatedDevice;
using integrations::DeviceCompletion;
using namespace std::chrono_literals;

using integrations::testing::error_of;

namespace {

// The host's view of a point, as a caller's stream sees it: that stream waits for the point,
// and the host for that stream (the simulated device's host waits only for its own events).
struct Observed {
  Observed(SimulatedDevice& device, const DeviceCompletion::Point& point)
      : stream(device.another_stream()) {
    stream->wait_event(point.event, 10s);
    after = stream->record();
  }
  bool reached() { return stream->reached(*after, "test"); }
  void wait() { stream->wait_for(*after, "test", 10s); }
  std::shared_ptr<SimulatedDevice> stream;
  std::shared_ptr<gpu_side::device::DeviceEvent> after;
};

}  // namespace

TEST_CASE("device completion: a point is reached once its number is, in order") {
  auto device = std::make_shared<SimulatedDevice>();
  DeviceCompletion completion(device);
  const DeviceCompletion::Point first = completion.next("test"), second = completion.next("test");
  CHECK(second.number == first.number + 1);
  Observed one(*device, first), two(*device, second);
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(one.reached());
  completion.reach(first.number);
  one.wait();
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(two.reached());
  // A late reach of an earlier number does not lower the word.
  completion.reach(second.number);
  completion.reach(first.number);
  two.wait();
}

TEST_CASE("device completion: a caller's stream waiting for a point reads what came before") {
  auto device = std::make_shared<SimulatedDevice>();
  auto caller = device->another_stream();
  DeviceCompletion completion(device);
  const DeviceCompletion::Point point = completion.next("test");
  // The task's device work, on the Buffer's stream; the caller's stream copies its output once
  // the point is reached.
  const std::shared_ptr<std::byte[]> output = device->allocate(16);
  std::array<uint8_t, 16> seen{};
  caller->wait_event(point.event, 10s);
  caller->copy(seen.data(), output.get(), seen.size());
  const auto copied = caller->record();
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(caller->reached(*copied, "test"));
  device->fill(output.get(), 9, 16);
  device->synchronize("test", 10s);  // as the task waits for its device work
  completion.reach(point.number);
  caller->wait_for(*copied, "test", 10s);
  CHECK(seen[0] == 9);
  CHECK(seen[15] == 9);
}

TEST_CASE("device completion: a point never signalled fails at its deadline, then is replaced") {
  params::ep_timeout_ms.set(25);  // the backstop is 4 x: 100 ms
  auto device = std::make_shared<SimulatedDevice>();
  {
    DeviceCompletion completion(device);
    const DeviceCompletion::Point lost = completion.next("dispatch");
    // check() reports nothing until the stream's wait ran out (100 ms after it began, however
    // late a loaded machine runs the stream's thread): asked until it does.
    std::string error;
    for (const auto give_up = std::chrono::steady_clock::now() + 10s;
         error.empty() && std::chrono::steady_clock::now() < give_up;
         std::this_thread::sleep_for(10ms))
      error = error_of([&] { completion.check("combine"); });
    CHECK(error.find("combine: an async call's completion was not signalled in time") !=
          std::string::npos);
    CHECK(error.find("wait_value (dispatch)") != std::string::npos);
    CHECK(error_of([&] { completion.check("combine"); }).empty());  // reported once
    // The replacement works as the first stream did.
    params::ep_timeout_ms.set(10000);
    const DeviceCompletion::Point next = completion.next("combine");
    Observed observed(*device, next);
    completion.reach(next.number);
    observed.wait();
    // A point left unreached when the Buffer goes: the destructor raises the word, no hang.
    (void)completion.next("dispatch");
  }
  params::ep_timeout_ms.reset();
}
