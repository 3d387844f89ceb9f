// Several proxy threads per rank: two ranks in one process, each with two single-rail fabrics
// on their own domains (split_fabric.hpp), so the engine runs one proxy thread per domain. Two
// rings per rank, each drained by its own thread and fed by its own producer thread; both
// threads route remote completions into one counter bank at once, and quiet() spans both.
#include "common/host_memory.hpp"
#include "control/counter_bank.hpp"
#include "control/signal_router.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_engine.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"
#include "tests/unit/proxy/split_fabric.hpp"

#include <doctest/doctest.h>

#include <thread>

using namespace proxyep;
using namespace proxyep::proxy;
using namespace proxyep::proxy::testing;

namespace {

constexpr size_t kBytes = 256 * 1024;
constexpr uint64_t kSlots = 128;
constexpr int kRings = 2;

struct Side {
  std::unique_ptr<SplitFabric> fabric;
  std::vector<uint8_t> send = std::vector<uint8_t>(kBytes), recv = std::vector<uint8_t>(kBytes);
  std::unique_ptr<fabric::MemoryRegion> send_region, recv_region;
  std::vector<HostMemory> memory;
  std::vector<gpu_side::Ring> rings;
  std::vector<std::unique_ptr<gpu_side::Doorbell>> doorbells;
  control::CounterBank bank{4};
  control::SignalRouter router;
  std::unique_ptr<ProxyEngine> engine;
};

// Both ranks, set up and started: two single-rail fabrics each (part k of rank 0 connected to
// part k of rank 1), buffers registered on both, an engine with two threads and two rings.
void set_up(Side (&sides)[2], const std::string& provider) {
  std::vector<std::unique_ptr<fabric::Fabric>> parts[2];
  for (int part = 0; part < 2; ++part) {
    for (int r = 0; r < 2; ++r)
      parts[r].push_back(
          fabric::Fabric::open(fabric::testing::options_for(provider, r, 1, /*reorder=*/true)));
    std::vector<fabric::Bytes> addresses{parts[0][part]->addresses(), parts[1][part]->addresses()};
    for (int r = 0; r < 2; ++r)
      parts[r][part]->connect(addresses);
  }
  EngineOptions options;
  options.placement = {.threads = 2, .pin = false, .cpus = ""};
  options.credits = {.writes = 4, .bytes = 1 << 20};
  for (int r = 0; r < 2; ++r) {
    Side& s = sides[r];
    s.fabric = std::make_unique<SplitFabric>(std::move(parts[r]));
    s.send_region = s.fabric->register_memory(s.send.data(), kBytes, fabric::MemoryKind::host);
    s.recv_region = s.fabric->register_memory(s.recv.data(), kBytes, fabric::MemoryKind::host);
    for (size_t i = 0; i < kBytes; ++i)
      s.send[i] = fabric::testing::pattern(r, i);
    s.router.attach_counters(s.bank);
    s.engine = std::make_unique<ProxyEngine>(*s.fabric, r, 2, s.router, options);
    REQUIRE(s.engine->threads() == 2);
    s.engine->regions().add_local(0, *s.send_region);
  }
  for (int r = 0; r < 2; ++r) {
    Side& s = sides[r];
    s.engine->regions().add_remote(1 - r, 1, sides[1 - r].recv_region->descriptor());
    for (int i = 0; i < kRings; ++i) {
      s.memory.push_back(HostMemory::heap(gpu_side::Ring::bytes_for(kSlots)));
      s.rings.push_back(gpu_side::Ring::create(s.memory.back().bytes(), kSlots));
      s.doorbells.push_back(std::make_unique<gpu_side::Doorbell>());
      s.engine->add_ring(s.rings.back(), s.doorbells.back().get());
    }
    REQUIRE(s.bank.set_expected(0, 0, kBytes / 1024) == Status::ok);
    s.engine->start();
  }
}

// Producer thread (r, i) sends the i-th half of rank r's buffer, 1 KiB per descriptor.
void produce(Side& side, int r, int i) {
  gpu_side::RingProducer producer(side.rings[i], {.doorbell = side.doorbells[i].get()});
  for (size_t offset = i * kBytes / 2; offset < (i + 1) * kBytes / 2; offset += 1024) {
    gpu_side::Descriptor d{.op = gpu_side::Op::write_imm,
                           .dst_rank = static_cast<uint32_t>(1 - r),
                           .local_region = 0,
                           .remote_region = 1,
                           .src_offset = offset,
                           .dst_offset = offset,
                           .length = 1024,
                           .imm = control::imm::encode_counter(0, 0)};
    if (producer.push(d, Deadline::after_ms(10000)) != Status::ok) return;  // the wait fails
  }
}

}  // namespace

TEST_CASE("one proxy thread per domain: two threads drain two rings, one counter bank") {
  for (std::string provider : {"shm", "tcp"}) {
    CAPTURE(provider);
    Side sides[2];
    set_up(sides, provider);
    std::vector<std::thread> producers;
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < kRings; ++i)
        producers.emplace_back([&, r, i] { produce(sides[r], r, i); });
    for (auto& thread : producers)
      thread.join();
    for (int r = 0; r < 2; ++r) {
      sides[r].engine->wait_flag(sides[r].bank, 0, 0, Deadline::after_ms(20000), "all chunks");
      sides[r].engine->quiet(Deadline::after_ms(20000));
    }
    for (int r = 0; r < 2; ++r) {
      size_t bad = 0;
      for (size_t i = 0; i < kBytes; ++i)
        bad += sides[r].recv[i] != fabric::testing::pattern(1 - r, i);
      CHECK(bad == 0);
      for (int t = 0; t < 2; ++t) {
        ThreadStats stats = sides[r].engine->thread_stats(t);
        CHECK(stats.completed == kBytes / 2 / 1024);  // each thread drained its own ring
        CHECK(stats.remote > 0);                      // and routed completions of its rail
      }
      CHECK(sides[r].engine->stats().remote == kBytes / 1024);
    }
    for (auto& side : sides)
      side.engine->stop();
  }
}
