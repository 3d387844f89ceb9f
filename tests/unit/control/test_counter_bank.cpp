#include "common/deadline.hpp"
#include "common/error.hpp"
#include "control/counter_bank.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using proxyep::Deadline;
using proxyep::Error;
using proxyep::Status;
using proxyep::control::CounterBank;
namespace imm = proxyep::control::imm;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

uint32_t tag(uint64_t epoch) {
  return imm::epoch_tag(epoch);
}

void join_all(std::vector<std::thread>& threads) {
  for (auto& th : threads)
    th.join();
}

// Spins until `done()`, failing the test (not hanging it) after 30 s.
template <typename Done>
void spin_until(Done&& done, const char* what) {
  auto deadline = Deadline::after_ms(30000);
  while (!done()) {
    REQUIRE_MESSAGE(!deadline.expired(), what);
    std::this_thread::yield();
  }
}

// Advances the bank's current epoch to `epoch`, requiring no leaks on the way.
void advance_to(CounterBank& bank, uint64_t epoch) {
  while (bank.epoch() < epoch)
    REQUIRE(bank.begin_epoch(bank.epoch() + 1) == Status::ok);
}

}  // namespace

TEST_CASE("counter bank: arrivals before the expectation are not lost") {
  std::vector<std::pair<uint64_t, uint32_t>> raised;
  CounterBank bank(16, [&](uint64_t e, uint32_t k) { raised.emplace_back(e, k); });
  for (int i = 0; i < 5; ++i)
    REQUIRE(bank.arrive(tag(0), 3) == Status::ok);
  CHECK_FALSE(bank.ready(0, 3));
  CHECK(raised.empty());
  REQUIRE(bank.set_expected(0, 3, 5) == Status::ok);  // the expectation completes the key
  CHECK(bank.ready(0, 3));
  REQUIRE(raised.size() == 1);
  CHECK(raised[0] == std::make_pair(uint64_t{0}, uint32_t{3}));
  CHECK(bank.flag(0, 3).load() == CounterBank::flag_value(0));
  CHECK_FALSE(bank.ready(0, 2));
}

TEST_CASE("counter bank: the last arrival raises when the expectation came first") {
  int raises = 0;
  CounterBank bank(4, [&](uint64_t, uint32_t) { ++raises; });
  REQUIRE(bank.set_expected(0, 1, 3) == Status::ok);
  REQUIRE(bank.arrive(tag(0), 1) == Status::ok);
  REQUIRE(bank.arrive(tag(0), 1) == Status::ok);
  CHECK_FALSE(bank.ready(0, 1));
  CHECK(raises == 0);
  REQUIRE(bank.arrive(tag(0), 1) == Status::ok);
  CHECK(bank.ready(0, 1));
  CHECK(raises == 1);
}

TEST_CASE("counter bank: a key expecting zero raises at once") {
  CounterBank bank(4);
  REQUIRE(bank.set_expected(0, 2, 0) == Status::ok);
  CHECK(bank.ready(0, 2));
  CHECK(bank.arrive(tag(0), 2) == Status::error);  // any arrival is one too many
  CHECK(contains(bank.last_error(), "key 2 in epoch 0: 1 arrivals, expected 0 (too many"));
}

TEST_CASE("counter bank: too many arrivals, after and before the expectation") {
  CounterBank bank(8);
  REQUIRE(bank.set_expected(0, 5, 2) == Status::ok);
  REQUIRE(bank.arrive(tag(0), 5) == Status::ok);
  REQUIRE(bank.arrive(tag(0), 5) == Status::ok);
  CHECK(bank.arrive(tag(0), 5) == Status::error);
  CHECK(contains(bank.last_error(), "key 5 in epoch 0: 3 arrivals, expected 2"));
  CHECK(contains(bank.last_error(), "detected by an arrival"));

  for (int i = 0; i < 4; ++i)
    REQUIRE(bank.arrive(tag(0), 6) == Status::ok);
  CHECK(bank.set_expected(0, 6, 2) == Status::error);
  CHECK(contains(bank.last_error(), "key 6 in epoch 0: 4 arrivals, expected 2"));
  CHECK(contains(bank.last_error(), "detected by set_expected"));
  CHECK_FALSE(bank.ready(0, 6));
  CHECK(bank.errors() == 2);
}

