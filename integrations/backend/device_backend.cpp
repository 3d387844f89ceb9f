// The device backend (device_backend.hpp).
#include "integrations/backend/device_backend.hpp"

#include "common/error.hpp"
#include "common/params.hpp"
#include "gpu_side/ep/layout.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations {

using gpu_side::device::EpKernels;

namespace {

void require_on_device(const ep::TensorRef& t, std::string_view phase, std::string_view name) {
  if (t.defined())
    require(t.device == ep::Device::cuda, phase,
            "{} must be on the same device as the call's other tensors; got {} in host memory",
            name, t);
}

void require_source_on_device(const RowSource& source, std::string_view phase) {
  require_on_device(source.x, phase, "x");
  require_on_device(source.x_scales, phase, "x_scales");
  require_on_device(source.topk_idx, phase, "topk_idx");
  require_on_device(source.topk_weights, phase, "topk_weights");
}

}  // namespace

DeviceBackend::DeviceBackend(std::shared_ptr<gpu_side::device::DeviceRuntime> device)
    : device_(std::move(device)) {
  require(device_ != nullptr, "device backend", "no device runtime given");
}

template <typename T>
const T* DeviceBackend::upload(const T* host, size_t count) {
  if (count == 0) return nullptr;
  // The copy may run any time before the next mark, and callers pass arrays that die sooner (a
  // table built in a nested scope): the bytes are taken now, into staging held until then.
  const size_t bytes = count * sizeof(T);
  const std::byte* staged = stage(host, bytes);
  Upload& upload = uploads_.back();
  upload.device = device_->allocate(bytes);
  device_->copy(upload.device.get(), staged, bytes);
  return reinterpret_cast<const T*>(upload.device.get());
}

const std::byte* DeviceBackend::stage(const void* host, size_t bytes) {
  Upload& staged = uploads_.emplace_back(
      Upload{.before = last_ + 1, .device = nullptr, .host = std::vector<std::byte>(bytes)});
  std::memcpy(staged.host.data(), host, bytes);
  return staged.host.data();
}

DeviceBackend::Mark DeviceBackend::mark() {
  std::lock_guard lock(mutex_);
  if (!queued_) return last_;  // the newest mark already follows everything queued
  pending_.push_back({.mark = ++last_, .event = device_->record()});
  queued_ = false;
  return last_;
}

bool DeviceBackend::reached(Mark mark, std::string_view phase) {
  std::lock_guard lock(mutex_);
  require(mark <= last_, phase, "mark {} was never handed out (newest {})", mark, last_);
  // The stream runs in order: the oldest marks are reached first.
  while (!pending_.empty() && mark > done_ && device_->reached(*pending_.front().event, phase))
    passed(pending_.front().mark);
  return mark <= done_;
}

void DeviceBackend::wait(Mark mark, std::string_view phase) {
  std::unique_lock lock(mutex_);
  require(mark <= last_, phase, "mark {} was never handed out (newest {})", mark, last_);
  if (mark <= done_) return;
  // Every mark in (done_, last_] is pending: `mark`'s own event is there.
  const Recorded awaited = *std::find_if(pending_.begin(), pending_.end(),
                                         [&](const Recorded& r) { return r.mark == mark; });
  lock.unlock();  // another thread may queue work meanwhile
  device_->wait_for(*awaited.event, phase, std::chrono::milliseconds(params::ep_timeout_ms.get()));
  lock.lock();
  passed(awaited.mark);
}

void DeviceBackend::passed(Mark mark) {
  done_ = std::max(done_, mark);
  while (!pending_.empty() && pending_.front().mark <= done_)
    pending_.pop_front();
  // The device copy is released in stream order; the host bytes were read before the mark.
  while (!uploads_.empty() && uploads_.front().before <= done_)
    uploads_.pop_front();
}

ep::Tensor DeviceBackend::allocate(ep::DType dtype, int64_t rows, int64_t cols) {
  require(rows >= 0 && cols >= 0, "device backend", "negative shape [{}, {}]", rows, cols);
  const uint64_t bytes = static_cast<uint64_t>(rows * cols) * ep::dtype_size(dtype);
  return ep::Tensor::over(device_->allocate(bytes), dtype, rows, cols, ep::Device::cuda);
}

ep::Tensor DeviceBackend::allocate(ep::DType dtype, int64_t rows) {
  require(rows >= 0, "device backend", "negative shape [{}]", rows);
  const uint64_t bytes = static_cast<uint64_t>(rows) * ep::dtype_size(dtype);
  return ep::Tensor::over(device_->allocate(bytes), dtype, rows, -1, ep::Device::cuda);
}

