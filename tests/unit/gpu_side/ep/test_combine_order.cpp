// DeepEP V2's combine order (gpu_side/ep/combine_order.hpp) and what combine_token and the host
// reduce do with it (row_rules.hpp):
// - the tables, worked out by hand: repeated ranks, -1 lanes, a group placed by its LAST lane,
//   rows with no lane at all, one rank, per-node groups;
// - a combine with them equals reference_combine's CombineOrder::by_topk bit for bit (a twin
//   written from the definition, reading the dispatched rows instead of these tables), with 0, 1
//   and 2 biases, on data where V1's order gives other bits -- the test checks that it does, so
//   it fails if the order is ignored;
// - null tables still give V1's reference (CombineOrder::by_rank) bit for bit.
#include "gpu_side/ep/combine_order.hpp"

#include "common/error.hpp"
#include "gpu_side/ep/host_reduce.hpp"
#include "gpu_side/ep/numeric.hpp"
#include "gpu_side/ep/reference.hpp"
#include "gpu_side/ep/row_rules.hpp"
#include "gpu_side/ep/workload.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

using namespace proxyep;
using namespace proxyep::gpu_side::ep;

namespace {

CombineOrderTables tables_of(const std::vector<int64_t>& idx, int topk, const EpShape& shape,
                             CombineGroups groups) {
  const auto rows = static_cast<int64_t>(idx.size()) / topk;
  return compute_combine_order(TensorRef::matrix(idx.data(), DType::i64, rows, topk), shape,
                               groups);
}

std::vector<int32_t> row_of(const Tensor& table, int64_t row) {
  const int32_t* at = table.data<int32_t>() + row * table.cols();
  return {at, at + table.cols()};
}

}  // namespace

TEST_CASE("combine order: groups by last lane, each once, -1 lanes ignored") {
  // 4 ranks of 2 experts, 2 ranks per node: expert e is on rank e / 2, node e / 4.
  const EpShape shape{4, 2, 8};
  const std::vector<int64_t> idx = {
      6,  0,  3,  1,   // ranks 3 0 1 0: rank 0's last lane is 3, after rank 1's (2)
      -1, 2,  -1, -1,  // one lane
      -1, -1, -1, -1,  // no lane: an empty list
      2,  3,  2,  3,   // rank 1 four times: listed once
      0,  7,  4,  1,   // ranks 0 3 2 0: rank 0 first reached, last placed
  };
  const CombineOrderTables by_rank = tables_of(idx, 4, shape, CombineGroups::rank);
  REQUIRE(by_rank.order.rows() == 5);
  REQUIRE(by_rank.order.cols() == 4);
  CHECK(row_of(by_rank.order, 0) == std::vector<int32_t>{3, 1, 0, -1});
  CHECK(row_of(by_rank.order, 1) == std::vector<int32_t>{1, -1, -1, -1});
  CHECK(row_of(by_rank.order, 2) == std::vector<int32_t>{-1, -1, -1, -1});
  CHECK(row_of(by_rank.order, 3) == std::vector<int32_t>{1, -1, -1, -1});
  CHECK(row_of(by_rank.order, 4) == std::vector<int32_t>{3, 2, 0, -1});
  CHECK(row_of(by_rank.weight_owner, 0) == std::vector<int32_t>{3, 0, 1, 0});
  CHECK(row_of(by_rank.weight_owner, 1) == std::vector<int32_t>{-1, 1, -1, -1});
  CHECK(row_of(by_rank.weight_owner, 2) == std::vector<int32_t>{-1, -1, -1, -1});
  CHECK(row_of(by_rank.weight_owner, 3) == std::vector<int32_t>{1, 1, 1, 1});
  CHECK(row_of(by_rank.weight_owner, 4) == std::vector<int32_t>{0, 3, 2, 0});

  // Nodes: ranks 3 0 1 0 are nodes 1 0 0 0, ranks 0 3 2 0 are nodes 0 1 1 0.
  const CombineOrderTables by_node = tables_of(idx, 4, shape, CombineGroups::node);
  REQUIRE(by_node.order.cols() == 2);
  CHECK(row_of(by_node.order, 0) == std::vector<int32_t>{1, 0});
  CHECK(row_of(by_node.order, 1) == std::vector<int32_t>{0, -1});
  CHECK(row_of(by_node.order, 2) == std::vector<int32_t>{-1, -1});
  CHECK(row_of(by_node.order, 3) == std::vector<int32_t>{0, -1});
  CHECK(row_of(by_node.order, 4) == std::vector<int32_t>{1, 0});
  CHECK(row_of(by_node.weight_owner, 0) == std::vector<int32_t>{1, 0, 0, 0});
  CHECK(row_of(by_node.weight_owner, 1) == std::vector<int32_t>{-1, 0, -1, -1});
  CHECK(row_of(by_node.weight_owner, 4) == std::vector<int32_t>{0, 1, 1, 0});
}

