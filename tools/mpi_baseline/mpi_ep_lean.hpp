// The baseline of `proxyep bench ep --baseline mpi`: dispatch and combine as a careful user writes
// them with MPI and no EP library -- every row crosses memory as few times as MPI allows.
//
// dispatch: the routing (mpi_routing.hpp: each token's slot per destination rank from
//   is_token_in_rank, MPI_Alltoall of the per-destination counts); one pass over the tokens packs
//   each destination's x rows (one per (token, destination rank): deduplicated, not one per
//   expert), FP8 scales with --fp8, and a small metadata record per row -- top-k ids rewritten to
//   the destination's local expert ids (-1 elsewhere), weights zeroed where the id is -1, the
//   source token index; then MPI_Alltoallv of the x rows straight into the returned recv_x, of the
//   scales straight into recv_x_scales, and of the metadata records, which one cheap pass splits
//   into recv_topk_idx, recv_topk_weights and recv_src_idx while it counts the tokens per expert.
//   Why one metadata record and not one MPI_Alltoallv per metadata tensor: each collective costs
//   a round of messages (over TCP, a round trip per peer) whatever its size, the split reads
//   about 100 bytes per row against the x row's kilobytes, and the per-expert counts need a pass
//   over the received ids anyway.
// combine: one MPI_Alltoallv of the expert output rows back, the dispatch's counts swapped
//   (mpi_routing.hpp: MpiCombineExchange), then one pass that sums each token's rows in float32
//   over its ranks ascending from 0.0f and rounds once to BF16 (the reference's order, so the
//   bits are the reference's, except which NaN a sum of two NaNs keeps: the workload has none),
//   in blocks of 64 elements so that the compiler vectorises it, as a careful user's loop would
//   be (the record variant's element-at-a-time loop stays scalar).
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
#include <optional>
#include <vector>

namespace proxyep::tools {

class MpiLeanEp {
 public:
  MpiLeanEp(MPI_Comm comm, const gpu_side::ep::EpShape& shape, int hidden, int topk, bool fp8);

  MpiDispatched dispatch(const MpiDispatchInputs& in);
  // Combines `expert_out` (bf16 [rows received by the last dispatch, H], receive order) back to
  // the sources of the last dispatch: bf16 [N, H].
  gpu_side::ep::Tensor combine(const gpu_side::ep::TensorRef& expert_out);

 private:
  // Byte offsets inside one metadata record: local top-k ids (i64 x K), weights (f32 x K), the
  // source token index (i32).
  struct MetaLayout {
    size_t topk_idx = 0, weights = 0, src = 0, size = 0;
  };
  static MetaLayout meta_layout(int topk);

  void pack(const MpiDispatchInputs& in);
  void exchange(const void* send, std::byte* recv, MPI_Datatype type, const char* what);
  void unpack_metadata(MpiDispatched& out) const;

  MPI_Comm comm_;
  gpu_side::ep::EpShape shape_;
  int hidden_, topk_;
  bool fp8_;
  size_t x_bytes_, scale_bytes_;  // per row
  MetaLayout meta_;
  MpiBytesType x_type_, meta_type_;
  std::optional<MpiBytesType> scale_type_;  // with --fp8
  MpiRouting routing_;                      // of the last dispatch
  MpiCombineExchange back_;
  // Scratch kept between calls: the packed rows, scales and records, the received records.
  std::vector<std::byte> send_x_, send_scales_, send_meta_, recv_meta_;
  std::vector<const uint16_t*> token_rows_;  // combine: one token's rows that came back
};

}  // namespace proxyep::tools
