// How a Buffer call's rows travel as chunk streams through bounded memory (DeepEP's chunked
// rings, here as slots with credits). Pure arithmetic, computed identically on every rank from
// values every rank agrees on (the Buffer's options, the call's row counts and row format), so
// a sender always knows which slot of the receiver a chunk goes to.
//
// Every ordered pair (source s, destination d), s != d, is a stream of chunks; chunk j carries
// rows [j * rows_per_chunk, ...) of the rows s sends d in this call, laid out in its slot as
// ep::RowAreas of its own row count. A receiver's data area gives every source the same share
// (source_area); a stream may have `window` chunks in its slots at once, chunk j in slot
// j % window, and chunk j may be written only once the receiver has consumed chunk j - window.
//  - Node peers (stores into a mapped arena): a pair whose rows fit its share moves as one
//    chunk (the whole call in one pass, nothing to wait for); a larger one alternates between
//    two half-share slots.
//  - Other nodes (one RMA write per chunk, one sequence number per write): slots of
//    remote_slot bytes (at most ep.chunk_bytes, so the first writes are on the wire while later
//    rows are still being packed), as many as fit the share (a power of two: SequenceWindow).
//    The sender packs chunks into its staging area first: stage_window slots per destination.
#pragma once

#include "gpu_side/ep/row_format.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

namespace proxyep {

// Most chunks of one stream in flight (a power of two, within imm::kMaxWindow).
inline constexpr uint32_t kMaxStreamWindow = 1024;

// The memory shares every rank derives from the Buffer's agreed options.
struct StreamGeometry {
  uint64_t source_area = 0;    // bytes of a receiver's data area per source
  uint64_t remote_slot = 0;    // bytes of one chunk between nodes (0: one node)
  uint32_t remote_window = 0;  // chunks in flight per stream between nodes
  uint64_t stage_area = 0;     // this rank's staging bytes per destination on another node
  uint32_t stage_window = 0;   // this rank's staging slots per destination on another node

  // `data_bytes`: a rank's data area; `staging_bytes`: a rank's staging area (the same on every
  // rank); `chunk_bytes`: ep.chunk_bytes. Throws proxyep::Error("buffer") when the memory
  // cannot give every stream one slot.
  static StreamGeometry make(int rank, int ranks, int ranks_per_node, uint64_t data_bytes,
                             uint64_t staging_bytes, uint64_t chunk_bytes);
};

// Ranks on `rank`'s node (nodes hold consecutive ranks; the last one may be smaller).
int node_size(int rank, int ranks, int ranks_per_node);

// One stream of one call.
struct ChunkPlan {
  uint64_t rows = 0;
  uint64_t rows_per_chunk = 0;
  uint64_t chunks = 0;
  uint64_t slot_bytes = 0;  // distance between slots in the receiver's share
  uint32_t window = 1;
  bool eager = false;  // one chunk in the eager slot, sent with the notify record

  // All `rows` as one chunk in a slot of `slot_bytes` (window 1).
  static ChunkPlan whole(uint64_t rows, uint64_t slot_bytes, bool eager = false) {
    ChunkPlan plan;
    plan.rows = plan.rows_per_chunk = rows;
    plan.chunks = 1;
    plan.slot_bytes = slot_bytes;
    plan.eager = eager;
    return plan;
  }

  uint64_t first_row(uint64_t chunk) const { return chunk * rows_per_chunk; }
  uint64_t rows_in(uint64_t chunk) const {
    return std::min(rows_per_chunk, rows - first_row(chunk));
  }
};

// Rows of `format` that fit `slot_bytes` (0 when not even one does).
uint64_t rows_per_slot(uint64_t slot_bytes, const gpu_side::ep::RowFormat& format);

// The plan for `rows` rows between node peers / between nodes. rows_per_chunk is 0 (and chunks
// 0) only when a single row does not fit a slot: check with fits_one_row() before sending.
ChunkPlan plan_node_stream(uint64_t rows, const gpu_side::ep::RowFormat& format,
                           const StreamGeometry& geometry);
ChunkPlan plan_remote_stream(uint64_t rows, const gpu_side::ep::RowFormat& format,
                             const StreamGeometry& geometry);

// Whether a row of `format` fits every kind of slot this Buffer uses; else the message says
// which memory is too small.
bool fits_one_row(const gpu_side::ep::RowFormat& format, const StreamGeometry& geometry,
                  bool multi_node, std::string* why);

}  // namespace proxyep
