// The straightforward reference of normal-mode dispatch and combine, computed in one process from
// every rank's inputs. Tests and `proxyep bench ep` compare Buffer's outputs with it for exact
// equality. It encodes ProxyEP's (= DeepEP V1's) semantics, DEEPEP_COMPAT 2.3-2.5:
// - A token goes once to every rank that owns one of its experts.
// - Receive order: source rank ascending, then source token index ascending.
// - recv_topk_idx: the expert as a local id on the receiving rank, -1 elsewhere; recv_topk_weights
//   zeroed where the index is -1.
// - num_recv_tokens_per_expert: (token, local expert) pairs, rounded up to expert_alignment.
// - Combine: out[t] = bf16( ((sum over ranks r ascending that received t of float(x_r[row])) +
//   float(bias0[t])) + float(bias1[t]) ), in float32 in exactly that order; combined weights =
//   sum over the same ranks, ascending, in float32.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/tensor.hpp"

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

// `all` holds every rank's inputs, indexed by rank; computes what `rank` receives.
ReferenceDispatch reference_dispatch(std::span<const DispatchInputs> all, const EpShape& shape,
                                     int rank, int expert_alignment = 1);

struct ReferenceCombine {
  Tensor combined_x;             // bf16 [N_rank, H]
  Tensor combined_topk_weights;  // f32 [N_rank, K] when weights were given
};

// Combine as seen by source `rank`: `expert_out[r]` is rank r's combine input (bf16
// [num_recv_r, H], in r's receive order) and `dispatched[r]` r's reference dispatch result;
// `weights_in[r]` (optional, f32 [num_recv_r, K]); biases optional (bf16 [N_rank, H]).
ReferenceCombine reference_combine(std::span<const TensorRef> expert_out,
                                   std::span<const ReferenceDispatch> dispatched,
                                   std::span<const TensorRef> weights_in, const EpShape& shape,
                                   int rank, int num_tokens, const TensorRef& bias0 = {},
                                   const TensorRef& bias1 = {});

}  // namespace proxyep::gpu_side::ep