TEST_CASE("counter bank: misuse of expectations and keys") {
  CounterBank bank(8);
  REQUIRE(bank.set_expected(0, 1, 4) == Status::ok);
  CHECK(bank.set_expected(0, 1, 4) == Status::error);
  CHECK(contains(bank.last_error(), "twice"));
  CHECK(bank.set_expected(0, 2, CounterBank::kMaxExpected + 1) == Status::error);
  CHECK(bank.arrive(tag(0), 8) == Status::error);
  CHECK(contains(bank.last_error(), "key 8"));
  CHECK(bank.set_expected(5, 1, 1) == Status::error);  // far outside the window
  CHECK(contains(bank.last_error(), "epoch 5"));
  CHECK_THROWS_AS(CounterBank(0), Error);
  CHECK_THROWS_AS((void)bank.begin_epoch(2), Error);  // epochs advance by one
  CHECK_THROWS_AS((void)bank.flag(0, 8), Error);
}

TEST_CASE("counter bank: only epochs e-1, e and e+1 are accepted") {
  CounterBank bank(4);
  // Epoch 0: {0, 1}; tag 3 would be epoch -1, tag 2 epoch 2.
  CHECK(bank.arrive(tag(1), 0) == Status::ok);
  CHECK(bank.arrive(3, 0) == Status::error);
  CHECK(bank.arrive(2, 0) == Status::error);
  CHECK(contains(bank.last_error(), "epoch tag 2 while the current epoch is 0"));
  REQUIRE(bank.set_expected(1, 0, 1) == Status::ok);  // expectation for the next epoch
  CHECK(bank.ready(1, 0));
  advance_to(bank, 3);                             // window {2, 3, 4}
  CHECK(bank.arrive(tag(1), 0) == Status::error);  // epoch 1 retired: stale (or epoch 5: early)
  CHECK(contains(bank.last_error(), "stale (epoch 1) or early (epoch 5)"));
  CHECK(bank.arrive(tag(2), 0) == Status::ok);
  CHECK(bank.arrive(tag(3), 0) == Status::ok);
  CHECK(bank.arrive(tag(4), 0) == Status::ok);
  REQUIRE(bank.set_expected(2, 0, 1) == Status::ok);
  REQUIRE(bank.set_expected(3, 0, 1) == Status::ok);
  REQUIRE(bank.set_expected(4, 0, 1) == Status::ok);
  CHECK(bank.ready(2, 0));
  CHECK(bank.ready(3, 0));
  CHECK(bank.ready(4, 0));
  CHECK(bank.set_expected(1, 1, 0) == Status::error);
  advance_to(bank, 6);
}

TEST_CASE("counter bank: early and late writes count toward their own epoch") {
  CounterBank bank(4);
  advance_to(bank, 5);
  REQUIRE(bank.set_expected(5, 1, 2) == Status::ok);
  REQUIRE(bank.arrive(tag(5), 1) == Status::ok);
  // A sender already in epoch 6 writes the same key: it must not complete epoch 5's count.
  REQUIRE(bank.arrive(tag(6), 1) == Status::ok);
  CHECK_FALSE(bank.ready(5, 1));
  REQUIRE(bank.begin_epoch(6) == Status::ok);
  REQUIRE(bank.arrive(tag(5), 1) == Status::ok);  // epoch 5's late write
  CHECK(bank.ready(5, 1));
  CHECK_FALSE(bank.ready(6, 1));
  REQUIRE(bank.set_expected(6, 1, 1) == Status::ok);
  CHECK(bank.ready(6, 1));
  REQUIRE(bank.begin_epoch(7) == Status::ok);  // retires 5: drained
  REQUIRE(bank.begin_epoch(8) == Status::ok);  // retires 6: drained
}

TEST_CASE("counter bank: begin_epoch reports leaks naming the keys, then resets the bank") {
  CounterBank bank(32);
  REQUIRE(bank.arrive(tag(0), 7) == Status::ok);  // arrivals, no expectation
  REQUIRE(bank.arrive(tag(0), 7) == Status::ok);
  REQUIRE(bank.set_expected(0, 3, 2) == Status::ok);  // expectation not met
  REQUIRE(bank.arrive(tag(0), 3) == Status::ok);
  REQUIRE(bank.set_expected(0, 4, 1) == Status::ok);  // met: not a leak
  REQUIRE(bank.arrive(tag(0), 4) == Status::ok);
  REQUIRE(bank.set_expected(0, 9, 1) == Status::ok);  // exceeded: a leak
  REQUIRE(bank.arrive(tag(0), 9) == Status::ok);
  CHECK(bank.arrive(tag(0), 9) == Status::error);
  REQUIRE(bank.begin_epoch(1) == Status::ok);  // epoch 0 is still e-1: not retired yet
  CHECK(bank.begin_epoch(2) == Status::error);
  std::string error = bank.last_error();
  CHECK(contains(error, "LEAK in epoch 0"));
  CHECK(contains(error, "3 keys not drained"));
  CHECK(contains(error, "key 3: 1 arrivals of 2 expected"));
  CHECK(contains(error, "key 7: 2 arrivals, no expectation"));
  CHECK(contains(error, "key 9: 2 arrivals of 1 expected"));
  CHECK_FALSE(contains(error, "key 4"));
  CHECK_FALSE(bank.ready(0, 4));  // flags of a retired epoch are cleared
  // The bank is clean for epoch 4, which reuses it.
  advance_to(bank, 4);
  REQUIRE(bank.set_expected(4, 7, 1) == Status::ok);
  CHECK_FALSE(bank.ready(4, 7));
  REQUIRE(bank.arrive(tag(4), 7) == Status::ok);
  CHECK(bank.ready(4, 7));
  CHECK_FALSE(bank.ready(0, 7));  // the flag word names its epoch
  advance_to(bank, 6);
}

