// DeepEP V2's combine order and weight owners (docs/plans/ELASTIC_BUFFER.md section 2), as the
// two tables CombineInput::order and CombineInput::weight_owner take (row_rules.hpp), computed on
// the host from a token's topk_idx row:
// - order[t]: the groups token t's lanes reach, each once, in the order of the group's LAST lane
//   (-1 lanes ignored), then -1 to the end of the row. V2's test compares combine bit for bit
//   with a reference that adds partials in exactly that order, so ours must.
// - weight_owner[t][k]: the group owning lane k's expert, -1 for a -1 lane. V2 returns lane k's
//   weight as that group sends it back (a selection), where V1 sums every group's lane k.
// Groups are ranks (rank = expert / experts_per_rank), or nodes of ranks_per_node consecutive
// ranks, for hierarchical combine's last step, where each block is a node's partial.
//
// Both follow from topk_idx alone, so one computation per dispatch serves every combine of it
// (a cached dispatch's too); the tables travel with the dispatch handle.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/tensor.hpp"

namespace proxyep::gpu_side::ep {

// What one block of a combine is: a rank's returned row, or a node's partial sum.
enum class CombineGroups { rank, node };

struct CombineOrderTables {
  Tensor order;         // i32 [N, groups]: CombineInput::order
  Tensor weight_owner;  // i32 [N, K]: CombineInput::weight_owner
};

// The number of groups (CombineInput::num_ranks) a combine over `groups` has.
int combine_group_count(const EpShape& shape, CombineGroups groups);

// From topk_idx (host i64 [N, K], contiguous, entries in [-1, E): checked as
// get_dispatch_layout checks it, proxyep::Error with phase "combine_order" otherwise).
CombineOrderTables compute_combine_order(const TensorRef& topk_idx, const EpShape& shape,
                                         CombineGroups groups);

// V2's order inside node `node` (a hierarchical combine's node partials, each DeepEP's
// bf16(0 + its ranks' rows by their last lane)): for each of `tokens` rows of topk_idx (i64
// [tokens, topk], global expert ids, entries in [-1, E), checked by the caller), the ranks of
// `node` its lanes reach, as indices within the node (rank % ranks_per_node), each once, by last
// lane, then -1: i32 [tokens, ranks_per_node] into `out`.
void node_order_rows(const int64_t* topk_idx, int64_t tokens, int topk, const EpShape& shape,
                     int node, int32_t* out);

}  // namespace proxyep::gpu_side::ep
