// Chunk stream arithmetic: every rank must derive the same slots and chunk counts.
#include "integrations/normal/chunk_plan.hpp"

#include "common/error.hpp"
#include "proxy/session/arena_layout.hpp"

#include <doctest/doctest.h>

namespace ep = proxyep::gpu_side::ep;

using namespace proxyep;
namespace ep = proxyep::gpu_side::ep;
using namespace proxyep::integrations::normal;

namespace {

ep::RowFormat bf16_row(uint32_t hidden, uint32_t topk) {
  ep::RowFormat f;
  f.hidden_bytes = hidden * 2;
  f.topk = topk;
  f.weights = topk;
  f.src_index = 1;
  return f;
}

proxy::ArenaLayout layout(int rank, int ranks, int per_node, uint64_t data, uint64_t staging) {
  return proxy::ArenaLayout(rank, {.ranks = ranks,
                                   .ranks_per_node = per_node,
                                   .record_bytes = 256,
                                   .eager_bytes = 0,
                                   .data_bytes = data,
                                   .staging_bytes = staging,
                                   .chunk_bytes = 1 << 20});
}

}  // namespace

TEST_CASE("rows_per_slot is the largest count whose layout fits the slot") {
  auto f = bf16_row(7168, 8);  // 14336 + 64 + 32 + 4 = 14436 bytes per row
  CHECK(f.row_bytes() == 14436);
  CHECK(rows_per_slot(14436, f) == 0);  // areas are padded to 64 bytes
  for (uint64_t slot : {uint64_t{15000}, uint64_t{1} << 20, uint64_t{123456}}) {
    uint64_t rows = rows_per_slot(slot, f);
    CHECK(ep::RowAreas::of(rows, f).end <= slot);
    CHECK(ep::RowAreas::of(rows + 1, f).end > slot);
  }
  CHECK(rows_per_slot(1 << 20, f) == 72);
}

TEST_CASE("one node: a pair that fits its share moves as one chunk, a larger one in halves") {
  auto l = layout(0, 4, 4, 3 * (uint64_t{1} << 20), 0);
  const proxy::SlotGeometry g = l.node_slots();
  CHECK(g.whole_bytes == uint64_t{1} << 20);
  auto f = bf16_row(2048, 4);
  auto whole = plan_in_slots(100, f, g);
  CHECK(whole.chunks == 1);
  CHECK(whole.window == 1);
  CHECK(whole.rows_in(0) == 100);
  auto halves = plan_in_slots(1000, f, g);
  CHECK(halves.window == 2);
  CHECK(halves.slot_bytes == uint64_t{1} << 19);
  CHECK(halves.rows_per_chunk == rows_per_slot(uint64_t{1} << 19, f));
  CHECK(halves.chunks == (1000 + halves.rows_per_chunk - 1) / halves.rows_per_chunk);
  uint64_t rows = 0;
  for (uint64_t j = 0; j < halves.chunks; ++j)
    rows += halves.rows_in(j);
  CHECK(rows == 1000);
  CHECK(plan_in_slots(0, f, g).chunks == 0);
}

TEST_CASE("between nodes: chunks of the agreed slot size, never one whole-share chunk") {
  auto l = layout(0, 3, 2, 8 << 20, 3 << 20);
  auto f = bf16_row(7168, 8);
  auto plan = plan_in_slots(500, f, l.remote_slots());
  CHECK(plan.rows_per_chunk == 72);
  CHECK(plan.chunks == 7);
  CHECK(plan.window == 4);
  CHECK(plan.rows_in(6) == 500 - 6 * 72);
  CHECK(plan_in_slots(1, f, l.remote_slots()).slot_bytes == uint64_t{1} << 20);
}

TEST_CASE(
    "DeepEP's RDMA chunk sizes shrink the chunks and the window between nodes, never grow them") {
  const auto f = bf16_row(1024, 8);  // 2148 bytes per row
  const auto remote = layout(0, 4, 2, 64 << 20, 32 << 20).remote_slots();
  const ChunkPlan slots = plan_in_slots(1000, f, remote);
  REQUIRE(slots.rows_per_chunk > 20);
  REQUIRE(slots.window >= 2);
  // Config(rdma_send = 6, rdma_recv = 12): chunks of 6 rows, 2 in flight.
  const ChunkPlan deep = limit_chunks(slots, {.send_rows = 6, .recv_rows = 12});
  CHECK(deep.rows == 1000);
  CHECK(deep.rows_per_chunk == 6);
  CHECK(deep.chunks == 167);
  CHECK(deep.window == 2);
  CHECK(deep.slot_bytes == slots.slot_bytes);  // the receiver's slots do not move
  CHECK(deep.rows_in(166) == 4);
  // Larger than the slots allow: the slots win.
  const ChunkPlan big = limit_chunks(slots, {.send_rows = 1u << 20, .recv_rows = 1u << 30});
  CHECK(big.rows_per_chunk == slots.rows_per_chunk);
  CHECK(big.chunks == slots.chunks);
  CHECK(big.window == slots.window);
  // Fewer rows in flight than a chunk: still one chunk at a time.
  CHECK(limit_chunks(slots, {.send_rows = 6, .recv_rows = 6}).window == 1);
  // None, eager and empty plans are unchanged.
  CHECK(limit_chunks(slots, {}).rows_per_chunk == slots.rows_per_chunk);
  const ChunkPlan eager = ChunkPlan::whole(3, 4096, /*eager=*/true);
  CHECK(limit_chunks(eager, {.send_rows = 1, .recv_rows = 2}).chunks == 1);
  CHECK(limit_chunks(plan_in_slots(0, f, remote), {.send_rows = 1, .recv_rows = 2}).chunks == 0);
}

TEST_CASE("rows that fit the eager slot travel with the record") {
  auto l = layout(0, 2, 1, 8 << 20, 8 << 20);
  auto f = bf16_row(256, 2);
  const uint64_t eager = 128 << 10;
  CHECK_FALSE(fits_eager(0, f, eager));  // nothing to send: no eager write either
  auto small = plan_stream(10, f, l.remote_slots(), eager);
  CHECK(small.eager);
  CHECK(small.chunks == 1);
  CHECK(small.slot_bytes == eager);
  auto large = plan_stream(1000, f, l.remote_slots(), eager);
  CHECK_FALSE(large.eager);
  CHECK(large.chunks >= 1);
  CHECK_FALSE(plan_stream(10, f, l.remote_slots(), 0).eager);  // ep.eager_bytes = 0: never
}

TEST_CASE("a row that fits no slot is reported before anything is sent") {
  auto l = layout(0, 2, 1, 64 << 10, 64 << 10);
  std::string why;
  CHECK(fits_one_row(bf16_row(2048, 8), l.node_slots(), &why));
  CHECK(fits_one_row(bf16_row(2048, 8), l.remote_slots(), &why));
  // 32 KiB rows: they fit a 64 KiB chunk between nodes, not half of a node peer's share.
  CHECK(fits_one_row(bf16_row(16384, 8), l.remote_slots(), &why));
  CHECK_FALSE(fits_one_row(bf16_row(16384, 8), l.node_slots(), &why));
  CHECK(why.find("does not fit") != std::string::npos);
  CHECK_FALSE(fits_one_row(bf16_row(65536, 8), l.remote_slots(), &why));
}
