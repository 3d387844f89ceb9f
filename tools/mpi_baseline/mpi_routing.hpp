// What both MPI baselines of `bench ep` (mpi_ep_lean.hpp, mpi_ep.hpp) share: their inputs and
// outputs, the routing of one dispatch (which row goes to which rank, in which slot) with the
// MPI_Alltoall of its counts, and combine's exchange back over that routing.
//
// Routing: a token goes once to each rank that owns one of its experts (is_token_in_rank); its
//   slot among the rows for rank d is its rank among the tokens sent to d, in token order; rows
//   are grouped by destination ascending. The received rows are then grouped by source rank
//   ascending, then token index: DeepEP's receive order.
// Combine's exchange: the expert output (one BF16 row per received row, receive order) goes back
//   to the sources with one MPI_Alltoallv using the dispatch's counts swapped, into a scratch
//   buffer laid out as the rows were sent: the row of token t from rank d is at
//   send_displs[d] + slot(t, d). Each variant then reduces per token (float32, ranks ascending,
//   from 0.0f, one rounding to BF16: the reference's combine, gpu_side/ep/reference.hpp).
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "tools/mpi_baseline/mpi_check.hpp"

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace proxyep::tools {

struct MpiDispatchInputs {
  gpu_side::ep::TensorRef x;                 // bf16 [N, H] or fp8 [N, H]
  gpu_side::ep::TensorRef x_scales;          // f32 [N, H / 128] with fp8, contiguous
  gpu_side::ep::TensorRef topk_idx;          // i64 [N, K]
  gpu_side::ep::TensorRef topk_weights;      // f32 [N, K]
  gpu_side::ep::TensorRef is_token_in_rank;  // bool [N, R]
};

struct MpiDispatched {
  gpu_side::ep::Tensor recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, recv_src_idx;
  std::vector<int> num_recv_tokens_per_expert;
};

// Where a row's routing metadata sits in a record (byte offsets): its top-k ids as the
// destination's local ids (i64 x K), their weights (f32 x K), the source token index (i32).
struct RowMetaOffsets {
  size_t topk_idx = 0, weights = 0, src = 0;
};

// Writes token t's metadata for rank d into `record`: ids of experts d does not own become -1 and
// their weights 0, as DeepEP's dispatch returns them.
void write_row_metadata(std::byte* record, const RowMetaOffsets& at,
                        const gpu_side::ep::EpShape& shape, const MpiDispatchInputs& in, int topk,
                        int64_t t, int d);

// The routing of the last dispatch: what combine needs (DeepEP's handle).
class MpiRouting {
 public:
  MpiRouting(MPI_Comm comm, int ranks);

  // Slots and per-destination counts from is_token_in_rank (bool [N, R]), then MPI_Alltoall of
  // the counts: what each source sends here. Collective.
  void plan(const gpu_side::ep::TensorRef& is_token_in_rank);

  int64_t num_tokens() const { return num_tokens_; }
  // The token's row among those sent to `rank`; -1 = not sent there.
  int slot(int64_t token, int rank) const { return slot_[token * ranks_ + rank]; }
  int64_t sent_rows() const { return send_displs_.back() + send_counts_.back(); }
  int64_t received_rows() const { return recv_displs_.back() + recv_counts_.back(); }
  // Rows, per rank (the counts and displacements of MPI_Alltoallv in a one-row datatype).
  const std::vector<int>& send_counts() const { return send_counts_; }
  const std::vector<int>& send_displs() const { return send_displs_; }
  const std::vector<int>& recv_counts() const { return recv_counts_; }
  const std::vector<int>& recv_displs() const { return recv_displs_; }

  // Calls row(t, d, index) for every row this rank sends, token by token: token t to rank d, at
  // `index` = send_displs[d] + slot(t, d) of a send buffer in rows.
  template <typename Row>
  void for_each_sent_row(Row&& row) const {
    for (int64_t t = 0; t < num_tokens_; ++t)
      for (int d = 0; d < ranks_; ++d)
        if (const int s = slot(t, d); s >= 0) row(t, d, static_cast<size_t>(send_displs_[d] + s));
  }

 private:
  MPI_Comm comm_;
  int ranks_;
  int64_t num_tokens_ = 0;
  std::vector<int> slot_;  // [N * R]
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
};

// Combine's exchange over a routing (see above). Its scratch is kept between calls, as a user's.
class MpiCombineExchange {
 public:
  MpiCombineExchange(MPI_Comm comm, int hidden);

  // expert_out: bf16 [routing.received_rows(), H], receive order. Returns the rows that came
  // back: bf16 [routing.sent_rows(), H], valid until the next call.
  const uint16_t* send_back(const MpiRouting& routing, const gpu_side::ep::TensorRef& expert_out);

 private:
  MPI_Comm comm_;
  int hidden_;
  MpiBytesType row_type_;  // one bf16 row
  std::vector<uint16_t> back_buf_;
};

}  // namespace proxyep::tools
