// Test fixture: two ranks (two Fabric instances) in one process, connected to each other
// directly (no bootstrap), each with a registered send and receive buffer. Every wait drives
// both ranks' completion queues (manual-progress providers move nothing otherwise) and is
// bounded by a Deadline, so a bug fails the test instead of hanging it.
#pragma once

#include "common/deadline.hpp"
#include "fabric/fabric.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace proxyep::fabric::testing {

constexpr int64_t kWaitMs = 10000;

// Options for one of the providers the tests run on; tcp stays on the loopback interface.
inline FabricOptions options_for(const std::string& provider, int rank, int rails = 1,
                                 bool reorder = false, uint64_t seed = 1) {
  FabricOptions options;
  options.provider = provider;
  bool ip = provider == "tcp" || provider == "sockets" || provider == "net" || provider == "udp";
  options.domain_filter = ip ? "lo" : "";  // never address anything but loopback
  options.rails = rails;
  options.rank = rank;
  options.cq_size = 4096;
  options.cq_batch = 16;
  options.reorder.enabled = reorder;
  options.reorder.seed = seed + static_cast<uint64_t>(rank) * 1000;
  options.reorder.segment_bytes = 1024;
  options.reorder.max_held = 8;
  return options;
}

struct Rank {
  std::unique_ptr<Fabric> fabric;
  std::vector<uint8_t> send;
  std::vector<uint8_t> recv;
  std::unique_ptr<MemoryRegion> send_region;
  std::unique_ptr<MemoryRegion> recv_region;
  std::vector<Completion> local;   // local_write completions, in delivery order
  std::vector<Completion> remote;  // remote_write completions, in delivery order
};

class FabricPair {
 public:
  // `make_options(rank)` gives each rank's options; buffers are `bytes` long.
  FabricPair(const std::function<FabricOptions(int)>& make_options, size_t bytes) {
    for (int r = 0; r < 2; ++r) {
      ranks_[r].fabric = Fabric::open(make_options(r));
      ranks_[r].send.assign(bytes, 0);
      ranks_[r].recv.assign(bytes, 0);
    }
    std::vector<Bytes> addresses{ranks_[0].fabric->addresses(), ranks_[1].fabric->addresses()};
    for (auto& rank : ranks_) {
      rank.fabric->connect(addresses);
      rank.send_region = rank.fabric->register_memory(rank.send.data(), rank.send.size());
      rank.recv_region = rank.fabric->register_memory(rank.recv.data(), rank.recv.size());
    }
  }

  Rank& rank(int r) { return ranks_[r]; }
  // Tears one rank down (regions first, then its fabric), as if its process had gone away.
  void close(int r) {
    ranks_[r].send_region.reset();
    ranks_[r].recv_region.reset();
    ranks_[r].fabric.reset();
  }
  Fabric& fabric(int r) { return *ranks_[r].fabric; }

  // Polls every rail of both ranks once; fails the test on an error status.
  void poll_all() {
    for (auto& rank : ranks_) {
      for (int rail = 0; rail < rank.fabric->num_rails(); ++rail) {
        Completion batch[16];
        size_t count = 0;
        Status status = rank.fabric->rail(rail).poll(batch, count);
        // Plain `if` rather than REQUIRE per poll: doctest counts every assertion, and waits poll
        // millions of times.
        if (status != Status::ok) FAIL(rank.fabric->rail(rail).last_error());
        for (size_t i = 0; i < count; ++i) {
          auto& list = batch[i].kind == Completion::Kind::local_write ? rank.local : rank.remote;
          list.push_back(batch[i]);
        }
      }
    }
  }

  void wait_until(const std::function<bool()>& done, const char* what) {
    auto deadline = Deadline::after_ms(kWaitMs);
    while (!done()) {
      poll_all();
      if (deadline.expired()) FAIL("timed out waiting for " << std::string(what));
    }
  }

