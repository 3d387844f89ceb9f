#include "common/deadline.hpp"
#include "common/error.hpp"
#include "control/quiet_tracker.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

using proxyep::Deadline;
using proxyep::Error;
using proxyep::Status;
using proxyep::control::QuietTracker;

namespace {
bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("quiet tracker: out-of-order completions retire in order") {
  QuietTracker q(8);
  QuietTracker::Ticket t = 0;
  for (uint64_t i = 0; i < 5; ++i) {
    REQUIRE(q.post(t) == Status::ok);
    CHECK(t == i);
  }
  REQUIRE(q.complete(3) == Status::ok);
  REQUIRE(q.complete(1) == Status::ok);
  CHECK(q.retired_prefix() == 0);
  CHECK(q.outstanding(5) == 3);
  REQUIRE(q.complete(0) == Status::ok);
  CHECK(q.retired_prefix() == 2);
  CHECK(q.quiet(2));
  CHECK_FALSE(q.quiet(3));
  REQUIRE(q.complete(2) == Status::ok);
  CHECK(q.retired_prefix() == 4);
  REQUIRE(q.complete(4) == Status::ok);
  CHECK(q.retired_prefix() == 5);
  CHECK(q.outstanding(5) == 0);
}

TEST_CASE("quiet tracker: bounded capacity, again when full") {
  QuietTracker q(4);
  QuietTracker::Ticket t = 0;
  for (int i = 0; i < 4; ++i)
    REQUIRE(q.post(t) == Status::ok);
  CHECK(q.post(t) == Status::again);
  REQUIRE(q.complete(1) == Status::ok);
  CHECK(q.post(t) == Status::again);  // the oldest (0) still holds the ring
  REQUIRE(q.complete(0) == Status::ok);
  REQUIRE(q.post(t) == Status::ok);
  CHECK(t == 4);
  REQUIRE(q.post(t) == Status::ok);
  CHECK(q.post(t) == Status::again);
  CHECK_THROWS_AS(QuietTracker(12), Error);
}

TEST_CASE("quiet tracker: unknown and repeated completions are errors") {
  QuietTracker q(4);
  QuietTracker::Ticket t = 0;
  REQUIRE(q.post(t) == Status::ok);
  CHECK(q.complete(1) == Status::error);
  CHECK(contains(q.last_error(), "only tickets below 1 were posted"));
  REQUIRE(q.complete(0) == Status::ok);
  CHECK(q.complete(0) == Status::error);
  CHECK(contains(q.last_error(), "ticket 0 completed twice"));
  REQUIRE(q.post(t) == Status::ok);
  REQUIRE(q.post(t) == Status::ok);
  REQUIRE(q.complete(2) == Status::ok);
  CHECK(q.complete(2) == Status::error);  // inside the window, already done
}

TEST_CASE("quiet tracker: wait returns once every write before the target completed") {
  QuietTracker q(64);
  std::mt19937_64 rng(3);
  std::vector<QuietTracker::Ticket> pending;
  QuietTracker::Ticket t = 0;
  for (int i = 0; i < 40; ++i) {
    REQUIRE(q.post(t) == Status::ok);
    pending.push_back(t);
  }
  uint64_t target = q.posted();
  for (int i = 0; i < 10; ++i) {  // posted after the quiet point: not waited for
    REQUIRE(q.post(t) == Status::ok);
    pending.push_back(t);
  }
  int calls = 0;
  q.wait(target, "test.quiet", Deadline::after_ms(5000), [&] {
    ++calls;  // completes a random pending ticket, except the last one posted
    REQUIRE(pending.size() > 1);
    size_t i = rng() % (pending.size() - 1);
    Status status = q.complete(pending[i]);
    pending.erase(pending.begin() + static_cast<long>(i));
    return status;
  });
  CHECK(q.quiet(target));
  for (uint64_t k = 0; k < target; ++k)
    CHECK(std::find(pending.begin(), pending.end(), k) == pending.end());
  CHECK(calls >= 40);  // it kept waiting until the last one below the target
  CHECK_FALSE(pending.empty());
  int void_calls = 0;
  q.wait_all("test.quiet", Deadline::after_ms(5000), [&] {  // a void progress callback
    ++void_calls;
    (void)q.complete(pending.back());
    pending.pop_back();
  });
  CHECK(pending.empty());
  CHECK(void_calls > 0);
}

TEST_CASE("quiet tracker: a timeout names the phase and what is outstanding") {
  QuietTracker q(8);
  QuietTracker::Ticket t = 0;
  for (int i = 0; i < 5; ++i)
    REQUIRE(q.post(t) == Status::ok);
  REQUIRE(q.complete(0) == Status::ok);
  REQUIRE(q.complete(3) == Status::ok);
  try {
    q.wait_all("dispatch.quiet", Deadline::after_ms(30), [] { return Status::again; });
    FAIL("wait returned");
  } catch (const Error& e) {
    CHECK(e.phase() == "dispatch.quiet");
    CHECK(contains(e.message(), "3 of the writes posted before ticket 5 still outstanding"));
    CHECK(contains(e.message(), "oldest ticket 1"));
  }
  CHECK_THROWS_AS(
      q.wait_all("dispatch.quiet", Deadline::after_ms(1000), [] { return Status::peer_failed; }),
      Error);
}

// One poster, two completer threads (like proxy threads polling two rails), a waiter: every
// ticket's "landed" word is written before its completion and read after the quiet.
TEST_CASE("quiet tracker: concurrent completers, quiet sees every write") {
  constexpr uint64_t kTickets = 50000;
  QuietTracker q(256);
  std::vector<uint64_t> landed(kTickets, 0);
  std::mutex mutex;
  std::vector<QuietTracker::Ticket> queue;
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> completers;
  for (int c = 0; c < 2; ++c)
    completers.emplace_back([&, c] {
      std::mt19937_64 rng(c);
      for (;;) {
        QuietTracker::Ticket ticket = 0;
        {
          std::lock_guard lock(mutex);
          if (queue.empty()) {
            if (done.load()) return;
            continue;
          }
          size_t i = rng() % queue.size();
          ticket = queue[i];
          queue[i] = queue.back();
          queue.pop_back();
        }
        landed[ticket] = ticket + 1;
        if (q.complete(ticket) != Status::ok) failures.fetch_add(1);
      }
    });
  for (uint64_t i = 0; i < kTickets;) {
    QuietTracker::Ticket ticket = 0;
    if (q.post(ticket) == Status::again) {
      std::this_thread::yield();
      continue;
    }
    std::lock_guard lock(mutex);
    queue.push_back(ticket);
    ++i;
  }
  q.wait_all("test.quiet", Deadline::after_ms(60000), [] { std::this_thread::yield(); });
  for (uint64_t i = 0; i < kTickets; ++i)
    REQUIRE(landed[i] == i + 1);
  done.store(true);
  for (auto& th : completers)
    th.join();
  CHECK(failures.load() == 0);
  CHECK(q.retired_prefix() == kTickets);
}
