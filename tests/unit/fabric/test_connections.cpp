// Connection probes (Fabric::open_connections): they complete on every rail, stay below the
// layers that poll (no completion, no byte at either side), refuse bad input before anything is
// sent, and never report a connection to a rank that went away as open.
#include "fabric/fabric.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

using namespace proxyep;
using namespace proxyep::fabric;
using namespace proxyep::fabric::testing;

namespace {

// Rank `from`'s probe to rank `to`: the start of `to`'s receive region on each rail.
Fabric::ConnectionProbe probe_to(FabricPair& pair, int from, int to) {
  Fabric::ConnectionProbe probe{.peer = to, .rails = {}};
  for (int rail = 0; rail < pair.fabric(from).num_rails(); ++rail)
    probe.rails.push_back(pair.rank(to).recv_region->descriptor().target(rail, 0));
  return probe;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("connection probes open every rail and stay invisible to the rails' users") {
  for (bool reorder : {false, true}) {
    for (std::string provider : {"shm", "tcp"}) {
      CAPTURE(provider);
      CAPTURE(reorder);
      FabricPair pair([&](int rank) { return options_for(provider, rank, 2, reorder); }, 4096);
      pair.fabric(0).open_connections({probe_to(pair, 0, 1)});
      CHECK(pair.fabric(0).peers_awaiting_connection() == std::vector<int>{1});
      auto deadline = Deadline::after_ms(kWaitMs);
      while (!pair.fabric(0).connections_open()) {
        pair.fabric(1).progress();  // the target's side of the connection
        if (deadline.expired()) FAIL("the probes did not complete");
      }
      CHECK(pair.fabric(0).peers_awaiting_connection().empty());
      for (int i = 0; i < 100; ++i)
        pair.poll_all();
      for (int r = 0; r < 2; ++r) {
        CHECK(pair.rank(r).local.empty());
        CHECK(pair.rank(r).remote.empty());
        CHECK(std::all_of(pair.rank(r).recv.begin(), pair.rank(r).recv.end(),
                          [](uint8_t b) { return b == 0; }));
        for (int rail = 0; rail < 2; ++rail)
          CHECK(pair.fabric(r).rail(rail).writes_in_flight() == 0);
      }
      // The connections carry data both ways afterwards, the reverse direction included.
      for (int rail = 0; rail < 2; ++rail) {
        pair.rank(1).send[rail] = static_cast<uint8_t>(0xa0 + rail);
        pair.write(1, 0, rail, static_cast<size_t>(rail), 1, 40u + rail, 50u + rail);
        pair.write(0, 1, rail, 0, 0, 60u + rail, 70u + rail);
      }
      pair.wait_until(
          [&] { return pair.rank(0).remote.size() == 2 && pair.rank(1).remote.size() == 2; },
          "writes after the probes");
      CHECK(pair.rank(0).recv[0] == 0xa0);
      CHECK(pair.rank(0).recv[1] == 0xa1);
    }
  }
}

TEST_CASE("a probe to no such rank, or with a target per rail missing, is refused at once") {
  FabricPair pair([&](int rank) { return options_for("tcp", rank, 2); }, 4096);
  Fabric::ConnectionProbe stranger = probe_to(pair, 0, 1);
  stranger.peer = 5;
  try {
    pair.fabric(0).open_connections({stranger});
    FAIL("a probe to rank 5 of 2 was accepted");
  } catch (const Error& e) {
    CHECK(e.phase() == "fabric.connect");
    CHECK(contains(e.what(), "rank 5"));
  }
  Fabric::ConnectionProbe short_probe = probe_to(pair, 0, 1);
  short_probe.rails.pop_back();
  CHECK_THROWS_WITH_AS(pair.fabric(0).open_connections({short_probe}),
                       doctest::Contains("names 1 rail targets"), Error);
  // Nothing was queued: the fabric reports every connection open.
  CHECK(pair.fabric(0).connections_open());
}

TEST_CASE("a probe to a rank that went away never reports its connection open") {
  for (std::string provider : {"sockets", "tcp"}) {
    CAPTURE(provider);
    FabricPair pair([&](int rank) { return options_for(provider, rank); }, 4096);
    Fabric::ConnectionProbe probe = probe_to(pair, 0, 1);
    pair.close(1);
    pair.fabric(0).open_connections({probe});
    auto deadline = Deadline::after_ms(300);
    bool open = false;
    try {
      while (!open && !deadline.expired())
        open = pair.fabric(0).connections_open();
      CHECK(pair.fabric(0).peers_awaiting_connection() == std::vector<int>{1});
    } catch (const Error& e) {  // a provider that reports the refused connection
      CHECK(e.phase() == "fabric.connect");
      CHECK(contains(e.what(), "rank 1"));
    }
    CHECK_FALSE(open);
  }
}
