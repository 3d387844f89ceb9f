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
// Between nodes, a home on another node (LlRemoteReturn) gets its rows in one write pushed after
// ll_return_counted ran into this rank's send slot, and sends its release as a signal; the words
// its proxy counts are waited for as the node peers' are.
//
// It combines the dispatch's latest step: the routing (counts, positions) and layout_range it
// reads are the dispatch's, rewritten by its next step, so queue dispatch and combine in turn
// (DeepEP's order). Rows are bf16 [hidden]; a row comes back at the index its message had.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "integrations/low_latency/ll_node_dispatch.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace proxyep::integrations::low_latency {

// One rank's combine memory as a device reaches it. Words start at 0, 8-byte aligned.
struct LlNodeReturnMemory {
  std::byte* slots = nullptr;    // [ranks] slots of slot_bytes (16-byte aligned): rank r's at r
  uint64_t* arrived = nullptr;   // [ranks]
  uint64_t* released = nullptr;  // [ranks]
};

// A home on another node (the dispatch's LlRemotePeer): the rows of its tokens go back through
// the proxies, one write a step (sized from the counts it sent), and its rows for this rank's
// tokens land in this rank's receive memory; the proxy counts both words once a step.
struct LlRemoteReturn {
  std::byte* send_slot = nullptr;        // my rows for it, copied here (slot_bytes)
  const std::byte* recv_slot = nullptr;  // its rows for my tokens land here (slot_bytes)
  const uint64_t* arrived = nullptr;     // counted once per step: its rows landed
  const uint64_t* released = nullptr;    // counted once per step: it read my rows
};

struct LlNodeCombinePlan {
  uint64_t slot_bytes = 0;  // at least ll_node_return_slot_bytes(hidden, max_tokens, local)
  std::vector<LlNodeReturnMemory> memory;  // [ranks], as this rank's device reaches them
  // The dispatch's ranks on other nodes (none on one node): [ranks], set for those ranks (their
  // `memory` entry is then all null); the writes, [i] to remote peer i in rank order (the step
  // sets length and op), and the releases.
  std::vector<LlRemoteReturn> remote;
  LlRemoteSends remote_sends;
  uint64_t* epoch = nullptr;  // this rank's combine step counter (0 at first)
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
  bool remote(int rank) const {
    return !plan_.remote.empty() && plan_.remote[static_cast<size_t>(rank)].send_slot != nullptr;
  }

  // Device tables: every home's slot for this rank (the way back), this rank's slots (the
  // combine's rows); the writes to other nodes, the ranks that size them, the releases.
  std::shared_ptr<std::byte[]> to_slots_, from_slots_;
  std::shared_ptr<std::byte[]> sends_, send_groups_, releases_;
  int64_t remotes_ = 0;
};

}  // namespace proxyep::integrations::low_latency
