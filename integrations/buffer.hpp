// proxyep::Buffer: DeepEP V1's deep_ep.Buffer (DEEPEP_COMPAT 1.2-1.5, 2.1-2.8) in C++, normal
// and low-latency modes, CPU backend; device tensors in both modes with BufferOptions::device.
// Named structs replace DeepEP's tuples (layout, dispatch result, handle).
//
//   auto boot = control::Bootstrap::from_environment();
//   Buffer buffer(*boot, {.num_nvl_bytes = Buffer::nvl_bytes_hint(4096, 7168 * 2, 8, world)});
//   DispatchLayout layout = buffer.get_dispatch_layout(topk_idx, num_experts);
//   DispatchResult d = buffer.dispatch({.x = x, .num_tokens_per_rank = layout.num_tokens_per_rank,
//       .is_token_in_rank = layout.is_token_in_rank,
//       .num_tokens_per_expert = layout.num_tokens_per_expert,
//       .topk_idx = topk_idx, .topk_weights = topk_weights});
//   ... experts compute on d.recv_x ...
//   CombineResult c = buffer.combine({.x = expert_out, .handle = &d.handle});
//
// Paths. Ranks of one node (ranks_per_node, configuration, so one machine emulates several
// nodes) map each other's receive arenas (memfd shared memory) and copy token rows straight
// into them: the NVLink analog, no proxy. Ranks on other nodes get their rows through the
// descriptor rings, the proxy threads and the fabric (RMA writes with stream immediates,
// ordered by sequence windows; the expected counts come from the notify phase).
//
// Every call is collective over the group and starts with a notify phase in which every rank
// tells every other one how many rows it will send; that exchange doubles as the barrier that
// makes the peers' arenas free for this call. Every wait has a deadline (ep.timeout_ms); a peer
// that does not arrive is named in the error. Arguments are checked before anything is sent:
// bad input throws proxyep::Error on the calling rank only and leaves the Buffer usable. (A
// rank that throws skips the call; its peers then time out naming it, as they would in DeepEP.)
//
// Overlap. A call made with async_finish returns once its outputs exist (a dispatch after its
// notify phase, a combine and a low-latency call at once) and finishes on the Buffer's
// communication thread (comm_stream.hpp), the CPU analog of DeepEP's comm stream; its `event`
// joins it. Every later call first finishes the calls before it, in order, so the caller must
// keep an async call's inputs alive until its event is set or the next call returns.
//
// Sizing. Rows stream through bounded memory in chunks with credits (normal/chunk_plan.hpp),
// as through DeepEP's chunked rings, so any number of tokens fits any Buffer in which one row
// fits a slot: num_nvl_bytes is the receive arena (an equal share per source rank), and
// num_rdma_bytes stages the chunks sent to other nodes. nvl_bytes_hint / rdma_bytes_hint size a
// Buffer that holds whole calls (one chunk per node pair: the fastest); DeepEP's Config hints
// give smaller Buffers that stream. A row that fits no slot is refused before anything is sent.
#pragma once

#include "common/step_clock.hpp"
#include "control/bootstrap.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "integrations/config.hpp"
#include "integrations/low_latency_types.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
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
  // Payloads (eager bytes, chunks) device calls stored into device arenas (proxy/device_arenas.hpp:
  // node peers' by CUDA IPC, this rank's own, and with FI_HMEM other nodes' through the NIC)
  // rather than host arenas.
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

