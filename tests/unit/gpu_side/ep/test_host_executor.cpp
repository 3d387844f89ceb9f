#include "gpu_side/ep/host_executor.hpp"

#include "common/error.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side::ep;

TEST_CASE("host_executor: every block runs exactly once, on several threads") {
  HostExecutor executor(4);
  CHECK(executor.threads() == 4);
  constexpr int64_t kBlocks = 200;
  std::vector<std::atomic<int>> hits(kBlocks);
  std::mutex ids_mutex;
  std::set<std::thread::id> ids;
  executor.run(kBlocks, [&](int64_t b) {
    hits[b].fetch_add(1);
    {
      std::lock_guard lock(ids_mutex);
      ids.insert(std::this_thread::get_id());
    }
    // Long enough that the workers wake up before the caller drains everything.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  for (int64_t b = 0; b < kBlocks; ++b)
    REQUIRE(hits[b].load() == 1);
  CHECK(ids.size() > 1);
  CHECK(ids.size() <= 4);
}

TEST_CASE("host_executor: zero blocks and a single thread") {
  HostExecutor solo(1);
  CHECK(solo.threads() == 1);
  int calls = 0;
  solo.run(0, [&](int64_t) { ++calls; });
  CHECK(calls == 0);
  std::vector<int64_t> order;
  solo.run(5, [&](int64_t b) { order.push_back(b); });
  // The caller alone claims blocks in increasing order.
  CHECK(order == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK_THROWS_AS(HostExecutor(0), Error);
}

TEST_CASE("host_executor: the first exception is rethrown and the pool stays usable") {
  HostExecutor executor(3);
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH_AS(executor.run(100,
                                    [&](int64_t b) {
                                      ran.fetch_add(1);
                                      if (b == 7) throw std::runtime_error("block 7 failed");
                                    }),
                       "block 7 failed", std::runtime_error);
  CHECK(ran.load() >= 1);
  CHECK(ran.load() <= 100);

  // Every block throws: exactly one exception comes back, the rest are swallowed.
  CHECK_THROWS_AS(executor.run(10, [](int64_t) { throw std::logic_error("all"); }),
                  std::logic_error);

  // Reuse after failures: a clean run sees every block once and no stale error.
  std::vector<std::atomic<int>> hits(64);
  executor.run(64, [&](int64_t b) { hits[b].fetch_add(1); });
  for (auto& h : hits)
    CHECK(h.load() == 1);
}

TEST_CASE("host_executor: many short runs back to back") {
  HostExecutor executor(2);
  int64_t total = 0;
  for (int run = 1; run <= 500; ++run) {
    std::atomic<int64_t> sum{0};
    executor.run(run % 7 + 1, [&](int64_t b) { sum.fetch_add(b + 1); });
    int64_t n = run % 7 + 1;
    REQUIRE(sum.load() == n * (n + 1) / 2);
    total += sum.load();
  }
  CHECK(total > 0);
}

TEST_CASE("host_executor: callers on two threads take turns, each sees its own blocks") {
  // A Buffer's calls reach one executor from the caller's thread and from its communication
  // stream's; interleaved runs would swap each other's bodies and block counts.
  HostExecutor executor(3);
  auto caller = [&](int64_t blocks, std::atomic<int64_t>& sum) {
    for (int run = 0; run < 300; ++run)
      executor.run(blocks, [&](int64_t b) { sum.fetch_add(b + 1); });
  };
  std::atomic<int64_t> first{0}, second{0};
  std::thread other([&] { caller(5, first); });
  caller(9, second);
  other.join();
  CHECK(first.load() == 300 * 15);
  CHECK(second.load() == 300 * 45);
}