TEST_CASE("counter bank: a leak report names a bounded number of keys") {
  CounterBank bank(100);
  for (uint32_t k = 0; k < 100; ++k)
    REQUIRE(bank.arrive(tag(0), k) == Status::ok);
  REQUIRE(bank.begin_epoch(1) == Status::ok);
  CHECK(bank.begin_epoch(2) == Status::error);
  CHECK(contains(bank.last_error(), "100 keys not drained"));
  CHECK(contains(bank.last_error(), "key 7:"));
  CHECK_FALSE(contains(bank.last_error(), "key 8:"));
  CHECK(contains(bank.last_error(), "..."));
}

// Several proxy threads arrive on the same keys while the consumer sets expectations at random
// moments. Each arrival first writes its own payload word (plain memory, like the landed bytes
// of a write); when the consumer sees a key's flag it reads every payload word of that key: the
// flag's acquire must make them visible (TSan checks the ordering, the values check the count).
TEST_CASE("counter bank: concurrent arrivals on shared keys raise exactly once, never early") {
  constexpr uint32_t kKeys = 24;
  constexpr int kThreads = 4;
  constexpr int kEpochs = 6;
  constexpr int kPerThread = 3000;
  std::vector<std::atomic<int>> raises(kKeys);
  CounterBank bank(kKeys, [&](uint64_t, uint32_t key) { raises[key].fetch_add(1); });
  std::mt19937_64 rng(7);
  for (uint64_t epoch = 0; epoch < kEpochs; ++epoch) {
    // Plan: each thread's keys; per key, the payload words its arrivals write.
    std::vector<std::vector<uint32_t>> keys(kThreads);
    std::vector<uint64_t> expected(kKeys, 0);
    std::vector<std::vector<size_t>> word_of(kThreads);
    for (int t = 0; t < kThreads; ++t)
      for (int i = 0; i < kPerThread; ++i) {
        uint32_t key = static_cast<uint32_t>(rng() % (kKeys - 2));  // the last 2 keys expect 0
        keys[t].push_back(key);
        word_of[t].push_back(expected[key]++);
      }
    std::vector<std::vector<uint64_t>> payload(kKeys);
    for (uint32_t k = 0; k < kKeys; ++k)
      payload[k].assign(expected[k], 0);
    for (auto& r : raises)
      r.store(0);
    std::atomic<bool> go{false};
    std::atomic<int> failures{0};
    uint64_t unlanded = 0;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        while (!go.load(std::memory_order_acquire))
          std::this_thread::yield();
        for (int i = 0; i < kPerThread; ++i) {
          uint32_t key = keys[t][i];
          payload[key][word_of[t][i]] = epoch * 1000003 + key + 1;
          if (bank.arrive(tag(epoch), key) != Status::ok) failures.fetch_add(1);
        }
      });
    go.store(true, std::memory_order_release);
    // Expectations in random order while the arrivals run.
    std::vector<uint32_t> order(kKeys);
    for (uint32_t k = 0; k < kKeys; ++k)
      order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t k : order) {
      for (int spin = static_cast<int>(rng() % 2000); spin > 0; --spin)
        std::this_thread::yield();
      REQUIRE(bank.set_expected(epoch, k, expected[k]) == Status::ok);
    }
    std::vector<bool> checked(kKeys, false);
    auto deadline = Deadline::after_ms(30000);
    for (uint32_t left = kKeys; left > 0;) {
      if (deadline.expired()) {
        join_all(threads);
        FAIL("epoch ", epoch, ": ", left, " flags never rose");
      }
      for (uint32_t k = 0; k < kKeys; ++k) {
        if (checked[k] || !bank.ready(epoch, k)) continue;
        for (uint64_t word : payload[k])
          if (word != epoch * 1000003 + k + 1) ++unlanded;
        checked[k] = true;
        --left;
      }
    }
    for (auto& th : threads)
      th.join();
    CHECK(unlanded == 0);  // a flag rose before its key's payload words were all written
    CHECK(failures.load() == 0);
    for (uint32_t k = 0; k < kKeys; ++k)
      CHECK(raises[k].load() == 1);
    REQUIRE(bank.begin_epoch(epoch + 1) == Status::ok);
  }
  advance_to(bank, kEpochs + 1);
  CHECK(bank.errors() == 0);
}

