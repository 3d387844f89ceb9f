// Session and peer channels, without any protocol above them: ranks as threads of this process
// (a real TCP bootstrap on loopback, real memfd arenas, a real fabric with the reorder shim)
// send records, eager bytes and chunk streams of more chunks than the slots hold, through node
// channels, fabric channels and both at once, and check every byte where it lands. A channel
// that published before its bytes were written, reused a slot too early, or lost a credit fails
// here by content or by deadline.
#include "proxy/session/session.hpp"

#include "common/error.hpp"
#include "gpu_side/device/simulated_device.hpp"
#include "tests/unit/control/rank_threads.hpp"
#include "tests/unit/fabric/fabric_pair.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace proxyep;
using proxy::PeerChannel;
using proxy::Session;

namespace {

constexpr int kCalls = 5;
constexpr uint64_t kChunks = 40;  // more than any window below: slots and credits are reused
constexpr uint64_t kRecordBytes = 24;

struct Scenario {
  std::string name;
  int ranks, per_node;
  std::string provider;
  bool reorder;
  // Writes to other nodes handed to the proxies by a simulated device's stream
  // (Session::open_device_route): rank 0's runs nothing until waited for, the others' are slow.
  bool device_stream = false;
  // Hierarchical internode: counterparts over the fabric, every other rank of another node
  // through a relay lane (arena_layout.hpp).
  bool hierarchical = false;
};

// Byte `i` of what `from` sends `to` in `call` (kind tells records, eager bytes and chunks apart).
std::byte pattern(uint64_t call, int from, int to, uint64_t kind, uint64_t i) {
  return static_cast<std::byte>((call * 131 + static_cast<uint64_t>(from) * 31 +
                                 static_cast<uint64_t>(to) * 7 + kind * 17 + i * 13) &
                                0xff);
}

// Whom this rank stands for on its channel to `peer`: itself, or on a relay lane the counterpart
// whose key it writes under. Patterns are by keys, so a lane's bytes check as the stream from
// and to the ranks it stands for, and a lane that wrote under a wrong key fails by content.
int key_of(const Session& s, int peer) {
  const proxy::ArenaLayout& l = s.layout();
  if (l.on_node(peer) || l.fabric_peer(peer)) return s.rank();
  return l.counterpart(peer / s.ranks_per_node());
}

void fill(std::byte* out, uint64_t bytes, uint64_t call, int from, int to, uint64_t kind) {
  for (uint64_t i = 0; i < bytes; ++i)
    out[i] = pattern(call, from, to, kind, i);
}

void verify(const std::byte* got, uint64_t bytes, uint64_t call, int from, int to, uint64_t kind,
            const char* what) {
  for (uint64_t i = 0; i < bytes; ++i)
    require(got[i] == pattern(call, from, to, kind, i), "test",
            "call {}: {} from rank {} at rank {}: byte {} of {} is wrong", call, what, from, to, i,
            bytes);
}

// The bytes chunk j of a stream carries: varying sizes, at most a slot.
uint64_t chunk_bytes(const proxy::SlotShape& shape, uint64_t j) {
  return std::min<uint64_t>(shape.slot_bytes, 64 + (j * 977) % shape.slot_bytes);
}

proxy::SlotShape shape_of(const PeerChannel& channel) {
  const proxy::SlotGeometry g = channel.slots();
  return {.slot_bytes = g.slot_bytes, .window = g.window};
}

// Waits until in(r) holds for every rank r.
template <typename In>
void await_all(Session& s, In&& in, std::string_view what) {
  s.await({.ready =
               [&] {
                 for (int r = 0; r < s.ranks(); ++r)
                   if (!in(r)) return false;
                 return true;
               },
           .pending = [&](int r) { return !in(r); },
           .phase = "test",
           .what = what,
           .detail = {},
           .on_lost = {}});
}

void exchange_records(Session& s, uint64_t call, bool eager) {
  const int R = s.ranks(), me = s.rank();
  for (int d = 0; d < R; ++d) {
    if (!eager || d == me) continue;
    PeerChannel& to = s.channel(d);
    fill(to.eager_buffer(call), 4096, call, key_of(s, d), d, 1);
    to.send_eager(call, 4096, "test");
  }
  for (int d = 0; d < R; ++d) {
    PeerChannel& to = s.channel(d);
    fill(to.record_buffer(call).data(), kRecordBytes, call, key_of(s, d), d, 0);
    to.send_record(call, kRecordBytes, "test");
  }
  for (int r = 0; r < R; ++r)
    s.channel(r).expect_record(call, "test");
  await_all(
      s, [&](int r) { return s.channel(r).record_arrived(call); }, "records");
  for (int r = 0; r < R; ++r)
    verify(s.channel(r).record(call).data(), kRecordBytes, call, r, key_of(s, r), 0, "record");
  if (!eager) return;
  for (int r = 0; r < R; ++r)
    if (r != me) s.channel(r).expect_eager(call, "test");
  await_all(
      s, [&](int r) { return r == me || s.channel(r).eager_arrived(call); }, "eager bytes");
  for (int r = 0; r < R; ++r)
    if (r != me) verify(s.channel(r).eager(call), 4096, call, r, key_of(s, r), 1, "eager bytes");
}

// Every pair streams kChunks chunks; every chunk is checked as it is consumed.
void exchange_streams(Session& s, uint64_t call) {
  const int R = s.ranks(), me = s.rank();
  std::vector<uint64_t> sent(static_cast<size_t>(R), 0), taken(static_cast<size_t>(R), 0);
  for (int r = 0; r < R; ++r) {
    sent[r] = taken[r] = r == me ? kChunks : 0;
    if (r != me) s.channel(r).begin_streams(call, "test");
  }
  auto can_send = [&](int d) {
    return sent[d] < kChunks && s.channel(d).can_send(sent[d], shape_of(s.channel(d)));
  };
  auto landed = [&](int r) { return std::min(s.channel(r).landed(), kChunks); };
  auto pending = [&](int r) { return sent[r] < kChunks || taken[r] < kChunks; };
  while (true) {
    bool progressed = false;
    for (int d = 0; d < R; ++d)
      while (can_send(d)) {
        PeerChannel& to = s.channel(d);
        const auto shape = shape_of(to);
        const uint64_t j = sent[d]++, bytes = chunk_bytes(shape, j);
        fill(to.send_buffer(j, shape), bytes, call, key_of(s, d), d, 2 + j);
        to.send_chunk(j, shape, bytes, "test");
        progressed = true;
      }
    for (int r = 0; r < R; ++r) {
      if (r == me || taken[r] >= landed(r)) continue;
      PeerChannel& from = s.channel(r);
      const auto shape = shape_of(from);
      const uint64_t upto = landed(r);
      for (uint64_t j = taken[r]; j < upto; ++j)
        verify(from.chunk(j, shape), chunk_bytes(shape, j), call, r, key_of(s, r), 2 + j, "chunk");
      taken[r] = upto;
      from.consumed(upto, kChunks, shape, "test");
      progressed = true;
    }
    bool done = true;
    for (int r = 0; r < R; ++r)
      done = done && !pending(r);
    if (done) return;
    if (!progressed)
      s.await({.ready =
                   [&] {
                     for (int r = 0; r < R; ++r)
                       if (r != me && (can_send(r) || landed(r) > taken[r])) return true;
                     return false;
                   },
               .pending = pending,
               .phase = "test",
               .what = "chunks",
               .detail = [&](int r) { return s.channel(r).send_progress(); },
               .on_lost = {}});
  }
}

void run_rank(const Scenario& sc, control::Bootstrap::Options options) {
  auto boot = control::Bootstrap::connect(options);
  proxy::SessionConfig config;
  config.sizes = {
      .ranks = sc.ranks,
      .ranks_per_node = sc.per_node,
      .record_bytes = 128,
      .eager_bytes = 4096,
      .data_bytes = 64 << 10,
      .staging_bytes =
          16 << 10,  // fewer staging slots than the window: reuse waits for local completion
      .chunk_bytes = 4096,
      .internode = sc.hierarchical ? proxy::Internode::hierarchical : proxy::Internode::per_rank};
  config.timeout = std::chrono::milliseconds(15000);
  config.fabric = fabric::testing::options_for(sc.provider, boot->rank(), 1, sc.reorder, 11);
  proxy::EngineOptions engine;
  engine.placement.pin = false;  // every rank of the test shares this process's cores
  config.engine = engine;
  std::shared_ptr<gpu_side::device::SimulatedDevice> device;
  if (sc.device_stream) {
    device = std::make_shared<gpu_side::device::SimulatedDevice>(
        gpu_side::device::SimulatedDeviceOptions{
            .defer_until_synchronize = boot->rank() == 0,
            .operation_delay = std::chrono::milliseconds(boot->rank() == 0 ? 0 : 1)});
    config.device = device;
  }
  auto session = Session::open(*boot, config);
  const bool spans_nodes = sc.per_node < sc.ranks;
  int fabric = 0, relay = 0;
  for (int r = 0; r < sc.ranks; ++r) {
    fabric += session->channel(r).path() == proxy::PeerPath::fabric;
    relay += session->channel(r).path() == proxy::PeerPath::relay;
  }
  // Hierarchical: one fabric peer per other node; per rank: every rank of another node.
  const int others = sc.ranks - proxy::node_size(boot->rank(), sc.ranks, sc.per_node);
  const bool hierarchical = sc.hierarchical && sc.ranks % sc.per_node == 0;
  REQUIRE(session->layout().hierarchical() == hierarchical);
  const int fabric_peers = hierarchical ? sc.ranks / sc.per_node - 1 : others;
  require(fabric == fabric_peers && relay == others - fabric_peers, "test",
          "rank {}: {} fabric channels and {} relay lanes, expected {} and {}", boot->rank(),
          fabric, relay, fabric_peers, others - fabric_peers);
  for (uint64_t call = 0; call < kCalls; ++call) {
    session->begin_call(call, nullptr);
    if (device) REQUIRE(session->open_device_route(device, "test") == spans_nodes);
    exchange_records(*session, call, call % 2 == 1);
    exchange_streams(*session, call);
    session->quiet("test");
    session->close_device_route();
  }
  if (device && spans_nodes) {
    // Writes the stream holds when quiet() begins: it has the stream push them and waits for
    // them, so that every write went to the proxy (and completed) once it returns.
    REQUIRE(session->open_device_route(device, "test"));
    for (int d = 0; d < session->ranks(); ++d)
      if (session->channel(d).path() == proxy::PeerPath::fabric)
        session->channel(d).release(kCalls - 1, "test");
    session->quiet("test");
    session->close_device_route();
    uint64_t popped = 0;
    for (const proxy::ThreadStats& t : session->proxy_thread_stats())
      popped += t.descriptors;
    CHECK(session->writes_from_device() > 0);
    CHECK(popped == session->writes_from_device());  // every write went through the stream
  }
  boot->barrier("test(done)");  // nobody stops its proxy while a peer still waits for a credit
}

void run_scenario(const Scenario& sc) {
  CAPTURE(sc.name);
  std::vector<control::testing::RankBody> bodies;
  for (int r = 0; r < sc.ranks; ++r)
    bodies.push_back([&](control::Bootstrap::Options options) { run_rank(sc, options); });
  auto outcomes = control::testing::run_bodies(bodies, sc.ranks, std::chrono::milliseconds(20000));
  for (size_t r = 0; r < outcomes.size(); ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].ok);
  }
}

