// One call's rows as chunk streams: every ordered pair of ranks (source, destination) is a
// stream of chunks through the destination's slots (chunk_plan.hpp), moved through the peer
// channels (proxy/session/peer_channel.hpp) by one loop per rank that both writes what the
// receivers' slots allow and consumes what has arrived, until both directions are done. Because the
// same loop does both, two ranks that wait for each other's credits always also drain each other:
// no pair can deadlock.
//
// What the rows are is the call's business (dispatch_rows.hpp, combine_rows.hpp): a RowStreams
// says how to fill a chunk and what to do with one that arrived, with its backend's work.
//
// The backend may still be running that work when fill() or take() returns (a device's
// stream): a chunk is sent, and a slot's credit handed back, only once the backend's work
// queued before it is done (RowBackend's completion rule). Until then the loop fills chunks for
// other destinations, so one chunk's kernels run while the chunk before it is posted.
#pragma once

#include "integrations/backend/row_backend.hpp"
#include "integrations/normal/chunk_plan.hpp"
#include "integrations/normal/notify_record.hpp"
#include "integrations/normal_types.hpp"
#include "integrations/phase_clock.hpp"
#include "proxy/session/session.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace proxyep::integrations::normal {

class RowStreams {
 public:
  RowStreams(RowBackend& backend, const gpu_side::ep::RowFormat& format, int ranks)
      : backend(backend),
        format(format),
        out(static_cast<size_t>(ranks)),
        in(static_cast<size_t>(ranks)) {}
  virtual ~RowStreams() = default;

  // Rows [first, first + rows) of the stream to `destination`, written into `slot` as
  // gpu_side::ep::RowAreas of `rows` rows.
  virtual void fill(int destination, uint64_t first, uint64_t rows, std::byte* slot) = 0;
  // Chunk `chunk` from `source` (its rows [first, first + rows)) has arrived in `slot`; the slot
  // is handed back once the backend's work queued so far is done (combine may still read it:
  // combine_rows.hpp says when).
  virtual void take(int source, uint64_t chunk, uint64_t first, uint64_t rows,
                    const std::byte* slot) = 0;
  // Once, after the first chunks are on their way (e.g. a rank's rows to itself).
  virtual void local() {}
  // Where the token bytes of rows [first, ...) to `destination` go in its landing region (a
  // fabric peer whose recv_x is there: PeerChannel::send_chunk_in_place), or -1: with the rest
  // of the chunk into its slot.
  virtual int64_t landing_offset(int destination, uint64_t first) const {
    (void)destination, (void)first;
    return -1;
  }
  // The format of the rows in `peer`'s streams (hierarchical internode: the fabric's rows carry
  // more than the call's).
  virtual const gpu_side::ep::RowFormat& stream_format(int peer) const {
    (void)peer;
    return format;
  }
  // Whether rows [0, end) to `destination` can be filled now (a forwarder's rows only once they
  // arrived from their source).
  virtual bool rows_ready(int destination, uint64_t end) const {
    (void)destination, (void)end;
    return true;
  }
  // Rows [first, first + rows) to `destination` as the caller's memory already holds them, one
  // run laid out as fill() would write the chunk (a fabric peer's channel may write them from
  // there: PeerChannel::send_chunk_from), or null: they need fill().
  virtual const std::byte* caller_rows(int destination, uint64_t first, uint64_t rows) const {
    (void)destination, (void)first, (void)rows;
    return nullptr;
  }

  RowBackend& backend;  // whose work fills and takes the chunks
  const gpu_side::ep::RowFormat format;
  std::vector<ChunkPlan> out;  // by destination (this rank: none)
  std::vector<ChunkPlan> in;   // by source (this rank: none)
};

// The plans of this rank's streams with every peer for rows[r] rows between this rank and r
// (either direction: a stream's plan depends only on its rows and the peer's slots). This rank's
// own entry is an empty plan.
std::vector<ChunkPlan> plan_streams(const proxy::Session& session,
                                    const gpu_side::ep::RowFormat& format,
                                    std::span<const int64_t> rows);
// DeepEP's RDMA chunk sizes on the streams between nodes (the channels of fabric peers): this
// call's own on the streams it sends, before any is sent...
void chunk_fabric_out(const proxy::Session& session, RowStreams& streams, FabricChunking mine);
// ...and each sender's, from its record, on the streams it receives, before any is taken.
void chunk_fabric_in(const proxy::Session& session, RowStreams& streams,
                     const std::vector<NotifyRecord>& records);
// Throws proxyep::Error(phase), before anything is sent, when a row of `format` fits no slot
// of some peer's streams (the Buffer is too small for it).
void require_row_fits(const proxy::Session& session, const gpu_side::ep::RowFormat& format,
                      std::string_view phase);

// Before the records of `call`: writes the rows of every eager stream of `streams`.
void send_eager(proxy::Session& session, uint64_t call, RowStreams& streams, BufferStats& stats,
                PhaseClock& clock, std::string_view phase);
// Moves every other stream of `streams`: returns when this rank has sent every chunk and
// consumed every chunk sent to it. A peer that makes no progress for the session's deadline, or
// a node peer that exits, fails the call naming it.
// Its time is charged to pack, post, local, unpack and wait on `clock`.
void run_streams(proxy::Session& session, uint64_t call, RowStreams& streams, BufferStats& stats,
                 PhaseClock& clock, std::string_view phase);

}  // namespace proxyep::integrations::normal