// Late arrivals race with begin_epoch retiring their epoch: each one is either counted before
// the bank is checked (and then reported in the LEAK, since nothing expected it) or rejected as
// stale. None may slip into the reset bank, so the LEAK's count equals the accepted arrivals,
// and the bank is clean when epoch 7 reuses it.
TEST_CASE("counter bank: arrivals racing with begin_epoch are either leaked or rejected") {
  const std::regex leak("key 1: ([0-9]+) arrivals, no expectation");
  for (int round = 0; round < 20; ++round) {
    CounterBank bank(2);
    advance_to(bank, 4);  // window {3, 4, 5}
    std::atomic<bool> stop{false};
    std::atomic<int64_t> accepted{0}, rejected{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)
      threads.emplace_back([&] {
        while (!stop.load(std::memory_order_relaxed)) {
          if (bank.arrive(tag(3), 1) == Status::ok)
            accepted.fetch_add(1);
          else
            rejected.fetch_add(1);
        }
      });
    spin_until([&] { return accepted.load() >= 50 + round * 10; }, "arrivals accepted");
    REQUIRE(bank.begin_epoch(5) == Status::error);  // retires epoch 3 mid-stream
    std::string error = bank.last_leak();           // last_error() may be a stale arrival's by now
    spin_until([&] { return rejected.load() >= 50; }, "stale arrivals rejected");
    stop.store(true);
    for (auto& th : threads)
      th.join();
    std::smatch match;
    REQUIRE_MESSAGE(std::regex_search(error, match, leak), error);
    CHECK(std::stoll(match[1].str()) == accepted.load());
    CHECK(contains(error, "LEAK in epoch 3"));
    advance_to(bank, 7);  // epoch 7 reuses epoch 3's bank
    REQUIRE(bank.set_expected(7, 1, 0) == Status::ok);
    CHECK(bank.ready(7, 1));
  }
}

TEST_CASE("counter bank: an ignored key drops arrivals of any epoch and never leaks") {
  CounterBank bank(4);
  REQUIRE(bank.set_expected(0, 2, 1) == Status::ok);  // set before the peer was given up
  bank.ignore_key(2, true);
  bank.cancel_expected(0, 2);
  // Arrivals of the ignored key are dropped whatever their tag (even one no window accepts).
  for (uint32_t tag = 0; tag < imm::kEpochTags; ++tag)
    CHECK(bank.arrive(tag, 2) == Status::ok);
  CHECK(bank.ignored_arrivals() == imm::kEpochTags);
  CHECK_FALSE(bank.ready(0, 2));
  // Other keys count as before.
  REQUIRE(bank.set_expected(0, 1, 1) == Status::ok);
  CHECK(bank.arrive(imm::epoch_tag(0), 1) == Status::ok);
  CHECK(bank.ready(0, 1));
  for (uint64_t epoch = 1; epoch <= 3; ++epoch)
    CHECK(bank.begin_epoch(epoch) == Status::ok);  // retiring epochs 0 and 1: no leak
  CHECK(bank.last_leak().empty());
}

TEST_CASE("counter bank: a cancelled expectation leaves nothing to leak; a met one stays") {
  CounterBank bank(2);
  REQUIRE(bank.set_expected(0, 0, 3) == Status::ok);
  CHECK(bank.arrive(imm::epoch_tag(0), 0) == Status::ok);
  bank.cancel_expected(0, 0);  // the rest will never come: its sender was given up
  REQUIRE(bank.set_expected(0, 1, 1) == Status::ok);
  CHECK(bank.arrive(imm::epoch_tag(0), 1) == Status::ok);
  bank.cancel_expected(0, 1);  // met: stays met
  CHECK(bank.ready(0, 1));
  bank.ignore_key(0, true);  // the one arrival of key 0 is the given-up sender's
  CHECK(bank.begin_epoch(1) == Status::ok);
  CHECK(bank.begin_epoch(2) == Status::ok);
  CHECK(bank.last_leak().empty());
  // Without the ignore, the arrival that came before the cancel is a leak, reported.
  CounterBank strict(1);
  REQUIRE(strict.set_expected(0, 0, 2) == Status::ok);
  CHECK(strict.arrive(imm::epoch_tag(0), 0) == Status::ok);
  strict.cancel_expected(0, 0);
  CHECK(strict.begin_epoch(1) == Status::ok);
  CHECK(strict.begin_epoch(2) == Status::error);
  CHECK(strict.last_leak().find("1 arrivals, no expectation") != std::string::npos);
}
