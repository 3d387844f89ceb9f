// The record baseline of `proxyep bench ep` (--baseline mpi-records): expert-parallel dispatch
// and combine the way a user writes them with MPI and no EP library, moving each row with its
// metadata as one record. Until the lean baseline (mpi_ep_lean.hpp) it was `--baseline mpi`; it
// stays as a second, named comparison: it does one more pass over the rows per dispatch.
//
// dispatch: the routing (mpi_routing.hpp: slots, per-destination counts, MPI_Alltoall of the
//   counts); pack one record per (token, destination) -- the x row (+ FP8 scales), top-k ids
//   rewritten to the destination's local expert ids (-1 elsewhere), weights zeroed where the id
//   is -1, and the source token index -- grouped by destination in token order; MPI_Alltoallv the
//   records (one derived datatype per record, so counts are rows); unpack into the receive
//   tensors (the extra pass: every received row is copied once more).
// combine: the rows go back with one MPI_Alltoallv (mpi_routing.hpp: MpiCombineExchange); each
//   source then sums, per token, the rows of the ranks it went to in ascending rank order in
//   float32 and rounds once to BF16, one element at a time (GCC's -O2 leaves this loop scalar:
//   its trip count is the run-time hidden size). Kept as it was, so that its figures stay
//   comparable with runs saved before the lean baseline (ep_compare.hpp).
// Scratch buffers are kept between calls (a user would); the returned tensors are new each call,
// as Buffer's are.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/tensor.hpp"
#include "tools/mpi_baseline/mpi_check.hpp"
#include "tools/mpi_baseline/mpi_routing.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace proxyep::tools {

class MpiAlltoallvEp {
 public:
  MpiAlltoallvEp(MPI_Comm comm, const gpu_side::ep::EpShape& shape, int hidden, int topk, bool fp8);

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
  static RecordLayout record_layout(int hidden, int topk, bool fp8);

  void pack(const MpiDispatchInputs& in);
  MpiDispatched unpack(int64_t rows) const;

  MPI_Comm comm_;
  gpu_side::ep::EpShape shape_;
  int hidden_, topk_;
  bool fp8_;
  RecordLayout record_;
  MpiBytesType record_type_;  // one dispatch record
  MpiRouting routing_;        // of the last dispatch
  MpiCombineExchange back_;
  // Scratch kept between calls.
  std::vector<std::byte> send_buf_, recv_buf_;
  std::vector<float> accumulator_;
};

}  // namespace proxyep::tools