ep::DispatchLayout DeviceBackend::layout(const ep::TensorRef& topk_idx, const ep::EpShape& shape) {
  constexpr std::string_view kPhase = "get_dispatch_layout";
  ep::require_dtype(topk_idx, ep::DType::i64, kPhase, "topk_idx");
  require_on_device(topk_idx, kPhase, "topk_idx");
  ep::require_contiguous(topk_idx, kPhase, "topk_idx");
  // The host path's checks, on a host copy: the kernel trusts every entry.
  ep::Tensor checked = topk_idx.dims == 2
                           ? ep::Tensor::empty(ep::DType::i64, topk_idx.rows, topk_idx.cols)
                           : ep::Tensor::empty(ep::DType::i64, topk_idx.rows);
  copy_rows(checked.raw(), static_cast<const std::byte*>(topk_idx.data), 1, checked.bytes());
  complete(kPhase);
  ep::validate_topk_idx(checked, shape, kPhase);

  const int64_t tokens = topk_idx.rows;
  const int ranks = shape.num_ranks;
  ep::DispatchLayout layout;
  layout.num_tokens_per_rank = allocate(ep::DType::i32, ranks);
  if (ep::layout_has_node_counts(shape))
    layout.num_tokens_per_rdma_rank = allocate(ep::DType::i32, shape.num_nodes());
  layout.num_tokens_per_expert = allocate(ep::DType::i32, shape.num_experts);
  layout.is_token_in_rank = allocate(ep::DType::boolean, tokens, ranks);
  std::unique_lock lock(mutex_);
  queue_kernel(*device_, &EpKernels::dispatch_layout,
               {.topk_idx = topk_idx.as<int64_t>(),
                .num_tokens = tokens,
                .topk = static_cast<int>(topk_idx.cols),
                .shape = shape,
                .tokens_per_rank = layout.num_tokens_per_rank.data<int32_t>(),
                .tokens_per_node = layout.num_tokens_per_rdma_rank.defined()
                                       ? layout.num_tokens_per_rdma_rank.data<int32_t>()
                                       : nullptr,
                .tokens_per_expert = layout.num_tokens_per_expert.data<int32_t>(),
                .is_token_in_rank = layout.is_token_in_rank.data<bool>()});
  queued();
  lock.unlock();
  // Done on return: the caller may read the layout from any stream of its own.
  complete(kPhase);
  return layout;
}

void DeviceBackend::pack_rows(const RowSource& source, const ep::RowSink& sink,
                              std::span<const int32_t> tokens) {
  if (tokens.empty()) return;
  require_source_on_device(source, "dispatch");
  std::lock_guard lock(mutex_);
  queue_kernel(*device_, &EpKernels::dispatch_chunk,
               {.input = row_input(source),
                .tokens = upload(tokens.data(), tokens.size()),
                .sink = sink,
                .rows = static_cast<int64_t>(tokens.size())});
  queued();
}

void DeviceBackend::place_routed_rows(const RowSource& source, const ep::RowSink& sink,
                                      const TokenRoutes& routes) {
  if (routes.tokens <= 0) return;
  require_source_on_device(source, "dispatch");
  // Only sink.rank's column is written: the kernel skips destinations whose sink has no rows.
  std::vector<ep::RowSink> sinks(static_cast<size_t>(routes.ranks));
  sinks[static_cast<size_t>(sink.rank)] = sink;
  std::lock_guard lock(mutex_);
  queue_kernel(
      *device_, &EpKernels::dispatch_rows,
      {.input = row_input(source),
       .send_head = upload(routes.send_head, static_cast<size_t>(routes.tokens * routes.ranks)),
       .sinks = upload(sinks.data(), sinks.size()),
       .num_tokens = routes.tokens});
  queued();
}

void DeviceBackend::copy_rows(std::byte* to, const std::byte* from, int64_t rows,
                              uint64_t row_bytes) {
  if (rows <= 0) return;
  std::lock_guard lock(mutex_);
  device_->copy(to, from, static_cast<uint64_t>(rows) * row_bytes);
  queued();
}

void DeviceBackend::copy_runs(std::span<const ep::CopyRun> runs) {
  if (runs.empty()) return;
  if (runs.size() == 1) return copy_rows(runs[0].to, runs[0].from, 1, runs[0].bytes);
  std::lock_guard lock(mutex_);
  queue_kernel(
      *device_, &EpKernels::copy_runs,
      {.runs = upload(runs.data(), runs.size()), .num_runs = static_cast<int64_t>(runs.size())});
  queued();
}

