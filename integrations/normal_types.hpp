// The value types of normal-mode calls (DEEPEP_CONTRACT 1.3, 2.3-2.6): what dispatch and combine
// take and return, the handle, and the statistics a Buffer keeps of them. Buffer::dispatch and
// Buffer::combine use these (buffer.hpp); the protocol is integrations/normal/, which includes
// this header, never the facade. The low-latency mode's are beside it (low_latency_types.hpp).
#pragma once

#include "common/step_clock.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/config.hpp"
#include "integrations/low_latency_types.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace proxyep {

using gpu_side::ep::DispatchLayout;
using gpu_side::ep::DType;
using gpu_side::ep::Tensor;
using gpu_side::ep::TensorRef;

// Where this rank's normal-mode calls of one kind spent their time, in nanoseconds summed over
// the calls (each charged on the thread that ran it; an async call's wait for its caller is not
// counted). Every clock read marks a boundary between two phases, so the phases add up to the
// calls' time. For `proxyep bench ep --breakdown` and for tuning.
struct PhaseTimes {
  uint64_t calls = 0;       // completed
  uint64_t prepare_ns = 0;  // checks, routing, chunk plans, outputs, handle, padding
  uint64_t notify_ns = 0;   // every rank's record (and eager rows) awaited: the call's barrier
  uint64_t pack_ns = 0;     // rows written into slots (a node peer's arena, or staging)
  uint64_t post_ns = 0;     // chunks and credits handed to the channels (stores, RMA posts)
  uint64_t local_ns = 0;    // this rank's rows to itself
  uint64_t unpack_ns = 0;   // arrived rows copied out, or gathered for the reduce
  uint64_t wait_ns = 0;     // waiting for chunks or credits: the wire and the peers
  uint64_t reduce_ns = 0;   // combine's float32 reduce
  uint64_t quiet_ns = 0;    // waiting for this rank's writes to complete
  uint64_t sum_ns() const {
    return prepare_ns + notify_ns + pack_ns + post_ns + local_ns + unpack_ns + wait_ns + reduce_ns +
           quiet_ns;
  }
};

// What this rank's calls moved and how (Buffer::stats()): for tuning num_nvl_bytes,
// num_rdma_bytes, ep.chunk_bytes and ep.eager_bytes, and for checking that calls streamed.
struct BufferStats {
  uint64_t calls = 0;             // normal-mode dispatches and combines completed
  uint64_t eager_streams = 0;     // (call, destination) pairs sent with the notify record
  uint64_t chunks_sent = 0;       // chunks of the other pairs, to node peers and other nodes
  uint64_t chunks_received = 0;   // likewise, received
  uint64_t chunks_to_fabric = 0;  // of chunks_sent, those to other nodes (the Config's RDMA sizes)
  uint64_t credit_stalls = 0;     // times a pair with chunks left waited for a credit or a slot
  // Combine chunks the reduce read where they landed (streams of several chunks, all within
  // their window) instead of gathering them first.
  uint64_t chunks_reduced_in_place = 0;
  // Dispatch rows this rank stored straight into a node peer's recv_x (its landing region)
  // instead of the peer's arena.
  uint64_t rows_stored_in_place = 0;
  // Combine chunks to other nodes written straight from the caller's x (ep.send_from_x)
  // instead of being copied into the staging area first.
  uint64_t chunks_sent_from_caller = 0;
  uint64_t bytes_to_node = 0;    // row bytes stored into node peers' arenas
  uint64_t bytes_to_fabric = 0;  // row bytes posted to other nodes
  // How normal mode crossed nodes (ep.internode as it applies: "per_rank" on one node, on
  // unequal nodes and for low-latency Buffers).
  std::string internode = "per_rank";
  // Dispatch rows this rank sent to other nodes: each token once per node it reaches
  // (hierarchical), or once per rank there (per_rank). Hierarchical internode: rows this rank
  // forwarded inside its node for its counterparts.
  uint64_t rows_to_fabric = 0;
  uint64_t rows_forwarded = 0;
  // Writes to other nodes (rows, records, credits, of any mode) that the device's stream handed
  // to the proxies after its kernels filled them, rather than the host once it had waited for
  // them (device calls whose group spans nodes).
  uint64_t writes_from_device = 0;
  // Of them, chunks written straight from device memory the NIC reads (FI_HMEM: the session's
  // device staging area) instead of bouncing through the host staging area.
  uint64_t chunks_from_device_memory = 0;
  // Payloads (eager bytes, chunks) device calls stored into device arenas
  // (proxy/session/device_arenas.hpp: node peers' by CUDA IPC, this rank's own, and with FI_HMEM
  // other nodes' through the NIC) rather than host arenas.
  uint64_t sends_to_device_arenas = 0;
  // With fabric.reorder (a testing aid): completions the reorder shim delivered here after a
  // later write's (writes from other nodes landing, and this rank's writes to them completing);
  // unset without a fabric or with the shim off.
  std::optional<uint64_t> reordered_completions;
  // How long each step of the Buffer's creation took, in order (seconds): "landing region"
  // (with the metrics port and host threads), "options agreed", "node memory", "fabric open",
  // "fabric addresses", "memory registered", "regions shared", "channels", "connections" (each
  // pair's fabric connection opened from its lower rank, then a barrier), "proxy started", "ready
  // barrier", "modes" (the fabric steps only when the group spans nodes; "daemon session" for them
  // with proxy.mode = daemon).
  StepClock::Steps setup_steps;
  PhaseTimes dispatch_phases, combine_phases;  // normal-mode calls
};

