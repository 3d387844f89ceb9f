// proxyep::Buffer's public surface: forwards to Buffer::Impl (buffer_impl.hpp) and adds the
// size hints and the layout call.
#include "integrations/buffer.hpp"

#include "gpu_side/ep/layout.hpp"
#include "gpu_side/ep/row_format.hpp"
#include "integrations/buffer_impl.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep {

Buffer::Buffer(control::Bootstrap& bootstrap, BufferOptions options)
    : impl_(std::make_unique<Impl>(bootstrap, options)) {}

Buffer::~Buffer() = default;

int Buffer::rank() const {
  return impl_->rank;
}
int Buffer::group_size() const {
  return impl_->ranks;
}
int Buffer::ranks_per_node() const {
  return impl_->ranks_per_node;
}
int64_t Buffer::num_nvl_bytes() const {
  return impl_->options.num_nvl_bytes;
}
int64_t Buffer::num_rdma_bytes() const {
  return impl_->options.num_rdma_bytes;
}
bool Buffer::explicitly_destroy() const {
  return impl_->options.explicitly_destroy;
}

BufferStats Buffer::stats() const {
  return impl_->stats;
}

namespace {

// The widest row a call may carry: FP8 scales and weights included, with bf16's bytes.
ep::RowFormat widest_row(int64_t hidden_bytes, int num_topk) {
  ep::RowFormat f;
  f.hidden_bytes = static_cast<uint32_t>(hidden_bytes);
  f.scale_cols = static_cast<uint32_t>((hidden_bytes + 127) / 128);
  f.topk = static_cast<uint32_t>(num_topk);
  f.weights = static_cast<uint32_t>(num_topk);
  f.src_index = 1;
  return f;
}

int64_t round_up_128(uint64_t bytes) {
  return static_cast<int64_t>((bytes + 127) / 128 * 128);
}

}  // namespace

int64_t Buffer::nvl_bytes_hint(int64_t max_tokens_per_rank, int64_t hidden_bytes, int num_topk,
                               int num_ranks) {
  require(max_tokens_per_rank >= 0 && hidden_bytes > 0 && num_topk >= 0 && num_ranks >= 1, "buffer",
          "size hint needs non-negative sizes");
  auto rows = static_cast<uint64_t>(max_tokens_per_rank) * static_cast<uint64_t>(num_ranks);
  return round_up_128(
      ep::RowAreas::bound(std::max<uint64_t>(rows, 1), widest_row(hidden_bytes, num_topk)));
}

int64_t Buffer::rdma_bytes_hint(int64_t max_tokens_per_rank, int64_t hidden_bytes, int num_topk,
                                int num_ranks, int ranks_per_node) {
  require(ranks_per_node >= 1, "buffer", "ranks_per_node must be >= 1");
  int remote = num_ranks - std::min(num_ranks, ranks_per_node);
  if (remote == 0) return 0;
  // Each remote destination gets at most every token, in its own staging block.
  auto f = widest_row(hidden_bytes, num_topk);
  uint64_t per_destination = ep::RowAreas::bound(static_cast<uint64_t>(max_tokens_per_rank), f);
  return round_up_128(per_destination * static_cast<uint64_t>(remote));
}

DispatchLayout Buffer::get_dispatch_layout(const TensorRef& topk_idx, int num_experts) {
  impl_->check_usable("get_dispatch_layout");
  auto shape = impl_->shape_for(num_experts);
  ep::validate_topk_idx(topk_idx, shape, "get_dispatch_layout");
  return ep::compute_dispatch_layout(topk_idx, shape, impl_->executor.get());
}

DispatchResult Buffer::dispatch(const DispatchArgs& args) {
  return impl_->dispatch(args);
}

CombineResult Buffer::combine(const CombineArgs& args) {
  return impl_->combine(args);
}

void Buffer::destroy() {
  if (impl_->destroyed) return;
  impl_->bootstrap.barrier("buffer(destroy)");
  impl_->destroyed = true;
  impl_->stop_proxy();
}

}  // namespace proxyep
