// LlNodeDispatch: a low-latency dispatch among the ranks of one node as operations of one stream
// alone, so that it can be captured into a graph and replayed (DeepEP's LL path under CUDA
// graphs): no host reads the routing, no host waits between the sends and the receive. Every
// rank's memory is reachable by every rank's device (CUDA IPC mappings of the peers' device
// arenas; on the simulated device, one device's allocations).
//
// Each rank owns, in its memory (LlNodeMemory): a slot per source for that source's messages,
// the counts table [source][local expert] the sources fill, and two words per peer: arrived[s]
// (the last step whose messages from s are here) and released[p] (the last step in which p read
// this rank's messages). One step, numbered by the rank's epoch word:
//
//   add_value(epoch, 1)                                 this step is n
//   ll_route(topk_idx)                                  counts and positions, on the device
//   wait_value(released[p] >= n - 1)   for every peer   p read step n - 1: its slot is free
//   ll_pack_routed(x -> every peer's slot for me)       grouped by the peer's local expert
//   copy(my counts -> every peer's counts row `me`)
//   write_value(peer's arrived[me] = n) for every peer
//   wait_value(arrived[s] >= n)        for every source
//   ll_unpack_counted(slots, counts -> the outputs)     placed by the counts alone
//   write_value(source's released[me] = n) for every source
//
// Between nodes (LlRemotePeer), for a peer on another node the step packs into its own send
// slot, copies its counts row beside, and pushes two writes (ll_write_bytes sizes them from the
// counts) after the pack ran; it waits for the peer's words its proxy counts (released >= n - 1,
// arrived >= 2n), copies the peer's counts row into its table, and pushes a signal as the
// release.
//
// Every value is an epoch value (signal_value.hpp), so the step replays: replay n of every rank
// waits for the others' replay n. Every rank must run the same number of steps, as with DeepEP.
// Selections naming no expert (outside [-1, experts)) are skipped, not refused: nothing on the
// host sees topk_idx (a caller that wants the refusal reads ll_route's `invalid` outside the
// step). The waits carry `timeout`: a peer that never runs its step fails the stream, naming
// the word, instead of hanging it.
#pragma once

#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/ll_kernel_params.hpp"
#include "gpu_side/ep/ll_rules.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace proxyep::integrations::low_latency {

namespace ep = gpu_side::ep;
using gpu_side::Descriptor;
using gpu_side::device::DeviceRingProducer;
using gpu_side::device::DeviceRuntime;

// One rank's step memory as a device reaches it. Words start at 0, 8-byte aligned.
struct LlNodeMemory {
  std::byte* slots = nullptr;    // [ranks] slots of slot_bytes (16-byte aligned): source s's at s
  int32_t* counts = nullptr;     // [ranks * local_experts]: source s's row at s * local_experts
  uint64_t* arrived = nullptr;   // [ranks]
  uint64_t* released = nullptr;  // [ranks]
};

// A rank on another node (a group that spans nodes): reached through the proxies, whose writes
// the step pushes into a descriptor ring (DeviceRuntime::ring_push) once the kernels before them
// ran, and whose arrivals the proxies count up in signal words (control/signal_words.hpp). Its
// send memory and receive memory are this rank's, registered with the fabric; the writes are
// made by the caller (regions, offsets, immediates) and sized by the step from its counts.
struct LlRemotePeer {
  std::byte* send_slot = nullptr;        // my messages for it, packed here (slot_bytes)
  int32_t* send_counts = nullptr;        // my counts row for it, copied here
  const std::byte* recv_slot = nullptr;  // its messages for me land here (slot_bytes)
  const int32_t* recv_counts = nullptr;  // its counts row for me lands here
  // Counted up by this rank's proxy: once per write of it that landed (kLlDispatchWrites a
  // step), once per step it read my messages.
  const uint64_t* arrived = nullptr;
  const uint64_t* released = nullptr;
};

// The writes of one step to one remote peer: its messages, its counts row.
inline constexpr uint64_t kLlDispatchWrites = 2;

// What a step sends to the ranks on other nodes (none on one node).
struct LlRemoteSends {
  DeviceRingProducer* ring = nullptr;
  // In rank order of the remote peers: [i] peer i's messages (the step sets length and op),
  // [remotes + i] its counts row; then what tells peer i that its messages were read (a signal).
  std::vector<Descriptor> sends;
  std::vector<Descriptor> releases;
};