// Calls whose receive phase lags one call behind (as low-latency hooks do): call k is received
// after call k + 1 was sent. A slot of call k's parity is written again by call k + 2 only
// after the peer released call k; the rank `slow` sleeps before each receive, so a sender that
// did not wait would overwrite bytes that are still to be read (and verify() would fail).
void receive_lagging(Session& s, uint64_t call) {
  const int R = s.ranks(), me = s.rank();
  await_all(
      s, [&](int r) { return s.channel(r).record_arrived(call); }, "records");
  for (int r = 0; r < R; ++r)
    s.channel(r).expect_eager(call, "test");
  await_all(
      s, [&](int r) { return s.channel(r).eager_arrived(call); }, "eager bytes");
  for (int r = 0; r < R; ++r) {
    verify(s.channel(r).record(call).data(), kRecordBytes, call, r, key_of(s, r), 0, "record");
    verify(s.channel(r).eager(call), 4096, call, r, me, 1, "eager bytes");
    s.channel(r).release(call, "test");
  }
}

void run_lagging_rank(const Scenario& sc, int slow, control::Bootstrap::Options options) {
  auto boot = control::Bootstrap::connect(options);
  proxy::SessionConfig config;
  config.sizes = {
      .ranks = sc.ranks,
      .ranks_per_node = sc.per_node,
      .record_bytes = 128,
      .eager_bytes = 4096,
      .data_bytes = 0,  // no streams: records and eager bytes only
      .staging_bytes = 0,
      .chunk_bytes = 4096,
      .internode = sc.hierarchical ? proxy::Internode::hierarchical : proxy::Internode::per_rank};
  config.timeout = std::chrono::milliseconds(15000);
  config.fabric = fabric::testing::options_for(sc.provider, boot->rank(), 1, sc.reorder, 12);
  proxy::EngineOptions engine;
  engine.placement.pin = false;
  config.engine = engine;
  auto session = Session::open(*boot, config);
  Session& s = *session;
  const int R = s.ranks(), me = s.rank();
  for (uint64_t call = 0; call < kCalls + 3; ++call) {
    s.begin_call(call, nullptr);
    for (int r = 0; r < R; ++r)
      s.channel(r).expect_record(call, "test");
    if (call >= 2) {
      for (int d = 0; d < R; ++d)
        s.channel(d).expect_release(call - 2, "test");
      await_all(
          s, [&](int d) { return s.channel(d).released(call - 2); }, "releases");
    }
    for (int d = 0; d < R; ++d) {
      PeerChannel& to = s.channel(d);
      fill(to.eager_buffer(call), 4096, call, key_of(s, d), d, 1);
      to.send_eager(call, 4096, "test");
      fill(to.record_buffer(call).data(), kRecordBytes, call, key_of(s, d), d, 0);
      to.send_record(call, kRecordBytes, "test");
    }
    if (call == 0) continue;
    if (me == slow) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    receive_lagging(s, call - 1);
  }
  receive_lagging(s, kCalls + 2);
  s.quiet("test");
  boot->barrier("test(done)");
}

