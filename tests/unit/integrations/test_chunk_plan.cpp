// Chunk stream arithmetic: every rank must derive the same slots and chunk counts.
#include "integrations/chunk_plan.hpp"

#include "common/error.hpp"

#include <doctest/doctest.h>

namespace ep = proxyep::gpu_side::ep;

using namespace proxyep;

namespace {

ep::RowFormat bf16_row(uint32_t hidden, uint32_t topk) {
  ep::RowFormat f;
  f.hidden_bytes = hidden * 2;
  f.topk = topk;
  f.weights = topk;
  f.src_index = 1;
  return f;
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
  auto g = StreamGeometry::make(0, 4, 4, 3 * (uint64_t{1} << 20), 0, 1 << 20);
  CHECK(g.source_area == uint64_t{1} << 20);
  CHECK(g.remote_slot == 0);
  auto f = bf16_row(2048, 4);
  auto whole = plan_node_stream(100, f, g);
  CHECK(whole.chunks == 1);
  CHECK(whole.window == 1);
  CHECK(whole.rows_in(0) == 100);
  auto halves = plan_node_stream(1000, f, g);
  CHECK(halves.window == 2);
  CHECK(halves.slot_bytes == uint64_t{1} << 19);
  CHECK(halves.rows_per_chunk == rows_per_slot(uint64_t{1} << 19, f));
  CHECK(halves.chunks == (1000 + halves.rows_per_chunk - 1) / halves.rows_per_chunk);
  uint64_t rows = 0;
  for (uint64_t j = 0; j < halves.chunks; ++j)
    rows += halves.rows_in(j);
  CHECK(rows == 1000);
  CHECK(plan_node_stream(0, f, g).chunks == 0);
}

TEST_CASE("between nodes: one chunk size for all, windows are powers of two") {
  // 3 ranks, 2 per node: ranks 0 and 1 have one remote peer, rank 2 has two.
  const uint64_t data = 8 << 20, staging = 3 << 20;
  auto g0 = StreamGeometry::make(0, 3, 2, data, staging, 1 << 20);
  auto g2 = StreamGeometry::make(2, 3, 2, data, staging, 1 << 20);
  CHECK(g0.remote_slot == g2.remote_slot);  // senders and receivers agree
  CHECK(g0.remote_slot == uint64_t{1} << 20);
  CHECK(g0.remote_window == g2.remote_window);
  CHECK(g0.remote_window == 4);  // 4 MiB share / 1 MiB slots
  CHECK(g0.stage_window == 2);   // 3 MiB for one peer -> 3 slots, rounded down to 2
  CHECK(g2.stage_window == 1);   // 1.5 MiB per peer -> 1 slot
  // The smallest staging share bounds the chunk: 1 MiB / 2 peers.
  auto small = StreamGeometry::make(0, 3, 2, data, 1 << 20, 1 << 20);
  CHECK(small.remote_slot == uint64_t{1} << 19);
  auto f = bf16_row(7168, 8);
  auto plan = plan_remote_stream(500, f, g0);
  CHECK(plan.rows_per_chunk == 72);
  CHECK(plan.chunks == 7);
  CHECK(plan.rows_in(6) == 500 - 6 * 72);
}

TEST_CASE("a row that fits no slot is reported before anything is sent") {
  auto g = StreamGeometry::make(0, 2, 1, 64 << 10, 64 << 10, 1 << 20);
  std::string why;
  CHECK(fits_one_row(bf16_row(2048, 8), g, true, &why));
  CHECK_FALSE(fits_one_row(bf16_row(16384, 8), g, true, &why));
  CHECK(why.find("does not fit") != std::string::npos);
  CHECK_THROWS_AS(StreamGeometry::make(0, 2, 1, 64 << 10, 0, 1 << 20), Error);
}
