// integrations/rma_link.hpp: a sender and a receiver link over a real two-rank fabric in one
// process (tcp on loopback and shm, the reorder shim on, so writes land and complete out of
// order), the receiver waiting on its own thread as a rollout worker would. Every payload byte
// and every immediate must arrive exactly once; bad input and timeouts must fail with errors
// that name the phase and the peer, leaving the link usable.
#include "integrations/rma_link.hpp"

#include "common/deadline.hpp"
#include "common/error.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <future>
#include <set>
#include <string>
#include <vector>

using namespace proxyep;
using proxyep::fabric::testing::options_for;

namespace {

constexpr int64_t kWaitMs = 20000;

struct Link {
  RmaReceiver receiver;
  RmaSender sender;
  int remote = -1;

  Link(const std::string& provider, size_t landing, int rails = 1)
      : receiver(landing, "test sender", options_for(provider, 1, rails, true, 7)),
        sender("test receiver", options_for(provider, 0, rails, true, 7)) {
    receiver.connect(sender.address());
    sender.connect(receiver.address());
    remote = sender.add_remote(receiver.descriptor());
  }
};

uint8_t pattern(size_t i) {
  return static_cast<uint8_t>((i * 197 + 11) ^ (i >> 9));
}

struct Piece {
  size_t offset, length;
};

// Pieces of `bytes`: zero-length ones, small ones and some spanning many shim segments.
std::vector<Piece> pieces_of(size_t bytes) {
  std::vector<Piece> out;
  size_t offset = 0;
  for (size_t i = 0; offset < bytes; ++i) {
    size_t length = i % 5 == 0 ? 0 : (i % 3 == 0 ? 40000 + i * 37 : 1 + (i * 733) % 3000);
    length = std::min(length, bytes - offset);
    out.push_back({offset, length});
    offset += length;
  }
  return out;
}

// Sends `source` in pieces (landing at `shift` + offset) with imm = base + piece index while
// the receiver waits on another thread; returns the immediates the receiver saw.
std::vector<uint32_t> transfer(Link& link, std::vector<uint8_t>& source, int region, uint32_t base,
                               size_t shift = 0) {
  auto pieces = pieces_of(source.size());
  uint64_t expected = link.receiver.received() + pieces.size();
  auto waiter = std::async(std::launch::async,
                           [&] { return link.receiver.wait(expected, kWaitMs, "test.wait"); });
  for (size_t i = 0; i < pieces.size(); ++i)
    link.sender.write(region, pieces[i].offset, pieces[i].length, link.remote,
                      shift + pieces[i].offset, base + static_cast<uint32_t>(i), kWaitMs,
                      "test.write");
  link.sender.flush(kWaitMs, "test.flush");
  auto imms = waiter.get();
  CHECK(imms.size() == pieces.size());
  std::set<uint32_t> unique(imms.begin(), imms.end());
  CHECK(unique.size() == pieces.size());
  CHECK(*unique.begin() == base);
  CHECK(*unique.rbegin() == base + pieces.size() - 1);
  return imms;
}

}  // namespace