void run_lagging(const Scenario& sc, int slow) {
  CAPTURE(sc.name);
  CAPTURE(slow);
  std::vector<control::testing::RankBody> bodies;
  for (int r = 0; r < sc.ranks; ++r)
    bodies.push_back(
        [&](control::Bootstrap::Options options) { run_lagging_rank(sc, slow, options); });
  auto outcomes = control::testing::run_bodies(bodies, sc.ranks, std::chrono::milliseconds(20000));
  for (size_t r = 0; r < outcomes.size(); ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].ok);
  }
}

}  // namespace

TEST_CASE("released slots: call k + 2 waits until every peer read call k") {
  for (int slow : {0, 1}) {
    run_lagging({"2 ranks on one node", 2, 2, "shm", false}, slow);
    run_lagging({"2 ranks as 2 nodes, tcp", 2, 1, "tcp", true}, slow);
  }
  run_lagging({"3 ranks, 2 per node, tcp", 3, 2, "tcp", true}, 2);
}

TEST_CASE("node channels: records, eager bytes and streams through mapped arenas") {
  run_scenario({"2 ranks on one node", 2, 2, "shm", false});
  run_scenario({"3 ranks on one node", 3, 3, "shm", false});
}

TEST_CASE("fabric channels over an unordered fabric (reorder shim)") {
  run_scenario({"2 ranks as 2 nodes, tcp", 2, 1, "tcp", true});
  run_scenario({"2 ranks as 2 nodes, shm", 2, 1, "shm", true});
}

