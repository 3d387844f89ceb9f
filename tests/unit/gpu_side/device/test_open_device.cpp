// open_device (gpu_side/device/open_device.hpp): the devices a front end can choose by name, what
// it refuses, and the helpers the Python module uses (caller streams, where memory lives) on a
// device without CUDA streams and on memory CUDA does not know.
#include "gpu_side/device/open_device.hpp"

#include "common/error.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace device = proxyep::gpu_side::device;

TEST_CASE("open_device gives no device for host, the simulated one by name, and refuses others") {
  CHECK(device::open_device("host", 0, "test") == nullptr);
  auto simulated = device::open_device("simulated", 0, "test");
  REQUIRE(simulated != nullptr);
  CHECK(simulated->kind() == "simulated");
  CHECK_THROWS_WITH_AS(device::open_device("tpu", 0, "test"),
                       doctest::Contains("not one of host, simulated, cuda"), proxyep::Error);
  // Without CUDA in the build, or without a GPU on the machine, "cuda" says which.
  if (!device::built_with_cuda()) {
    CHECK_THROWS_WITH_AS(device::open_device("cuda", 0, "test"),
                         doctest::Contains("this build has no CUDA"), proxyep::Error);
  }
  const auto& kinds = device::device_kinds();
  CHECK(kinds == std::vector<std::string>{"host", "simulated", "cuda"});
}

TEST_CASE("the simulated device has no caller streams and its memory is no GPU's") {
  auto simulated = device::open_device("simulated", 0, "test");
  // Its callers work on the host: nothing to order after, and no CUDA stream of its own.
  CHECK(device::record_on_caller_stream(*simulated, 0, "test") == nullptr);
  CHECK_NOTHROW(device::require_no_graph_capture(*simulated, 0, "test"));
  CHECK(device::cuda_stream_of(*simulated) == 0);
  auto memory = simulated->allocate(4096);
  CHECK(device::cuda_device_of(memory.get()) == -1);
  std::vector<std::byte> host(64);
  CHECK(device::cuda_device_of(host.data()) == -1);
  CHECK(device::cuda_device_of(nullptr) == -1);
}