// DeepEP's intranode handle, plus what combine and cached dispatch need.
struct DispatchHandle {
  Tensor rank_prefix_matrix;  // i32 [R, R]: [s][d] = rows ranks 0..s send to rank d
  Tensor recv_src_idx;        // i32 [num_recv]: token index at its source rank
  Tensor is_token_in_rank;    // bool [N, R]
  Tensor send_head;           // i32 [N, R]: token's position among the rows sent to rank r, or -1
  int num_tokens = 0;         // N, this rank's tokens at dispatch
  int num_experts = 0;        // the dispatch's (a cached dispatch may carry top-k again)
  int num_recv_tokens = 0;    // rows really received (recv_x may have num_worst_tokens rows)
  int hidden = 0;
  uint64_t buffer_id = 0;  // the Buffer that made it
  // Hierarchical internode: the heads of the rows this rank forwarded for each counterpart
  // (rank order; i32 [rows, ranks_per_node]), which its combine reduces by.
  std::vector<Tensor> forward_heads;
  // DeepEP V2's order inside a node (gpu_side/ep/combine_order.hpp's node_order_rows), which a
  // hierarchical combine given CombineArgs::order adds the node's ranks' rows in: this rank's
  // tokens over its own node's ranks (i32 [N, ranks_per_node]) and, by counterpart as
  // forward_heads, the forwarded rows' over this node's. Fresh dispatches with topk_idx.
  Tensor own_node_order;
  std::vector<Tensor> forward_orders;
};

