// Single-producer rings (ProducerMode::single): the mode is recorded in the header and checked on
// attach; one producer at a time (a second one, in this process or another, gets an Error); no
// atomic RMW, so head in the header is exactly what was published; order over many laps, bursts
// straddling the end, timeouts that owe nothing; a half-written or corrupted slot is never
// accepted; and the doorbell loses no wake-up, both with membarrier (kSyncBarrier) and with a
// fence per publish (kSyncFence), also across a fork. Every wait has a deadline.
#include "common/error.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "tests/unit/gpu_side/ring_fixture.hpp"
#include "tests/unit/gpu_side/wakeup_race.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side;
using namespace proxyep::gpu_side::testing;
using namespace std::chrono_literals;

namespace {

struct SpscRing : HeapRing {
  explicit SpscRing(uint64_t capacity) : HeapRing(capacity, ProducerMode::single) {}
};

uint64_t shared_head(const Ring& ring) {
  return atomic(ring.header().producer.head).load(std::memory_order_acquire);
}

}  // namespace

TEST_CASE("the producer mode is in the header; attach reads it; old layouts are refused") {
  auto memory = HostMemory::heap(Ring::bytes_for(16));
  Ring multi = Ring::create(memory.bytes(), 16);
  CHECK(multi.producer_mode() == ProducerMode::multi);
  CHECK(Ring::attach(memory.bytes()).producer_mode() == ProducerMode::multi);
  Ring single = Ring::create(memory.bytes(), 16, ProducerMode::single);
  CHECK(single.producer_mode() == ProducerMode::single);
  CHECK(Ring::attach(memory.bytes()).producer_mode() == ProducerMode::single);
  CHECK_THROWS_AS(Ring::create(memory.bytes(), 16, static_cast<ProducerMode>(7)), Error);
  single.header().config.producer_mode = static_cast<ProducerMode>(7);
  CHECK_THROWS_WITH_AS(Ring::attach(memory.bytes()), doctest::Contains("producer mode"), Error);
  single.header().config.producer_mode = ProducerMode::single;
  single.header().config.layout_version = 1;  // a build from before the producer modes
  CHECK_THROWS_WITH_AS(Ring::attach(memory.bytes()),
                       doctest::Contains("made by another ProxyEP build"), Error);
}

TEST_CASE("a single-producer ring takes one producer; a second is refused until it leaves") {
  SpscRing r(8);
  RingConsumer consumer(r.ring);
  std::array<WireDescriptor, 8> out{};
  ArrivalChecker checker(1);
  {
    RingProducer first(r.ring);
    CHECK(r.ring.header().producer.attached == 1);
    CHECK_THROWS_WITH_AS(RingProducer(r.ring), doctest::Contains("already has a producer"), Error);
    CHECK_THROWS_AS(RingProducer(Ring::attach(r.memory.bytes())), Error);  // another view too
    for (uint64_t i = 0; i < 5; ++i)
      REQUIRE(first.try_push(make_descriptor(0, i)) == Status::ok);
    checker.check(std::span(out).first(consumer.pop_burst(std::span(out).first(3))));
  }
  CHECK(r.ring.header().producer.attached == 0);
  // The next producer continues at the published head, over slots the first one left in use.
  RingProducer second(r.ring);
  for (uint64_t i = 5; i < 11; ++i)
    REQUIRE(second.try_push(make_descriptor(0, i)) == Status::ok);
  CHECK(second.try_push(make_descriptor(0, 11)) == Status::again);  // 8 in the ring
  while (size_t n = consumer.pop_burst(out))
    checker.check(std::span(out).first(n));
  CHECK(checker.received() == 11);
  CHECK(checker.corrupt() + checker.wrong() == 0);
  // A multi-producer ring still takes any number of producers.
  HeapRing m(8);
  RingProducer a(m.ring), b(m.ring);
  CHECK(a.try_push(make_descriptor(0, 0)) == Status::ok);
  CHECK(b.try_push(make_descriptor(1, 0)) == Status::ok);
  CHECK(m.ring.header().producer.attached == 0);
}

TEST_CASE("single producer: order over many laps; head is exactly what was published") {
  SpscRing r(4);
  RingProducer producer(r.ring);
  RingConsumer consumer(r.ring);
  ArrivalChecker checker(1);
  std::array<WireDescriptor, 3> out{};
  uint64_t pushed = 0;
  for (int lap = 0; lap < 5000; ++lap) {
    while (producer.try_push(make_descriptor(0, pushed)) == Status::ok) {
      ++pushed;
      REQUIRE(shared_head(r.ring) == pushed);  // stored on every publish, never ahead of it
    }
    CHECK(shared_head(r.ring) == pushed);  // again changed nothing
    REQUIRE(consumer.pop_burst(out) == 3);
    checker.check(out);
  }
  while (size_t n = consumer.pop_burst(out))
    checker.check(std::span(out).first(n));
  CHECK(checker.corrupt() == 0);
  CHECK(checker.wrong() == 0);
  CHECK(checker.received() == pushed);
  CHECK(pushed == 4 + 3 * 4999);
  CHECK_FALSE(consumer.ready());
  CHECK_FALSE(producer.owes_nop());
}

