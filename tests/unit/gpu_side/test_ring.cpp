// Ring behaviour a single thread can pin down: layout validation, order, wraparound, bursts,
// full -> again, timeouts that owe a nop, and the single-consumer claim.
#include "common/error.hpp"
#include "gpu_side/ring.hpp"
#include "tests/unit/gpu_side/ring_fixture.hpp"

#include <doctest/doctest.h>

#include <array>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side;
using namespace proxyep::gpu_side::testing;
using namespace std::chrono_literals;

TEST_CASE("ring creation validates capacity and memory; attach validates the header") {
  auto memory = HostMemory::heap(Ring::bytes_for(64));
  CHECK_THROWS_AS(Ring::create(memory.bytes(), 48), Error);  // not a power of two
  CHECK_THROWS_AS(Ring::create(memory.bytes(), 1), Error);
  CHECK_THROWS_AS(Ring::create(memory.bytes(), 128), Error);             // does not fit
  CHECK_THROWS_AS(Ring::create(memory.bytes().subspan(64), 16), Error);  // misaligned
  CHECK_THROWS_AS(Ring::attach(memory.bytes()), Error);                  // zeroed: no magic

  Ring ring = Ring::create(memory.bytes(), 64);
  CHECK(ring.capacity() == 64);
  CHECK(Ring::attach(memory.bytes()).capacity() == 64);
  CHECK_THROWS_AS(Ring::attach(memory.bytes().first(Ring::bytes_for(32))), Error);  // truncated
  ring.header().config.descriptor_version = kDescriptorVersion + 1;
  CHECK_THROWS_WITH_AS(Ring::attach(memory.bytes()),
                       doctest::Contains("made by another ProxyEP build"), Error);
}

TEST_CASE("single producer: descriptors come out in order, intact, over many laps") {
  HeapRing r(4);
  RingProducer producer(r.ring);
  RingConsumer consumer(r.ring);
  ArrivalChecker checker(1);
  std::array<WireDescriptor, 3> out{};
  uint64_t pushed = 0;
  for (int lap = 0; lap < 5000; ++lap) {  // 5000 laps of a 4-slot ring, odd-sized bursts
    while (producer.try_push(make_descriptor(0, pushed)) == Status::ok)
      ++pushed;
    CHECK(consumer.ready());
    size_t n = consumer.pop_burst(out);
    REQUIRE(n == 3);
    checker.check(std::span(out).first(n));
  }
  while (size_t n = consumer.pop_burst(out))
    checker.check(std::span(out).first(n));
  CHECK(checker.corrupt() == 0);
  CHECK(checker.wrong() == 0);
  CHECK(checker.received() == pushed);
  CHECK(pushed == 4 + 3 * 4999);
  CHECK(consumer.position() == pushed);
  CHECK_FALSE(consumer.ready());
}

TEST_CASE("full ring returns again without reserving; popping makes room") {
  HeapRing r(8);
  RingProducer producer(r.ring);
  RingConsumer consumer(r.ring);
  for (uint64_t i = 0; i < 8; ++i)
    REQUIRE(producer.try_push(make_descriptor(0, i)) == Status::ok);
  CHECK(producer.try_push(make_descriptor(0, 8)) == Status::again);
  CHECK(producer.try_push(make_descriptor(0, 8)) == Status::again);
  CHECK(r.ring.header().producer.head == 8);  // again reserved nothing
  std::array<WireDescriptor, 2> out{};
  REQUIRE(consumer.pop_burst(out) == 2);
  CHECK(producer.try_push(make_descriptor(0, 8)) == Status::ok);
  CHECK(producer.try_push(make_descriptor(0, 9)) == Status::ok);
  CHECK(producer.try_push(make_descriptor(0, 10)) == Status::again);
}

TEST_CASE("burst push: one reservation for as many as fit, in order") {
  HeapRing r(8);
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
  CHECK(r.ring.header().producer.head == 5);
  REQUIRE(producer.try_push_burst(std::span(batch).subspan(5), pushed) == Status::ok);
  CHECK(pushed == 3);  // room for 3 of 5
  CHECK(r.ring.header().producer.head == 8);
  CHECK(producer.try_push_burst(std::span(batch).subspan(8), pushed) == Status::again);
  CHECK(pushed == 0);
  CHECK(r.ring.header().producer.head == 8);  // again reserved nothing
  std::array<WireDescriptor, 16> out{};
  ArrivalChecker checker(1);
  checker.check(std::span(out).first(consumer.pop_burst(out)));
  REQUIRE(producer.try_push_burst(std::span(batch).subspan(8), pushed) == Status::ok);
  CHECK(pushed == 2);
  checker.check(std::span(out).first(consumer.pop_burst(out)));
  CHECK(checker.received() == 10);
  CHECK(checker.corrupt() + checker.wrong() == 0);
}

