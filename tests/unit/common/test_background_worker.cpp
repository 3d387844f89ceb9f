// StealableTask and BackgroundWorker: a body runs exactly once, in submission order, never two at
// once; a waiter steals a body the worker has not started; errors reach the waiter.
#include "common/background_worker.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace proxyep;
using namespace std::chrono_literals;

TEST_CASE("a stolen task runs once, on the thread that stole it") {
  std::atomic<int> runs{0};
  std::thread::id ran_on;
  auto task = std::make_shared<StealableTask>([&] {
    ++runs;
    ran_on = std::this_thread::get_id();
  });
  task->run_or_wait();
  CHECK(runs == 1);
  CHECK(ran_on == std::this_thread::get_id());
  CHECK_FALSE(task->try_run());
  task->run_or_wait();  // done: returns at once
  CHECK(runs == 1);
}

TEST_CASE("the error of a body reaches every waiter") {
  auto task = std::make_shared<StealableTask>([] { throw std::runtime_error("boom"); });
  CHECK_THROWS_WITH(task->run_or_wait(), "boom");
  CHECK_THROWS_WITH(task->run_or_wait(), "boom");
}

TEST_CASE("the worker runs tasks in order, one at a time, stolen or not") {
  for (int round = 0; round < 50; ++round) {
    std::vector<int> order;
    std::atomic<int> inside{0};
    std::atomic<bool> overlapped{false};
    std::vector<std::shared_ptr<StealableTask>> tasks;
    {
      BackgroundWorker worker;
      for (int i = 0; i < 8; ++i) {
        tasks.push_back(std::make_shared<StealableTask>([&, i] {
          if (inside.fetch_add(1) != 0) overlapped = true;
          if (i % 3 == 0) std::this_thread::sleep_for(100us);
          order.push_back(i);
          inside.fetch_sub(1);
        }));
        worker.submit(tasks.back());
      }
      // Steal what the worker has not reached, in order (as LowLatencyMode::settle does).
      for (auto& task : tasks)
        task->run_or_wait();
    }
    CHECK_FALSE(overlapped);
    REQUIRE(order.size() == 8);
    for (int i = 0; i < 8; ++i)
      CHECK(order[i] == i);
  }
}

TEST_CASE("the worker's destructor finishes what was submitted") {
  std::atomic<int> runs{0};
  {
    BackgroundWorker worker;
    for (int i = 0; i < 5; ++i)
      worker.submit(std::make_shared<StealableTask>([&] { ++runs; }));
  }
  CHECK(runs == 5);
}
