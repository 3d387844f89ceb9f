// A dispatch's routing and streams (dispatch_rows.hpp).
#include "integrations/normal/dispatch_rows.hpp"

#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

TokenRouting TokenRouting::fresh(const ep::TensorRef& is_token_in_rank, int R, int me) {
  TokenRouting r;
  r.in_rank = ep::Tensor::copy_of(is_token_in_rank);
  const int64_t tokens = r.in_rank.rows();
  r.send_head = ep::Tensor::empty(DType::i32, tokens, R);
  r.rows_to.assign(static_cast<size_t>(R), 0);
  const auto* in_rank = r.in_rank.data<bool>();
  auto* head = r.send_head.data<int32_t>();
  for (int64_t t = 0; t < tokens; ++t)
    for (int d = 0; d < R; ++d)
      head[t * R + d] = in_rank[t * R + d] ? static_cast<int32_t>(r.rows_to[d]++) : -1;
  r.gather_tokens(me);
  return r;
}

TokenRouting TokenRouting::cached(const DispatchHandle& handle, int me) {
  TokenRouting r;
  r.in_rank = handle.is_token_in_rank;
  r.send_head = handle.send_head;
  const auto R = static_cast<int>(r.in_rank.cols());
  const int64_t tokens = r.in_rank.rows();
  const auto* in_rank = r.in_rank.data<bool>();
  r.rows_to.assign(static_cast<size_t>(R), 0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int d = 0; d < R; ++d)
      if (in_rank[t * R + d]) ++r.rows_to[d];
  r.gather_tokens(me);
  return r;
}

void TokenRouting::gather_tokens(int me) {
  const auto R = static_cast<int>(in_rank.cols());
  const int64_t tokens = in_rank.rows();
  const auto* marked = in_rank.data<bool>();
  const auto* head = send_head.data<int32_t>();
  tokens_to.assign(static_cast<size_t>(R), {});
  for (int d = 0; d < R; ++d)
    if (d != me) tokens_to[d].resize(static_cast<size_t>(rows_to[d]));
  for (int64_t t = 0; t < tokens; ++t)
    for (int d = 0; d < R; ++d)
      if (d != me && marked[t * R + d])
        tokens_to[d][static_cast<size_t>(head[t * R + d])] = static_cast<int32_t>(t);
}

TokenRoutes TokenRouting::routes() const {
  return {.in_rank = in_rank.data<bool>(),
          .send_head = send_head.data<int32_t>(),
          .ranks = static_cast<int>(in_rank.cols()),
          .tokens = in_rank.rows()};
}

DispatchStreams::DispatchStreams(RowBackend& backend, const DispatchInput& input,
                                 const DispatchArgs& args, const TokenRouting& routing,
                                 const ep::EpShape& shape, int me, bool on_device)
    : RowStreams(backend, input.format, shape.num_ranks),
      input_(input),
      routing_(routing),
      source_{.x = args.x,
              .x_scales = args.x_scales,
              .topk_idx = args.topk_idx,  // a cached dispatch's only when given again
              .topk_weights = args.topk_weights,
              .format = input.format,
              .shape = shape},
      me_(me),
      on_device_(on_device) {}

void DispatchStreams::receive_into(DispatchResult& out, std::vector<int64_t> first_row) {
  out_ = &out;
  first_row_ = std::move(first_row);
}

void DispatchStreams::store_in_place(std::vector<std::byte*> x_to, std::vector<int64_t> landing_at,
                                     std::vector<char> x_from) {
  x_to_ = std::move(x_to);
  landing_at_ = std::move(landing_at);
  x_from_ = std::move(x_from);
}

int64_t DispatchStreams::landing_offset(int d, uint64_t first) const {
  if (landing_at_.empty() || landing_at_[d] < 0) return -1;
  return landing_at_[d] + static_cast<int64_t>(first * format.hidden_bytes);
}

void DispatchStreams::fill(int d, uint64_t first, uint64_t rows, std::byte* slot) {
  const auto areas = ep::RowAreas::of(rows, format);
  auto sink = ep::RowSink::at(slot, areas, 0, d);
  // The slot's x area then stays unused: the chunk still carries the rest of the rows and says,
  // by arriving, that they are all stored.
  std::byte* store_at =
      !x_to_.empty() && x_to_[d] != nullptr ? x_to_[d] + first * format.hidden_bytes : nullptr;
  if (store_at != nullptr) {
    if (!on_device_) sink.x = store_at;
    rows_in_place_ += rows;
  }
  if (!landing_at_.empty() && landing_at_[d] >= 0) rows_in_place_ += rows;  // sent from here
  backend.pack_rows(source_, sink,
                    std::span<const int32_t>(routing_.tokens_to[d]).subspan(first, rows));
  // A device call's kernels cannot store into a node peer's landing region (host memory the
  // device does not map), so its rows went into the slot, which may be device memory (the
  // peer's device arena): the device's stream copies the token bytes on, after the packing and
  // before the chunk is sent (the send waits for the work queued so far). Never the host: it
  // cannot read device memory.
  if (on_device_ && store_at != nullptr)
    backend.copy_rows(store_at, slot + areas.x, static_cast<int64_t>(rows), format.hidden_bytes);
}

void DispatchStreams::take(int s, uint64_t, uint64_t first, uint64_t rows, const std::byte* slot) {
  const auto areas = ep::RowAreas::of(rows, format);
  const auto n = static_cast<int64_t>(rows);
  const int64_t at = first_row_[s] + static_cast<int64_t>(first);
  auto copy = [&](Tensor& to, uint64_t area, uint64_t unit) {
    backend.copy_rows(to.raw() + at * unit, slot + area, n, unit);
  };
  if (x_from_.empty() || x_from_[s] == 0) copy(out_->recv_x, areas.x, format.hidden_bytes);
  if (input_.fp8) copy(out_->recv_x_scales, areas.scales, 4ull * format.scale_cols);
  if (input_.topk > 0) copy(out_->recv_topk_idx, areas.topk_idx, 8ull * input_.topk);
  if (input_.weights) copy(out_->recv_topk_weights, areas.weights, 4ull * input_.topk);
  if (!input_.cached) copy(out_->handle.recv_src_idx, areas.src_index, 4);
}

ep::RowSink DispatchStreams::output_sink(int64_t first_row) const {
  ep::RowSink sink;
  sink.x = out_->recv_x.raw();
  sink.scales = input_.fp8 ? out_->recv_x_scales.data<uint32_t>() : nullptr;
  sink.topk_idx = input_.topk > 0 ? out_->recv_topk_idx.data<int64_t>() : nullptr;
  sink.weights = input_.weights ? out_->recv_topk_weights.data<float>() : nullptr;
  sink.src_index = input_.cached ? nullptr : out_->handle.recv_src_idx.data<int32_t>();
  sink.first_row = first_row;
  sink.rank = me_;
  return sink;
}

void DispatchStreams::local() {
  backend.place_routed_rows(source_, output_sink(first_row_[me_]), routing_.routes());
}

}  // namespace proxyep::integrations::normal
