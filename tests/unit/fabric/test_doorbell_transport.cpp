// The doorbell double (doorbell_transport.hpp) and the hook it is installed by
// (FabricOptions::wrap_rail): writes posted with FI_MORE stay held, whatever the polling, until a
// write without it on the same rail; then all of them land, in order, every byte. The proxy's
// FI_MORE test (tests/unit/proxy/test_proxy_fi_more.cpp) relies on exactly this.
#include "fabric/reorder_shim.hpp"
#include "tests/unit/fabric/doorbell_transport.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>

using namespace proxyep;
using namespace proxyep::fabric;
using namespace proxyep::fabric::testing;

namespace {

// Rank 0 posts a write of 1000 bytes at `index * 1000` on `rail`, imm = index.
void post(FabricPair& pair, int rail, uint32_t index, bool more) {
  WriteOp op;
  op.peer = 1;
  op.local = pair.rank(0).send.data() + index * 1000;
  op.local_desc = pair.rank(0).send_region->local_desc(rail);
  op.length = 1000;
  op.remote = pair.rank(1).recv_region->descriptor().target(rail, index * 1000);
  op.imm = index;
  op.cookie = index;
  op.more = more;
  REQUIRE(pair.fabric(0).rail(rail).write(op) == Status::ok);
}

// Polls both ranks for `ms` milliseconds.
void poll_for(FabricPair& pair, int ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until)
    pair.poll_all();
}

}  // namespace

TEST_CASE("doorbell double: FI_MORE writes wait for a write without it on their own rail") {
  for (std::string provider : {"shm", "tcp"}) {
    for (bool reorder : {false, true}) {
      CAPTURE(provider);
      CAPTURE(reorder);
      DoorbellRails doorbells;
      FabricPair pair(
          [&](int rank) { return doorbells.install(options_for(provider, rank, 2, reorder, 3)); },
          64 * 1024);
      REQUIRE(doorbells.rails().size() == 4);  // two rails for each of the two ranks
      REQUIRE(dynamic_cast<DoorbellTransport*>(&pair.fabric(0).rail(1)) != nullptr);
      for (size_t i = 0; i < 64 * 1024; ++i)
        pair.rank(0).send[i] = pattern(0, i);

      // Three writes with FI_MORE on rail 0, then one without it on rail 1: rail 1's goes,
      // rail 0's stay held however long both ranks poll.
      for (uint32_t i = 0; i < 3; ++i)
        post(pair, 0, i, true);
      post(pair, 1, 3, false);
      pair.wait_until([&] { return pair.rank(1).remote.size() == 1; }, "rail 1's write");
      poll_for(pair, 200);
      CHECK(pair.rank(1).remote.size() == 1);
      CHECK(pair.rank(1).remote[0].imm == 3);
      CHECK(pair.rank(0).local.size() == 1);
      CHECK(doorbells.held() == 3);
      CHECK(pair.fabric(0).rail(0).writes_in_flight() == 3);
      CHECK(std::all_of(pair.rank(1).recv.begin(), pair.rank(1).recv.begin() + 3000,
                        [](uint8_t b) { return b == 0; }));
      CHECK(doorbells.report().find("3 write(s) held behind FI_MORE") != std::string::npos);

      // A write without FI_MORE on rail 0 rings its doorbell: all four go, every byte lands.
      post(pair, 0, 4, false);
      CHECK(doorbells.held() == 0);
      pair.wait_until(
          [&] { return pair.rank(1).remote.size() == 5 && pair.rank(0).local.size() == 5; },
          "the held writes after the doorbell");
      CHECK(std::equal(pair.rank(1).recv.begin(), pair.rank(1).recv.begin() + 5000,
                       pair.rank(0).send.begin()));
      CHECK(doorbells.held_total() == 3);
      CHECK(doorbells.batches() == 1);
      for (int rail = 0; rail < 2; ++rail)
        CHECK(pair.fabric(0).rail(rail).writes_in_flight() == 0);
    }
  }
}

TEST_CASE("wrap_rail sees every rail once, above the reorder shim; reorder_stats sums the rails") {
  int wrapped = 0;
  auto options = [&](int rank, bool reorder) {
    FabricOptions o = options_for("shm", rank, 2, reorder, 5);
    o.wrap_rail = [&wrapped, reorder](std::unique_ptr<Transport> inner) {
      ++wrapped;
      // Above the shim: what it is handed is the shim itself when the shim is on.
      CHECK((dynamic_cast<ReorderShim*>(inner.get()) != nullptr) == reorder);
      return inner;
    };
    return o;
  };
  {
    FabricPair pair([&](int rank) { return options(rank, true); }, 4 * 1024 * 1024);
    CHECK(wrapped == 4);
    REQUIRE(pair.fabric(0).reorder_stats().has_value());
    CHECK(pair.fabric(0).reorder_stats()->writes == 0);
    exchange(pair, 200, 4 * 1024 * 1024, true);
    for (int r = 0; r < 2; ++r) {
      ReorderStats stats = *pair.fabric(r).reorder_stats();
      CHECK(stats.writes == 200);
      CHECK(stats.segments > stats.writes);
      CHECK(stats.remote_out_of_order > 0);
      CHECK(stats.local_out_of_order > 0);
    }
  }
  FabricPair plain([&](int rank) { return options(rank, false); }, 4096);
  CHECK(wrapped == 8);
  CHECK_FALSE(plain.fabric(0).reorder_stats().has_value());

  FabricOptions refused = options_for("shm", 0);
  refused.wrap_rail = [](std::unique_ptr<Transport>) { return std::unique_ptr<Transport>(); };
  CHECK_THROWS_WITH_AS(Fabric::open(refused), doctest::Contains("wrap_rail returned no transport"),
                       Error);
}