TEST_CASE("single producer: bursts take as many as fit and straddle the ring's end") {
  SpscRing r(8);
  RingProducer producer(r.ring);
  RingConsumer consumer(r.ring);
  std::vector<Descriptor> batch;
  for (uint64_t i = 0; i < 10; ++i)
    batch.push_back(make_descriptor(0, i));
  size_t pushed = 99;
  CHECK(producer.try_push_burst(std::span(batch).first(0), pushed) == Status::ok);
  CHECK(pushed == 0);
  REQUIRE(producer.try_push_burst(std::span(batch).first(5), pushed) == Status::ok);
  CHECK(pushed == 5);
  CHECK(shared_head(r.ring) == 5);
  REQUIRE(producer.try_push_burst(std::span(batch).subspan(5), pushed) == Status::ok);
  CHECK(pushed == 3);  // room for 3 of 5
  CHECK(shared_head(r.ring) == 8);
  CHECK(producer.try_push_burst(std::span(batch).subspan(8), pushed) == Status::again);
  CHECK(pushed == 0);
  CHECK(shared_head(r.ring) == 8);
  std::array<WireDescriptor, 16> out{};
  ArrivalChecker checker(1);
  checker.check(std::span(out).first(consumer.pop_burst(std::span(out).first(6))));
  REQUIRE(producer.try_push_burst(std::span(batch).subspan(8), pushed) == Status::ok);
  CHECK(pushed == 2);  // positions 8 and 9: slots 0 and 1 of the second lap
  checker.check(std::span(out).first(consumer.pop_burst(out)));
  CHECK(checker.received() == 10);
  CHECK(checker.corrupt() + checker.wrong() == 0);

  // Many odd-sized bursts over a 16-slot ring, consumed in bursts of another odd size.
  SpscRing big(16);
  RingProducer p(big.ring);
  RingConsumer c(big.ring);
  ArrivalChecker all(1);
  std::array<Descriptor, 7> seven;
  std::array<WireDescriptor, 5> five{};
  uint64_t next = 0;
  for (int round = 0; round < 20000; ++round) {
    for (size_t k = 0; k < seven.size(); ++k)
      seven[k] = make_descriptor(0, next + k);
    size_t n = 0;
    const Status status = p.try_push_burst(seven, n);
    REQUIRE((status == Status::ok || status == Status::again));
    next += n;
    all.check(std::span(five).first(c.pop_burst(five)));
  }
  while (size_t n = c.pop_burst(five))
    all.check(std::span(five).first(n));
  CHECK(all.received() == next);
  CHECK(next > 20000 * 4);
  CHECK(all.corrupt() + all.wrong() == 0);
}

TEST_CASE("single producer: a blocking push times out owing nothing") {
  SpscRing r(2);
  RingProducer producer(r.ring, {.stall_timeout = 10ms});
  RingConsumer consumer(r.ring);
  REQUIRE(producer.push(make_descriptor(0, 0), Deadline(1s)) == Status::ok);
  REQUIRE(producer.push(make_descriptor(0, 1), Deadline(1s)) == Status::ok);
  CHECK(producer.push(make_descriptor(0, 2), Deadline(5ms)) == Status::timeout);
  CHECK_FALSE(producer.owes_nop());
  CHECK(shared_head(r.ring) == 2);  // nothing reserved
  CHECK(producer.flush(Deadline(0ms)) == Status::ok);
  std::array<WireDescriptor, 4> out{};
  REQUIRE(consumer.pop_burst(out) == 2);
  REQUIRE(producer.push(make_descriptor(0, 2), Deadline(1s)) == Status::ok);
  REQUIRE(consumer.pop_burst(out) == 1);
  Descriptor d;
  REQUIRE(decode(out[0], d) == DecodeResult::ok);
  CHECK(same(d, make_descriptor(0, 2)));  // no nop in between
  CHECK(consumer.health() == Status::ok);
}

