// ArenaLayout: every rank derives the same offsets, and no two places overlap.
#include "proxy/session/arena_layout.hpp"

#include "common/error.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace proxyep;
using proxy::ArenaLayout;
using proxy::SessionSizes;

namespace {

SessionSizes sizes(int ranks, int per_node, uint64_t data, uint64_t staging,
                   uint64_t eager = 4096) {
  return {.ranks = ranks,
          .ranks_per_node = per_node,
          .record_bytes = 256,
          .eager_bytes = eager,
          .data_bytes = data,
          .staging_bytes = staging,
          .chunk_bytes = 1 << 20};
}

struct Place {
  uint64_t begin, end;
  std::string what;
};

// Fails naming the two places when any two of `places` overlap or one leaves [0, bytes).
void check_disjoint(std::vector<Place> places, uint64_t bytes) {
  std::sort(places.begin(), places.end(),
            [](const Place& a, const Place& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < places.size(); ++i) {
    INFO(places[i].what);
    CHECK(places[i].begin < places[i].end);
    CHECK(places[i].end <= bytes);
    if (i > 0) {
      INFO("after " << places[i - 1].what);
      CHECK(places[i - 1].end <= places[i].begin);
    }
  }
}

// Every slot of rank `rank`'s arena, as any sender would compute it.
std::vector<Place> arena_places(const ArenaLayout& l) {
  const SessionSizes& s = l.sizes();
  std::vector<Place> out;
  for (uint64_t call : {0, 1})
    for (int src = 0; src < s.ranks; ++src) {
      out.push_back({l.record(call, src), l.record(call, src) + s.record_bytes, "record"});
      if (s.eager_bytes > 0)
        out.push_back({l.eager_slot(call, src), l.eager_slot(call, src) + s.eager_bytes, "eager"});
    }
  for (int r = 0; r < s.ranks; ++r) {
    out.push_back({l.published_word(r), l.published_word(r) + 8, "published word"});
    out.push_back({l.consumed_word(r), l.consumed_word(r) + 8, "consumed word"});
    for (uint64_t call : {0, 1})
      out.push_back({l.released_word(call, r), l.released_word(call, r) + 8, "released word"});
  }
  for (int src = 0; src < s.ranks; ++src) {
    if (src == l.rank()) continue;
    // Each source's whole share, as the windows of its streams use it.
    const proxy::SlotShape share{.slot_bytes = l.source_area(), .window = 1};
    out.push_back({l.chunk_slot(l.rank(), src, share, 0),
                   l.chunk_slot(l.rank(), src, share, 0) + l.source_area(), "data share"});
  }
  return out;
}

}  // namespace

TEST_CASE("arena: records, words, eager slots and data shares never overlap") {
  for (int ranks : {1, 2, 3, 4, 7})
    for (int per_node : {1, 2, 4})
      for (int rank = 0; rank < ranks; ++rank) {
        CAPTURE(ranks);
        CAPTURE(per_node);
        CAPTURE(rank);
        ArenaLayout l(rank, sizes(ranks, per_node, 3 << 20, 2 << 20));
        check_disjoint(arena_places(l), l.arena_bytes());
        CHECK(l.data_base() % 4096 == 0);
      }
}

TEST_CASE("staging: records, eager slots and per-destination shares never overlap") {
  for (int ranks : {2, 3, 4, 7})
    for (int per_node : {1, 2, 3})
      for (int rank = 0; rank < ranks; ++rank) {
        if (ranks <= per_node) continue;
        CAPTURE(ranks);
        CAPTURE(per_node);
        CAPTURE(rank);
        ArenaLayout l(rank, sizes(ranks, per_node, 4 << 20, 2 << 20));
        const SessionSizes& s = l.sizes();
        std::vector<Place> places;
        for (int d = 0; d < ranks; ++d) {
          for (uint64_t call : {0, 1}) {
            places.push_back({l.staging_record(call, d), l.staging_record(call, d) + s.record_bytes,
                              "staging record"});
            places.push_back({l.staging_eager(call, d), l.staging_eager(call, d) + s.eager_bytes,
                              "staging eager"});
          }
          if (l.on_node(d)) continue;
          for (uint32_t slot = 0; slot < l.stage_window(); ++slot)
            places.push_back({l.staging_slot(d, slot),
                              l.staging_slot(d, slot) + l.remote_slots().slot_bytes,
                              "staging slot"});
        }
        check_disjoint(places, l.staging_bytes());
      }
}

TEST_CASE("a sender's chunk slot is where the receiver reads it, in its source's share") {
  const auto s = sizes(4, 2, 4 << 20, 2 << 20);
  const proxy::SlotShape shape{.slot_bytes = 1 << 18, .window = 4};
  for (int receiver = 0; receiver < 4; ++receiver) {
    ArenaLayout mine(receiver, s);
    for (int source = 0; source < 4; ++source) {
      if (source == receiver) continue;
      ArenaLayout theirs(source, s);
      for (uint64_t chunk : {0, 1, 5, 1000}) {
        const uint64_t at = mine.chunk_slot(receiver, source, shape, chunk);
        CHECK(theirs.chunk_slot(receiver, source, shape, chunk) == at);
        const uint64_t share =
            mine.data_base() +
            static_cast<uint64_t>(source < receiver ? source : source - 1) * mine.source_area();
        CHECK(at >= share);
        CHECK(at + shape.slot_bytes <= share + mine.source_area());
      }
    }
  }
}

TEST_CASE("one node: equal shares per source, no chunks between nodes") {
  ArenaLayout l(0, sizes(4, 4, 3 << 20, 0));
  CHECK(l.source_area() == uint64_t{1} << 20);
  CHECK(l.remote_slots().slot_bytes == 0);
  CHECK(l.staging_bytes() == 0);
  CHECK(l.node_slots().whole_bytes == uint64_t{1} << 20);
  CHECK(l.node_slots().slot_bytes == uint64_t{1} << 19);
  CHECK(l.node_slots().window == 2);
}

TEST_CASE("between nodes: one chunk size for all, windows are powers of two") {
  // 3 ranks, 2 per node: ranks 0 and 1 have one remote peer, rank 2 has two.
  const uint64_t data = 8 << 20, staging = 3 << 20;
  ArenaLayout l0(0, sizes(3, 2, data, staging)), l2(2, sizes(3, 2, data, staging));
  CHECK(l0.remote_slots().slot_bytes == l2.remote_slots().slot_bytes);  // senders, receivers agree
  CHECK(l0.remote_slots().slot_bytes == uint64_t{1} << 20);
  CHECK(l0.remote_slots().window == l2.remote_slots().window);
  CHECK(l0.remote_slots().window == 4);  // 4 MiB share / 1 MiB slots
  CHECK(l0.remote_slots().whole_bytes == 0);
  CHECK(l0.stage_window() == 2);  // 3 MiB for one peer -> 3 slots, rounded down to 2
  CHECK(l2.stage_window() == 1);  // 1.5 MiB per peer -> 1 slot
  // The smallest staging share bounds the chunk: 1 MiB / 2 peers.
  ArenaLayout small(0, sizes(3, 2, data, 1 << 20));
  CHECK(small.remote_slots().slot_bytes == uint64_t{1} << 19);
}

TEST_CASE("memory that cannot give every stream one slot is refused") {
  CHECK_THROWS_AS(ArenaLayout(0, sizes(2, 1, 64 << 10, 0)), Error);
  CHECK_THROWS_AS(ArenaLayout(3, sizes(2, 1, 64 << 10, 64 << 10)), Error);  // rank out of range
  auto bad = sizes(2, 1, 64 << 10, 64 << 10);
  bad.record_bytes = 100;  // not a multiple of the slot alignment
  CHECK_THROWS_AS(ArenaLayout(0, bad), Error);
}

namespace {

SessionSizes hierarchical(int ranks, int per_node, uint64_t data = 8 << 20,
                          uint64_t staging = 4 << 20) {
  SessionSizes s = sizes(ranks, per_node, data, staging);
  s.internode = proxy::Internode::hierarchical;
  return s;
}

}  // namespace

TEST_CASE("hierarchical: only on equal nodes across nodes, and only when asked for") {
  CHECK(hierarchical(4, 2).hierarchical());
  CHECK(hierarchical(6, 2).hierarchical());
  CHECK_FALSE(hierarchical(4, 4).hierarchical());  // one node
  CHECK_FALSE(hierarchical(3, 2).hierarchical());  // a smaller last node: per rank
  CHECK_FALSE(hierarchical(3, 1).hierarchical());  // one rank per node: per rank sends the same
  CHECK_FALSE(sizes(4, 2, 8 << 20, 4 << 20).hierarchical());
  // A rank's fabric peers are its counterparts: rank 1 of 2 x 4 writes rank 5 only.
  ArenaLayout l(1, hierarchical(8, 4));
  for (int peer = 0; peer < 8; ++peer) {
    CAPTURE(peer);
    CHECK(l.fabric_peer(peer) == (peer == 5));
  }
  CHECK(l.counterpart(1) == 5);
  CHECK(l.counterpart(0) == 1);
  ArenaLayout per_rank(1, sizes(8, 4, 8 << 20, 4 << 20));
  for (int peer = 0; peer < 8; ++peer)
    CHECK(per_rank.fabric_peer(peer) == (peer >= 4));
}

// Everything that writes rank p's arena under a source key (a data share and its published
// word) or a receiver key (a consumed word), hierarchical: direct node peers under their own
// rank, counterparts over the fabric (shares only: fabric streams signal with immediates), and
// the relay lanes of p's node peers under lane keys. No key may serve two writers, and every
// share but p's own is used.
TEST_CASE("hierarchical: relay-lane keys fill the arena's keys exactly once, and name the source") {
  const std::vector<std::pair<int, int>> shapes = {{2, 2}, {2, 4}, {3, 2}, {4, 2}, {4, 8}, {3, 1}};
  for (const auto& shape : shapes) {
    const int nodes = shape.first, per_node = shape.second;
    const int R = nodes * per_node;
    const SessionSizes s = hierarchical(R, per_node);
    for (int p = 0; p < R; ++p) {
      CAPTURE(nodes);
      CAPTURE(per_node);
      CAPTURE(p);
      const ArenaLayout owner(p, s);
      std::vector<std::string> share(static_cast<size_t>(R)), consumed(static_cast<size_t>(R));
      auto use = [&](std::vector<std::string>& keys, int key, const std::string& who) {
        REQUIRE(key >= 0);
        REQUIRE(key < R);
        INFO("key " << key << " used by " << who << " and " << keys[static_cast<size_t>(key)]);
        CHECK(key != p);
        CHECK(keys[static_cast<size_t>(key)].empty());
        keys[static_cast<size_t>(key)] = who;
      };
      for (int q = 0; q < R; ++q) {
        if (q == p) continue;
        if (owner.on_node(q)) {
          use(share, q, "node peer " + std::to_string(q));
          use(consumed, q, "node peer " + std::to_string(q));
          const ArenaLayout sender(q, s);
          for (int n = 0; n < nodes; ++n) {
            if (n == owner.node()) continue;
            const std::string who =
                "lane of " + std::to_string(q) + " for node " + std::to_string(n);
            use(share, sender.lane_key(q, n), who);
            use(consumed, sender.lane_key(q, n), who);
            CHECK_FALSE(owner.fabric_peer(sender.lane_key(q, n)));
          }
        } else if (owner.fabric_peer(q)) {
          use(share, q, "counterpart " + std::to_string(q));
        }
      }
      for (int key = 0; key < R; ++key)
        CHECK(share[static_cast<size_t>(key)].empty() == (key == p));
      // The rows of any source s on another node reach p through s's counterpart here, under
      // the key s: at p the lane is "the stream from s".
      for (int source = 0; source < R; ++source) {
        if (owner.on_node(source)) continue;
        const int forwarder = owner.forwarder_of(source);
        CHECK(owner.on_node(forwarder));
        CHECK(ArenaLayout(forwarder, s).fabric_peer(source));
        CHECK(owner.lane_key(forwarder, source / per_node) == source);
      }
    }
  }
}

TEST_CASE("hierarchical: staging holds one share per counterpart, so chunks may be larger") {
  // 2 nodes x 4: per rank, 4 fabric peers share the staging; hierarchical, one.
  const uint64_t data = 64 << 20, staging = 4 << 20;
  SessionSizes per_rank = sizes(8, 4, data, staging), hier = hierarchical(8, 4, data, staging);
  per_rank.chunk_bytes = hier.chunk_bytes = 8 << 20;
  CHECK(ArenaLayout(0, per_rank).remote_slots().slot_bytes == uint64_t{1} << 20);
  CHECK(ArenaLayout(0, hier).remote_slots().slot_bytes == uint64_t{4} << 20);
  for (const auto& shape : std::vector<std::pair<int, int>>{{2, 2}, {3, 2}, {4, 2}}) {
    const int nodes = shape.first, per_node = shape.second;
    const int R = nodes * per_node;
    for (int rank = 0; rank < R; ++rank) {
      CAPTURE(R);
      CAPTURE(rank);
      ArenaLayout l(rank, hierarchical(R, per_node, data, 3 << 20));
      std::vector<Place> places;
      for (int d = 0; d < R; ++d) {
        if (!l.fabric_peer(d)) continue;
        for (uint32_t slot = 0; slot < l.stage_window(); ++slot)
          places.push_back({l.staging_slot(d, slot),
                            l.staging_slot(d, slot) + l.remote_slots().slot_bytes,
                            "staging slot of " + std::to_string(d)});
      }
      CHECK(places.size() == static_cast<size_t>((nodes - 1) * l.stage_window()));
      check_disjoint(places, l.staging_bytes());
      CHECK(places.front().begin >= l.staging_data_base());
    }
  }
}
