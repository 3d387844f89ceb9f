// Normal-mode calls with async_finish, ranks as threads of this process (a real TCP bootstrap on
// loopback, real shared arenas, a real fabric with the reorder shim), so that ThreadSanitizer (the
// tsan preset) sees the communication thread finish dispatches and combines against the calls
// that follow them: an async dispatch finished by the next call (a cached dispatch), an async
// combine whose event is waited for, one whose event is dropped and that the next call finishes.
// Every output is checked exactly against gpu_side/ep/reference.hpp.
#include "gpu_side/ep/reference.hpp"
#include "gpu_side/ep/workload.hpp"
#include "integrations/buffer.hpp"
#include "tests/unit/integrations/buffer_rank_threads.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

namespace ep = proxyep::gpu_side::ep;
using namespace proxyep;

namespace {

constexpr int kRanks = 2;
constexpr int kTokens = 48;
constexpr int kHidden = 1024;

ep::WorkloadOptions workload(int per_node, uint64_t seed) {
  ep::WorkloadOptions w;
  w.shape = {kRanks, per_node, 4 * kRanks};
  w.num_tokens = kTokens;
  w.hidden = kHidden;
  w.topk = 3;
  w.drop_fraction = 0.1;
  w.seed = seed;
  return w;
}

void require_equal(const ep::Tensor& got, const ep::Tensor& want, int64_t rows,
                   const std::string& what) {
  const size_t bytes = static_cast<size_t>(rows) * want.bytes() / static_cast<size_t>(want.rows());
  require(got.defined() && got.rows() >= rows && std::memcmp(got.raw(), want.raw(), bytes) == 0,
          "test", "{} differs from the reference", what);
}

void run_rank(int per_node, control::Bootstrap::Options options) {
  auto boot = control::Bootstrap::connect(std::move(options));
  const int me = boot->rank();
  BufferOptions o;
  o.ranks_per_node = per_node;
  o.num_nvl_bytes = Buffer::nvl_bytes_hint(kTokens, kHidden * 2, 3, kRanks);
  o.num_rdma_bytes =
      per_node < kRanks ? Buffer::rdma_bytes_hint(kTokens, kHidden * 2, 3, kRanks, per_node) : 0;
  Buffer buffer(*boot, o);
  for (uint64_t round = 0; round < 3; ++round) {
    const ep::WorkloadOptions w = workload(per_node, round + 1);
    std::vector<ep::RankInputs> all;
    std::vector<ep::DispatchInputs> views;
    for (int r = 0; r < kRanks; ++r)
      all.push_back(ep::make_rank_inputs(w, r));
    for (const auto& in : all)
      views.push_back({in.x, {}, in.topk_idx, in.topk_weights});
    const ep::RankInputs& mine = all[static_cast<size_t>(me)];
    std::vector<ep::ReferenceDispatch> want;
    for (int r = 0; r < kRanks; ++r)
      want.push_back(ep::reference_dispatch(views, w.shape, r));
    const ep::ReferenceDispatch& wanted = want[static_cast<size_t>(me)];
    const int64_t recv = wanted.recv_src_idx.rows();

    const DispatchLayout layout = buffer.get_dispatch_layout(mine.topk_idx, w.shape.num_experts);
    DispatchArgs args{.x = mine.x,
                      .num_tokens_per_rank = layout.num_tokens_per_rank,
                      .is_token_in_rank = layout.is_token_in_rank,
                      .num_tokens_per_expert = layout.num_tokens_per_expert,
                      .topk_idx = mine.topk_idx,
                      .topk_weights = mine.topk_weights,
                      .async_finish = true};
    DispatchResult d = buffer.dispatch(args);
    // The next call finishes it first (stream order).
    DispatchResult cached =
        buffer.dispatch({.x = mine.x, .handle = &d.handle, .async_finish = true});
    require(d.handle.num_recv_tokens == recv, "test", "received {} rows, reference {}",
            d.handle.num_recv_tokens, recv);
    require_equal(d.recv_x, wanted.recv_x, recv, "recv_x");
    require_equal(d.recv_topk_idx, wanted.recv_topk_idx, recv, "recv_topk_idx");
    require_equal(d.handle.recv_src_idx, wanted.recv_src_idx, recv, "recv_src_idx");
    cached.event.wait();
    require_equal(cached.recv_x, wanted.recv_x, recv, "recv_x (cached)");

    std::vector<ep::TensorRef> expert_out, weights;
    for (const auto& r : want) {
      expert_out.push_back(r.recv_x);
      weights.push_back(r.recv_topk_weights);
    }
    const ep::ReferenceCombine combined_want =
        ep::reference_combine(expert_out, want, weights, w.shape, me, kTokens);
    CombineResult c = buffer.combine({.x = d.recv_x,
                                      .handle = &d.handle,
                                      .topk_weights = d.recv_topk_weights,
                                      .async_finish = true});
    c.event.wait();
    require_equal(c.combined_x, combined_want.combined_x, kTokens, "combined_x");
    require_equal(c.combined_topk_weights, combined_want.combined_topk_weights, kTokens,
                  "combined_topk_weights");
    // An event nobody waits for: the next call (any kind) finishes its call first.
    CombineResult dropped = buffer.combine({.x = d.recv_x,
                                            .handle = &d.handle,
                                            .topk_weights = d.recv_topk_weights,
                                            .async_finish = true});
    (void)buffer.stats();
    require_equal(dropped.combined_x, combined_want.combined_x, kTokens, "combined_x (dropped)");
  }
  if (per_node == 1)
    require(buffer.stats().reordered_completions.has_value(), "test",
            "the fabric path ran without the reorder shim");
  buffer.destroy();
}

void run(int per_node) {
  integrations::testing::run_buffer_ranks(
      kRanks, per_node == 1,
      [per_node](control::Bootstrap::Options options) { run_rank(per_node, options); });
}

}  // namespace

TEST_CASE("normal-mode async_finish calls: node peers (ranks as threads)") {
  run(kRanks);
}

TEST_CASE("normal-mode async_finish calls: over the fabric with the reorder shim") {
  run(1);
}
