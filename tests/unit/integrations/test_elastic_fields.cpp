// DeepEP V2's EPHandle fields (integrations/elastic/elastic_fields.hpp) on hand-made routings:
// the values DeepEP's test reads back (psums, source ids) and our stand-ins (slots, column 1).
#include "integrations/elastic/elastic_fields.hpp"
#include "integrations/elastic/expand.hpp"

#include "common/error.hpp"
#include "integrations/backend/host_backend.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

using namespace proxyep::integrations::elastic;

TEST_CASE("psum_per_scaleup_rank folds source ranks onto their scale-up peer") {
  const std::vector<int64_t> from = {3, 1, 4, 2};
  CHECK(psum_per_scaleup_rank(from, 2) == std::vector<int32_t>{7, 10});  // {3 + 4, 1 + 2}
  CHECK(psum_per_scaleup_rank(from, 4) == std::vector<int32_t>{3, 4, 8, 10});
  CHECK(psum_per_scaleup_rank(from, 1) == std::vector<int32_t>{10});
  CHECK_THROWS_AS(psum_per_scaleup_rank(from, 3), proxyep::Error);
}

TEST_CASE("aligned_psum rounds each expert up before summing") {
  const std::vector<int> counts = {0, 3, 5, 4};
  CHECK(aligned_psum(counts, 1) == std::vector<int32_t>{0, 3, 8, 12});
  CHECK(aligned_psum(counts, 4) == std::vector<int32_t>{0, 4, 12, 16});
  CHECK_THROWS_AS(aligned_psum(counts, 0), proxyep::Error);
}

TEST_CASE("send_slots: the send head of each lane's rank, once per rank") {
  // 2 ranks of 2 experts, top-3; send_head [tokens, ranks].
  const Routing routing{.ranks = 2, .local_experts = 2, .topk = 3};
  const std::vector<int64_t> topk = {1,  2,  0,    // ranks 0, 1, 0 again
                                     -1, 3,  2,    // none, rank 1, rank 1 again
                                     -1, -1, -1};  // goes nowhere
  const std::vector<int32_t> head = {5, 6, -1, 7, -1, -1};
  std::vector<int32_t> out(9, 99);
  send_slots(routing, topk.data(), head.data(), 3, out.data());
  CHECK(out == std::vector<int32_t>{5, 6, -1, -1, 7, -1, -1, -1, -1});
}

TEST_CASE("source_metadata: global source ids and first local lanes by source rank") {
  // Rows from rank 0 (2) then rank 1 (1), one worst-case row after them; top-2, T = 10.
  const Routing routing{.ranks = 2, .local_experts = 2, .topk = 2};
  const std::vector<int64_t> from = {2, 1};
  const std::vector<int32_t> src_idx = {5, 7, 3};
  const std::vector<int64_t> recv_topk = {-1, 0, 1, -1, 0, 1, -1, -1};
  std::vector<int32_t> out(4 * 4, 99);
  source_metadata(routing, from, src_idx.data(), recv_topk.data(), 10, 4, out.data());
  CHECK(out == std::vector<int32_t>{5, 1, -1, -1,      // rank 0, token 5, lane 1
                                    7, 0, -1, -1,      // rank 0, token 7, lane 0
                                    13, 2, -1, -1,     // rank 1 (id 10 + 3), 1 * K + lane 0
                                    -1, -1, -1, -1});  // past the received rows
  std::vector<int32_t> small(2 * 4);
  CHECK_THROWS_AS(
      source_metadata(routing, from, src_idx.data(), recv_topk.data(), 10, 2, small.data()),
      proxyep::Error);
}

TEST_CASE("plan_expand: each expert from the aligned end of the previous one") {
  const std::vector<int> counts = {0, 3, 5};
  const ExpandPlan plan = plan_expand(counts, 4);
  CHECK(plan.base == std::vector<int32_t>{0, 0, 4});
  CHECK(plan.psum == std::vector<int32_t>{0, 3, 9});
  CHECK(plan.slots == 12);
  CHECK(plan_expand(counts, 1).slots == 8);
}

