// LlNodeCombine: the low-latency combine of an LlNodeDispatch's step (ll_node_dispatch.hpp) as
// operations of one stream alone, capturable and replayable as the dispatch is. Each rank owns a
// return slot per expert rank, where that rank sends back the rows of this rank's messages, and
// two words per peer (arrived, released), as the dispatch's. One step, numbered by its own
// epoch word:
//
//   add_value(epoch, 1)                                  this step is n
//   wait_value(released[h] >= n - 1)   for every home    h reduced my rows of step n - 1
//   ll_return_counted(x -> every home's slot for me)     by the dispatch's layout_range
//   write_value(home's arrived[me] = n) for every home
//   wait_value(arrived[r] >= n)         for every rank   r's rows of my tokens are here
//   ll_combine_routed(my slots -> out)                   by the dispatch's routing
//   write_value(r's released[me] = n)  for every rank
//
// It combines the dispatch's latest step: the routing (counts, positions) and layout_range it
// reads are the dispatch's, rewritten by its next step, so queue dispatch and combine in turn
// (DeepEP's order). Rows are bf16 [hidden]; a row comes back at the index its message had.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/device/ll_node_dispatch.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace proxyep::gpu_side::device {

// One rank's combine memory as a device reaches it. Words start at 0, 8-byte aligned.
struct LlNodeReturnMemory {
  std::byte* slots = nullptr;    // [ranks] slots of slot_bytes (16-byte aligned): rank r's at r
  uint64_t* arrived = nullptr;   // [ranks]
  uint64_t* released = nullptr;  // [ranks]
};

struct LlNodeCombinePlan {
  uint64_t slot_bytes = 0;  // at least ll_node_return_slot_bytes(hidden, max_tokens, local)
  std::vector<LlNodeReturnMemory> memory;  // [ranks], as this rank's device reaches them
  uint64_t* epoch = nullptr;               // this rank's combine step counter (0 at first)
  // The expert outputs in the dispatch's recv_x layout: bf16 [local_experts * ranks *
  // max_tokens, hidden] (DeepEP's combine x); the weights f32 [num_tokens, topk]; the output
  // bf16 [num_tokens, hidden]. Device memory, the same for every step.
  const uint16_t* x = nullptr;
  const float* topk_weights = nullptr;
  uint16_t* out = nullptr;
  // Optional, DeepEP's combine_wait_recv_cost_stats: i64 [ranks] += the nanoseconds the step
  // waited for each expert rank's rows (device memory).
  int64_t* wait_stats = nullptr;
};

// The bytes one expert rank's return slot needs: a row for each message it was sent.
uint64_t ll_node_return_slot_bytes(uint32_t hidden, int64_t max_tokens, int32_t local_experts);

class LlNodeCombine {
 public:
  // Checks the plan against the dispatch's (proxyep::Error(phase) naming what is wrong) and
  // uploads the tables its kernels read, as LlNodeDispatch does (inside a capture too). The
  // dispatch must outlive it.
  LlNodeCombine(std::shared_ptr<DeviceRuntime> device, const LlNodeDispatch& dispatch,
                LlNodeCombinePlan plan, std::string_view phase);
  LlNodeCombine(const LlNodeCombine&) = delete;
  LlNodeCombine& operator=(const LlNodeCombine&) = delete;

  // Queues one step on the device's stream: nothing on the host waits, so it may be captured.
  // In two halves as LlNodeDispatch's: queue_send() (the rows back to their homes, the arrival
  // signals), queue_receive() (the arrival waits, the weighted sum, the releases).
  void queue(std::string_view phase);
  void queue_send(std::string_view phase);
  void queue_receive(std::string_view phase);

 private:
  std::shared_ptr<DeviceRuntime> device_;
  const LlNodeDispatch& dispatch_;
  LlNodeCombinePlan plan_;
  // Device tables: every home's slot for this rank (the way back), this rank's slots (the
  // combine's rows).
  std::shared_ptr<std::byte[]> to_slots_, from_slots_;
};

}  // namespace proxyep::gpu_side::device
