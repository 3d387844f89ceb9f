// Multi-process integration test of the proxy path (run under `proxyep launch`, exit 0 = pass).
// Every rank sends a block to every rank (itself included) per round, as descriptors pushed by
// several producer threads into one or more rings; its proxy engine posts them as RMA writes with
// counter immediates (epoch = round, key = source rank). Receivers wait for one flag per source
// through the engine, then check every byte; begin_epoch() then checks that every key of the
// round before was drained exactly (no lost, duplicated or stray immediate). Block and chunk
// sizes come from a shared seed, zero-length blocks (a pure signal) included.
//
// --die-rank R --die-after N: rank R calls _exit(0) after pushing N descriptors (a peer that
// vanishes mid-stream, exit code 0 so the launcher leaves the others running). The survivors
// must fail within their timeouts with an error naming rank R, and exit 1.
#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/host_memory.hpp"
#include "common/keep_forever.hpp"
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "control/counter_bank.hpp"
#include "control/signal_router.hpp"
#include "fabric/fabric.hpp"
#include "gpu_side/doorbell.hpp"
#include "gpu_side/ring.hpp"
#include "proxy/engine/proxy_engine.hpp"
#include "proxy/engine/region_exchange.hpp"
#include "reorder_check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

using namespace proxyep;

namespace {

constexpr uint32_t kSendRegion = 0;
constexpr uint32_t kRecvRegion = 1;
constexpr uint64_t kRingSlots = 256;

struct Options {
  std::string provider = "shm";
  bool reorder = false;
  int rounds = 3, rings = 2, producers = 3;
  uint64_t seed = 1;
  size_t max_block = 128 * 1024;
  int64_t timeout_ms = 60000;
  int die_rank = -1;
  int64_t die_after = 0;
};

struct Plan {
  size_t block = 0;
  size_t chunk = 1;
  size_t chunks() const { return block == 0 ? 1 : (block + chunk - 1) / chunk; }
};

Plan plan_for(const Options& o, int round, int src, int dst) {
  std::mt19937_64 rng(o.seed * 1000003u + static_cast<uint64_t>(round) * 7919u +
                      static_cast<uint64_t>(src) * 131u + static_cast<uint64_t>(dst));
  Plan plan;
  int shape = static_cast<int>(rng() % 6);
  plan.block = shape == 0 ? 0 : shape == 1 ? 1 + rng() % 64 : 1 + rng() % o.max_block;
  plan.chunk = 1 + rng() % (16 * 1024);
  return plan;
}

uint8_t pattern(int src, int dst, int round, size_t i) {
  return static_cast<uint8_t>((i * 2654435761u) ^ (src * 37 + dst * 11 + round * 101));
}

struct Rank {
  int me = 0, n = 1;
  std::vector<uint8_t> send, recv;
  std::unique_ptr<fabric::MemoryRegion> send_region, recv_region;
  std::vector<HostMemory> ring_memory;
  std::vector<gpu_side::Ring> rings;
  std::vector<std::unique_ptr<gpu_side::Doorbell>> doorbells;
  std::unique_ptr<control::CounterBank> bank;
  control::SignalRouter router;
  std::unique_ptr<proxy::ProxyEngine> engine;
  std::atomic<int64_t> pushed{0};
};

// Producer thread `t`: the destinations k = t, t + P, ... (staggered from this rank), chunk by
// chunk, into ring t mod R.
void produce(Rank& rank, const Options& o, int round, int t) {
  gpu_side::RingProducer producer(
      rank.rings[static_cast<size_t>(t % o.rings)],
      {.doorbell = rank.doorbells[static_cast<size_t>(t % o.rings)].get()});
  auto deadline = Deadline::after_ms(o.timeout_ms);
  for (int k = t; k < rank.n; k += o.producers) {
    int dst = (rank.me + k) % rank.n;
    Plan plan = plan_for(o, round, rank.me, dst);
    for (size_t c = 0; c < plan.chunks(); ++c) {
      size_t off = c * plan.chunk;
      size_t len = std::min(plan.chunk, plan.block - std::min(off, plan.block));
      gpu_side::Descriptor d;
      d.op = len == 0 ? gpu_side::Op::signal : gpu_side::Op::write_imm;
      d.dst_rank = static_cast<uint32_t>(dst);
      d.local_region = kSendRegion;
      d.remote_region = kRecvRegion;
      d.src_offset = len == 0 ? 0 : static_cast<uint64_t>(dst) * o.max_block + off;
      d.dst_offset = len == 0 ? 0 : static_cast<uint64_t>(rank.me) * o.max_block + off;
      d.length = len;
      d.cookie = c;
      d.imm = control::imm::encode_counter(static_cast<uint64_t>(round),
                                           static_cast<uint32_t>(rank.me));
      if (rank.me == o.die_rank && rank.pushed.fetch_add(1) >= o.die_after) {
        std::fprintf(stderr, "proxy_alltoall: rank %d: vanishing mid-stream (test)\n", rank.me);
        ::_exit(0);  // the test's peer failure; exit code 0 keeps the launcher from stopping others
      }
      if (producer.push(d, deadline) != Status::ok)
        fail("proxy_alltoall", "round {}: ring stayed full past the deadline", round);
    }
  }
  (void)producer.flush(deadline);
}

void run_round(control::Bootstrap& boot, Rank& rank, const Options& o, int round) {
  std::fill(rank.recv.begin(), rank.recv.end(), 0);
  std::vector<Plan> in(static_cast<size_t>(rank.n));
  for (int p = 0; p < rank.n; ++p) {
    in[p] = plan_for(o, round, p, rank.me);
    Plan out = plan_for(o, round, rank.me, p);
    for (size_t i = 0; i < out.block; ++i)
      rank.send[static_cast<size_t>(p) * o.max_block + i] = pattern(rank.me, p, round, i);
    if (rank.bank->set_expected(static_cast<uint64_t>(round), static_cast<uint32_t>(p),
                                in[p].chunks()) != Status::ok)
      fail("proxy_alltoall", "round {}: {}", round, rank.bank->last_error());
  }
  boot.barrier("proxy_alltoall(round start)");  // every receive arena is clear
  std::vector<std::thread> producers;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(o.producers));
  for (int t = 0; t < o.producers; ++t)
    producers.emplace_back([&, t] {
      try {
        produce(rank, o, round, t);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  for (auto& thread : producers)
    thread.join();
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);
  // One wait for every source, so a timeout names all the ranks whose writes are missing.
  auto deadline = Deadline::after_ms(o.timeout_ms);
  auto missing = [&] {
    std::vector<int> ranks;
    for (int p = 0; p < rank.n; ++p)
      if (!rank.bank->ready(static_cast<uint64_t>(round), static_cast<uint32_t>(p)))
        ranks.push_back(p);
    return ranks;
  };
  rank.engine->wait_until([&] { return missing().empty(); }, deadline,
                          [&] {
                            return fmt::format(
                                "round {}: the writes from rank(s) {} did not all arrive", round,
                                fmt::join(missing(), ", "));
                          });
  for (int p = 0; p < rank.n; ++p) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < in[p].block; ++i) {
      uint8_t got = rank.recv[static_cast<size_t>(p) * o.max_block + i];
      if (got != pattern(p, rank.me, round, i) && bad++ == 0) first = i;
    }
    if (bad != 0)
      fail("proxy_alltoall",
           "round {}: {} of the {} bytes from rank {} are wrong, the first at offset {} (chunks "
           "of {} bytes)",
           round, bad, in[p].block, p, first, in[p].chunk);
  }
  rank.engine->quiet(deadline);  // our sends are done before the send arena is rewritten
  boot.barrier("proxy_alltoall(round done)");
  if (rank.bank->begin_epoch(static_cast<uint64_t>(round) + 1) != Status::ok)
    fail("proxy_alltoall", "round {}: {}", round, rank.bank->last_error());
}

