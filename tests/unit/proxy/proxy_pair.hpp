// Test fixture: two ranks in one process (two Fabric instances from fabric_pair.hpp), each with
// a proxy engine draining one descriptor ring, a counter bank behind a signal router, and the
// region table filled the way the bootstrap exchange would: region 0 = the rank's send buffer,
// region 1 = its receive buffer (remote writes land there).
#pragma once

#include "common/host_memory.hpp"
#include "control/counter_bank.hpp"
#include "control/signal_router.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_engine.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <string>

namespace proxyep::proxy::testing {

constexpr uint32_t kSendRegion = 0;
constexpr uint32_t kRecvRegion = 1;
constexpr uint64_t kRingSlots = 256;

// Options for tests: unpinned (both ranks share this process's cores), short peer timeout.
inline EngineOptions test_options() {
  EngineOptions options;
  options.placement.pin = false;
  options.peer_timeout = std::chrono::milliseconds(5000);
  options.credits = {.writes = 8, .bytes = 64 * 1024};  // small: the backlog gets exercised
  options.ring_window = 512;
  return options;
}

// Ranks whose ring a device kernel fills (gpu_side/cuda/ring_producer.cuh, the CUDA emulator's
// tests) instead of a host RingProducer: the ring is added without a doorbell (a GPU rings none),
// no producer is made for it, and its engine keeps polling (an idle proxy thread would otherwise
// look at a doorbell-less ring only every proxy.idle_sleep_us).
struct DeviceRings {
  bool rank[2] = {false, false};
};

struct ProxyRank {
  HostMemory memory = HostMemory::heap(gpu_side::Ring::bytes_for(kRingSlots));
  gpu_side::Ring ring = gpu_side::Ring::create(memory.bytes(), kRingSlots);
  gpu_side::Doorbell doorbell;
  control::CounterBank bank{64};
  control::SignalRouter router;
  std::unique_ptr<ProxyEngine> engine;
  std::unique_ptr<gpu_side::RingProducer> producer;
};

class ProxyPair {
 public:
  ProxyPair(const std::string& provider, bool reorder, size_t bytes,
            EngineOptions options = test_options(), DeviceRings device = {})
      : ProxyPair([&](int r) { return fabric::testing::options_for(provider, r, 1, reorder); },
                  bytes, options, true, device) {}
  // Each rank's fabric opened with `fabric_options(rank)`. With start = false the engines wait
  // for start(), so descriptors pushed before then are popped as one burst.
  ProxyPair(const std::function<fabric::FabricOptions(int)>& fabric_options, size_t bytes,
            EngineOptions options, bool start = true, DeviceRings device = {})
      : fabrics_(fabric_options, bytes) {
    for (int r = 0; r < 2; ++r) {
      ProxyRank& rank = ranks_[r];
      rank.router.attach_counters(rank.bank);
      rank.engine = std::make_unique<ProxyEngine>(fabrics_.fabric(r), r, 2, rank.router, options);
      RegionTable& table = rank.engine->regions();
      table.add_local(kSendRegion, *fabrics_.rank(r).send_region);
      table.add_local(kRecvRegion, *fabrics_.rank(r).recv_region);
      for (int peer = 0; peer < 2; ++peer) {
        table.add_remote(peer, kSendRegion, fabrics_.rank(peer).send_region->descriptor());
        table.add_remote(peer, kRecvRegion, fabrics_.rank(peer).recv_region->descriptor());
      }
      if (device.rank[r]) {
        rank.engine->add_ring(rank.ring, nullptr);
        rank.engine->keep_polling(true);
        continue;
      }
      rank.engine->add_ring(rank.ring, &rank.doorbell);
      rank.producer = std::make_unique<gpu_side::RingProducer>(
          rank.ring, gpu_side::ProducerOptions{.doorbell = &rank.doorbell});
    }
    if (start) this->start();
  }
  ~ProxyPair() {
    for (auto& rank : ranks_)
      if (rank.engine) rank.engine->stop();
  }

  void start() {
    for (auto& rank : ranks_)
      rank.engine->start();
  }

  ProxyRank& rank(int r) { return ranks_[r]; }
  ProxyEngine& engine(int r) { return *ranks_[r].engine; }
  fabric::testing::Rank& buffers(int r) { return fabrics_.rank(r); }
  // Stops rank r's engine and closes its fabric, as if the process had gone away.
  void kill(int r) {
    ranks_[r].engine->stop();
    fabrics_.close(r);
  }

  void push(int from, const gpu_side::Descriptor& d) {
    REQUIRE(ranks_[from].producer != nullptr);  // a device ring's rank pushes from its kernels
    Status status = ranks_[from].producer->push(d, Deadline::after_ms(fabric::testing::kWaitMs));
    REQUIRE(status == Status::ok);
  }

 private:
  fabric::testing::FabricPair fabrics_;
  ProxyRank ranks_[2];
};

// A write of `length` bytes from `from`'s send buffer at `offset` to the same offset of the
// peer's receive buffer, counted under `key` (epoch 0).
inline gpu_side::Descriptor write_descriptor(int from, uint64_t offset, uint64_t length,
                                             uint32_t key, uint64_t cookie = 0) {
  gpu_side::Descriptor d;
  d.op = length == 0 ? gpu_side::Op::signal : gpu_side::Op::write_imm;
  d.dst_rank = static_cast<uint32_t>(1 - from);
  d.local_region = kSendRegion;
  d.remote_region = kRecvRegion;
  d.src_offset = offset;
  d.dst_offset = length == 0 ? 0 : offset;
  d.length = length;
  d.cookie = cookie;
  d.imm = control::imm::encode_counter(0, key);
  return d;
}

}  // namespace proxyep::proxy::testing