  // Writes `length` bytes of rank `from`'s send buffer at `offset` to the same offset of rank
  // `to`'s receive buffer, retrying while the rail says again.
  void write(int from, int to, int rail, size_t offset, size_t length, uint32_t imm,
             uint64_t cookie) {
    Rank& source = ranks_[from];
    RegionDescriptor target = ranks_[to].recv_region->descriptor();
    WriteOp op;
    op.peer = to;
    op.local = source.send.data() + offset;
    op.local_desc = source.send_region->local_desc(rail);
    op.length = length;
    op.remote = target.target(rail, offset);
    op.imm = imm;
    op.cookie = cookie;
    auto deadline = Deadline::after_ms(kWaitMs);
    Status status;
    while ((status = source.fabric->rail(rail).write(op)) == Status::again) {
      poll_all();
      if (deadline.expired()) FAIL("write kept returning again");
    }
    REQUIRE_MESSAGE(status == Status::ok, source.fabric->rail(rail).last_error());
  }

 private:
  Rank ranks_[2];
};

inline uint8_t pattern(int rank, size_t i) {
  return static_cast<uint8_t>((i * 131 + 7) ^ (static_cast<size_t>(rank) * 59));
}

struct WritePlan {
  size_t offset = 0;
  size_t length = 0;
};

// Carves `count` writes out of `bytes`: zero-length ones, small ones, and (when `large`) some
// longer than 64 segments of 1 KiB, so the reorder shim must grow its segments.
inline std::vector<WritePlan> plan_writes(size_t count, size_t bytes, uint64_t seed, bool large) {
  std::mt19937_64 random(seed);
  std::vector<WritePlan> plans;
  size_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t length = 1 + random() % 5000;
    if (i % 7 == 0)
      length = 0;
    else if (large && i % 13 == 1)
      length = 64 * 1024 + random() % 20000;
    length = std::min(length, bytes - offset);
    plans.push_back({offset, length});
    offset += length;
  }
  return plans;
}

// The order in which each rank saw the other's writes complete (index = write number).
struct ExchangeOrder {
  std::vector<size_t> remote[2];
  std::vector<size_t> local[2];
};

// Both ranks send `count` writes to each other, round robin over the rails, then the test checks
// everything: each rank gets exactly `count` local and remote completions, every cookie and every
// imm exactly once with the right peer, every payload byte, and no byte outside the writes.
inline ExchangeOrder exchange(FabricPair& pair, size_t count, size_t bytes, bool large = false) {
  auto plans = plan_writes(count, bytes, 42, large);
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < bytes; ++i)
      pair.rank(r).send[i] = pattern(r, i);
  int rails = pair.fabric(0).num_rails();
  for (size_t i = 0; i < count; ++i) {
    for (int from = 0; from < 2; ++from) {
      uint32_t imm = (static_cast<uint32_t>(from) << 31) | static_cast<uint32_t>(i);
      pair.write(from, 1 - from, static_cast<int>(i % static_cast<size_t>(rails)), plans[i].offset,
                 plans[i].length, imm, 1000 + i);
    }
  }
  pair.wait_until(
      [&] {
        for (int r = 0; r < 2; ++r)
          if (pair.rank(r).local.size() < count || pair.rank(r).remote.size() < count) return false;
        return true;
      },
      "all completions");
  ExchangeOrder order;
  for (int r = 0; r < 2; ++r) {
    Rank& rank = pair.rank(r);
    CHECK(rank.local.size() == count);
    CHECK(rank.remote.size() == count);
    std::set<uint64_t> cookies;
    for (const auto& c : rank.local) {
      CHECK(c.peer == 1 - r);
      CHECK(c.cookie >= 1000);
      cookies.insert(c.cookie);
      order.local[r].push_back(c.cookie - 1000);
    }
    CHECK(cookies.size() == count);
    std::set<uint32_t> imms;
    for (const auto& c : rank.remote) {
      CHECK((c.imm >> 31) == static_cast<uint32_t>(1 - r));
      imms.insert(c.imm);
      order.remote[r].push_back(c.imm & 0x7fffffffu);
    }
    CHECK(imms.size() == count);
    CHECK((imms.empty() || (*imms.rbegin() & 0x7fffffffu) == count - 1));
    for (int rail = 0; rail < rails; ++rail)
      CHECK(pair.fabric(r).rail(rail).writes_in_flight() == 0);
    size_t written = plans.back().offset + plans.back().length;
    size_t bad = 0;
    for (size_t i = 0; i < written; ++i)
      bad += rank.recv[i] != pattern(1 - r, i);
    for (size_t i = written; i < bytes; ++i)
      bad += rank.recv[i] != 0;
    CHECK_MESSAGE(bad == 0, bad << " bytes differ at rank " << r);
  }
  return order;
}

}  // namespace proxyep::fabric::testing
