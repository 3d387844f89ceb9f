// DeepEP V2's combine of the expanded layout without multiple reduction
// (allow_multiple_reduction=False; docs/plans/ELASTIC_BUFFER.md sections 2 and 3.1): every slot
// goes back to its token's home rank alone, and the home adds, in float32 and rounded once, the
// biases and then the token's slots in lane order. Nothing is summed where the experts are.
//
// Moving a slot home is a dispatch: each rank's slots are the "tokens" of a normal-mode
// dispatch whose only destination is their home rank, listed by (home rank, source token,
// lane). The home then receives, from each rank, its tokens' slots in (token, lane) order, which
// it can place from its own topk_idx alone: (token t, lane k) is the next row of the block from
// the rank owning lane k's expert. The reduce is the combine's own (RowBackend::reduce) with the
// K lanes as its groups, so host and device backends add the same rows in the same order.
//
//   CombineResult c = combine_slots(buffer, {.x = expert_out, .weights = w, .handle = &h,
//                                            .metadata = recv_src_metadata, .topk_idx = idx,
//                                            .num_experts = E});
#pragma once

#include "integrations/buffer.hpp"
#include "integrations/normal_types.hpp"

namespace proxyep::integrations::elastic {

struct SlotCombineArgs {
  TensorRef x;             // bf16 [>= slots, hidden]: the expanded layout's rows, after the experts
  TensorRef weights;       // f32 [>= slots] (one per slot) or undefined
  TensorRef bias0, bias1;  // bf16 [N, hidden] (this rank's tokens) or undefined
  const DispatchHandle* handle = nullptr;  // the fresh expanded dispatch's
  TensorRef metadata;  // its recv_src_metadata: i32 [>= num_recv, K + 2], host or device
  TensorRef topk_idx;  // the dispatch's topk_idx: i64 [N, K], host or device
  int num_experts = 0;
};

// Collective. Returns bf16 [N, hidden] and, with weights, f32 [N, K] (lane k's slot's weight,
// 0 for a -1 lane), complete at return, in the memory x is in. Throws proxyep::Error("combine")
// for bad input before anything is sent, and for a slot table that disagrees with the routing.
CombineResult combine_slots(Buffer& buffer, const SlotCombineArgs& args);

}  // namespace proxyep::integrations::elastic
