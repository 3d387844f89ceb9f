// The no-lost-wake-up race, for either producer mode: the consumer goes straight from "popped
// round r" to announce/re-check/block (no spinning), and the producer publishes round r + 1 after
// a random delay of 0..~3 us, so publishes land on every step of that sequence, including between
// the consumer's last look at the ring and its announcement (and, single-producer, inside its
// membarrier()). Every fourth round waits until the consumer is asleep, so the blocking path is
// exercised for sure. A lost wake-up blocks the consumer for max_block (60 s), far past the
// producer's 5 s deadline for the round.
#pragma once

#include "common/backoff.hpp"
#include "gpu_side/doorbell.hpp"
#include "tests/unit/gpu_side/ring_fixture.hpp"

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace proxyep::gpu_side::testing {

struct WakeupRaces {
  uint64_t lost = 0;  // the first round that lost its wake-up + 1, or 0
  uint64_t blocks = 0;
  int consumer_timeouts = 0;
};

// `burst`: each round publishes two descriptors with one try_push_burst.
inline WakeupRaces sleep_produce_races(ProducerMode mode, bool fence, bool burst, uint64_t rounds) {
  using namespace std::chrono_literals;
  HeapRing r(64, mode);
  Doorbell bell;
  std::atomic<uint64_t> observed{0};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> blocks{0};
  std::atomic<int> consumer_timeouts{0};
  std::thread consumer_thread([&] {
    RingConsumer consumer(r.ring);
    RingWaiter waiter(consumer, &bell, {.spins = 0, .yields = 0, .max_block = 60s});
    std::vector<WireDescriptor> out(8);
    while (!stop.load()) {
      if (waiter.wait(Deadline(15s)) != Status::ok) {
        ++consumer_timeouts;
        break;
      }
      observed.fetch_add(consumer.pop_burst(out), std::memory_order_release);
    }
    blocks = waiter.blocks();
  });
  RingProducer producer(r.ring, {.doorbell = &bell, .fence_per_publish = fence});
  std::mt19937 random(12345);
  WakeupRaces result;
  uint64_t expected = 0;
  for (uint64_t round = 0; round < rounds && result.lost == 0; ++round) {
    if (round % 4 == 3) {
      // Flag seen, then a pause: a single-producer consumer is still in membarrier() when its
      // flag appears, and a publish right then only makes it withdraw. After 200 us it is
      // blocked (or withdrew for a spurious reason and announced again).
      const Deadline settle(100ms);
      while (atomic(r.ring.header().signal.consumer_sleeping).load() == 0 && !settle.expired())
        cpu_relax();
      std::this_thread::sleep_for(200us);
    } else {
      for (uint32_t i = random() % 200; i > 0; --i)
        cpu_relax();
    }
    if (burst) {
      std::array<Descriptor, 2> two{make_descriptor(0, 2 * round),
                                    make_descriptor(0, 2 * round + 1)};
      size_t pushed = 0;
      REQUIRE(producer.try_push_burst(two, pushed) == Status::ok);  // the ring is empty
      REQUIRE(pushed == 2);
      expected += 2;
    } else {
      REQUIRE(producer.push(make_descriptor(0, round), Deadline(5s)) == Status::ok);
      expected += 1;
    }
    const Deadline deadline(5s);
    for (uint32_t i = 0; observed.load(std::memory_order_acquire) < expected; ++i) {
      if (i % 1024 == 1023 && deadline.expired()) {
        result.lost = round + 1;
        break;
      }
      cpu_relax();
    }
  }
  stop = true;
  bell.kick();  // release the consumer from its last wait
  REQUIRE(producer.push(make_descriptor(0, 1'000'000), Deadline(5s)) == Status::ok);
  consumer_thread.join();
  result.blocks = blocks.load();
  result.consumer_timeouts = consumer_timeouts.load();
  return result;
}

}  // namespace proxyep::gpu_side::testing
