#include "tools/mpi_baseline/mpi_routing.hpp"

#include "common/error.hpp"

#include <algorithm>
#include <cstring>

namespace ep = proxyep::gpu_side::ep;

namespace proxyep::tools {

MpiRouting::MpiRouting(MPI_Comm comm, int ranks)
    : comm_(comm),
      ranks_(ranks),
      send_counts_(ranks),
      send_displs_(ranks),
      recv_counts_(ranks),
      recv_displs_(ranks) {}

void MpiRouting::plan(const ep::TensorRef& is_token_in_rank) {
  num_tokens_ = is_token_in_rank.rows;
  slot_.assign(static_cast<size_t>(num_tokens_ * ranks_), -1);
  std::fill(send_counts_.begin(), send_counts_.end(), 0);
  const auto* in_rank = static_cast<const uint8_t*>(is_token_in_rank.data);
  for (int64_t t = 0; t < num_tokens_; ++t)
    for (int d = 0; d < ranks_; ++d)
      if (in_rank[t * ranks_ + d]) slot_[t * ranks_ + d] = send_counts_[d]++;
  int rows = 0;
  for (int d = 0; d < ranks_; ++d) {
    send_displs_[d] = rows;
    rows += send_counts_[d];
  }
  check_mpi(MPI_Alltoall(send_counts_.data(), 1, MPI_INT, recv_counts_.data(), 1, MPI_INT, comm_),
            "MPI_Alltoall(counts)");
  rows = 0;
  for (int s = 0; s < ranks_; ++s) {
    recv_displs_[s] = rows;
    rows += recv_counts_[s];
  }
}

MpiCombineExchange::MpiCombineExchange(MPI_Comm comm, int hidden)
    : comm_(comm), hidden_(hidden), row_type_(static_cast<size_t>(hidden) * 2) {}

const uint16_t* MpiCombineExchange::send_back(const MpiRouting& routing,
                                              const ep::TensorRef& expert_out) {
  const int64_t received = routing.received_rows();
  require(expert_out.dtype == ep::DType::bf16 && expert_out.rows == received &&
              expert_out.cols == hidden_ && expert_out.contiguous(),
          "mpi_baseline", "combine input must be contiguous bf16 [{}, {}], got {}", received,
          hidden_, expert_out.describe());
  // What came from source s goes back to s, in the same order.
  back_buf_.resize(static_cast<size_t>(routing.sent_rows() * hidden_));
  check_mpi(
      MPI_Alltoallv(expert_out.data, routing.recv_counts().data(), routing.recv_displs().data(),
                    row_type_.get(), back_buf_.data(), routing.send_counts().data(),
                    routing.send_displs().data(), row_type_.get(), comm_),
      "MPI_Alltoallv(combine)");
  return back_buf_.data();
}

void write_row_metadata(std::byte* record, const RowMetaOffsets& at, const ep::EpShape& shape,
                        const MpiDispatchInputs& in, int topk, int64_t t, int d) {
  const auto* topk_idx = in.topk_idx.as<int64_t>();
  const auto* weights = in.topk_weights.as<float>();
  for (int k = 0; k < topk; ++k) {
    const int64_t local = shape.local_expert(topk_idx[t * topk + k], d);
    const float weight = local >= 0 ? weights[t * topk + k] : 0.0f;
    std::memcpy(record + at.topk_idx + k * sizeof(int64_t), &local, sizeof local);
    std::memcpy(record + at.weights + k * sizeof(float), &weight, sizeof weight);
  }
  const auto src = static_cast<int32_t>(t);
  std::memcpy(record + at.src, &src, sizeof src);
}

}  // namespace proxyep::tools
