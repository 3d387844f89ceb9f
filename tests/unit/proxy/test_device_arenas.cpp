// DeviceArenas (proxy/session/device_arenas.hpp): the node's arenas in device memory, opened
// through the bootstrap by ranks as threads with host-simulated devices, one rank without a device.
// Which arenas each rank reaches, that a peer's device writes land in the owner's arena, and which
// calls use them.
#include "proxy/session/device_arenas.hpp"

#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "tests/unit/control/rank_threads.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <vector>

using namespace proxyep;
using gpu_side::device::SimulatedDevice;
using namespace std::chrono_literals;

namespace {

constexpr int kRanks = 4, kPerNode = 2;
constexpr uint64_t kBytes = 2 * 4096;
constexpr int kWithoutDevice = 3;  // rank 3 has none; its node peer, rank 2, has one

bool has_device(int rank) {
  return rank != kWithoutDevice;
}

}  // namespace

TEST_CASE("device arenas: node peers with devices reach each other's, a rank without one none") {
  const auto outcomes = control::testing::run_ranks(kRanks, 20s, [](control::Bootstrap& boot) {
    const int me = boot.rank();
    std::shared_ptr<SimulatedDevice> device;
    if (has_device(me)) device = std::make_shared<SimulatedDevice>();
    proxy::DeviceArenas arenas(boot, device, kBytes, kPerNode, 10s, "test");
    for (int r = 0; r < kRanks; ++r) {
      const bool same_node = r / kPerNode == me / kPerNode;
      const bool reached = same_node && has_device(me) && has_device(r);
      require((arenas.peer(r) != nullptr) == reached, "test", "rank {}: rank {}'s arena {}", me, r,
              reached ? "not reached" : "reached");
    }
    // Rank 0's device writes into rank 1's arena through its own mapping; rank 1 reads it.
    if (me == 0) {
      device->fill(arenas.peer(1) + 4096, 0x5a, 64);
      device->synchronize("test", 10s);
    }
    boot.barrier("written");
    if (me == 1) {
      std::vector<std::byte> seen(64);
      device->copy(seen.data(), arenas.local() + 4096, seen.size());
      device->synchronize("test", 10s);
      for (std::byte b : seen)
        require(b == std::byte{0x5a}, "test", "rank 1 reads {} in its arena", int(b));
    }
    // Only calls of the arenas' own device use them.
    auto other = std::make_shared<SimulatedDevice>();
    arenas.begin_call(0, device.get());
    arenas.begin_call(1, other.get());
    require(arenas.device_call(0) == has_device(me), "test", "call 0 of rank {}", me);
    require(!arenas.device_call(1), "test", "another device's call uses the arenas");
    arenas.begin_call(2, nullptr);
    require(!arenas.device_call(2), "test", "a host call uses the arenas");
    require(arenas.device_call(3) == false, "test", "call 3 reads call 1's parity");
    boot.barrier("done");  // nobody drops its arena while a peer still writes
  });
  for (int r = 0; r < kRanks; ++r) {
    CAPTURE(r);
    CHECK_MESSAGE(outcomes[r].ok, outcomes[r].error);
  }
}
