// The control plane at scale. A 1024-rank job, every rank a thread of this process on loopback: the
// rendezvous (with a job id and secret, as `proxyep launch` gives its ranks), a barrier, an
// allgather of fabric-address-sized contributions checked on every rank, and the loss of one
// rank in the middle of a collective, which every other rank must name. Deadlines (this 2-core
// box; sanitizer builds scale them): the whole rendezvous 20 s (~2 s measured by `proxyep bench
// rendezvous`), the news of the loss 10 s after it. And the ordering layer's state of a 4096-rank
// job, the most an immediate names.
#include "common/crypto.hpp"
#include "common/descriptor_limit.hpp"
#include "control/bootstrap.hpp"
#include "control/signal_router.hpp"
#include "tests/unit/control/rank_threads.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace proxyep;
using namespace proxyep::control;
using namespace proxyep::control::testing;

namespace {

constexpr int kWorld = 1024;
constexpr int kLost = 517;  // neither rank 0 nor at an end of any range
#ifndef PROXYEP_TEST_TIMEOUT_SCALE
#define PROXYEP_TEST_TIMEOUT_SCALE 1
#endif
constexpr auto kScale = PROXYEP_TEST_TIMEOUT_SCALE;
constexpr auto kRendezvousBound = std::chrono::milliseconds(20'000 * kScale);
constexpr auto kLossBound = std::chrono::milliseconds(10'000 * kScale);

Bytes address_of(int rank) {
  return bytes_of(
      fmt::format("fi_addr of rank {:04}, 64 bytes as an EFA address is .........", rank));
}

}  // namespace

TEST_CASE("control plane at 1024 ranks: rendezvous, barrier, allgather, and one rank lost") {
  // Every rank's socket, rank 0's end of it and both ends of the liveness star, in one process.
  reserve_descriptors(6 * kWorld + 256, "test");
  const auto secret = std::make_shared<const SecretBytes>(SecretBytes::random_hex(32));
  std::atomic<int> gathered{0};
  std::atomic<int> verified{0};
  std::atomic<int64_t> slowest_join_ms{0};
  std::atomic<int64_t> lost_at_ms{-1};
  const auto start = std::chrono::steady_clock::now();
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 t)
        .count();
  };
  RankBody body = [&](Bootstrap::Options options) {
    options.job_id = "scale-1024";
    options.secret = secret;
    auto boot = Bootstrap::connect(std::move(options));
    const int64_t joined = ms_since(start);
    int64_t seen = slowest_join_ms.load();
    while (joined > seen && !slowest_join_ms.compare_exchange_weak(seen, joined)) {
    }
    boot->barrier("joined");
    const int me = boot->rank();
    const auto all = boot->allgather(address_of(me), "fabric addresses");
    bool ok = all.size() == static_cast<size_t>(kWorld);
    for (int r = 0; ok && r < kWorld; ++r)
      ok = all[static_cast<size_t>(r)] == address_of(r);
    verified += ok ? 1 : 0;
    ++gathered;
    if (me == kLost) {
      // Dies once every rank has its addresses and is on its way into the next barrier.
      while (gathered.load() < kWorld)
        std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(200ms);
      lost_at_ms = ms_since(start);
      boot.reset();  // its sockets close, as a process's do when it dies
      throw std::runtime_error("lost on purpose");
    }
    boot->barrier("after the loss");
  };
  std::vector<RankBody> bodies(kWorld, body);
  const auto outcomes = run_bodies(bodies, kWorld, std::chrono::milliseconds(60'000 * kScale));

  CHECK(verified.load() == kWorld);
  CHECK_MESSAGE(std::chrono::milliseconds(slowest_join_ms.load()) < kRendezvousBound,
                "the last rank joined after " << slowest_join_ms.load() << " ms");
  REQUIRE(lost_at_ms.load() >= 0);
  int named = 0;
  std::string unnamed;
  int64_t latest_ms = 0;
  for (int r = 0; r < kWorld; ++r) {
    if (r == kLost) continue;
    const auto& outcome = outcomes[static_cast<size_t>(r)];
    const bool names = !outcome.ok && contains(outcome.error, fmt::format("rank {}", kLost));
    named += names ? 1 : 0;
    if (!names && unnamed.empty())
      unnamed = fmt::format("rank {}: {}", r, outcome.ok ? "no error" : outcome.error);
    latest_ms = std::max<int64_t>(latest_ms, outcome.elapsed.count());
  }
  CHECK_MESSAGE(named == kWorld - 1,
                named << " ranks named the lost rank; the first that did not, " << unnamed);
  // Every rank's thread started at `start` (give or take the thread's creation): its elapsed
  // time bounds when it learnt of the loss.
  CHECK_MESSAGE(
      std::chrono::milliseconds(latest_ms - lost_at_ms.load()) < kLossBound,
      "the last rank learnt of the loss " << latest_ms - lost_at_ms.load() << " ms after it");
}

// The ordering layer's per-rank state at the largest group an immediate can name (4096 ranks:
// 12 bits of stream id): a counter bank with the session's 4R keys (records, eager bytes,
// releases, landing writes), a sequence window and sender credits per source stream, all routed
// by one SignalRouter from encoded immediates, each arrival landing exactly where it should,
// and the bank's epoch turnover (O(keys)) over all of them.
TEST_CASE("ordering state of a 4096-rank job: every key, window and credit reached") {
  constexpr uint32_t kRanks = imm::kMaxStreams;
  static_assert(kRanks == 4096, "the stream field names 4096 ranks");
  constexpr uint32_t kKeys = 4 * kRanks;
  static_assert(kKeys <= imm::kMaxKeys);
  CounterBank bank(kKeys);
  SignalRouter router;
  router.attach_counters(bank);
  std::vector<std::unique_ptr<SequenceWindow>> windows;
  std::vector<std::unique_ptr<SenderCredits>> credits;
  for (uint32_t s = 0; s < kRanks; ++s) {
    windows.push_back(std::make_unique<SequenceWindow>(8));
    credits.push_back(std::make_unique<SenderCredits>(8));
    router.attach_stream(s, *windows.back());
    router.attach_credits(s, *credits.back());
  }
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    if (epoch > 0) bank.begin_epoch(epoch);
    for (uint32_t key = 0; key < kKeys; ++key)
      REQUIRE(bank.set_expected(epoch, key, 1) == Status::ok);
    for (uint32_t key = kKeys; key-- > 0;)  // arrivals in another order than the expectations
      REQUIRE(router.route(imm::encode_counter(epoch, key)) == Status::ok);
    uint32_t raised = 0;
    for (uint32_t key = 0; key < kKeys; ++key)
      raised += bank.ready(epoch, key) ? 1 : 0;
    CHECK(raised == kKeys);
  }
  for (uint32_t s = 0; s < kRanks; ++s) {
    uint16_t seq = 0;
    REQUIRE(credits[s]->acquire(seq) == Status::ok);
    REQUIRE(router.route(imm::encode_stream(0, s, seq)) == Status::ok);
    REQUIRE(router.route(imm::encode_credit(0, s, static_cast<uint16_t>(seq + 1))) == Status::ok);
  }
  for (uint32_t s = 0; s < kRanks; ++s) {
    CHECK(windows[s]->tail() == 1);
    CHECK(credits[s]->available() == 8);
  }
  // One past the last stream is not representable: a session of more ranks is refused before
  // any immediate is sent (proxy/session/session.cpp).
  CHECK_FALSE(imm::StreamField::fits(kRanks));
}
