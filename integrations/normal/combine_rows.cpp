// A combine's streams (combine_rows.hpp).
#include "integrations/normal/combine_rows.hpp"

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::integrations::normal {

CombineStreams::CombineStreams(RowBackend& backend, const ep::RowFormat& format,
                               const RowCounts& counts, const std::byte* x, const float* weights,
                               int topk, int me, bool x_on_device)
    : RowStreams(backend, format, counts.ranks()),
      counts_(counts),
      x_(x),
      weights_(weights),
      topk_(topk),
      me_(me),
      x_on_device_(x_on_device),
      row_bytes_(format.hidden_bytes),
      block_rows_(static_cast<size_t>(counts.ranks()), nullptr),
      block_weights_(static_cast<size_t>(counts.ranks()), nullptr),
      gathered_x_(static_cast<size_t>(counts.ranks())),
      gathered_weights_(static_cast<size_t>(counts.ranks())),
      chunk_x_(static_cast<size_t>(counts.ranks())),
      block_chunks_(static_cast<size_t>(counts.ranks()), nullptr),
      block_chunk_rows_(static_cast<size_t>(counts.ranks()), 0) {
  // This rank's rows for itself stay in x.
  const int64_t self_first = counts.first_from(me, me);
  block_rows_[me] = reinterpret_cast<const uint16_t*>(x + self_first * row_bytes_);
  block_weights_[me] = weights != nullptr ? weights + self_first * topk : nullptr;
}

void CombineStreams::fill(int s, uint64_t first, uint64_t rows, std::byte* slot) {
  // The rows for source s are x's rows [first_from(s, me), ...), in receive order.
  const auto areas = ep::RowAreas::of(rows, format);
  const int64_t from = counts_.first_from(s, me_) + static_cast<int64_t>(first);
  const auto n = static_cast<int64_t>(rows);
  backend.copy_rows(slot + areas.x, x_ + from * row_bytes_, n, row_bytes_);
  if (weights_ != nullptr)
    backend.copy_rows(slot + areas.weights,
                      reinterpret_cast<const std::byte*>(weights_ + from * topk_), n, 4ull * topk_);
}

const std::byte* CombineStreams::caller_rows(int s, uint64_t first, uint64_t rows) const {
  // RowAreas::x leads the chunk; with no weights nothing follows it.
  (void)rows;
  if (weights_ != nullptr || x_on_device_) return nullptr;
  return x_ + (counts_.first_from(s, me_) + static_cast<int64_t>(first)) * row_bytes_;
}

void CombineStreams::take(int r, uint64_t chunk, uint64_t first, uint64_t rows,
                          const std::byte* slot) {
  const auto areas = ep::RowAreas::of(rows, format);
  const ChunkPlan& plan = in[r];
  if (plan.chunks == 1) {
    block_rows_[r] = reinterpret_cast<const uint16_t*>(slot + areas.x);
    block_weights_[r] = reinterpret_cast<const float*>(slot + areas.weights);
    return;
  }
  const auto total = static_cast<int64_t>(plan.rows);  // the rows r returns
  const auto n = static_cast<int64_t>(rows);
  if (plan.chunks <= plan.window) {
    if (chunk_x_[r].empty()) {
      chunk_x_[r].resize(static_cast<size_t>(plan.chunks));
      block_chunks_[r] = chunk_x_[r].data();
      block_chunk_rows_[r] = static_cast<int64_t>(plan.rows_per_chunk);
    }
    chunk_x_[r][chunk] = reinterpret_cast<const uint16_t*>(slot + areas.x);
    ++chunks_in_place_;
  } else {
    if (!gathered_x_[r].defined()) {
      gathered_x_[r] = backend.allocate(DType::bf16, total, row_bytes_ / 2);
      block_rows_[r] = gathered_x_[r].data<uint16_t>();
    }
    backend.copy_rows(gathered_x_[r].raw() + first * row_bytes_, slot + areas.x, n, row_bytes_);
  }
  if (topk_ == 0) return;
  if (!gathered_weights_[r].defined()) {
    gathered_weights_[r] = backend.allocate(DType::f32, total, topk_);
    block_weights_[r] = gathered_weights_[r].data<float>();
  }
  backend.copy_rows(gathered_weights_[r].raw() + first * 4ull * topk_, slot + areas.weights, n,
                    4ull * topk_);
}

}  // namespace proxyep::integrations::normal
