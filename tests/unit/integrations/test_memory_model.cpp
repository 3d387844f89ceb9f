// The memory model (integrations/memory_model.hpp) against the layout the session really opens:
// its items add up to the arena and staging sizes of the same options, item by item as the
// formulas say, for normal and low-latency shapes; and what grows with the ranks does.
#include "common/params.hpp"
#include "integrations/buffer.hpp"
#include "integrations/memory_model.hpp"
#include "integrations/session_sizes.hpp"
#include "proxy/session/arena_layout.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>

using namespace proxyep;
using namespace proxyep::integrations;

namespace {

std::map<std::string, uint64_t> by_name(const std::vector<MemoryItem>& items) {
  std::map<std::string, uint64_t> out;
  for (const auto& item : items)
    out[item.name] = item.bytes;
  return out;
}

uint64_t resident(const std::vector<MemoryItem>& items) {
  uint64_t sum = 0;
  for (const auto& item : items)
    sum += item.resident ? item.bytes : 0;
  return sum;
}

}  // namespace

TEST_CASE("memory model: normal mode across nodes adds up to the session's arena and staging") {
  MemoryShape shape{
      .ranks = 128, .ranks_per_node = 8, .tokens = 64, .hidden = 1024, .topk = 8, .experts = 128};
  const auto items = by_name(buffer_memory(shape));
  BufferOptions opts;
  opts.num_nvl_bytes = Buffer::nvl_bytes_hint(64, 2048, 8, 128);
  opts.num_rdma_bytes = Buffer::rdma_bytes_hint(64, 2048, 8, 128, 8);
  const proxy::SessionSizes sizes = session_sizes(opts, 128, 8);
  const proxy::ArenaLayout layout(0, sizes);
  CHECK(items.at("arena.records") + items.at("arena.words") + items.at("arena.eager_slots") +
            items.at("arena.data") ==
        layout.arena_bytes());
  CHECK(items.at("staging.records") + items.at("staging.eager_slots") + items.at("staging.data") ==
        layout.staging_bytes());
  CHECK(items.at("arena.records") == 2 * 128 * sizes.record_bytes);
  CHECK(items.at("arena.words") == 4 * 128 * 64);  // one cache line per stream word
  CHECK(items.at("staging.eager_slots") == 2 * 128 * sizes.eager_bytes);
  CHECK(items.at("arena.data") == static_cast<uint64_t>(opts.num_nvl_bytes));
  CHECK(items.at("staging.data") == static_cast<uint64_t>(opts.num_rdma_bytes));
  CHECK(items.contains("landing"));
}

TEST_CASE("memory model: one node has no staging; low-latency slots are the LL buffer") {
  MemoryShape node{.ranks = 8, .ranks_per_node = 8};
  const auto one_node = by_name(buffer_memory(node));
  CHECK_FALSE(one_node.contains("staging.data"));
  CHECK_FALSE(one_node.contains("staging.records"));

  MemoryShape ll{.ranks = 16,
                 .ranks_per_node = 8,
                 .tokens = 16,
                 .hidden = 1024,
                 .topk = 8,
                 .experts = 128,
                 .low_latency = true};
  const auto items = by_name(buffer_memory(ll));
  BufferOptions opts;
  opts.low_latency_mode = true;
  opts.num_nvl_bytes = 0;
  opts.num_rdma_bytes = Buffer::get_low_latency_rdma_size_hint(16, 1024, 16, 128);
  const proxy::SessionSizes sizes = session_sizes(opts, 16, 8);
  const proxy::ArenaLayout layout(0, sizes);
  CHECK_FALSE(items.contains("arena.data"));
  CHECK_FALSE(items.contains("landing"));
  CHECK(items.at("arena.records") + items.at("arena.words") + items.at("arena.eager_slots") ==
        layout.arena_bytes());
  CHECK(items.at("staging.records") + items.at("staging.eager_slots") == layout.staging_bytes());
  // The LL buffer: both halves of num_rdma_bytes' slots, in the arena and again in staging.
  CHECK(items.at("staging.eager_slots") >= static_cast<uint64_t>(opts.num_rdma_bytes) - 64 * 32);
}

TEST_CASE("memory model: what grows with the ranks grows, and bad shapes are refused") {
  MemoryShape small{.ranks = 64, .ranks_per_node = 8};
  MemoryShape large{.ranks = 256, .ranks_per_node = 8};
  const auto a = by_name(buffer_memory(small)), b = by_name(buffer_memory(large));
  CHECK(b.at("arena.records") > 4 * a.at("arena.records"));  // R records of a size growing with R
  // The eager slots do not: both groups spend the per-area budget (ep.eager_budget_bytes).
  CHECK(b.at("arena.eager_slots") <= a.at("arena.eager_slots"));
  CHECK(resident(buffer_memory(large)) > resident(buffer_memory(small)));
  MemoryShape bad{.ranks = 0};
  CHECK_THROWS_AS(buffer_memory(bad), Error);
}

TEST_CASE("memory model: each pair's eager slot comes from the per-area budget") {
  BufferOptions opts;
  opts.num_nvl_bytes = 1 << 20;
  opts.num_rdma_bytes = 1 << 20;
  const uint64_t budget = static_cast<uint64_t>(params::ep_eager_budget_bytes.get());
  const uint64_t cap = static_cast<uint64_t>(params::ep_eager_bytes.get());
  // Small groups keep the per-pair cap; large ones split the budget over their 2R slots.
  CHECK(session_sizes(opts, 16, 8).eager_limit == cap);
  for (int ranks : {128, 256, 1024, 4096}) {
    const proxy::SessionSizes sizes = session_sizes(opts, ranks, 8);
    CAPTURE(ranks);
    CHECK(sizes.eager_limit < cap);
    CHECK(sizes.eager_limit % proxy::kSlotAlignment == 0);
    CHECK(2 * static_cast<uint64_t>(ranks) * sizes.eager_bytes <= budget);
    CHECK(2 * static_cast<uint64_t>(ranks) * (sizes.eager_limit + proxy::kSlotAlignment) > budget);
  }
  // A budget of 0 turns eager rows off, as ep.eager_bytes = 0 does.
  params::ep_eager_budget_bytes.set(0);
  CHECK(session_sizes(opts, 16, 8).eager_limit == 0);
  params::ep_eager_budget_bytes.reset();
}