TEST_CASE("single producer: stale and corrupted slots are never accepted") {
  SpscRing r(4);
  RingProducer producer(r.ring);
  RingConsumer consumer(r.ring);
  std::array<WireDescriptor, 4> out{};
  for (uint64_t i = 0; i < 4; ++i)
    REQUIRE(producer.try_push(make_descriptor(0, i)) == Status::ok);
  REQUIRE(consumer.pop_burst(out) == 4);
  // Slot 0 still holds position 0's image (seq 1); the consumer is at position 4: no match.
  CHECK_FALSE(consumer.ready());
  CHECK(consumer.pop_burst(out) == 0);
  // A published slot whose payload changed after its check word was computed does not decode.
  REQUIRE(producer.try_push(make_descriptor(0, 4)) == Status::ok);
  reinterpret_cast<char*>(&r.ring.slot(4))[24] ^= 1;  // a bit of src_offset
  REQUIRE(consumer.pop_burst(out) == 1);
  Descriptor d;
  CHECK(decode(out[0], d) == DecodeResult::bad_check);
  // A slot published under another position's seq (a torn GPU write, a lap mix-up) neither.
  REQUIRE(producer.try_push(make_descriptor(0, 5)) == Status::ok);
  WireDescriptor& slot = r.ring.slot(5);
  const WireDescriptor lap_before = encode(make_descriptor(0, 5), 5 + 1 - 4);
  std::memcpy(reinterpret_cast<char*>(&slot) + 8, reinterpret_cast<const char*>(&lap_before) + 8,
              56);
  REQUIRE(consumer.pop_burst(out) == 1);
  CHECK(decode(out[0], d) == DecodeResult::bad_check);
}

namespace {

// A single producer that follows the slot protocol by hand but writes the payload one field at a
// time, yielding between fields, seq and then head last: a consumer that acted on anything but
// seq == c + 1 would copy a mixture of two laps.
void slow_single_produce(Ring ring, uint64_t count, std::atomic<bool>& failed) {
  RingHeader& header = ring.header();
  const Deadline deadline(15s);
  for (uint64_t position = 0; position < count; ++position) {
    while (position - atomic(header.consumer.tail).load(std::memory_order_acquire) >=
           ring.capacity()) {
      if (deadline.expired()) {
        failed = true;
        return;
      }
      std::this_thread::yield();
    }
    write_slot_slowly(ring, position, make_descriptor(0, position));
    atomic(header.producer.head).store(position + 1, std::memory_order_release);
  }
}

}  // namespace

TEST_CASE("single producer: the consumer never acts on a half-written slot") {
  SpscRing r(4);
  RingConsumer consumer(r.ring);
  ArrivalChecker checker(1);
  std::atomic<bool> failed{false};
  constexpr uint64_t kCount = 2000;
  std::thread producer(slow_single_produce, r.ring, kCount, std::ref(failed));
  std::vector<WireDescriptor> out(4);
  const Deadline deadline(15s);
  uint64_t polls = 0;
  while (checker.popped() < kCount && !deadline.expired() && !failed) {
    ++polls;
    if (size_t n = consumer.pop_burst(out))
      checker.check(std::span(out).first(n));
    else if (polls % 8 == 0)
      std::this_thread::yield();
  }
  producer.join();
  CHECK_FALSE(failed);
  check_intact(checker, kCount);
  CHECK(polls > kCount);
}

TEST_CASE("single producer thread and consumer thread: every descriptor once, intact, in order") {
  for (const bool fence : {false, true}) {
    for (const uint64_t capacity : {uint64_t{2}, uint64_t{16}, uint64_t{1024}}) {
      CAPTURE(fence);
      CAPTURE(capacity);
      // A ring of 2 hands over every descriptor between the threads: a quarter as many still
      // wrap it 50,000 times, and keep the case inside its deadline on a loaded machine.
      const uint64_t count = capacity == 2 ? 100'000 : 400'000;
      SpscRing r(capacity);
      RingConsumer consumer(r.ring);
      ArrivalChecker checker(1);
      std::atomic<bool> producer_ok{true};
      std::thread producer_thread([&] {
        RingProducer producer(r.ring, {.fence_per_publish = fence});
        const Deadline deadline(15s);
        std::array<Descriptor, 5> batch;
        Backoff backoff;
        for (uint64_t i = 0; i < count;) {
          size_t pushed = 0;
          if (i % 3 == 0) {  // mix single pushes and bursts
            pushed = producer.try_push(make_descriptor(0, i)) == Status::ok ? 1 : 0;
          } else {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(batch.size(), count - i));
            for (size_t k = 0; k < n; ++k)
              batch[k] = make_descriptor(0, i + k);
            (void)producer.try_push_burst(std::span(batch).first(n), pushed);
          }
          i += pushed;
          if (pushed != 0) {
            backoff.reset();
            continue;
          }
          if (deadline.expired()) {
            producer_ok = false;
            return;
          }
          backoff.pause();
        }
      });
      const bool drained = drain(consumer, checker, count, Deadline(15s), 7);
      producer_thread.join();
      CHECK(producer_ok);
      CHECK_MESSAGE(drained, checker.summary());
      check_intact(checker, count);
      CHECK(checker.nops() == 0);
      CHECK(shared_head(r.ring) == count);
    }
  }
}

