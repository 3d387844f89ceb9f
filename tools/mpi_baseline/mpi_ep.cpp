#include "tools/mpi_baseline/mpi_ep.hpp"

#include "gpu_side/ep/numeric.hpp"

#include <algorithm>
#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
namespace {

constexpr size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace

MpiAlltoallvEp::RecordLayout MpiAlltoallvEp::record_layout(int hidden, int topk, bool fp8) {
  RecordLayout r;
  r.x_bytes = static_cast<size_t>(hidden) * (fp8 ? 1 : 2);
  r.scale_bytes = fp8 ? static_cast<size_t>(hidden / ep::kScaleBlock) * sizeof(float) : 0;
  r.scales = r.x_bytes;
  r.topk_idx = align_up(r.scales + r.scale_bytes, 8);
  r.weights = r.topk_idx + static_cast<size_t>(topk) * sizeof(int64_t);
  r.src = r.weights + static_cast<size_t>(topk) * sizeof(float);
  r.size = align_up(r.src + sizeof(int32_t), 16);
  return r;
}

MpiAlltoallvEp::MpiAlltoallvEp(MPI_Comm comm, const ep::EpShape& shape, int hidden, int topk,
                               bool fp8)
    : comm_(comm),
      shape_(shape),
      hidden_(hidden),
      topk_(topk),
      fp8_(fp8),
      record_(record_layout(hidden, topk, fp8)),
      record_type_(record_.size),
      routing_(comm, shape.num_ranks),
      back_(comm, hidden) {}

void MpiAlltoallvEp::pack(const MpiDispatchInputs& in) {
  send_buf_.resize(static_cast<size_t>(routing_.sent_rows()) * record_.size);
  const auto* x = static_cast<const std::byte*>(in.x.data);
  const auto* scales = static_cast<const std::byte*>(in.x_scales.data);
  const RowMetaOffsets at{record_.topk_idx, record_.weights, record_.src};
  routing_.for_each_sent_row([&](int64_t t, int d, size_t row) {
    std::byte* rec = send_buf_.data() + row * record_.size;
    std::memcpy(rec + record_.x, x + t * record_.x_bytes, record_.x_bytes);
    if (fp8_)
      std::memcpy(rec + record_.scales, scales + t * record_.scale_bytes, record_.scale_bytes);
    write_row_metadata(rec, at, shape_, in, topk_, t, d);
  });
}

MpiDispatched MpiAlltoallvEp::unpack(int64_t rows) const {
  MpiDispatched out;
  out.recv_x = ep::Tensor::empty(fp8_ ? ep::DType::fp8_e4m3 : ep::DType::bf16, rows, hidden_);
  if (fp8_) out.recv_x_scales = ep::Tensor::empty(ep::DType::f32, rows, hidden_ / ep::kScaleBlock);
  out.recv_topk_idx = ep::Tensor::empty(ep::DType::i64, rows, topk_);
  out.recv_topk_weights = ep::Tensor::empty(ep::DType::f32, rows, topk_);
  out.recv_src_idx = ep::Tensor::empty(ep::DType::i32, rows);
  out.num_recv_tokens_per_expert.assign(static_cast<size_t>(shape_.experts_per_rank()), 0);
  for (int64_t i = 0; i < rows; ++i) {
    const std::byte* rec = recv_buf_.data() + i * record_.size;
    std::memcpy(out.recv_x.raw() + i * record_.x_bytes, rec + record_.x, record_.x_bytes);
    if (fp8_)
      std::memcpy(out.recv_x_scales.raw() + i * record_.scale_bytes, rec + record_.scales,
                  record_.scale_bytes);
    auto* idx = out.recv_topk_idx.data<int64_t>() + i * topk_;
    std::memcpy(idx, rec + record_.topk_idx, topk_ * sizeof(int64_t));
    std::memcpy(out.recv_topk_weights.data<float>() + i * topk_, rec + record_.weights,
                topk_ * sizeof(float));
    std::memcpy(out.recv_src_idx.data<int32_t>() + i, rec + record_.src, sizeof(int32_t));
    for (int k = 0; k < topk_; ++k)
      if (idx[k] >= 0) ++out.num_recv_tokens_per_expert[idx[k]];
  }
  return out;
}

MpiDispatched MpiAlltoallvEp::dispatch(const MpiDispatchInputs& in) {
  routing_.plan(in.is_token_in_rank);
  pack(in);
  const int64_t rows = routing_.received_rows();
  recv_buf_.resize(static_cast<size_t>(rows) * record_.size);
  check_mpi(
      MPI_Alltoallv(send_buf_.data(), routing_.send_counts().data(), routing_.send_displs().data(),
                    record_type_.get(), recv_buf_.data(), routing_.recv_counts().data(),
                    routing_.recv_displs().data(), record_type_.get(), comm_),
      "MPI_Alltoallv(dispatch)");
  return unpack(rows);
}

ep::Tensor MpiAlltoallvEp::combine(const ep::TensorRef& expert_out) {
  const uint16_t* back = back_.send_back(routing_, expert_out);
  // Reduce: per token, float32 sum over the ranks it went to, ascending; one rounding to bf16.
  const int ranks = shape_.num_ranks;
  const int64_t tokens = routing_.num_tokens();
  ep::Tensor out = ep::Tensor::empty(ep::DType::bf16, tokens, hidden_);
  accumulator_.resize(static_cast<size_t>(hidden_));
  auto* dst = out.data<uint16_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    std::fill(accumulator_.begin(), accumulator_.end(), 0.0f);
    for (int d = 0; d < ranks; ++d) {
      int slot = routing_.slot(t, d);
      if (slot < 0) continue;
      const uint16_t* row = back + static_cast<int64_t>(routing_.send_displs()[d] + slot) * hidden_;
      for (int c = 0; c < hidden_; ++c)
        accumulator_[c] += ep::bf16_to_float(row[c]);
    }
    for (int c = 0; c < hidden_; ++c)
      dst[t * hidden_ + c] = ep::float_to_bf16(accumulator_[c]);
  }
  return out;
}

}  // namespace proxyep::tools
