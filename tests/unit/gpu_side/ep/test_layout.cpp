#include "gpu_side/ep/layout.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/host_executor.hpp"

#include <doctest/doctest.h>

#include <set>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side::ep;

namespace {

// Random routing with -1 entries and occasional repeated experts in a row.
Tensor random_topk(int64_t tokens, int topk, int experts, uint64_t seed) {
  Tensor t = Tensor::empty(DType::i64, tokens, topk);
  uint64_t state = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t.data<int64_t>()[i] = static_cast<int64_t>((state >> 33) % (experts + 1)) - 1;
  }
  return t;
}

struct Recount {
  std::vector<int> per_rank, per_node, per_expert;
  std::vector<bool> in_rank;
};

// The obvious recount with sets, independent of layout_rules.hpp.
Recount brute_force(const Tensor& topk, const EpShape& shape) {
  Recount c;
  c.per_rank.assign(shape.num_ranks, 0);
  c.per_node.assign(shape.num_nodes(), 0);
  c.per_expert.assign(shape.num_experts, 0);
  c.in_rank.assign(topk.rows() * shape.num_ranks, false);
  const int experts_per_rank = shape.num_experts / shape.num_ranks;
  for (int64_t t = 0; t < topk.rows(); ++t) {
    std::set<int> ranks, nodes;
    for (int64_t k = 0; k < topk.cols(); ++k) {
      int64_t e = topk.data<int64_t>()[t * topk.cols() + k];
      if (e < 0) continue;
      ++c.per_expert[e];
      int rank = static_cast<int>(e / experts_per_rank);
      ranks.insert(rank);
      nodes.insert(rank / shape.ranks_per_node);
    }
    for (int r : ranks) {
      ++c.per_rank[r];
      c.in_rank[t * shape.num_ranks + r] = true;
    }
    for (int n : nodes)
      ++c.per_node[n];
  }
  return c;
}

std::vector<int> to_vector(const Tensor& t) {
  return std::vector<int>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

void check_against_brute_force(const EpShape& shape, int64_t tokens, int topk, uint64_t seed,
                               HostExecutor* executor) {
  CAPTURE(shape.num_ranks);
  CAPTURE(shape.ranks_per_node);
  CAPTURE(tokens);
  Tensor idx = random_topk(tokens, topk, shape.num_experts, seed);
  DispatchLayout layout = compute_dispatch_layout(idx, shape, executor);
  Recount expected = brute_force(idx, shape);
  REQUIRE(layout.num_tokens_per_rank.dims() == 1);
  REQUIRE(layout.num_tokens_per_rank.dtype() == DType::i32);
  CHECK(to_vector(layout.num_tokens_per_rank) == expected.per_rank);
  CHECK(to_vector(layout.num_tokens_per_expert) == expected.per_expert);
  REQUIRE(layout.is_token_in_rank.dtype() == DType::boolean);
  REQUIRE(layout.is_token_in_rank.rows() == tokens);
  REQUIRE(layout.is_token_in_rank.cols() == shape.num_ranks);
  bool same = true;
  for (int64_t i = 0; i < layout.is_token_in_rank.numel(); ++i)
    same = same && layout.is_token_in_rank.data<bool>()[i] == expected.in_rank[i];
  CHECK(same);
  if (shape.num_ranks <= shape.ranks_per_node) {
    CHECK_FALSE(layout.num_tokens_per_rdma_rank.defined());
  } else {
    REQUIRE(layout.num_tokens_per_rdma_rank.defined());
    CHECK(layout.num_tokens_per_rdma_rank.rows() == shape.num_nodes());
    CHECK(to_vector(layout.num_tokens_per_rdma_rank) == expected.per_node);
  }
}

}  // namespace

TEST_CASE("layout: matches a brute-force recount, with and without an executor") {
  HostExecutor executor(3);
  const std::vector<EpShape> shapes = {
      {1, 1, 8},   {4, 4, 32},  {8, 8, 64},   {8, 2, 16},
      {16, 8, 64}, {12, 4, 48}, {32, 8, 256}, {24, 8, 24},
  };
  uint64_t seed = 1;
  for (const EpShape& shape : shapes) {
    for (int64_t tokens : {0, 1, 7, 2000}) {
      int topk = std::min(8, shape.num_experts);
      check_against_brute_force(shape, tokens, topk, seed, nullptr);
      check_against_brute_force(shape, tokens, topk, seed, &executor);
      ++seed;
    }
  }
}

