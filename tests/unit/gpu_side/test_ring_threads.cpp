// Ring under concurrency: several producers and the consumer in threads, each descriptor exactly
// once, intact and in its producer's order; overshoot at tiny capacities; and a slow producer
// whose half-written slots the consumer must never act on. Every wait has a deadline.
#include "gpu_side/ring.hpp"
#include "tests/unit/gpu_side/ring_fixture.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <thread>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side;
using namespace proxyep::gpu_side::testing;
using namespace std::chrono_literals;

namespace {

struct ProducerTally {
  std::atomic<uint64_t> timeouts{0};
  std::atomic<uint64_t> agains{0};
};

enum class Mode { blocking, try_single, try_burst };

// One attempt of `mode` to push descriptors from index `next` on; returns how many it pushed.
Status push_some(RingProducer& producer, Mode mode, uint32_t id, uint64_t next, uint64_t count,
                 const Deadline& deadline, size_t& pushed) {
  pushed = 0;
  if (mode == Mode::try_burst) {
    std::array<Descriptor, 7> batch;  // odd size: bursts straddle the ring's end
    const size_t n = static_cast<size_t>(std::min<uint64_t>(batch.size(), count - next));
    for (size_t k = 0; k < n; ++k)
      batch[k] = make_descriptor(id, next + k);
    return producer.try_push_burst(std::span(batch).first(n), pushed);
  }
  Status status = mode == Mode::blocking ? producer.push(make_descriptor(id, next), deadline)
                                         : producer.try_push(make_descriptor(id, next));
  pushed = status == Status::ok ? 1 : 0;
  return status;
}

// Producer `id` pushes `count` descriptors in `mode`, retrying on again.
void produce(Ring ring, uint32_t id, uint64_t count, Mode mode, ProducerTally& tally) {
  RingProducer producer(ring, {.stall_timeout = 10s});
  const Deadline deadline(15s);
  Backoff backoff;
  for (uint64_t i = 0; i < count;) {
    size_t pushed = 0;
    Status status = push_some(producer, mode, id, i, count, deadline, pushed);
    i += pushed;
    if (status == Status::ok) {
      backoff.reset();
      continue;
    }
    if (status == Status::again) {
      tally.agains.fetch_add(1, std::memory_order_relaxed);
      if (deadline.expired()) status = Status::timeout;
    }
    if (status != Status::again) {
      tally.timeouts.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    backoff.pause();
  }
}

void run_producers(uint32_t producers, uint64_t total, uint64_t capacity, Mode mode) {
  HeapRing r(capacity);
  RingConsumer consumer(r.ring);
  ArrivalChecker checker(producers);
  ProducerTally tally;
  std::vector<std::thread> threads;
  const uint64_t each = total / producers;
  for (uint32_t id = 0; id < producers; ++id)
    threads.emplace_back(produce, r.ring, id, each, mode, std::ref(tally));
  const bool drained = drain(consumer, checker, each * producers, Deadline(15s));
  for (auto& thread : threads)
    thread.join();
  CHECK_MESSAGE(drained, checker.summary());
  CHECK(tally.timeouts == 0);
  check_intact(checker, each * producers);
  CHECK(checker.nops() == 0);
  for (uint32_t id = 0; id < producers; ++id)
    CHECK(checker.next(id) == each);
  std::vector<WireDescriptor> extra(4);
  CHECK(consumer.pop_burst(extra) == 0);  // nothing beyond what was pushed
  CHECK(r.ring.header().producer.head == each * producers);
}

}  // namespace

TEST_CASE("several producers: every descriptor exactly once, intact, in producer order") {
  SUBCASE("4 producers, blocking push, 1e6 descriptors, 256 slots") {
    run_producers(4, 1'000'000, 256, Mode::blocking);
  }
  SUBCASE("2 producers, try_push retried, 1e6 descriptors, 1024 slots") {
    run_producers(2, 1'000'000, 1024, Mode::try_single);
  }
  SUBCASE("3 producers racing for a 2-slot ring (overshoot on nearly every push)") {
    run_producers(3, 60'000, 2, Mode::try_single);
  }
  SUBCASE("3 producers pushing bursts of up to 7 into 16 slots, 6e5 descriptors") {
    run_producers(3, 600'000, 16, Mode::try_burst);
  }
}

namespace {

// A producer that follows the slot protocol by hand but writes the payload one field at a time,
// yielding between fields, with seq last: any consumer that acted on anything but seq == c + 1
// would copy a mixture of two laps.
void slow_produce(Ring ring, uint32_t id, uint64_t count, std::atomic<bool>& failed) {
  RingHeader& header = ring.header();
  const Deadline deadline(15s);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t position = atomic(header.producer.head).fetch_add(1);
    while (static_cast<int64_t>(position -
                                atomic(header.consumer.tail).load(std::memory_order_acquire)) >=
           static_cast<int64_t>(ring.capacity())) {
      if (deadline.expired()) {
        failed = true;
        return;
      }
      std::this_thread::yield();
    }
    write_slot_slowly(ring, position, make_descriptor(id, i));
  }
}

}  // namespace

TEST_CASE("the consumer never acts on a half-written slot") {
  HeapRing r(4);
  RingConsumer consumer(r.ring);
  ArrivalChecker checker(2);
  std::atomic<bool> failed{false};
  constexpr uint64_t kEach = 1000;
  std::thread a(slow_produce, r.ring, 0, kEach, std::ref(failed));
  std::thread b(slow_produce, r.ring, 1, kEach, std::ref(failed));
  // The consumer polls as fast as it can to catch slots mid-write, yielding only every 8th
  // empty poll so that, with 3 threads on 2 cores, the producers still get to run.
  std::vector<WireDescriptor> out(4);
  const Deadline deadline(15s);
  uint64_t polls = 0;
  while (checker.popped() < 2 * kEach && !deadline.expired() && !failed) {
    ++polls;
    if (size_t n = consumer.pop_burst(out))
      checker.check(std::span(out).first(n));
    else if (polls % 8 == 0)
      std::this_thread::yield();
  }
  a.join();
  b.join();
  CHECK_FALSE(failed);
  check_intact(checker, 2 * kEach);
  CHECK(polls > 2 * kEach);  // the consumer really did poll while slots were being written
}
