// DeepEP V2's dispatch (ElasticBuffer.dispatch, non-expanded layout) as one call over a Buffer:
// the layout of topk_idx, the normal-mode dispatch, and the EPHandle fields V1 does not return
// (elastic_fields.hpp). Python's ElasticBuffer makes this one native call, so that a V2 dispatch
// costs what V1's layout + dispatch do (docs/plans/ELASTIC_BUFFER.md, sections 3.4 and 7).
//
//   ElasticDispatchResult r = elastic_dispatch(buffer, {.v1 = {.x = x, .topk_idx = idx},
//                                                       .num_experts = E, .num_max_tokens_per_rank
//                                                       = T});
//   CombineResult c = buffer.combine({.x = expert_out, .handle = &r.v1.handle});
#pragma once

#include "integrations/buffer.hpp"
#include "integrations/elastic/expand.hpp"
#include "integrations/normal_types.hpp"

#include <cstdint>

namespace proxyep::integrations::elastic {

struct ElasticDispatchArgs {
  // x, x_scales, topk_idx, topk_weights, recv_stats, expert_alignment, num_worst_tokens (the
  // worst case without CPU sync), async_finish, previous_event; or x and a handle (cached). A
  // fresh dispatch's layout tensors are computed here from topk_idx: leave them unset.
  DispatchArgs v1;
  int num_experts = 0;                  // fresh dispatches
  int64_t num_max_tokens_per_rank = 0;  // the source id base of recv_src_metadata
  int num_scaleup_ranks = 1;            // DeepEP's logical scale-up domain (a divisor of R)
  // DeepEP's do_expand (expand.hpp): the outputs in the expanded layout, in the memory x is in.
  // The rows are copied into their slots once they are in, so an async_finish call returns
  // then, its event already set. `zero_padding`: slots no pair takes are zeroed (x, scales,
  // weights).
  bool expand = false;
  bool zero_padding = false;
  // A cached expand: the fresh dispatch's recv_src_metadata (its slot columns; host or device)
  // and slot count.
  TensorRef cached_metadata;
  int64_t cached_slots = 0;
};

// The expanded outputs (ElasticDispatchArgs::expand): [slots, hidden], [slots, scale columns]
// (FP8), [slots] f32 lane weights (with topk_weights); in the memory x is in.
struct ExpandedRows {
  Tensor x, scales, weights;
  int64_t slots = 0;  // M: the received pairs' slots, or the worst case without CPU sync
};

// The EPHandle fields of a fresh dispatch, host memory (i32), whichever memory the call's
// tensors are in: computed on the host, with device tensors from host copies of what they read
// (topk_idx before the call, the received rows' indices after it). Undefined with a handle.
struct ElasticFields {
  Tensor psum_per_scaleup_rank;  // [num_scaleup_ranks]
  Tensor psum_per_expert;        // [E_local], aligned counts' inclusive prefix
  Tensor unaligned_per_expert;   // [E_local]
  Tensor dst_buffer_slot_idx;    // [N, K]
  // [rows of recv_x, K + 2]: computed here when the rows are in at return (no async_finish, or
  // expand); else source_metadata() once the call's event is set.
  Tensor recv_src_metadata;
  // V2's combine order for every combine of this dispatch (CombineArgs::order and
  // ::weight_owner, host tables for host and device calls alike): over ranks, or nodes when the
  // Buffer is hierarchical.
  Tensor combine_order, weight_owner;
};

struct ElasticDispatchResult {
  DispatchResult v1;
  ElasticFields fields;
  ExpandedRows expanded;  // with expand
  // The layout the dispatch was routed by: an async_finish call reads it until its event is
  // set, so the caller keeps it until then.
  DispatchLayout layout;
};

// Throws proxyep::Error("dispatch") as Buffer::dispatch does, before anything is sent for bad
// arguments (the Buffer stays usable).
ElasticDispatchResult elastic_dispatch(Buffer& buffer, ElasticDispatchArgs args);

// Combine's side of the expanded layout (expand.hpp): each received token's slots of x (bf16
// [>= slots, H]) folded into one row, and 1-D weights (f32 [>= slots] or undefined) into
// [num_recv, K], by the slot columns of `metadata` (i32 [>= num_recv, K + 2], checked first), on
// the Buffer's backend for the memory x is in (a device's work queued on the Buffer's stream,
// where its combine runs next). Throws proxyep::Error("combine").
Folded fold_expanded_rows(Buffer& buffer, const TensorRef& x, const TensorRef& weights,
                          const TensorRef& metadata, int64_t num_recv);

// recv_src_metadata of a fresh dispatch (its handle, its recv_topk_idx: host or device), once
// its rows are in (an async call's event set).
Tensor source_metadata(Buffer& buffer, const DispatchHandle& handle, const TensorRef& recv_topk_idx,
                       int num_experts, int64_t num_max_tokens_per_rank);

}  // namespace proxyep::integrations::elastic
