// proxyep::Buffer: DeepEP V1's deep_ep.Buffer (DEEPEP_CONTRACT 1.2-1.5, 2.1-2.8) in C++, normal
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
#include "integrations/normal_types.hpp"
#include "proxy/session/arena_layout.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace proxyep {

namespace integrations {
class RowBackend;
}

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
  // How normal-mode calls cross nodes for this Buffer; unset: ep.internode. Per Buffer because
  // DeepEP V2 chooses it per Buffer (ElasticBuffer's allow_hybrid_mode); every rank must pass
  // the same (checked when the session's sizes are agreed).
  std::optional<proxy::Internode> internode;
  // The deadline of this Buffer's host waits (the session's: every call's waits for peers and
  // for the proxy), in ms; 0: ep.timeout_ms. Device waits keep ep.timeout_ms. Per Buffer for
  // DeepEP V2's num_cpu_timeout_secs.
  int64_t timeout_ms = 0;
  // The device this rank's device tensors live on (gpu_side/device/device_runtime.hpp): a
  // CudaDevice on a GPU, a SimulatedDevice in tests. Without one, calls take host tensors only.
  // Calls with device tensors, normal and low-latency, run on the device backend, whose kernels
  // pack rows and messages straight into the session's slots (registered with the device while
  // the Buffer lives: device_calls.hpp, device_ll_calls.hpp, device_regions.hpp) and copy
  // arriving ones into device outputs; get_dispatch_layout runs on the device. The node's
  // slots for device calls are device memory the node peers open (CUDA IPC: a device arena of
  // the arena's size, num_nvl_bytes plus the slots' bookkeeping, per rank, as DeepEP's NVLink
  // buffer; proxy/session/device_arenas.hpp). The
  // device's stream is the Buffer's own: a call's `previous_event` orders it after the work
  // that made the inputs (else they must be complete before the call). Outputs are complete
  // when the call returns (or its event or hook completes) and are released on the Buffer's
  // stream when their last handle goes, which orders the release after the Buffer's work only:
  // drop them after the work of other streams that reads them has finished (as a CUDA caching
  // allocator needs record_stream; DeepEP's allocate_on_comm_stream is that case).
  std::shared_ptr<gpu_side::device::DeviceRuntime> device;
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
  // Whether normal-mode calls cross nodes hierarchically (a token once per node, forwarded and
  // reduced inside it): then a combine's last step reduces nodes' partials, not ranks' rows.
  bool hierarchical_internode() const;
  // The port this rank's metrics endpoint listens on (metrics.port), or -1 without one.
  int metrics_port() const;
  int64_t num_nvl_bytes() const;
  int64_t num_rdma_bytes() const;
  bool low_latency_mode() const;
  bool explicitly_destroy() const;
  BufferStats stats() const;

  // The per-row work of layers built over these calls (DeepEP V2's expanded layout,
  // integrations/elastic/), on the backend the Buffer's calls use for tensors in host memory
  // (on_device false) or on its device (the device's stream: RowBackend::stream()), once every
  // earlier call has finished. Throws proxyep::Error(phase) for device work without a device.
  integrations::RowBackend& row_backend(bool on_device, std::string_view phase);

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

  // ---- low-latency mode (DEEPEP_CONTRACT 1.4 items 5-8, 2.8; integrations/low_latency/) ----
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
