#include "tools/mpi_baseline/mpi_ep_lean.hpp"

#include "gpu_side/ep/numeric.hpp"

#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
namespace {

// Elements summed per pass over a token's rows: the float sums stay in registers or L1 while
// each row adds a contiguous run, and a fixed count lets GCC's -O2 cost model, which vectorises
// only loops that need no scalar remainder, vectorise the loops.
constexpr int kBlock = 64;

// out[0, W) = bf16(0 + rows[0][c + j] + rows[1][c + j] + ...) in that order (n >= 0).
template <int W>
inline void reduce_block(const uint16_t* const* rows, int n, int64_t c, uint16_t* out) {
  float acc[W];
  for (int j = 0; j < W; ++j)
    acc[j] = 0.0f;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < W; ++j)
      acc[j] += ep::bf16_to_float(rows[i][c + j]);
  for (int j = 0; j < W; ++j)
    out[j] = ep::float_to_bf16(acc[j]);
}

}  // namespace

MpiLeanEp::MetaLayout MpiLeanEp::meta_layout(int topk) {
  MetaLayout m;
  m.topk_idx = 0;
  m.weights = static_cast<size_t>(topk) * sizeof(int64_t);
  m.src = m.weights + static_cast<size_t>(topk) * sizeof(float);
  m.size = m.src + sizeof(int32_t);
  return m;
}

MpiLeanEp::MpiLeanEp(MPI_Comm comm, const ep::EpShape& shape, int hidden, int topk, bool fp8)
    : comm_(comm),
      shape_(shape),
      hidden_(hidden),
      topk_(topk),
      fp8_(fp8),
      x_bytes_(static_cast<size_t>(hidden) * (fp8 ? 1 : 2)),
      scale_bytes_(fp8 ? static_cast<size_t>(hidden / ep::kScaleBlock) * sizeof(float) : 0),
      meta_(meta_layout(topk)),
      x_type_(x_bytes_),
      meta_type_(meta_.size),
      routing_(comm, shape.num_ranks),
      back_(comm, hidden) {
  if (fp8) scale_type_.emplace(scale_bytes_);
}

void MpiLeanEp::pack(const MpiDispatchInputs& in) {
  const auto rows = static_cast<size_t>(routing_.sent_rows());
  send_x_.resize(rows * x_bytes_);
  send_scales_.resize(rows * scale_bytes_);
  send_meta_.resize(rows * meta_.size);
  const auto* x = static_cast<const std::byte*>(in.x.data);
  const auto* scales = static_cast<const std::byte*>(in.x_scales.data);
  const RowMetaOffsets at{meta_.topk_idx, meta_.weights, meta_.src};
  routing_.for_each_sent_row([&](int64_t t, int d, size_t row) {
    std::memcpy(send_x_.data() + row * x_bytes_, x + t * x_bytes_, x_bytes_);
    if (fp8_)
      std::memcpy(send_scales_.data() + row * scale_bytes_, scales + t * scale_bytes_,
                  scale_bytes_);
    write_row_metadata(send_meta_.data() + row * meta_.size, at, shape_, in, topk_, t, d);
  });
}

// One MPI_Alltoallv over the dispatch's routing, in rows of `type`.
void MpiLeanEp::exchange(const void* send, std::byte* recv, MPI_Datatype type, const char* what) {
  check_mpi(
      MPI_Alltoallv(send, routing_.send_counts().data(), routing_.send_displs().data(), type, recv,
                    routing_.recv_counts().data(), routing_.recv_displs().data(), type, comm_),
      what);
}

void MpiLeanEp::unpack_metadata(MpiDispatched& out) const {
  const int64_t rows = routing_.received_rows();
  out.recv_topk_idx = ep::Tensor::empty(ep::DType::i64, rows, topk_);
  out.recv_topk_weights = ep::Tensor::empty(ep::DType::f32, rows, topk_);
  out.recv_src_idx = ep::Tensor::empty(ep::DType::i32, rows);
  out.num_recv_tokens_per_expert.assign(static_cast<size_t>(shape_.experts_per_rank()), 0);
  auto* idx = out.recv_topk_idx.data<int64_t>();
  auto* weights = out.recv_topk_weights.data<float>();
  auto* src = out.recv_src_idx.data<int32_t>();
  for (int64_t i = 0; i < rows; ++i) {
    const std::byte* meta = recv_meta_.data() + i * meta_.size;
    std::memcpy(idx + i * topk_, meta + meta_.topk_idx, topk_ * sizeof(int64_t));
    std::memcpy(weights + i * topk_, meta + meta_.weights, topk_ * sizeof(float));
    std::memcpy(src + i, meta + meta_.src, sizeof(int32_t));
    for (int k = 0; k < topk_; ++k)
      if (idx[i * topk_ + k] >= 0) ++out.num_recv_tokens_per_expert[idx[i * topk_ + k]];
  }
}

MpiDispatched MpiLeanEp::dispatch(const MpiDispatchInputs& in) {
  routing_.plan(in.is_token_in_rank);
  pack(in);
  const int64_t rows = routing_.received_rows();
  MpiDispatched out;
  out.recv_x = ep::Tensor::empty(fp8_ ? ep::DType::fp8_e4m3 : ep::DType::bf16, rows, hidden_);
  exchange(send_x_.data(), out.recv_x.raw(), x_type_.get(), "MPI_Alltoallv(x)");
  if (fp8_) {
    out.recv_x_scales = ep::Tensor::empty(ep::DType::f32, rows, hidden_ / ep::kScaleBlock);
    exchange(send_scales_.data(), out.recv_x_scales.raw(), scale_type_->get(),
             "MPI_Alltoallv(scales)");
  }
  recv_meta_.resize(static_cast<size_t>(rows) * meta_.size);
  exchange(send_meta_.data(), recv_meta_.data(), meta_type_.get(), "MPI_Alltoallv(metadata)");
  unpack_metadata(out);
  return out;
}

ep::Tensor MpiLeanEp::combine(const ep::TensorRef& expert_out) {
  const uint16_t* back = back_.send_back(routing_, expert_out);
  const int ranks = shape_.num_ranks;
  const int64_t tokens = routing_.num_tokens();
  const int64_t hidden = hidden_;
  ep::Tensor out = ep::Tensor::empty(ep::DType::bf16, tokens, hidden);
  auto* dst = out.data<uint16_t>();
  token_rows_.resize(static_cast<size_t>(ranks));
  for (int64_t t = 0; t < tokens; ++t) {
    int n = 0;  // the token's rows, ranks ascending
    for (int d = 0; d < ranks; ++d)
      if (int slot = routing_.slot(t, d); slot >= 0)
        token_rows_[n++] = back + (routing_.send_displs()[d] + slot) * hidden;
    uint16_t* row_out = dst + t * hidden;
    int64_t c = 0;
    for (; c + kBlock <= hidden; c += kBlock)
      reduce_block<kBlock>(token_rows_.data(), n, c, row_out + c);
    for (; c < hidden; c += 8)  // hidden is a multiple of 8 (ep_options.cpp: validate)
      reduce_block<8>(token_rows_.data(), n, c, row_out + c);
  }
  return out;
}

}  // namespace proxyep::tools
