// The proxy engine end to end between two ranks in one process: descriptors pushed into a ring
// become RMA writes with immediates, the receiver's proxy routes their completions to its
// counter bank, the flag rises, and every payload byte is where it should be. Over shm and tcp,
// with and without the reorder shim (EFA SRD semantics), with credit windows small enough that
// the backlog is used. Then the error paths: a descriptor naming an unknown region, and a peer
// that goes away, each reported to waiters with the peer named, never a hang.
#include "tests/unit/proxy/proxy_pair.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <random>
#include <thread>

using namespace proxyep;
using namespace proxyep::proxy;
using namespace proxyep::proxy::testing;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Chunk {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Chunks of random sizes (zero-length signals included) carved out of `bytes`.
std::vector<Chunk> plan_chunks(size_t count, size_t bytes, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<Chunk> chunks;
  uint64_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    uint64_t length = i % 9 == 4 ? 0 : 1 + random() % 6000;
    length = std::min<uint64_t>(length, bytes - offset);
    chunks.push_back({offset, length});
    offset += length;
  }
  return chunks;
}

}  // namespace

TEST_CASE("descriptors become writes that raise the receiver's flag, every byte in place") {
  constexpr size_t kBytes = 512 * 1024;
  constexpr size_t kChunks = 300;
  for (std::string provider : {"shm", "tcp"}) {
    for (bool reorder : {false, true}) {
      CAPTURE(provider);
      CAPTURE(reorder);
      ProxyPair pair(provider, reorder, kBytes);
      auto chunks = plan_chunks(kChunks, kBytes, 7);
      for (int r = 0; r < 2; ++r) {
        for (size_t i = 0; i < kBytes; ++i)
          pair.buffers(r).send[i] = fabric::testing::pattern(r, i);
        // Rank r receives kChunks writes from its peer under key = the peer's rank.
        REQUIRE(pair.rank(r).bank.set_expected(0, static_cast<uint32_t>(1 - r), kChunks) ==
                Status::ok);
      }
      // Both ranks stream at once, descriptors interleaved.
      for (size_t i = 0; i < kChunks; ++i)
        for (int r = 0; r < 2; ++r)
          pair.push(r, write_descriptor(r, chunks[i].offset, chunks[i].length,
                                        static_cast<uint32_t>(r), i));
      for (int r = 0; r < 2; ++r)
        pair.engine(r).wait_flag(pair.rank(r).bank, 0, static_cast<uint32_t>(1 - r),
                                 Deadline::after_ms(20000), "the peer's chunks");
      for (int r = 0; r < 2; ++r)
        pair.engine(r).quiet(Deadline::after_ms(20000));
      for (int r = 0; r < 2; ++r) {
        const auto& recv = pair.buffers(r).recv;
        size_t written = chunks.back().offset + chunks.back().length;
        size_t bad = 0;
        for (size_t i = 0; i < written; ++i)
          bad += recv[i] != fabric::testing::pattern(1 - r, i);
        for (size_t i = written; i < kBytes; ++i)
          bad += recv[i] != 0;
        CHECK_MESSAGE(bad == 0, bad << " bytes differ at rank " << r);
        ThreadStats stats = pair.engine(r).stats();
        CHECK(stats.descriptors == kChunks);
        CHECK(stats.posted == kChunks);
        CHECK(stats.completed == kChunks);
        CHECK(stats.remote == kChunks);
        CHECK(stats.backlogged > 0);  // 8 writes of credit: most descriptors had to wait
        CHECK(!pair.engine(r).health().failed());
        // What the metrics endpoint shows of it: every write's latency once, its bytes, busy
        // time, no CQ error, and when the last write to the peer completed.
        CHECK(stats.latency.count == kChunks);
        CHECK(stats.latency.sum_ns > 0);
        CHECK(stats.bytes_posted == written);
        CHECK(stats.busy_ns > 0);
        CHECK(stats.cq_errors == 0);
        REQUIRE(stats.last_completion_ns.size() == 2);
        CHECK(stats.last_completion_ns[static_cast<size_t>(1 - r)] > 0);
        CHECK(stats.last_completion_ns[static_cast<size_t>(r)] == 0);
      }
    }
  }
}

TEST_CASE("quiet waits for every descriptor reserved before the call") {
  ProxyPair pair("shm", true, 256 * 1024);
  REQUIRE(pair.rank(1).bank.set_expected(0, 0, 101) == Status::ok);
  for (int i = 0; i < 100; ++i)
    pair.push(0, write_descriptor(0, static_cast<uint64_t>(i) * 2048, 2048, 0));
  pair.push(0, gpu_side::Descriptor{.op = gpu_side::Op::nop});
  pair.push(0, write_descriptor(0, 0, 0, 0));
  pair.engine(0).quiet(Deadline::after_ms(10000));
  CHECK(pair.engine(0).stats().completed == 101);  // the nop needs no write
  pair.engine(1).wait_flag(pair.rank(1).bank, 0, 0, Deadline::after_ms(10000), "101 writes");
  // A quiet with nothing outstanding returns at once.
  pair.engine(0).quiet(Deadline::after_ms(1));
}

