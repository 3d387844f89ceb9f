// The landing region's free space: offers, blocks taken and released in any order, runs merged,
// and the offer that keeps reusing the lowest pages while a caller holds outputs across calls.
#include "integrations/normal/landing_blocks.hpp"

#include <doctest/doctest.h>

#include <thread>
#include <vector>

using proxyep::integrations::normal::LandingBlocks;

namespace {

constexpr uint64_t kPage = LandingBlocks::kAlignment;

}  // namespace

TEST_CASE("landing blocks: a fresh region offers all of itself; takes split, releases merge") {
  LandingBlocks blocks(100 * kPage + 17);  // the tail that is not a whole page is not used
  const LandingBlocks::Offer first = blocks.offer();
  CHECK(first.fitted.bytes == 0);  // no need seen yet
  CHECK(first.largest.offset == 0);
  CHECK(first.largest.bytes == 100 * kPage);
  CHECK(first.place(100 * kPage) == 0);
  CHECK(first.place(100 * kPage + 1) == -1);
  CHECK(blocks.take(0, 10 * kPage - 5));  // rounded up to 10 pages
  CHECK(blocks.take(10 * kPage, kPage));
  CHECK(blocks.take(50 * kPage, 20 * kPage));
  CHECK(blocks.free_bytes() == 69 * kPage);
  CHECK(blocks.free_runs() == 2);  // [11, 50) and [70, 100)
  // Overlapping a used block, or past the end, or unaligned: refused, nothing changes.
  CHECK_FALSE(blocks.take(5 * kPage, kPage));
  CHECK_FALSE(blocks.take(45 * kPage, 10 * kPage));
  CHECK_FALSE(blocks.take(95 * kPage, 10 * kPage));
  CHECK_FALSE(blocks.take(12 * kPage + 1, kPage));
  CHECK_FALSE(blocks.take(12 * kPage, 0));
  CHECK(blocks.free_bytes() == 69 * kPage);
  // Released in any order, the runs merge back into one.
  blocks.release(10 * kPage, kPage);
  blocks.release(50 * kPage, 20 * kPage);
  CHECK(blocks.free_runs() == 1);  // [10, 100); [0, 10) is still held
  CHECK(blocks.free_bytes() == 90 * kPage);
  blocks.release(0, 10 * kPage - 5);
  CHECK(blocks.free_runs() == 1);
  CHECK(blocks.free_bytes() == 100 * kPage);
}

TEST_CASE("landing blocks: with outputs held across calls, offers reuse the lowest pages") {
  LandingBlocks blocks(1000 * kPage);
  const uint64_t need = 30 * kPage;
  // A caller that holds each output until the next call has finished: at most two are alive.
  std::vector<LandingBlocks::Run> held;
  uint64_t highest = 0;
  for (int call = 0; call < 50; ++call) {
    const int64_t at = blocks.offer().place(need);
    REQUIRE(at >= 0);
    const auto offset = static_cast<uint64_t>(at);
    blocks.note_need(need);
    REQUIRE(blocks.take(offset, need));
    highest = std::max(highest, offset + need);
    held.push_back({offset, need});
    if (held.size() > 2) {
      blocks.release(held.front().offset, held.front().bytes);
      held.erase(held.begin());
    }
  }
  // Three outputs' worth of pages at most, not fifty.
  CHECK(highest <= 3 * need);
}

TEST_CASE("landing blocks: a call larger than the recent ones gets the largest run") {
  LandingBlocks blocks(1000 * kPage);
  blocks.note_need(10 * kPage);
  REQUIRE(blocks.take(0, 10 * kPage));
  REQUIRE(blocks.take(20 * kPage, 10 * kPage));  // [10, 20) free, then [30, 1000)
  const LandingBlocks::Offer offer = blocks.offer();
  CHECK(offer.fitted.offset == 10 * kPage);
  CHECK(offer.largest.offset == 30 * kPage);
  CHECK(offer.place(10 * kPage) == static_cast<int64_t>(10 * kPage));
  CHECK(offer.place(10 * kPage + 1) == static_cast<int64_t>(30 * kPage));
  CHECK(offer.place(970 * kPage + 1) == -1);
  CHECK(offer.place(0) == -1);
}

TEST_CASE("landing blocks: an offer stays free until taken while other blocks come back") {
  LandingBlocks blocks(64 * kPage);
  REQUIRE(blocks.take(0, 8 * kPage));
  REQUIRE(blocks.take(8 * kPage, 8 * kPage));
  const LandingBlocks::Run run = blocks.offer().largest;  // [16, 64)
  CHECK(run.offset == 16 * kPage);
  // Released from other threads meanwhile: the run only grows (it merges with [8, 16)).
  std::thread([&] { blocks.release(8 * kPage, 8 * kPage); }).join();
  std::thread([&] { blocks.release(0, 8 * kPage); }).join();
  CHECK(blocks.take(run.offset, run.bytes));
  CHECK(blocks.free_bytes() == 16 * kPage);
}
