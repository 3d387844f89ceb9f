// One pass per token: mark each group's last lane, then walk the lanes again and emit a group at
// the lane marked as its last, which lists the groups by last lane in O(K) with no sort.
#include "gpu_side/ep/combine_order.hpp"

#include "gpu_side/ep/layout.hpp"

#include <vector>

namespace proxyep::gpu_side::ep {

int combine_group_count(const EpShape& shape, CombineGroups groups) {
  return groups == CombineGroups::node ? shape.num_nodes() : shape.num_ranks;
}

CombineOrderTables compute_combine_order(const TensorRef& topk_idx, const EpShape& shape,
                                         CombineGroups groups) {
  validate_topk_idx(topk_idx, shape, "combine_order");
  const int64_t tokens = topk_idx.rows;
  const int topk = static_cast<int>(topk_idx.cols);
  const int count = combine_group_count(shape, groups);
  auto group_of = [&](int64_t expert) {
    const int rank = shape.rank_of_expert(expert);
    return groups == CombineGroups::node ? shape.node_of_rank(rank) : rank;
  };

  CombineOrderTables out{Tensor::empty(DType::i32, tokens, count),
                         Tensor::empty(DType::i32, tokens, topk)};
  const int64_t* idx = topk_idx.as<int64_t>();
  int32_t* order = out.order.data<int32_t>();
  int32_t* owner = out.weight_owner.data<int32_t>();
  std::vector<int> last(static_cast<size_t>(count), -1);  // reset after each token
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t* row = idx + t * topk;
    int32_t* lanes = owner + t * topk;
    for (int k = 0; k < topk; ++k) {
      lanes[k] = row[k] < 0 ? -1 : group_of(row[k]);
      if (lanes[k] >= 0) last[static_cast<size_t>(lanes[k])] = k;
    }
    int32_t* list = order + t * count;
    int n = 0;
    for (int k = 0; k < topk; ++k) {
      const int32_t g = lanes[k];
      if (g < 0 || last[static_cast<size_t>(g)] != k) continue;
      list[n++] = g;
      last[static_cast<size_t>(g)] = -1;
    }
    for (; n < count; ++n)
      list[n] = -1;
  }
  return out;
}

void node_order_rows(const int64_t* topk_idx, int64_t tokens, int topk, const EpShape& shape,
                     int node, int32_t* out) {
  const int rpn = shape.ranks_per_node;
  std::vector<int> last(static_cast<size_t>(rpn), -1);  // reset after each token
  std::vector<int32_t> lanes(static_cast<size_t>(topk));
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t* row = topk_idx + t * topk;
    for (int k = 0; k < topk; ++k) {
      const int rank = row[k] < 0 ? -1 : shape.rank_of_expert(row[k]);
      lanes[static_cast<size_t>(k)] =
          rank < 0 || shape.node_of_rank(rank) != node ? -1 : rank % rpn;
      if (lanes[static_cast<size_t>(k)] >= 0)
        last[static_cast<size_t>(lanes[static_cast<size_t>(k)])] = k;
    }
    int32_t* list = out + t * rpn;
    int n = 0;
    for (int k = 0; k < topk; ++k) {
      const int32_t g = lanes[static_cast<size_t>(k)];
      if (g < 0 || last[static_cast<size_t>(g)] != k) continue;
      list[n++] = g;
      last[static_cast<size_t>(g)] = -1;
    }
    for (; n < rpn; ++n)
      list[n] = -1;
  }
}

}  // namespace proxyep::gpu_side::ep