struct LlNodeDispatchPlan {
  int rank = 0;
  int ranks = 0;
  int32_t local_experts = 0;  // 1..kMaxLocalExperts; experts = ranks * local_experts
  uint64_t slot_bytes = 0;    // at least ll_node_slot_bytes(format, max_tokens, local_experts)
  // [ranks]: every rank's memory as this rank's device reaches it (its own at `rank`); a rank
  // on another node has none (all null) and an entry in `remote` instead.
  std::vector<LlNodeMemory> memory;
  std::vector<LlRemotePeer> remote;  // [ranks] or empty (one node): set for other nodes' ranks
  LlRemoteSends remote_sends;
  uint64_t* epoch = nullptr;  // this rank's step counter (device memory, 0 before the first step)
  std::chrono::milliseconds timeout{0};

  // The inputs and outputs (device memory; the same addresses for every step): DeepEP's LL
  // dispatch tensors, as in integrations' LowLatencyMode.
  ep::LlFormat format;
  int64_t max_tokens = 0;             // num_max_dispatch_tokens_per_rank
  int64_t num_tokens = 0;             // <= max_tokens
  int topk = 0;                       // 1..kLlMaxTopk
  const uint16_t* x = nullptr;        // bf16 [num_tokens, hidden]
  const int64_t* topk_idx = nullptr;  // [num_tokens, topk]
  std::byte* recv_x = nullptr;        // [local_experts * ranks * max_tokens] rows of payload_bytes
  uint32_t* recv_x_scales = nullptr;  // FP8: [local_experts * scale_words, ranks * max_tokens]
  int32_t* src_info = nullptr;        // [local_experts, ranks * max_tokens]
  int32_t* recv_count = nullptr;      // [local_experts]
  int64_t* layout_range = nullptr;    // [local_experts, ranks]
  // DeepEP's statistics, optional (device memory): recv_stats i32 [local_experts] += the tokens
  // each local expert received; wait_stats i64 [ranks] += the nanoseconds the step waited for
  // each source's messages (its arrival wait, in source order).
  int32_t* recv_stats = nullptr;
  int64_t* wait_stats = nullptr;
};

// The bytes one source's slot needs: every one of max_tokens tokens may select every local
// expert of the destination.
uint64_t ll_node_slot_bytes(const ep::LlFormat& format, int64_t max_tokens, int32_t local_experts);

class LlNodeDispatch {
 public:
  // Checks the plan (proxyep::Error(phase) naming what is wrong), allocates the step's scratch
  // (the routing, the tables of addresses its kernels read) and uploads the tables, waiting for
  // that: on the device's stream, or while it is being captured on another stream of the device
  // (device_table.hpp), so a step may be made inside the capture that queues it. It must then
  // outlive the graph's launches.
  LlNodeDispatch(std::shared_ptr<DeviceRuntime> device, LlNodeDispatchPlan plan,
                 std::string_view phase);
  LlNodeDispatch(const LlNodeDispatch&) = delete;
  LlNodeDispatch& operator=(const LlNodeDispatch&) = delete;

  // Queues one step on the device's stream: nothing on the host waits, so it may be captured.
  // In two halves where the receive is deferred (DeepEP's return_recv_hook): queue_send() (the
  // routing, the sends, the arrival signals), then queue_receive() (the arrival waits, the
  // unpack, the releases, the statistics); queue() is both.
  void queue(std::string_view phase);
  void queue_send(std::string_view phase);
  void queue_receive(std::string_view phase);

  const LlNodeDispatchPlan& plan() const { return plan_; }
  // The routing of the latest step (device memory; ll_route's output), which its combine reads
  // (ll_node_combine.hpp): counts [experts], positions [num_tokens * topk].
  const int32_t* routed_counts() const { return reinterpret_cast<const int32_t*>(counts_.get()); }
  const int32_t* routed_positions() const {
    return reinterpret_cast<const int32_t*>(positions_.get());
  }

 private:
  std::shared_ptr<DeviceRuntime> device_;
  LlNodeDispatchPlan plan_;
  bool remote(int rank) const {
    return !plan_.remote.empty() && plan_.remote[static_cast<size_t>(rank)].send_slot != nullptr;
  }

  // Device memory the kernels read: the routing, every peer's slot for this rank (the pack's),
  // this rank's slots (the unpack's), its experts' sinks; the writes to other nodes, the ranks
  // that size them, the releases.
  std::shared_ptr<std::byte[]> counts_, positions_, invalid_, to_slots_, from_slots_, sinks_;
  std::shared_ptr<std::byte[]> sends_, send_groups_, releases_;
  int64_t remotes_ = 0;
};

}  // namespace proxyep::integrations::low_latency
