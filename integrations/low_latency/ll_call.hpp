// CallState: what one low-latency call keeps between its send phase and its receive phase (which
// may run later: a hook, or a background completion), and what a dispatch leaves for the
// combine that answers it (through LowLatencyHandle::dispatched).
#pragma once

#include "gpu_side/ep/ll_rules.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/backend/row_backend.hpp"
#include "integrations/low_latency/ll_record.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace proxyep::integrations::low_latency {

struct CallState {
  uint64_t buffer_id = 0;  // the Buffer that made it
  uint64_t call = 0;       // its number in the Buffer's call sequence
  LlKind kind = LlKind::dispatch;
  LlShape shape;
  gpu_side::ep::LlFormat format;
  uint32_t flags = 0;  // as in the records (kFlag*)
  int ranks = 0;
  int num_tokens = 0;  // T', this rank's tokens
  int topk = 0;
  bool received = false;
  // Whose per-message work it is: the Buffer's host backend, or a device call's (outputs and
  // statistics in device memory).
  RowBackend* backend = nullptr;

  // ---- dispatch: where this rank's (token, k) selections went ----
  // A host call's, on the host:
  std::vector<int64_t> topk_idx;  // [T' * K], the routing (combine must pass the same)
  std::vector<int32_t> dest_of;   // [T' * K]: destination rank, -1 for none
  std::vector<int32_t> slot_of;   // [T' * K]: the message's index among those to dest_of
  // A device call's, on the device (nothing of it is read on the host but the counts): the
  // backend's routing of its own copy of topk_idx, by which the pack places the messages and the
  // combine finds the rows sent back (and checks its topk_idx against the copy).
  std::optional<RowBackend::LlRouting> routing;
  std::vector<int64_t> sent_to;  // [R]: messages sent to each rank
  std::vector<int64_t> ranges;   // [E_local * R]: layout_range as the host computed it

  // ---- dispatch outputs, filled by the receive phase ----
  gpu_side::ep::Tensor recv_x, recv_x_scales, recv_count, src_info, layout_range;
  // The caller's statistics tensors, written in place by the receive phase (may be undefined).
  gpu_side::ep::TensorRef recv_stats, wait_stats;

  // ---- combine ----
  std::shared_ptr<const CallState> dispatched;  // the dispatch it answers
  // f32 [T', K] in the backend's memory: a copy, so the caller may change topk_weights once the
  // call returned (the reduce reads them in the receive phase).
  gpu_side::ep::Tensor weights;
  gpu_side::ep::Tensor combined;  // bf16 [T', H] (unless the caller's `out`)
  uint16_t* out = nullptr;        // where the reduce writes
};

}  // namespace proxyep::integrations::low_latency