void DeviceBackend::fill(std::byte* to, uint8_t value, uint64_t bytes) {
  if (bytes == 0) return;
  std::lock_guard lock(mutex_);
  device_->fill(to, value, bytes);
  queued();
}

void DeviceBackend::reduce(const ep::CombineInput& input, int64_t num_tokens) {
  if (num_tokens <= 0) return;
  const int ranks = input.num_ranks;
  const auto n = static_cast<size_t>(ranks);
  std::lock_guard lock(mutex_);
  ep::CombineInput in = input;
  in.send_head = upload(input.send_head, static_cast<size_t>(num_tokens) * n);
  // DeepEP V2's tables, host memory like send_head (CombineInput).
  if (input.order != nullptr) in.order = upload(input.order, static_cast<size_t>(num_tokens) * n);
  if (input.weight_owner != nullptr && input.topk > 0)
    in.weight_owner = upload(input.weight_owner, static_cast<size_t>(num_tokens * input.topk));
  in.block_rows = upload(input.block_rows, n);
  if (input.topk > 0) in.block_weights = upload(input.block_weights, n);
  if (input.block_chunk_rows != nullptr) {
    // A chunked block's table of chunk addresses is as long as its rows need: the largest
    // position any token has there, plus one, in chunks.
    std::vector<int64_t> rows(n, 0);
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int r = 0; r < ranks; ++r)
        rows[static_cast<size_t>(r)] = std::max<int64_t>(
            rows[static_cast<size_t>(r)], int64_t{input.send_head[t * ranks + r]} + 1);
    std::vector<const uint16_t* const*> chunks(n, nullptr);
    for (size_t r = 0; r < n; ++r) {
      const int64_t per = input.block_chunk_rows[r];
      if (per > 0 && rows[r] > 0)
        chunks[r] = upload(input.block_chunks[r], static_cast<size_t>((rows[r] + per - 1) / per));
    }
    in.block_chunk_rows = upload(input.block_chunk_rows, n);
    in.block_chunks = upload(chunks.data(), n);
  }
  queue_kernel(*device_, &EpKernels::combine, {.input = in, .num_tokens = num_tokens});
  queued();
}

void DeviceBackend::write(std::byte* to, const void* from, uint64_t bytes) {
  if (bytes == 0) return;
  std::lock_guard lock(mutex_);
  device_->copy(to, stage(from, bytes), bytes);
  queued();
}

template <typename T>
void DeviceBackend::add_values(const ep::TensorRef& to, std::span<const T> values) {
  if (values.empty()) return;
  require_on_device(to, "device backend", "a statistics tensor");
  ep::require_contiguous(to, "device backend", "a statistics tensor");
  require(to.rows >= static_cast<int64_t>(values.size()), "device backend", "{} values added to {}",
          values.size(), to);
  std::lock_guard lock(mutex_);
  queue_kernel(*device_, &EpKernels::add,
               {.wide = sizeof(T) == 8,
                .to = const_cast<void*>(to.data),
                .from = upload(values.data(), values.size()),
                .count = static_cast<int64_t>(values.size())});
  queued();
}

void DeviceBackend::add(const ep::TensorRef& to, std::span<const int32_t> values) {
  add_values(to, values);
}

void DeviceBackend::add(const ep::TensorRef& to, std::span<const int64_t> values) {
  add_values(to, values);
}

void DeviceBackend::ll_pack(const ep::LlFormat& format, const ep::TensorRef& x,
                            std::span<const ep::LlPackItem> items) {
  if (items.empty()) return;
  require_on_device(x, "low_latency_dispatch", "x");
  require_ll_tokens(items, x.rows);
  std::lock_guard lock(mutex_);
  queue_kernel(*device_, &EpKernels::ll_pack,
               {.format = format,
                .x = x.as<uint16_t>(),
                .items = upload(items.data(), items.size()),
                .num_items = static_cast<int64_t>(items.size())});
  queued();
}

