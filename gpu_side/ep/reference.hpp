// The straightforward reference of normal-mode dispatch and combine, computed in one process from
// every rank's inputs. Tests and `proxyep bench ep` compare Buffer's outputs with it for exact
// equality. It encodes ProxyEP's (= DeepEP V1's) semantics, DEEPEP_CONTRACT 2.3-2.5:
// - A token goes once to every rank that owns one of its experts.
// - Receive order: source rank ascending, then source token index ascending.
// - recv_topk_idx: the expert as a local id on the receiving rank, -1 elsewhere; recv_topk_weights
//   zeroed where the index is -1.
// - num_recv_tokens_per_expert: (token, local expert) pairs, rounded up to expert_alignment.
// - Combine (CombineOrder::by_rank: one node, or ep.internode=per_rank): out[t] = bf16( ((sum
//   over ranks r ascending that received t of float(x_r[row])) + float(bias0[t])) +
//   float(bias1[t]) ), in float32 in exactly that order; combined weights = sum over the same
//   ranks, ascending, in float32.
// - Combine (CombineOrder::by_node: a group across nodes with ep.internode=hierarchical, as
//   DeepEP's internode kernels): each node n that received t first reduces its ranks' rows,
//   P_n[t] = bf16(0 + sum over n's ranks l ascending that received t of float(x_l[row])), the
//   one row per (token, node) that crosses the fabric, its own node's included; then out[t] =
//   bf16( (float(bias0[t]) + float(bias1[t])) + float(P_0[t]) + float(P_1[t]) + ... ), nodes
//   ascending, the biases first (a missing one is 0) as DeepEP's final receiver does. So a value
//   is rounded to bf16 twice: once per node, once at the end. Weights: W_n = 0 + sum over n's
//   ranks ascending (float32, never rounded), combined = 0 + sum over nodes ascending of W_n.
// - Combine (CombineOrder::by_topk: DeepEP V2's ElasticBuffer, docs/plans/ELASTIC_BUFFER.md
//   section 2, per-rank groups): out[t] = bf16( (float(bias0[t]) + float(bias1[t])) +
//   float(x_a[row]) + float(x_b[row]) + ... ), a missing bias 0, over the ranks that received t
//   ordered by the last lane of t's topk_idx row whose expert each owns; combined weight lane k
//   = lane k of the row returned by the rank owning lane k's expert (copied, not summed), 0 for a
//   -1 lane. Read from the dispatched rows' recv_topk_idx (lane k is local on exactly its
//   owner), not from the CombineInput tables combine_order.hpp computes, so it checks them.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/tensor.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace proxyep::gpu_side::ep {

// One rank's dispatch inputs as views: x is bf16 [N, H], or fp8 [N, H] with scales [N, S], S >= 1,
// float32 (S = H/128 in DeepEP's use) or int32 packed UE8M0 (S = H/512). Like DeepEP, the
// reference moves scale rows as raw bytes, so any S works; every rank must use one dtype and S.
struct DispatchInputs {
  TensorRef x;
  TensorRef x_scales;      // undefined for bf16; strides honoured
  TensorRef topk_idx;      // i64 [N, K]
  TensorRef topk_weights;  // f32 [N, K]; may be undefined
};

struct ReferenceDispatch {
  Tensor recv_x;                                // like x: [num_recv, H]
  Tensor recv_x_scales;                         // for fp8: x_scales' dtype, [num_recv, S]
  Tensor recv_topk_idx;                         // i64 [num_recv, K]
  Tensor recv_topk_weights;                     // f32 [num_recv, K] (when weights were given)
  Tensor recv_src_idx;                          // i32 [num_recv]: token index at its source
  std::vector<int> recv_from;                   // [R]: rows received from each source rank
  std::vector<int> num_recv_tokens_per_expert;  // [E_local], aligned
};

// The form every rank's inputs must share: the first source's.
struct DispatchInputForm {
  int64_t hidden = 0;
  int topk = 0;
  DType x_dtype = DType::bf16;
  bool weights = false;
  // FP8 scales, moved as opaque 4-byte words like DeepEP does: float32 (amax / 448 per 128
  // channels) or int32 (packed UE8M0, four 128-channel groups per word), any column count.
  DType scale_dtype = DType::f32;
  int64_t scale_cols = 0;
};

// What `rank` receives, built one source at a time, so a caller never holds every rank's inputs
// at once (each rank of a 128-rank benchmark checks its own outputs this way, in O(T x H) per
// source instead of O(R x T x H)).
class ReferenceReceiver {
 public:
  ReferenceReceiver(const EpShape& shape, int rank, int expert_alignment = 1);
  // The rows `source` sends to the rank. Sources come in ascending order (the receive order),
  // each at most once; one left out sent nothing. Each source's inputs must have the form of the
  // first one added.
  void add_source(int source, const DispatchInputs& in);
  // The rows added so far, as reference_dispatch returns them; the receiver is left empty.
  ReferenceDispatch finish();

 private:
  EpShape shape_;
  int rank_;
  int expert_alignment_;
  int next_source_ = 0;
  bool have_form_ = false;
  DispatchInputForm form_;
  std::vector<std::byte> x_, scales_;  // received rows, packed
  std::vector<int64_t> topk_idx_;
  std::vector<float> topk_weights_;
  std::vector<int32_t> src_idx_;
  std::vector<int> recv_from_;
  std::vector<int64_t> expert_pairs_;  // (token, local expert) pairs, per local expert
};

// `all` holds every rank's inputs, indexed by rank; computes what `rank` receives.
ReferenceDispatch reference_dispatch(std::span<const DispatchInputs> all, const EpShape& shape,
                                     int rank, int expert_alignment = 1);

// The order (and so the roundings) of combine's reduction; see the top of this file.
enum class CombineOrder { by_rank, by_node, by_topk };

struct ReferenceCombine {
  Tensor combined_x;             // bf16 [N_rank, H]
  Tensor combined_topk_weights;  // f32 [N_rank, K] when weights were given
};

// Combine as seen by source `rank`: `expert_out[r]` is rank r's combine input (bf16
// [num_recv_r, H], in r's receive order) and `dispatched[r]` r's reference dispatch result;
// `weights_in[r]` (optional, f32 [num_recv_r, K]); biases optional (bf16 [N_rank, H]). Nodes
// (CombineOrder::by_node) are shape.ranks_per_node consecutive ranks. by_topk needs each
// dispatched[r].recv_topk_idx.
ReferenceCombine reference_combine(std::span<const TensorRef> expert_out,
                                   std::span<const ReferenceDispatch> dispatched,
                                   std::span<const TensorRef> weights_in, const EpShape& shape,
                                   int rank, int num_tokens, const TensorRef& bias0 = {},
                                   const TensorRef& bias1 = {},
                                   CombineOrder order = CombineOrder::by_rank);

}  // namespace proxyep::gpu_side::ep