TEST_CASE("assign_slots: source order within each expert; counts must agree with the rows") {
  // 3 received rows, top-2, 2 local experts; alignment 2: expert 0 has 2 pairs, expert 1 has 2.
  const std::vector<int64_t> idx = {0, 1, -1, 1, 0, -1};
  const auto recv =
      proxyep::gpu_side::ep::TensorRef::matrix(idx.data(), proxyep::gpu_side::ep::DType::i64, 3, 2);
  const std::vector<int> counts = {2, 2};
  std::vector<int32_t> meta(3 * 4, 99);
  assign_slots(plan_expand(counts, 2), recv, 3, meta.data());
  CHECK(meta == std::vector<int32_t>{99, 99, 0, 2, 99, 99, -1, 3, 99, 99, 1, -1});
  const std::vector<int> fewer = {1, 2};
  CHECK_THROWS_AS(assign_slots(plan_expand(fewer, 2), recv, 3, meta.data()), proxyep::Error);
  const std::vector<int> more = {3, 2};
  CHECK_THROWS_AS(assign_slots(plan_expand(more, 2), recv, 3, meta.data()), proxyep::Error);
}

TEST_CASE("fold_expanded: a token's slots summed in lane order, weights gathered by slot") {
  // 2 rows, top-2, hidden 8 (one combine chunk); row 0 in slots 2 and 0, row 1 in slot 1 only.
  const std::vector<int32_t> meta = {7, 0, 2, 0, 9, 1, -1, 1};
  std::vector<uint16_t> x(3 * 8);
  const uint16_t one = 0x3f80, two = 0x4000, three = 0x4040;  // bf16 1, 2, 3
  std::fill(x.begin(), x.begin() + 8, one);
  std::fill(x.begin() + 8, x.begin() + 16, two);
  std::fill(x.begin() + 16, x.end(), three);
  const std::vector<float> w = {0.5f, 0.25f, 0.125f};
  namespace ep = proxyep::gpu_side::ep;
  proxyep::integrations::HostBackend host(1);
  const Folded f = fold_expanded(host, ep::TensorRef::matrix(x.data(), ep::DType::bf16, 3, 8),
                                 ep::TensorRef::vector(w.data(), ep::DType::f32, 3),
                                 ep::TensorRef::matrix(meta.data(), ep::DType::i32, 2, 4), 2);
  const uint16_t four = 0x4080;  // 3 + 1
  for (int c = 0; c < 8; ++c) {
    CHECK(f.x.data<uint16_t>()[c] == four);
    CHECK(f.x.data<uint16_t>()[8 + c] == two);
  }
  CHECK(std::vector<float>(f.weights.data<float>(), f.weights.data<float>() + 4) ==
        std::vector<float>{0.125f, 0.5f, 0.0f, 0.25f});
}

TEST_CASE("expand_runs: one copy per taken slot, a row per token or a weight per lane") {
  // 2 rows, top-2: row 0 in slots 2 and 0, row 1 in slot 1 (lane 1).
  const std::vector<int32_t> meta = {7, 0, 2, 0, 9, 1, -1, 1};
  std::vector<std::byte> from(64), to(64);
  const auto rows = expand_runs(from.data(), to.data(), 8, false, meta.data(), 2, 2);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].from == from.data());
  CHECK(rows[0].to == to.data() + 16);  // slot 2
  CHECK(rows[1].to == to.data());       // slot 0, the same row
  CHECK(rows[1].from == from.data());
  CHECK(rows[2].from == from.data() + 8);  // row 1
  CHECK(rows[2].to == to.data() + 8);      // slot 1
  const auto lanes = expand_runs(from.data(), to.data(), 4, true, meta.data(), 2, 2);
  REQUIRE(lanes.size() == 3);
  CHECK(lanes[1].from == from.data() + 4);   // row 0, lane 1
  CHECK(lanes[2].from == from.data() + 12);  // row 1, lane 1
  CHECK(lanes[2].bytes == 4);
}
