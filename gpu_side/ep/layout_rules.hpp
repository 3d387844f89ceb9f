// The per-token rule of get_dispatch_layout (DEEPEP_CONTRACT 2.2), written once for the CPU twin
// (layout.cpp) and the CUDA kernel: pure functions over one token's row of topk_idx, no scratch
// memory, no allocation. A row has at most kMaxTopk (32) entries, so the O(K^2) "did an earlier
// slot already pick this rank / node" scans cost less than any shared-memory bitmap would.
//
// The rule: every slot with an expert >= 0 counts once for its expert ((token, expert) pairs, so a
// row naming one expert twice counts it twice); the token counts once for each distinct rank that
// owns one of its experts and once for each distinct node holding such a rank.
// Entries are assumed validated (-1 <= e < num_experts; see validate_topk_idx).
#pragma once

#include "common/host_device.hpp"
#include "gpu_side/ep/ep_shape.hpp"

#include <cstdint>

namespace proxyep::gpu_side::ep {

// True when slot k selects an expert whose rank no earlier slot of the row selected: the slot
// that "sends" the token to that rank.
PROXYEP_HOST_DEVICE inline bool first_slot_of_rank(const int64_t* row, int k,
                                                   const EpShape& shape) {
  if (row[k] < 0) return false;
  int rank = shape.rank_of_expert(row[k]);
  for (int j = 0; j < k; ++j)
    if (row[j] >= 0 && shape.rank_of_expert(row[j]) == rank) return false;
  return true;
}

// True when slot k selects an expert on a node no earlier slot of the row selected.
PROXYEP_HOST_DEVICE inline bool first_slot_of_node(const int64_t* row, int k,
                                                   const EpShape& shape) {
  if (row[k] < 0) return false;
  int node = shape.node_of_rank(shape.rank_of_expert(row[k]));
  for (int j = 0; j < k; ++j)
    if (row[j] >= 0 && shape.node_of_rank(shape.rank_of_expert(row[j])) == node) return false;
  return true;
}

// True when the token goes to `rank` (some slot selects one of its experts).
PROXYEP_HOST_DEVICE inline bool token_in_rank(const int64_t* row, int topk, const EpShape& shape,
                                              int rank) {
  for (int k = 0; k < topk; ++k)
    if (shape.local_expert(row[k], rank) >= 0) return true;
  return false;
}

// Adds one token's contribution to plain (non-atomic) counters, the host twin's per-block
// partial sums. tokens_per_node may be null (single node: DeepEP returns None). in_rank_row
// ([num_ranks], may be null) is fully written: true for the ranks the token goes to.
PROXYEP_HOST_DEVICE inline void count_token(const int64_t* row, int topk, const EpShape& shape,
                                            int* tokens_per_rank, int* tokens_per_node,
                                            int* tokens_per_expert, bool* in_rank_row) {
  if (in_rank_row != nullptr)
    for (int r = 0; r < shape.num_ranks; ++r)
      in_rank_row[r] = false;
  for (int k = 0; k < topk; ++k) {
    int64_t expert = row[k];
    if (expert < 0) continue;
    ++tokens_per_expert[expert];
    if (first_slot_of_rank(row, k, shape)) {
      int rank = shape.rank_of_expert(expert);
      ++tokens_per_rank[rank];
      if (in_rank_row != nullptr) in_rank_row[rank] = true;
    }
    if (tokens_per_node != nullptr && first_slot_of_node(row, k, shape))
      ++tokens_per_node[shape.node_of_rank(shape.rank_of_expert(expert))];
  }
}

}  // namespace proxyep::gpu_side::ep
