// The baseline of `proxyep bench ll --baseline mpi`: DeepEP's low-latency dispatch and combine
// (DEEPEP_CONTRACT 2.8) the way a user writes them with MPI and no EP library.
//
// dispatch: make each token's message once with the shared LL rules (gpu_side/ep/ll_rules.hpp:
//   ll_pack_message -- a 16-byte header with the token index, then DeepEP LL's FP8 cast of the
//   row with its float scales, or the BF16 row with --bf16), and pack a copy per valid (token,
//   expert) selection, grouped by destination rank, then by expert, then by token; MPI_Alltoall the
//   per-expert message counts (DeepEP sends those too); MPI_Alltoallv the messages (one derived
//   datatype per message); unpack (ll_unpack_message) into DeepEP's layout: recv_x [E_local * R*T,
//   H], scales [E_local * H/128, R*T] (column-major per expert), recv_count, src_info,
//   layout_range, each expert's rows in blocks by source rank ascending.
// combine: each received message's expert output row (bf16, from the [E_local * R*T, H] tensor)
//   goes back to its source with one MPI_Alltoallv (the dispatch's counts swapped), in the order
//   it came; each source combines per token with ll_combine_token: weight x row over its valid
//   selections in slot order in float32, rounded once to BF16.
// Scratch buffers are kept between calls; the returned tensors are new each call, as Buffer's are.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/ll_rules.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace proxyep::tools {

struct MpiLlDispatched {
  gpu_side::ep::Tensor recv_x, recv_x_scales, recv_count, src_info, layout_range;
};

class MpiAlltoallvLl {
 public:
  // `tokens` is num_max_dispatch_tokens_per_rank (T).
  MpiAlltoallvLl(MPI_Comm comm, const gpu_side::ep::EpShape& shape, int tokens, int hidden,
                 int topk, bool fp8);
  ~MpiAlltoallvLl();
  MpiAlltoallvLl(const MpiAlltoallvLl&) = delete;
  MpiAlltoallvLl& operator=(const MpiAlltoallvLl&) = delete;

  // x bf16 [T', H], topk_idx i64 [T', K] (-1 = none).
  MpiLlDispatched dispatch(const gpu_side::ep::Tensor& x, const gpu_side::ep::TensorRef& topk_idx);
  // expert_out bf16 [E_local * R*T, H] in the last dispatch's layout; weights f32 [T', K] with
  // the last dispatch's topk_idx. Returns bf16 [T', H].
  gpu_side::ep::Tensor combine(const gpu_side::ep::TensorRef& expert_out,
                               const gpu_side::ep::TensorRef& topk_weights);

 private:
  void pack(const gpu_side::ep::Tensor& x);
  MpiLlDispatched unpack();

  MPI_Comm comm_;
  gpu_side::ep::EpShape shape_;
  int tokens_, hidden_, topk_;
  gpu_side::ep::LlFormat format_;
  size_t message_bytes_ = 0;
  MPI_Datatype message_type_ = MPI_DATATYPE_NULL;  // one dispatch message
  MPI_Datatype row_type_ = MPI_DATATYPE_NULL;      // one bf16 row
  // Routing of the last dispatch (DeepEP's handle, what combine needs).
  int64_t num_tokens_ = 0;
  std::vector<int64_t> topk_idx_;             // [T' * K]
  std::vector<int> message_of_;               // [T' * K]: the selection's message index, -1 = none
  std::vector<std::vector<int>> selections_;  // [E]: (t * K + k) of the selections, by token
  std::vector<int64_t> recv_row_;             // [received]: the message's row in recv_x
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;  // [R], messages
  std::vector<int> send_expert_counts_, recv_expert_counts_;  // [R * E_local], messages
  // Scratch kept between calls.
  std::vector<std::byte> token_messages_;  // [T'] each token's message, cast once per call
  std::vector<std::byte> send_buf_, recv_buf_;
  std::vector<uint16_t> back_send_, back_recv_;
  std::vector<const uint16_t*> rows_;  // [K]: a token's expert output rows, null = none
};

}  // namespace proxyep::tools
