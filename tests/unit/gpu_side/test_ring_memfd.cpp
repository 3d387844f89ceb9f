// A ring in a memfd (common/host_memory.hpp) mapped twice: two mappings in one process, and a
// forked child producer that maps the fd anew and kicks the parent through a shared eventfd.
#include "common/host_memory.hpp"
#include "gpu_side/doorbell.hpp"
#include "tests/unit/gpu_side/ring_fixture.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

using namespace proxyep;
using namespace proxyep::gpu_side;
using namespace proxyep::gpu_side::testing;
using namespace std::chrono_literals;

TEST_CASE("a memfd ring mapped twice in one process: produce on one mapping, consume on other") {
  constexpr uint64_t kCount = 200'000;
  auto owner = HostMemory::memfd(Ring::bytes_for(128), "proxyep-test-ring");
  REQUIRE(owner.fd() >= 0);
  Ring ring = Ring::create(owner.bytes(), 128);
  auto second = HostMemory::map_fd(owner.fd());
  CHECK(second.host() != owner.host());
  CHECK(second.fd() != owner.fd());
  Ring other = Ring::attach(second.bytes());
  REQUIRE(other.capacity() == 128);
  Doorbell bell;
  std::atomic<bool> producer_ok{true};
  std::thread producer_thread([&] {
    RingProducer producer(other, {.doorbell = &bell});
    for (uint64_t i = 0; i < kCount; ++i)
      if (producer.push(make_descriptor(0, i), Deadline(20s)) != Status::ok) {
        producer_ok = false;
        return;
      }
  });
  RingConsumer consumer(ring);
  RingWaiter waiter(consumer, &bell);
  ArrivalChecker checker(1);
  std::vector<WireDescriptor> out(32);
  const Deadline deadline(15s);
  while (checker.popped() < kCount && producer_ok) {
    if (waiter.wait(deadline) != Status::ok) break;
    checker.check(std::span(out).first(consumer.pop_burst(out)));
  }
  producer_thread.join();
  CHECK(producer_ok);
  check_intact(checker, kCount);
}

TEST_CASE("a forked child maps the memfd and produces; the parent consumes, woken by eventfd") {
  constexpr uint64_t kCount = 50'000;
  auto memory = HostMemory::memfd(Ring::bytes_for(64), "proxyep-test-fork");
  Ring ring = Ring::create(memory.bytes(), 64);
  Doorbell bell;
  const int fd = memory.fd();
  std::fflush(nullptr);  // or the child's exit may flush our buffered output a second time
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Child: a fresh mapping of the fd (as the proxy daemon's client would make), then produce.
    int code = 0;
    try {
      auto mapping = HostMemory::map_fd(fd);
      RingProducer producer(Ring::attach(mapping.bytes()), {.doorbell = &bell});
      for (uint64_t i = 0; i < kCount && code == 0; ++i)
        if (producer.push(make_descriptor(7, i), Deadline(20s)) != Status::ok) code = 3;
    } catch (...) {
      code = 2;
    }
    ::_exit(code);
  }
  RingConsumer consumer(ring);
  RingWaiter waiter(consumer, &bell);
  ArrivalChecker checker(8);
  drain(waiter, consumer, checker, kCount);
  const int status = reap_child(child);
  check_intact(checker, kCount);
  CHECK(checker.next(7) == kCount);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