TEST_CASE("single producer doorbell: kicks only a sleeping consumer, once, in both sync modes") {
  for (const bool fence : {false, true}) {
    CAPTURE(fence);
    SpscRing r(64);
    Doorbell bell;
    RingConsumer consumer(r.ring);
    // The consumer announced its sleep before any producer attached: the producer's first
    // publish must still see the flag (the constructor's sync store and fence).
    REQUIRE(consumer.announce_sleep());
    RingProducer producer(r.ring, {.doorbell = &bell, .fence_per_publish = fence});
    if (fence) CHECK(producer.fences_publish());
    MESSAGE("membarrier doorbell: " << !producer.fences_publish());
    CHECK(r.ring.header().producer.sync == (producer.fences_publish() ? kSyncFence : kSyncBarrier));
    REQUIRE(producer.try_push(make_descriptor(0, 0)) == Status::ok);
    CHECK(r.ring.header().signal.consumer_sleeping == 0);  // the producer took the flag
    CHECK(bell.wait(0ns));
    consumer.end_sleep();
    for (uint64_t i = 1; i < 10; ++i)
      REQUIRE(producer.try_push(make_descriptor(0, i)) == Status::ok);
    CHECK_FALSE(bell.wait(0ns));             // awake consumer: no kicks
    CHECK_FALSE(consumer.announce_sleep());  // not empty: the announcement is withdrawn
    CHECK(r.ring.header().signal.consumer_sleeping == 0);
    std::vector<WireDescriptor> out(16);
    REQUIRE(consumer.pop_burst(out) == 10);
    REQUIRE(consumer.announce_sleep());
    std::array<Descriptor, 3> batch{make_descriptor(0, 10), make_descriptor(0, 11),
                                    make_descriptor(0, 12)};
    size_t pushed = 0;
    REQUIRE(producer.try_push_burst(batch, pushed) == Status::ok);
    REQUIRE(pushed == 3);
    REQUIRE(producer.try_push(make_descriptor(0, 13)) == Status::ok);
    CHECK(bell.wait(0ns));        // one kick ...
    CHECK_FALSE(bell.wait(0ns));  // ... for a burst and a push
    consumer.end_sleep();
    REQUIRE(consumer.pop_burst(out) == 4);
  }
}

TEST_CASE("single producer: no lost wake-up in thousands of sleep/publish races") {
  constexpr uint64_t kRounds = 4000;
  for (const bool fence : {false, true}) {
    for (const bool burst : {false, true}) {
      CAPTURE(fence);
      CAPTURE(burst);
      const WakeupRaces races = sleep_produce_races(ProducerMode::single, fence, burst, kRounds);
      CHECK_MESSAGE(races.lost == 0, "wake-up lost in round " << races.lost - 1);
      CHECK(races.consumer_timeouts == 0);
      CHECK(races.blocks >= kRounds / 4);  // the sleep path was really taken
    }
  }
}

TEST_CASE("a forked child is the single producer; the parent's producer is refused") {
  constexpr uint64_t kCount = 50'000;
  auto memory = HostMemory::memfd(Ring::bytes_for(64), "proxyep-test-spsc-fork");
  Ring ring = Ring::create(memory.bytes(), 64, ProducerMode::single);
  Doorbell bell;
  const int fd = memory.fd();
  std::fflush(nullptr);  // or the child's exit may flush our buffered output a second time
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 0;
    try {
      auto mapping = HostMemory::map_fd(fd);
      RingProducer producer(Ring::attach(mapping.bytes()), {.doorbell = &bell});
      for (uint64_t i = 0; i < kCount && code == 0; ++i) {
        if (producer.push(make_descriptor(7, i), Deadline(20s)) != Status::ok) code = 3;
        // Pause now and then so the parent's consumer runs dry and sleeps on the doorbell.
        if (i % 512 == 511) std::this_thread::sleep_for(200us);
      }
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  // Once the child holds the producer role, this process cannot take it.
  const Deadline attached(10s);
  while (atomic(ring.header().producer.attached).load(std::memory_order_acquire) == 0 &&
         !attached.expired())
    std::this_thread::sleep_for(100us);
  CHECK_THROWS_WITH_AS(RingProducer{ring}, doctest::Contains("already has a producer"), Error);
  RingConsumer consumer(ring);
  // max_block past the deadline: a lost wake-up fails the test instead of costing 10 ms.
  RingWaiter waiter(consumer, &bell, {.spins = 64, .yields = 0, .max_block = 60s});
  ArrivalChecker checker(8);
  drain(waiter, consumer, checker, kCount);
  const int status = reap_child(child);
  check_intact(checker, kCount);
  CHECK(checker.next(7) == kCount);
  CHECK(waiter.blocks() > 0);  // the doorbell path across processes was taken
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
