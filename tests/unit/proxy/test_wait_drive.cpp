// A waiting caller drives the proxy threads itself (proxy.wait_drive_us): the passes that find
// its completion are its own while the proxy thread sleeps; a proxy thread stuck inside the
// provider never traps a driving waiter, which fails at its deadline naming the stuck thread.
#include "tests/unit/proxy/proxy_pair.hpp"
#include "tests/unit/proxy/stuck_rail.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

using namespace proxyep;
using namespace proxyep::proxy;
using namespace proxyep::proxy::testing;
using namespace std::chrono_literals;

namespace {

// Proxies that sleep after their first empty pass, and long: whatever completes a wait quickly
// was polled by someone else.
EngineOptions sleepy_options(std::chrono::microseconds drive) {
  EngineOptions options = test_options();
  options.idle = {.spin_passes = 0, .yield_passes = 0, .sleep_us = 2000000};
  options.wait_drive = drive;
  return options;
}

void wait_until_asleep(ProxyEngine& engine, uint64_t sleeps_before) {
  const auto by = Deadline::after_ms(10000);
  while (engine.stats().sleeps == sleeps_before && !by.expired())
    std::this_thread::sleep_for(1ms);
  REQUIRE_MESSAGE(!by.expired(), "an idle proxy did not sleep within 10 s");
}

// Rank 1 waits for `rounds` writes from rank 0, one at a time, each pushed while rank 1's proxy
// sleeps; returns how many of rank 1's passes its waiter ran.
uint64_t driven_passes(const std::string& provider, std::chrono::microseconds drive, int rounds) {
  ProxyPair pair(provider, true, 64 * 1024, sleepy_options(drive));
  for (int round = 0; round < rounds; ++round) {
    const auto key = static_cast<uint32_t>(round);
    REQUIRE(pair.rank(1).bank.set_expected(0, key, 1) == Status::ok);
    const uint64_t sleeps = pair.engine(1).stats().sleeps;
    pair.engine(1).kick();  // an earlier sleep may still run: wait for a fresh one
    wait_until_asleep(pair.engine(1), sleeps);
    pair.push(0, write_descriptor(0, 0, 64, key));
    pair.engine(1).wait_flag(pair.rank(1).bank, 0, key, Deadline::after_ms(10000), "drive");
  }
  return pair.engine(1).stats().driven;
}

}  // namespace

TEST_CASE("a waiting caller runs the passes of its sleeping proxy when driving is on") {
  CHECK(driven_passes("tcp", 10s, 5) > 0);
  CHECK(driven_passes("tcp", 0us, 5) == 0);
  // auto: tcp's waiters drive; shm shares memory with its peers and a
  // dead one could trap a driver inside the provider, so its waiters never do.
  CHECK(driven_passes("tcp", -1us, 5) > 0);
  CHECK(driven_passes("shm", -1us, 5) == 0);
}

namespace {

// Outlives the pair: the stuck thread reads it.
proxy::testing::StuckGate gate;

}  // namespace

TEST_CASE("a proxy thread stuck inside the provider never traps a driving waiter") {
  EngineOptions options = test_options();
  options.wait_drive = 10s;  // the whole wait drives
  ProxyPair pair(
      [](int r) {
        auto o = fabric::testing::options_for("tcp", r, 1, false);
        if (r == 1)
          o.wrap_rail = [](std::unique_ptr<fabric::Transport> rail) {
            return std::make_unique<StuckRail>(std::move(rail), gate);
          };
        return o;
      },
      64 * 1024, options);
  REQUIRE(pair.rank(1).bank.set_expected(0, 0, 1) == Status::ok);
  gate.armed = true;
  const auto by = Deadline::after_ms(10000);
  while (!gate.inside && !by.expired())
    std::this_thread::sleep_for(1ms);
  REQUIRE(gate.inside.load());
  // A driver that blocked on the stuck thread's pass lock would hang here: the watchdog then
  // frees the thread, and the wait returns late instead of failing at its deadline.
  std::atomic<bool> waited{false};
  std::thread watchdog([&] {
    const auto until = Deadline::after_ms(20000);
    while (!waited && !until.expired())
      std::this_thread::sleep_for(1ms);
    gate.armed = false;
  });
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    pair.engine(1).wait_flag(pair.rank(1).bank, 0, 0, Deadline::after_ms(300), "a stuck wait");
  } catch (const Error& e) {
    error = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  waited = true;
  watchdog.join();
  INFO(error);
  CHECK(error.find("a stuck wait") != std::string::npos);
  CHECK(error.find("stuck inside the provider") != std::string::npos);
  CHECK(took < 10s);
  CHECK(pair.engine(1).stats().driven == 0);  // the lock was never free
}
