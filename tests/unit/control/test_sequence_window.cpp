#include "common/deadline.hpp"
#include "common/error.hpp"
#include "control/sequence_window.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

using proxyep::Deadline;
using proxyep::Error;
using proxyep::Status;
using proxyep::control::PrefixWindow;
using proxyep::control::SenderCredits;
using proxyep::control::SequenceWindow;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Completes `count` chunks starting at `start` in a random order that respects the window (each
// completed seq lies in [tail, tail + W) of a model tail), checking the tail after every step
// against the model: the length of the completed prefix.
void run_random_order(uint32_t window, uint16_t start, uint64_t count, uint64_t seed) {
  SequenceWindow win(window, start);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> pending;  // offsets issued (tail <= o < tail + W) and not completed
  std::set<uint64_t> done;
  uint64_t issued = 0, model_tail = 0;
  while (model_tail < count) {
    while (issued < count && issued < model_tail + window && (pending.empty() || rng() % 3))
      pending.push_back(issued++);
    size_t pick = rng() % pending.size();
    uint64_t offset = pending[pick];
    pending[pick] = pending.back();
    pending.pop_back();
    REQUIRE(win.complete(static_cast<uint16_t>(start + offset)) == Status::ok);
    done.insert(offset);
    while (done.count(model_tail))
      done.erase(model_tail++);
    REQUIRE(win.tail() == start + model_tail);
    REQUIRE(win.tail16() == static_cast<uint16_t>(start + model_tail));
  }
}

}  // namespace

TEST_CASE("sequence window: in order, the tail follows every completion") {
  SequenceWindow win(8);
  for (uint16_t s = 0; s < 100; ++s) {
    REQUIRE(win.complete(s) == Status::ok);
    REQUIRE(win.tail() == s + 1u);
  }
}

TEST_CASE("sequence window: the tail advances over contiguous completions only") {
  SequenceWindow win(16, 10);
  REQUIRE(win.complete(12) == Status::ok);
  REQUIRE(win.complete(11) == Status::ok);
  CHECK(win.tail() == 10);  // 10 missing: nothing visible
  REQUIRE(win.complete(14) == Status::ok);
  REQUIRE(win.complete(10) == Status::ok);
  CHECK(win.tail() == 13);  // 10, 11, 12; 13 missing
  REQUIRE(win.complete(13) == Status::ok);
  CHECK(win.tail() == 15);
}

TEST_CASE("sequence window: random completion orders, windows 1 to 2^15") {
  for (uint32_t w : {1u, 2u, 4u, 64u, 1024u, 32768u})
    run_random_order(w, 0, 20000, w);
}

TEST_CASE("sequence window: wraparound across many laps of the 16-bit sequence") {
  run_random_order(64, 65500, 5 * 65536 + 123, 1);
  run_random_order(4096, 40000, 4 * 65536, 2);
}

TEST_CASE("sequence window: duplicates and seqs outside the window are errors") {
  SequenceWindow win(8, 65533);
  REQUIRE(win.complete(65534) == Status::ok);
  CHECK(win.complete(65534) == Status::error);  // in the window, already completed
  CHECK(contains(win.last_error(), "65534 completed twice"));
  REQUIRE(win.complete(65533) == Status::ok);
  CHECK(win.tail16() == 65535);
  CHECK(win.complete(65533) == Status::error);  // behind the tail: retired
  CHECK(contains(win.last_error(), "behind the tail 65535"));
  CHECK(win.complete(7) == Status::error);  // tail 65535 + 8 = 7 (wrapped) is the first outside
  CHECK(contains(win.last_error(), "beyond the window"));
  REQUIRE(win.complete(6) == Status::ok);  // the last seq inside, across the wrap
  CHECK(win.tail16() == 65535);
}

TEST_CASE("sequence window: window sizes are powers of two up to 2^15") {
  CHECK_THROWS_AS(SequenceWindow(0), Error);
  CHECK_THROWS_AS(SequenceWindow(3), Error);
  CHECK_THROWS_AS(SequenceWindow(65536), Error);
  CHECK_NOTHROW(SequenceWindow(32768));
  CHECK_THROWS_AS(SenderCredits(48), Error);
  CHECK_THROWS_AS(PrefixWindow(6, 0), Error);
}

