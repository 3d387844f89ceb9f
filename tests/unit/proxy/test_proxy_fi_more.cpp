// FI_MORE hygiene. The proxy posts a burst with FI_MORE on all but the last write of each rail,
// so a doorbell provider (EFA, verbs) rings the NIC once per rail and burst. Such a provider may
// leave a write posted with FI_MORE unseen until the next write without it on the same endpoint:
// a flag left set on the last write of a burst, or computed over the whole burst instead of per
// rail, is a hang in production. tcp and shm make progress on FI_MORE writes anyway (and the
// reorder shim clears the flag on every segment it posts), so these tests run every rail through
// the doorbell double (tests/unit/fabric/doorbell_transport.hpp, installed above the shim by
// FabricOptions::wrap_rail), with three rails per proxy thread. A dangling flag leaves writes
// held; the wait fails within seconds and says how many are held on which rail.
#include "tests/unit/fabric/doorbell_transport.hpp"
#include "tests/unit/proxy/proxy_pair.hpp"

#include <doctest/doctest.h>

#include <array>

using namespace proxyep;
using namespace proxyep::proxy;
using namespace proxyep::proxy::testing;
using fabric::testing::DoorbellRails;

namespace {

constexpr int kRails = 3;
constexpr size_t kBytes = 256 * 1024;
constexpr int64_t kWaitMs = 5000;    // every write here completes within milliseconds
constexpr uint32_t kFirstBurst = 7;  // over 3 rails: rails 0, 1, 2, 0, 1, 2, 0
constexpr uint32_t kRounds = 20;
constexpr uint32_t kRoundBurst = 5;

// Credits for every write of a burst, so none waits in the backlog (whose writes never carry
// FI_MORE and would ring every rail's doorbell, hiding a dangling flag); no peer timeout before
// the test's own deadline.
EngineOptions roomy_options() {
  EngineOptions options = test_options();
  options.credits = {.writes = 256, .bytes = 16 * 1024 * 1024};
  options.peer_timeout = std::chrono::milliseconds(60000);
  return options;
}

// Waits for rank r's flag `key`; on a timeout fails naming the writes held behind FI_MORE.
void wait_or_report(ProxyPair& pair, int r, uint32_t key, const DoorbellRails& doorbells,
                    const std::string& what) {
  try {
    pair.engine(r).wait_flag(pair.rank(r).bank, 0, key, Deadline::after_ms(kWaitMs), what);
  } catch (const Error& e) {
    FAIL("rank " << r << ": " << what << ": " << std::string(e.what()) << "; "
                 << doorbells.report());
  }
}

// Writes of rank r's rails ever held behind FI_MORE (the rails of rank 0 opened first).
uint64_t held_total(const DoorbellRails& doorbells, int r) {
  uint64_t sum = 0;
  for (int rail = 0; rail < kRails; ++rail)
    sum += doorbells.rails()[static_cast<size_t>(r * kRails + rail)]->held_total();
  return sum;
}

}  // namespace

TEST_CASE("FI_MORE: a doorbell provider sees every burst rung on every rail") {
  for (std::string provider : {"shm", "tcp"}) {
    for (bool reorder : {false, true}) {
      CAPTURE(provider);
      CAPTURE(reorder);
      DoorbellRails doorbells;
      ProxyPair pair(
          [&](int r) {
            return doorbells.install(fabric::testing::options_for(provider, r, kRails, reorder));
          },
          kBytes, roomy_options(), /*start=*/false);
      REQUIRE(doorbells.rails().size() == 2 * kRails);
      for (int r = 0; r < 2; ++r) {
        REQUIRE(pair.engine(r).threads() == 1);  // one thread owns all three rails
        for (size_t i = 0; i < kBytes; ++i)
          pair.buffers(r).send[i] = fabric::testing::pattern(r, i);
        for (uint32_t key = 0; key <= kRounds; ++key)
          REQUIRE(pair.rank(r).bank.set_expected(0, key, key == 0 ? kFirstBurst : kRoundBurst) ==
                  Status::ok);
      }

      // One burst, popped whole by the first pass: rails 0, 1, 2, 0, 1, 2, 0. Per rail, the
      // last write (positions 4, 5 and 6) must go without FI_MORE.
      for (int r = 0; r < 2; ++r)
        for (uint32_t i = 0; i < kFirstBurst; ++i)
          pair.push(r, write_descriptor(r, i * 1000, 1000, 0, i));
      pair.start();
      for (int r = 0; r < 2; ++r)
        wait_or_report(pair, r, 0, doorbells, "the first burst (7 writes over 3 rails)");
      for (int r = 0; r < 2; ++r) {
        const auto& recv = pair.buffers(r).recv;
        size_t bad = 0;
        for (size_t i = 0; i < kFirstBurst * 1000; ++i)
          bad += recv[i] != fabric::testing::pattern(1 - r, i);
        CHECK_MESSAGE(bad == 0, bad << " bytes differ at rank " << r);
        // The proxy did batch: positions 0-3 each had a later write on their rail.
        CHECK_MESSAGE(held_total(doorbells, r) == 4, "rank " << r << ": " << doorbells.report());
      }

      // Bursts pushed while the proxy runs (it may pop them whole or in pieces).
      for (uint32_t round = 1; round <= kRounds; ++round) {
        for (int r = 0; r < 2; ++r) {
          std::array<gpu_side::Descriptor, kRoundBurst> burst;
          for (uint32_t i = 0; i < kRoundBurst; ++i) {
            const uint64_t offset = (kFirstBurst + (round - 1) * kRoundBurst + i) * 1000;
            burst[i] = write_descriptor(r, offset, 1000, round, offset);
          }
          size_t done = 0;
          const auto deadline = Deadline::after_ms(kWaitMs);
          while (done < burst.size()) {
            size_t pushed = 0;
            Status status =
                pair.rank(r).producer->try_push_burst(std::span(burst).subspan(done), pushed);
            done += pushed;
            REQUIRE((status == Status::ok || status == Status::again));
            REQUIRE_MESSAGE(!deadline.expired(), "the ring stayed full");
          }
        }
        for (int r = 0; r < 2; ++r)
          wait_or_report(pair, r, round, doorbells, "round " + std::to_string(round));
      }
      for (int r = 0; r < 2; ++r)
        pair.engine(r).quiet(Deadline::after_ms(kWaitMs));
      CHECK_MESSAGE(doorbells.held() == 0, doorbells.report());
      CHECK(doorbells.batches() > 0);
      for (int r = 0; r < 2; ++r) {
        const auto& recv = pair.buffers(r).recv;
        const size_t written = (kFirstBurst + kRounds * kRoundBurst) * 1000;
        size_t bad = 0;
        for (size_t i = 0; i < written; ++i)
          bad += recv[i] != fabric::testing::pattern(1 - r, i);
        CHECK_MESSAGE(bad == 0, bad << " bytes differ at rank " << r);
        CHECK(!pair.engine(r).health().failed());
      }
    }
  }
}
