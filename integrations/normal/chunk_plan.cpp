// Chunk stream arithmetic (chunk_plan.hpp).
#include "integrations/normal/chunk_plan.hpp"

#include "common/error.hpp"

#include <fmt/format.h>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

uint64_t rows_per_slot(uint64_t slot_bytes, const ep::RowFormat& format) {
  const uint64_t row = format.row_bytes();
  const uint64_t padding = ep::RowAreas::bound(0, format);
  if (row == 0 || slot_bytes < padding + row) return 0;
  uint64_t rows = (slot_bytes - padding) / row;  // fits by the bound; the exact layout may fit more
  while (ep::RowAreas::of(rows + 1, format).end <= slot_bytes)
    ++rows;
  return rows;
}

bool fits_eager(uint64_t rows, const ep::RowFormat& format, uint64_t eager_bytes) {
  return rows > 0 && ep::RowAreas::of(rows, format).end <= eager_bytes;
}

ChunkPlan plan_in_slots(uint64_t rows, const ep::RowFormat& format,
                        const proxy::SlotGeometry& geometry) {
  if (rows > 0 && ep::RowAreas::of(rows, format).end <= geometry.whole_bytes)
    return ChunkPlan::whole(rows, geometry.whole_bytes);
  ChunkPlan plan;
  plan.rows = rows;
  plan.slot_bytes = geometry.slot_bytes;
  plan.window = geometry.window;
  plan.rows_per_chunk = rows_per_slot(geometry.slot_bytes, format);
  if (rows > 0 && plan.rows_per_chunk > 0)
    plan.chunks = (rows + plan.rows_per_chunk - 1) / plan.rows_per_chunk;
  return plan;
}

ChunkPlan plan_stream(uint64_t rows, const ep::RowFormat& format,
                      const proxy::SlotGeometry& geometry, uint64_t eager_bytes) {
  if (fits_eager(rows, format, eager_bytes))
    return ChunkPlan::whole(rows, eager_bytes, /*eager=*/true);
  return plan_in_slots(rows, format, geometry);
}

ChunkPlan limit_chunks(ChunkPlan plan, FabricChunking chunking) {
  if (chunking.none() || plan.eager || plan.rows == 0 || plan.rows_per_chunk == 0) return plan;
  const uint64_t send = chunking.send_rows;
  if (plan.rows_per_chunk > send) {
    plan.rows_per_chunk = send;
    plan.chunks = (plan.rows + send - 1) / send;
  }
  // A whole-stream plan (one chunk, window 1) keeps its window; a slotted one gets DeepEP's.
  const uint64_t in_flight = std::max<uint64_t>(1, chunking.recv_rows / send);
  plan.window = static_cast<uint32_t>(std::min<uint64_t>(plan.window, in_flight));
  return plan;
}

FabricChunking fabric_chunking_of(const std::optional<Config>& config, std::string_view phase) {
  if (!config) return {};
  const int send = config->num_max_rdma_chunked_send_tokens;
  const int recv = config->num_max_rdma_chunked_recv_tokens;
  require(send > 0 && recv >= send, phase,
          "config: num_max_rdma_chunked_send_tokens ({}) must be positive and at most "
          "num_max_rdma_chunked_recv_tokens ({})",
          send, recv);
  return {.send_rows = static_cast<uint32_t>(send), .recv_rows = static_cast<uint32_t>(recv)};
}

bool fits_one_row(const ep::RowFormat& format, const proxy::SlotGeometry& geometry,
                  std::string* why) {
  if (rows_per_slot(geometry.slot_bytes, format) > 0) return true;
  if (why)
    *why = fmt::format(
        "a row of {} bytes does not fit a {}-byte chunk slot (slots are shares of num_nvl_bytes "
        "per source, halved between ranks of a node; between nodes also at most ep.chunk_bytes "
        "and a share of num_rdma_bytes per destination): the Buffer is too small for this "
        "hidden size (Buffer::nvl_bytes_hint, rdma_bytes_hint)",
        format.row_bytes(), geometry.slot_bytes);
  return false;
}

}  // namespace proxyep::integrations::normal
