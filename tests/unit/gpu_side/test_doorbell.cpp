// Doorbell and RingWaiter: producers kick only a sleeping consumer, only on the edge, and no
// wake-up is ever lost (thousands of sleep/produce races, each with a deadline).
#include "gpu_side/doorbell.hpp"
#include "tests/unit/gpu_side/ring_fixture.hpp"
#include "tests/unit/gpu_side/wakeup_race.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <random>
#include <thread>

using namespace proxyep;
using namespace proxyep::gpu_side;
using namespace proxyep::gpu_side::testing;
using namespace std::chrono_literals;

TEST_CASE("the doorbell counts kicks and a wait consumes them") {
  Doorbell bell;
  CHECK_FALSE(bell.wait(0ns));
  bell.kick();
  bell.kick();
  CHECK(bell.wait(0ns));
  CHECK_FALSE(bell.wait(1ms));  // both kicks consumed by one wait
  Doorbell moved = std::move(bell);
  CHECK(bell.fd() == -1);
  moved.kick();
  CHECK(moved.wait(1s));
}

TEST_CASE("producers kick only a consumer that announced sleep on an empty ring, once") {
  HeapRing r(64);
  Doorbell bell;
  RingProducer producer(r.ring, {.doorbell = &bell});
  RingConsumer consumer(r.ring);
  for (uint64_t i = 0; i < 10; ++i)
    REQUIRE(producer.try_push(make_descriptor(0, i)) == Status::ok);
  CHECK_FALSE(bell.wait(0ns));             // awake consumer: no syscalls, no kicks
  CHECK_FALSE(consumer.announce_sleep());  // not empty: the announcement is withdrawn
  CHECK(r.ring.header().signal.consumer_sleeping == 0);
  std::vector<WireDescriptor> out(16);
  REQUIRE(consumer.pop_burst(out) == 10);
  REQUIRE(consumer.announce_sleep());  // empty, nothing reserved
  REQUIRE(producer.try_push(make_descriptor(0, 10)) == Status::ok);
  CHECK(r.ring.header().signal.consumer_sleeping == 0);  // the kicking producer took the flag
  REQUIRE(producer.try_push(make_descriptor(0, 11)) == Status::ok);
  CHECK(bell.wait(0ns));        // one kick ...
  CHECK_FALSE(bell.wait(0ns));  // ... for two pushes
  consumer.end_sleep();
  // A reservation made before the announcement keeps the consumer awake.
  REQUIRE(consumer.pop_burst(out) == 2);
  atomic(r.ring.header().producer.head).fetch_add(1);
  CHECK_FALSE(consumer.announce_sleep());
}

TEST_CASE("a waiting producer keeps the consumer awake and wakes a sleeping one") {
  HeapRing r(64);
  Doorbell bell;
  RingProducer producer(r.ring, {.doorbell = &bell});
  RingConsumer consumer(r.ring);
  producer.set_waiting(true);
  CHECK_FALSE(bell.wait(0ns));             // nobody slept: no kick
  CHECK_FALSE(consumer.announce_sleep());  // empty ring, but its producer waits
  producer.set_waiting(false);
  REQUIRE(consumer.announce_sleep());
  producer.set_waiting(true);  // a wait begins while the consumer sleeps
  CHECK(bell.wait(0ns));
  CHECK(r.ring.header().signal.consumer_sleeping == 0);
  producer.set_waiting(false);
  CHECK_FALSE(bell.wait(0ns));  // ending a wait kicks nobody
}

TEST_CASE("no lost wake-up: thousands of sleep/produce races") {
  constexpr uint64_t kRounds = 4000;
  const WakeupRaces races = sleep_produce_races(ProducerMode::multi, false, false, kRounds);
  CHECK_MESSAGE(races.lost == 0, "wake-up lost in round " << races.lost - 1);
  CHECK(races.consumer_timeouts == 0);
  CHECK(races.blocks >= kRounds / 4);  // the sleep path was really taken
}

TEST_CASE("without a doorbell (GPU producers) the waiter polls with timed sleeps") {
  HeapRing r(8);
  RingConsumer consumer(r.ring);
  RingWaiter waiter(consumer, nullptr, {.spins = 16, .yields = 2, .timed_sleep = 50us});
  const auto start = Deadline::Clock::now();
  CHECK(waiter.wait(Deadline(30ms)) == Status::timeout);
  CHECK(Deadline::Clock::now() - start >= 30ms);
  std::thread producer_thread([&] {
    std::this_thread::sleep_for(20ms);
    RingProducer producer(r.ring);  // no doorbell: nobody kicks
    REQUIRE(producer.try_push(make_descriptor(0, 0)) == Status::ok);
  });
  CHECK(waiter.wait(Deadline(5s)) == Status::ok);
  producer_thread.join();
  CHECK(waiter.blocks() == 0);
}

TEST_CASE("a doorbell wait ends at the caller's deadline, not at max_block") {
  HeapRing r(8);
  Doorbell bell;
  RingConsumer consumer(r.ring);
  RingWaiter waiter(consumer, &bell, {.spins = 0, .yields = 0, .max_block = 60s});
  const auto start = Deadline::Clock::now();
  CHECK(waiter.wait(Deadline(50ms)) == Status::timeout);
  const auto elapsed = Deadline::Clock::now() - start;
  CHECK(elapsed >= 50ms);
  CHECK(elapsed < 5s);
  CHECK(waiter.blocks() >= 1);
}