struct DispatchArgs {
  TensorRef x;         // bf16 [N, H], or fp8_e4m3 [N, H] with x_scales
  TensorRef x_scales;  // f32 or i32 (packed UE8M0) [N, H / 128], strides honoured
  // Cached mode: reuse its routing. Top-k travels only if given again (DeepEP V2: a cached
  // dispatch of weights): the handle's dispatch's topk_idx, with topk_weights.
  const DispatchHandle* handle = nullptr;
  TensorRef num_tokens_per_rank;       // i32 [R]
  TensorRef num_tokens_per_rdma_rank;  // i32 [nodes] or None; checked when given (host)
  TensorRef is_token_in_rank;          // bool [N, R]
  TensorRef num_tokens_per_expert;     // i32 [E]
  TensorRef topk_idx;                  // i64 [N, K]
  TensorRef topk_weights;              // f32 [N, K]
  // DeepEP V2's cumulative_local_expert_recv_stats: i32 or i64 [num_experts / R], where x is;
  // += the (token, local expert) pairs this rank receives, unaligned. Fresh dispatches only.
  TensorRef recv_stats;
  int expert_alignment = 1;
  int num_worst_tokens = 0;
  // Its RDMA chunk sizes chunk the streams to other nodes; the rest is accepted (config.hpp).
  std::optional<Config> config;
  // Return once the outputs exist (after the notify phase, which sizes them) and move the rows
  // on the Buffer's communication thread; DispatchResult::event joins it. x and the other inputs
  // are read until then: keep them alive and unchanged.
  bool async_finish = false;
  // With device tensors (DeepEP's previous_event): the Buffer's device stream reads the inputs
  // after this point of the caller's stream (DeviceRuntime::record, or CudaDevice::record_on for
  // a stream of the caller's). Without one, the inputs must be complete before the call.
  // Refused for host tensors.
  std::shared_ptr<gpu_side::device::DeviceEvent> previous_event;

  // A fresh dispatch of x (with x_scales for FP8; undefined for BF16) routed by topk_idx and
  // topk_weights, with the layout get_dispatch_layout computed for them; every option at its
  // default.
  static DispatchArgs routed(const TensorRef& x, const TensorRef& x_scales,
                             const DispatchLayout& layout, const TensorRef& topk_idx,
                             const TensorRef& topk_weights);
};

struct DispatchResult {
  Tensor recv_x;             // same dtype as x
  Tensor recv_x_scales;      // with fp8
  Tensor recv_topk_idx;      // i64 [rows, K], local expert ids, -1 elsewhere (fresh mode)
  Tensor recv_topk_weights;  // f32 [rows, K], 0 where the index is -1 (fresh mode)
  std::vector<int> num_recv_tokens_per_expert;  // aligned; empty with num_worst_tokens / cached
  // The (token, local expert) pairs received per local expert, unaligned (DeepEP V2's
  // num_unaligned_recv_tokens_per_expert); fresh dispatches, with num_worst_tokens too.
  std::vector<int> unaligned_recv_tokens_per_expert;
  DispatchHandle handle;  // complete at once, but for recv_src_idx's contents (with async_finish)
  CallEvent event;        // with async_finish: the rows are in the outputs once it is set
};

struct CombineArgs {
  TensorRef x;  // bf16 [num_recv, H], one row per received token, receive order
  const DispatchHandle* handle = nullptr;
  TensorRef topk_weights;  // f32 [num_recv, K] or None
  TensorRef bias0, bias1;  // bf16 [N, H] or None
  // DeepEP V2's reduce order, or None for V1's (ranks ascending, then the biases): host i32
  // tables of gpu_side/ep/combine_order.hpp computed from the dispatch's topk_idx, over ranks
  // (CombineGroups::rank), or nodes when the Buffer crosses them hierarchically. order
  // [N, groups]; weight_owner [N, K], with topk_weights (V2 selects lane k from its owner's row
  // where V1 sums the rows). Hierarchical: the nodes' partials are added in this order after the
  // biases; inside a node the ranks' rows keep rank order (the same sums for up to 2 ranks per
  // node, as addition of two terms commutes).
  TensorRef order, weight_owner;
  std::optional<Config> config;  // as in DispatchArgs
  // Return at once (the arguments checked, the outputs allocated) and run the whole call on the
  // Buffer's communication thread; CombineResult::event joins it. The inputs and the handle's
  // tensors are read until then.
  bool async_finish = false;
  std::shared_ptr<gpu_side::device::DeviceEvent> previous_event;  // as in DispatchArgs
};

struct CombineResult {
  Tensor combined_x;             // bf16 [N, H]
  Tensor combined_topk_weights;  // f32 [N, K] when topk_weights was given
  CallEvent event;               // with async_finish: the outputs are filled once it is set
};

}  // namespace proxyep
