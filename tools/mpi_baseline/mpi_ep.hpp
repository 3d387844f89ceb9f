// The baseline of `proxyep bench ep --baseline mpi`: expert-parallel dispatch and combine the way
// a user writes them with MPI and no EP library.
//
// dispatch: find each token's destination ranks (is_token_in_rank, from the layout) and its slot
//   among the rows for that rank; pack one record per (token, destination) -- the x row (+ FP8
//   scales), top-k ids rewritten to the destination's local expert ids (-1 elsewhere), weights
//   zeroed where the id is -1, and the source token index -- grouped by destination in token
//   order; MPI_Alltoall the per-destination row counts; MPI_Alltoallv the records (one derived
//   datatype per record, so counts are rows); unpack into the receive tensors. The receive order
//   is what DeepEP's is: source rank ascending, then token index.
// combine: the received rows (the expert output, one BF16 row per received token) already sit
//   grouped by source rank, so they go back with one MPI_Alltoallv using the dispatch's counts
//   swapped; each source then sums, per token, the rows of the ranks it went to in ascending
//   rank order in float32 and rounds once to BF16 -- the reference's combine (reference.hpp).
// Scratch buffers are kept between calls (a user would); the returned tensors are new each call,
// as Buffer's are.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace proxyep::tools {

// Throws proxyep::Error("mpi_baseline") naming `what` and MPI's error text unless rc is
// MPI_SUCCESS.
void check_mpi(int rc, const char* what);

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

class MpiAlltoallvEp {
 public:
  MpiAlltoallvEp(MPI_Comm comm, const gpu_side::ep::EpShape& shape, int hidden, int topk, bool fp8);
  ~MpiAlltoallvEp();
  MpiAlltoallvEp(const MpiAlltoallvEp&) = delete;
  MpiAlltoallvEp& operator=(const MpiAlltoallvEp&) = delete;

  MpiDispatched dispatch(const MpiDispatchInputs& in);
  // Combines `expert_out` (bf16 [rows received by the last dispatch, H], receive order) back to
  // the sources of the last dispatch: bf16 [N, H].
  gpu_side::ep::Tensor combine(const gpu_side::ep::TensorRef& expert_out);

 private:
  // Byte offsets inside one dispatch record.
  struct RecordLayout {
    size_t x = 0, scales = 0, topk_idx = 0, weights = 0, src = 0, size = 0;
    size_t x_bytes = 0, scale_bytes = 0;
  };

  void pack(const MpiDispatchInputs& in);
  MpiDispatched unpack(int64_t rows) const;

  MPI_Comm comm_;
  gpu_side::ep::EpShape shape_;
  int rank_ = 0;
  int hidden_, topk_;
  bool fp8_;
  RecordLayout record_;
  MPI_Datatype record_type_ = MPI_DATATYPE_NULL;   // one dispatch record
  MPI_Datatype combine_type_ = MPI_DATATYPE_NULL;  // one bf16 row
  // Routing of the last dispatch (what combine needs; DeepEP's handle).
  int64_t num_tokens_ = 0;
  std::vector<int> slot_;  // [N * R]: token's row among those sent to a rank, -1 = not sent
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  // Scratch kept between calls.
  std::vector<std::byte> send_buf_, recv_buf_;
  std::vector<uint16_t> back_buf_;
  std::vector<float> accumulator_;
};

}  // namespace proxyep::tools
