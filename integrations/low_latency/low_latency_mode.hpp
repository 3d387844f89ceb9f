// LowLatencyMode: DeepEP's low-latency dispatch and combine (DEEPEP_CONTRACT 2.7-2.8) as a protocol
// over a Session's peer channels. One message per (token, destination expert); every call
// sends to every rank, and the sizes are agreed once (clean_low_latency_buffer, or the first
// call of a new shape) so no call needs a notify round trip:
//
//   send phase      check the arguments (nothing is sent for bad input); route; cast each token
//                   once (FP8, or BF16 as is); for every rank, wait until it released the slots
//                   this call reuses (call_sequence.hpp), copy its messages into its eager slot
//                   [k % 2][me], grouped by its local expert, then send the record with the
//                   per-expert counts (ll_record.hpp)
//   receive phase   wait for every rank's record and messages; unpack each expert's messages in
//                   blocks by source rank (ascending; layout_range says where each begins) into
//                   recv_x [E_local, R*T, H]; release every source's slots
//
// Combine sends each received row back to its home rank in the order it arrived, so the home
// rank finds the row of its (token, k) at the index it gave the message, and reduces with the
// top-k weights in float32, k ascending (gpu_side/ep/ll_rules.hpp).
//
// The receive phase runs at once, in `hook()` (return_recv_hook), or on the Buffer's CommStream
// (async_finish; every later Buffer call first waits for it, like stream order). At most two
// calls are in flight (CallSequence); a third is refused.
#pragma once

#include "integrations/backend/row_backend.hpp"
#include "integrations/call_sequence.hpp"
#include "integrations/comm_stream.hpp"
#include "integrations/low_latency/ll_call.hpp"
#include "integrations/low_latency_types.hpp"
#include "proxy/session/session.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace proxyep::integrations::low_latency {

struct DispatchInput;  // ll_args.hpp

// A low-latency call whose tensors are device memory (device_ll_calls.hpp): the backend that runs
// its per-message work (the routing included: topk_idx is not read on the host) and, for a
// zero_copy combine, the device combine buffer.
struct LlDeviceCall {
  RowBackend& backend;
  gpu_side::ep::TensorRef combine_buffer;
};

class LowLatencyMode {
 public:
  // `enable_shrink`: a peer that is lost or does not deliver within the deadline is masked and
  // the call completes for the others (DeepEP's rank masking); without it the call fails
  // naming the peer.
  LowLatencyMode(proxy::Session& session, RowBackend& backend, CallSequence& calls,
                 CommStream& stream, uint64_t buffer_id, bool enable_shrink);
  LowLatencyMode(const LowLatencyMode&) = delete;
  LowLatencyMode& operator=(const LowLatencyMode&) = delete;

  // clean_low_latency_buffer: a collective call that agrees on `shape` (every rank fails,
  // naming the ranks that differ, when they do not agree) and frees the LL slots.
  void clean(const LlShape& shape);
  LowLatencyDispatchResult dispatch(const LowLatencyDispatchArgs& args,
                                    const LlDeviceCall* device = nullptr);
  LowLatencyCombineResult combine(const LowLatencyCombineArgs& args,
                                  const LlDeviceCall* device = nullptr);
  // The zero_copy combine buffer's shape for `handle` (bf16 [rows, cols]); throws for a handle
  // of another Buffer.
  std::pair<int64_t, int64_t> combine_buffer_shape(const LowLatencyHandle& handle) const;
  gpu_side::ep::Tensor next_combine_buffer(const LowLatencyHandle& handle);

  // ---- rank masking (enable_shrink) ----
  void update_mask(int rank, bool mask);  // low_latency_update_mask_buffer
  // low_latency_query_mask_buffer: i32 [R], 1 = masked; `device`: the backend that writes a
  // device tensor (null for a host one).
  void query_mask(const gpu_side::ep::TensorRef& out, RowBackend* device = nullptr);
  void clean_mask();  // low_latency_clean_mask_buffer
  bool any_masked() const;

