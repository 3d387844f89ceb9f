// How the rows of one stream of a call travel: as one eager payload with the record, as one
// chunk, or as chunks through the peer's slots (proxy/arena_layout.hpp says where the slots are,
// the channel's SlotGeometry how large). Pure arithmetic, computed identically on every rank
// from values every rank agrees on (the session's sizes, the call's row counts and row format),
// so a sender always knows which slot of the receiver a chunk goes to.
//
// Chunk j carries rows [j * rows_per_chunk, ...) of the rows the source sends the destination in
// this call, laid out in its slot as gpu_side::ep::RowAreas of its own row count.
#pragma once

#include "gpu_side/ep/row_format.hpp"
#include "proxy/arena_layout.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

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
