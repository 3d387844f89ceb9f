// Stream capture on the host-simulated device (gpu_side/device/simulated_device_capture.cpp):
// the capture cases of device_capture_cases.hpp (which CUDA also runs) under every stream option,
// and what only the simulation can show: memory dropped inside a capture living as long as its
// graph, and which streams may launch a graph.
#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "tests/unit/gpu_side/device/device_capture_cases.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>

using namespace proxyep;
using namespace proxyep::gpu_side;
using device::SimulatedDevice;
using device::SimulatedDeviceOptions;
using testing::device_signal::error_of;
using namespace std::chrono_literals;

TEST_CASE(
    "simulated device: a captured step replays; a stream joins a capture; what a graph cannot "
    "hold is refused") {
  namespace cases = testing::device_capture;
  for (const SimulatedDeviceOptions options :
       {SimulatedDeviceOptions{}, SimulatedDeviceOptions{.operation_delay = 5ms},
        SimulatedDeviceOptions{.defer_until_synchronize = true}}) {
    CAPTURE(options.operation_delay.count());
    CAPTURE(options.defer_until_synchronize);
    CHECK(cases::capture_and_replay_case(std::make_shared<SimulatedDevice>(options)) == "");
    CHECK(cases::refused_in_capture_case(std::make_shared<SimulatedDevice>(options)) == "");
    CHECK(cases::joined_capture_case(std::make_shared<SimulatedDevice>(options)) == "");
  }
}

TEST_CASE("simulated device: captured handshakes on two streams replay with epoch values") {
  namespace cases = testing::device_capture;
  // Not with defer_until_synchronize: the two streams wait for each other, so neither may hold
  // its work until the host synchronizes it.
  for (const SimulatedDeviceOptions options :
       {SimulatedDeviceOptions{}, SimulatedDeviceOptions{.operation_delay = 2ms}}) {
    CAPTURE(options.operation_delay.count());
    CHECK(cases::replayed_handshake_case(std::make_shared<SimulatedDevice>(options)) == "");
  }
}

TEST_CASE("simulated device: memory dropped inside a capture lives as long as its graph") {
  SimulatedDevice dev;
  const uint64_t before = dev.device_bytes_in_use();
  dev.begin_capture("test");
  dev.fill(dev.allocate(4096).get(), 1, 4096);  // its last owner goes at the end of the line
  std::unique_ptr<device::DeviceGraph> graph = dev.end_capture("test");
  dev.launch(*graph, "test");
  dev.launch(*graph, "test");
  dev.synchronize("test", 5s);
  CHECK(dev.device_bytes_in_use() == before + 4096);
  graph.reset();
  dev.synchronize("test", 5s);  // the release is queued behind the launches
  CHECK(dev.device_bytes_in_use() == before);
  // An invalid capture releases at once.
  dev.begin_capture("invalid");
  dev.fill(dev.allocate(4096).get(), 1, 4096);
  CHECK(error_of([&] { dev.synchronize("in capture", 5s); }).find("inside the capture") !=
        std::string::npos);
  CHECK(error_of([&] { (void)dev.end_capture("invalid"); }).find("the capture is invalid") !=
        std::string::npos);
  dev.synchronize("test", 5s);
  CHECK(dev.device_bytes_in_use() == before);
  // A graph is launched only by a stream of the device that captured it.
  SimulatedDevice other;
  dev.begin_capture("test");
  graph = dev.end_capture("test");
  CHECK(error_of([&] {
          other.launch(*graph, "elsewhere");
        }).find("not captured on a stream of this device") != std::string::npos);
  dev.another_stream()->launch(*graph, "another stream");
}
