// The DeviceBackend on the host-simulated device against the HostBackend, bit for bit
// (device_backend_cases.hpp; tests/gpu/test_gpu_backend.cpp runs the same cases on CUDA), once
// with an eager stream and once with one that runs nothing until waited for, so a result read
// before its wait fails the comparison. Plus the wiring the simulation exists to catch.
#include "gpu_side/device/simulated_device.hpp"
#include "tests/unit/integrations/device_backend_cases.hpp"
#include "tests/unit/integrations/device_backend_ll_cases.hpp"

#include <doctest/doctest.h>

#include <thread>

using namespace proxyep;
using namespace proxyep::testing::device_backend_cases;
using gpu_side::device::SimulatedDevice;
using gpu_side::device::SimulatedDeviceOptions;

namespace {

std::shared_ptr<SimulatedDevice> simulated(bool deferred) {
  return std::make_shared<SimulatedDevice>(
      SimulatedDeviceOptions{.defer_until_synchronize = deferred});
}

}  // namespace

TEST_CASE("device backend on the simulated device equals the host backend") {
  for (bool deferred : {false, true}) {
    CAPTURE(deferred);
    CHECK(layout_case(simulated(deferred)) == "");
    CHECK(pack_rows_case(simulated(deferred), false) == "");
    CHECK(pack_rows_case(simulated(deferred), true) == "");
    CHECK(place_routed_rows_case(simulated(deferred)) == "");
    CHECK(reduce_case(simulated(deferred)) == "");
    CHECK(copy_fill_case(simulated(deferred)) == "");
    CHECK(write_add_case(simulated(deferred)) == "");
    CHECK(ll_pack_case(simulated(deferred), false, false) == "");
    CHECK(ll_pack_case(simulated(deferred), true, false) == "");
    CHECK(ll_pack_case(simulated(deferred), true, true) == "");
    CHECK(ll_unpack_counted_case(simulated(deferred), false) == "");
    CHECK(ll_unpack_counted_case(simulated(deferred), true) == "");
    CHECK(ll_combine_case(simulated(deferred)) == "");
  }
}

TEST_CASE("device backend: leaves no device memory behind") {
  auto device = simulated(false);
  const uint64_t before = device->device_bytes_in_use();
  CHECK(reduce_case(device) == "");
  CHECK(pack_rows_case(device, true) == "");
  device->synchronize("test", std::chrono::seconds(10));
  CHECK(device->device_bytes_in_use() == before);
}

TEST_CASE("device backend: a sink the device cannot reach fails the call, naming the phase") {
  auto device = simulated(false);
  integrations::DeviceBackend backend(device);
  Inputs in(backend, false, 4);
  const ep::RowFormat format = in.format();
  const ep::RowAreas areas = ep::RowAreas::of(2, format);
  std::vector<std::byte> unregistered(areas.end);
  const std::vector<int32_t> tokens = {0, 1};
  std::string message;
  try {
    backend.pack_rows(in.device_source(), ep::RowSink::at(unregistered.data(), areas, 0, 1),
                      tokens);
    backend.complete("dispatch");
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("dispatch: the simulated device failed: dispatch_chunk: sink x row") !=
        std::string::npos);
}

TEST_CASE("device backend: host tensors are refused before anything is queued") {
  auto device = simulated(false);
  integrations::DeviceBackend backend(device);
  Inputs in(backend, false, 4);
  const ep::RowAreas areas = ep::RowAreas::of(1, in.format());
  Arena arena(*device, areas.end, 0);
  const std::vector<int32_t> tokens = {0};
  const uint64_t ran = device->operations_run();
  CHECK_THROWS_WITH_AS(
      backend.pack_rows(in.host_source(), ep::RowSink::at(arena.device(), areas, 0, 1), tokens),
      doctest::Contains("x must be on the same device"), Error);
  device->synchronize("test", std::chrono::seconds(10));
  CHECK(device->operations_run() == ran);
}

TEST_CASE("device backend: work is queued, and done once a mark after it is reached") {
  auto device = simulated(true);  // runs nothing until the host waits
  integrations::DeviceBackend backend(device);
  Arena arena(*device, 4096, 0);
  backend.fill(arena.device(), 0x5a, 256);
  const auto filled = backend.mark();
  CHECK(backend.mark() == filled);  // nothing queued since: the same point
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(backend.reached(filled, "test"));
  CHECK(arena.host()[0] == std::byte{0});  // a protocol publishing now would publish stale bytes
  backend.copy_rows(arena.device() + 256, arena.device(), 1, 256);
  const auto copied = backend.mark();
  CHECK(copied > filled);
  backend.wait(filled, "test");
  CHECK(backend.reached(filled, "test"));
  CHECK(arena.host()[0] == std::byte{0x5a});
  backend.wait(copied, "test");
  CHECK(arena.host()[256] == std::byte{0x5a});
  CHECK_THROWS_WITH_AS(backend.wait(copied + 1, "test"), doctest::Contains("never handed out"),
                       Error);
}

TEST_CASE("device backend: an upload is held until a mark after it is reached, then released") {
  auto device = simulated(false);
  integrations::DeviceBackend backend(device);
  Inputs in(backend, false, 4);
  const ep::RowAreas areas = ep::RowAreas::of(2, in.format());
  Arena arena(*device, areas.end, 0);
  device->synchronize("test", std::chrono::seconds(10));
  const uint64_t before = device->device_bytes_in_use();
  const std::vector<int32_t> tokens = {0, 1};
  backend.pack_rows(in.device_source(), ep::RowSink::at(arena.device(), areas, 0, 1), tokens);
  CHECK(device->device_bytes_in_use() > before);  // the token list's device copy
  backend.complete("test");
  device->synchronize("test", std::chrono::seconds(10));  // releases run in stream order
  CHECK(device->device_bytes_in_use() == before);
}