// Several proxy threads complete chunks of one stream; each writes the chunk's bytes (plain
// memory) first. The consumer reads every chunk below the tail it observes: the tail's acquire
// must make them visible (TSan checks the ordering, the values check the tail).
TEST_CASE("sequence window: concurrent completers, one consumer") {
  constexpr uint32_t kWindow = 128;
  constexpr uint64_t kChunks = 60000;
  constexpr int kThreads = 3;
  SequenceWindow win(kWindow, 65000);
  std::vector<uint64_t> data(kChunks, 0);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      // Thread t owns chunks i with i % kThreads == t, completed in shuffled runs.
      std::vector<uint64_t> mine;
      for (uint64_t i = t; i < kChunks; i += kThreads)
        mine.push_back(i);
      for (size_t b = 0; b < mine.size(); b += 16)
        std::shuffle(mine.begin() + b, mine.begin() + std::min(mine.size(), b + 16), rng);
      for (uint64_t i : mine) {
        while (i >= win.tail() - 65000 + kWindow)
          std::this_thread::yield();  // credits
        data[i] = i * 31 + 7;
        if (win.complete(static_cast<uint16_t>(65000 + i)) != Status::ok) failures.fetch_add(1);
      }
    });
  uint64_t consumed = 0, last_tail = 65000, regressions = 0, wrong = 0;
  auto deadline = Deadline::after_ms(60000);
  while (consumed < kChunks && !deadline.expired()) {
    uint64_t tail = win.tail();
    if (tail < last_tail) ++regressions;
    last_tail = tail;
    for (; consumed < tail - 65000; ++consumed)
      if (data[consumed] != consumed * 31 + 7) ++wrong;  // visible below the tail, or a bug
  }
  REQUIRE_MESSAGE(consumed == kChunks, "the tail stopped at ", win.tail() - 65000);
  for (auto& th : threads)
    th.join();
  CHECK(regressions == 0);
  CHECK(wrong == 0);
  CHECK(failures.load() == 0);
  CHECK(win.tail() == 65000 + kChunks);
}

TEST_CASE("sender credits: at most W unacknowledged, credits free them, seqs wrap") {
  SenderCredits credits(4, 65534);
  uint16_t seq = 0;
  for (uint16_t want : {65534, 65535, 0, 1}) {
    REQUIRE(credits.acquire(seq) == Status::ok);
    CHECK(seq == want);
  }
  CHECK(credits.available() == 0);
  CHECK(credits.acquire(seq) == Status::again);
  REQUIRE(credits.credit(0) == Status::ok);  // receiver consumed 65534 and 65535
  CHECK(credits.acked() == 65536);
  CHECK(credits.available() == 2);
  REQUIRE(credits.acquire(seq) == Status::ok);
  CHECK(seq == 2);
  REQUIRE(credits.credit(65535) == Status::ok);  // reordered, older credit: ignored
  CHECK(credits.acked() == 65536);
  REQUIRE(credits.credit(0) == Status::ok);   // repeated: nothing new
  CHECK(credits.credit(4) == Status::error);  // only seqs before 3 were posted
  CHECK(contains(credits.last_error(), "credit up to seq 4"));
  REQUIRE(credits.credit(3) == Status::ok);
  CHECK(credits.available() == 4);
}

// A sender, a receiver and a network that reorders both the chunk completions and the credit
// immediates. The consumer reads chunks in order from a ring of W slots, checks each holds its
// own sequence (a sender overwriting a slot before its credit would break that), and returns
// credits now and then. Runs across several wraps of the 16-bit sequence.
TEST_CASE("sender credits + sequence window: reordered chunks and credits end to end") {
  constexpr uint32_t kWindow = 32;
  constexpr uint64_t kChunks = 3 * 65536 + 77;
  constexpr uint16_t kStart = 65000;
  SenderCredits sender(kWindow, kStart);
  SequenceWindow receiver(kWindow, kStart);
  std::vector<uint64_t> ring(kWindow, ~uint64_t{0});
  std::vector<std::pair<uint16_t, uint64_t>> chunks_in_flight;  // (seq, unwrapped position)
  std::vector<uint16_t> credits_in_flight;
  std::mt19937_64 rng(5);
  uint64_t sent = 0, consumed = 0, againsts = 0;
  auto take = [&](auto& v) {
    size_t i = rng() % v.size();
    auto item = v[i];
    v[i] = v.back();
    v.pop_back();
    return item;
  };
  while (consumed < kChunks) {
    switch (rng() % 4) {
      case 0: {  // post a chunk: its bytes land in slot seq mod W
        uint16_t seq = 0;
        if (sent == kChunks) break;
        Status status = sender.acquire(seq);
        if (status == Status::again) {
          ++againsts;
          break;
        }
        REQUIRE(status == Status::ok);
        REQUIRE(seq == static_cast<uint16_t>(kStart + sent));
        uint64_t position = kStart + sent++;
        REQUIRE(position < kStart + consumed + kWindow);  // its slot was consumed (credit)
        chunks_in_flight.emplace_back(seq, position);
        break;
      }
      case 1:  // a chunk completes at the receiver
        if (!chunks_in_flight.empty()) {
          auto [seq, position] = take(chunks_in_flight);
          ring[position % kWindow] = position;
          REQUIRE(receiver.complete(seq) == Status::ok);
        }
        break;
      case 2:  // the consumer reads the visible prefix and maybe returns a credit
        for (; kStart + consumed < receiver.tail(); ++consumed)
          REQUIRE(ring[(kStart + consumed) % kWindow] == kStart + consumed);
        if (rng() % 2) credits_in_flight.push_back(static_cast<uint16_t>(kStart + consumed));
        break;
      default:  // a credit reaches the sender
        if (!credits_in_flight.empty())
          REQUIRE(sender.credit(take(credits_in_flight)) == Status::ok);
    }
  }
  CHECK(sent == kChunks);
  CHECK(againsts > 0);  // the window was the limit at times
}
