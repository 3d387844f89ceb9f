#include "tools/mpi_baseline/mpi_ll.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/workload.hpp"
#include "tools/mpi_baseline/mpi_ep.hpp"

#include <algorithm>
#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
namespace {

constexpr size_t kHeaderBytes = 16;  // int32 token index, int32 local expert, 8 bytes unused

}  // namespace

MpiAlltoallvLl::MpiAlltoallvLl(MPI_Comm comm, const ep::EpShape& shape, int tokens, int hidden,
                               int topk, bool fp8)
    : comm_(comm), shape_(shape), tokens_(tokens), hidden_(hidden), topk_(topk), fp8_(fp8) {
  payload_bytes_ = static_cast<size_t>(hidden) * (fp8 ? 1 : 2);
  scale_bytes_ = fp8 ? static_cast<size_t>(hidden / ep::kScaleBlock) * sizeof(float) : 0;
  message_bytes_ = kHeaderBytes + payload_bytes_ + scale_bytes_;
  check_mpi(MPI_Type_contiguous(static_cast<int>(message_bytes_), MPI_BYTE, &message_type_),
            "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&message_type_), "MPI_Type_commit");
  check_mpi(MPI_Type_contiguous(hidden * 2, MPI_BYTE, &row_type_), "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&row_type_), "MPI_Type_commit");
  selections_.resize(static_cast<size_t>(shape.num_experts));
  for (auto* counts : {&send_counts_, &send_displs_, &recv_counts_, &recv_displs_})
    counts->resize(static_cast<size_t>(shape.num_ranks));
}

MpiAlltoallvLl::~MpiAlltoallvLl() {
  if (message_type_ != MPI_DATATYPE_NULL) MPI_Type_free(&message_type_);
  if (row_type_ != MPI_DATATYPE_NULL) MPI_Type_free(&row_type_);
}

void MpiAlltoallvLl::pack(const ep::Tensor& x) {
  const int local = shape_.experts_per_rank();
  for (auto& list : selections_)
    list.clear();
  for (int64_t sel = 0; sel < num_tokens_ * topk_; ++sel)
    if (topk_idx_[sel] >= 0) selections_[topk_idx_[sel]].push_back(static_cast<int>(sel));
  int messages = 0;
  for (int d = 0; d < shape_.num_ranks; ++d) {
    send_displs_[d] = messages;
    send_counts_[d] = 0;
    for (int e = 0; e < local; ++e)
      send_counts_[d] += static_cast<int>(selections_[d * local + e].size());
    messages += send_counts_[d];
  }
  // The cast of every token, once per call, as DeepEP's LL dispatch casts inside the kernel.
  if (fp8_) ep::cast_to_fp8(x, x_fp8_, x_scales_);
  const auto* rows = fp8_ ? x_fp8_.raw() : x.raw();
  send_buf_.resize(static_cast<size_t>(messages) * message_bytes_);
  message_of_.assign(static_cast<size_t>(num_tokens_ * topk_), -1);
  // Experts ascending is destination ranks ascending, then experts, then tokens.
  int m = 0;
  for (int expert = 0; expert < shape_.num_experts; ++expert) {
    for (int sel : selections_[expert]) {
      std::byte* msg = send_buf_.data() + static_cast<size_t>(m) * message_bytes_;
      const int32_t header[4] = {sel / topk_, expert % local, 0, 0};
      std::memcpy(msg, header, kHeaderBytes);
      std::memcpy(msg + kHeaderBytes, rows + static_cast<size_t>(sel / topk_) * payload_bytes_,
                  payload_bytes_);
      if (fp8_)
        std::memcpy(msg + kHeaderBytes + payload_bytes_,
                    x_scales_.raw() + static_cast<size_t>(sel / topk_) * scale_bytes_,
                    scale_bytes_);
      message_of_[sel] = m++;
    }
  }
}

MpiLlDispatched MpiAlltoallvLl::unpack() {
  const int ranks = shape_.num_ranks, local = shape_.experts_per_rank();
  const int64_t slots = int64_t{ranks} * tokens_, groups = hidden_ / ep::kScaleBlock;
  MpiLlDispatched out;
  out.recv_x =
      ep::Tensor::empty(fp8_ ? ep::DType::fp8_e4m3 : ep::DType::bf16, local * slots, hidden_);
  if (fp8_) out.recv_x_scales = ep::Tensor::empty(ep::DType::f32, local * groups, slots);
  out.recv_count = ep::Tensor::zeros(ep::DType::i32, local);
  out.src_info = ep::Tensor::zeros(ep::DType::i32, local, slots);
  out.layout_range = ep::Tensor::zeros(ep::DType::i64, local, ranks);
  auto* counts = out.recv_count.data<int32_t>();
  auto* ranges = out.layout_range.data<int64_t>();
  auto* scales = fp8_ ? out.recv_x_scales.data<float>() : nullptr;
  const int received = recv_displs_[ranks - 1] + recv_counts_[ranks - 1];
  recv_row_.resize(static_cast<size_t>(received));
  for (int src = 0; src < ranks; ++src) {
    for (int m = recv_displs_[src]; m < recv_displs_[src] + recv_counts_[src]; ++m) {
      const std::byte* msg = recv_buf_.data() + static_cast<size_t>(m) * message_bytes_;
      int32_t header[4];
      std::memcpy(header, msg, kHeaderBytes);
      const int32_t token = header[0], e = header[1];
      require(e >= 0 && e < local && token >= 0 && token < tokens_, "mpi_baseline",
              "message {} from rank {}: expert {} / token {} out of range", m, src, e, token);
      // A source's messages to one expert are consecutive: the first opens its block.
      const int64_t row = counts[e]++;
      int64_t& range = ranges[e * ranks + src];
      if (range == 0) range = row << 32;
      range += 1;
      recv_row_[m] = e * slots + row;
      std::memcpy(out.recv_x.raw() + recv_row_[m] * static_cast<int64_t>(payload_bytes_),
                  msg + kHeaderBytes, payload_bytes_);
      out.src_info.data<int32_t>()[e * slots + row] = token;
      if (!fp8_) continue;
      const std::byte* scale = msg + kHeaderBytes + payload_bytes_;
      for (int64_t g = 0; g < groups; ++g)
        std::memcpy(&scales[(e * groups + g) * slots + row], scale + g * sizeof(float),
                    sizeof(float));
    }
  }
  return out;
}

MpiLlDispatched MpiAlltoallvLl::dispatch(const ep::Tensor& x, const ep::TensorRef& topk_idx) {
  require(x.dtype() == ep::DType::bf16 && x.cols() == hidden_ && x.rows() <= tokens_ &&
              topk_idx.dtype == ep::DType::i64 && topk_idx.rows == x.rows() &&
              topk_idx.cols == topk_ && topk_idx.contiguous(),
          "mpi_baseline", "dispatch: x bf16 [<= {}, {}] and topk_idx i64 [rows, {}] expected",
          tokens_, hidden_, topk_);
  num_tokens_ = x.rows();
  topk_idx_.assign(topk_idx.as<int64_t>(), topk_idx.as<int64_t>() + num_tokens_ * topk_);
  pack(x);
  check_mpi(MPI_Alltoall(send_counts_.data(), 1, MPI_INT, recv_counts_.data(), 1, MPI_INT, comm_),
            "MPI_Alltoall(counts)");
  int received = 0;
  for (int s = 0; s < shape_.num_ranks; ++s) {
    recv_displs_[s] = received;
    received += recv_counts_[s];
  }
  recv_buf_.resize(static_cast<size_t>(received) * message_bytes_);
  check_mpi(MPI_Alltoallv(send_buf_.data(), send_counts_.data(), send_displs_.data(), message_type_,
                          recv_buf_.data(), recv_counts_.data(), recv_displs_.data(), message_type_,
                          comm_),
            "MPI_Alltoallv(dispatch)");
  return unpack();
}

ep::Tensor MpiAlltoallvLl::combine(const ep::TensorRef& expert_out,
                                   const ep::TensorRef& topk_weights) {
  const int ranks = shape_.num_ranks;
  const int64_t slots = int64_t{ranks} * tokens_;
  require(expert_out.dtype == ep::DType::bf16 && expert_out.contiguous() &&
              expert_out.rows == shape_.experts_per_rank() * slots && expert_out.cols == hidden_ &&
              topk_weights.dtype == ep::DType::f32 && topk_weights.contiguous() &&
              topk_weights.rows == num_tokens_ && topk_weights.cols == topk_,
          "mpi_baseline", "combine: expert output {} / weights {} do not fit the last dispatch",
          expert_out.describe(), topk_weights.describe());
  // The reverse exchange: each received message's expert output row goes back in its order.
  const int received = recv_displs_[ranks - 1] + recv_counts_[ranks - 1];
  back_send_.resize(static_cast<size_t>(received) * hidden_);
  for (int m = 0; m < received; ++m)
    std::memcpy(back_send_.data() + static_cast<size_t>(m) * hidden_,
                expert_out.as<uint16_t>() + recv_row_[m] * hidden_,
                static_cast<size_t>(hidden_) * 2);
  const int sent = send_displs_[ranks - 1] + send_counts_[ranks - 1];
  back_recv_.resize(static_cast<size_t>(sent) * hidden_);
  check_mpi(
      MPI_Alltoallv(back_send_.data(), recv_counts_.data(), recv_displs_.data(), row_type_,
                    back_recv_.data(), send_counts_.data(), send_displs_.data(), row_type_, comm_),
      "MPI_Alltoallv(combine)");
  // Weighted reduce in float32 over the valid selections in slot order; one rounding to bf16.
  ep::Tensor out = ep::Tensor::empty(ep::DType::bf16, num_tokens_, hidden_);
  accumulator_.resize(static_cast<size_t>(hidden_));
  auto* dst = out.data<uint16_t>();
  const auto* weights = topk_weights.as<float>();
  for (int64_t t = 0; t < num_tokens_; ++t) {
    std::fill(accumulator_.begin(), accumulator_.end(), 0.0f);
    for (int k = 0; k < topk_; ++k) {
      const int m = message_of_[t * topk_ + k];
      if (m < 0) continue;
      const float weight = weights[t * topk_ + k];
      const uint16_t* row = back_recv_.data() + static_cast<size_t>(m) * hidden_;
      for (int c = 0; c < hidden_; ++c)
        accumulator_[c] += weight * ep::bf16_to_float(row[c]);
    }
    for (int c = 0; c < hidden_; ++c)
      dst[t * hidden_ + c] = ep::float_to_bf16(accumulator_[c]);
  }
  return out;
}

}  // namespace proxyep::tools
