#include "tools/mpi_baseline/mpi_ep.hpp"

#include "common/error.hpp"
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

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  fail("mpi_baseline", "{} failed: {}", what, std::string(text, static_cast<size_t>(length)));
}

MpiAlltoallvEp::MpiAlltoallvEp(MPI_Comm comm, const ep::EpShape& shape, int hidden, int topk,
                               bool fp8)
    : comm_(comm), shape_(shape), hidden_(hidden), topk_(topk), fp8_(fp8) {
  check_mpi(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
  auto& r = record_;
  r.x_bytes = static_cast<size_t>(hidden) * (fp8 ? 1 : 2);
  r.scale_bytes = fp8 ? static_cast<size_t>(hidden / ep::kScaleBlock) * sizeof(float) : 0;
  r.scales = r.x_bytes;
  r.topk_idx = align_up(r.scales + r.scale_bytes, 8);
  r.weights = r.topk_idx + static_cast<size_t>(topk) * sizeof(int64_t);
  r.src = r.weights + static_cast<size_t>(topk) * sizeof(float);
  r.size = align_up(r.src + sizeof(int32_t), 16);
  check_mpi(MPI_Type_contiguous(static_cast<int>(r.size), MPI_BYTE, &record_type_),
            "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&record_type_), "MPI_Type_commit");
  check_mpi(MPI_Type_contiguous(hidden * 2, MPI_BYTE, &combine_type_), "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&combine_type_), "MPI_Type_commit");
  send_counts_.resize(shape.num_ranks);
  send_displs_.resize(shape.num_ranks);
  recv_counts_.resize(shape.num_ranks);
  recv_displs_.resize(shape.num_ranks);
}

MpiAlltoallvEp::~MpiAlltoallvEp() {
  if (record_type_ != MPI_DATATYPE_NULL) MPI_Type_free(&record_type_);
  if (combine_type_ != MPI_DATATYPE_NULL) MPI_Type_free(&combine_type_);
}

void MpiAlltoallvEp::pack(const MpiDispatchInputs& in) {
  const int ranks = shape_.num_ranks;
  num_tokens_ = in.x.rows;
  // Destinations and slots: a token's record goes once to each rank that owns one of its experts.
  slot_.assign(static_cast<size_t>(num_tokens_ * ranks), -1);
  std::fill(send_counts_.begin(), send_counts_.end(), 0);
  const auto* in_rank = static_cast<const uint8_t*>(in.is_token_in_rank.data);
  for (int64_t t = 0; t < num_tokens_; ++t)
    for (int d = 0; d < ranks; ++d)
      if (in_rank[t * ranks + d]) slot_[t * ranks + d] = send_counts_[d]++;
  int64_t rows = 0;
  for (int d = 0; d < ranks; ++d) {
    send_displs_[d] = static_cast<int>(rows);
    rows += send_counts_[d];
  }
  send_buf_.resize(static_cast<size_t>(rows) * record_.size);

  const auto* x = static_cast<const std::byte*>(in.x.data);
  const auto* scales = static_cast<const std::byte*>(in.x_scales.data);
  const auto* topk_idx = in.topk_idx.as<int64_t>();
  const auto* weights = in.topk_weights.as<float>();
  for (int64_t t = 0; t < num_tokens_; ++t) {
    for (int d = 0; d < ranks; ++d) {
      int slot = slot_[t * ranks + d];
      if (slot < 0) continue;
      std::byte* rec = send_buf_.data() + (send_displs_[d] + slot) * record_.size;
      std::memcpy(rec + record_.x, x + t * record_.x_bytes, record_.x_bytes);
      if (fp8_)
        std::memcpy(rec + record_.scales, scales + t * record_.scale_bytes, record_.scale_bytes);
      for (int k = 0; k < topk_; ++k) {
        int64_t local = shape_.local_expert(topk_idx[t * topk_ + k], d);
        float weight = local >= 0 ? weights[t * topk_ + k] : 0.0f;
        std::memcpy(rec + record_.topk_idx + k * sizeof(int64_t), &local, sizeof local);
        std::memcpy(rec + record_.weights + k * sizeof(float), &weight, sizeof weight);
      }
      auto src = static_cast<int32_t>(t);
      std::memcpy(rec + record_.src, &src, sizeof src);
    }
  }
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
  pack(in);
  check_mpi(MPI_Alltoall(send_counts_.data(), 1, MPI_INT, recv_counts_.data(), 1, MPI_INT, comm_),
            "MPI_Alltoall(counts)");
  int64_t rows = 0;
  for (int s = 0; s < shape_.num_ranks; ++s) {
    recv_displs_[s] = static_cast<int>(rows);
    rows += recv_counts_[s];
  }
  recv_buf_.resize(static_cast<size_t>(rows) * record_.size);
  check_mpi(MPI_Alltoallv(send_buf_.data(), send_counts_.data(), send_displs_.data(), record_type_,
                          recv_buf_.data(), recv_counts_.data(), recv_displs_.data(), record_type_,
                          comm_),
            "MPI_Alltoallv(dispatch)");
  return unpack(rows);
}

ep::Tensor MpiAlltoallvEp::combine(const ep::TensorRef& expert_out) {
  const int ranks = shape_.num_ranks;
  int64_t received = recv_displs_[ranks - 1] + recv_counts_[ranks - 1];
  require(expert_out.dtype == ep::DType::bf16 && expert_out.rows == received &&
              expert_out.cols == hidden_ && expert_out.contiguous(),
          "mpi_baseline", "combine input must be contiguous bf16 [{}, {}], got {}", received,
          hidden_, expert_out.describe());
  // The reverse exchange: what came from source s goes back to s, in the same order.
  int64_t sent = send_displs_[ranks - 1] + send_counts_[ranks - 1];
  back_buf_.resize(static_cast<size_t>(sent * hidden_));
  check_mpi(MPI_Alltoallv(expert_out.data, recv_counts_.data(), recv_displs_.data(), combine_type_,
                          back_buf_.data(), send_counts_.data(), send_displs_.data(), combine_type_,
                          comm_),
            "MPI_Alltoallv(combine)");
  // Reduce: per token, float32 sum over the ranks it went to, ascending; one rounding to bf16.
  ep::Tensor out = ep::Tensor::empty(ep::DType::bf16, num_tokens_, hidden_);
  accumulator_.resize(static_cast<size_t>(hidden_));
  auto* dst = out.data<uint16_t>();
  for (int64_t t = 0; t < num_tokens_; ++t) {
    std::fill(accumulator_.begin(), accumulator_.end(), 0.0f);
    for (int d = 0; d < ranks; ++d) {
      int slot = slot_[t * ranks + d];
      if (slot < 0) continue;
      const uint16_t* row =
          back_buf_.data() + static_cast<int64_t>(send_displs_[d] + slot) * hidden_;
      for (int c = 0; c < hidden_; ++c)
        accumulator_[c] += ep::bf16_to_float(row[c]);
    }
    for (int c = 0; c < hidden_; ++c)
      dst[t * hidden_ + c] = ep::float_to_bf16(accumulator_[c]);
  }
  return out;
}

}  // namespace proxyep::tools