 private:
  // ---- both calls (low_latency_mode.cpp) ----
  void agree(const LlShape& shape, std::string_view phase);
  void check_slot_fits(const LlShape& shape, std::string_view phase) const;
  // What a call sends every rank: `fill(destinations)` has the backend write their messages
  // into their eager slots (one batch of work: a device packs them in one kernel), and
  // `describe(d, counts)` returns the bytes rank d gets and sets its record's counts.
  struct Sends {
    std::function<void(std::span<const int>)> fill;
    std::function<uint64_t(int, std::vector<int32_t>&)> describe;
  };
  // Waits until every rank freed the slots `state`'s call reuses, then sends every rank its
  // record and messages: peers on other nodes first (their writes complete in the background
  // while the others' messages are written), each group once the backend's work is done.
  void send_phase(const CallState& state, const Sends& sends, std::string_view phase);
  void send_all(const CallState& state, const Sends& sends, std::string_view phase);
  // Waits for every rank's record and eager bytes of `state`'s call; returns the records, and
  // the nanoseconds each source took from `start`.
  std::vector<LlRecord> receive_all(const CallState& state, std::vector<int64_t>& waited_ns,
                                    std::string_view phase);
  // With shrink: masks `rank`, lost during call `call` (`why`), and goes on without it.
  bool lose(int rank, const std::string& why, uint64_t call, std::string_view phase);
  void mask(int rank, bool masked);
  // Begins `state`'s call and runs `send` (its send phase) and then its receive phase as the
  // call asked: both now; the send in the background and the receive in the hook (as a GPU
  // runs a launched kernel: the call returns at once); or both in the background (async).
  void launch(const std::shared_ptr<CallState>& state, std::function<void()> send, bool hook,
              bool async, RecvHook& out_hook, CallEvent& out_event);
  void receive(CallState& state);

  // ---- dispatch (ll_dispatch.cpp) ----
  // The call's state, routed (on the device for a device call); then its output tensors.
  std::shared_ptr<CallState> dispatch_state(const LowLatencyDispatchArgs& args,
                                            const DispatchInput& input, const LlDeviceCall* device);
  void make_dispatch_outputs(CallState& state, bool on_device);
  void route(CallState& state, const gpu_side::ep::TensorRef& topk_idx);
  // A device call's routing: on the device, from a copy of topk_idx the call keeps; only the
  // counts (and how many values named no expert: refused) are read back.
  void route_on_device(CallState& state, const gpu_side::ep::TensorRef& topk_idx);
  // sent_to, and where each (rank, local expert) group begins among the messages to its rank,
  // from expert_counts_.
  std::vector<int32_t> count_sends(CallState& state);
  // A device call's pack for `destinations` by the routing its backend made (no item list).
  void pack_routed(const CallState& state, const gpu_side::ep::TensorRef& x,
                   std::span<const int> destinations);
  void receive_dispatch(CallState& state);

  // ---- combine (ll_combine.cpp) ----
  // The call's state: shape, weights and output, after the device call's routing check.
  std::shared_ptr<CallState> combine_state(const LowLatencyCombineArgs& args,
                                           const LlDeviceCall* device);
  void receive_combine(CallState& state);

  proxy::Session& session_;
  RowBackend& backend_;
  CallSequence& calls_;
  CommStream& stream_;
  uint64_t buffer_id_;
  bool shrink_;
  std::vector<uint8_t> masked_;  // by rank
  std::optional<LlShape> agreed_;
  // Send-phase scratch of dispatch, reused across calls:
  std::vector<uint16_t> x_copy_;             // x, when the cast runs in the background
  std::vector<int32_t> expert_counts_;       // [R * E_local]: messages per (rank, local expert)
  std::vector<std::vector<int32_t>> order_;  // [R][messages]: the token of each message
  gpu_side::ep::Tensor combine_buffer_;      // zero_copy combine's input
  // Output tensors of earlier calls, by call parity, reused once nobody else holds them: a fresh
  // large allocation costs a page fault for every page the receive phase touches.
  struct Outputs {
    gpu_side::ep::Tensor recv_x, recv_x_scales, recv_count, src_info, layout_range, combined;
  };
  Outputs outputs_[2];
  // Which of them the next call of each kind fills. Counted per kind, so that a caller who keeps
  // the previous call's outputs (DeepEP's double buffering: dispatch of micro-batch 1 held while
  // micro-batch 2 dispatches) always leaves the other one free. (By the sequence's call count,
  // every dispatch of a dispatch/combine loop landed on the same one.)
  uint64_t dispatches_ = 0, combines_ = 0;
  // `pooled` if only the pool holds it and its form fits, else a new tensor (kept in the pool).
  gpu_side::ep::Tensor output(gpu_side::ep::Tensor& pooled, gpu_side::ep::DType dtype, int64_t rows,
                              int64_t cols);
  // Hooks and events hold a weak reference: called after the Buffer is gone they throw.
  std::shared_ptr<LowLatencyMode*> alive_;
};

}  // namespace proxyep::integrations::low_latency