void run(const Options& o) {
  params::fabric_provider.set(o.provider);
  params::fabric_reorder.set(o.reorder);
  params::fabric_reorder_seed.set(static_cast<int64_t>(o.seed));
  auto boot = control::Bootstrap::from_environment();
  auto fab = fabric::Fabric::open(fabric::FabricOptions::from_params(boot->rank()));
  boot->set_progress([&fab] { fab->progress(); });
  fab->connect(boot->allgather(fab->addresses(), "proxy_alltoall(addresses)"));
  auto owned = std::make_unique<Rank>();
  Rank& rank = *owned;
  // A proxy thread that stop() had to detach (stuck inside the provider after a peer died) may
  // still use the fabric and all it reaches: then both are kept for the rest of the process
  // (ProxyEngine::abandoned), as the Buffer's session does.
  struct KeepIfAbandoned {
    std::unique_ptr<fabric::Fabric>& fabric;
    std::unique_ptr<Rank>& rank;
    ~KeepIfAbandoned() {
      if (!rank->engine) return;
      rank->engine->stop();
      if (!rank->engine->abandoned()) return;
      (void)keep_forever(std::move(fabric));
      (void)keep_forever(std::move(rank));
    }
  } keep{fab, owned};
  rank.me = boot->rank();
  rank.n = boot->world_size();
  rank.send.assign(static_cast<size_t>(rank.n) * o.max_block, 0);
  rank.recv.assign(static_cast<size_t>(rank.n) * o.max_block, 0);
  rank.send_region = fab->register_memory(rank.send.data(), rank.send.size());
  rank.recv_region = fab->register_memory(rank.recv.data(), rank.recv.size());
  rank.bank = std::make_unique<control::CounterBank>(static_cast<uint32_t>(rank.n));
  rank.router.attach_counters(*rank.bank);
  rank.engine = std::make_unique<proxy::ProxyEngine>(*fab, rank.me, rank.n, rank.router);
  rank.engine->watch_peers(boot->peer_watch());  // a rank that dies is named at once
  proxy::share_region(*boot, rank.engine->regions(), kSendRegion, *rank.send_region,
                      "proxy_alltoall");
  proxy::share_region(*boot, rank.engine->regions(), kRecvRegion, *rank.recv_region,
                      "proxy_alltoall");
  for (int r = 0; r < o.rings; ++r) {
    rank.ring_memory.push_back(HostMemory::heap(gpu_side::Ring::bytes_for(kRingSlots)));
    rank.rings.push_back(gpu_side::Ring::create(rank.ring_memory.back().bytes(), kRingSlots));
    rank.doorbells.push_back(std::make_unique<gpu_side::Doorbell>());
    rank.engine->add_ring(rank.rings.back(), rank.doorbells.back().get());
  }
  boot->set_progress({});  // the proxy threads own the rails from here on
  rank.engine->start();
  for (int round = 0; round < o.rounds; ++round)
    run_round(*boot, rank, o, round);
  auto stats = rank.engine->stats();
  rank.engine->stop();
  if (o.reorder)
    testing::require_reordered(*boot, testing::out_of_order(fab->reorder_stats()),
                               "proxy_alltoall");
  if (rank.me == 0)
    fmt::print(
        "proxy_alltoall: {} ranks, provider {}, reorder {}, {} rings x {} producers, {} "
        "rounds: OK\n",
        rank.n, fab->capabilities().provider, o.reorder ? "on" : "off", o.rings, o.producers,
        o.rounds);
  fmt::print(
      "rank {}: {} descriptors, {} writes posted and completed, {} received, {} waited "
      "for credits\n",
      rank.me, stats.descriptors, stats.completed, stats.remote, stats.backlogged);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"proxy all-to-all integration test (run under proxyep launch)"};
  Options o;
  app.add_option("--provider", o.provider);
  app.add_flag("--reorder", o.reorder, "reorder shim on");
  app.add_option("--rounds", o.rounds);
  app.add_option("--rings", o.rings, "descriptor rings per rank");
  app.add_option("--producers", o.producers, "producer threads per rank (share the rings)");
  app.add_option("--seed", o.seed);
  app.add_option("--max-block", o.max_block);
  app.add_option("--timeout-ms", o.timeout_ms);
  app.add_option("--die-rank", o.die_rank, "this rank vanishes mid-stream (_exit(0))");
  app.add_option("--die-after", o.die_after, "descriptors the dying rank pushes first");
  CLI11_PARSE(app, argc, argv);
  if (o.rings < 1 || o.producers < 1) {
    std::fprintf(stderr, "proxy_alltoall: --rings and --producers must be at least 1\n");
    return 2;
  }
  try {
    run(o);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "proxy_alltoall: error: %s\n", e.what());
    return 1;
  }
}