struct BufferOptions {
  int64_t num_nvl_bytes = 0;   // receive arena, shared with the node's ranks and registered
  int64_t num_rdma_bytes = 0;  // staging for rows sent to other nodes (0 on a single node)
  // Low-latency calls (integrations/low_latency/): num_rdma_bytes then also holds their slots
  // (size it with get_low_latency_rdma_size_hint); num_nvl_bytes may be 0 for a Buffer that
  // makes LL calls only.
  bool low_latency_mode = false;
  int num_qps_per_rank = 24;  // accepted for compatibility; the fabric has its own rails
  // With low_latency_mode: false sends to this node's ranks through the fabric too (DeepEP's
  // NVSHMEM_DISABLE_P2P), for normal calls as well.
  bool allow_nvlink_for_low_latency_mode = true;
  // Rank masking (with low_latency_mode): a peer that is lost or does not deliver within
  // ep.timeout_ms is masked and low-latency calls complete for the others, its contributions
  // skipped; normal-mode calls are refused while a rank is masked.
  bool enable_shrink = false;
  bool explicitly_destroy = false;
  int ranks_per_node = 0;  // 0: the bootstrap's LOCAL_WORLD_SIZE
  // The device this rank's device tensors live on (gpu_side/device/device_runtime.hpp): a
  // CudaDevice on a GPU, a SimulatedDevice in tests. Without one, calls take host tensors only.
  // Calls with device tensors, normal and low-latency, run on the device backend, whose kernels
  // pack rows and messages straight into the session's slots (registered with the device while
  // the Buffer lives: device_calls.hpp, device_ll_calls.hpp, device_regions.hpp) and copy
  // arriving ones into device outputs; get_dispatch_layout runs on the device. The node's
  // slots for device calls are device memory the node peers open (CUDA IPC: a device arena of
  // the arena's size, num_nvl_bytes plus the slots' bookkeeping, per rank, as DeepEP's NVLink
  // buffer; proxy/device_arenas.hpp). The
  // device's stream is the Buffer's own: a call's `previous_event` orders it after the work
  // that made the inputs (else they must be complete before the call). Outputs are complete
  // when the call returns (or its event or hook completes) and are released on the Buffer's
  // stream when their last handle goes, which orders the release after the Buffer's work only:
  // drop them after the work of other streams that reads them has finished (as a CUDA caching
  // allocator needs record_stream; DeepEP's allocate_on_comm_stream is that case).
  std::shared_ptr<gpu_side::device::DeviceRuntime> device;
};

// DeepEP's intranode handle, plus what combine and cached dispatch need.
struct DispatchHandle {
  Tensor rank_prefix_matrix;  // i32 [R, R]: [s][d] = rows ranks 0..s send to rank d
  Tensor recv_src_idx;        // i32 [num_recv]: token index at its source rank
  Tensor is_token_in_rank;    // bool [N, R]
  Tensor send_head;           // i32 [N, R]: token's position among the rows sent to rank r, or -1
  int num_tokens = 0;         // N, this rank's tokens at dispatch
  int num_recv_tokens = 0;    // rows really received (recv_x may have num_worst_tokens rows)
  int hidden = 0;
  uint64_t buffer_id = 0;  // the Buffer that made it
  // Hierarchical internode: the heads of the rows this rank forwarded for each counterpart
  // (rank order; i32 [rows, ranks_per_node]), which its combine reduces by.
  std::vector<Tensor> forward_heads;
};

struct DispatchArgs {
  TensorRef x;         // bf16 [N, H], or fp8_e4m3 [N, H] with x_scales
  TensorRef x_scales;  // f32 or i32 (packed UE8M0) [N, H / 128], strides honoured
  const DispatchHandle* handle = nullptr;  // cached mode: reuse its routing, no top-k
  TensorRef num_tokens_per_rank;           // i32 [R]
  TensorRef num_tokens_per_rdma_rank;      // i32 [nodes] or None; checked when given (host)
  TensorRef is_token_in_rank;              // bool [N, R]
  TensorRef num_tokens_per_expert;         // i32 [E]
  TensorRef topk_idx;                      // i64 [N, K]
  TensorRef topk_weights;                  // f32 [N, K]
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
  DispatchHandle handle;  // complete at once, but for recv_src_idx's contents (with async_finish)
  CallEvent event;        // with async_finish: the rows are in the outputs once it is set
};