TEST_CASE("layout: one node has no per-node counts, a group across nodes has them") {
  Tensor idx = Tensor::empty(DType::i64, 2, 2);
  int64_t rows[] = {0, 63, -1, 5};
  std::copy(rows, rows + 4, idx.data<int64_t>());
  DispatchLayout eight = compute_dispatch_layout(idx, EpShape{8, 8, 64});
  CHECK_FALSE(eight.num_tokens_per_rdma_rank.defined());
  CHECK(to_vector(eight.num_tokens_per_rank) == std::vector<int>{2, 0, 0, 0, 0, 0, 0, 1});

  // 16 ranks of 4 per node: expert 0 -> rank 0 (node 0), expert 63 -> rank 15 (node 3).
  DispatchLayout sixteen = compute_dispatch_layout(idx, EpShape{16, 4, 64});
  REQUIRE(sixteen.num_tokens_per_rdma_rank.defined());
  CHECK(to_vector(sixteen.num_tokens_per_rdma_rank) == std::vector<int>{2, 0, 0, 1});
  CHECK(sixteen.num_tokens_per_expert.data<int32_t>()[5] == 1);
  CHECK(sixteen.num_tokens_per_expert.data<int32_t>()[63] == 1);

  // ProxyEP's node is ranks_per_node, not DeepEP's fixed 8: 16 ranks on one node have no
  // per-node counts, 2 nodes of 2 have them.
  CHECK_FALSE(compute_dispatch_layout(idx, EpShape{16, 16, 64}).num_tokens_per_rdma_rank.defined());
  DispatchLayout four = compute_dispatch_layout(idx, EpShape{4, 2, 64});
  REQUIRE(four.num_tokens_per_rdma_rank.defined());
  CHECK(to_vector(four.num_tokens_per_rdma_rank) == std::vector<int>{2, 1});
}

TEST_CASE("layout: a token naming two experts of one rank counts once for the rank") {
  Tensor idx = Tensor::empty(DType::i64, 1, 4);
  int64_t row[] = {3, 2, 3, -1};  // experts 2, 3 (twice) all on rank 0 of 4 ranks x 4 experts
  std::copy(row, row + 4, idx.data<int64_t>());
  DispatchLayout layout = compute_dispatch_layout(idx, EpShape{4, 4, 16});
  CHECK(to_vector(layout.num_tokens_per_rank) == std::vector<int>{1, 0, 0, 0});
  CHECK(layout.num_tokens_per_expert.data<int32_t>()[3] == 2);
  CHECK(layout.num_tokens_per_expert.data<int32_t>()[2] == 1);
}

TEST_CASE("layout: validation names the first bad entry and the caller's phase") {
  const EpShape shape{4, 4, 64};
  Tensor idx = random_topk(10, 4, 64, 3);
  CHECK_NOTHROW(validate_topk_idx(idx, shape, "dispatch"));

  idx.data<int64_t>()[3 * 4 + 2] = 64;
  idx.data<int64_t>()[5 * 4 + 0] = -7;
  try {
    validate_topk_idx(idx, shape, "dispatch");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.phase() == "dispatch");
    CHECK(e.message() == "topk_idx[3, 2] = 64 is out of range [-1, 64)");
  }
  idx.data<int64_t>()[3 * 4 + 2] = 0;
  CHECK_THROWS_WITH_AS(validate_topk_idx(idx, shape, "dispatch"),
                       doctest::Contains("topk_idx[5, 0] = -7"), Error);
  CHECK_THROWS_WITH_AS(compute_dispatch_layout(idx, shape),
                       doctest::Contains("get_dispatch_layout: topk_idx[5, 0] = -7"), Error);

  Tensor good = random_topk(10, 4, 64, 4);
  Tensor i32 = Tensor::zeros(DType::i32, 10, 4);
  CHECK_THROWS_WITH_AS(validate_topk_idx(i32, shape, "layout"),
                       doctest::Contains("topk_idx must have dtype int64"), Error);
  CHECK_THROWS_WITH_AS(validate_topk_idx(Tensor::zeros(DType::i64, 10), shape, "layout"),
                       doctest::Contains("2-D"), Error);
  CHECK_THROWS_AS(validate_topk_idx(TensorRef{}, shape, "layout"), Error);
  TensorRef strided = TensorRef::strided(good.data<int64_t>(), DType::i64, 5, 4, 8, 1);
  CHECK_THROWS_WITH_AS(validate_topk_idx(strided, shape, "layout"), doctest::Contains("contiguous"),
                       Error);
  TensorRef on_gpu = good.ref();
  on_gpu.device = Device::cuda;
  CHECK_THROWS_AS(validate_topk_idx(on_gpu, shape, "layout"), Error);
  CHECK_THROWS_WITH_AS(validate_topk_idx(good, EpShape{3, 3, 64}, "layout"),
                       doctest::Contains("multiple of num_ranks"), Error);
  CHECK_THROWS_WITH_AS(validate_topk_idx(Tensor::zeros(DType::i64, 2, 33), shape, "layout"),
                       doctest::Contains("num_topk = 33"), Error);
  CHECK_THROWS_WITH_AS(validate_topk_idx(good, EpShape{2, 2, 2 * 1025}, "layout"),
                       doctest::Contains("1024"), Error);
  CHECK_NOTHROW(validate_topk_idx(Tensor::zeros(DType::i64, 2, 32), EpShape{2, 2, 2048}, "layout"));
}