TEST_CASE("node order: a node's ranks by last lane, as indices within the node") {
  // 8 ranks of 1 expert, 4 ranks per node: node 1 holds ranks (experts) 4..7, indices 0..3.
  const EpShape shape{8, 4, 8};
  const std::vector<int64_t> idx = {
      6,  5, 1,  6,   // node 1's ranks 6 5 6: rank 5 (index 1) first, rank 6 (2) by lane 3
      7,  4, 5,  -1,  // 7 4 5: indices 3 0 1
      0,  1, 2,  3,   // no rank of node 1
      -1, 4, -1, 4};  // rank 4 twice: once
  std::vector<int32_t> out(16, 99);
  node_order_rows(idx.data(), 4, 4, shape, 1, out.data());
  CHECK(out == std::vector<int32_t>{1, 2, -1, -1, 3, 0, 1, -1, -1, -1, -1, -1, 0, -1, -1, -1});
  node_order_rows(idx.data(), 1, 4, shape, 0, out.data());
  CHECK(std::vector<int32_t>(out.begin(), out.begin() + 4) == std::vector<int32_t>{1, -1, -1, -1});
}

TEST_CASE("combine order: one rank, no tokens, bad input") {
  const EpShape one{1, 1, 4};
  const CombineOrderTables t =
      tables_of({3, -1, 0, 2, /* */ -1, -1, -1, -1}, 4, one, CombineGroups::rank);
  CHECK(row_of(t.order, 0) == std::vector<int32_t>{0});
  CHECK(row_of(t.order, 1) == std::vector<int32_t>{-1});
  CHECK(row_of(t.weight_owner, 0) == std::vector<int32_t>{0, -1, 0, 0});
  CHECK(row_of(t.weight_owner, 1) == std::vector<int32_t>{-1, -1, -1, -1});

  const CombineOrderTables none = tables_of({}, 4, EpShape{4, 2, 8}, CombineGroups::rank);
  CHECK(none.order.rows() == 0);
  CHECK(none.order.cols() == 4);
  CHECK(none.weight_owner.cols() == 4);

  CHECK_THROWS_AS(tables_of({0, 8}, 2, EpShape{4, 2, 8}, CombineGroups::rank), Error);
  CHECK_THROWS_AS(tables_of({0, -2}, 2, EpShape{4, 2, 8}, CombineGroups::rank), Error);
}