TEST_CASE("burst pop takes only contiguous published slots") {
  HeapRing r(16);
  RingProducer producer(r.ring);
  RingConsumer consumer(r.ring);
  std::array<WireDescriptor, 16> out{};
  CHECK(consumer.pop_burst(out) == 0);
  for (uint64_t i = 0; i < 5; ++i)
    REQUIRE(producer.try_push(make_descriptor(0, i)) == Status::ok);
  // Position 5 reserved by hand but not published: a producer still writing it.
  const uint64_t hole = atomic(r.ring.header().producer.head).fetch_add(1);
  RingProducer later(r.ring);
  REQUIRE(later.try_push(make_descriptor(0, 6)) == Status::ok);  // published after the hole
  CHECK(consumer.pop_burst(std::span(out).first(2)) == 2);
  CHECK(consumer.pop_burst(out) == 3);  // stops at the hole
  CHECK(consumer.pop_burst(out) == 0);
  CHECK_FALSE(consumer.ready());
  // Publish the hole: both come out, in position order.
  WireDescriptor& slot = r.ring.slot(hole);
  const WireDescriptor image = encode(make_descriptor(0, 5), hole + 1);
  std::memcpy(reinterpret_cast<char*>(&slot) + 8, reinterpret_cast<const char*>(&image) + 8, 56);
  atomic(slot.seq).store(hole + 1, std::memory_order_release);
  REQUIRE(consumer.pop_burst(out) == 2);
  Descriptor d;
  REQUIRE(decode(out[0], d) == DecodeResult::ok);
  CHECK(same(d, make_descriptor(0, 5)));
  REQUIRE(decode(out[1], d) == DecodeResult::ok);
  CHECK(same(d, make_descriptor(0, 6)));
}

TEST_CASE("push waits for room until its deadline; a timed-out position is filled by a nop") {
  HeapRing r(4);
  RingProducer producer(r.ring, {.stall_timeout = 20ms});
  RingConsumer consumer(r.ring);
  for (uint64_t i = 0; i < 4; ++i)
    REQUIRE(producer.push(make_descriptor(0, i), Deadline(1s)) == Status::ok);
  // Full and nobody consumes: push reserves position 4 (ticket order) and times out.
  CHECK(producer.push(make_descriptor(0, 4), Deadline(10ms)) == Status::timeout);
  CHECK(producer.owes_nop());
  CHECK(producer.try_push(make_descriptor(0, 4)) == Status::again);  // nop's slot still taken
  std::array<WireDescriptor, 8> out{};
  REQUIRE(consumer.pop_burst(out) == 4);
  // The next call settles the nop at position 4 first, then pushes at position 5.
  CHECK(producer.try_push(make_descriptor(0, 4)) == Status::ok);
  CHECK_FALSE(producer.owes_nop());
  REQUIRE(consumer.pop_burst(out) == 2);
  Descriptor d;
  REQUIRE(decode(out[0], d) == DecodeResult::ok);
  CHECK(d.op == Op::nop);
  REQUIRE(decode(out[1], d) == DecodeResult::ok);
  CHECK(same(d, make_descriptor(0, 4)));
  CHECK(consumer.health() == Status::ok);
}

TEST_CASE("flush settles an owed nop; a producer that dies owing one marks the ring") {
  HeapRing r(2);
  RingConsumer consumer(r.ring);
  std::array<WireDescriptor, 4> out{};
  {
    RingProducer producer(r.ring, {.stall_timeout = 10ms});
    REQUIRE(producer.try_push(make_descriptor(0, 0)) == Status::ok);
    REQUIRE(producer.try_push(make_descriptor(0, 1)) == Status::ok);
    CHECK(producer.push(make_descriptor(0, 2), Deadline(5ms)) == Status::timeout);
    CHECK(producer.flush(Deadline(5ms)) == Status::timeout);
    REQUIRE(consumer.pop_burst(out) == 2);
    CHECK(producer.flush(Deadline(1s)) == Status::ok);
    CHECK_FALSE(producer.owes_nop());
    REQUIRE(consumer.pop_burst(out) == 1);
    CHECK(out[0].op == static_cast<uint8_t>(Op::nop));
    REQUIRE(producer.try_push(make_descriptor(0, 3)) == Status::ok);
    REQUIRE(producer.try_push(make_descriptor(0, 4)) == Status::ok);
    CHECK(producer.push(make_descriptor(0, 5), Deadline(5ms)) == Status::timeout);
    CHECK(consumer.health() == Status::ok);
  }  // destroyed owing position 5 with the ring still full: it cannot publish the nop
  CHECK(consumer.health() == Status::peer_failed);
  CHECK(r.ring.header().signal.abandoned == 5 + 1);
}

TEST_CASE("a ring has one consumer at a time; a new one resumes where the last stopped") {
  HeapRing r(8);
  RingProducer producer(r.ring);
  for (uint64_t i = 0; i < 6; ++i)
    REQUIRE(producer.try_push(make_descriptor(0, i)) == Status::ok);
  std::array<WireDescriptor, 4> out{};
  {
    RingConsumer first(r.ring);
    CHECK_THROWS_WITH_AS(RingConsumer(r.ring), doctest::Contains("already has a consumer"), Error);
    REQUIRE(first.pop_burst(out) == 4);
  }
  RingConsumer second(r.ring);
  CHECK(second.position() == 4);
  REQUIRE(second.pop_burst(out) == 2);
  Descriptor d;
  REQUIRE(decode(out[0], d) == DecodeResult::ok);
  CHECK(same(d, make_descriptor(0, 4)));
}
