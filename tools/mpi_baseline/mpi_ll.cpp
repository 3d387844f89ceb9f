#include "tools/mpi_baseline/mpi_ll.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/row_rules.hpp"
#include "tools/mpi_baseline/mpi_check.hpp"

#include <algorithm>
#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {
MpiAlltoallvLl::MpiAlltoallvLl(MPI_Comm comm, const ep::EpShape& shape, int tokens, int hidden,
                               int topk, bool fp8)
    : comm_(comm), shape_(shape), tokens_(tokens), hidden_(hidden), topk_(topk) {
  format_.hidden = static_cast<uint32_t>(hidden);
  format_.fp8 = fp8;
  message_bytes_ = format_.message_bytes();
  check_mpi(MPI_Type_contiguous(static_cast<int>(message_bytes_), MPI_BYTE, &message_type_),
            "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&message_type_), "MPI_Type_commit");
  check_mpi(MPI_Type_contiguous(hidden * 2, MPI_BYTE, &row_type_), "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&row_type_), "MPI_Type_commit");
  selections_.resize(static_cast<size_t>(shape.num_experts));
  for (auto* counts : {&send_counts_, &send_displs_, &recv_counts_, &recv_displs_})
    counts->resize(static_cast<size_t>(shape.num_ranks));
  send_expert_counts_.resize(static_cast<size_t>(shape.num_experts));
  recv_expert_counts_.resize(static_cast<size_t>(shape.num_experts));
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
    for (int e = 0; e < local; ++e) {
      const int n = static_cast<int>(selections_[d * local + e].size());
      send_expert_counts_[d * local + e] = n;
      send_counts_[d] += n;
    }
    messages += send_counts_[d];
  }
  send_buf_.resize(static_cast<size_t>(messages) * message_bytes_);
  message_of_.assign(static_cast<size_t>(num_tokens_ * topk_), -1);
  // Each token cast once into its message (DeepEP LL's send phase casts a token once and sends
  // that message to each of its experts), then copied once per selection: experts ascending is
  // destination ranks ascending, then experts, then tokens.
  token_messages_.resize(static_cast<size_t>(num_tokens_) * message_bytes_);
  for (int64_t t = 0; t < num_tokens_; ++t)
    ep::ll_pack_message(format_, x.data<uint16_t>() + t * hidden_, static_cast<int32_t>(t),
                        token_messages_.data() + t * message_bytes_, ep::HostLanes{});
  int m = 0;
  for (const auto& list : selections_) {
    for (int sel : list) {
      std::memcpy(send_buf_.data() + static_cast<size_t>(m) * message_bytes_,
                  token_messages_.data() + static_cast<size_t>(sel / topk_) * message_bytes_,
                  message_bytes_);
      message_of_[sel] = m++;
    }
  }
}

MpiLlDispatched MpiAlltoallvLl::unpack() {
  const int ranks = shape_.num_ranks, local = shape_.experts_per_rank();
  const int64_t slots = int64_t{ranks} * tokens_, groups = hidden_ / ep::kScaleBlock;
  MpiLlDispatched out;
  out.recv_x = ep::Tensor::empty(format_.fp8 ? ep::DType::fp8_e4m3 : ep::DType::bf16, local * slots,
                                 hidden_);
  if (format_.fp8) out.recv_x_scales = ep::Tensor::empty(ep::DType::f32, local * groups, slots);
  out.recv_count = ep::Tensor::zeros(ep::DType::i32, local);
  out.src_info = ep::Tensor::zeros(ep::DType::i32, local, slots);
  out.layout_range = ep::Tensor::zeros(ep::DType::i64, local, ranks);
  auto* counts = out.recv_count.data<int32_t>();
  auto* ranges = out.layout_range.data<int64_t>();
  const bool fp8 = format_.fp8;
  const int received = recv_displs_[ranks - 1] + recv_counts_[ranks - 1];
  recv_row_.resize(static_cast<size_t>(received));
  for (int src = 0; src < ranks; ++src) {
    int m = recv_displs_[src];
    for (int e = 0; e < local; ++e) {
      const int n = recv_expert_counts_[src * local + e];
      const int64_t begin = counts[e];
      ranges[e * ranks + src] = (begin << 32) | n;
      ep::LlExpertSink sink{out.recv_x.raw() + e * slots * format_.payload_bytes(),
                            fp8 ? out.recv_x_scales.data<uint32_t>() + e * groups * slots : nullptr,
                            slots, out.src_info.data<int32_t>() + e * slots};
      for (int j = 0; j < n; ++j, ++m) {
        ep::ll_unpack_message(format_, recv_buf_.data() + static_cast<size_t>(m) * message_bytes_,
                              sink, begin + j, ep::HostLanes{});
        recv_row_[m] = e * slots + begin + j;
      }
      counts[e] += n;
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
  const int local = shape_.experts_per_rank();
  check_mpi(MPI_Alltoall(send_expert_counts_.data(), local, MPI_INT, recv_expert_counts_.data(),
                         local, MPI_INT, comm_),
            "MPI_Alltoall(counts)");
  int received = 0;
  for (int s = 0; s < shape_.num_ranks; ++s) {
    recv_displs_[s] = received;
    recv_counts_[s] = 0;
    for (int e = 0; e < local; ++e)
      recv_counts_[s] += recv_expert_counts_[s * local + e];
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
  // Weighted reduce with the shared rule (float32 from 0, slot order, one rounding to bf16).
  ep::Tensor out = ep::Tensor::empty(ep::DType::bf16, num_tokens_, hidden_);
  rows_.resize(static_cast<size_t>(topk_));
  for (int64_t t = 0; t < num_tokens_; ++t) {
    for (int k = 0; k < topk_; ++k) {
      const int m = message_of_[t * topk_ + k];
      rows_[k] = m < 0 ? nullptr : back_recv_.data() + static_cast<size_t>(m) * hidden_;
    }
    ep::ll_combine_token(rows_.data(), topk_weights.as<float>() + t * topk_, topk_, format_.hidden,
                         out.data<uint16_t>() + t * hidden_, ep::HostLanes{});
  }
  return out;
}

}  // namespace proxyep::tools