struct CombineArgs {
  TensorRef x;  // bf16 [num_recv, H], one row per received token, receive order
  const DispatchHandle* handle = nullptr;
  TensorRef topk_weights;        // f32 [num_recv, K] or None
  TensorRef bias0, bias1;        // bf16 [N, H] or None
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

class Buffer {
 public:
  // Collective over the bootstrap's group (which must outlive the Buffer). Throws
  // proxyep::Error for bad options, a failed peer or a failed fabric.
  Buffer(control::Bootstrap& bootstrap, BufferOptions options);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  int rank() const;
  int group_size() const;
  int ranks_per_node() const;
  // The port this rank's metrics endpoint listens on (metrics.port), or -1 without one.
  int metrics_port() const;
  int64_t num_nvl_bytes() const;
  int64_t num_rdma_bytes() const;
  bool low_latency_mode() const;
  bool explicitly_destroy() const;
  BufferStats stats() const;

  // Bytes that hold a whole call (no streaming): every rank sends up to max_tokens_per_rank
  // tokens of hidden_bytes (plus FP8 scales) with up to num_topk selections.
  static int64_t nvl_bytes_hint(int64_t max_tokens_per_rank, int64_t hidden_bytes, int num_topk,
                                int num_ranks);
  static int64_t rdma_bytes_hint(int64_t max_tokens_per_rank, int64_t hidden_bytes, int num_topk,
                                 int num_ranks, int ranks_per_node);

  // `previous_event`: with a device topk_idx, as in DispatchArgs.
  DispatchLayout get_dispatch_layout(
      const TensorRef& topk_idx, int num_experts,
      std::shared_ptr<gpu_side::device::DeviceEvent> previous_event = nullptr);
  DispatchResult dispatch(const DispatchArgs& args);
  CombineResult combine(const CombineArgs& args);

  // ---- low-latency mode (DEEPEP_COMPAT 1.4 items 5-8, 2.8; integrations/low_latency/) ----
  // Bytes of num_rdma_bytes that hold LL calls of these sizes (BF16 or FP8, two calls in flight).
  static int64_t get_low_latency_rdma_size_hint(int num_max_dispatch_tokens_per_rank, int hidden,
                                                int num_ranks, int num_experts);
  // Collective: agrees on the LL sizes and makes the LL slots ready after normal-mode calls.
  void clean_low_latency_buffer(int num_max_dispatch_tokens_per_rank, int hidden, int num_experts);
  // With device tensors on one node, both may be captured into a graph (low_latency/
  // ll_captured.hpp): made while the Buffer's device stream captures, or given a previous_event
  // recorded inside the caller's capture, which the Buffer's stream then joins; the result's
  // event is where the caller's stream joins back.
  LowLatencyDispatchResult low_latency_dispatch(const LowLatencyDispatchArgs& args);
  LowLatencyCombineResult low_latency_combine(const LowLatencyCombineArgs& args);
  // bf16 [E_local * R*T, H]: where a zero_copy combine of `handle` reads its expert outputs.
  Tensor get_next_low_latency_combine_buffer(const LowLatencyHandle& handle);
  // Rank masking (enable_shrink): mask (or unmask) a rank by hand; read the mask into an i32 [R]
  // tensor (1 = masked); unmask every rank. Masks are local. What a masked rank sends is dropped,
  // so after unmasking a rank on every rank, synchronise them (a barrier of the caller's) before
  // the next call: a record that rank sent to a rank still masking it would be lost.
  void low_latency_update_mask_buffer(int rank_to_mask, bool mask = false);
  void low_latency_query_mask_buffer(const TensorRef& mask_status);
  void low_latency_clean_mask_buffer();

  // DeepEP's get_local_buffer_tensor: this rank's NVL buffer (the arena's data area, num_nvl_bytes
  // bytes, where node peers' rows land) or RDMA buffer (the staging data area, num_rdma_bytes,
  // rows on their way to other nodes: only when the group spans nodes). Raw bytes that every
  // call rewrites; valid until the Buffer is destroyed.
  std::span<std::byte> local_buffer(bool use_rdma_buffer);

  // Collective; required before destruction when explicitly_destroy, allowed otherwise. After
  // it every call throws.
  void destroy();

 private:
  struct Impl;  // buffer.cpp: the session, the backend and the protocol
  std::unique_ptr<Impl> impl_;
};

}  // namespace proxyep