TEST_CASE("both kinds at once: 3 ranks as nodes of 2 and 1") {
  run_scenario({"3 ranks, 2 per node, tcp", 3, 2, "tcp", true});
}

TEST_CASE("hierarchical: counterparts over the fabric, relay lanes under their keys (reorder)") {
  Scenario two_by_two{"2 nodes x 2, tcp", 4, 2, "tcp", true};
  two_by_two.hierarchical = true;
  run_scenario(two_by_two);
  Scenario three_by_two{"3 nodes x 2, tcp", 6, 2, "tcp", true};
  three_by_two.hierarchical = true;
  run_scenario(three_by_two);
  // A smaller last node: per rank, whatever was asked for.
  Scenario uneven{"3 ranks, 2 per node, tcp", 3, 2, "tcp", true};
  uneven.hierarchical = true;
  run_scenario(uneven);
}

TEST_CASE("fabric channels whose writes a device's stream hands to the proxies") {
  run_scenario({"2 ranks as 2 nodes, tcp", 2, 1, "tcp", true, true});
  run_scenario({"3 ranks, 2 per node, tcp", 3, 2, "tcp", true, true});
  run_scenario({"2 ranks on one node (no route)", 2, 2, "shm", false, true});
}

TEST_CASE("sizes that differ between ranks are refused on every rank, naming the rank") {
  std::vector<control::testing::RankBody> bodies;
  for (int r = 0; r < 2; ++r)
    bodies.push_back([r](control::Bootstrap::Options options) {
      auto boot = control::Bootstrap::connect(options);
      proxy::SessionConfig config;
      config.sizes = {.ranks = 2,
                      .ranks_per_node = 2,
                      .record_bytes = 128,
                      .eager_bytes = 0,
                      .data_bytes = static_cast<uint64_t>(r == 0 ? 64 << 10 : 128 << 10),
                      .staging_bytes = 0,
                      .chunk_bytes = 4096};
      (void)Session::open(*boot, config);
    });
  auto outcomes = control::testing::run_bodies(bodies, 2, std::chrono::milliseconds(10000));
  for (const auto& o : outcomes) {
    CHECK_FALSE(o.ok);
    CHECK(o.error.find("every rank must pass the same") != std::string::npos);
  }
}

TEST_CASE("an ep.internode that differs between ranks is refused on every rank, naming it") {
  std::vector<control::testing::RankBody> bodies;
  for (int r = 0; r < 4; ++r)
    bodies.push_back([r](control::Bootstrap::Options options) {
      auto boot = control::Bootstrap::connect(options);
      proxy::SessionConfig config;
      config.sizes = {
          .ranks = 4,
          .ranks_per_node = 2,
          .record_bytes = 128,
          .eager_bytes = 0,
          .data_bytes = 64 << 10,
          .staging_bytes = 16 << 10,
          .chunk_bytes = 4096,
          .internode = r == 3 ? proxy::Internode::per_rank : proxy::Internode::hierarchical};
      config.fabric = fabric::testing::options_for("tcp", boot->rank(), 1, false, 11);
      (void)Session::open(*boot, config);
    });
  auto outcomes = control::testing::run_bodies(bodies, 4, std::chrono::milliseconds(10000));
  for (const auto& o : outcomes) {
    CHECK_FALSE(o.ok);
    CHECK(o.error.find("ep.internode") != std::string::npos);
  }
}
