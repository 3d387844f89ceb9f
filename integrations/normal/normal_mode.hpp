// NormalMode: DeepEP's normal-mode dispatch and combine as a protocol over a Session's peer
// channels. Every call:
//   1. checks its arguments (nothing sent yet: bad input leaves the Buffer usable);
//   2. sends the eager streams, then its notify record to every rank, and waits for every
//      rank's (notify.hpp): the row counts of every pair, and the barrier that frees the slots;
//   3. checks that every rank called alike (a disagreement fails every rank with one message);
//   4. moves every other stream in chunks (streams.hpp) while the rows that arrive are copied
//      into the outputs (dispatch) or gathered for the reduce (combine);
//   5. waits until its own writes completed (quiet): staging is rewritten by the next call.
// The per-row work is the backend's (backend/row_backend.hpp): the host backend for host
// tensors, a device backend, given per call, for device tensors (DeviceCall).
//
// With async_finish a call returns as soon as its outputs exist and finishes on the Buffer's
// CommStream: a dispatch after step 3 (the notify phase sizes its outputs, as DeepEP's CPU waits
// for the received counts), a combine after step 1 (its outputs have the handle's sizes). The
// call's state (DispatchCall, CombineCall) then lives on the heap until the stream finished it.
#pragma once

#include "integrations/backend/row_backend.hpp"
#include "integrations/call_sequence.hpp"
#include "integrations/comm_stream.hpp"
#include "integrations/normal/landing_blocks.hpp"
#include "integrations/normal/notify_record.hpp"
#include "integrations/normal_types.hpp"
#include "proxy/session/session.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace proxyep::integrations::normal {

struct DispatchInput;
struct TokenRouting;
struct NodeRouting;
class RowCounts;
class LandingZone;
struct DispatchCall;  // dispatch.cpp
class HierDispatchStreams;
struct CombineCall;  // combine.cpp

// A call whose tensors are in device memory (integrations/device_calls.hpp): `backend` moves its
// rows, which host code never touches, and `steering` holds host copies of what the protocol
// itself reads of a dispatch's device tensors: is_token_in_rank, num_tokens_per_rank,
// num_tokens_per_expert and topk_idx (its values are checked; undefined for a combine or a
// cached dispatch). Such a call offers no landing region (its recv_x is device memory), stores
// into node peers' landing regions through its slots, and never has the fabric read its x.
struct DeviceCall {
  RowBackend& backend;
  struct {
    gpu_side::ep::TensorRef is_token_in_rank, num_tokens_per_rank, num_tokens_per_expert, topk_idx;
  } steering;
};

class NormalMode {
 public:
  // `buffer_id` tells this Buffer's handles from others'; `calls` and `stream` are shared with
  // the low-latency mode. `landing` (may be null): where node peers store dispatch rows
  // straight into recv_x.
  NormalMode(proxy::Session& session, RowBackend& backend, CallSequence& calls, CommStream& stream,
             uint64_t buffer_id, std::shared_ptr<LandingZone> landing);

  // `device`: null for host tensors.
  DispatchResult dispatch(const DispatchArgs& args, const DeviceCall* device = nullptr);
  CombineResult combine(const CombineArgs& args, const DeviceCall* device = nullptr);

  void check_usable(std::string_view phase) const { calls_.check_usable(phase); }
  // Calls, eager streams, chunks and stalls (bytes are the channels' to count).
  const BufferStats& stats() const { return stats_; }
  // stats() as of the last call that completed, for readers on other threads (the metrics
  // endpoint): a copy taken under a lock once per call.
  BufferStats published_stats() const {
    std::lock_guard lock(published_mutex_);
    return published_;
  }
  gpu_side::ep::EpShape shape_for(int num_experts) const {
    return {session_.ranks(), session_.ranks_per_node(), num_experts};
  }

 private:
  // ---- dispatch steps (dispatch.cpp) ----
  // `args` as the protocol reads them: a device call's with its host steering copies.
  // `nodes`: a hierarchical internode call's node routing (hier_notify.hpp), or null.
  std::vector<NotifyRecord> notify_dispatch(uint64_t call, const DispatchInput& input,
                                            const DispatchArgs& args, const TokenRouting& routing,
                                            const LandingBlocks::Offer& offer,
                                            const NodeRouting* nodes);
  void agree_dispatch(uint64_t call, const DispatchInput& input, const DispatchArgs& args,
                      const std::vector<NotifyRecord>& records, const RowCounts& counts) const;
  // recv_x at `offset` of the landing region (in a run this rank offered).
  gpu_side::ep::Tensor land_recv_x(const DispatchInput& input, const DispatchArgs& args,
                                   uint64_t offset, int64_t rows);
  // Where peers' rows go straight into recv_x (DispatchStreams::store_in_place); expects the
  // writes of other nodes' ranks.
  void plan_in_place(DispatchCall& call, const std::vector<NotifyRecord>& records,
                     const RowCounts& counts);
  void await_in_place(DispatchCall& call);
  DispatchResult allocate_outputs(RowBackend& backend, const DispatchInput& input,
                                  const DispatchArgs& args, int64_t num_recv,
                                  gpu_side::ep::Tensor recv_x);
  void clear_padding(RowBackend& backend, DispatchResult& out, const DispatchInput& input,
                     int64_t num_recv);
  void finish_handle(DispatchResult& out, const DispatchInput& input, const DispatchArgs& args,
                     const TokenRouting& routing, const RowCounts& counts,
                     const std::vector<NotifyRecord>& records) const;
  // A dispatch's send streams, planned and chunked (hierarchical internode: the lanes and the
  // forwarders, returned; else null).
  HierDispatchStreams* plan_sends(DispatchCall& call);
  // Step 4 and 5 of a dispatch whose outputs exist.
  void move_rows(DispatchCall& call);

  // The rest of call `c`, whose outputs exist: here, or with `async` on the CommStream (the
  // result's event joins it, and has a device point for a device call; the caller's own work
  // meanwhile is not charged to the call).
  template <typename Call>
  auto finish_call(const std::shared_ptr<Call>& c, bool async, void (NormalMode::*rest)(Call&),
                   std::string_view phase) {
    if (!async) {
      (this->*rest)(*c);
      return std::move(c->out);
    }
    auto out = c->out;
    out.event = stream_.submit_call(
        [this, c, rest] {
          c->clock.resume();
          (this->*rest)(*c);
        },
        c->backend->stream() != nullptr, phase);
    return out;
  }

  // ---- combine steps (combine.cpp) ----
  // Steps 2 to 5 of a combine whose outputs exist.
  void run_combine(CombineCall& call);
  // A combine that failed after writing chunks straight from the caller's x: waits, up to the
  // session's deadline, until no write reads x any more (a warning when some still might).
  void settle_writes_from_x() noexcept;

  proxy::Session& session_;
  RowBackend& backend_;
  uint64_t buffer_id_;
  CallSequence& calls_;
  CommStream& stream_;
  std::shared_ptr<LandingZone> landing_;
  // After a call completed: its stats for published_stats().
  void publish_stats() {
    std::lock_guard lock(published_mutex_);
    published_ = stats_;
  }

  RecordEncoder encoder_;
  RecordEncoder relay_encoder_;  // hierarchical internode: counterparts' records, relayed
  BufferStats stats_;
  mutable std::mutex published_mutex_;
  BufferStats published_;
};

}  // namespace proxyep::integrations::normal