TEST_CASE("combine_token with an order: V2's sum, by hand, where V1's differs") {
  // Token 0 reaches ranks 0, 1, 2 with lanes on ranks 0 1 2 0: V2 adds rank 1, rank 2, rank 0.
  // Values 2^24 (rank 0), 1 (rank 1), -2^24 (rank 2): V1's ((0 + 2^24) + 1) - 2^24 loses the 1
  // (a float32 ulp is 2 there) and gives 0; V2's ((0 + 1) - 2^24) + 2^24 gives 0 too -- so the
  // bias pair leads with 0.5 + 0.5: ((1 + 1) - 2^24) + 2^24 = 2 under V2, while V1's
  // (((0 + 2^24) + 1) - 2^24) + 0.5 + 0.5 = 1.
  constexpr int64_t kHidden = kCombineChunk;
  const EpShape shape{3, 3, 3};
  const std::vector<int64_t> idx = {0, 1, 2, 0};
  const CombineOrderTables tables = tables_of(idx, 4, shape, CombineGroups::rank);
  REQUIRE(row_of(tables.order, 0) == std::vector<int32_t>{1, 2, 0});

  alignas(16) uint16_t rows[3][kHidden];
  const float values[3] = {16777216.0f, 1.0f, -16777216.0f};
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < kHidden; ++j)
      rows[r][j] = float_to_bf16(values[r]);
  alignas(16) uint16_t half[kHidden];
  for (uint16_t& h : half)
    h = float_to_bf16(0.5f);
  // Lane weights each rank returns: its own lanes 1 + r, foreign lanes 100 + r (what a gradient
  // may hold), so a sum and a selection differ.
  float weights[3][4];
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 4; ++k)
      weights[r][k] = static_cast<float>(shape.rank_of_expert(idx[k]) == r ? 1 + r : 100 + r);
  const uint16_t* row_ptrs[3] = {rows[0], rows[1], rows[2]};
  const float* weight_ptrs[3] = {weights[0], weights[1], weights[2]};
  const int32_t head[3] = {0, 0, 0};

  alignas(16) uint16_t v1[kHidden], v2[kHidden];
  float w1[4], w2[4];
  CombineInput in{.block_rows = row_ptrs,
                  .block_weights = weight_ptrs,
                  .send_head = head,
                  .bias0 = half,
                  .bias1 = half,
                  .out = v1,
                  .out_weights = w1,
                  .num_ranks = 3,
                  .hidden = kHidden,
                  .topk = 4};
  combine_token(in, 0, HostLanes{});
  in.order = tables.order.data<int32_t>();
  in.weight_owner = tables.weight_owner.data<int32_t>();
  in.out = v2;
  in.out_weights = w2;
  combine_token(in, 0, HostLanes{});
  for (int j = 0; j < kHidden; ++j) {
    CHECK(bf16_to_float(v1[j]) == 1.0f);
    CHECK(bf16_to_float(v2[j]) == 2.0f);
  }
  // V1 sums every rank's lane; V2 copies the owner's: 1, 2, 3, 1.
  for (int k = 0; k < 4; ++k) {
    CHECK(w1[k] == weights[0][k] + weights[1][k] + weights[2][k]);
    CHECK(w2[k] == static_cast<float>(1 + shape.rank_of_expert(idx[k])));
  }
  // The host reduce, the same bits.
  alignas(16) uint16_t host[kHidden];
  float host_w[4];
  in.out = host;
  in.out_weights = host_w;
  reduce_tokens_host(in, 0, 1);
  CHECK(std::memcmp(host, v2, sizeof host) == 0);
  CHECK(std::memcmp(host_w, w2, sizeof host_w) == 0);
}

namespace {

// bf16 values, half of them +-2^24, +-1 or +-2^-8 (a float32 ulp at 2^24 is 2, so where a
// small value lands among cancelling large ones decides the result: the order of the adds shows
// in the bits, where sums of ordinary values are mostly exact or rounded away by the final bf16
// rounding), half of mixed signs and magnitudes (2^-20 .. 2^20). No NaN or infinity (which NaN
// two NaNs give is the compiler's choice, host_reduce.hpp).
std::vector<uint16_t> random_bf16(size_t count, std::mt19937_64& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> scale(-20, 20), pick(0, 11);
  const float cancelling[6] = {16777216.0f, -16777216.0f, 1.0f, -1.0f, 0x1p-8f, -0x1p-8f};
  std::vector<uint16_t> out(count);
  for (uint16_t& v : out) {
    const int p = pick(gen);
    v = float_to_bf16(p < 6 ? cancelling[p] : std::ldexp(normal(gen), scale(gen)));
  }
  return out;
}

// Every rank's reference dispatch of a seeded workload, and what each rank sends back: random
// rows (not its received x: copies of one value add alike in any order) and weights on every
// lane (foreign lanes non-zero, as a gradient's may be).
struct World {
  WorkloadOptions options;
  std::vector<RankInputs> inputs;
  std::vector<ReferenceDispatch> dispatched;
  std::vector<Tensor> returned, returned_weights;
  std::vector<TensorRef> expert_out, weights_in;

