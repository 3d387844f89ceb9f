// Multi-process integration test of the fabric layer (fabtests style: one binary per rank,
// started by `proxyep launch`, exit code 0 = pass). Every rank writes a block to every rank
// (itself included) as chunks of RMA writes with immediate data; block and chunk sizes are
// drawn per (source, destination, round) from a shared seed, including empty blocks and sizes
// that are not multiples of anything. Receivers count remote completions per source (the only
// proof of arrival on an unordered transport), check every immediate arrives exactly once, then
// check every byte. Run with the reorder shim on and off, over shm and tcp;ofi_rxm.
#include "common/deadline.hpp"
#include "common/error.hpp"
#include "common/params.hpp"
#include "control/bootstrap.hpp"
#include "fabric/fabric.hpp"
#include "reorder_check.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <random>
#include <vector>

using namespace proxyep;

namespace {

struct Plan {
  size_t block = 0;  // bytes from src to dst this round
  size_t chunk = 1;  // bytes per write
  size_t chunks() const {
    return block == 0 ? 1 : (block + chunk - 1) / chunk;
  }  // 1: a 0-byte write
};

Plan plan_for(uint64_t seed, int round, int src, int dst, size_t max_block) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(round) * 7919u +
                      static_cast<uint64_t>(src) * 131u + static_cast<uint64_t>(dst));
  Plan plan;
  int shape = static_cast<int>(rng() % 8);
  if (shape == 0)
    plan.block = 0;  // nothing to send: one zero-length write
  else if (shape == 1)
    plan.block = 1 + rng() % 64;  // tiny
  else
    plan.block = 1 + rng() % max_block;
  plan.chunk = 1 + rng() % (64 * 1024);
  return plan;
}

uint8_t pattern(int src, int dst, int round, size_t i) {
  return static_cast<uint8_t>((i * 2654435761u) ^ (src * 37 + dst * 11 + round * 101));
}

constexpr uint32_t kChunkBits = 20;
uint32_t imm_of(int src, size_t chunk) {
  return (static_cast<uint32_t>(src) << kChunkBits) | chunk;
}