TEST_CASE("the ring header's retired prefix covers every descriptor pushed once quiet returns") {
  // proxy/engine/ring_lane.hpp publishes the in-order retired prefix in the ring's header on every
  // finish: what a node daemon's client (another process) waits on instead of quiet().
  ProxyPair pair("shm", true, 256 * 1024);  // reorder: completions come out of order
  auto retired = [&](int r) {
    return gpu_side::atomic(pair.rank(r).ring.header().consumer.retired)
        .load(std::memory_order_acquire);
  };
  // finish() stores the header's copy right after the tracker's prefix moves, and quiet()
  // reads the tracker: poll (with a deadline) for the store that may still be on its way.
  auto wait_retired = [&](int r, uint64_t target) {
    const Deadline deadline = Deadline::after_ms(10000);
    while (retired(r) < target && !deadline.expired())
      std::this_thread::yield();
    return retired(r);
  };
  CHECK(retired(0) == 0);
  REQUIRE(pair.rank(1).bank.set_expected(0, 0, 80) == Status::ok);
  uint64_t pushed = 0;
  for (int i = 0; i < 60; ++i, ++pushed)
    pair.push(0, write_descriptor(0, static_cast<uint64_t>(i) * 2048, 2048, 0));
  pair.push(0, gpu_side::Descriptor{.op = gpu_side::Op::nop});  // finishes at once
  pair.push(0, write_descriptor(0, 0, 0, 0));                   // a bare signal
  pushed += 2;
  pair.engine(0).quiet(Deadline::after_ms(10000));
  CHECK(wait_retired(0, pushed) == pushed);
  CHECK(retired(1) == 0);  // rank 1 pushed nothing

  // A ring position, not a per-call count: a second round carries on from the first.
  for (int i = 0; i < 19; ++i, ++pushed)
    pair.push(0, write_descriptor(0, static_cast<uint64_t>(i) * 4096, 4096, 0));
  pair.engine(0).quiet(Deadline::after_ms(10000));
  CHECK(wait_retired(0, pushed) == pushed);
  CHECK(pushed == 81);
  pair.engine(1).wait_flag(pair.rank(1).bank, 0, 0, Deadline::after_ms(10000), "80 writes");
}

TEST_CASE("an invalid descriptor is an error naming it and the peer, seen by waiters") {
  ProxyPair pair("shm", false, 64 * 1024);
  auto bad = write_descriptor(0, 0, 100, 0, 0x5eed);
  bad.remote_region = 9;
  pair.push(0, bad);
  try {
    pair.engine(0).quiet(Deadline::after_ms(10000));
    FAIL("quiet succeeded after an invalid descriptor");
  } catch (const Error& e) {
    CHECK(e.phase() == "proxy.translate");
    CHECK(contains(e.message(), "rank 1 registered no region 9"));
    CHECK(contains(e.message(), "cookie 0x5eed"));
  }
  auto failure = pair.engine(0).health().failure();
  REQUIRE(failure.has_value());
  CHECK(failure->peer == 1);
  // A flag waiter on the same engine gets the same error instead of waiting out its deadline.
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(
      pair.engine(0).wait_flag(pair.rank(0).bank, 0, 3, Deadline::after_ms(10000), "never"),
      doctest::Contains("registered no region 9"), Error);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
}

TEST_CASE("a peer that goes away is named within the peer timeout") {
  EngineOptions options = test_options();
  options.peer_timeout = std::chrono::milliseconds(1000);
  ProxyPair pair("tcp", false, 256 * 1024, options);
  REQUIRE(pair.rank(1).bank.set_expected(0, 0, 4) == Status::ok);
  for (int i = 0; i < 4; ++i)
    pair.push(0, write_descriptor(0, static_cast<uint64_t>(i) * 1000, 1000, 0));
  pair.engine(1).wait_flag(pair.rank(1).bank, 0, 0, Deadline::after_ms(10000), "warm-up");
  pair.engine(0).quiet(Deadline::after_ms(10000));
  pair.kill(1);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i)
    pair.push(0, write_descriptor(0, static_cast<uint64_t>(i) * 1000, 1000, 0));
  try {
    pair.engine(0).quiet(Deadline::after_ms(15000));
    FAIL("quiet succeeded with the peer gone");
  } catch (const Error& e) {
    CAPTURE(e.what());
    CHECK(contains(e.what(), "rank 1"));
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed < std::chrono::milliseconds(8000));
  MESSAGE("peer failure reported after "
          << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count() << " ms");
}
