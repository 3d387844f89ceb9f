// How the rows of one stream of a call travel: as one eager payload with the record, as one
// chunk, or as chunks through the peer's slots (proxy/session/arena_layout.hpp says where the slots
// are, the channel's SlotGeometry how large). Pure arithmetic, computed identically on every rank
// from values every rank agrees on (the session's sizes, the call's row counts and row format),
// so a sender always knows which slot of the receiver a chunk goes to.
//
// Chunk j carries rows [j * rows_per_chunk, ...) of the rows the source sends the destination in
// this call, laid out in its slot as gpu_side::ep::RowAreas of its own row count.
#pragma once

#include "gpu_side/ep/row_format.hpp"
#include "integrations/config.hpp"
#include "proxy/session/arena_layout.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace proxyep::integrations::normal {

// One stream of one call.
struct ChunkPlan {
  uint64_t rows = 0;
  uint64_t rows_per_chunk = 0;
  uint64_t chunks = 0;
  uint64_t slot_bytes = 0;  // distance between slots in the receiver's share
  uint32_t window = 1;
  bool eager = false;  // one chunk in the eager slot, sent with the record

  // All `rows` as one chunk in a slot of `slot_bytes` (window 1).
  static ChunkPlan whole(uint64_t rows, uint64_t slot_bytes, bool eager = false) {
    ChunkPlan plan;
    plan.rows = plan.rows_per_chunk = rows;
    plan.chunks = 1;
    plan.slot_bytes = slot_bytes;
    plan.eager = eager;
    return plan;
  }

  proxy::SlotShape shape() const { return {.slot_bytes = slot_bytes, .window = window}; }
  uint64_t first_row(uint64_t chunk) const { return chunk * rows_per_chunk; }
  uint64_t rows_in(uint64_t chunk) const {
    return std::min(rows_per_chunk, rows - first_row(chunk));
  }
};

// DeepEP's RDMA chunking (Config::num_max_rdma_chunked_send_tokens and _recv_tokens) on a
// stream between nodes: chunks of at most `send_rows` rows, and at most `recv_rows` rows (so
// recv_rows / send_rows chunks) in the receiver's slots at once. The slots still bound both: a
// chunk never outgrows a slot, nor the window the slots' count. 0 and 0: as the slots allow. The
// sender's travels in its notify record, so the receiver plans the same chunks.
struct FabricChunking {
  uint32_t send_rows = 0;
  uint32_t recv_rows = 0;

  bool operator==(const FabricChunking&) const = default;
  bool none() const { return send_rows == 0; }
};

// `plan` in `chunking`'s chunks (an eager plan, an empty one and chunking none(): unchanged).
ChunkPlan limit_chunks(ChunkPlan plan, FabricChunking chunking);

// A call's chunking of its streams to other nodes from the caller's Config (DeepEP's RDMA chunk
// sizes; none without a Config). Throws proxyep::Error(phase), before anything is sent, for one
// that breaks DeepEP's rules on them (a C++ caller may set the fields by hand).
FabricChunking fabric_chunking_of(const std::optional<Config>& config, std::string_view phase);

// Rows of `format` that fit `slot_bytes` (0 when not even one does).
uint64_t rows_per_slot(uint64_t slot_bytes, const gpu_side::ep::RowFormat& format);

// Whether `rows` rows of `format` travel with the record (they fit `eager_bytes`).
bool fits_eager(uint64_t rows, const gpu_side::ep::RowFormat& format, uint64_t eager_bytes);

// The plan for `rows` rows through slots of `geometry`: one chunk when they fit
// geometry.whole_bytes, else chunks of at most slot_bytes. rows_per_chunk is 0 (and chunks 0)
// only when a single row does not fit a slot: check with fits_one_row() before sending.
ChunkPlan plan_in_slots(uint64_t rows, const gpu_side::ep::RowFormat& format,
                        const proxy::SlotGeometry& geometry);

// The plan of a stream between two different ranks: eager when the rows fit `eager_bytes`,
// else through the slots of `geometry`.
ChunkPlan plan_stream(uint64_t rows, const gpu_side::ep::RowFormat& format,
                      const proxy::SlotGeometry& geometry, uint64_t eager_bytes);

// Whether a row of `format` fits a slot of `geometry`; else `why` says which memory is too
// small.
bool fits_one_row(const gpu_side::ep::RowFormat& format, const proxy::SlotGeometry& geometry,
                  std::string* why);

}  // namespace proxyep::integrations::normal