RowBackend::LlRouting DeviceBackend::ll_route(const ep::TensorRef& topk_idx, int32_t experts) {
  require_on_device(topk_idx, "low_latency_dispatch", "topk_idx");
  ep::require_contiguous(topk_idx, "low_latency_dispatch", "topk_idx");
  // The routing stays on the device (stream-ordered allocations, held by the caller's call);
  // the caller reads the counts and the bad-value count when it needs them.
  LlRouting routing{.topk_idx = allocate(ep::DType::i64, topk_idx.rows, topk_idx.cols),
                    .experts = experts,
                    .counts = allocate(ep::DType::i32, experts),
                    .positions = allocate(ep::DType::i32, topk_idx.rows * topk_idx.cols),
                    .invalid = allocate(ep::DType::i32, 1)};
  copy_rows(routing.topk_idx.raw(), static_cast<const std::byte*>(topk_idx.data), 1,
            routing.topk_idx.bytes());
  std::lock_guard lock(mutex_);
  queue_kernel(*device_, &EpKernels::ll_route,
               {.topk_idx = routing.topk_idx.data<int64_t>(),
                .num_tokens = topk_idx.rows,
                .topk = static_cast<int>(topk_idx.cols),
                .num_experts = experts,
                .counts = routing.counts.data<int32_t>(),
                .positions = routing.positions.data<int32_t>(),
                .invalid = routing.invalid.data<int32_t>()});
  queued();
  return routing;
}

void DeviceBackend::ll_pack_routed(const ep::LlFormat& format, const ep::TensorRef& x,
                                   const LlRouting& routing, int32_t local_experts,
                                   std::span<std::byte* const> slots) {
  require_on_device(x, "low_latency_dispatch", "x");
  std::lock_guard lock(mutex_);
  queue_kernel(*device_, &EpKernels::ll_pack_routed,
               {.format = format,
                .x = x.as<uint16_t>(),
                .topk_idx = routing.topk_idx.data<int64_t>(),
                .positions = routing.positions.data<int32_t>(),
                .counts = routing.counts.data<int32_t>(),
                .slots = upload(slots.data(), slots.size()),
                .num_tokens = routing.topk_idx.rows(),
                .topk = static_cast<int>(routing.topk_idx.cols()),
                .num_experts = routing.experts,
                .local_experts = local_experts});
  queued();
}

void DeviceBackend::ll_unpack_counted(const ep::LlFormat& format, std::span<const int32_t> counts,
                                      std::span<const std::byte* const> from,
                                      std::span<const ep::LlExpertSink> sinks,
                                      int64_t rows_per_expert, int32_t* recv_count,
                                      int64_t* layout_range) {
  std::lock_guard lock(mutex_);
  queue_kernel(*device_, &EpKernels::ll_unpack_counted,
               {.format = format,
                .counts = upload(counts.data(), counts.size()),
                .from = upload(from.data(), from.size()),
                .sinks = upload(sinks.data(), sinks.size()),
                .recv_count = recv_count,
                .layout_range = layout_range,
                .ranks = static_cast<int32_t>(from.size()),
                .local_experts = static_cast<int32_t>(sinks.size()),
                .rows_per_expert = rows_per_expert});
  queued();
}

void DeviceBackend::ll_combine(std::span<const uint16_t* const> rows, const float* weights,
                               uint16_t* out, int topk, uint32_t hidden) {
  const int64_t tokens = ll_combine_tokens(rows, topk);
  if (tokens == 0) return;
  std::lock_guard lock(mutex_);
  queue_kernel(*device_, &EpKernels::ll_combine,
               {.rows = upload(rows.data(), rows.size()),
                .weights = weights,
                .out = out,
                .num_tokens = tokens,
                .topk = topk,
                .hidden = hidden});
  queued();
}

void DeviceBackend::ll_combine_routed(const LlRouting& routing, int32_t local_experts,
                                      std::span<const uint16_t* const> from, const float* weights,
                                      uint16_t* out, uint32_t hidden) {
  if (routing.topk_idx.rows() == 0) return;
  std::lock_guard lock(mutex_);
  queue_kernel(*device_, &EpKernels::ll_combine_routed,
               {.topk_idx = routing.topk_idx.data<int64_t>(),
                .positions = routing.positions.data<int32_t>(),
                .counts = routing.counts.data<int32_t>(),
                .from = upload(from.data(), from.size()),
                .weights = weights,
                .out = out,
                .num_tokens = routing.topk_idx.rows(),
                .topk = static_cast<int>(routing.topk_idx.cols()),
                .num_experts = routing.experts,
                .local_experts = local_experts,
                .hidden = hidden});
  queued();
}

int64_t DeviceBackend::count_mismatches(const int64_t* a, const int64_t* b, int64_t count,
                                        std::string_view phase) {
  ep::Tensor counted = allocate(ep::DType::i32, 1);
  int32_t mismatches = 0;
  {
    std::lock_guard lock(mutex_);
    queue_kernel(*device_, &EpKernels::count_mismatches,
                 {.a = a, .b = b, .count = count, .mismatches = counted.data<int32_t>()});
    device_->copy(&mismatches, counted.raw(), sizeof mismatches);
    queued();
  }
  complete(phase);
  return mismatches;
}

}  // namespace proxyep::integrations
