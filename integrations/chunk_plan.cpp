// Chunk stream arithmetic (chunk_plan.hpp).
#include "integrations/chunk_plan.hpp"

#include "common/error.hpp"

#include <fmt/format.h>

#include <bit>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep {

namespace {

uint64_t floor64(uint64_t bytes) {
  return bytes / ep::kAreaAlignment * ep::kAreaAlignment;
}

uint32_t window_for(uint64_t area, uint64_t slot) {
  uint64_t slots = std::min<uint64_t>(area / slot, kMaxStreamWindow);
  return slots == 0 ? 0 : static_cast<uint32_t>(std::bit_floor(slots));
}

// Ranks on other nodes than `rank`.
int remote_peers(int rank, int ranks, int ranks_per_node) {
  return ranks - node_size(rank, ranks, ranks_per_node);
}

}  // namespace

int node_size(int rank, int ranks, int ranks_per_node) {
  const int first = rank / ranks_per_node * ranks_per_node;
  return std::min(ranks, first + ranks_per_node) - first;
}

StreamGeometry StreamGeometry::make(int rank, int ranks, int ranks_per_node, uint64_t data_bytes,
                                    uint64_t staging_bytes, uint64_t chunk_bytes) {
  StreamGeometry g;
  g.source_area = floor64(data_bytes / static_cast<uint64_t>(std::max(1, ranks - 1)));
  if (ranks <= ranks_per_node) return g;
  // One chunk size for every stream between nodes: it must fit the smallest staging share.
  uint64_t slot = std::min(chunk_bytes, g.source_area);
  for (int r = 0; r < ranks; ++r) {
    int remote = remote_peers(r, ranks, ranks_per_node);
    slot = std::min(slot, staging_bytes / static_cast<uint64_t>(remote));
  }
  g.remote_slot = floor64(slot);
  require(g.remote_slot > 0, "buffer",
          "num_nvl_bytes ({}) or num_rdma_bytes ({}) is too small to give each of the {} ranks "
          "one chunk slot",
          data_bytes, staging_bytes, ranks);
  g.remote_window = window_for(g.source_area, g.remote_slot);
  g.stage_area = floor64(staging_bytes / static_cast<uint64_t>(std::max(
                                             1, remote_peers(rank, ranks, ranks_per_node))));
  g.stage_window = window_for(g.stage_area, g.remote_slot);
  return g;
}

uint64_t rows_per_slot(uint64_t slot_bytes, const ep::RowFormat& format) {
  const uint64_t row = format.row_bytes();
  const uint64_t padding = ep::RowAreas::bound(0, format);
  if (row == 0 || slot_bytes < padding + row) return 0;
  uint64_t rows = (slot_bytes - padding) / row;  // fits by the bound; the exact layout may fit more
  while (ep::RowAreas::of(rows + 1, format).end <= slot_bytes)
    ++rows;
  return rows;
}

namespace {

ChunkPlan plan_in_slots(uint64_t rows, const ep::RowFormat& format, uint64_t slot,
                        uint32_t window) {
  ChunkPlan plan;
  plan.rows = rows;
  plan.slot_bytes = slot;
  plan.window = window;
  plan.rows_per_chunk = rows_per_slot(slot, format);
  if (rows > 0 && plan.rows_per_chunk > 0)
    plan.chunks = (rows + plan.rows_per_chunk - 1) / plan.rows_per_chunk;
  return plan;
}

}  // namespace

ChunkPlan plan_node_stream(uint64_t rows, const ep::RowFormat& format,
                           const StreamGeometry& geometry) {
  if (rows > 0 && ep::RowAreas::of(rows, format).end <= geometry.source_area)
    return ChunkPlan::whole(rows, geometry.source_area);
  return plan_in_slots(rows, format, floor64(geometry.source_area / 2), 2);
}

ChunkPlan plan_remote_stream(uint64_t rows, const ep::RowFormat& format,
                             const StreamGeometry& geometry) {
  return plan_in_slots(rows, format, geometry.remote_slot, geometry.remote_window);
}

bool fits_one_row(const ep::RowFormat& format, const StreamGeometry& geometry, bool multi_node,
                  std::string* why) {
  const uint64_t node_slot = floor64(geometry.source_area / 2);
  if (rows_per_slot(node_slot, format) == 0) {
    if (why)
      *why = fmt::format(
          "a row of {} bytes does not fit a chunk slot of {} bytes (half of each source's "
          "{}-byte share of num_nvl_bytes): the Buffer is too small for this hidden size "
          "(Buffer::nvl_bytes_hint)",
          format.row_bytes(), node_slot, geometry.source_area);
    return false;
  }
  if (multi_node && rows_per_slot(geometry.remote_slot, format) == 0) {
    if (why)
      *why = fmt::format(
          "a row of {} bytes does not fit a {}-byte chunk between nodes (ep.chunk_bytes, bounded "
          "by each peer's share of num_nvl_bytes and num_rdma_bytes): the Buffer is too small "
          "for this hidden size",
          format.row_bytes(), geometry.remote_slot);
    return false;
  }
  return true;
}

}  // namespace proxyep