  explicit World(const EpShape& shape) {
    options.shape = shape;
    options.tokens_per_rank.assign(static_cast<size_t>(shape.num_ranks), 0);
    for (int r = 0; r < shape.num_ranks; ++r)
      options.tokens_per_rank[static_cast<size_t>(r)] = 40 + 7 * r;
    options.hidden = 64;
    options.topk = 6;
    options.drop_fraction = 0.15;
    options.seed = 11;
    std::vector<DispatchInputs> views;
    for (int r = 0; r < shape.num_ranks; ++r) {
      inputs.push_back(make_rank_inputs(options, r));
      const RankInputs& in = inputs.back();
      views.push_back({in.x, {}, in.topk_idx, in.topk_weights});
    }
    std::mt19937_64 gen(23);
    std::uniform_real_distribution<float> weight(-4.0f, 4.0f);
    for (int r = 0; r < shape.num_ranks; ++r) {
      dispatched.push_back(reference_dispatch(views, shape, r));
      const int64_t rows = dispatched.back().recv_x.rows();
      Tensor x = Tensor::empty(DType::bf16, rows, options.hidden);
      const std::vector<uint16_t> values = random_bf16(static_cast<size_t>(x.numel()), gen);
      std::memcpy(x.raw(), values.data(), x.bytes());
      Tensor w = Tensor::empty(DType::f32, rows, options.topk);
      for (int64_t i = 0; i < w.numel(); ++i)
        w.data<float>()[i] = weight(gen);
      returned.push_back(std::move(x));
      returned_weights.push_back(std::move(w));
    }
    for (int r = 0; r < shape.num_ranks; ++r) {
      expert_out.push_back(returned[static_cast<size_t>(r)]);
      weights_in.push_back(returned_weights[static_cast<size_t>(r)]);
    }
  }
};

// Source `s`'s combine over World's returned rows: rank r's block is the rows it received from
// s (a contiguous run of its receive order), send_head from their source token indices.
struct SourceCombine {
  std::vector<const uint16_t*> block_rows;
  std::vector<const float*> block_weights;
  std::vector<int32_t> send_head;
  int64_t tokens = 0;

  SourceCombine(const World& w, int s) {
    const int ranks = w.options.shape.num_ranks;
    tokens = w.options.tokens_of(s);
    send_head.assign(static_cast<size_t>(tokens * ranks), -1);
    for (int r = 0; r < ranks; ++r) {
      const ReferenceDispatch& d = w.dispatched[static_cast<size_t>(r)];
      int64_t first = 0;
      for (int q = 0; q < s; ++q)
        first += d.recv_from[static_cast<size_t>(q)];
      for (int64_t i = 0; i < d.recv_from[static_cast<size_t>(s)]; ++i) {
        const int32_t t = d.recv_src_idx.data<int32_t>()[first + i];
        send_head[static_cast<size_t>(t * ranks + r)] = static_cast<int32_t>(i);
      }
      block_rows.push_back(w.returned[static_cast<size_t>(r)].data<uint16_t>() +
                           first * w.options.hidden);
      block_weights.push_back(w.returned_weights[static_cast<size_t>(r)].data<float>() +
                              first * w.options.topk);
    }
  }

