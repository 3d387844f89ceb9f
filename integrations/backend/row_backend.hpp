// RowBackend: the per-row work of a Buffer's calls, apart from moving bytes between ranks. The
// protocols (integrations/normal) decide which rows go where and when; a backend packs them
// into slots, copies them out, reduces them and allocates the outputs, on the processor that
// holds the tensors:
//   HostBackend    CPU tensors: the CPU twins of the kernels on the host executor
//   (host_backend.hpp) DeviceBackend  device tensors: the kernels on a DeviceRuntime, CUDA or the
//   host-simulated
//                  device (device_backend.hpp)
// Every backend runs the same per-row rules (gpu_side/ep/row_rules.hpp), so results are
// bit-identical whichever runs them.
//
// Memory. Tensors, rows, slots and outputs are in the backend's memory: host memory for the host
// backend; device memory or device-reachable (registered) host memory for a device backend. The
// index arrays that steer the work (`tokens`, TokenRoutes, CombineInput's send_head and per-rank
// tables) are host memory: the protocols compute them on the host, and a device backend uploads
// them.
//
// Completion. A backend may queue its work and return before it has run (a device backend's
// stream). mark() names the point after everything queued so far; once reached(mark) is true,
// or wait(mark) returned, that work has written its outputs and stopped reading its inputs (the
// steering arrays are taken when a call is made: they may change at once). So the protocols
// wait for a mark before they publish what the work wrote or let what it reads change: before a
// filled chunk is sent, before a slot's credit goes back, before a call ends (complete()). The
// host backend's work is done when each call returns: its marks are reached at once.
#pragma once

#include "common/error.hpp"
#include "gpu_side/device/device_runtime.hpp"
#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/kernel_params.hpp"
#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/ll_kernel_params.hpp"
#include "gpu_side/ep/row_format.hpp"
#include "gpu_side/ep/row_rules.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace proxyep::integrations {

// The sender's rows, as the call passed them (or, a forwarder's, as they arrived).
struct RowSource {
  gpu_side::ep::TensorRef x, x_scales, topk_idx, topk_weights;
  gpu_side::ep::RowFormat format;
  gpu_side::ep::EpShape shape;
  // Hierarchical internode (gpu_side::ep::RowInput): the source token indices rows carry on
  // (null: their own), and each row's heads (format.heads > 0). In the backend's memory, as x:
  // the kernels read them.
  const int32_t* src_index = nullptr;
  const int32_t* heads = nullptr;
  int64_t head_stride = 0, head_first = 0;
};

// `source` as the raw pointers the shared rules and the kernels read.
inline gpu_side::ep::RowInput row_input(const RowSource& source) {
  gpu_side::ep::RowInput in;
  in.x = static_cast<const std::byte*>(source.x.data);
  if (source.x_scales.defined()) {
    in.scales = source.x_scales.as<uint32_t>();
    in.scale_row_stride = source.x_scales.row_stride;
    in.scale_col_stride = source.x_scales.col_stride;
  }
  in.topk_idx = source.topk_idx.defined() ? source.topk_idx.as<int64_t>() : nullptr;
  in.topk_weights = source.topk_weights.defined() ? source.topk_weights.as<float>() : nullptr;
  in.src_index = source.src_index;
  in.heads = source.heads;
  in.head_stride = source.head_stride;
  in.head_first = source.head_first;
  in.format = source.format;
  in.shape = source.shape;
  return in;
}

// Where each of a rank's tokens goes: is_token_in_rank and its positions (send_head).
struct TokenRoutes {
  const bool* in_rank = nullptr;       // [tokens, ranks]
  const int32_t* send_head = nullptr;  // [tokens, ranks]: position among the rows to that rank
  int ranks = 0;
  int64_t tokens = 0;
};

// The tokens of an ll_combine's row table (`topk` entries each); throws proxyep::Error when the
// table does not split into tokens.
inline int64_t ll_combine_tokens(std::span<const uint16_t* const> rows, int topk) {
  require(topk >= 1 && rows.size() % static_cast<size_t>(topk) == 0, "low_latency_combine",
          "a row table of {} entries is not made of tokens of topk {}", rows.size(), topk);
  return static_cast<int64_t>(rows.size()) / topk;
}

