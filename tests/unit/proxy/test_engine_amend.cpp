// ProxyEngine::amend: memory registered and regions added while the proxy threads run (what a
// session's step transport does at the first captured call), with writes in flight on the
// regions already there; and a thread stuck inside the provider fails the amend, naming it,
// with nothing changed, instead of hanging it.
#include "common/host_memory.hpp"
#include "control/counter_bank.hpp"
#include "control/signal_router.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_engine.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"
#include "tests/unit/proxy/stuck_rail.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>

using namespace proxyep;
using namespace proxyep::proxy;
using namespace std::chrono_literals;

namespace {

constexpr size_t kBytes = 64 * 1024;
constexpr uint64_t kSlots = 64;
constexpr uint32_t kEarly = 0, kLate = 1;  // counter keys: writes to the early / late region

proxy::testing::StuckGate gate;  // the rails' poll() blocks while armed

struct Side {
  std::unique_ptr<fabric::Fabric> fabric;
  std::vector<uint8_t> send = std::vector<uint8_t>(kBytes);
  std::vector<uint8_t> early = std::vector<uint8_t>(kBytes), late = std::vector<uint8_t>(kBytes);
  std::unique_ptr<fabric::MemoryRegion> send_region, early_region, late_region;
  HostMemory ring_memory = HostMemory::heap(gpu_side::Ring::bytes_for(kSlots));
  gpu_side::Ring ring = gpu_side::Ring::create(ring_memory.bytes(), kSlots);
  gpu_side::Doorbell doorbell;
  control::CounterBank bank{2};
  control::SignalRouter router;
  std::unique_ptr<ProxyEngine> engine;
};

void push_all(Side& side, int to, uint32_t remote_region, uint32_t key) {
  gpu_side::RingProducer producer(side.ring, {.doorbell = &side.doorbell});
  for (size_t offset = 0; offset < kBytes; offset += 1024) {
    gpu_side::Descriptor d{.op = gpu_side::Op::write_imm,
                           .dst_rank = static_cast<uint32_t>(to),
                           .local_region = 0,
                           .remote_region = remote_region,
                           .src_offset = offset,
                           .dst_offset = offset,
                           .length = 1024,
                           .imm = control::imm::encode_counter(0, key)};
    REQUIRE(producer.push(d, Deadline::after_ms(10000)) == Status::ok);
  }
}

}  // namespace

TEST_CASE("engine amend: a region registered while the proxy threads run takes writes") {
  Side sides[2];
  for (int r = 0; r < 2; ++r) {
    auto options = fabric::testing::options_for("tcp", r, 1, /*reorder=*/true);
    options.wrap_rail = [](std::unique_ptr<fabric::Transport> rail) {
      return std::make_unique<proxy::testing::StuckRail>(std::move(rail), gate);
    };
    sides[r].fabric = fabric::Fabric::open(options);
  }
  const std::vector<fabric::Bytes> addresses{sides[0].fabric->addresses(),
                                             sides[1].fabric->addresses()};
  for (Side& s : sides)
    s.fabric->connect(addresses);
  EngineOptions options;
  options.placement = {.threads = 1, .pin = false, .cpus = ""};
  for (int r = 0; r < 2; ++r) {
    Side& s = sides[r];
    for (size_t i = 0; i < kBytes; ++i)
      s.send[i] = fabric::testing::pattern(r, i);
    s.send_region = s.fabric->register_memory(s.send.data(), kBytes);
    s.early_region = s.fabric->register_memory(s.early.data(), kBytes);
    s.router.attach_counters(s.bank);
    s.engine = std::make_unique<ProxyEngine>(*s.fabric, r, 2, s.router, options);
    s.engine->regions().add_local(0, *s.send_region);
    s.engine->add_ring(s.ring, &s.doorbell);
    REQUIRE(s.bank.set_expected(0, kEarly, kBytes / 1024) == Status::ok);
    REQUIRE(s.bank.set_expected(0, kLate, kBytes / 1024) == Status::ok);
  }
  for (int r = 0; r < 2; ++r) {
    sides[r].engine->regions().add_remote(1 - r, 1, sides[1 - r].early_region->descriptor());
    sides[r].engine->start();
  }
  // Frozen while running: a plain add throws.
  CHECK_THROWS_WITH_AS(sides[0].engine->regions().add_local(7, *sides[0].send_region),
                       doctest::Contains("added after the proxy engine started"), Error);

  // Writes to the early region flow while each rank registers its late region and adds it.
  std::thread writer0([&] { push_all(sides[0], 1, 1, kEarly); });
  std::thread writer1([&] { push_all(sides[1], 0, 1, kEarly); });
  for (Side& s : sides)
    s.engine->amend([&] { s.late_region = s.fabric->register_memory(s.late.data(), kBytes); },
                    Deadline::after_ms(10000));
  for (int r = 0; r < 2; ++r)
    sides[r].engine->amend(
        [&] {
          sides[r].engine->regions().add_remote(1 - r, 2, sides[1 - r].late_region->descriptor());
        },
        Deadline::after_ms(10000));
  writer0.join();
  writer1.join();
  CHECK_THROWS_AS(sides[0].engine->regions().add_local(7, *sides[0].send_region), Error);
  for (int r = 0; r < 2; ++r)
    push_all(sides[r], 1 - r, 2, kLate);
  for (int r = 0; r < 2; ++r) {
    sides[r].engine->wait_flag(sides[r].bank, 0, kEarly, Deadline::after_ms(20000), "early");
    sides[r].engine->wait_flag(sides[r].bank, 0, kLate, Deadline::after_ms(20000), "late");
    sides[r].engine->quiet(Deadline::after_ms(20000));
  }
  for (int r = 0; r < 2; ++r) {
    size_t bad = 0;
    for (size_t i = 0; i < kBytes; ++i)
      bad += (sides[r].early[i] != fabric::testing::pattern(1 - r, i)) +
             (sides[r].late[i] != fabric::testing::pattern(1 - r, i));
    CHECK(bad == 0);
  }

  // A thread stuck inside the provider: the amend fails at its deadline, naming the thread,
  // without running the change; once the provider returns, amend works again.
  gate.armed = true;
  while (!gate.inside)
    std::this_thread::sleep_for(1ms);
  bool ran = false;
  CHECK_THROWS_WITH_AS(sides[0].engine->amend([&] { ran = true; }, Deadline::after_ms(200)),
                       doctest::Contains("proxy thread 0 did not finish its pass in time"), Error);
  CHECK_FALSE(ran);
  gate.armed = false;
  sides[0].engine->amend([&] { ran = true; }, Deadline::after_ms(10000));
  CHECK(ran);
  for (Side& s : sides)
    s.engine->stop();
}
