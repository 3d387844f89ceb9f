// get_dispatch_layout (DEEPEP_CONTRACT 1.4, 2.2), CPU twin: from topk_idx [N, K] (int64, -1 = no
// selection) count tokens per rank (deduplicated), per node (deduplicated), per expert ((token,
// expert) pairs) and mark is_token_in_rank. The per-token rule lives in layout_rules.hpp
// (PROXYEP_HOST_DEVICE) and is shared with the CUDA kernel.
#pragma once

#include "gpu_side/ep/ep_shape.hpp"
#include "gpu_side/ep/tensor.hpp"

namespace proxyep::gpu_side::ep {

class HostExecutor;

struct DispatchLayout {
  Tensor num_tokens_per_rank;       // i32 [R]
  Tensor num_tokens_per_rdma_rank;  // i32 [nodes]; undefined (None) on one node, like DeepEP
  Tensor num_tokens_per_expert;     // i32 [E]
  Tensor is_token_in_rank;          // bool [N, R]
};

// Whether a layout of `shape` has num_tokens_per_rdma_rank: DeepEP returns None within one
// NVLink domain, which it fixes at 8 ranks; ProxyEP's node is the group's ranks_per_node
// (LOCAL_WORLD_SIZE), so a group across nodes has the counts at any size (2 nodes x 2 ranks
// too) and one node never has them. Every backend's layout follows it.
constexpr bool layout_has_node_counts(const EpShape& shape) {
  return shape.num_nodes() > 1;
}

// Checks topk_idx (host, int64, 2-D, contiguous, entries in [-1, E)) and the shape (E divisible
// by R) and throws proxyep::Error("get_dispatch_layout", ...) naming the first bad entry.
void validate_topk_idx(const TensorRef& topk_idx, const EpShape& shape, std::string_view phase);

// `executor` may be null (runs on the calling thread).
DispatchLayout compute_dispatch_layout(const TensorRef& topk_idx, const EpShape& shape,
                                       HostExecutor* executor = nullptr);

}  // namespace proxyep::gpu_side::ep