// Throws proxyep::Error when an ll_pack item names a token x does not have.
inline void require_ll_tokens(std::span<const gpu_side::ep::LlPackItem> items, int64_t tokens) {
  for (const gpu_side::ep::LlPackItem& item : items)
    require(item.token >= 0 && item.token < tokens, "low_latency_dispatch",
            "a message of token {} packed from x of {} tokens", item.token, tokens);
}

class RowBackend {
 public:
  virtual ~RowBackend() = default;

  virtual gpu_side::ep::Tensor allocate(gpu_side::ep::DType dtype, int64_t rows, int64_t cols) = 0;
  virtual gpu_side::ep::Tensor allocate(gpu_side::ep::DType dtype, int64_t rows) = 0;
  // get_dispatch_layout of `topk_idx` (already validated).
  virtual gpu_side::ep::DispatchLayout layout(const gpu_side::ep::TensorRef& topk_idx,
                                              const gpu_side::ep::EpShape& shape) = 0;

  // Dispatch: token tokens[i] of `source` becomes row sink.first_row + i of `sink`.
  virtual void pack_rows(const RowSource& source, const gpu_side::ep::RowSink& sink,
                         std::span<const int32_t> tokens) = 0;
  // Dispatch: every token routed to sink.rank becomes row sink.first_row + its send_head there.
  virtual void place_routed_rows(const RowSource& source, const gpu_side::ep::RowSink& sink,
                                 const TokenRoutes& routes) = 0;
  // `rows` rows of `row_bytes` from `from` to `to`.
  virtual void copy_rows(std::byte* to, const std::byte* from, int64_t rows,
                         uint64_t row_bytes) = 0;
  // Each run's bytes from its `from` to its `to` (one batch of work: a device copies them all in
  // one kernel; the run table on the host, taken with the call).
  virtual void copy_runs(std::span<const gpu_side::ep::CopyRun> runs) = 0;
  // `bytes` bytes at `to` set to `value`.
  virtual void fill(std::byte* to, uint8_t value, uint64_t bytes) = 0;
  // Combine: what gpu_side::ep::combine_token gives for tokens [0, num_tokens).
  virtual void reduce(const gpu_side::ep::CombineInput& input, int64_t num_tokens) = 0;

  // ---- host values into the backend's memory (taken with the call) ----
  // `bytes` bytes of host memory at `from` to `to`.
  virtual void write(std::byte* to, const void* from, uint64_t bytes) = 0;
  // to[i] += values[i] for the caller's statistics tensors (1-D, i32 or i64, at least as long as
  // values; a host one may be a strided view, a device one is contiguous).
  virtual void add(const gpu_side::ep::TensorRef& to, std::span<const int32_t> values) = 0;
  virtual void add(const gpu_side::ep::TensorRef& to, std::span<const int64_t> values) = 0;