TEST_CASE("rma link: every byte and immediate arrives exactly once, out of order") {
  for (std::string provider : {"tcp", "shm"}) {
    CAPTURE(provider);
    for (int rails : {1, 2}) {
      CAPTURE(rails);
      const size_t bytes = 300 * 1024;
      Link link(provider, bytes + 4096, rails);
      std::vector<uint8_t> source(bytes);
      for (size_t i = 0; i < bytes; ++i)
        source[i] = pattern(i);
      int region = link.sender.register_region(source.data(), source.size());
      CHECK(link.sender.max_write_bytes() >= 64 * 1024);

      auto imms = transfer(link, source, region, 1000);
      auto landing = link.receiver.landing();
      size_t bad = 0;
      for (size_t i = 0; i < bytes; ++i)
        bad += static_cast<uint8_t>(landing[i]) != source[i];
      for (size_t i = bytes; i < landing.size(); ++i)  // nothing outside the writes
        bad += landing[i] != std::byte{0};
      CHECK_MESSAGE(bad == 0, bad << " landing bytes differ");
      CHECK(link.sender.posted() == imms.size());
      CHECK(link.sender.completed() == link.sender.posted());
      CHECK(link.sender.bytes_posted() == bytes);

      // The shim was really underneath and split the long writes into segments.
      auto stats = link.sender.reorder_stats();
      REQUIRE(stats.has_value());
      CHECK(stats->writes == imms.size());
      CHECK(stats->split_writes > 0);
      CHECK(link.receiver.reorder_stats().has_value());

      // A second transfer over the same link (new contents, shifted): counts carry on.
      for (auto& b : source)
        b = static_cast<uint8_t>(b ^ 0x5a);
      uint64_t before = link.receiver.received();
      auto again = transfer(link, source, region, 50000, 4096 - 512);
      CHECK(link.receiver.received() == before + again.size());
      bad = 0;
      for (size_t i = 0; i < bytes; ++i)
        bad += static_cast<uint8_t>(landing[4096 - 512 + i]) != source[i];
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("rma link: bad input is refused before anything is posted; the link stays usable") {
  Link link("tcp", 8192);
  std::vector<uint8_t> source(4096, 7);
  int region = link.sender.register_region(source.data(), source.size());

  auto refused = [&](auto&& call, const std::string& needle) {
    try {
      call();
      FAIL("accepted: " << needle);
    } catch (const Error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
      CHECK(std::string(e.what()).find("test.write") == 0);
    }
  };
  refused([&] { link.sender.write(region, 4000, 200, link.remote, 0, 1, 1000, "test.write"); },
          "outside region");
  refused([&] { link.sender.write(region, 0, 4096, link.remote, 6000, 1, 1000, "test.write"); },
          "landing area of test receiver");
  refused([&] { link.sender.write(region + 5, 0, 1, link.remote, 0, 1, 1000, "test.write"); },
          "unknown source region");
  refused([&] { link.sender.write(region, 0, 1, link.remote + 3, 0, 1, 1000, "test.write"); },
          "unknown remote");
  CHECK(link.sender.posted() == 0);
  CHECK_THROWS_WITH_AS(link.sender.add_remote({1, 2, 3}),
                       doctest::Contains("descriptor of test receiver is malformed"), Error);
  CHECK_THROWS_AS(link.receiver.connect(link.sender.address()), Error);  // already connected

  transfer(link, source, region, 9);
  CHECK(static_cast<uint8_t>(link.receiver.landing()[4095]) == 7);
  // Deregistration waits for nothing: everything was flushed.
  link.sender.unregister_region(region);
  CHECK_THROWS_WITH_AS(link.sender.write(region, 0, 1, link.remote, 0, 1, 1000, "test.write"),
                       doctest::Contains("unknown source region"), Error);
}

TEST_CASE("rma link: a wait past its deadline names the phase, the peer and the count") {
  Link link("tcp", 4096);
  std::vector<uint8_t> source(64, 3);
  int region = link.sender.register_region(source.data(), source.size());
  auto waiter =
      std::async(std::launch::async, [&] { return link.receiver.wait(2, 1500, "weights.stage"); });
  link.sender.write(region, 0, 64, link.remote, 0, 42, kWaitMs, "test.write");
  link.sender.flush(kWaitMs, "test.flush");
  try {
    waiter.get();
    FAIL("the wait for a write never sent returned");
  } catch (const Error& e) {
    std::string what = e.what();
    CHECK(e.phase() == "weights.stage");
    CHECK_MESSAGE(what.find("1 of 2 writes from test sender") != std::string::npos, what);
  }
  // The write that did arrive is kept for the next call.
  auto imms = link.receiver.poll("test.poll");
  REQUIRE(imms.size() == 1);
  CHECK(imms[0] == 42);
  CHECK(link.receiver.received() == 1);
  CHECK(link.receiver.poll("test.poll").empty());
}

TEST_CASE("rma link: a landing area of 0 bytes is refused") {
  CHECK_THROWS_WITH_AS(RmaReceiver(0, "nobody", options_for("tcp", 1)),
                       doctest::Contains("0 bytes"), Error);
}

TEST_CASE("rma link: wait_some returns what arrived, as it arrives, or nothing on its deadline") {
  Link link("tcp", 4096);
  std::vector<uint8_t> source(64, 5);
  int region = link.sender.register_region(source.data(), source.size());
  CHECK(link.receiver.wait_some(1, 50, "test.wait").empty());  // nothing sent yet: no error
  auto waiter = std::async(std::launch::async, [&] {
    std::vector<uint32_t> got;
    auto deadline = Deadline::after_ms(kWaitMs);
    while (link.receiver.received() < 3 && !deadline.expired()) {
      auto some = link.receiver.wait_some(3, 100, "test.wait");
      got.insert(got.end(), some.begin(), some.end());
    }
    return got;
  });
  for (uint32_t imm : {7u, 8u, 9u})
    link.sender.write(region, 0, 64, link.remote, imm * 64, imm, kWaitMs, "test.write");
  link.sender.flush(kWaitMs, "test.flush");
  auto got = waiter.get();
  std::sort(got.begin(), got.end());
  CHECK(got == std::vector<uint32_t>{7, 8, 9});
}

TEST_CASE("rma link: flush_some reports completion without failing on its deadline") {
  Link link("tcp", 4096);
  std::vector<uint8_t> source(128, 1);
  int region = link.sender.register_region(source.data(), source.size());
  CHECK(link.sender.flush_some(10, "test.flush"));  // nothing posted: done at once
  auto waiter =
      std::async(std::launch::async, [&] { return link.receiver.wait(2, kWaitMs, "test.wait"); });
  link.sender.write(region, 0, 128, link.remote, 0, 1, kWaitMs, "test.write");
  link.sender.write(region, 0, 128, link.remote, 128, 2, kWaitMs, "test.write");
  auto deadline = Deadline::after_ms(kWaitMs);
  bool done = false;
  while (!done && !deadline.expired())
    done = link.sender.flush_some(20, "test.flush");
  CHECK(done);
  CHECK(link.sender.completed() == 2);
  CHECK(waiter.get().size() == 2);
}