  CombineInput input(const World& w, const uint16_t* bias0, const uint16_t* bias1) const {
    return CombineInput{.block_rows = block_rows.data(),
                        .block_weights = block_weights.data(),
                        .send_head = send_head.data(),
                        .bias0 = bias0,
                        .bias1 = bias1,
                        .num_ranks = w.options.shape.num_ranks,
                        .hidden = w.options.hidden,
                        .topk = w.options.topk};
  }
};

struct Out {
  Tensor x, weights;
  Out(int64_t tokens, const World& w)
      : x(Tensor::empty(DType::bf16, tokens, w.options.hidden)),
        weights(Tensor::empty(DType::f32, tokens, w.options.topk)) {
    std::memset(x.raw(), 0xee, x.bytes());  // poison: every byte must be written
    std::memset(weights.raw(), 0xee, weights.bytes());
  }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

int64_t differing_elements(const Tensor& a, const Tensor& b) {
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    n += std::memcmp(a.raw() + i * dtype_size(a.dtype()), b.raw() + i * dtype_size(b.dtype()),
                     dtype_size(a.dtype())) != 0
             ? 1
             : 0;
  return n;
}

}  // namespace

TEST_CASE("combine with V2's order equals reference by_topk bit for bit; V1 stays V1") {
  // 5 ranks of 4 experts on one node (by_rank groups) and top-6 of 20, so tokens reach 3+ ranks
  // in every order.
  const EpShape shape{5, 5, 20};
  const World w(shape);
  int64_t v1_v2_differ = 0, order_matters = 0, weights_differ = 0;
  for (int s = 0; s < shape.num_ranks; ++s) {
    const SourceCombine sc(w, s);
    const int64_t n = sc.tokens;
    std::mt19937_64 gen(100 + static_cast<uint64_t>(s));
    Tensor bias0 = Tensor::empty(DType::bf16, n, w.options.hidden);
    Tensor bias1 = Tensor::empty(DType::bf16, n, w.options.hidden);
    for (Tensor* b : {&bias0, &bias1}) {
      const std::vector<uint16_t> v = random_bf16(static_cast<size_t>(b->numel()), gen);
      std::memcpy(b->raw(), v.data(), b->bytes());
    }
    const CombineOrderTables tables = compute_combine_order(
        w.inputs[static_cast<size_t>(s)].topk_idx, shape, CombineGroups::rank);
    for (int biases = 0; biases <= 2; ++biases) {
      CAPTURE(s);
      CAPTURE(biases);
      const TensorRef b0 = biases >= 1 ? TensorRef(bias0) : TensorRef{};
      const TensorRef b1 = biases >= 2 ? TensorRef(bias1) : TensorRef{};
      CombineInput in = sc.input(w, biases >= 1 ? bias0.data<uint16_t>() : nullptr,
                                 biases >= 2 ? bias1.data<uint16_t>() : nullptr);

      // V1: null tables, the by_rank reference.
      const ReferenceCombine want_v1 = reference_combine(w.expert_out, w.dispatched, w.weights_in,
                                                         shape, s, static_cast<int>(n), b0, b1);
      Out v1(n, w);
      in.out = v1.x.data<uint16_t>();
      in.out_weights = v1.weights.data<float>();
      for (int64_t t = 0; t < n; ++t)
        combine_token(in, t, HostLanes{});
      CHECK(same_bytes(v1.x, want_v1.combined_x));
      CHECK(same_bytes(v1.weights, want_v1.combined_topk_weights));

      // V2: the tables, the by_topk reference; combine_token and the host reduce alike.
      const ReferenceCombine want =
          reference_combine(w.expert_out, w.dispatched, w.weights_in, shape, s, static_cast<int>(n),
                            b0, b1, CombineOrder::by_topk);
      in.order = tables.order.data<int32_t>();
      in.weight_owner = tables.weight_owner.data<int32_t>();
      Out rule(n, w), host(n, w);
      in.out = rule.x.data<uint16_t>();
      in.out_weights = rule.weights.data<float>();
      for (int64_t t = 0; t < n; ++t)
        combine_token(in, t, HostLanes{});
      in.out = host.x.data<uint16_t>();
      in.out_weights = host.weights.data<float>();
      reduce_tokens_host(in, 0, n / 2);
      reduce_tokens_host(in, n / 2, n);
      CHECK(same_bytes(rule.x, want.combined_x));
      CHECK(same_bytes(rule.weights, want.combined_topk_weights));
      CHECK(same_bytes(host.x, want.combined_x));
      CHECK(same_bytes(host.weights, want.combined_topk_weights));

      v1_v2_differ += differing_elements(v1.x, rule.x);
      weights_differ += differing_elements(v1.weights, rule.weights);
      // Biases first but ranks ascending: the order table itself matters too.
      CombineInput ascending = in;
      ascending.order = nullptr;
      ascending.bias_first = true;
      Out asc(n, w);
      ascending.out = asc.x.data<uint16_t>();
      ascending.out_weights = asc.weights.data<float>();
      for (int64_t t = 0; t < n; ++t)
        combine_token(ascending, t, HostLanes{});
      order_matters += differing_elements(asc.x, rule.x);
    }
  }
  // The data tells the orders apart (else the checks above could not fail on a wrong order).
  CHECK(v1_v2_differ > 100);
  CHECK(order_matters > 100);
  CHECK(weights_differ > 100);
}

TEST_CASE("reference by_topk: the biases lead, ranks by last lane, weights selected") {
  // Rank 0's token 0 names experts 3 (rank 1), 0 (rank 0), 2 (rank 1): rank 0's last lane is 1,
  // rank 1's is 2, so rank 0's row comes first. 2 ranks of 2 experts. Rank 0 returns 2^24, rank
  // 1 returns 1, bias0 is -2^24 (a float32 ulp is 2 at 2^24, so where the 1 lands decides).
  const EpShape shape{2, 2, 4};
  std::vector<ReferenceDispatch> dispatched(2);
  std::vector<Tensor> rows, weights;
  const float value[2] = {16777216.0f, 1.0f};
  const int64_t local[2][3] = {{-1, 0, -1}, {1, -1, 0}};
  for (int r = 0; r < 2; ++r) {
    dispatched[r].recv_from = {1, 0};
    dispatched[r].recv_src_idx = Tensor::zeros(DType::i32, 1);
    dispatched[r].recv_topk_idx = Tensor::empty(DType::i64, 1, 3);
    std::memcpy(dispatched[r].recv_topk_idx.raw(), local[r], sizeof local[r]);
    rows.push_back(Tensor::empty(DType::bf16, 1, 8));
    for (int c = 0; c < 8; ++c)
      rows.back().data<uint16_t>()[c] = float_to_bf16(value[r]);
    weights.push_back(Tensor::empty(DType::f32, 1, 3));
    for (int k = 0; k < 3; ++k)
      weights.back().data<float>()[k] = static_cast<float>(10 * r + k);
  }
  const std::vector<TensorRef> expert_out(rows.begin(), rows.end());
  const std::vector<TensorRef> weights_in(weights.begin(), weights.end());
  Tensor bias = Tensor::empty(DType::bf16, 1, 8);
  for (int c = 0; c < 8; ++c)
    bias.data<uint16_t>()[c] = float_to_bf16(-16777216.0f);
  // by_topk: ((-2^24 + 0) + 2^24) + 1 = 1. by_rank: ((0 + 2^24) + 1) - 2^24 = 0 (the 1 is lost).
  const ReferenceCombine v2 = reference_combine(expert_out, dispatched, weights_in, shape, 0, 1,
                                                bias, {}, CombineOrder::by_topk);
  const ReferenceCombine v1 = reference_combine(expert_out, dispatched, weights_in, shape, 0, 1,
                                                bias, {}, CombineOrder::by_rank);
  for (int c = 0; c < 8; ++c) {
    CHECK(bf16_to_float(v2.combined_x.data<uint16_t>()[c]) == 1.0f);
    CHECK(bf16_to_float(v1.combined_x.data<uint16_t>()[c]) == 0.0f);
  }
  // Weights: lane 0 from rank 1 (10), lane 1 from rank 0 (1), lane 2 from rank 1 (12); V1 sums.
  CHECK(v2.combined_topk_weights.data<float>()[0] == 10.0f);
  CHECK(v2.combined_topk_weights.data<float>()[1] == 1.0f);
  CHECK(v2.combined_topk_weights.data<float>()[2] == 12.0f);
  CHECK(v1.combined_topk_weights.data<float>()[0] == 10.0f);
  CHECK(v1.combined_topk_weights.data<float>()[1] == 12.0f);

  // Rows without recv_topk_idx cannot be ordered: refused.
  dispatched[1].recv_topk_idx = Tensor();
  CHECK_THROWS_AS(reference_combine(expert_out, dispatched, weights_in, shape, 0, 1, {}, {},
                                    CombineOrder::by_topk),
                  Error);
}
