// get_dispatch_layout's CPU twin. Tokens are split into contiguous blocks; each block counts into
// its own partial sums (no atomics, no sharing), writes its rows of is_token_in_rank directly,
// and the partials are added in block order at the end, so the result does not depend on how
// many threads ran it.
#include "gpu_side/ep/layout.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/host_executor.hpp"
#include "gpu_side/ep/layout_rules.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace proxyep::gpu_side::ep {

namespace {

// Tokens per block: large enough that claiming a block is noise, small enough that a few
// thousand tokens still spread over a handful of threads.
constexpr int64_t kTokensPerBlock = 512;

}  // namespace

void validate_topk_idx(const TensorRef& topk_idx, const EpShape& shape, std::string_view phase) {
  require(shape.num_ranks >= 1 && shape.ranks_per_node >= 1, phase,
          "num_ranks ({}) and ranks_per_node ({}) must be positive", shape.num_ranks,
          shape.ranks_per_node);
  require(shape.num_experts >= 1 && shape.num_experts % shape.num_ranks == 0, phase,
          "num_experts ({}) must be a positive multiple of num_ranks ({})", shape.num_experts,
          shape.num_ranks);
  require(shape.experts_per_rank() <= kMaxLocalExperts, phase,
          "num_experts / num_ranks = {} exceeds the limit of {} experts per rank",
          shape.experts_per_rank(), kMaxLocalExperts);
  require_dtype(topk_idx, DType::i64, phase, "topk_idx");
  require_host(topk_idx, phase, "topk_idx");
  require(topk_idx.dims == 2, phase, "topk_idx must be 2-D [num_tokens, num_topk]; got {}",
          topk_idx);
  require_contiguous(topk_idx, phase, "topk_idx");
  require(topk_idx.cols <= kMaxTopk, phase, "num_topk = {} exceeds the limit of {}", topk_idx.cols,
          kMaxTopk);
  const int64_t* idx = topk_idx.as<int64_t>();
  for (int64_t i = 0; i < topk_idx.numel(); ++i) {
    if (idx[i] >= -1 && idx[i] < shape.num_experts) continue;
    fail(std::string(phase), "topk_idx[{}, {}] = {} is out of range [-1, {})", i / topk_idx.cols,
         i % topk_idx.cols, idx[i], shape.num_experts);
  }
}

DispatchLayout compute_dispatch_layout(const TensorRef& topk_idx, const EpShape& shape,
                                       HostExecutor* executor) {
  validate_topk_idx(topk_idx, shape, "get_dispatch_layout");
  const int64_t num_tokens = topk_idx.rows;
  const int topk = static_cast<int>(topk_idx.cols);
  const int num_ranks = shape.num_ranks;
  const bool per_node = layout_has_node_counts(shape);
  const int num_nodes = per_node ? shape.num_nodes() : 0;

  DispatchLayout layout;
  layout.is_token_in_rank = Tensor::zeros(DType::boolean, num_tokens, num_ranks);
  bool* in_rank = layout.is_token_in_rank.data<bool>();

  // One partial-sum row per block: [ranks | nodes | experts].
  const int64_t blocks = std::max<int64_t>(1, (num_tokens + kTokensPerBlock - 1) / kTokensPerBlock);
  const int64_t width = num_ranks + num_nodes + shape.num_experts;
  std::vector<int> partial(static_cast<size_t>(blocks * width), 0);
  const int64_t* idx = topk_idx.as<int64_t>();

  auto count_block = [&](int64_t block) {
    int* per_rank = partial.data() + block * width;
    int* per_node_counts = per_node ? per_rank + num_ranks : nullptr;
    int* per_expert = per_rank + num_ranks + num_nodes;
    int64_t end = std::min(num_tokens, (block + 1) * kTokensPerBlock);
    for (int64_t t = block * kTokensPerBlock; t < end; ++t)
      count_token(idx + t * topk, topk, shape, per_rank, per_node_counts, per_expert,
                  in_rank + t * num_ranks);
  };
  if (executor != nullptr && blocks > 1)
    executor->run(blocks, count_block);
  else
    for (int64_t b = 0; b < blocks; ++b)
      count_block(b);

  // Sum the partials into one row, then split it into the three outputs.
  std::vector<int> total(static_cast<size_t>(width), 0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < width; ++i)
      total[i] += partial[b * width + i];
  auto slice = [&](int64_t offset, int64_t n) {
    Tensor t = Tensor::empty(DType::i32, n);
    std::copy_n(total.begin() + offset, n, t.data<int32_t>());
    return t;
  };
  layout.num_tokens_per_rank = slice(0, num_ranks);
  if (per_node) layout.num_tokens_per_rdma_rank = slice(num_ranks, num_nodes);
  layout.num_tokens_per_expert = slice(num_ranks + num_nodes, shape.num_experts);
  return layout;
}

}  // namespace proxyep::gpu_side::ep