void run_round(control::Bootstrap& boot, fabric::Fabric& fab, uint64_t seed, int round,
               size_t max_block, int64_t timeout_ms, size_t& writes, size_t& bytes) {
  const int me = boot.rank(), n = boot.world_size();
  std::vector<Plan> out(n), in(n);
  std::vector<size_t> send_off(n + 1, 0), recv_off(n + 1, 0);
  for (int p = 0; p < n; ++p) {
    out[p] = plan_for(seed, round, me, p, max_block);
    in[p] = plan_for(seed, round, p, me, max_block);
    send_off[p + 1] = send_off[p] + out[p].block;
    recv_off[p + 1] = recv_off[p] + in[p].block;
  }
  std::vector<uint8_t> send(std::max<size_t>(send_off[n], 1)),
      recv(std::max<size_t>(recv_off[n], 1), 0);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < out[p].block; ++i)
      send[send_off[p] + i] = pattern(me, p, round, i);
  auto send_mr = fab.register_memory(send.data(), send.size());
  auto recv_mr = fab.register_memory(recv.data(), recv.size());
  // Receivers tell senders where their block starts: the region descriptor plus our offsets.
  auto descs = boot.allgather(recv_mr->descriptor().serialize(), "alltoall(regions)");
  auto offs_bytes = boot.allgather(std::span(reinterpret_cast<const uint8_t*>(recv_off.data()),
                                             recv_off.size() * sizeof(size_t)),
                                   "alltoall(offsets)");

  std::vector<size_t> got(n, 0);
  std::vector<std::vector<bool>> seen(n);
  for (int p = 0; p < n; ++p)
    seen[p].assign(in[p].chunks(), false);
  size_t in_flight = 0;
  auto deadline = Deadline::after_ms(timeout_ms);
  fabric::Completion batch[64];
  auto poll_all = [&] {
    for (int r = 0; r < fab.num_rails(); ++r) {
      size_t count = 0;
      if (fab.rail(r).poll(batch, count) != Status::ok)
        fail("alltoall", "completion error on rail {}: {}", r, fab.rail(r).last_error());
      for (size_t i = 0; i < count; ++i) {
        if (batch[i].kind == fabric::Completion::Kind::local_write) {
          --in_flight;
          continue;
        }
        int src = static_cast<int>(batch[i].imm >> kChunkBits);
        size_t chunk = batch[i].imm & ((1u << kChunkBits) - 1);
        require(src < n && chunk < seen[src].size(), "alltoall", "bad immediate {:#x}",
                batch[i].imm);
        require(!seen[src][chunk], "alltoall", "chunk {} from rank {} delivered twice", chunk, src);
        seen[src][chunk] = true;
        ++got[src];
      }
    }
    if (deadline.expired()) fail("alltoall", "round {}: deadline passed", round);
  };

  size_t op = 0;
  for (int k = 0; k < n; ++k) {
    int dst = (me + k) % n;  // stagger destinations
    auto desc = fabric::RegionDescriptor::deserialize(descs[dst]);
    size_t base = reinterpret_cast<const size_t*>(offs_bytes[dst].data())[me];
    for (size_t c = 0; c < out[dst].chunks(); ++c, ++op) {
      size_t off = c * out[dst].chunk;
      size_t len = std::min(out[dst].chunk, out[dst].block - std::min(off, out[dst].block));
      int rail = static_cast<int>(op % fab.num_rails());
      fabric::WriteOp w;
      w.peer = dst;
      w.local = send.data() + send_off[dst] + off;
      w.local_desc = send_mr->local_desc(rail);
      w.length = len;
      w.remote = desc.target(rail, len ? base + off : 0);
      w.imm = imm_of(me, c);
      w.cookie = op;
      Status st;
      while ((st = fab.rail(rail).write(w)) == Status::again)
        poll_all();
      if (st != Status::ok)
        fail("alltoall", "write to rank {}: {}", dst, fab.rail(rail).last_error());
      ++in_flight;
      ++writes;
      bytes += len;
    }
  }
  auto complete = [&] {
    for (int p = 0; p < n; ++p)
      if (got[p] < in[p].chunks()) return false;
    return in_flight == 0;
  };
  while (!complete())
    poll_all();

  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < in[p].block; ++i)
      if (recv[recv_off[p] + i] != pattern(p, me, round, i))
        fail("alltoall", "round {}: byte {} of the block from rank {} is {:#x}, expected {:#x}",
             round, i, p, recv[recv_off[p] + i], pattern(p, me, round, i));
  // Nobody deregisters memory a peer may still be writing into.
  boot.barrier("alltoall(round done)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fabric all-to-all integration test (run under proxyep launch)"};
  std::string provider = "shm";
  bool reorder = false;
  int rounds = 3, rails = 1;
  uint64_t seed = 1;
  size_t max_block = 256 * 1024;
  int64_t timeout_ms = 60000;
  app.add_option("--provider", provider);
  app.add_flag("--reorder", reorder, "reorder shim on");
  app.add_option("--rounds", rounds);
  app.add_option("--rails", rails);
  app.add_option("--seed", seed);
  app.add_option("--max-block", max_block);
  app.add_option("--timeout-ms", timeout_ms);
  CLI11_PARSE(app, argc, argv);
  try {
    params::fabric_provider.set(provider);
    params::fabric_reorder.set(reorder);
    params::fabric_rails.set(rails);
    params::fabric_reorder_seed.set(static_cast<int64_t>(seed));
    auto boot = control::Bootstrap::from_environment();
    auto fab = fabric::Fabric::open(fabric::FabricOptions::from_params(boot->rank()));
    boot->set_progress([&fab] { fab->progress(); });
    auto addrs = boot->allgather(fab->addresses(), "alltoall(addresses)");
    fab->connect(addrs);
    size_t writes = 0, bytes = 0;
    for (int round = 0; round < rounds; ++round)
      run_round(*boot, *fab, seed, round, max_block, timeout_ms, writes, bytes);
    if (reorder)
      testing::require_reordered(*boot, testing::out_of_order(fab->reorder_stats()), "alltoall");
    if (boot->rank() == 0)
      fmt::print("alltoall: {} ranks, provider {}, reorder {}, {} rails, {} rounds: OK\n",
                 boot->world_size(), fab->capabilities().provider, reorder ? "on" : "off", rails,
                 rounds);
    fmt::print("rank {}: {} writes, {} bytes sent and verified at their targets\n", boot->rank(),
               writes, bytes);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "alltoall: error: %s\n", e.what());
    return 1;
  }
}