  // ---- low-latency mode (gpu_side/ep/ll_rules.hpp) ----
  // Dispatch, sender: row items[i].token of x (bf16 [tokens, format.hidden]) packed as the
  // message at items[i].message (slots: the backend's memory; the item list on the host).
  virtual void ll_pack(const gpu_side::ep::LlFormat& format, const gpu_side::ep::TensorRef& x,
                       std::span<const gpu_side::ep::LlPackItem> items) = 0;
  // Dispatch, sender, steered from the backend's own memory (gpu_side/ep/ll_route.hpp):
  // ll_route() copies topk_idx (i64 [tokens, topk] in the backend's memory, contiguous: the
  // caller may change it once the call returned) and routes the copy on the backend's side,
  // once per call; ll_pack_routed() then packs every selection whose rank has a slot in `slots`
  // ([ranks]; null: not this time) where the host protocol's route() places it, with no item
  // list. The host backend routes nothing (it packs by item lists, casting a token once for all
  // its messages: ll_pack) and refuses both.
  struct LlRouting {
    gpu_side::ep::Tensor topk_idx;  // the copy that was routed
    int32_t experts = 0;
    gpu_side::ep::Tensor counts, positions, invalid;  // i32 [experts], [tokens * topk], [1]
  };
  virtual LlRouting ll_route(const gpu_side::ep::TensorRef& topk_idx, int32_t experts) {
    (void)topk_idx, (void)experts;
    fail("low_latency_dispatch", "this backend routes nothing (it packs by item lists)");
  }
  virtual void ll_pack_routed(const gpu_side::ep::LlFormat& format,
                              const gpu_side::ep::TensorRef& x, const LlRouting& routing,
                              int32_t local_experts, std::span<std::byte* const> slots) {
    (void)format, (void)x, (void)routing, (void)local_experts, (void)slots;
    fail("low_latency_dispatch", "this backend packs by item lists only (it routes nothing)");
  }
  // Combine, home rank, steered from the backend's own memory: as ll_combine, with selection i's
  // row found by its dispatch's `routing` (gpu_side/ep/ll_route.hpp: ll_routed_row) among the
  // rows from[rank] sent back ([ranks]; null: skipped), no row table. Backends that route
  // nothing refuse it.
  virtual void ll_combine_routed(const LlRouting& routing, int32_t local_experts,
                                 std::span<const uint16_t* const> from, const float* weights,
                                 uint16_t* out, uint32_t hidden) {
    (void)routing, (void)local_experts, (void)from, (void)weights, (void)out, (void)hidden;
    fail("low_latency_combine", "this backend combines by row tables only (it routes nothing)");
  }
  // Combine: how many elements of a and b (i64 [count] in the backend's memory, contiguous)
  // differ, once the work queued before is done (waits as wait() does; throws
  // proxyep::Error(phase)): a routed combine's topk_idx checked against its dispatch's. Backends
  // that route nothing refuse it (the host protocol compares entry by entry, naming the first).
  virtual int64_t count_mismatches(const int64_t* a, const int64_t* b, int64_t count,
                                   std::string_view phase) {
    (void)a, (void)b, (void)count;
    fail(std::string(phase), "this backend routes nothing (it compares on the host)");
  }
  // Dispatch, receiver: every source's messages unpacked by the counts alone
  // (gpu_side/ep/ll_counted.hpp): counts (i32 [ranks * sinks], source-major) and each source's
  // slot (from, [ranks]; null: it sent nothing) say where each message is and which row of which
  // sink it becomes; recv_count (i32 [sinks]) and layout_range (i64 [sinks * ranks]) are written
  // beside. The counts and the tables on the host, what they point to in the backend's memory.
  virtual void ll_unpack_counted(const gpu_side::ep::LlFormat& format,
                                 std::span<const int32_t> counts,
                                 std::span<const std::byte* const> from,
                                 std::span<const gpu_side::ep::LlExpertSink> sinks,
                                 int64_t rows_per_expert, int32_t* recv_count,
                                 int64_t* layout_range) = 0;
  // Combine, home rank: out[t] = ll_combine_token(rows + t * topk, weights + t * topk) for the
  // `rows.size() / topk` tokens; rows (null: skipped), weights (f32 [tokens, topk]) and out
  // (bf16 [tokens, hidden]) in the backend's memory, the table of row addresses on the host.
  virtual void ll_combine(std::span<const uint16_t* const> rows, const float* weights,
                          uint16_t* out, int topk, uint32_t hidden) = 0;

  // The device whose stream runs this backend's work, in the order it was queued (none: the host
  // backend). The session may hand writes to that stream (proxy::Session::open_device_route).
  virtual std::shared_ptr<gpu_side::device::DeviceRuntime> stream() const { return nullptr; }

  // ---- completion (above) ----
  using Mark = uint64_t;
  virtual Mark mark() { return 0; }
  // Throws proxyep::Error(phase) for work that failed (and, wait(), at ep.timeout_ms).
  virtual bool reached(Mark mark, std::string_view phase) {
    (void)mark, (void)phase;
    return true;
  }
  virtual void wait(Mark mark, std::string_view phase) { (void)mark, (void)phase; }
  // Waits for everything queued so far.
  void complete(std::string_view phase) { wait(mark(), phase); }
};

}  // namespace proxyep::integrations
